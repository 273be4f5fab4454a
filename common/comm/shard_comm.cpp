// Reduce-scatter and all-gather on flat buffers. Where the backend has no reduce_scatter (Gloo), it is
// composed from an all-to-all and a local sum.
#include "common/comm/shard_comm.hpp"

#include "common/dist/runtime.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace dp {

FlatLayout FlatLayout::of(int64_t numel, int world) {
  if (world < 1 || numel < 0)
    throw std::invalid_argument(fmt::format("FlatLayout: {} elements over {} ranks", numel, world));
  FlatLayout l;
  l.numel = numel;
  l.world = world;
  l.chunk = (numel + world - 1) / world;  // round up: the last ranks' chunks end in padding
  l.padded = l.chunk * world;
  return l;
}

int64_t FlatLayout::data_in(int r) const { return std::clamp<int64_t>(numel - offset(r), 0, chunk); }

static bool use_native(const ProcessGroup& pg, ReduceScatterAlgo algo) {
  return algo == ReduceScatterAlgo::native || (algo == ReduceScatterAlgo::automatic && pg.has_native_reduce_scatter());
}

std::string reduce_scatter_name(const ProcessGroup& pg, const ReduceScatterHow& how) {
  if (how.custom) return how.name;
  return use_native(pg, how.algo) ? "native reduce_scatter" : "all-to-all + local sum";
}

// [reduce_scatter]
ReduceScatterWork reduce_scatter_async(ProcessGroup& pg, torch::Tensor& flat, torch::Tensor& out,
                                       ReduceScatterAlgo algo, const std::string& label, torch::Tensor scratch) {
  const int W = pg.world_size();
  if (flat.numel() != out.numel() * W || !flat.is_contiguous() || !out.is_contiguous())
    throw std::invalid_argument(
        fmt::format("reduce_scatter: a contiguous buffer of {} x {} elements is needed, "
                    "got {}",
                    W, out.numel(), flat.numel()));
  if (W == 1) {  // nothing to exchange
    if (!out.is_same(flat)) out.copy_(flat.view_as(out));
    return {};
  }
  if (use_native(pg, algo)) return {pg.reduce_scatter_native_async(out, flat, label), {}, out};
  // Rank r sends chunk j of its buffer to rank j; piece i of `scratch` is then rank i's chunk r.
  if (!scratch.defined()) scratch = torch::empty_like(flat);
  Work work = pg.all_to_all_async(scratch, flat, label);
  return {std::move(work), scratch.view({W, out.numel()}), out};
}

void ReduceScatterWork::wait() {
  if (work_.valid()) {
    work_.wait();
    work_ = Work();
  }
  // The local sum, in rank order: piece 0 + piece 1 + ... + piece W-1.
  if (pieces_.defined()) {
    torch::sum_out(out_, pieces_, /*dim=*/0);
    pieces_ = torch::Tensor();
  }
}
// [reduce_scatter]

void reduce_scatter(ProcessGroup& pg, torch::Tensor& flat, torch::Tensor& out, const ReduceScatterHow& how,
                    const std::string& label, torch::Tensor scratch) {
  if (how.custom) return how.custom(pg, flat, out, label);
  reduce_scatter_async(pg, flat, out, how.algo, label, std::move(scratch)).wait();
}

static bool gather_by_all_to_all(const ProcessGroup& pg, AllGatherAlgo algo) {
  return algo == AllGatherAlgo::all_to_all || (algo == AllGatherAlgo::automatic && pg.backend() == "gloo");
}

std::string all_gather_name(const ProcessGroup& pg, AllGatherAlgo algo) {
  return gather_by_all_to_all(pg, algo) ? "all-to-all" : "list all-gather";
}

// [all_gather]
Work all_gather_flat_async(ProcessGroup& pg, torch::Tensor& chunk, torch::Tensor& flat, const std::string& label,
                           AllGatherAlgo algo, torch::Tensor scratch) {
  const int W = pg.world_size();
  const int64_t n = chunk.numel();
  if (flat.numel() != n * W || !flat.is_contiguous())
    throw std::invalid_argument(
        fmt::format("all_gather_flat: a contiguous buffer of {} x {} elements is needed, "
                    "got {}",
                    W, n, flat.numel()));
  if (W == 1) {
    if (chunk.data_ptr() != flat.data_ptr()) flat.copy_(chunk.view_as(flat));
    return Work();
  }
  torch::Tensor line = flat.view({-1});
  if (gather_by_all_to_all(pg, algo)) {
    // N copies of my chunk, copy j for rank j; piece i of `flat` then receives rank i's chunk.
    if (!scratch.defined()) scratch = torch::empty_like(line);
    scratch.view({W, n}).copy_(chunk.reshape({1, n}).expand({W, n}));
    return pg.all_to_all_async(line, scratch, label);
  }
  std::vector<torch::Tensor> views;  // rank r's piece lands in flat[r*n, (r+1)*n)
  for (int r = 0; r < W; ++r) views.push_back(line.narrow(0, r * n, n));
  torch::Tensor in = chunk.view({n});
  return pg.all_gather_async(views, in, label);
}
// [all_gather]

void all_gather_flat(ProcessGroup& pg, torch::Tensor& chunk, torch::Tensor& flat, const std::string& label,
                     AllGatherAlgo algo, torch::Tensor scratch) {
  all_gather_flat_async(pg, chunk, flat, label, algo, std::move(scratch)).wait();
}

torch::Tensor flat_chunk(const std::vector<torch::Tensor>& tensors, const FlatLayout& L, int rank,
                         const torch::TensorOptions& options) {
  int64_t n = 0;
  for (const auto& t : tensors) n += t.numel();
  if (n != L.numel) throw std::invalid_argument(fmt::format("flat_chunk: {} elements for a layout of {}", n, L.numel));
  torch::NoGradGuard no_grad;
  auto flat = torch::zeros({L.padded}, options.requires_grad(false));
  int64_t off = 0;
  for (const auto& t : tensors) {
    flat.narrow(0, off, t.numel()).copy_(t.reshape(-1));
    off += t.numel();
  }
  return flat.narrow(0, L.offset(rank), L.chunk).clone();
}

std::vector<torch::Tensor> gather_flat_chunks(ProcessGroup& pg, const torch::Tensor& chunk, const FlatLayout& L,
                                              const std::vector<torch::Tensor>& like) {
  torch::NoGradGuard no_grad;
  torch::Tensor mine = chunk.detach().reshape(-1).contiguous();
  if (mine.numel() != L.chunk)
    throw std::invalid_argument(
        fmt::format("gather_flat_chunks: a chunk of {} elements for a layout's {}", mine.numel(), L.chunk));
  torch::Tensor flat = torch::empty({L.padded}, mine.options());
  all_gather_flat(pg, mine, flat, "gather chunks");
  std::vector<torch::Tensor> out;
  int64_t off = 0;
  for (const auto& t : like) {
    out.push_back(flat.narrow(0, off, t.numel()).view(t.sizes()).clone());
    off += t.numel();
  }
  return out;
}

}  // namespace dp
