// Extension 06c, on stage 06 and extension 06b: checkpoints of a ShardedOptimizer (06b's CS336 design), gathered to
// rank 0 on save, re-partitioned on load at any world size. The optimizer state is spread over the ranks, so saving
// first gathers every owner's share to rank 0, and loading lets every rank pick out the share it owns now: save with 2
// ranks, resume with 3.
//
// The file is common/state/checkpoint_file.hpp's container (magic "DPZ1CKPT", version, lengths, checksum,
// atomic write). Inside it: metadata, JSON: world size at save time, optimizer kind, parameter names,
// shapes, dtypes and groups, per group its options, per parameter its state's step count and tensor
// names; payload, a torch::serialize archive: p<i>_value and p<i>_<state tensor>.
#pragma once

#include "common/dist/dist.hpp"
#include "extensions/06b_cs336_design/sharded_optimizer.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace dp {

/// The checkpoint format this code writes and reads.
constexpr uint32_t kCheckpointVersion = 1;

/// What a checkpoint's metadata says (after it passed the magic, size and hash checks).
struct CheckpointInfo {
  uint32_t version = 0;
  int world_size = 0;              ///< ranks that saved it
  std::string optimizer;           ///< "adamw", "adam" or "sgd"
  std::vector<std::string> names;  ///< parameter names, tied weights once, model order
  int64_t max_step = 0;            ///< largest step count of any parameter's state (0 for SGD)
};

/// Saves `module`'s parameters (frozen ones too) and `opt`'s full state. A collective: every rank
/// calls it; each owner broadcasts its parameters' state tensors and rank 0 writes. The write is
/// atomic: PATH.tmp is written, fsync'ed and renamed over PATH, so PATH is always either the old
/// file or the complete new one. Throws dp::UsageError on every rank if rank 0 cannot write, or if
/// the optimizer holds a tensor that is not a parameter of `module`.
void save_checkpoint(const std::string& path, ProcessGroup& pg, torch::nn::Module& module, ShardedOptimizer& opt);

/// Loads a checkpoint written by save_checkpoint, with any world size. Every rank reads PATH and checks
/// it: magic, version, length and hash (else "damaged"), then parameter names, shapes and dtypes,
/// optimizer kind and parameter groups against `module` and `opt`, naming the first mismatch. Only
/// when every rank passed does each rank copy all parameters and install the state of the parameters
/// it owns (and each group's learning rate). Throws dp::UsageError on every rank otherwise; then the
/// model and optimizer are unchanged. A collective.
CheckpointInfo load_checkpoint(const std::string& path, ProcessGroup& pg, torch::nn::Module& module,
                               ShardedOptimizer& opt);

/// Reads and checks a checkpoint file on its own (magic, version, length, hash, metadata) without a
/// model or process group. Throws dp::UsageError.
CheckpointInfo read_checkpoint_info(const std::string& path);

}  // namespace dp
