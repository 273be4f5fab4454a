// Stage 02's gradient synchronization: one blocking all-reduce per parameter, after backward.
#pragma once

#include "common/contract/grad_sync.hpp"

namespace dp {

/// Naive DDP: broadcast rank 0's weights at construction; after backward, all-reduce every
/// gradient on its own and divide by the world size.
class NaiveDdp : public GradSync {
 public:
  NaiveDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> module);
  void after_backward() override;
  /// Collectives per step: one per trainable parameter tensor.
  int64_t calls_per_step() const override { return static_cast<int64_t>(params_.size()); }

  std::shared_ptr<torch::nn::Module> module;

 private:
  ProcessGroup& pg_;
  std::vector<torch::Tensor> params_;  // unique trainable parameters, registration order
};

}  // namespace dp
