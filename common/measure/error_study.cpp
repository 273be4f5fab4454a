#include "common/measure/error_study.hpp"

#include "common/base/log.hpp"  // print0
#include "common/measure/timing.hpp"
#include "common/model/data.hpp"    // markov_batch
#include "common/model/params.hpp"  // unique_parameters

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

namespace dp {

nlohmann::json error_summary(const nlohmann::json& draws, const std::vector<std::string>& formats,
                             const std::vector<int>& ranks, const std::string& title) {
  print0("\n{}", title);
  print0("{:<26}{}{:>8}", "format", fmt::format("{}", fmt::join(ranks, "          ")), "slope");
  nlohmann::json summary = nlohmann::json::object();
  for (const auto& f : formats) {
    std::string line = fmt::format("{:<26}", f);
    std::vector<double> xs, ys;
    nlohmann::json medians = nlohmann::json::object();
    for (int W : ranks) {
      std::vector<double> v;
      for (const auto& d : draws)
        if (d["format"] == f && d["ranks"] == W) v.push_back(d["relative_error"]);
      xs.push_back(W);
      ys.push_back(summarize(v).median);
      medians[std::to_string(W)] = ys.back();
      line += fmt::format("{:<11.3e}", ys.back());
    }
    const double slope = log_log_slope(xs, ys);
    summary[f] = {{"median_by_ranks", medians}, {"slope", slope}};
    print0("{}{:>+8.2f}", line, slope);
  }
  return summary;
}

torch::Tensor markov_gradient(const TransformerConfig& mcfg, uint64_t seed, int64_t rows, uint64_t draw) {
  torch::manual_seed(seed);
  TransformerLM model(mcfg);
  auto [x, y] = markov_batch(rows, mcfg.context_length, mcfg.vocab_size, 1000, draw);
  lm_loss(model->forward(x), y).backward();
  std::vector<torch::Tensor> grads;
  for (const auto& p : unique_parameters(*model)) grads.push_back(p.grad().view({-1}));
  return torch::cat(grads);
}

double final_loss(const std::vector<double>& losses) {
  const size_t k = std::max<size_t>(1, losses.size() / 10);
  double sum = 0;
  for (size_t i = losses.size() - k; i < losses.size(); ++i) sum += losses[i];
  return sum / static_cast<double>(k);
}

void compare_curves(nlohmann::json& runs, const std::string& key) {
  for (auto& r : runs) r["final_loss"] = final_loss(r["losses"].get<std::vector<double>>());
  const double ref = runs.front()["final_loss"], other = runs.back()["final_loss"];
  print0("\nloss after {} steps (mean of the last tenth), {} on other data {:.4f}, |difference| {:.4f}:",
         runs.front()["losses"].size(), runs.front()[key].get<std::string>(), other, std::abs(other - ref));
  for (size_t i = 0; i + 1 < runs.size(); ++i) {
    const double f = runs[i]["final_loss"];
    print0("  {:<18} {:.4f}, |difference to {}| {:.4f} ({} the other-data difference)", runs[i][key].get<std::string>(),
           f, runs.front()[key].get<std::string>(), std::abs(f - ref),
           std::abs(f - ref) <= std::abs(other - ref) ? "within" : "OUTSIDE");
  }
}

}  // namespace dp
