// Extension 06a, on stage 06: true ZeRO-1 whose communication starts early (BucketedZero1). Zero1Optimizer
// reduce-scatters the whole gradient buffer once backward is over and all-gathers the whole parameter buffer once its
// step is over: two long waits on a slow link, where stage 05's DDP sends its buckets while backward still runs. Here
// the parameters are grouped into buckets as stage 05 groups them (last layers first, ~25 MB each), and each bucket is
// a flat buffer of its own, padded and cut into N chunks: rank r owns chunk r of every bucket, so every collective is
// spread evenly over the ranks. A bucket's reduce-scatter leaves from a gradient hook the moment backward has finished
// its gradients; step() steps each bucket's chunk and launches its all-gather right away, first layers first.
// step(false) leaves the all-gathers to the next forward: it launches them all as it starts and waits for each unit's
// weights only when it reaches that unit (runner()), so the second half of ZeRO-1's traffic hides behind the next
// forward, which DDP's all-reduce cannot do.
#pragma once

#include "common/comm/grad_hooks.hpp"  // AccumulateGradHooks
#include "common/comm/shard_comm.hpp"
#include "common/contract/strategy.hpp"
#include "common/dist/dist.hpp"
#include "common/measure/memory.hpp"                  // count_training_bytes, TrainingBytes
#include "common/model/units.hpp"                     // UnitRunner, ModuleUnits
#include "stages/06_sharded_opt/zero1_optimizer.hpp"  // FlatLayout, flattenable_parameters

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace dp {

/// ZeRO-1 in buckets, with reduce-scatters launched from gradient hooks during backward.
///
/// Usage, on every rank (parameters broadcast from rank 0 first, as for Zero1Optimizer):
///   BucketedZero1 zero(pg, model->parameters(), make_local, 25.0);
///   loop: zero.zero_grad(); loss(model->forward(x)).backward(); zero.step();
/// or, to hide the all-gathers behind the next forward (a model with forward_units, as the Transformer):
///   auto run = zero.runner(model->units());
///   loop: zero.zero_grad(); loss(model->forward_units(x, run)).backward(); zero.step(false);
///   and zero.wait_parameters() before reading the weights any other way (evaluation, checkpoints).
/// One synchronized backward per step: to accumulate micro-batches, set_requires_gradient_sync(false)
/// before all but the last backward (they only add into the buffers); a second synchronized backward
/// before step() throws std::logic_error. The arithmetic is Zero1Optimizer's: each element's gradient is
/// the sum over ranks in rank order, divided by N; only where the buffers are cut differs.
class BucketedZero1 {
 public:
  /// `params`: tied weights once, frozen ones left alone (as Zero1Optimizer); float32 leaves on pg's device.
  /// `make_local` is called once per bucket, with that bucket's chunk as its one parameter.
  BucketedZero1(ProcessGroup& pg, const std::vector<torch::Tensor>& params, const MakeOptimizer& make_local,
                double bucket_cap_mb = 25.0);
  ~BucketedZero1();
  BucketedZero1(const BucketedZero1&) = delete;
  BucketedZero1& operator=(const BucketedZero1&) = delete;

  /// `BucketedZero1::make<torch::optim::AdamW>(pg, model->parameters(), AdamWOptions(1e-3), 25.0)`.
  template <typename Opt, typename Options>
  static std::unique_ptr<BucketedZero1> make(ProcessGroup& pg, const std::vector<torch::Tensor>& params,
                                             const Options& defaults, double bucket_cap_mb = 25.0) {
    return std::make_unique<BucketedZero1>(
        pg, params,
        [defaults](std::vector<torch::Tensor> chunk) {
          return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<Opt>(std::move(chunk), defaults));
        },
        bucket_cap_mb);
  }

  /// Finishes the reduce-scatters still in flight (their sums are dropped), zeroes every gradient. Local
  /// arithmetic; every rank must call it at the same point.
  void zero_grad();
  /// Launches the buckets backward left incomplete (unused parameters: zero gradient), then, last bucket
  /// first (the one holding the first layers): waits for its reduce-scatter, divides by N, steps its chunk,
  /// launches its all-gather, and returns once every parameter is back. step(false) steps the chunks only:
  /// the next forward through runner() launches the all-gathers and waits for each unit's weights when it
  /// reaches that unit (or wait_parameters() does both). A collective: every rank calls it.
  void step(bool wait_for_parameters = true);
  /// Launches the all-gathers step(false) left, waits for every one in flight: the model's weights are this
  /// step's afterwards. A collective after step(false).
  void wait_parameters();
  /// false: the hooks only keep each gradient in its bucket (local accumulation, no reduce-scatter);
  /// true (the default): the next backward launches the buckets with everything accumulated.
  void set_requires_gradient_sync(bool sync) { sync_ = sync; }
  /// A UnitRunner for forward_units(): launches the all-gathers step(false) left (at unit 0), and before
  /// unit u runs waits for those of the buckets holding its parameters. `units` are the model's (model->units()); the
  /// runner refers to this object.
  UnitRunner runner(const ModuleUnits& units);

  size_t num_buckets() const { return buckets_.size(); }
  /// Bucket b's split over the ranks (bucket 0 holds the last parameters registered).
  const FlatLayout& layout(size_t b) const { return buckets_.at(b).layout; }
  /// Bucket b's optimizer; its one parameter is this rank's chunk of that bucket.
  torch::optim::Optimizer& local(size_t b) { return *buckets_.at(b).local; }
  /// The distinct trainable parameters, bucket by bucket.
  const std::vector<torch::Tensor>& parameters() const { return params_; }
  /// Reduce-scatters launched by a gradient hook (during backward) in the last step, out of num_buckets().
  size_t launched_during_backward() const { return launched_in_backward_; }
  /// Sum over the buckets of the optimizer state's bytes (what Zero1Optimizer's local() holds).
  int64_t state_bytes() const;
  /// count_training_bytes() of `model` with every bucket's optimizer state.
  TrainingBytes training_bytes(const torch::nn::Module& model) const;
  /// Bytes of the buffers this design adds: the chunks' gradients and the all-to-all buffers.
  int64_t buffer_bytes() const;
  /// "adamw", "adam", "sgd" or "custom".
  const std::string& kind() const { return kind_; }
  /// One line: the optimizer, buckets, elements, the collectives in use.
  std::string describe() const;

 private:
  struct Bucket {
    std::vector<size_t> params;  // indices into params_, in buffer order
    FlatLayout layout;
    torch::Tensor flat_params, flat_grads, scratch, shard;  // shard: a leaf aliasing chunk r of flat_params
    std::unique_ptr<torch::optim::Optimizer> local;
    size_t ready = 0;          // parameters whose gradient backward has finished
    ReduceScatterWork reduce;  // in flight from launch until step()
    Work gather;               // in flight from step() until runner() or wait_parameters()
  };
  torch::Tensor grad_view(size_t i) const;  // params_[i]'s region of its bucket's gradient buffer
  void adopt_gradient(size_t i);            // the gradient into the buffer, if backward put it elsewhere
  void before_accumulate(size_t i);
  void after_accumulate(size_t i);
  void launch_complete_buckets(bool during_backward);
  void finish_reduces();
  void launch_gather(size_t k);
  void launch_due_gathers();  // after step(false): every bucket's all-gather, first layers first
  void wait_for_gather(size_t k);

  ProcessGroup* pg_;
  std::vector<torch::Tensor> params_;
  std::vector<size_t> bucket_of_, offset_of_;  // per parameter: its bucket, its offset in that bucket
  std::vector<char> ready_;
  bool sync_ = true;  // set_requires_gradient_sync()
  std::vector<Bucket> buckets_;
  size_t next_to_launch_ = 0, launched_in_backward_ = 0;
  bool gathers_due_ = false;  // step(false) stepped the chunks; their all-gathers wait for the next forward
  double cap_mb_;
  std::string kind_;
  std::unique_ptr<AccumulateGradHooks> hooks_;  // last: removed first
};

/// BucketedZero1 as a dp::Strategy: reduce-scatters launched from backward, each bucket's chunk stepped by
/// the MakeOptimizer's optimizer. With `overlap_gathers` the all-gathers wait for the next forward (the model
/// must have units: dp::UnitModel; std::invalid_argument otherwise).
MakeStrategy bucketed_zero1_strategy(double bucket_cap_mb = 25.0, bool overlap_gathers = false);

}  // namespace dp
