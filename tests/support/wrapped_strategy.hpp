// A dp::Strategy that forwards every call to another: the base of the tests' mutants, each of which
// overrides the one call it breaks.
#pragma once

#include "common/contract/strategy.hpp"

#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace dp::testing {

class WrappedStrategy : public Strategy {
 public:
  explicit WrappedStrategy(std::unique_ptr<Strategy> inner) : inner_(std::move(inner)) {}
  void zero_grad() override { inner_->zero_grad(); }
  UnitRunner runner() override { return inner_->runner(); }
  void after_backward() override { inner_->after_backward(); }
  void set_requires_gradient_sync(bool sync) override { inner_->set_requires_gradient_sync(sync); }
  // A mutant's clipping (set_max_grad_norm() on the wrapper) runs here, on the inner scheme's gradient spread:
  // right for the schemes whose gradient is final before step() (DDP, FSDP, HSDP; not ZeRO-1).
  void step() override {
    clip_before_step();
    inner_->step();
  }
  GradientSpread gradient_spread() override { return inner_->gradient_spread(); }
  int64_t calls_per_step() const override { return inner_->calls_per_step(); }
  TrainingBytes bytes() const override { return inner_->bytes(); }
  double sent_bytes_per_step() const override { return inner_->sent_bytes_per_step(); }
  double buffer_bytes() const override { return inner_->buffer_bytes(); }
  double gathered_peak_bytes() const override { return inner_->gathered_peak_bytes(); }
  std::string describe() const override { return "mutant of " + inner_->describe(); }
  torch::ScalarType compute_dtype(const torch::nn::Module& m) const override { return inner_->compute_dtype(m); }
  std::vector<std::pair<std::string, torch::Tensor>> full_parameters() override { return inner_->full_parameters(); }
  FullState full_state() override { return inner_->full_state(); }
  void load_full_state(const FullState& s) override { inner_->load_full_state(s); }
  std::vector<torch::optim::Optimizer*> optimizers() override { return inner_->optimizers(); }

 protected:
  std::unique_ptr<Strategy> inner_;
};

}  // namespace dp::testing
