// A training state in full, world-size-free, and the collectives that assemble it from shards.
// A checkpoint that any world size and any way of training can resume from stores every parameter whole
// with its optimizer state whole. A scheme that keeps everything on every rank (DDP) just copies it; one
// that shards the state (ZeRO-1) or the parameters too (FSDP) gathers its pieces here on save, and cuts
// this world's pieces out on load.
#pragma once

#include "common/comm/shard_comm.hpp"
#include "common/dist/dist.hpp"
#include "common/state/optim_state.hpp"

#include <nlohmann/json.hpp>
#include "common/base/libtorch.hpp"

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// Everything a step needs to continue exactly: every trainable parameter in full (tied ones once, in
/// named_parameters() order, fp32) and its optimizer state in full, index for index. The same on every
/// rank, and the same whatever the world size or the scheme that produced it.
struct FullState {
  std::vector<std::pair<std::string, torch::Tensor>> params;
  /// One per parameter; present == false before the optimizer's first step.
  std::vector<ParamState> optimizer;
};

/// Each of `params`' state in `opt` (copies; with `copy` false, the optimizer's own tensors), for a scheme
/// in which this rank holds all of it.
std::vector<ParamState> local_states(const torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                                     bool copy = true);

/// Installs `states[i]` as the state of `params[i]` in `opt` (copies). Throws std::invalid_argument when
/// the counts or a state tensor's shape differ from the parameter's.
void set_local_states(torch::optim::Optimizer& opt, const std::vector<torch::Tensor>& params,
                      const std::vector<ParamState>& states);

/// The state of `p` as rank `owner` holds it (`mine` there; ignored elsewhere), on every rank: the names
/// of its tensors, its step and each tensor (shaped like `p`) broadcast from the owner. A collective.
ParamState broadcast_param_state(ProcessGroup& pg, int owner, const ParamState& mine, const torch::Tensor& p);

/// Some tensors in, some out (a collective that gathers pieces, or a cut into this rank's pieces).
using TensorsMap = std::function<std::vector<torch::Tensor>(const std::vector<torch::Tensor>&)>;

/// The state tensors of `in`, name by name, through `f`: for each name, `f` gets that tensor of every
/// state of `in` (in order) and returns `n_out` tensors, which become that tensor of each of the `n_out`
/// states returned. Every state of `in` must share the names, step and presence of `in[0]` (a scheme whose
/// tensors all step together), which the result takes; an empty `in` gives `n_out` states not present.
/// How a sharded scheme turns its pieces' states into whole parameters' states and back.
std::vector<ParamState> map_states(const std::vector<ParamState>& in, size_t n_out, const TensorsMap& f);

/// A flat buffer laid out by `L` holds `params` back to back; this rank's chunk of it is `chunk`, the one
/// parameter of `opt`. Returns each of `params`' state: every rank's chunk of each state tensor
/// all-gathered, the padding cut, cut per parameter and reshaped. A collective.
std::vector<ParamState> gather_chunk_state(ProcessGroup& pg, const torch::optim::Optimizer& opt,
                                           const torch::Tensor& chunk, const FlatLayout& L,
                                           const std::vector<torch::Tensor>& params);

/// The reverse of gather_chunk_state() on this rank alone: concatenates `states` (one per parameter of
/// the buffer, in its order), pads as `L` says and installs rank `rank`'s chunk as `chunk`'s state in `opt`.
void set_chunk_state(torch::optim::Optimizer& opt, const torch::Tensor& chunk, const FlatLayout& L, int rank,
                     const std::vector<ParamState>& states);

/// `states`, one per tensor of `held` (a scheme's own order), in the order of `wanted` (the model's):
/// tensors are matched by identity (the same tensor, not an equal one). Throws std::invalid_argument
/// when one of `wanted` is not in `held`. permute_states(wanted, held, s) goes back.
std::vector<ParamState> permute_states(const std::vector<torch::Tensor>& held, const std::vector<torch::Tensor>& wanted,
                                       const std::vector<ParamState>& states);

/// How a scheme that shards parameters (FSDP) holds a model's trainable tensors: group g's `tensors` back
/// to back in one flat buffer laid out by g.layout, of which this rank holds `chunk` (fp32 [layout.chunk],
/// zeros in the padding), and the `replicated` tensors whole on every rank. What it gathers whole for a
/// check or a checkpoint that any world size reads, and cuts back into this world's pieces on load.
struct ShardedParams {
  struct Group {
    FlatLayout layout;
    std::vector<torch::Tensor> tensors;  ///< the model's own, in the buffer's order
    torch::Tensor chunk;                 ///< this rank's piece of the buffer: what its optimizer steps
  };
  std::vector<Group> groups;
  std::vector<torch::Tensor> replicated;
  /// Every tensor of the groups and of `replicated` once, named, in the order full tensors are listed
  /// (the model's trainable parameters in named_parameters() order, tied ones once).
  std::vector<std::pair<std::string, torch::Tensor>> named;

  /// What this rank holds: every group's chunk, then the replicated tensors.
  std::vector<torch::Tensor> pieces() const;
  /// Tensors shaped like pieces() (the pieces themselves, or an optimizer's state of each) made whole: one
  /// fp32 tensor per entry of `named`, in its order, each group's chunks all-gathered and the padding cut.
  /// A collective. Throws std::invalid_argument when the count differs from pieces()'.
  std::vector<torch::Tensor> gather(ProcessGroup& pg, const std::vector<torch::Tensor>& pieces) const;
  /// The reverse of gather() on this rank alone: full tensors, one per entry of `named`, cut into rank
  /// `rank`'s pieces, each with the dtype of its piece. Throws std::invalid_argument when the count differs.
  std::vector<torch::Tensor> cut(const std::vector<torch::Tensor>& full, int rank) const;
  /// `named`, each tensor in full (gather() of the pieces). A collective.
  std::vector<std::pair<std::string, torch::Tensor>> gather_named(ProcessGroup& pg) const;
  /// The parameters in full and the state in full that `opt` (an optimizer over pieces()) holds for each
  /// piece, every state tensor gathered like the parameters. A collective.
  FullState full_state(ProcessGroup& pg, const torch::optim::Optimizer& opt) const;
  /// The reverse of full_state() on this rank alone: `s` (names and shapes checked by the caller) cut
  /// into rank `rank`'s pieces, copied into them, and their state installed in `opt`.
  void load_full_state(const FullState& s, int rank, torch::optim::Optimizer& opt) const;
};

/// The file format of save_state_file(): common/state/checkpoint_file.hpp's container, magic "DPSTATE1".
/// Metadata (JSON, readable with `head -c 4000 FILE`): per parameter its name, shape and optimizer state
/// (present, step, the names of its tensors), and the caller's `meta`. Payload: a torch::serialize
/// archive with p<i> (the parameter) and s<i>.<name> (each state tensor).
constexpr uint32_t kStateFileVersion = 1;

/// Writes `state` and `meta` to `path` from rank 0, atomically (a temporary file, fsync, rename: a crash
/// mid-write leaves the previous file intact). A collective: every rank learns whether it worked, and
/// throws dp::UsageError when rank 0 could not write.
void save_state_file(const std::string& path, ProcessGroup& pg, const nlohmann::json& meta, const FullState& state);

/// What a state file holds.
struct StateFile {
  nlohmann::json meta;  ///< the caller's, as saved
  FullState state;
  size_t bytes = 0;  ///< the file's size
};

/// Reads `path` and checks it: the container (magic, version, length, checksum: else "damaged"), then
/// the caller's metadata (`check_meta`, if given, throws to refuse it), then one parameter for each of
/// `like` (the model's trainable parameters, named, in order; only names and shapes are read) with the
/// same name and shape, and state tensors of that shape. Throws dp::UsageError naming the file and the
/// first problem. Not a collective: every rank reads.
StateFile load_state_file(const std::string& path, const std::vector<std::pair<std::string, torch::Tensor>>& like,
                          const std::function<void(const nlohmann::json& meta)>& check_meta = {});

}  // namespace dp
