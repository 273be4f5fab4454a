// Stage 07: FSDP (ZeRO-3). A rank keeps 1/N of each unit's parameters, gradients and optimizer state and
// gathers a unit's full weights just before it computes (in forward, and again in backward), freeing them
// after; a unit's gradients are reduce-scattered as soon as its backward is done.
#pragma once

#include "common/comm/grad_hooks.hpp"  // AccumulateGradHooks
#include "common/comm/shard_comm.hpp"
#include "common/dist/dist.hpp"
#include "common/model/params.hpp"      // ModelTensors
#include "common/model/units.hpp"       // UnitRunner, ModuleUnits, TensorUnit
#include "common/state/full_state.hpp"  // ShardedParams

#include "common/base/libtorch.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// How Fsdp shards, gathers and computes.
struct FsdpOptions {
  /// Free a unit's gathered weights after its forward (ZeRO-3: gather again for backward). false keeps
  /// them until the unit's backward is done (ZeRO-2-like: one all-gather fewer per unit, more memory).
  /// The last unit is never freed after forward: its backward starts at once.
  bool reshard_after_forward = true;
  /// dtype of the gathered weights the units compute with: kFloat32, kBFloat16 or kHalf. The shards the
  /// optimizer steps (master weights) and the reduce-scattered gradients are fp32 either way.
  torch::ScalarType compute_dtype = torch::kFloat32;
};

/// "float32, reshard after forward", "bfloat16, keep until backward", ...: how the checks' lines and the
/// benchmark's rows name an FsdpOptions.
std::string fsdp_mode_name(const FsdpOptions& f);

/// True for the modules whose weights Fsdp shards: Linear and Embedding (CS336 2026's rule); the
/// parameters of every other module (RMSNorm) are replicated.
bool is_sharded_module(const torch::nn::Module& m);
/// The dtype forward and backward compute with `m`'s own parameters: the compute dtype for the sharded
/// modules (gathered in it), fp32 for the rest. What a mixed-precision reference casts (dp::reference_backward()).
torch::ScalarType compute_dtype_of(const torch::nn::Module& m, const FsdpOptions& opts);

/// FSDP over a model made of units (ModuleUnits, run through a UnitRunner). Usage, on every rank:
///   Fsdp fsdp(pg, model, model->units(), {});
///   torch::optim::AdamW opt(fsdp.parameters(), ...);        // the shards, then the replicated tensors
///   loop: opt.zero_grad(); lm_loss(model->forward_units(tokens, fsdp.runner()), targets).backward();
///         fsdp.finish_gradient_synchronization(); opt.step();
/// Between steps the model's sharded parameters keep their shapes but own no memory; read them with
/// gather_full_parameters(). The replicated ones (is_sharded_module()) are whole, their gradients all-reduced.
class Fsdp {
 public:
  /// Broadcasts rank 0's parameters, shards every unit and frees the full weights. Throws
  /// std::invalid_argument when a trainable parameter is in no unit or in two, or units are empty.
  Fsdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model, const ModuleUnits& units, FsdpOptions opts = {});
  /// The same for a model given as tensors (a Python nn.Module's, through python/), each trainable one in
  /// exactly one unit (the module constructor checks that; this one trusts its caller).
  Fsdp(ProcessGroup& pg, const ModelTensors& model, std::vector<TensorUnit> units, FsdpOptions opts = {});
  virtual ~Fsdp();
  Fsdp(const Fsdp&) = delete;
  Fsdp& operator=(const Fsdp&) = delete;

  /// Pass it to the model's forward_units(tokens, run): gathers before each unit, prefetches the next one,
  /// frees after, and arms the unit's backward.
  UnitRunner runner();
  /// What the optimizer steps: each unit's fp32 shard (1-D, its chunk), then the replicated parameters.
  std::vector<torch::Tensor> parameters() const { return sharding().pieces(); }
  /// Call after every backward, before the optimizer: completes every reduce-scatter and adds the mean
  /// over the ranks to each shard's gradient (fp32, the shard's shape; set when undefined), and
  /// all-reduces the replicated gradients (then / N). Gradient accumulation is K forward/backward/finish
  /// rounds before one optimizer step: the shard gradients add up as .grad does, each micro-batch paying
  /// its own gathers and reduce-scatter, and no rank ever holds a full-size gradient between rounds.
  void finish_gradient_synchronization();
  /// How the model is held (per unit its layout, sharded tensors and shard; the replicated tensors): what
  /// gathers it whole and cuts it back for checks and checkpoints at any world size (common/state/full_state.hpp).
  ShardedParams sharding() const;
  /// Every parameter in full, fp32, named as in model->named_parameters() (a collective; rank order).
  std::vector<std::pair<std::string, torch::Tensor>> gather_full_parameters() { return sharding().gather_named(pg_); }

  size_t unit_count() const { return units_.size(); }
  /// Parameters P (sharded + replicated), and of them sharded.
  int64_t num_parameters() const { return sharded_numel_ + replicated_numel_; }
  int64_t sharded_parameters() const { return sharded_numel_; }
  /// Bytes of gathered (full) weights allocated now, and the most at any moment since construction.
  int64_t gathered_bytes() const { return gathered_now_; }
  int64_t peak_gathered_bytes() const { return gathered_peak_; }
  /// All-gathers, reduce-scatters and all-reduces (of the replicated gradients) since construction; a
  /// step at reshard_after_forward: 2U - 1, U, and 1 when there are replicated parameters and N > 1.
  int64_t all_gathers() const { return gathers_; }
  int64_t reduce_scatters() const { return reduce_scatters_; }
  int64_t all_reduces() const { return all_reduces_; }
  /// Bytes this rank has sent since construction by ring arithmetic: (N-1)/N of each gathered or
  /// reduce-scattered buffer, 2(N-1)/N of the replicated all-reduce.
  double sent_bytes() const { return sent_bytes_; }
  /// One line: ranks, units, parameters sharded, the options.
  std::string describe() const;

 protected:
  // A unit's forward: gather it (and prefetch the next) before `body`, free it after (the workbook's
  // exercise 07.1; virtual so that a test can plant the classic slips). runner() checks that `body` finds
  // the unit gathered.
  virtual torch::Tensor run_unit(size_t u, const std::function<torch::Tensor()>& body);
  void launch_gather(size_t u);
  void wait_gathered(size_t u);
  void free_full(size_t u);
  /// false: this backward's gradients stay whole in the parameters' .grad for the next backward to add to,
  /// with no reduce-scatter or all-reduce (stage 10's HSDP accumulating without communication).
  virtual bool reduce_this_backward() const { return true; }
  /// Unit u's reduce-scatter completed and its mean was added to the shard's gradient (stage 10's HSDP sends it
  /// on across nodes from here, while backward goes on).
  virtual void after_shard_reduced(size_t /*u*/) {}
  /// How unit u travels (extension 07c sends it in fewer bytes), each launched and counted in sent_bytes(): every
  /// rank's fp32 `shard` ([chunk]) gathered into `full` ([padded], the compute dtype) by the handle's wait(); every
  /// rank's gradient `flat` (fp32 [padded]) summed into this rank's `out` ([chunk]) by its wait().
  virtual Work gather_unit(size_t u, const torch::Tensor& shard, torch::Tensor& full);
  virtual ReduceScatterWork reduce_scatter_unit(size_t u, torch::Tensor& flat, torch::Tensor& out);
  void count_sent(double bytes) { sent_bytes_ += bytes; }

 private:
  enum class State { freed, in_flight, gathered };
  struct Unit {
    std::vector<torch::Tensor> sharded, replicated;  // the model's own parameter tensors
    std::vector<int64_t> offsets;                    // per sharded tensor, into the flat buffer
    FlatLayout layout;
    torch::Tensor shard;  // fp32 [chunk], the master weights; what the optimizer steps
    torch::Tensor full;   // compute dtype [padded]; sharded tensors are views of its storage
    State state = State::freed;
    Work gather;
    size_t ready = 0;          // sharded gradients accumulated this backward
    bool scattered = false;    // reduce-scatter launched this backward
    torch::Tensor grad_flat;   // fp32 [padded]: this backward's full-size gradient, until its reduce-scatter ends
    torch::Tensor grad_shard;  // fp32 [chunk]: the shard's .grad when the optimizer left it undefined
    torch::Tensor rs_out;      // fp32 [chunk]: a view of a scatter_out_ slot, the sum over the ranks
    ReduceScatterWork rs;
  };

  void require_gathered(size_t u) const;
  void before_unit_backward(size_t u);
  void on_gradient_ready(size_t hooked);
  void launch_reduce_scatter(size_t u);
  void complete_reduce_scatter(size_t u);
  double ring_share() const { return double(pg_.world_size() - 1) / pg_.world_size(); }

  ProcessGroup& pg_;
  std::shared_ptr<torch::nn::Module> model_;                  // null when given as tensors
  std::vector<std::pair<std::string, torch::Tensor>> named_;  // the trainable parameters, named
  FsdpOptions opts_;
  std::vector<Unit> units_;
  std::vector<size_t> unit_of_hook_;   // hook index -> its unit
  std::vector<char> grad_seen_;        // per hook index: gradient accumulated this backward
  std::vector<size_t> scatter_order_;  // units reduce-scattered this backward, in launch order
  size_t scatters_done_ = 0;           // scatter_order_[0, scatters_done_) are completed
  static constexpr size_t kReduceScattersInFlight = 2;
  // One output buffer per reduce-scatter in flight (the largest chunk), apart from the gradients the
  // optimizer reads: a second micro-batch's sum must not overwrite the first's before it is added.
  torch::Tensor scatter_out_[kReduceScattersInFlight];
  int64_t max_chunk_ = 0;
  int64_t sharded_numel_ = 0, replicated_numel_ = 0;
  int64_t gathered_now_ = 0, gathered_peak_ = 0, gathers_ = 0, reduce_scatters_ = 0, all_reduces_ = 0;
  double sent_bytes_ = 0;
  std::unique_ptr<AccumulateGradHooks> hooks_;  // last member: destroyed first
};

}  // namespace dp
