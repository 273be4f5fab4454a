// A thin layer over c10d that reads like torch.distributed.
#pragma once

#include "common/base/libtorch.hpp"

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace c10d {
class Store;
}

namespace dp {

/// Options of a process group.
struct DistOptions {
  std::string backend = "gloo";               ///< "gloo" (CPU tensors) or "nccl" (CUDA tensors)
  std::chrono::milliseconds timeout{120000};  ///< rendezvous and collective timeout
  /// Where this rank's tensors live: "cpu" or "cuda" (cuda:LOCAL_RANK mod the GPUs visible); empty means
  /// the backend's own, cpu for gloo and cuda for nccl. Gloo takes CUDA tensors too (it copies them
  /// through host memory), which is how several ranks share one GPU.
  std::string device;
  /// True when this rank's tensors live on a GPU: NCCL's always, Gloo's with device "cuda". Known before
  /// the group forms (memory checks use it).
  bool on_gpu() const { return backend == "nccl" || device == "cuda"; }
};

/// Handle of an asynchronous collective, like torch.distributed's Work object.
class Work {
 public:
  Work() = default;
  explicit Work(std::shared_ptr<void> impl, std::string what, int64_t trace_id = -1)
      : impl_(std::move(impl)), what_(std::move(what)), trace_id_(trace_id) {}
  /// Blocks until the collective finished (on GPU: until the current stream is ordered after it).
  /// Throws std::runtime_error naming the collective when it failed or timed out.
  void wait();
  /// True once the collective completed (successfully or not): its result is in the output tensors, also for a
  /// CUDA tensor received over Gloo (staged through the host; that one completes in wait()). A then() step
  /// runs in wait() only.
  bool completed() const;
  /// True when this handle refers to a collective, or to a then() step not yet run.
  bool valid() const { return impl_ != nullptr || (after_ && *after_); }
  /// What the collective carries, for messages ("all_reduce of 400 bytes").
  const std::string& what() const { return what_; }
  /// This collective with a local step after it: wait() waits, then runs `after` once (every copy of the
  /// handle shares it). What a collective on encoded bytes leaves to do: decode them (common/comm/low_byte.hpp).
  /// `after` may also hold tensors the collective reads, to keep them alive until it ended.
  Work then(std::function<void()> after) &&;

 private:
  std::shared_ptr<void> impl_;
  std::string what_;
  int64_t trace_id_ = -1;                         // its span in a trace being recorded (common/base/trace.hpp), else -1
  std::shared_ptr<std::function<void()>> after_;  // then()'s step; emptied when it has run
  void wait_collective();
};

/// A group of ranks that run collectives together (a c10d backend underneath).
class ProcessGroup {
 public:
  /// Joins the job described by the launch environment: rank 0 hosts a TCP store at
  /// MASTER_ADDR:MASTER_PORT, all ranks rendezvous there within `opts.timeout`.
  static ProcessGroup init_from_env(const DistOptions& opts = {});
  /// Joins through an existing store (threads-as-ranks tests use a c10d::HashStore).
  static ProcessGroup init_with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int world_size,
                                      const DistOptions& opts = {});
  /// init_with_store() on a thread of its own, given up after `opts.timeout` + `grace`: Gloo's connect can
  /// wait for good on a peer that died while the group formed (stage 09's chaos runs saw a survivor stuck so,
  /// its group never formed and no error ever came). Throws std::runtime_error then, naming the group; the
  /// thread stays behind, blocked, owning everything it uses (its group, if it ever forms, is closed there).
  static std::unique_ptr<ProcessGroup> init_with_store_or_give_up(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                                  int world_size, const DistOptions& opts,
                                                                  std::chrono::milliseconds grace);

  /// Wraps a c10d backend made elsewhere, such as the default group of Python's torch.distributed, which the
  /// package in python/ hands over: collectives go to it, and shutdown() leaves it to its maker. `backend`
  /// holds a compat::CommPtr (common/base/c10d_compat.hpp: c10d's type differs between LibTorch 1.13 and 2.x);
  /// `name` is "gloo" or "nccl", `device` where this rank's tensors live.
  static ProcessGroup adopt(std::shared_ptr<void> backend, int rank, int world_size, const std::string& name,
                            torch::Device device);

  /// A group of some of this group's ranks (`ranks`: this group's ranks, increasing, this rank among them),
  /// formed through this group's store under a key of its own: torch.distributed's new_group(). Only the
  /// members call it, but every rank of this group must make the same number of subgroups in the same order
  /// (their keys are numbered, so that two meshes in one job never meet). The subgroup's rank is this rank's
  /// index in `ranks`; `name` ("node", "replica") names it in messages. Throws std::invalid_argument for bad
  /// ranks, dp::UsageError for an adopted group (no store to form it through). A collective of the members.
  ProcessGroup new_group(const std::vector<int>& ranks, const std::string& name);

  int rank() const { return rank_; }
  int world_size() const { return world_; }
  const std::string& backend() const { return backend_; }
  /// Device that this rank's tensors live on: DistOptions::device (by default CPU for gloo,
  /// cuda:LOCAL_RANK for nccl).
  torch::Device device() const { return device_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // `label` says what a collective carries ("bucket 2", a parameter's name); it only names the
  // collective's span in a trace (common/base/trace.hpp) and costs nothing when no trace is recorded.

  /// In-place sum over all ranks (blocking). Gloo has no AVG: divide by world_size() yourself.
  void all_reduce(torch::Tensor& t, const std::string& label = {});
  /// In-place sum over all ranks, returning at once; call wait() on the handle before reading `t`.
  Work all_reduce_async(torch::Tensor& t, const std::string& label = {});
  /// Copies `root`'s tensor into `t` on every rank (blocking).
  void broadcast(torch::Tensor& t, int root, const std::string& label = {});
  /// Asynchronous broadcast.
  Work broadcast_async(torch::Tensor& t, int root, const std::string& label = {});
  /// Every rank's tensor, in rank order (all tensors must have t's shape and dtype).
  std::vector<torch::Tensor> all_gather(const torch::Tensor& t);
  /// List-form all-gather: `outs[r]` receives rank r's `in` (one output per rank, each shaped like `in`;
  /// they may be views of one flat buffer, and this rank's may alias `in`). Asynchronous.
  Work all_gather_async(std::vector<torch::Tensor>& outs, torch::Tensor& in, const std::string& label = {});
  /// All-to-all with equal splits: `in` is cut into world_size() equal chunks along dim 0, chunk j goes to
  /// rank j, and `out`'s chunk i receives rank i's piece. `out` and `in` have the same shape and must not
  /// overlap. Asynchronous.
  Work all_to_all_async(torch::Tensor& out, torch::Tensor& in, const std::string& label = {});
  /// Point to point: sends `t` (contiguous) to rank `peer`, which posts recv_async() with the same `tag`.
  /// Returns at once; `t` must stay unchanged until wait() returns. Stage 01's ring all-reduce is built of these.
  /// Over Gloo a CUDA tensor goes out from a host copy taken at the call (Gloo's sockets move host memory).
  Work send_async(torch::Tensor& t, int peer, int tag, const std::string& label = {});
  /// Point to point: receives into `t` (contiguous, the sender's shape and dtype) from rank `peer`'s
  /// send_async() with the same `tag`. Returns at once; read `t` after wait(). Over Gloo a CUDA tensor is
  /// received into a host buffer that wait() copies into `t`. A send's or receive's handle may be waited on
  /// more than once (c10d's own Gloo handle blocks on a second wait).
  Work recv_async(torch::Tensor& t, int peer, int tag, const std::string& label = {});
  /// True when this backend has a reduce_scatter of its own (NCCL); Gloo has none (common/comm/shard_comm.hpp
  /// builds one from all_to_all_async).
  bool has_native_reduce_scatter() const;
  /// The backend's own reduce_scatter: `in` (world_size() x out.numel() elements) is summed over ranks and
  /// rank r gets chunk r in `out`. Throws dp::UsageError when has_native_reduce_scatter() is false.
  Work reduce_scatter_native_async(torch::Tensor& out, torch::Tensor& in, const std::string& label = {});
  /// Every rank's value, in rank order (small values such as timings or counts).
  std::vector<double> all_gather(double v);
  /// The lowest rank whose `flag` is true, or -1 when no rank's is: every rank gets the same answer, so all
  /// can stop (or throw) together, naming the rank (one all_gather).
  int first_rank_with(bool flag);
  /// Every rank's vector, in rank order (all ranks must pass the same length).
  std::vector<std::vector<double>> all_gather(const std::vector<double>& v);
  /// Blocks until every rank reached it.
  void barrier();
  /// Waits for outstanding work and releases the backend; safe to call twice.
  void shutdown();

  /// For the correctness checks (common/harness/ddp_check.cpp): while on, every asynchronous collective launched
  /// through this group is remembered until unfinished_async() sees it complete. Off unless a check runs:
  /// a remembered handle keeps its tensors alive.
  void track_async(bool on);
  /// The remembered collectives that are still running, each as "all_reduce of 400 bytes (fc1.weight)";
  /// the completed ones are forgotten.
  std::vector<std::string> unfinished_async();
  /// Waits for every remembered collective still running, and forgets them (a check that found some: its
  /// next step then reads whole tensors, not ones a collective is still writing). Throws what Work::wait() throws.
  void wait_async();

  ProcessGroup(ProcessGroup&&) noexcept;
  ProcessGroup& operator=(ProcessGroup&&) noexcept;
  ~ProcessGroup();

 private:
  ProcessGroup() = default;
  Work tracked(Work w, const std::string& label);  // remembered while track_async(true)
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int rank_ = 0, world_ = 1;
  std::string backend_;
  torch::Device device_{torch::kCPU};
  std::chrono::milliseconds timeout_{0};
};

/// True when this build can run `backend` ("gloo" always; "nccl" only with a CUDA LibTorch).
bool backend_available(const std::string& backend);

/// Throws UsageError (exit 2) unless `backend` is gloo or nccl and this build and machine can run it:
/// for nccl, a CUDA build and one GPU per rank on this node (LOCAL_WORLD_SIZE). `device` ("", "cpu" or
/// "cuda") must suit the backend (nccl takes CUDA tensors only) and, for cuda, a CUDA build with a GPU.
/// `gpus` < 0 asks CUDA how many GPUs there are; tests pass a number.
void check_backend(const std::string& backend, int gpus = -1, const std::string& device = "");

/// True when this build was compiled with CUDA (the cuda preset or scripts/machines/gpu_check.sh's build).
bool cuda_build();

}  // namespace dp
