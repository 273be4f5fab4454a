#include "stages/01_allreduce/ring_allreduce.hpp"

#include <fmt/format.h>

#include <stdexcept>

namespace dp {

void ring_all_reduce(ProcessGroup& pg, torch::Tensor& t) {
  if (!t.is_contiguous()) throw std::invalid_argument("ring_all_reduce: the tensor must be contiguous");
  const int W = pg.world_size();
  if (W == 1) return;  // the sum over one rank is the tensor itself
  // [exercise 01.1: the ring's two phases, from sends and receives]
  // [ring]
  std::vector<torch::Tensor> chunk = t.view({-1}).tensor_split(W);  // views: writing a chunk writes t
  torch::Tensor incoming = torch::empty_like(chunk[0]);             // chunk 0 is the largest
  const int r = pg.rank(), next = (r + 1) % W, prev = (r + W - 1) % W;
  // One step: send chunk `out` to the next rank while receiving chunk `in` from the previous one; both are
  // in flight together (Gloo pairs a send with the receive of the same peer and tag).
  // With fewer elements than ranks some chunks are empty: they travel nowhere (sender and receiver agree,
  // as both look at the same chunk index).
  auto step = [&](int out, int in, int tag) {
    torch::Tensor into = incoming.narrow(0, 0, chunk[in].numel());
    Work recv, send;
    if (into.numel() > 0) recv = pg.recv_async(into, prev, tag);
    if (chunk[out].numel() > 0) send = pg.send_async(chunk[out], next, tag);
    recv.wait();  // a Work never started (an empty chunk) returns at once
    send.wait();
    return into;
  };
  // Reduce-scatter: at step s rank r sends chunk (r - s) and adds what it receives to chunk (r - s - 1).
  for (int s = 0; s < W - 1; ++s) {
    const int out = (r - s + W) % W, in = (r - s - 1 + W) % W;
    chunk[in].add_(step(out, in, s));
  }
  // Rank r now holds the whole sum of chunk (r + 1) mod W. All-gather: pass the sums on around the ring.
  for (int s = 0; s < W - 1; ++s) {
    const int out = (r + 1 - s + W) % W, in = (r - s + W) % W;
    chunk[in].copy_(step(out, in, W - 1 + s));
  }
  // [ring]
  // [/exercise 01.1]
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
  bool own_summed = torch::equal(got_c[(r + 1) % W], want_c[(r + 1) % W]), one_rank_each = true;
  for (int c = 0; c < W; ++c) {
    bool from_one = false;
    for (const auto& x : inputs_c) from_one = from_one || torch::equal(got_c[c], x[c]);
    one_rank_each = one_rank_each && from_one;
  }
  if (own_summed)  // and some other chunk not: the result is not the sum
    return fmt::format(
        "; hint [ring-no-all-gather]: chunk {} ((r+1) mod W) holds its sum but other chunks do not: "
        "the all-gather phase, which passes each rank's summed chunk around, is missing or sends the "
        "wrong chunks",
        (r + 1) % W);
  if (one_rank_each)
    return "; hint [ring-copied-not-added]: every chunk holds one rank's values, not a sum: in the reduce-scatter "
           "add what arrives to your chunk (add_) instead of copying it over";
  return "";
}

}  // namespace dp
