// What extensions 05e and 07c report about their formats' error: a table of the relative error against the number
// of ranks, with each format's log-log slope, and a set of loss curves held to the distance between two fp32 runs
// on different data.
#pragma once

#include "common/model/transformer.hpp"

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

namespace dp {

/// From `draws` (objects with "format", "ranks" and "relative_error"), per format in `formats`: the median over draws
/// at each of `ranks`, and the least-squares slope of log(median) over log(ranks). Prints the table (rank 0), headed
/// by `title`, and returns {format: {"median_by_ranks": {"W": median}, "slope": s}}.
nlohmann::json error_summary(const nlohmann::json& draws, const std::vector<std::string>& formats,
                             const std::vector<int>& ranks, const std::string& title);

/// The flat gradient (every unique parameter's, in order) of a TransformerLM of `mcfg` drawn from `seed`, on `rows`
/// sequences of markov_batch() text (table seed 1000, draw `draw`): one rank's gradient for an error study.
torch::Tensor markov_gradient(const TransformerConfig& mcfg, uint64_t seed, int64_t rows, uint64_t draw);

/// The mean of the last tenth (at least one) of `losses`: a final loss steadier than the last step's.
double final_loss(const std::vector<double>& losses);

/// Sets "final_loss" of every run in `runs` (objects with "losses" and the name under `key`): the first is the
/// reference (fp32), the last the reference on other data, whose distance from the first is the bound. Prints a line
/// per run (rank 0): its final loss, its distance from the reference, and whether that is within the bound.
void compare_curves(nlohmann::json& runs, const std::string& key);

}  // namespace dp
