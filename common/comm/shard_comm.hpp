// Collectives on flat buffers split evenly over the ranks: what sharding (ZeRO, FSDP) is built from.
// A flat buffer of n elements is padded to a multiple of the world size W and cut into W equal chunks;
// rank r owns chunk r. reduce_scatter sums every rank's buffer and leaves rank r with its chunk of the
// sum; all_gather_flat puts every rank's chunk back together. Together they move what one all-reduce
// moves: an all-reduce IS a reduce-scatter followed by an all-gather.
#pragma once

#include "common/dist/dist.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace dp {

/// How a flat buffer of `numel` elements is split over `world` ranks: padded up to a multiple of `world`
/// and cut into equal chunks, rank r owning elements [r x chunk, (r + 1) x chunk).
struct FlatLayout {
  int64_t numel = 0;   ///< elements that carry data
  int64_t padded = 0;  ///< numel rounded up to a multiple of world (the buffers' length)
  int64_t chunk = 0;   ///< padded / world: one rank's share
  int world = 1;

  /// The layout of `numel` elements over `world` ranks (world >= 1; numel >= 0).
  static FlatLayout of(int64_t numel, int world);
  /// First element of rank r's chunk.
  int64_t offset(int r) const { return chunk * r; }
  /// Elements of rank r's chunk that carry data (the last chunks may be partly or wholly padding).
  int64_t data_in(int r) const;
};

/// How to reduce-scatter.
enum class ReduceScatterAlgo {
  automatic,   ///< the backend's own when it has one (NCCL), else all_to_all_sum
  native,      ///< the backend's own; dp::UsageError where there is none (Gloo)
  all_to_all,  ///< all-to-all of the chunks, then a local sum of the W received pieces
};

/// How the blocking reduce_scatter() below sums: one of the algorithms, or a function its caller supplies (then
/// `algo` is unused): extension 07c's sends the pieces in fewer bytes, for stage 06's ZeRO-1.
struct ReduceScatterHow {
  ReduceScatterAlgo algo = ReduceScatterAlgo::automatic;
  /// The caller's own, with reduce_scatter()'s contract (blocking; `out` holds this rank's chunk of the sum).
  std::function<void(ProcessGroup&, torch::Tensor& flat, torch::Tensor& out, const std::string& label)> custom;
  std::string name;  ///< the custom one's, as reduce_scatter_name() says it
  /// The custom one's bytes sent per rank for a buffer of `padded` values over `world` ranks.
  std::function<double(int64_t padded, int world)> bytes;
  ReduceScatterHow(ReduceScatterAlgo a = ReduceScatterAlgo::automatic) : algo(a) {}  // an algorithm is a how
};

/// "native" when `pg`'s backend would use its own reduce_scatter under `how`, "all-to-all + sum", or the custom
/// one's name.
std::string reduce_scatter_name(const ProcessGroup& pg, const ReduceScatterHow& how = {});

/// A reduce_scatter in flight (reduce_scatter_async). wait() completes it: on the all-to-all path that is
/// where the W received pieces are added up, so `out` holds the sum only after wait().
class ReduceScatterWork {
 public:
  ReduceScatterWork() = default;
  ReduceScatterWork(Work work, torch::Tensor pieces, torch::Tensor out)
      : work_(std::move(work)), pieces_(std::move(pieces)), out_(std::move(out)) {}
  /// Waits for the collective, then (all-to-all path) sums the pieces into `out` in rank order.
  void wait();
  /// True while wait() has something left to do.
  bool pending() const { return work_.valid() || pieces_.defined(); }

 private:
  Work work_;
  torch::Tensor pieces_;  // all-to-all path: [W, chunk], piece i from rank i; undefined otherwise
  torch::Tensor out_;
};

/// reduce_scatter() without waiting: the collective is launched, the local sum happens in wait().
/// `flat`, `out` and `scratch` must stay untouched until then.
ReduceScatterWork reduce_scatter_async(ProcessGroup& pg, torch::Tensor& flat, torch::Tensor& out,
                                       ReduceScatterAlgo algo = ReduceScatterAlgo::automatic,
                                       const std::string& label = {}, torch::Tensor scratch = {});

/// Sums `flat` (padded length W x out.numel(), fp32, contiguous) over all ranks; rank r gets chunk r of the
/// sum in `out`. Blocking; a collective. All-to-all path: rank r sends chunk j to rank j and receives W
/// pieces of its own chunk, one per rank, into `scratch` (a buffer like `flat`, allocated when undefined),
/// then adds them up in rank order. Each rank sends and receives (W-1)/W of the buffer, as a ring does.
void reduce_scatter(ProcessGroup& pg, torch::Tensor& flat, torch::Tensor& out, const ReduceScatterHow& how = {},
                    const std::string& label = {}, torch::Tensor scratch = {});

/// How to all-gather into a flat buffer.
enum class AllGatherAlgo {
  automatic,   ///< all_to_all on Gloo (measured faster there), list elsewhere
  list,        ///< the list form of all-gather, its outputs views of the flat buffer
  all_to_all,  ///< every rank sends its chunk to every rank: an all-to-all of N copies of the chunk
};

/// "list all-gather" or "all-to-all", whichever all_gather_flat uses on `pg` under `algo`.
std::string all_gather_name(const ProcessGroup& pg, AllGatherAlgo algo = AllGatherAlgo::automatic);

/// Gathers every rank's `chunk` into `flat` (W x chunk.numel() elements, contiguous): rank r's chunk lands
/// in elements [r x n, (r + 1) x n). `chunk` may be a view of `flat` (this rank's own part). Asynchronous:
/// wait on the handle before reading `flat`. List path: all-gather into views (`narrow`) of `flat`
/// (LibTorch 1.13's Gloo has no flat all-gather). All-to-all path: `scratch` (a buffer like `flat`,
/// allocated when undefined) holds N copies of the chunk, and piece j goes to rank j. Both send
/// (W-1)/W of the buffer per rank, as a ring does.
Work all_gather_flat_async(ProcessGroup& pg, torch::Tensor& chunk, torch::Tensor& flat, const std::string& label = {},
                           AllGatherAlgo algo = AllGatherAlgo::automatic, torch::Tensor scratch = {});

/// Blocking all_gather_flat_async().
void all_gather_flat(ProcessGroup& pg, torch::Tensor& chunk, torch::Tensor& flat, const std::string& label = {},
                     AllGatherAlgo algo = AllGatherAlgo::automatic, torch::Tensor scratch = {});

/// Rank `rank`'s chunk of the flat buffer laid out by `L` that holds `tensors` back to back (L.numel
/// elements in all, zeros in the padding): a new [L.chunk] tensor with `options`. On this rank alone.
/// Throws std::invalid_argument when the tensors do not hold L.numel elements.
torch::Tensor flat_chunk(const std::vector<torch::Tensor>& tensors, const FlatLayout& L, int rank,
                         const torch::TensorOptions& options);

/// The reverse of flat_chunk() over every rank: each rank's `chunk` ([L.chunk]) all-gathered, the padding
/// cut, and the flat buffer cut into new tensors shaped like `like`, back to back. A collective.
std::vector<torch::Tensor> gather_flat_chunks(ProcessGroup& pg, const torch::Tensor& chunk, const FlatLayout& L,
                                              const std::vector<torch::Tensor>& like);

}  // namespace dp
