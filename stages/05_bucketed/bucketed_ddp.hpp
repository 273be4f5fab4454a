// Stage 05: bucketed data parallelism. Stage 04 launched one all-reduce per parameter and paid the
// fixed cost of a collective once per tensor. Here gradients are copied into a few flat buffers
// ("buckets"), and each bucket is all-reduced with one collective as soon as all its gradients are
// final, still during backward. The bucket size trades per-call overhead (few large buckets) against
// overlap (the first bucket can only start once it is full).
#pragma once

#include "common/dist.hpp"
#include "common/grad_sync.hpp"
#include "common/strategy.hpp"
#include "stages/04_overlap/accumulate_grad_hooks.hpp"  // AccumulateGradHooks, LaunchRecord
#include "stages/05_bucketed/buckets.hpp"
#include "stages/05_bucketed/comm_hooks.hpp"

#include "common/libtorch.hpp"

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dp {

/// Data parallelism with gradient buckets launched from autograd hooks, in bucket order.
///
/// Usage, on every rank (the same loop as OverlapDdp):
///   BucketedDdp ddp(pg, model, 25.0);   // 25 MB buckets
///   loop: ddp.on_train_batch_start(); opt.zero_grad(); model->forward(...).backward();
///         ddp.finish_gradient_synchronization(); opt.step();
/// The process group must outlive this object. All trainable parameters of one bucket must share a
/// dtype and device (the constructor checks; a std::invalid_argument otherwise).
///
/// Gradient accumulation over K micro-batches (K backward passes per optimizer step):
///   ddp.on_train_batch_start(); opt.zero_grad();
///   { NoSyncGuard guard(ddp); for k < K-1: (loss(micro_batch k) / K).backward(); }
///   (loss(micro_batch K-1) / K).backward(); ddp.finish_gradient_synchronization(); opt.step();
/// With a mean-reduced loss over B rows per micro-batch, dividing each loss by K makes the synchronized
/// gradient the gradient of the mean over all K * B * world rows: the step of one process on the whole
/// batch.
///
/// Extensions build on three seams (extensions/05*): register_comm_hook() (how a bucket is reduced),
/// on_bucket_averaged() (work per bucket as soon as it arrived) and, for subclasses, gradient_copied(),
/// after_synchronization() and reassign() (which parameters share a bucket).
class BucketedDdp : public GradSync {
 public:
  /// Broadcasts rank 0's parameters and buffers, assigns buckets with assign_buckets() over the unique
  /// parameters, allocates one flat buffer per bucket and hooks every trainable parameter.
  /// Throws dp::UsageError when bucket_cap_mb is not positive and finite.
  BucketedDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> module, double bucket_cap_mb);
  /// Removes the hooks. Does not wait for collectives still in flight (they keep their buffers alive).
  ~BucketedDdp() override;
  BucketedDdp(const BucketedDdp&) = delete;
  BucketedDdp& operator=(const BucketedDdp&) = delete;

  /// The wrapped model (call forward on your own typed pointer to it).
  std::shared_ptr<torch::nn::Module> module;

  /// Start of a step. The per-step state (ready counts, launched flags) is already reset at the end of
  /// finish_gradient_synchronization(); this throws std::logic_error if the previous step never finished.
  void on_train_batch_start() override;
  /// Same as finish_gradient_synchronization().
  void after_backward() override { finish_gradient_synchronization(); }
  /// One all-reduce per bucket.
  int64_t calls_per_step() const override { return static_cast<int64_t>(bucket_count()); }
  /// Completes and launches the buckets not launched yet (a parameter that got no gradient this step
  /// contributes its current .grad(), zeros if none), waits for all of them (the comm hook divides by the
  /// world size) and copies each bucket back into the parameters' .grad(). Does nothing while gradients
  /// accumulate locally, or when no hook ran since the last call; gradients accumulated locally with no
  /// backward since are synchronized here (all buckets launched from here).
  void finish_gradient_synchronization();

  /// Local gradient accumulation (PyTorch's DDP.no_sync(); dp::NoSyncGuard sets it for a scope): after
  /// false, backward accumulates into .grad() with no communication (the hooks neither copy nor launch)
  /// and finish_gradient_synchronization() does nothing. After true, the first backward synchronizes the
  /// accumulated sum: each hook copies the whole .grad(), this backward's gradient plus everything
  /// accumulated before. Throws std::logic_error on false while a synchronization is unfinished (a
  /// backward ran and finish_gradient_synchronization() was not called yet): its buckets may be on the wire.
  void set_requires_gradient_sync(bool sync) override;
  bool requires_gradient_sync() const override;

  /// Replaces how a bucket is reduced (PyTorch's register_comm_hook). The default is allreduce_hook().
  /// Every rank must register the same hook. Throws std::logic_error when called in the middle of a step
  /// (buckets in flight) or with an empty hook.
  void register_comm_hook(CommHook hook);
  /// Seam for work per bucket (PyTorch's comm-hook future's then()): `f(b)` runs inside
  /// finish_gradient_synchronization() as soon as bucket b's average is back in its parameters' .grad(),
  /// while buckets b+1, b+2, ... may still be on the wire; on the thread calling finish, with this
  /// object's lock held (f must not call back into it). Empty f removes it. Throws std::logic_error in
  /// the middle of a step.
  void on_bucket_averaged(std::function<void(size_t bucket)> f);

  /// Bytes handed to collectives since construction, per rank (the hook's BucketWork::wire_bytes):
  /// with the fp16 hook, half of the default's.
  int64_t wire_bytes() const { return wire_bytes_total_.load(); }

  /// Unique parameters (frozen ones too, tied weights once) in registration order; buckets() indexes them.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  const std::vector<std::string>& parameter_names() const { return names_; }
  /// Indices into parameters() per bucket, bucket 0 (launched first) first.
  const std::vector<std::vector<size_t>>& buckets() const { return assignment_; }
  size_t bucket_count() const { return assignment_.size(); }
  double bucket_cap_mb() const { return cap_mb_; }
  int world_size() const { return pg_.world_size(); }
  /// One line per bucket: "bucket 0: 1000 B = fc3.weight" (for printing).
  std::string describe_buckets() const;
  /// Bucket all-reduces launched since construction. Lock-free: may be read from another autograd hook.
  int64_t launched_count() const { return launched_total_.load(); }
  /// Launches (index = bucket) of the step in progress or, between steps, of the last finished step.
  std::vector<LaunchRecord> launches() const;

 protected:
  /// Seam for subclasses: parameter `param` (index into parameters()) had its gradient copied into its
  /// bucket in a synchronized step, by its hook during backward or, for a parameter without a gradient,
  /// by finish. Called with the lock held, in readiness order, before any bucket it completes is launched.
  virtual void gradient_copied(size_t /*param*/) {}
  /// Seam for subclasses: a synchronization completed (every bucket averaged and copied back, nothing in
  /// flight). Called at the end of finish_gradient_synchronization(), on every rank at the same step,
  /// without the lock: it may issue collectives and call reassign().
  virtual void after_synchronization() {}
  /// Replaces which parameters share a bucket (indices into parameters(), bucket 0 launched first) and
  /// reallocates the buffers. Every trainable parameter must appear exactly once, no frozen one, and
  /// every rank must pass the same assignment. Throws std::logic_error in the middle of a step or for
  /// an assignment that breaks those rules.
  void reassign(std::vector<std::vector<size_t>> assignment);
  ProcessGroup& process_group() const { return pg_; }

 private:
  void check_not_ready(size_t param);   // pre-hook: already ready this step? a second backward
  void on_gradient_ready(size_t param); // post-hook: copy .grad() into its slot, launch what is complete
  void copy_into_slot(size_t param);
  bool synchronize();                   // finish's work, under the lock; false when there was nothing to do
  void build_buffers();             // buckets_ and slots_ from assignment_
  void launch_complete_buckets_in_order(bool during_backward);
  void launch_bucket(size_t bucket, bool during_backward);  // its collective (through hook_) and its record

  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    torch::Tensor buffer;        // flat, contiguous: every gradient of the bucket back to back
    size_t ready = 0;            // gradients copied in this step
    BucketWork work;             // this step's reduction, once launched by the hook
  };
  struct Slot {
    size_t bucket = 0;
    int64_t offset = 0;  // in elements, into the bucket's buffer
    int64_t numel = 0;
  };

  ProcessGroup& pg_;
  double cap_mb_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<size_t>> assignment_;
  std::vector<Slot> slots_;            // per parameter in params_ (meaningful for trainable ones)
  std::vector<size_t> hooked_;         // hook index -> index in params_

  mutable std::mutex mu_;  // hooks run on autograd's thread (another thread for CUDA tensors)
  std::vector<Bucket> buckets_;
  std::vector<char> ready_;            // per parameter in params_, this step
  size_t next_to_launch_ = 0;          // buckets [0, next_to_launch_) are launched this step
  bool in_step_ = false;               // a synchronized backward ran, finish not called yet
  bool sync_off_ = false;              // set_requires_gradient_sync(false) holds: accumulate locally
  bool accumulated_locally_ = false;   // a gradient arrived locally since the last synchronization
  CommHook hook_;
  std::atomic<int64_t> wire_bytes_total_{0};
  std::vector<LaunchRecord> launches_;
  std::atomic<int64_t> launched_total_{0};
  std::function<void(size_t)> bucket_averaged_;  // on_bucket_averaged()'s f, or empty

  std::unique_ptr<AccumulateGradHooks> hooks_;  // last member: destroyed first
};

/// BucketedDdp with `bucket_cap_mb` MB buckets as a dp::Strategy (dp::ddp_strategy()): one optimizer over
/// every parameter after finish; set_requires_gradient_sync(false) accumulates micro-batches locally.
MakeStrategy bucketed_ddp_strategy(double bucket_cap_mb);

}  // namespace dp
