#include "stages/01_allreduce/ring_allreduce.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dp {

namespace {

void check_contiguous(const torch::Tensor& t, const char* who) {
  if (!t.is_contiguous()) throw std::invalid_argument(fmt::format("{}: the tensor must be contiguous", who));
}

// [step]
// One step of a ring: send `out` to rank r+1 while receiving `into` from rank r-1; both are in flight
// together (Gloo pairs a send with the receive of the same peer and tag). With fewer elements than ranks
// some chunks are empty: they travel nowhere (sender and receiver agree, as both look at the same chunk).
void ring_step(ProcessGroup& pg, torch::Tensor out, torch::Tensor into, int tag) {
  const int W = pg.world_size();
  const int r = pg.rank();
  Work recv, send;
  if (into.numel() > 0) recv = pg.recv_async(into, (r + W - 1) % W, tag);
  if (out.numel() > 0) send = pg.send_async(out, (r + 1) % W, tag);
  recv.wait();  // a Work never started (an empty chunk) returns at once
  send.wait();
}
// [step]

int mod(int a, int W) { return ((a % W) + W) % W; }

}  // namespace

void ring_reduce_scatter(ProcessGroup& pg, torch::Tensor& t) {
  check_contiguous(t, "ring_reduce_scatter");
  // [exercise 01.1: the ring reduce-scatter, from sends and receives]
  // [reduce_scatter]
  const int W = pg.world_size();
  const int r = pg.rank();
  std::vector<torch::Tensor> chunk = t.view({-1}).tensor_split(W);  // views: writing a chunk writes t
  torch::Tensor incoming = torch::empty_like(chunk[0]);             // chunk 0 is the largest
  // At step s rank r sends chunk r-s-1 (its own partial sum of it) and adds what arrives into chunk r-s-2:
  // at the last step, s = W-2, that is chunk r, which then holds every rank's share.
  for (int s = 0; s < W - 1; ++s) {
    const int out = mod(r - s - 1, W);
    const int in = mod(r - s - 2, W);
    torch::Tensor into = incoming.narrow(0, 0, chunk[in].numel());
    ring_step(pg, chunk[out], into, s);
    chunk[in].add_(into);
  }
  // [reduce_scatter]
  // [/exercise 01.1]
}

void ring_all_gather(ProcessGroup& pg, torch::Tensor& t) {
  check_contiguous(t, "ring_all_gather");
  // [exercise 01.2: the ring all-gather, from sends and receives]
  // [all_gather]
  const int W = pg.world_size();
  const int r = pg.rank();
  std::vector<torch::Tensor> chunk = t.view({-1}).tensor_split(W);
  // At step s rank r passes on chunk r-s (its own at s = 0, then the one it received last) and receives
  // chunk r-s-1 straight into its place.
  for (int s = 0; s < W - 1; ++s) ring_step(pg, chunk[mod(r - s, W)], chunk[mod(r - s - 1, W)], W + s);
  // [all_gather]
  // [/exercise 01.2]
}

// [ring]
void ring_all_reduce(ProcessGroup& pg, torch::Tensor& t) {
  ring_reduce_scatter(pg, t);  // rank r: the whole sum of chunk r
  ring_all_gather(pg, t);      // every rank: every chunk's sum
}
// [ring]

void alternate_ring_all_reduce(ProcessGroup& pg, torch::Tensor& t) {
  check_contiguous(t, "alternate_ring_all_reduce");
  // [exercise 01.3: CS336's alternate ring all-reduce: the original tensors travel]
  // [alternate]
  const int W = pg.world_size();
  torch::Tensor travelling = t.reshape({-1}).clone();  // what this rank passes on: its own tensor first
  torch::Tensor incoming = torch::empty_like(travelling);
  for (int s = 0; s < W - 1; ++s) {
    ring_step(pg, travelling, incoming, 2 * W + s);
    t.view({-1}).add_(incoming);  // rank r-1-s's original tensor
    std::swap(travelling, incoming);
  }
  // [alternate]
  // [/exercise 01.3]
}

std::string ring_name(Ring c) {
  switch (c) {
    case Ring::kReduceScatter: return "reduce_scatter";
    case Ring::kAllGather: return "all_gather";
    case Ring::kAllReduce: return "all_reduce";
    case Ring::kAlternate: return "alternate";
  }
  return "?";
}

double ring_seconds(Ring c, int world, double bytes, double rate, double step_latency) {
  // [exercise 01.4: predict each ring's time on a link]
  // [predict]
  const double W = world;
  double steps = W - 1;         // reduce-scatter, all-gather and the alternate ring: W-1 steps each
  double per_step = bytes / W;  // one chunk leaves every rank at every step
  if (c == Ring::kAllReduce) steps = 2 * (W - 1);
  if (c == Ring::kAlternate) per_step = bytes;  // a whole tensor per step
  return steps * (step_latency + per_step / rate);
  // [predict]
  // [/exercise 01.4]
}

std::string ring_mismatch_hint(ProcessGroup& pg, const torch::Tensor& input, const torch::Tensor& result) {
  const int W = pg.world_size(), r = pg.rank();
  const auto inputs = pg.all_gather(input.reshape({-1}).contiguous());  // every rank's, in rank order
  const auto got = result.reshape({-1});
  const auto want = torch::stack(inputs).sum(0);
  if (torch::equal(got, want)) return "";
  if (torch::equal(got, input.reshape({-1})))
    return "; hint [ring-nothing-received]: the result is this rank's own input: nothing that arrived was used";
  const auto got_c = got.tensor_split(W), want_c = want.tensor_split(W);
  std::vector<std::vector<torch::Tensor>> inputs_c;  // [rank][chunk]
  for (const auto& x : inputs) inputs_c.push_back(x.tensor_split(W));
  const bool own_summed = torch::equal(got_c[r], want_c[r]);
  bool one_rank_each = true;
  for (int c = 0; c < W; ++c) {
    bool from_one = false;
    for (const auto& x : inputs_c) from_one = from_one || torch::equal(got_c[c], x[c]);
    one_rank_each = one_rank_each && from_one;
  }
  if (own_summed)  // and some other chunk not: the result is not the sum
    return fmt::format(
        "; hint [ring-no-all-gather]: chunk {} (this rank's own, r) holds its sum but other chunks do not: "
        "the all-gather phase, which passes each rank's summed chunk around, is missing or sends the "
        "wrong chunks",
        r);
  if (one_rank_each)
    return "; hint [ring-copied-not-added]: every chunk holds one rank's values, not a sum: in the reduce-scatter "
           "add what arrives to your chunk (add_) instead of copying it over";
  return "";
}

}  // namespace dp
