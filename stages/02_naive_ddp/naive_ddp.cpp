#include "stages/02_naive_ddp/naive_ddp.hpp"

#include "common/model/models.hpp"
#include "common/model/params.hpp"

namespace dp {

// [construct]
NaiveDdp::NaiveDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) : module(std::move(m)), pg_(pg) {
  // Ranks may have initialised their models differently (different seeds, different files): from
  // here on they must be the same model, or averaging gradients would average unrelated models.
  broadcast_parameters(pg_, *module);
  // A tied weight appears twice in LibTorch's parameters(); reducing it twice would double its
  // gradient, so we keep each tensor once. Frozen parameters get no gradient and are skipped.
  params_ = unique_parameters(*module, /*trainable_only=*/true);
}
// [construct]

// [after_backward]
void NaiveDdp::after_backward() {
  // [exercise 02.1: average every gradient over the ranks]
  for (auto& p : params_) {
    if (!p.grad().defined()) continue;  // unused in this forward on every rank: nothing to average
    auto g = p.mutable_grad();
    pg_.all_reduce(g);         // one blocking collective per tensor: W-1 ranks wait for each
    g.div_(pg_.world_size());  // Gloo has no AVG: sum, then divide
  }
  // [/exercise 02.1]
  // Weakness: a Transformer has 9 tensors per layer, so ~100-400 separate calls, each paying the
  // collective's fixed latency. Stage 03 packs them into one call.
}
// [after_backward]

}  // namespace dp
