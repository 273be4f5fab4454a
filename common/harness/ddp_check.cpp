// Data-parallel training is correct when it is indistinguishable from training one model on the whole
// batch. These checks run that comparison step by step; every DDP stage runs them on itself.
#include "common/harness/ddp_check.hpp"

#include "common/base/format.hpp"
#include "common/contract/clip.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/hints.hpp"
#include "common/measure/tolerance.hpp"
#include "common/model/data.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

namespace dp {

namespace {

using Named = std::vector<std::pair<std::string, torch::Tensor>>;

// Largest |a - b| over two lists that must name the same tensors of the same shapes in the same order (in
// fp32): dp::CheckFailed otherwise, since different shapes would broadcast (a [3] minus a [1] is a [3]) and
// yield a number for no pair at all. `what` names the two sides in the message.
double max_named_diff(const Named& a, const Named& b, const char* what) {
  if (a.size() != b.size()) throw CheckFailed(fmt::format("{}: {} parameters against {}", what, a.size(), b.size()));
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].first != b[i].first || !a[i].second.sizes().equals(b[i].second.sizes()))
      throw CheckFailed(fmt::format("{}: {} {} against {} {}", what, a[i].first, shape_text(a[i].second.sizes()),
                                    b[i].first, shape_text(b[i].second.sizes())));
    const auto d = a[i].second.detach().to(torch::kFloat32) - b[i].second.detach().to(torch::kFloat32);
    worst = std::max(worst, d.abs().max().item<double>());
  }
  return worst;
}

}  // namespace

double max_param_diff(torch::nn::Module& a, torch::nn::Module& b) {
  return max_named_diff(unique_named_parameters(a), unique_named_parameters(b), "max_param_diff");
}

double max_full_diff(const std::vector<std::pair<std::string, torch::Tensor>>& full, torch::nn::Module& ref) {
  return max_named_diff(full, unique_named_parameters(ref, /*trainable_only=*/true),
                        "full parameters against the reference's trainable ones");
}

Margin worst_over_ranks(ProcessGroup& pg, const Margin& mine) {
  Margin worst = mine;
  const auto diffs = pg.all_gather(mine.diff), bounds = pg.all_gather(mine.bound);
  for (size_t i = 0; i < diffs.size(); ++i)
    if (Margin m{diffs[i], bounds[i]}; m.ratio() > worst.ratio()) {
      worst.diff = m.diff;
      worst.bound = m.bound;
    }
  return worst;
}

bool report_margin(const Margin& m, const std::string& what) {
  print0("{} {}: max |diff| {:.3g} <= {:.3g} (ratio {:.2f}{}{})", m.ok() ? "PASS" : "FAIL", what, m.diff, m.bound,
         m.ratio(), m.derivation.empty() ? "" : "; bound = ", m.derivation);
  return m.ok();
}

namespace {

// What the checks ask after each step, answered by every rank alike: whether the ranks' copies of a tensor
// differ, and whether every rank's `problem` is empty.
struct Vote {
  bool any_flag = false;
  bool all_ok = true;
};
struct Gathered {
  std::vector<torch::Tensor> copies;  // every rank's `flat`, in rank order
  Vote vote;                          // any_flag: the copies are not all equal
};
// Every rank's `flat` (1-D) and its verdict (1: `problem` empty) in one all_gather: a check's comparison and its
// vote in one collective.
Gathered gather_with_verdict(ProcessGroup& pg, const torch::Tensor& flat, const std::string& problem) {
  const int64_t n = flat.numel();
  Gathered g;
  const auto verdict = torch::full({1}, problem.empty() ? 1.0 : 0.0, flat.options());
  for (const auto& other : pg.all_gather(torch::cat({flat, verdict}))) {
    g.copies.push_back(other.narrow(0, 0, n));
    g.vote.any_flag = g.vote.any_flag || !torch::equal(g.copies.back(), flat);
    g.vote.all_ok = g.vote.all_ok && other[n].item<double>() == 1.0;
  }
  return g;
}

// gather_with_verdict() of every unique parameter, flat, in the widest of their dtypes (so exactly).
Vote vote_with_parameters(ProcessGroup& pg, torch::nn::Module& module, const std::string& problem) {
  const auto params = unique_parameters(module);
  auto dtype = params.empty() ? torch::kFloat32 : params.front().scalar_type();
  for (const auto& p : params) dtype = at::promote_types(dtype, p.scalar_type());
  std::vector<torch::Tensor> flat;
  for (const auto& p : params) flat.push_back(p.detach().to(dtype).reshape({-1}).cpu());
  auto mine = flat.empty() ? torch::zeros({0}, torch::TensorOptions().dtype(dtype)) : torch::cat(flat);
  return gather_with_verdict(pg, mine.to(pg.device()), problem).vote;
}

// All ranks throw together once any found a problem, so no rank is left waiting in the next collective.
void throw_unless(const Vote& v, const std::string& problem) {
  if (!v.all_ok) throw CheckFailed(problem.empty() ? "another rank's check failed (see its message)" : problem);
}

// Every rank votes; all ranks throw together.
void fail_together(ProcessGroup& pg, const std::string& problem) {
  throw_unless(Vote{false, pg.first_rank_with(!problem.empty()) < 0}, problem);
}

}  // namespace

bool parameters_identical_across_ranks(ProcessGroup& pg, torch::nn::Module& module) {
  // Every rank must reach the same verdict, or one rank would go on while another stops.
  return !vote_with_parameters(pg, module, "").any_flag;
}

namespace {

struct Setup {
  torch::Tensor x, y;  // the whole batch, identical on every rank
  double lr = 0.1;
  int steps = 5;
  bool shuffle = true;  // CS336 reshuffles with seed 42 + step
  uint64_t seed = 0;    // 0: CS336's seeds; others shift the weights, data and shuffles (margin test)
};

// The bound on |DDP - single process| after `steps` steps (common/measure/tolerance.hpp's model, fp32): a
// gradient entry sums the batch's rows in another grouping (per rank, then the W rank partials), and
// when 1/rows and 1/(rows/W)/W differ by more than a power of two every op between a weight and the
// loss may round differently (2 per layer module, forward and backward, plus the loss). Plain SGD:
// the steps' differences add up, each scaled by lr, plus an ulp of the weight per step (the update's
// own rounding). G: the largest gradient entry of any step so far; max_weight: the largest |w|.
double ddp_bound(const Setup& s, int W, int layers, int steps, double G, double max_weight) {
  const double roundings = double(s.x.size(0)) + W + 2.0 * (layers + 1);
  return sgd_weight_bound(s.lr, 0.0, steps, roundings * unit_roundoff(torch::kFloat32) * G, max_weight);
}

// Trains `baseline` on the whole batch and `ddp_model` (trained by `strategy`, built with SGD at s.lr) on
// this rank's rows, with the same SGD, and compares every parameter after every step against ddp_bound() of that step.
// Returns the largest difference of any step with the bound after the last step (the worst over ranks): after one step
// two runs may already sit one ulp apart, exactly what the bound's first ulp allows, so a ratio taken step by step
// would say only that rounding is discrete.
Margin train_and_compare(ProcessGroup& pg, ToyBase& baseline, const std::shared_ptr<ToyBase>& ddp_model,
                         Strategy& strategy, Setup s, bool verbose) {
  auto base_params = unique_named_parameters(baseline);
  auto ddp_params = unique_named_parameters(*ddp_model);
  std::vector<torch::Tensor> frozen_before;
  for (auto& [name, p] : ddp_params) frozen_before.push_back(p.detach().clone());
  torch::optim::SGD base_opt(unique_parameters(baseline), torch::optim::SGDOptions(s.lr));
  const int64_t local = s.x.size(0) / pg.world_size();
  const int layers = static_cast<int>(baseline.children().size());
  double G = 0, max_weight = 0;
  Margin worst;
  // Remember every asynchronous collective while the check runs (ProcessGroup::track_async), on Gloo: its
  // wait() returns once the collective is done. NCCL's wait() only orders the GPU stream after it, so a
  // correctly waited collective may still be running as far as the host can tell.
  struct Tracking {
    ProcessGroup& pg;
    explicit Tracking(ProcessGroup& g) : pg(g) { pg.track_async(pg.backend() == "gloo"); }
    ~Tracking() { pg.track_async(false); }
  } tracking(pg);

  for (int step = 0; step < s.steps; ++step) {
    std::vector<torch::Tensor> ddp_before, base_before;  // what a failed comparison's hint compares
    for (auto& [name, p] : ddp_params) ddp_before.push_back(p.detach().clone());
    for (auto& [name, p] : base_params) base_before.push_back(p.detach().clone());
    strategy.zero_grad();
    base_opt.zero_grad();
    // Reference: one process, every row.
    torch::mse_loss(baseline.forward(s.x), s.y).backward();
    G = std::max(G, max_abs_grad(unique_parameters(baseline)));
    base_opt.step();
    max_weight = std::max(max_weight, max_abs(unique_parameters(baseline)));
    // DDP: this rank's rows only; mean-MSE over W equal shards averages to the full-batch mean.
    auto x = s.x.narrow(0, pg.rank() * local, local), y = s.y.narrow(0, pg.rank() * local, local);
    torch::mse_loss(ddp_model->forward(x), y).backward();
    strategy.after_backward();
    // A collective that after_backward() launched and left running races with the step: it still writes
    // the gradients the optimizer reads. On a fast link it may end first, and the mistake hide: so ask. One
    // found is waited for here, so that the step does not race with it, and every rank fails at this step's
    // vote below, with this message first.
    const auto running = pg.unfinished_async();
    std::string problem = running.empty() ? ""
                                          : fmt::format(
                                                "step {}: after_backward() returned while {} "
                                                "collective(s) it launched were still running, the "
                                                "first: {}{}",
                                                step, running.size(), running.front(), not_waited_hint());
    if (!running.empty()) pg.wait_async();
    strategy.step();

    const double bound = ddp_bound(s, pg.world_size(), layers, step + 1, G, max_weight);
    for (size_t i = 0; i < ddp_params.size() && problem.empty(); ++i) {
      auto& [name, p] = ddp_params[i];
      if (!p.requires_grad()) {  // frozen: never touched by either run, so bit for bit where it started
        if (!torch::equal(p, frozen_before[i])) problem = fmt::format("step {}: frozen parameter {} moved", step, name);
        continue;
      }
      const Margin m{(p - base_params[i].second).abs().max().item<double>(), bound};
      worst.diff = std::max(worst.diff, m.diff);
      if (!m.ok())
        problem = fmt::format(
                      "step {}: parameter {} differs from single-process training by {:.3g}, over the rounding "
                      "bound {:.3g} (lr {} x {} steps x {:.0f} roundings x u(fp32) x max|g| {:.3g}, plus {} ulps "
                      "of max|w| {:.3g})",
                      step, name, m.diff, bound, s.lr, step + 1,
                      double(s.x.size(0)) + pg.world_size() + 2.0 * (layers + 1), G, step + 1, max_weight) +
                  update_hint(ddp_before[i], p, base_before[i], base_params[i].second, pg.world_size());
    }
    // Every step, whatever was found (collectives): ranks that disagree name the cause of a mismatch. One
    // vote answers both questions (do ranks differ, did any rank find a problem).
    const Vote v = vote_with_parameters(pg, *ddp_model, problem);
    if (v.any_flag && !problem.empty() && running.empty()) problem = with_ranks_differ_hint(problem);
    throw_unless(v, problem);
    if (s.shuffle) {
      auto idx = torch::randperm(s.x.size(0), torch::make_generator<at::CPUGeneratorImpl>(42 + step + 1000 * s.seed))
                     .to(s.x.device());  // drawn on the CPU (the same permutation everywhere), used where the rows are
      s.x = s.x.index_select(0, idx);
      s.y = s.y.index_select(0, idx);
    }
  }
  if (verbose && pg.rank() == 0)
    for (size_t i = 0; i < ddp_params.size(); ++i)
      print0("  {:<22} max |ddp - single| = {:.3g}", ddp_params[i].first,
             (ddp_params[i].second - base_params[i].second).abs().max().item<double>());
  if (!parameters_identical_across_ranks(pg, *ddp_model)) throw CheckFailed("ranks ended with different parameters");
  worst.bound = ddp_bound(s, pg.world_size(), layers, s.steps, G, max_weight);
  return worst_over_ranks(pg, worst);  // one verdict for every rank: the worst ratio anywhere
}

// The SGD every check trains with, for the Strategy to build over the parameters it chooses.
MakeOptimizer sgd(double lr) {
  return [lr](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr));
  };
}

}  // namespace

void check_cs336_world_size(int world_size) {
  if (world_size < 1 || 20 % world_size != 0)
    throw UsageError(
        fmt::format("the CS336 check splits 20 rows over the ranks; world size {} does not divide 20. "
                    "Use 1, 2, 4, 5, 10 or 20 ranks",
                    world_size));
}

Margin check_cs336_scenario(ProcessGroup& pg, const std::string& model_name, const MakeStrategy& make, int steps,
                            bool verbose, uint64_t seed) {
  const int W = pg.world_size();
  check_cs336_world_size(W);
  std::shared_ptr<ToyBase> baseline, ddp_model;
  // A parameter that comes out equal in two models built one after the other from the same RNG stream
  // was initialised to a constant (ToyModel's no_grad_fixed_param): it is the same on every rank whatever
  // the seed, so it cannot show whether the broadcast happened. Every other one can, frozen ones too.
  std::vector<char> seed_independent;
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(pg.rank() + 100 * seed);  // every rank starts from *different* weights
    baseline = make_toy_model(model_name);
    ddp_model = make_toy_model(model_name);
    auto first = unique_parameters(*baseline), second = unique_parameters(*ddp_model);
    for (size_t i = 0; i < first.size(); ++i) seed_independent.push_back(torch::equal(first[i], second[i]));
    copy_parameters(*ddp_model, *baseline);
  }
  // before the optimizers: they key their state by the tensors
  baseline->to(pg.device());
  ddp_model->to(pg.device());
  constexpr double lr = 0.1;
  auto strategy = make(pg, ddp_model, sgd(lr));
  // The wrapper must have replaced this rank's weights with rank 0's (frozen ones included).
  // Every rank votes, so all ranks fail together instead of leaving peers waiting in a collective.
  auto mine = unique_named_parameters(*baseline);
  auto now = unique_named_parameters(*ddp_model);
  std::string problem;
  for (size_t i = 0; i < now.size() && problem.empty(); ++i) {
    bool same = torch::equal(now[i].second, mine[i].second);
    if (pg.rank() == 0 && !same) problem = "rank 0's parameter " + now[i].first + " changed at construction";
    if (pg.rank() != 0 && same && !seed_independent[i])
      problem = "parameter " + now[i].first + " was not broadcast from rank 0" + not_broadcast_hint();
  }
  fail_together(pg, problem);
  if (!parameters_identical_across_ranks(pg, *ddp_model))
    throw CheckFailed("ranks hold different parameters after construction");
  copy_parameters(*baseline, *ddp_model);  // the reference starts where DDP starts: rank 0's weights

  auto [x, y] = regression_batch(20, kToyIn, kToyOut, 2025 + seed);  // same fixed batch on every rank
  return train_and_compare(pg, *baseline, ddp_model, *strategy,
                           {x.to(pg.device()), y.to(pg.device()), lr, steps, true, seed}, verbose);
}

Margin check_cs336_scenario(ProcessGroup& pg, const std::string& model_name, const MakeGradSync& make, int steps,
                            bool verbose, uint64_t seed) {
  return check_cs336_scenario(pg, model_name, ddp_strategy(make), steps, verbose, seed);
}

void reference_backward(torch::nn::Module& ref, torch::nn::Module& copy, const ComputeDtypeOf& dtype_of,
                        const std::function<torch::Tensor(torch::nn::Module&)>& loss_of) {
  std::unordered_map<const void*, torch::ScalarType> cast;  // copy's parameters computed below fp32
  for (const auto& m : copy.modules())
    if (const auto dtype = dtype_of(*m); dtype != torch::kFloat32)
      for (const auto& p : m->parameters(/*recurse=*/false)) cast[p.unsafeGetTensorImpl()] = dtype;
  if (cast.empty()) {
    loss_of(ref).backward();
    return;
  }
  auto c = unique_parameters(copy), r = unique_parameters(ref);
  {
    torch::NoGradGuard no_grad;
    for (size_t i = 0; i < c.size(); ++i) {
      const auto it = cast.find(c[i].unsafeGetTensorImpl());
      c[i].set_data(it != cast.end() ? r[i].detach().to(it->second) : r[i].detach().clone());
      c[i].mutable_grad() = torch::Tensor();  // this backward's gradient only
    }
  }
  loss_of(copy).backward();
  for (size_t i = 0; i < c.size(); ++i)
    if (c[i].grad().defined()) r[i].mutable_grad() = c[i].grad().to(torch::kFloat32);
}

torch::ScalarType lowest_compute_dtype(const torch::nn::Module& model, const ComputeDtypeOf& dtype_of) {
  torch::ScalarType low = torch::kFloat32;
  for (const auto& m : model.modules())
    if (const auto d = dtype_of(*m); unit_roundoff(d) > unit_roundoff(low)) low = d;
  return low;
}

StrategyCheck StrategyCheck::cs336_fsdp(uint64_t seed) {
  StrategyCheck c;
  c.seed = seed;
  c.rows = 10;
  c.momentum = 0.0;
  c.model_seed = 42;
  c.data_seed = 123;
  return c;
}

namespace {

// The reference's clipping: torch.nn.utils.clip_grad_norm_ over its parameters; returns the norm before.
double clip_reference(torch::nn::Module& ref, double max_norm) {
  return torch::nn::utils::clip_grad_norm_(unique_parameters(ref, true), max_norm);
}

}  // namespace

// [check_strategy]
Margin check_strategy(ProcessGroup& pg, const MakeStrategy& make, const StrategyCheck& c) {
  const int W = pg.world_size(), r = pg.rank(), accumulate = c.accumulate;
  const int64_t rows = c.rows;  // per rank, each a sequence of kT tokens
  constexpr int64_t kT = 8, kVocab = 100;
  if (accumulate < 1 || rows % accumulate != 0)
    throw std::invalid_argument(fmt::format("check_strategy: accumulate {} does not divide {} rows", accumulate, rows));
  const double lr = 0.01, momentum = c.momentum;
  ToyFSDPModel ref{nullptr}, model{nullptr}, copy{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(c.model_seed + 100 * c.seed);  // rank 0's weights: the reference, built alike on every rank
    ref = ToyFSDPModel();
    torch::manual_seed(c.model_seed + 100 * c.seed + r);  // this rank's own weights (rank 0's: the reference's)
    model = ToyFSDPModel();
    copy = ToyFSDPModel();  // the reference's mixed-precision copy (reference_backward); weights set per step
  }
  ref->to(pg.device());
  model->to(pg.device());
  copy->to(pg.device());
  const auto sgd_momentum = [=](std::vector<torch::Tensor> params) -> std::unique_ptr<torch::optim::Optimizer> {
    return std::make_unique<torch::optim::SGD>(std::move(params), torch::optim::SGDOptions(lr).momentum(momentum));
  };
  auto strategy = make(pg, model.ptr(), sgd_momentum);
  strategy->set_max_grad_norm(c.max_grad_norm);
  const ComputeDtypeOf dtype_of = [&](const torch::nn::Module& m) { return strategy->compute_dtype(m); };
  const torch::ScalarType low = lowest_compute_dtype(*copy, dtype_of);
  auto ref_params = unique_named_parameters(*ref, /*trainable_only=*/true);
  torch::optim::SGD ref_opt(unique_parameters(*ref, true), torch::optim::SGDOptions(lr).momentum(momentum));

  // Compares full_parameters() with the reference: within `bound` (0: bit for bit), and the same on every
  // rank (every rank's values gathered and compared with rank 0's). Every rank votes, so all fail together.
  Margin worst;
  // The parameters before the step being checked, ours (full) and the reference's: a failure's hint compares
  // the two updates.
  std::vector<std::pair<std::string, torch::Tensor>> ours_before;
  std::vector<torch::Tensor> ref_before;
  auto compare = [&](const std::string& when, double bound, const std::string& derivation) {
    auto full = strategy->full_parameters();
    std::string problem;
    if (full.size() != ref_params.size())
      problem = fmt::format("{}: full_parameters() gave {} tensors for {} trainable parameters", when, full.size(),
                            ref_params.size());
    for (size_t i = 0; i < full.size() && problem.empty(); ++i)
      if (full[i].first != ref_params[i].first || !full[i].second.sizes().equals(ref_params[i].second.sizes()))
        problem = fmt::format("{}: full_parameters()[{}] is {} {}, expected {} {}", when, i, full[i].first,
                              shape_text(full[i].second.sizes()), ref_params[i].first,
                              shape_text(ref_params[i].second.sizes()));
    fail_together(pg, problem);       // the same structure everywhere before any collective over it
    std::vector<torch::Tensor> flat;  // every tensor in fp32 (exact from bf16), back to back
    for (size_t i = 0; i < full.size(); ++i) {
      const auto& [name, p] = full[i];
      flat.push_back(p.detach().to(torch::kFloat32).reshape({-1}));
      const Margin m{(flat.back() - ref_params[i].second.detach().reshape({-1})).abs().max().item<double>(), bound};
      if (bound > 0 && m.ratio() >= worst.ratio()) worst = {m.diff, m.bound, derivation};
      if (!m.ok() && problem.empty())
        problem = bound == 0 ? fmt::format(
                                   "{}: parameter {} is not rank 0's (max |diff| {:.3g}): rank 0's weights "
                                   "were not broadcast{}",
                                   when, name, m.diff, not_broadcast_hint())
                             : fmt::format(
                                   "{}: parameter {} differs from single-process training by {:.3g}, over the "
                                   "rounding bound {:.3g} ({}){}",
                                   when, name, m.diff, bound, derivation,
                                   ours_before.empty()
                                       ? ""
                                       : update_hint(ours_before[i].second, p, ref_before[i], ref_params[i].second, W));
    }
    // Every rank's copy of all of them and its verdict so far (1: no problem), in one all_gather (every rank,
    // whatever was found): does any rank differ from rank 0 (the cause of a mismatch), did any find a problem.
    const Gathered g = gather_with_verdict(pg, torch::cat(flat), problem);
    const torch::Tensor& zero = g.copies.front();  // rank 0's
    Vote v = g.vote;
    for (size_t i = 0, off = 0; problem.empty() && i < flat.size(); off += flat[i++].numel())
      if (!torch::equal(zero.narrow(0, off, flat[i].numel()), flat[i]))
        problem = fmt::format("{}: parameter {} differs between rank 0 and rank {}", when, full[i].first, r);
    if (v.any_flag && !problem.empty() && bound > 0) problem = with_ranks_differ_hint(problem);
    v.all_ok = v.all_ok && !v.any_flag;  // a rank that differs from rank 0 fails every rank
    throw_unless(v, problem);
    // What the next step starts from: nothing changes the parameters between here and its zero_grad().
    for (auto& [name, p] : full) p = p.detach().clone();
    ours_before = std::move(full);
  };
  compare("after construction", 0.0, "");

  const auto last_token_loss = [](const torch::Tensor& logits, const torch::Tensor& labels) {
    return torch::nn::functional::cross_entropy(logits.select(1, -1).to(torch::kFloat32), labels);
  };
  // The bound (common/measure/tolerance.hpp's model): a weight gradient sums rows x W last-token terms in another
  // grouping, plus K accumulated micro-batch partials, then the W ranks' partials, in fp32; each of the 7
  // ops between a weight and the loss (embedding, 2 norms, fc1, fc2, lm_head, cross-entropy) may round
  // differently, in the compute dtype (gradient_rounding_error()). Relative to the largest gradient entry
  // G; SGD with momentum carries each difference on (sgd_weight_bound).
  double low_roundings = 0;
  const double rel = gradient_rounding_error(double(rows * W + accumulate), W, 7, low, &low_roundings);
  double G = 0;
  for (int step = 1; step <= c.steps; ++step) {
    // The same draw on every rank.
    auto gen = at::make_generator<at::CPUGeneratorImpl>(c.data_seed + 1000 * c.seed + step - 1);
    auto tokens = torch::randint(0, kVocab, {rows * W, kT}, gen).to(pg.device());
    auto labels = torch::randint(0, kVocab, {rows * W}, gen).to(pg.device());
    ref_before.clear();
    for (auto& [name, p] : ref_params) ref_before.push_back(p.detach().clone());
    ref_opt.zero_grad();
    reference_backward(*ref, *copy, dtype_of, [&](torch::nn::Module& m) {
      return last_token_loss(static_cast<ToyFSDPModelImpl&>(m).forward(tokens), labels);
    });
    G = std::max(G, max_abs_grad(unique_parameters(*ref, true)));
    const double ref_norm = c.max_grad_norm > 0 ? clip_reference(*ref, c.max_grad_norm) : 0.0;
    ref_opt.step();

    // This rank's rows, in K micro-batches of rows / K: each mean loss / K, so that they add up to the
    // mean over the rank's rows; only the last backward must synchronize.
    strategy->zero_grad();
    const int64_t micro = rows / accumulate;
    for (int k = 0; k < accumulate; ++k) {
      auto mine = [&](const torch::Tensor& t) { return t.narrow(0, r * rows + k * micro, micro); };
      strategy->set_requires_gradient_sync(k + 1 == accumulate);
      (last_token_loss(model->forward_units(mine(tokens), strategy->runner()), mine(labels)) / accumulate).backward();
      strategy->after_backward();
    }
    strategy->step();

    // Clipping: the norm before clipping differs from the reference's by at most ||g - g_ref||_2 <= sqrt(P) x
    // rel x G, plus the reference's own fp32 sum of P squares (clip_grad_norm_; P x u(fp32) of it). The scale
    // max / norm then differs by that bound / norm, relative, and moves each weight by lr x (that x G) more.
    double clip_diff = 0;
    if (c.max_grad_norm > 0) {
      const double P = static_cast<double>(count_elements(unique_parameters(*ref, true)));
      const double norm_bound = std::sqrt(P) * rel * G + P * unit_roundoff(torch::kFloat32) * ref_norm;
      const double norm = strategy->last_grad_norm();
      std::string problem;
      if (!(std::abs(norm - ref_norm) <= norm_bound))
        problem =
            fmt::format("step {}: the gradient norm before clipping is {:.6g}, one process's {:.6g} (bound {:.3g})",
                        step, norm, ref_norm, norm_bound) +
            clip_norm_hint(norm / ref_norm);
      fail_together(pg, problem);
      clip_diff = norm_bound / ref_norm * G;
    }

    const double w = max_abs(unique_parameters(*ref, true));
    const double bound = sgd_weight_bound(lr, momentum, step, rel * G + clip_diff, w);
    // The PASS line shows the derivation of the step with the largest ratio: it says which step that was.
    compare(fmt::format("step {}", step), bound,
            fmt::format("lr {}{} x {} x ({} sums x u(fp32) + {:.0f} roundings x u({})) x max|g| {:.3g}, plus {} "
                        "of max|w| {:.3g}, after step {} of {}",
                        lr, momentum > 0 ? fmt::format(" with momentum {}", momentum) : "", count_of(step, "step"),
                        rows * W + W + accumulate, low_roundings, dtype_name(low), G, count_of(step, "ulp"), w, step,
                        c.steps) +
                (clip_diff > 0 ? fmt::format("; clipping adds {:.3g} x max|g| to each gradient entry (the norm's bound "
                                             "over the norm)",
                                             clip_diff / G)
                               : ""));
  }
  return worst_over_ranks(pg, worst);
}
// [check_strategy]

Margin check_toy_mlp_experiment(ProcessGroup& pg, const MakeGradSync& make, bool verbose, uint64_t seed) {
  const int W = pg.world_size();
  if (100 % W != 0)
    throw UsageError(
        fmt::format("the toy-MLP check splits a batch of 100 over the ranks; world size {} does not "
                    "divide 100",
                    W));
  std::shared_ptr<ToyBase> baseline, ddp_model;
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(pg.rank() + 100 * seed);
    baseline = make_toy_model("mlp");
    ddp_model = make_toy_model("mlp");
  }
  baseline->to(pg.device());
  ddp_model->to(pg.device());
  constexpr double lr = 0.01;
  auto strategy = ddp_strategy(make)(pg, ddp_model, sgd(lr));
  copy_parameters(*baseline, *ddp_model);
  auto [x, y] = regression_batch(100, kToyIn, kToyOut, 7 + seed);
  const Margin m = train_and_compare(pg, *baseline, ddp_model, *strategy,
                                     {x.to(pg.device()), y.to(pg.device()), lr, 10, false, seed}, verbose);
  // The experiment's own criterion, a difference under 1e-5, is looser than the derived bound; both hold.
  if (m.diff >= 1e-5) throw CheckFailed(fmt::format("DDP weights differ from one process by {:.3g} >= 1e-5", m.diff));
  return m;
}

void check_gradient_sync(ProcessGroup& pg, const MakeStrategy& make) {
  ToyFSDPModel model{nullptr};
  {
    std::lock_guard<std::mutex> lock(model_init_mutex());
    torch::manual_seed(42);
    model = ToyFSDPModel();
  }
  model->to(pg.device());
  auto s = make(pg, model.ptr(), sgd(0.01));
  // Every rank its own data, from a generator of its own: ranks running as threads of one test process
  // do not race on the global RNG.
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7 + pg.rank());
  auto tokens = torch::randint(0, 100, {4, 8}, gen).to(pg.device());
  s->zero_grad();
  model->forward_units(tokens, s->runner()).to(torch::kFloat32).sum().backward();
  s->after_backward();
  std::string problem;  // the first tensor found wrong on this rank; every rank then fails together
  int64_t i = 0;
  for (auto* opt : s->optimizers())
    for (const auto& group : opt->param_groups())
      for (const auto& p : group.params()) {
        const auto& g = p.grad();
        if (problem.empty() && (!g.defined() || g.sizes() != p.sizes() || g.scalar_type() != torch::kFloat32))
          problem = fmt::format("optimizer tensor {} {}: gradient {} {}", i, shape_text(p.sizes()),
                                g.defined() ? shape_text(g.sizes()) : "missing",
                                g.defined() ? c10::toString(g.scalar_type()) : "");
        ++i;
      }
  fail_together(pg, problem);
  // The model's own parameters, in the same order on every rank: a gradient kept whole (not a shard, which
  // differs across ranks by design) is the same average everywhere. FSDP keeps none for sharded tensors.
  // Which ones kept a gradient, agreed first in one gather (ranks x parameters), so that a rank without one
  // is an error here rather than a wait in the gathers of the gradients.
  const auto params = model->named_parameters();
  std::vector<double> mine;
  for (const auto& item : params) mine.push_back(item.value().grad().defined() ? 1.0 : 0.0);
  const auto kept = pg.all_gather(mine);
  for (size_t k = 0; k < params.size(); ++k) {
    const std::string& name = params[k].key();
    const torch::Tensor& p = params[k].value();
    for (const auto& other : kept)
      if (other[k] != mine[k]) throw CheckFailed(fmt::format("{}: a gradient on some ranks only", name));
    if (mine[k] == 0) continue;
    for (const auto& other : pg.all_gather(p.grad()))
      if (!torch::equal(other, p.grad()))
        throw CheckFailed(fmt::format("{}: the gradient differs across ranks (not synchronized)", name));
  }
}

}  // namespace dp
