// Named hints for the classic mistakes of writing data-parallel training (the workbook, docs/workbook.md).
// A check that finds a parameter off from single-process training asks what the difference looks like:
// an update exactly W times the reference's is a sum that was never divided, and so on. Each hint has a
// name in brackets, so a learner (and a test) can tell them apart.
#pragma once

#include "common/base/libtorch.hpp"

#include <string>

namespace dp {

/// What one step did to one parameter, ours against one process's, both from the same weights: "; hint
/// [summed-not-averaged]: ..." when our update is `world_size` times the reference's, [averaged-twice]
/// at 1/world_size, [gradient-never-arrived] when the parameter did not move though the reference's did;
/// "" when the difference has none of these shapes (or the reference did not move). `ours_*` and `ref_*`
/// are the parameter before and after the step.
std::string update_hint(const torch::Tensor& ours_before, const torch::Tensor& ours_after,
                        const torch::Tensor& ref_before, const torch::Tensor& ref_after, int world_size);

/// `problem` with its hint, if any, replaced by "; hint [ranks-differ]: ...": for a check that found the ranks
/// holding different parameters after a step, which explains a mismatch better than the update's shape.
std::string with_ranks_differ_hint(const std::string& problem);

/// "; hint [not-broadcast]: ..." for a check that found a rank still holding its own initial weights.
std::string not_broadcast_hint();

/// "; hint [not-waited]: ..." for a check that found collectives still running when the step began.
std::string not_waited_hint();

}  // namespace dp
