// The hierarchical all-reduce, its byte counts per tier, and stage 05's hook that runs it on a worker thread.
#include "stages/10_hierarchy/hierarchical.hpp"

#include "common/comm/shard_comm.hpp"

#include <fmt/format.h>

#include <stdexcept>
#include <utility>

namespace dp {

// The first n elements of `buf`, reallocated only when it is too short or of other options: a buffer
// allocated once, at the longest length seen, and reused.
static torch::Tensor first(torch::Tensor& buf, int64_t n, const torch::TensorOptions& options) {
  if (!buf.defined() || buf.numel() < n || buf.dtype() != options.dtype() || buf.device() != options.device())
    buf = torch::empty({n}, options);
  return buf.narrow(0, 0, n);
}

void HierarchicalAllReduce::run(torch::Tensor& flat, const std::string& label) {
  if (!flat.is_contiguous()) throw std::invalid_argument("hierarchical_all_reduce: the tensor must be contiguous");
  const int L = mesh_.per_node(), M = mesh_.nodes();
  const FlatLayout layout = FlatLayout::of(flat.numel(), L);
  if (layout.numel == 0) return;
  torch::NoGradGuard no_grad;
  // The buffer the steps work in, [L x chunk]: `flat` itself when L divides its length, else a copy padded
  // with zeros, which add nothing to any sum and are cut off at the end.
  torch::Tensor line = flat.view({-1});
  torch::Tensor buf = line;
  if (layout.padded != layout.numel) {
    buf = first(padded_, layout.padded, flat.options());
    buf.narrow(0, 0, layout.numel).copy_(line);
    buf.narrow(0, layout.numel, layout.padded - layout.numel).zero_();
  }
  torch::Tensor scratch = L > 1 ? first(scratch_, layout.padded, flat.options()) : torch::Tensor();
  // [steps]
  // This rank's chunk, [chunk], a view of `buf`: the reduce-scatter writes its node's sum there, the
  // all-reduce sums it across nodes in place, and the all-gather sends it from there.
  torch::Tensor mine = buf.narrow(0, layout.offset(mesh_.local()), layout.chunk);
  const double chunk_bytes = static_cast<double>(layout.chunk) * flat.element_size();
  // [exercise 10.1: reduce-scatter inside the node, all-reduce your chunk across nodes, all-gather inside]
  if (L > 1) {  // 1: each rank sends the L-1 chunks it does not own to their owners
    reduce_scatter(mesh_.intra(), buf, mine, ReduceScatterAlgo::automatic, label, scratch);
    sent_.intra += (L - 1) * chunk_bytes;
  }
  if (M > 1) {                                                // 2: a ring of M ranks sends 2(M-1) pieces of chunk/M
    mesh_.inter().all_reduce(mine, label + " across nodes");  // the label says it crosses (uplink_bytes.py)
    sent_.inter += 2.0 * (M - 1) / M * chunk_bytes;
  }
  if (L > 1) {  // 3: each rank sends its chunk to the L-1 others
    all_gather_flat(mesh_.intra(), mine, buf, label, AllGatherAlgo::automatic, scratch);
    sent_.intra += (L - 1) * chunk_bytes;
  }
  // [/exercise 10.1]
  // [steps]
  if (!buf.is_same(line)) line.copy_(buf.narrow(0, 0, layout.numel));
}

void hierarchical_all_reduce(Mesh& mesh, torch::Tensor& flat, const std::string& label) {
  HierarchicalAllReduce(mesh).run(flat, label);
}

BucketWork HierarchicalHook::launch(torch::Tensor& bucket, const std::string& label) {
  std::shared_future<void> done = worker_.submit(
      [this, bucket, label]() mutable {
        reduce_.run(bucket, label);
        bucket.div_(world_);  // the sum of W ranks' gradients -> their average
      },
      label.empty() ? "a bucket" : label);
  // No Work to wait for: BucketWork::wait() goes straight to `then`, which waits for the worker and rethrows
  // what it caught.
  BucketWork w;
  w.then = [done] { done.get(); };
  w.wire_bytes = bucket.numel() * static_cast<int64_t>(bucket.element_size());
  return w;
}

CommHook hierarchical_hook(std::shared_ptr<HierarchicalHook> state) {
  return [state](ProcessGroup& pg, torch::Tensor& bucket, const std::string& label) {
    if (pg.world_size() != state->world_size())
      throw std::invalid_argument(
          fmt::format("hierarchical hook: a group of {} ranks for a mesh of {}", pg.world_size(), state->world_size()));
    return state->launch(bucket, label);
  };
}

}  // namespace dp
