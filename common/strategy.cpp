#include "common/strategy.hpp"

#include "common/params.hpp"

#include <stdexcept>

namespace dp {

DdpStrategy::DdpStrategy(std::unique_ptr<GradSync> sync, std::unique_ptr<torch::optim::Optimizer> opt)
    : sync_(std::move(sync)), opt_(std::move(opt)) {
  if (!opt_) throw std::invalid_argument("DdpStrategy: the optimizer is null");
}

void DdpStrategy::zero_grad() {
  if (sync_) sync_->on_train_batch_start();  // stages 04 and 05 check that the last step finished
  opt_->zero_grad();
}

void DdpStrategy::after_backward() {
  if (sync_) sync_->after_backward();
}

MakeStrategy ddp_strategy(MakeGradSync make) {
  if (!make) throw std::invalid_argument("ddp_strategy: no GradSync factory");
  return [make = std::move(make)](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> model,
                                  const MakeOptimizer& make_optimizer) -> std::unique_ptr<Strategy> {
    auto sync = make(pg, model);  // broadcasts rank 0's weights before the optimizer sees them
    return std::make_unique<DdpStrategy>(std::move(sync), make_optimizer(unique_parameters(*model)));
  };
}

MakeStrategy no_communication() {
  return [](ProcessGroup&, std::shared_ptr<torch::nn::Module> model,
            const MakeOptimizer& make_optimizer) -> std::unique_ptr<Strategy> {
    return std::make_unique<DdpStrategy>(nullptr, make_optimizer(unique_parameters(*model)));
  };
}

}  // namespace dp
