// Hooks on the AccumulateGrad nodes: how a strategy learns, during backward, that a gradient is final.
#include "common/comm/grad_hooks.hpp"

#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/utils/lambda_post_hook.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <stdexcept>

namespace dp {

const char* const kBackwardTwiceMessage =
    "backward ran twice before finish_gradient_synchronization(): call it after every backward "
    "(to accumulate gradients over several backward passes, run all but the last inside "
    "a dp::NoSyncGuard, on a variant that implements set_requires_gradient_sync())";
const char* const kStepUnfinishedMessage =
    "a new step started while the previous one still has gradients in flight: call "
    "finish_gradient_synchronization() after every backward";

namespace {

// LibTorch 1.13 has a lambda wrapper for post-hooks only; this is its twin for pre-hooks.
struct LambdaPreHook : torch::autograd::FunctionPreHook {
  explicit LambdaPreHook(std::function<void()> fn) : fn_(std::move(fn)) {}
  torch::autograd::variable_list operator()(const torch::autograd::variable_list& grads) override {
    fn_();
    return grads;  // the incoming gradients, unchanged
  }
  std::function<void()> fn_;
};

}  // namespace

AccumulateGradHooks::AccumulateGradHooks(const std::vector<torch::Tensor>& params, Callback before_accumulate,
                                         Callback after_accumulate) {
  entries_.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const auto& p = params[i];
    if (!p.requires_grad() || !p.is_leaf())
      throw std::invalid_argument("AccumulateGradHooks: parameters must be leaves with requires_grad");
    // [hook]
    // Why the AccumulateGrad node and not p.register_hook(): a tensor hook sees one incoming gradient
    // *before* it is added to .grad(). AccumulateGrad is the last node to touch .grad(), so right after
    // it runs, .grad() is this backward's complete gradient; a tied weight's two uses arrive summed.
    //
    // The parameter only holds a weak reference to its AccumulateGrad; if nobody holds a strong one,
    // it is freed with the graph and the next backward builds a fresh node without our hooks. Keep it.
    compat::NodePtr node = torch::autograd::impl::grad_accumulator(p);
    auto pre = std::make_unique<LambdaPreHook>([before_accumulate, i] { before_accumulate(i); });
    Entry e{node, pre.get(), 0};
    node->add_pre_hook(std::move(pre));
    e.post = node->add_post_hook(std::make_unique<torch::autograd::utils::LambdaPostHook>(
        [after_accumulate, i](const torch::autograd::variable_list& outputs,
                              const torch::autograd::variable_list& /*inputs*/) {
          after_accumulate(i);
          return outputs;  // AccumulateGrad has no outputs; pass them through
        }));
    // [hook]
    entries_.push_back(std::move(e));
  }
}

AccumulateGradHooks::~AccumulateGradHooks() {
  for (auto& e : entries_) {
    e.node->del_post_hook(e.post);
    auto& pre = e.node->pre_hooks();  // 1.13 has no del_pre_hook: find ours by address
    pre.erase(std::remove_if(pre.begin(), pre.end(), [&](const auto& h) { return h.get() == e.pre; }), pre.end());
  }
}

void LaunchLog::start_step() {
  std::lock_guard<std::mutex> lock(mu_);
  step_.clear();
}

void LaunchLog::record(size_t index, bool during_backward) {
  std::lock_guard<std::mutex> lock(mu_);
  step_.push_back({index, std::chrono::steady_clock::now(), during_backward});
  ++total_;
}

std::vector<LaunchRecord> LaunchLog::step() const {
  std::lock_guard<std::mutex> lock(mu_);
  return step_;
}

}  // namespace dp
