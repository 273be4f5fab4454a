// Extension 07b, on stage 07: checkpoints written shard by shard, as PyTorch's Distributed Checkpoint (DCP)
// writes them, and read back at any world size. Stage 08 saves through the training-strategy contract's
// full state: every tensor gathered whole on every rank, 12P bytes with AdamW, which FSDP exists to avoid.
// Here a save adds at most one file's bytes to what a rank holds (one unit's chunk and its state); a load,
// the pieces the rank will hold (read in full before any is installed, so that a failed read changes
// nothing) and one file.
//
// A checkpoint is a folder. Written by N ranks:
//   u<u>.r<s>    unit u's chunk on rank s: the data part of its flat fp32 buffer (common/comm/shard_comm.hpp's
//                FlatLayout, padding left out) and each optimizer state tensor's same part
//   replicated   rank 0: the tensors every rank holds whole (the RMSNorm gains) and their state
//   metadata     rank 0, last, once every rank's files are on disk: the world size, the caller's step,
//                the optimizer state's kind, per unit its tensors (names, shapes, flat length)
// Each file is common/state/checkpoint_file.hpp's container (magic, version, lengths, checksum, atomic write).
// Every file carries the save's id, which the metadata names: a save interrupted over an older checkpoint
// leaves files of two saves, and a load refuses them instead of mixing them. (To keep the last good
// checkpoint through a crash, save each time to a new folder, as torchtitan's step-N folders do.)
//
// Loading at M ranks: unit u's flat buffer is the same sequence of values at any world size, only cut
// differently. Rank r needs elements [r x chunk_M, r x chunk_M + its data) of it and reads just the files of
// the ranks whose chunks overlap that range, one unit at a time.
#pragma once

#include "common/dist/dist.hpp"
#include "common/state/full_state.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <nlohmann/json.hpp>
#include "common/base/libtorch.hpp"

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace dp {

/// What a save or a load did (on this rank) and what the checkpoint is.
struct ShardedCheckpointInfo {
  int world_size = 0;         ///< ranks that saved it
  int64_t step = 0;           ///< the caller's step, as saved
  int64_t files = 0;          ///< files in the folder that belong to it (shards, replicated, metadata)
  int64_t bytes = 0;          ///< their size on disk, together
  int64_t files_touched = 0;  ///< files this rank wrote (save) or read (load), metadata included
  int64_t largest_held = 0;   ///< the most bytes of file contents this rank held at once (one file's)
  nlohmann::json meta;        ///< the caller's, as saved (what the run was: a preset, say)
};

/// Saves `fsdp`'s pieces and `opt`'s state (an optimizer over fsdp.parameters()) into folder `dir` (made
/// if missing): every rank writes its own chunk of every unit; rank 0 the replicated tensors and then,
/// once every rank's files are written, the metadata, and removes the chunks an earlier save by more ranks
/// left. A collective. Throws dp::UsageError on every rank, naming the rank and the file, when any rank
/// could not write; then no metadata names this save, and a load refuses what is left. `model` is the model
/// `fsdp` shards (for the parameters' names); `meta` is stored as it is, for the caller.
ShardedCheckpointInfo save_sharded_checkpoint(const std::string& dir, ProcessGroup& pg, const torch::nn::Module& model,
                                              const Fsdp& fsdp, const torch::optim::Optimizer& opt, int64_t step,
                                              const nlohmann::json& meta = nlohmann::json::object());

/// Loads a checkpoint written by save_sharded_checkpoint() at any world size into `fsdp` and `opt`. Every
/// rank reads the metadata and checks it against `model` (units, names, shapes: "written for another model"
/// naming the first difference) and the optimizer's kind, then reads the files it needs, checking each
/// (container, save id, unit, rank, length). Only when every rank has read all it needs does any rank
/// install it; otherwise every rank throws dp::UsageError (the first failing rank's message) and the model
/// and optimizer are unchanged. A collective.
ShardedCheckpointInfo load_sharded_checkpoint(const std::string& dir, ProcessGroup& pg, const torch::nn::Module& model,
                                              Fsdp& fsdp, torch::optim::Optimizer& opt);

/// The checkpoint's metadata alone (world size, step, its files and their bytes, the caller's meta),
/// checked. dp::UsageError when the folder has none ("holds no complete sharded checkpoint") or it is
/// damaged. Not a collective.
ShardedCheckpointInfo read_sharded_info(const std::string& dir);

/// Every trainable parameter and its optimizer state gathered whole from `fsdp`'s pieces, on every rank (a
/// collective): what a checkpoint through the training-strategy contract holds (stage 08), and this
/// extension's reference.
FullState gathered_state(ProcessGroup& pg, const Fsdp& fsdp, const torch::optim::Optimizer& opt);

/// The first tensor of `a` that differs from `b`'s in any bit ("name", "name's exp_avg", "name's step"), or
/// "" when none does. `b` must hold at least `a`'s parameters, in the same order.
std::string first_difference(const FullState& a, const FullState& b);

/// Every file of the checkpoint assembled on this process alone into the whole training state (the
/// model's trainable parameters, named and in order as `like`, with their optimizer state): what PyTorch's
/// dcp_to_torch_save does. Holds the full state: a tool for checking and converting, not for resuming.
/// Throws dp::UsageError as load_sharded_checkpoint() does. Not a collective.
FullState consolidate_sharded_checkpoint(const std::string& dir,
                                         const std::vector<std::pair<std::string, torch::Tensor>>& like);

}  // namespace dp
