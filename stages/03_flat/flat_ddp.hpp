// Stage 03's gradient synchronization: all gradients packed into one buffer, one all-reduce.
#pragma once

#include "common/contract/grad_sync.hpp"

namespace dp {

/// Flat DDP: like NaiveDdp, but after backward every gradient is copied into one contiguous buffer,
/// reduced with a single all-reduce, and copied back.
class FlatDdp : public GradSync {
 public:
  FlatDdp(ProcessGroup& pg, std::shared_ptr<torch::nn::Module> module);
  void after_backward() override;
  /// Collectives per step: always one.
  int64_t calls_per_step() const override { return 1; }

  std::shared_ptr<torch::nn::Module> module;

 private:
  ProcessGroup& pg_;
  std::vector<torch::Tensor> params_;  // unique trainable parameters, registration order
};

}  // namespace dp
