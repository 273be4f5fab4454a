#include "stages/03_flat/flat_ddp.hpp"

#include "common/model/models.hpp"
#include "common/model/params.hpp"

namespace dp {

FlatDdp::FlatDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) : module(std::move(m)), pg_(pg) {
  broadcast_parameters(pg_, *module);
  params_ = unique_parameters(*module, /*trainable_only=*/true);
}

// [after_backward]
void FlatDdp::after_backward() {
  // [exercise 03.1: flatten the gradients, all-reduce once, copy the averages back]
  // A parameter without a gradient contributes zeros, so every rank packs the same layout.
  std::vector<torch::Tensor> grads;
  for (auto& p : params_)
    grads.push_back(p.grad().defined() ? p.grad().reshape({-1}) : torch::zeros({p.numel()}, p.options()));
  auto flat = torch::cat(grads);          // copy 1: every gradient into one [total] buffer
  pg_.all_reduce(flat, "all gradients");  // one collective: the fixed latency is paid once
  flat.div_(pg_.world_size());
  int64_t offset = 0;
  for (auto& p : params_) {  // copy 2: back into each .grad
    auto slice = flat.narrow(0, offset, p.numel()).view_as(p);
    if (p.grad().defined()) p.mutable_grad().copy_(slice);
    offset += p.numel();
  }
  // [/exercise 03.1]
  // Weakness: nothing is sent until backward has finished, so the network idles during backward
  // and the CPU/GPU idles during the all-reduce. Stage 04 starts sending while backward still runs.
}
// [after_backward]

}  // namespace dp
