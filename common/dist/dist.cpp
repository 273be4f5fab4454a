// The distributed layer: rendezvous through a TCP store, then collectives on a c10d backend.
// All version differences are in c10d_compat.hpp; this file only speaks c10d's common API.
#include "common/dist/dist.hpp"

#include "common/base/c10d_compat.hpp"
#include "common/base/format.hpp"
#include "common/base/trace.hpp"
#include "common/dist/exchange.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#ifdef DP_WITH_CUDA
#include <c10/core/DeviceGuard.h>
#include <c10/cuda/CUDAFunctions.h>
#endif
#include <net/if.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

namespace dp {
namespace {

// Which network interface Gloo binds. GLOO_SOCKET_IFNAME (PyTorch's variable) names an interface;
// otherwise one node, or a master on loopback, talks over 127.0.0.1 (resolving the hostname, Gloo's
// default, is a classic container hang); a real multi-node job resolves this machine's hostname.
// GLOO_SOCKET_IFNAME must name an interface of this machine (network namespace); Gloo's own error for a
// wrong name is an enforce failure deep in its TCP device. Names the interfaces there are instead.
void check_interface(const std::string& name) {
  if (if_nametoindex(name.c_str()) != 0) return;
  std::vector<std::string> names;
  if (struct if_nameindex* all = if_nameindex()) {
    for (auto* i = all; i->if_index != 0 && i->if_name; ++i) names.emplace_back(i->if_name);
    if_freenameindex(all);
  }
  throw UsageError(
      fmt::format("GLOO_SOCKET_IFNAME={}: no such network interface here (this machine has: {}). "
                  "Name one of them, or unset GLOO_SOCKET_IFNAME",
                  name, fmt::join(names, ", ")));
}

compat::GlooInterface gloo_interface(const LaunchEnv& env) {
  if (!env.gloo_ifname.empty()) {
    check_interface(env.gloo_ifname);
    return {"", env.gloo_ifname};
  }
  const bool loopback = env.master_addr.rfind("127.", 0) == 0 || env.master_addr == "localhost";
  if (env.launched && !env.single_node() && !loopback) return {"", ""};
  return {"127.0.0.1", ""};
}

}  // namespace

// ----- Work ------------------------------------------------------------------------------------

void Work::wait() {
  if (impl_) wait_collective();
  if (after_ && *after_) std::exchange(*after_, nullptr)();  // once, whichever copy waits first
}

Work Work::then(std::function<void()> after) && {
  after_ = std::make_shared<std::function<void()>>(std::move(after));
  return std::move(*this);
}

void Work::wait_collective() {
  auto& w = *static_cast<compat::WorkPtr*>(impl_.get());
  try {
    w->wait();
  } catch (const std::exception& e) {
    const std::string why = first_line(e.what());
    // A timeout is what a dead or hung peer looks like, and also ranks that issued different collectives.
    const bool timeout = why.find("Timed out") != std::string::npos || why.find("timed out") != std::string::npos;
    throw std::runtime_error(fmt::format(
        "{} failed: {}{}", what_, why,
        timeout ? "; hint [collective-timeout]: another rank is dead or hung, or the ranks issued different "
                  "collectives (a hook fired in another order on one rank; TORCH_DISTRIBUTED_DEBUG=DETAIL names "
                  "both sides: docs/debugging.md)"
                : ""));
  }
  trace::collective_done(trace_id_);  // no-op when the completion callback already recorded it
}

bool Work::completed() const { return !impl_ || (*static_cast<compat::WorkPtr*>(impl_.get()))->isCompleted(); }

// ----- ProcessGroup ----------------------------------------------------------------------------

struct ProcessGroup::Impl {
  compat::StorePtr store;
  compat::CommPtr comm;
  std::string where;                                 // "gloo rank 1/4" for messages
  bool adopted = false;                              // comm belongs to its maker (Python): never shut it down
  std::unique_ptr<detail::ExchangeQueue> exchanges;  // Gloo's all-to-alls, one at a time (made on first use)
  int subgroups = 0;                                 // new_group() calls so far: numbers the subgroups' keys
  // The correctness checks' record of asynchronous collectives (track_async); hooks launch from
  // autograd's threads, hence the lock.
  std::atomic<bool> tracking{false};
  std::mutex tracked_mu;
  std::vector<std::pair<Work, std::string>> tracked;
};

bool backend_available(const std::string& backend) {
  if (backend == "gloo") {
#ifdef USE_C10D_GLOO
    return true;
#endif
  }
  if (backend == "nccl") {
#ifdef DP_WITH_NCCL
    return true;
#endif
  }
  return false;
}

bool cuda_build() {
#ifdef DP_WITH_CUDA
  return true;
#else
  return false;
#endif
}

static int visible_gpus() {
#ifdef DP_WITH_CUDA
  return static_cast<int>(torch::cuda::device_count());
#else
  return 0;
#endif
}

void check_backend(const std::string& backend, int gpus, const std::string& device) {
  if (backend != "gloo" && backend != "nccl")
    throw UsageError(fmt::format("unknown backend '{}'; use --backend gloo (CPU) or nccl (CUDA)", backend));
  if (!backend_available(backend))
    throw UsageError(
        fmt::format("backend '{}': this build has no NCCL (LibTorch {}.{}, built without CUDA/NCCL). "
                    "Use --backend gloo, or build the cuda preset (README: 'LibTorch 2.x, CUDA and NCCL')",
                    backend, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
  if (!device.empty() && device != "cpu" && device != "cuda")
    throw UsageError(fmt::format("--device {}: unknown; use cpu or cuda", device));
  if (backend == "nccl" && device == "cpu")
    throw UsageError(
        "--backend nccl --device cpu: NCCL moves CUDA tensors only; use --backend gloo for CPU "
        "tensors, or leave --device out");
  if (!DistOptions{backend, {}, device}.on_gpu()) return;
  if (!cuda_build())
    throw UsageError(
        fmt::format("--device cuda: this build has no CUDA (LibTorch {}.{} without it). Build with "
                    "CUDA (bash scripts/machines/gpu_check.sh on a GPU machine, or the cuda preset), or use "
                    "--device cpu",
                    TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
  if (gpus < 0) gpus = visible_gpus();
  if (gpus <= 0)
    throw UsageError(
        fmt::format("--backend {} --device {}: no GPU is visible here (CUDA device count 0; check "
                    "CUDA_VISIBLE_DEVICES and the driver). Use --backend gloo --device cpu on a "
                    "machine without a GPU",
                    backend, device.empty() ? "cuda" : device));
  if (backend != "nccl") return;  // Gloo ranks may share a GPU: their tensors cross through host memory
  // NCCL wants one GPU per rank: each rank binds the GPU of its LOCAL_RANK.
  const LaunchEnv env = LaunchEnv::from_environment();
  const int local_world = env.launched ? env.local_world_size : 1;
  if (local_world > gpus)
    throw UsageError(
        fmt::format("--backend nccl: {} ranks on this node but {} GPU(s); NCCL needs one GPU per "
                    "rank. Start at most {} ranks per node (ddp_launch --nproc {} or torchrun "
                    "--nproc_per_node {}), or use --backend gloo --device cuda, whose ranks can "
                    "share a GPU",
                    local_world, gpus, gpus, gpus, gpus));
}

// TORCH_DISTRIBUTED_DEBUG, read by c10d's own parser; a value it does not know is bad input.
static bool debug_detail_requested() {
  try {
    return compat::debug_detail();
  } catch (const std::exception&) {  // c10::ValueError from TORCH_CHECK_VALUE
    throw UsageError(fmt::format("TORCH_DISTRIBUTED_DEBUG={}: not a level c10d knows; use OFF, INFO or DETAIL",
                                 std::getenv("TORCH_DISTRIBUTED_DEBUG") ? std::getenv("TORCH_DISTRIBUTED_DEBUG") : ""));
  }
}

std::unique_ptr<ProcessGroup> ProcessGroup::init_with_store_or_give_up(c10::intrusive_ptr<c10d::Store> store, int rank,
                                                                       int world_size, const DistOptions& opts,
                                                                       std::chrono::milliseconds grace) {
  auto made = std::make_shared<std::promise<std::unique_ptr<ProcessGroup>>>();
  auto group = made->get_future();
  std::thread([made, store, rank, world_size, opts] {
    try {
      made->set_value(std::make_unique<ProcessGroup>(init_with_store(store, rank, world_size, opts)));
    } catch (...) {
      made->set_exception(std::current_exception());
    }
  }).detach();
  if (group.wait_for(opts.timeout + grace) != std::future_status::ready)
    throw std::runtime_error(fmt::format(
        "a group of {} ranks did not form within {:.1f} s (--timeout + {:.1f} s): a member died while it formed",
        world_size, (opts.timeout + grace).count() / 1000.0, grace.count() / 1000.0));
  return group.get();
}

ProcessGroup ProcessGroup::init_with_store(c10::intrusive_ptr<c10d::Store> store, int rank, int world,
                                           const DistOptions& opts) {
  check_backend(opts.backend, -1, opts.device);
  ProcessGroup pg;
  pg.impl_ = std::make_unique<Impl>();
  pg.rank_ = rank;
  pg.world_ = world;
  pg.backend_ = opts.backend;
  pg.timeout_ = opts.timeout;
  pg.impl_->store = store;
  pg.impl_->where = fmt::format("{} rank {}/{}", opts.backend, rank, world);
  set_log_rank(rank, world);                     // so that an error while the group forms is tagged with the right rank
  const bool detail = debug_detail_requested();  // before c10d reads it (and throws on a bad value)
  try {
#ifdef DP_WITH_CUDA
    if (opts.on_gpu()) {
      const LaunchEnv env = LaunchEnv::from_environment();
      const int local = env.launched ? env.local_rank : rank;  // threads as ranks: no environment
      // Each rank binds the GPU of its LOCAL_RANK (check_backend made sure NCCL has one per rank; Gloo's
      // ranks may share one).
      pg.device_ = torch::Device(torch::kCUDA, local % std::max<int>(1, visible_gpus()));
      c10::cuda::set_device(pg.device_.index());
      // The checks' bounds assume sums accumulated in fp32 (docs/tolerances.md); cuBLAS may otherwise sum
      // bf16 and fp16 products in reduced precision. (TF32 matmuls are off by default in LibTorch 2.x.)
      at::globalContext().setAllowBF16ReductionCuBLAS(false);
      at::globalContext().setAllowFP16ReductionCuBLAS(false);
    }
#endif
    if (opts.backend == "nccl") {
#ifdef DP_WITH_NCCL
      pg.impl_->comm = compat::make_nccl(store, rank, world, opts.timeout);
#endif
    } else {
#ifdef USE_C10D_GLOO
      pg.impl_->comm =
          compat::make_gloo(store, rank, world, opts.timeout, gloo_interface(LaunchEnv::from_environment()));
#endif
    }
#ifdef USE_C10D_GLOO
    if (detail) {  // TORCH_DISTRIBUTED_DEBUG=DETAIL: every collective checked first
      pg.impl_->comm = compat::wrap_with_checks(pg.impl_->comm, store, rank, world, opts.timeout,
                                                gloo_interface(LaunchEnv::from_environment()));
      if (rank == 0)
        fmt::print(
            "TORCH_DISTRIBUTED_DEBUG=DETAIL: each collective is first compared across ranks (kind, shapes, "
            "dtypes) by c10d's ProcessGroupWrapper\n");
    }
#endif
  } catch (const UsageError&) {
    throw;
  } catch (const std::exception& e) {
    const std::string why = first_line(e.what());
    if (why.find("imeout") == std::string::npos && why.find("imed out") == std::string::npos)
      throw std::runtime_error(
          fmt::format("rank {}: the {} process group of {} ranks could not form: {}", rank, opts.backend, world, why));
    throw std::runtime_error(fmt::format(
        "rank {}: the {} process group of {} ranks did not form within {:.0f} s ({}). "
        "Are all {} ranks started, with the same MASTER_ADDR/MASTER_PORT? Raise --timeout if they start slowly",
        rank, opts.backend, world, opts.timeout.count() / 1000.0, why, world));
  }
  // Again: reading the launch environment above (Gloo's interface) tagged lines with RANK, which is not this
  // group's rank when the group is not the launch's (stage 09's generations, threads as ranks).
  set_log_rank(rank, world);
  return pg;
}

ProcessGroup ProcessGroup::init_from_env(const DistOptions& opts) {
  check_backend(opts.backend, -1, opts.device);
  LaunchEnv env = LaunchEnv::from_environment();
  if (!env.launched) {
    // One rank: an in-process store, no sockets to open.
    return init_with_store(c10::make_intrusive<c10d::HashStore>(), 0, 1, opts);
  }
  set_log_rank(env.rank, env.world_size);  // a failed rendezvous is reported with the right rank tag
  compat::StorePtr store;
  try {
    // Under torchrun (2.x) its agent hosts the store on MASTER_PORT already: every rank is a client, and
    // our keys get a prefix of their own so they cannot meet the agent's.
#if TORCH_VERSION_MAJOR < 2
    if (env.agent_store)  // measured: a 1.13 client never gets through a 2.x agent's store, it hangs
      throw UsageError(
          "torchrun's agent hosts the rendezvous store here (TORCHELASTIC_USE_AGENT_STORE=True), and this "
          "LibTorch 1.13 cannot join a torchrun 2.x agent's store (the client hangs). Start torchrun with "
          "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, so that rank 0 hosts its own store, or use ddp_launch");
#endif
    const bool host = env.rank == 0 && !env.agent_store;
    store = compat::make_tcp_store(env.master_addr, env.master_port, host, env.world_size, opts.timeout);
    if (env.agent_store) store = c10::make_intrusive<c10d::PrefixStore>("dp_from_scratch", store);
  } catch (const std::exception& e) {
    std::string msg = first_line(e.what());
    if (env.rank == 0 && (msg.find("in use") != std::string::npos || msg.find("bind") != std::string::npos))
      throw UsageError(
          fmt::format("rank 0 cannot listen on {}:{} ({}); pick a free --master-port "
                      "or let ddp_launch choose one",
                      env.master_addr, env.master_port, msg));
    throw UsageError(fmt::format(
        "rank {}: rendezvous at {}:{} failed within {:.0f} s ({}). Is rank 0 running and MASTER_ADDR reachable? "
        "All {} ranks must start; raise --timeout if they start slowly",
        env.rank, env.master_addr, env.master_port, opts.timeout.count() / 1000.0, msg, env.world_size));
  }
  return init_with_store(store, env.rank, env.world_size, opts);
}

ProcessGroup ProcessGroup::adopt(std::shared_ptr<void> backend, int rank, int world, const std::string& name,
                                 torch::Device device) {
  auto* comm = static_cast<compat::CommPtr*>(backend.get());
  if (!comm || !*comm) throw UsageError("ProcessGroup::adopt: no backend given");
  ProcessGroup pg;
  pg.impl_ = std::make_unique<Impl>();
  pg.impl_->comm = *comm;
  pg.impl_->adopted = true;
  pg.impl_->where = fmt::format("{} rank {}/{}", name, rank, world);
  pg.rank_ = rank;
  pg.world_ = world;
  pg.backend_ = name;
  pg.device_ = device;
  pg.timeout_ = DistOptions{}.timeout;  // for this layer's own waits; the backend keeps its maker's timeout
  return pg;
}

ProcessGroup ProcessGroup::new_group(const std::vector<int>& ranks, const std::string& name) {
  if (!impl_ || !impl_->store)
    throw UsageError(
        fmt::format("new_group('{}'): this group ({}) was adopted from its maker and has no store to "
                    "form a subgroup through; make the subgroup where the group was made",
                    name, impl_ ? impl_->where : "shut down"));
  for (size_t i = 0; i < ranks.size(); ++i) {
    if (ranks[i] < 0 || ranks[i] >= world_ || (i > 0 && ranks[i] <= ranks[i - 1]))
      throw std::invalid_argument(fmt::format("new_group('{}'): ranks {} must be increasing ranks of 0..{}", name,
                                              fmt::join(ranks, ","), world_ - 1));
  }
  const auto me = std::find(ranks.begin(), ranks.end(), rank_);
  if (me == ranks.end())
    throw std::invalid_argument(
        fmt::format("new_group('{}'): rank {} is not one of its ranks {}; only the members "
                    "form a subgroup",
                    name, rank_, fmt::join(ranks, ",")));
  DistOptions opts;
  opts.backend = backend_;
  opts.timeout = timeout_;
  if (backend_ != "nccl") opts.device = device_.is_cuda() ? "cuda" : "cpu";
  // The key holds the call's number and the members: two subgroups of different members, or made by
  // different calls, never share a key, and every member of this one computes the same key.
  const std::string key = fmt::format("dp_subgroup/{}/{}", impl_->subgroups++, fmt::join(ranks, ","));
  const int sub_rank = static_cast<int>(me - ranks.begin());
  ProcessGroup sub = init_with_store(c10::make_intrusive<c10d::PrefixStore>(key, impl_->store), sub_rank,
                                     static_cast<int>(ranks.size()), opts);
  sub.impl_->where =
      fmt::format("{} {} group rank {}/{} (rank {}/{})", backend_, name, sub_rank, ranks.size(), rank_, world_);
  set_log_rank(rank_, world_);  // forming it tagged this process's lines with its subgroup rank
  return sub;
}

ProcessGroup::ProcessGroup(ProcessGroup&&) noexcept = default;
ProcessGroup& ProcessGroup::operator=(ProcessGroup&&) noexcept = default;
ProcessGroup::~ProcessGroup() = default;

// Every collective goes through wrap(): it wraps the handle and names the collective in errors,
// so a dead or hung peer surfaces as "all_reduce of 400 bytes failed: ... timed out". When a trace is
// being recorded it also notes the launch, and the completion through the collective's own future,
// which fires when the backend finishes the work, whoever waits for it and whenever.
static Work wrap(compat::WorkPtr w, std::string what, int64_t trace_id = -1) {
  if (trace_id >= 0) {
    try {
      w->getFuture()->addCallback([trace_id](c10::ivalue::Future&) { trace::collective_done(trace_id); });
    } catch (const std::exception&) {
      // A backend without futures: the completion is taken when somebody waits (Work::wait()).
    }
  }
  return Work(std::make_shared<compat::WorkPtr>(std::move(w)), std::move(what), trace_id);
}

Work ProcessGroup::tracked(Work w, const std::string& label) {
  if (impl_->tracking.load()) {
    std::lock_guard<std::mutex> lock(impl_->tracked_mu);
    impl_->tracked.emplace_back(w, label.empty() ? w.what() : fmt::format("{} ({})", w.what(), label));
  }
  return w;
}

void ProcessGroup::track_async(bool on) {
  std::lock_guard<std::mutex> lock(impl_->tracked_mu);
  impl_->tracking = on;
  if (!on) impl_->tracked.clear();
}

std::vector<std::string> ProcessGroup::unfinished_async() {
  std::lock_guard<std::mutex> lock(impl_->tracked_mu);
  auto& t = impl_->tracked;
  t.erase(std::remove_if(t.begin(), t.end(), [](const auto& w) { return w.first.completed(); }), t.end());
  std::vector<std::string> out;
  for (const auto& w : t) out.push_back(w.second);
  return out;
}

void ProcessGroup::wait_async() {
  std::vector<std::pair<Work, std::string>> running;
  {
    std::lock_guard<std::mutex> lock(impl_->tracked_mu);
    running.swap(impl_->tracked);
  }
  for (auto& w : running) w.first.wait();  // outside the lock: a hook may launch meanwhile
}

static std::string describe(const char* op, const torch::Tensor& t) {
  return fmt::format("{} of {} bytes", op, t.numel() * t.element_size());
}

static int64_t trace_launch(const char* op, const torch::Tensor& t, const std::string& label) {
  if (!trace::recording()) return -1;
  return trace::collective_launched(op, label, t.numel() * static_cast<int64_t>(t.element_size()));
}

Work ProcessGroup::all_reduce_async(torch::Tensor& t, const std::string& label) {
  std::vector<at::Tensor> v{t};
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  const int64_t id = trace_launch("all_reduce", t, label);
  return tracked(wrap(impl_->comm->allreduce(v, o), describe("all_reduce", t), id), label);
}

void ProcessGroup::all_reduce(torch::Tensor& t, const std::string& label) { all_reduce_async(t, label).wait(); }

Work ProcessGroup::broadcast_async(torch::Tensor& t, int root, const std::string& label) {
  std::vector<at::Tensor> v{t};
  c10d::BroadcastOptions o;
  o.rootRank = root;
  const int64_t id = trace_launch("broadcast", t, label);
  return tracked(wrap(impl_->comm->broadcast(v, o), describe("broadcast", t), id), label);
}

// A send's or receive's handle. Two things c10d's own handle does not do:
// - wait() may be called again: Gloo's receive counts completions, so a second wait on its handle blocks
//   until Gloo's timeout, as if a peer were dead. Here a second wait returns at once.
// - CUDA tensors over Gloo: Gloo's send and receive hand the tensor's pointer to a TCP socket, and a CUDA
//   pointer fails there ("writev: Bad address") on Gloo's own thread, which aborts the process. Its
//   collectives copy CUDA tensors through the host themselves; for point-to-point we do, as
//   common/dist/exchange.cpp does for the all-to-all: a send goes out from a host copy taken at the call (in the
//   caller's stream order), a receive lands in a host buffer that wait() copies into the caller's tensor.
namespace {
class PointToPointWork : public c10d::Work {
 public:
  // `buffer`: what Gloo reads or writes; `fill`: the caller's tensor to copy `buffer` into once received
  // (a CUDA receive over Gloo), else undefined.
  PointToPointWork(compat::WorkPtr inner, at::Tensor buffer, at::Tensor fill)
      : inner_(std::move(inner)), buffer_(std::move(buffer)), fill_(std::move(fill)) {}
  // A staged receive is complete once wait() has copied it into the caller's tensor (or Gloo failed it).
  // Gloo's own receive handle completes inside its wait(), just before that copy, so it cannot answer.
  bool isCompleted() override {
    if (!fill_.defined()) return inner_->isCompleted();
    return done_ || (inner_->isCompleted() && inner_->exception() != nullptr);
  }
  bool wait(std::chrono::milliseconds timeout) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return true;
    inner_->wait(timeout);  // throws on failure or timeout; then nothing is copied
    if (fill_.defined()) {
      c10::DeviceGuard on(fill_.device());
      fill_.copy_(buffer_);  // host -> device, ordered on the current stream before later work
    }
    done_ = true;
    return true;
  }

 private:
  compat::WorkPtr inner_;
  at::Tensor buffer_, fill_;
  std::mutex mu_;
  std::atomic<bool> done_{false};  // read by isCompleted() without the lock that wait() holds while it blocks
};
}  // namespace

Work ProcessGroup::send_async(torch::Tensor& t, int peer, int tag, const std::string& label) {
  std::vector<at::Tensor> v{backend_ == "gloo" && t.is_cuda() ? t.cpu() : t};
  const int64_t id = trace_launch("send", t, label);
  const std::string what = describe("send", t) + " to rank " + std::to_string(peer);
  auto w = c10::make_intrusive<PointToPointWork>(impl_->comm->send(v, peer, tag), v[0], at::Tensor());
  return tracked(wrap(std::move(w), what, id), label);
}

Work ProcessGroup::recv_async(torch::Tensor& t, int peer, int tag, const std::string& label) {
  const bool staged = backend_ == "gloo" && t.is_cuda();
  std::vector<at::Tensor> v{staged ? at::empty(t.sizes(), t.options().device(at::kCPU)) : t};
  const int64_t id = trace_launch("recv", t, label);
  const std::string what = describe("recv", t) + " from rank " + std::to_string(peer);
  auto w = c10::make_intrusive<PointToPointWork>(impl_->comm->recv(v, peer, tag), v[0], staged ? t : at::Tensor());
  return tracked(wrap(std::move(w), what, id), label);
}

void ProcessGroup::broadcast(torch::Tensor& t, int root, const std::string& label) {
  broadcast_async(t, root, label).wait();
}

std::vector<torch::Tensor> ProcessGroup::all_gather(const torch::Tensor& t) {
  std::vector<at::Tensor> in{t.contiguous()};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < world_; ++r) out[0].push_back(torch::empty_like(in[0]));
  const int64_t id = trace_launch("all_gather", in[0], "");
  wrap(impl_->comm->allgather(out, in), describe("all_gather", t), id).wait();
  return out[0];
}

Work ProcessGroup::all_gather_async(std::vector<torch::Tensor>& outs, torch::Tensor& in, const std::string& label) {
  if (static_cast<int>(outs.size()) != world_)
    throw std::invalid_argument(fmt::format("all_gather_async: {} outputs for {} ranks", outs.size(), world_));
  std::vector<at::Tensor> input{in};
  std::vector<std::vector<at::Tensor>> output{outs};
  const int64_t id = trace_launch("all_gather", in, label);
  return tracked(wrap(impl_->comm->allgather(output, input), describe("all_gather", in), id), label);
}

// [all_to_all]
Work ProcessGroup::all_to_all_async(torch::Tensor& out, torch::Tensor& in, const std::string& label) {
  if (in.size(0) % world_ != 0 || !out.sizes().equals(in.sizes()) || !in.is_contiguous() || !out.is_contiguous())
    throw std::invalid_argument(
        fmt::format("all_to_all_async: {} and {} elements do not split evenly over {} ranks "
                    "(or are not contiguous)",
                    in.numel(), out.numel(), world_));
  const int64_t id = trace_launch("all_to_all", in, label);
  if (backend_ != "gloo") {
    std::vector<int64_t> equal_splits;  // empty: world_size equal chunks
    auto work = impl_->comm->alltoall_base(out, in, equal_splits, equal_splits);
    return tracked(wrap(std::move(work), describe("all_to_all", in), id), label);
  }
  // Gloo's alltoall moves the pieces at half the link's rate (scripts/peers/torch_alltoall.py, 2 ranks at
  // 1 Gbit/s: 307 ms for 37.3 MB per rank, where one send and one receive posted together take 156 ms,
  // the link's rate). So on Gloo the exchange is point to point: every receive posted, then every send.
  // Exchanges go on the wire one at a time, in the order issued, so that the first one issued is the
  // first one done (common/dist/exchange.hpp).
  if (!impl_->exchanges) impl_->exchanges = std::make_unique<detail::ExchangeQueue>(impl_->comm, rank_, world_);
  auto work = impl_->exchanges->post(out, in, [id] { trace::collective_done(id); });
  return tracked(wrap(std::move(work), describe("all_to_all", in), id), label);
}
// [all_to_all]

bool ProcessGroup::has_native_reduce_scatter() const { return compat::has_native_reduce_scatter(backend_); }

Work ProcessGroup::reduce_scatter_native_async(torch::Tensor& out, torch::Tensor& in, const std::string& label) {
  if (!has_native_reduce_scatter())
    throw UsageError(
        fmt::format("the {} backend of LibTorch {}.{} has no reduce_scatter; use dp::reduce_scatter "
                    "(common/comm/shard_comm.hpp), which falls back to all-to-all + local sum",
                    backend_, TORCH_VERSION_MAJOR, TORCH_VERSION_MINOR));
  if (in.numel() != out.numel() * world_)
    throw std::invalid_argument(
        fmt::format("reduce_scatter: input of {} elements is not {} x {}", in.numel(), world_, out.numel()));
  const int64_t id = trace_launch("reduce_scatter", in, label);
  return tracked(wrap(compat::reduce_scatter_flat(impl_->comm, out, in), describe("reduce_scatter", in), id), label);
}

std::vector<std::vector<double>> ProcessGroup::all_gather(const std::vector<double>& v) {
  auto t = torch::tensor(v, torch::kFloat64).to(device_);
  std::vector<std::vector<double>> res;
  for (auto& g : all_gather(t)) {
    auto c = g.cpu().contiguous();
    res.emplace_back(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return res;
}

std::vector<double> ProcessGroup::all_gather(double v) {
  std::vector<double> res;
  for (auto& r : all_gather(std::vector<double>{v})) res.push_back(r[0]);
  return res;
}

int ProcessGroup::first_rank_with(bool flag) {
  const auto flags = all_gather(flag ? 1.0 : 0.0);
  for (size_t r = 0; r < flags.size(); ++r)
    if (flags[r] == 1.0) return static_cast<int>(r);
  return -1;
}

void ProcessGroup::barrier() {
  // A one-element all-reduce is a barrier on every backend (c10d's barrier on NCCL needs a device hint).
  auto t = torch::zeros({1}, torch::TensorOptions().device(device_));
  std::vector<at::Tensor> v{t};
  wrap(impl_->comm->allreduce(v), "barrier").wait();
}

void ProcessGroup::shutdown() {
  if (!impl_) return;
  impl_->exchanges.reset();  // before the backend it sends through
#ifdef DP_WITH_NCCL
  if (impl_->comm && !impl_->adopted) compat::shutdown_nccl(impl_->comm);
#endif
  impl_->comm.reset();
  impl_->store.reset();
  impl_.reset();
}

}  // namespace dp
