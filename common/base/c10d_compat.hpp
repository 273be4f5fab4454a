// The one place where LibTorch 1.13 (Debian, CPU, Gloo) and LibTorch 2.x (pip, CUDA, NCCL) differ.
//
// 1.13: ProcessGroupGloo/ProcessGroupNCCL derive from c10d::ProcessGroup, which declares the collectives.
// 2.x:  they derive from c10d::Backend; c10d::ProcessGroup became a dispatcher front-end that needs
//       setBackend(). We hold the backend object directly in both versions and call its collectives.
// Everything else in the project includes this header instead of the c10d headers.
#pragma once

#include <torch/version.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#else
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#endif

#ifdef USE_C10D_GLOO
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupWrapper.hpp>
#endif
#include <torch/csrc/distributed/c10d/debug.h>
#ifdef DP_WITH_NCCL
#include <c10/cuda/CUDAFunctions.h>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <torch/csrc/autograd/variable.h>
#include <torch/optim/optimizer.h>

#include <chrono>
#include <sstream>
#include <string>
#include <type_traits>

namespace dp::compat {

#if TORCH_VERSION_MAJOR >= 2
using CommBase = c10d::Backend;
#else
using CommBase = c10d::ProcessGroup;
#endif
using CommPtr = c10::intrusive_ptr<CommBase>;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;
using StorePtr = c10::intrusive_ptr<c10d::Store>;

/// A c10d::Store to derive from: 2.x declares clone() (another handle on the same store) pure virtual,
/// 1.13 has no clone(); a subclass implements clone_store() and builds against both.
class CloneableStore : public c10d::Store {
 public:
  using c10d::Store::Store;
  virtual StorePtr clone_store() = 0;
#if TORCH_VERSION_MAJOR >= 2
  StorePtr clone() override { return clone_store(); }
#endif
};

/// TCP rendezvous store: rank 0 hosts it, every rank (rank 0 included) connects as a client.
inline StorePtr make_tcp_store(const std::string& host, int port, bool is_server, int world_size,
                               std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(port);
  o.isServer = is_server;
  o.numWorkers = world_size;
  o.waitWorkers = true;
  o.timeout = timeout;
#if TORCH_VERSION_MAJOR >= 2
  o.useLibUV = false;  // the classic server: same behaviour as 1.13, no libuv dependency
#endif
  return c10::make_intrusive<c10d::TCPStore>(host, o);
}

/// Where Gloo opens its sockets: a host address, an interface name, or neither (resolve the hostname).
struct GlooInterface {
  std::string host;
  std::string ifname;
};

#ifdef USE_C10D_GLOO
inline CommPtr make_gloo(const StorePtr& store, int rank, int world, std::chrono::milliseconds timeout,
                         const GlooInterface& where) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  if (!where.ifname.empty())
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(where.ifname));
  else if (!where.host.empty())
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname(where.host));
  else
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  opts->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world, opts);
}

/// TORCH_DISTRIBUTED_DEBUG=DETAIL (c10d's debug level): wraps `comm` in c10d's ProcessGroupWrapper, which
/// before every collective compares its kind, tensor shapes and dtypes across ranks over a second Gloo
/// group (on its own store prefix) and throws, naming both ranks' collectives, on a mismatch. One extra
/// small collective per collective: for debugging, not for measurements. 1.13 wraps a ProcessGroup with
/// a ProcessGroupGloo; 2.x wraps Backends.
inline CommPtr wrap_with_checks(const CommPtr& comm, const StorePtr& store, int rank, int world,
                                std::chrono::milliseconds timeout, const GlooInterface& where) {
  auto checker =
      make_gloo(c10::make_intrusive<c10d::PrefixStore>("dp_debug_checks", store), rank, world, timeout, where);
#if TORCH_VERSION_MAJOR >= 2
  return c10::make_intrusive<c10d::ProcessGroupWrapper>(comm, checker);
#else
  return c10::make_intrusive<c10d::ProcessGroupWrapper>(
      comm, c10::static_intrusive_pointer_cast<c10d::ProcessGroupGloo>(checker));
#endif
}
#endif

/// True when TORCH_DISTRIBUTED_DEBUG=DETAIL is set (read through c10d's own parser).
inline bool debug_detail() {
  c10d::setDebugLevelFromEnvironment();
  return c10d::debug_level() == c10d::DebugLevel::Detail;
}

#ifdef DP_WITH_NCCL
/// Ends an NCCL backend cleanly (ProcessGroupNCCL::shutdown, what destroy_process_group() calls), so its
/// destructor neither warns nor leaks the communicator; other backends need nothing.
inline void shutdown_nccl(const CommPtr& comm) {
  if (auto nccl = c10::dynamic_intrusive_pointer_cast<c10d::ProcessGroupNCCL>(comm)) nccl->shutdown();
}

inline CommPtr make_nccl(const StorePtr& store, int rank, int world, std::chrono::milliseconds timeout) {
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world, opts);
}
#endif

/// An owning pointer to an autograd Node (a parameter's AccumulateGrad): std::shared_ptr in 1.13,
/// c10::intrusive_ptr in recent 2.x releases.
using NodePtr = decltype(torch::autograd::impl::grad_accumulator(std::declval<const at::Tensor&>()));

/// The key under which torch::optim keeps a parameter's state: the address of its TensorImpl, as text in
/// 1.13 (`c10::guts::to_string`, gone in 2.x), as the pointer itself in recent 2.x releases.
/// (A template, so that `if constexpr` discards the branch of the other version.)
template <typename Optimizer = torch::optim::Optimizer>
auto optim_state_key(const at::Tensor& p) {
  using Key = typename std::decay_t<decltype(std::declval<Optimizer&>().state())>::key_type;
  if constexpr (std::is_same_v<Key, std::string>) {
    std::ostringstream s;
    s << static_cast<const void*>(p.unsafeGetTensorImpl());
    return s.str();
  } else {
    return static_cast<Key>(p.unsafeGetTensorImpl());
  }
}

// ---- flat-buffer sharding (common/comm/shard_comm.cpp, through ProcessGroup) ---------------------------
// Added for ZeRO-1's reduce-scatter. Gloo has no reduce_scatter in 1.13 (2.x adds a naive one that runs
// one all-reduce per rank, slower than all-to-all + local sum), so only NCCL counts as native here.

/// True when `backend` has a reduce_scatter worth using in this LibTorch.
inline bool has_native_reduce_scatter(const std::string& backend) { return backend == "nccl"; }

/// Native reduce_scatter of a flat buffer: `in` holds world x out.numel() elements, summed over ranks;
/// rank r gets chunk r in `out`. `_reduce_scatter_base` has this signature in 1.13 and 2.x.
inline WorkPtr reduce_scatter_flat(const CommPtr& comm, at::Tensor& out, at::Tensor& in) {
  c10d::ReduceScatterOptions o;
  o.reduceOp = c10d::ReduceOp::SUM;
  return comm->_reduce_scatter_base(out, in, o);
}

}  // namespace dp::compat
