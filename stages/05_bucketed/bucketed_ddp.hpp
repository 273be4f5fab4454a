// Stage 05: bucketed data parallelism. Gradients are copied into a few flat buffers ("buckets"), each
// all-reduced with one collective as soon as all its gradients are final, still during backward: a
// collective's fixed cost is paid once per bucket, not once per tensor as in stage 04, and the overlap stays.
#pragma once

#include "common/comm/comm_hook.hpp"
#include "common/comm/grad_hooks.hpp"
#include "common/contract/grad_sync.hpp"
#include "common/contract/strategy.hpp"
#include "common/dist/dist.hpp"
#include "stages/05_bucketed/buckets.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace dp {

/// Data parallelism with one asynchronous all-reduce per bucket of gradients, launched from autograd hooks.
///
/// Usage, on every rank:
///   auto ddp = std::make_shared<BucketedDdp>(pg, model, 25.0);   // 25 MB buckets (keep model for forward)
///   loop: ddp->on_train_batch_start(); opt.zero_grad(); loss = f(model->forward(x_local)); loss.backward();
///         ddp->finish_gradient_synchronization(); opt.step();
/// Every trainable parameter's gradient then holds the average over ranks. The process group must
/// outlive this object. Frozen parameters (requires_grad false) are broadcast but never hooked.
/// Accumulation over K micro-batches: the first K-1 backward passes inside a dp::NoSyncGuard, each loss
/// divided by K, then the K-th outside it and finish: one process's step on all K * B * world rows.
/// Extensions build on its seams (extensions/05*): register_comm_hook(), on_bucket_averaged() and, for
/// subclasses, gradient_copied(), after_synchronization() and reassign().
class BucketedDdp : public GradSync {
 public:
  /// Broadcasts rank 0's parameters and buffers, assigns buckets with assign_buckets() over the unique
  /// parameters, allocates one flat buffer per bucket and hooks every trainable parameter. Throws
  /// dp::UsageError for a cap that is not positive and finite, std::invalid_argument for a bucket that
  /// would mix dtypes or devices.
  BucketedDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> module, double bucket_cap_mb);
  /// The same for a model given as tensors (module stays null): a Python nn.Module's, through python/.
  BucketedDdp(ProcessGroup& pg, const ModelTensors& model, double bucket_cap_mb);
  /// Removes the hooks (hooks_, the last member, goes first). Does not wait for collectives still in
  /// flight (they keep their tensors alive). Not copyable (its mutex and hooks are not).
  ~BucketedDdp() override = default;

  /// The wrapped model. Call forward on your own typed pointer to it (torch::nn::Module has no
  /// virtual forward); its parameters are the ones being synchronized.
  std::shared_ptr<torch::nn::Module> module;

  /// Throws std::logic_error when the previous step's gradients were never finished.
  void on_train_batch_start() override;
  /// Same as finish_gradient_synchronization().
  void after_backward() override { finish_gradient_synchronization(); }
  int64_t calls_per_step() const override { return static_cast<int64_t>(bucket_count()); }  // one per bucket
  /// The buckets' flat buffers: a second copy of every gradient (4 bytes per element).
  int64_t buffer_bytes() const override;
  /// Launches the buckets not launched yet (a parameter that got no gradient this step contributes its
  /// .grad(), zeros if none), waits for all of them and copies each bucket's average back into .grad().
  /// Does nothing while sync is off or when no gradient arrived since the last call. after_synchronization()
  /// runs outside the lock: a subclass may issue collectives there.
  void finish_gradient_synchronization() {
    if (synchronize()) after_synchronization();
  }

  /// PyTorch's DDP.no_sync() (dp::NoSyncGuard sets it for a scope): after false, backward accumulates into
  /// .grad() with no communication and finish does nothing; after true, the next backward synchronizes the
  /// whole accumulated .grad(). Throws std::logic_error on false while a synchronization is unfinished.
  void set_requires_gradient_sync(bool sync) override;
  bool requires_gradient_sync() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return !sync_off_;
  }

  /// How a bucket is reduced (PyTorch's register_comm_hook; common/comm/comm_hook.hpp): the same hook on every
  /// rank. The default is allreduce_hook(). Throws std::logic_error mid-step or for an empty hook.
  void register_comm_hook(CommHook hook);
  /// `f(b)` runs inside finish as soon as bucket b's average is back in its parameters' .grad(), while
  /// later buckets may still be on the wire (PyTorch's comm-hook future's then()); with this object's lock
  /// held (f must not call back into it). Empty f removes it. Throws std::logic_error mid-step.
  void on_bucket_averaged(std::function<void(size_t bucket)> f);

  /// Unique parameters (frozen ones too, tied weights once) in registration order; buckets() indexes them.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  /// Their dotted names, same order.
  const std::vector<std::string>& parameter_names() const { return names_; }
  /// Indices into parameters() per bucket, bucket 0 (launched first) first.
  const std::vector<std::vector<size_t>>& buckets() const { return assignment_; }
  size_t bucket_count() const { return assignment_.size(); }
  double bucket_cap_mb() const { return cap_mb_; }
  int world_size() const { return pg_.world_size(); }
  /// One line per bucket: "bucket 0: 1000 B = fc3.weight" (for printing).
  std::string describe_buckets() const;
  /// All-reduces launched since construction. Lock-free: may be read from another autograd hook.
  int64_t launched_count() const { return log_.total(); }
  /// The launches of the step in progress or, between steps, of the last finished step, in launch order.
  /// A launch's index is its bucket's.
  std::vector<LaunchRecord> launches() const { return log_.step(); }

 protected:
  /// Parameter `param` (index into parameters()) was copied into its bucket, by its hook or, without a
  /// gradient, by finish: with the lock held, in readiness order, before the bucket it completes launches.
  virtual void gradient_copied(size_t /*param*/) {}
  /// A synchronization completed (nothing in flight): at the end of finish, on every rank at the same
  /// step, without the lock, so it may issue collectives and call reassign().
  virtual void after_synchronization() {}
  /// Replaces which parameters share a bucket (indices into parameters(), bucket 0 launched first; every
  /// trainable parameter once, no frozen one, the same on every rank) and reallocates the buffers.
  /// Throws std::logic_error mid-step or for an assignment that breaks those rules.
  void reassign(std::vector<std::vector<size_t>> assignment);
  ProcessGroup& process_group() const { return pg_; }

 private:
  void check_not_ready(size_t i);    // pre-hook: already ready this step? then a second backward
  void on_gradient_ready(size_t i);  // post-hook: copy .grad() into its slot, launch what is complete
  void copy_into_slot(size_t i);     // .grad() (zeros if none) into its slot, counted as ready
  std::unique_lock<std::mutex> lock_between_steps(const char* what);  // std::logic_error mid-step
  bool synchronize();    // finish's work, under the lock; false when there was nothing to do
  void build_buffers();  // buckets_, slots_ and bucket_of_ from assignment_
  void launch_complete_buckets_in_order(bool during_backward);
  void launch_bucket(size_t bucket, bool during_backward);  // its collective (through hook_) and its record

  struct Bucket {
    std::vector<size_t> params;  // indices into params_
    torch::Tensor buffer;        // flat, contiguous: every gradient of the bucket back to back
    size_t ready = 0;            // gradients copied in this step
    BucketWork work;             // this step's reduction, once launched by the hook
  };

  ProcessGroup& pg_;
  double cap_mb_;
  std::vector<torch::Tensor> params_;
  std::vector<std::string> names_;
  std::vector<std::vector<size_t>> assignment_;
  std::vector<torch::Tensor> slots_;  // per parameter in params_: a view into its bucket's buffer, its shape
  std::vector<size_t> bucket_of_;     // per parameter in params_: which bucket (trainable ones only)
  std::vector<size_t> hooked_;        // hook index -> index in params_

  mutable std::mutex mu_;    // hooks run on autograd's thread (another thread for CUDA tensors)
  bool in_step_ = false;     // a synchronization began; finish not called yet
  std::vector<char> ready_;  // per parameter in params_, this step
  std::vector<Bucket> buckets_;
  size_t next_to_launch_ = 0;         // buckets [0, next_to_launch_) are launched this step
  bool sync_off_ = false;             // set_requires_gradient_sync(false) holds: accumulate locally
  bool accumulated_locally_ = false;  // a gradient arrived locally since the last synchronization
  CommHook hook_;
  LaunchLog log_;                                // for launched_count() and launches()
  std::function<void(size_t)> bucket_averaged_;  // on_bucket_averaged()'s f, or empty

  std::unique_ptr<AccumulateGradHooks> hooks_;  // last member: destroyed first, before the state it uses
};

/// BucketedDdp with `bucket_cap_mb` MB buckets as a dp::Strategy (dp::ddp_strategy()); micro-batches
/// accumulate locally under set_requires_gradient_sync(false).
MakeStrategy bucketed_ddp_strategy(double bucket_cap_mb);

}  // namespace dp
