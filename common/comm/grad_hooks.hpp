// A callback on each parameter's AccumulateGrad node, so a strategy learns the moment a gradient is final
// and can start communicating while backward runs: what PyTorch 2.1+ offers in Python as
// p.register_post_accumulate_grad_hook(f), which LibTorch 1.13's C++ API lacks.
#pragma once

#include "common/base/libtorch.hpp"

#include "common/base/c10d_compat.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <vector>

namespace torch::autograd {
struct Node;
struct FunctionPreHook;
}  // namespace torch::autograd

namespace dp {

/// Two hooks on the AccumulateGrad node of each parameter in a list, removed again by the destructor.
///
/// AccumulateGrad is the autograd node that adds an incoming gradient into a leaf's .grad(). For
/// parameter `params[i]`, `before_accumulate(i)` runs just before that addition (it may throw to stop
/// backward before .grad() is touched) and `after_accumulate(i)` runs right after it, when .grad()
/// holds this backward's whole gradient. A weight used twice (tied) still has one AccumulateGrad node,
/// which runs once per backward with the sum of both uses.
///
/// Not thread-safe against a backward running concurrently with construction or destruction.
class AccumulateGradHooks {
 public:
  using Callback = std::function<void(size_t index)>;
  /// `params` must be leaves with requires_grad (trainable parameters), each listed once.
  AccumulateGradHooks(const std::vector<torch::Tensor>& params, Callback before_accumulate, Callback after_accumulate);
  /// Removes exactly the hooks this object added (other hooks on the same nodes stay).
  ~AccumulateGradHooks();
  AccumulateGradHooks(const AccumulateGradHooks&) = delete;
  AccumulateGradHooks& operator=(const AccumulateGradHooks&) = delete;

 private:
  struct Entry {
    compat::NodePtr node;                             ///< the parameter's AccumulateGrad (kept alive)
    torch::autograd::FunctionPreHook* pre = nullptr;  ///< our pre-hook, found again by address
    uintptr_t post = 0;                               ///< key returned by Node::add_post_hook, for del_post_hook
  };
  std::vector<Entry> entries_;
};

/// What a hook-driven variant throws (as std::logic_error, after its class name) when a parameter's
/// gradient arrives a second time before finish_gradient_synchronization(): its first all-reduce may
/// still be in flight.
extern const char* const kBackwardTwiceMessage;
/// What it throws (the same way) when on_train_batch_start() finds the previous step unfinished.
extern const char* const kStepUnfinishedMessage;

/// One all-reduce launch of a hook-driven variant, for tests and benchmarks (steady_clock, comparable
/// with your own timestamps).
struct LaunchRecord {
  size_t index = 0;  ///< what the variant launched: a parameter's position, or a bucket's index
  std::chrono::steady_clock::time_point time;  ///< when the collective was handed to the process group
  bool during_backward = true;  ///< false when finish_gradient_synchronization() launched it (no gradient this step)
};

/// The launches of a hook-driven variant (stages 04 and 05): a lock-free count since construction, and the
/// records of the step in progress or, between steps, of the last one. Thread-safe.
class LaunchLog {
 public:
  /// The first launch of a new step is next: forget the last step's records.
  void start_step();
  /// Index `index` was handed to the process group just now.
  void record(size_t index, bool during_backward);
  /// This step's records (the last step's between steps), in launch order.
  std::vector<LaunchRecord> step() const;
  /// Launches since construction; lock-free, so an autograd hook may read it.
  int64_t total() const { return total_.load(); }

 private:
  mutable std::mutex mu_;
  std::vector<LaunchRecord> step_;
  std::atomic<int64_t> total_{0};
};

}  // namespace dp
