// Stage 10: the hierarchical all-reduce. In a cluster a rank reaches the ranks of its own node over fast links
// and every other node through its node's one slow uplink. Over W = M x L ranks (M nodes of L ranks) it does
//   1. reduce-scatter inside the node: local rank l gets its node's sum of chunk l (1/L of the buffer);
//   2. all-reduce of that chunk across the nodes, among the M ranks with local index l (L rings side by side,
//      each carrying 1/L of the buffer through the uplinks);
//   3. all-gather inside the node: every rank gets every chunk of the total.
// Only step 2 uses the uplinks, and on a node's uplink it moves 2(M-1)/M of the buffer per direction where a
// flat ring over all W ranks moves 2(W-1)/W (uplink_bytes_*() below). The uplink is the slow hop of every ring
// step, so those bytes set the time: 1.5x fewer at 2 x 2, nearly 2x at 2 nodes of many ranks.
#pragma once

#include "common/comm/comm_hook.hpp"
#include "common/comm/ordered_worker.hpp"
#include "common/dist/mesh.hpp"
#include "common/measure/accounting.hpp"  // TierBytes, hierarchical_bytes()

#include "common/base/libtorch.hpp"

#include <memory>
#include <string>

namespace dp {

/// The hierarchical all-reduce, with its scratch buffers kept between calls (grown to the longest buffer seen,
/// then reused) and the bytes it hands to each tier counted.
class HierarchicalAllReduce {
 public:
  /// `mesh` must outlive this object.
  explicit HierarchicalAllReduce(Mesh& mesh) : mesh_(mesh) {}
  /// Sums the contiguous tensor `flat` (fp32, any shape and length) over the mesh's W ranks, in place, the
  /// same bits on every rank. Blocking; a collective of the mesh. A length that per_node() does not divide is
  /// reduced in a zero-padded copy. Throws std::invalid_argument for a tensor that is not contiguous,
  /// std::runtime_error when a collective fails.
  void run(torch::Tensor& flat, const std::string& label = {});
  /// Bytes this rank handed to each tier's collectives since construction, counted per collective launched
  /// (ring arithmetic on the padded buffer): hierarchical_bytes(padded bytes) per call. Read it while no
  /// run() is in flight.
  TierBytes sent() const { return sent_; }

 private:
  Mesh& mesh_;
  torch::Tensor padded_;   // [>= padded length] the input, zero-padded, when its length is not a multiple of L
  torch::Tensor scratch_;  // [>= padded length] what the all-to-alls inside the node send from or receive into
  TierBytes sent_;
};

/// HierarchicalAllReduce(mesh).run(flat, label): for one call (its scratch is allocated every time).
void hierarchical_all_reduce(Mesh& mesh, torch::Tensor& flat, const std::string& label = {});

/// What stage 05's hierarchical communication hook runs on: a worker thread (common/comm/ordered_worker.hpp) that
/// reduces the buckets hierarchically, in launch order, and divides them by the world size. The hook only queues
/// a bucket and returns, so autograd's thread goes on with backward while the worker communicates (the overlap
/// buckets exist for). Why a thread: the three steps cannot be launched together, each needs the previous one's
/// result, so someone must wait between them, and autograd's thread must not. While buckets are in flight the
/// mesh's two groups are the worker's; after a failed collective every later bucket fails with its exception.
class HierarchicalHook {
 public:
  /// `mesh` must outlive this object.
  explicit HierarchicalHook(Mesh& mesh) : reduce_(mesh), world_(mesh.world().world_size()) {}
  /// Queues `bucket` (fp32, contiguous, untouched until wait()) and returns at once. The BucketWork's wait()
  /// blocks until the bucket holds the average over the W ranks; it rethrows what the worker caught.
  BucketWork launch(torch::Tensor& bucket, const std::string& label);
  /// The worker's bytes per tier since construction (HierarchicalAllReduce::sent()): read it between steps.
  TierBytes sent() const { return reduce_.sent(); }
  /// W: the mesh's world size, what each bucket's sum is divided by.
  int world_size() const { return world_; }

 private:
  HierarchicalAllReduce reduce_;  // used by the worker alone
  int world_;
  OrderedWorker worker_;  // last: destroyed first, its running bucket finished, before what it uses goes
};

/// The CommHook that queues buckets onto `state` (which it keeps alive): give it to
/// BucketedDdp::register_comm_hook() on every rank, and keep `state` to read its counters. The hook throws
/// std::invalid_argument when the DDP's group is not as large as the mesh's world.
CommHook hierarchical_hook(std::shared_ptr<HierarchicalHook> state);

}  // namespace dp
