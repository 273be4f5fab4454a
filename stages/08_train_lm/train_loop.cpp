// The capstone's training loop, and its program (train_lm_main(): stage 08's main, and extension 10a's).
#include "stages/08_train_lm/train_loop.hpp"

#include "common/base/format.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/accounting.hpp"
#include "common/measure/cli.hpp"     // Cli, check_writable
#include "common/measure/memory.hpp"  // check_fits_in_memory
#include "common/measure/results.hpp"
#include "common/measure/timing.hpp"
#include "common/model/models.hpp"
#include "common/model/params.hpp"
#include "stages/08_train_lm/lm_check.hpp"
#include "stages/08_train_lm/lm_checkpoint.hpp"

#include <ATen/CPUGeneratorImpl.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>

namespace dp {

using json = nlohmann::json;

json RunOptions::config() const {
  json c = {{"corpus", corpus},
            {"preset", preset},
            {"context", context},
            {"batch", batch},
            {"accumulate", accumulate},
            {"lr", lr},
            {"warmup", warmup},
            {"weight_decay", trainer.weight_decay},
            {"seed", seed},
            {"world_size", world_size},
            {"sync", trainer.sync},
            {"steps", steps},
            {"eval_every", eval_every},
            {"checkpoint_every", checkpoint_every},
            {"bucket_mb", trainer.bucket_mb}};
  // Only when on: a checkpoint written without clipping has no such key, and still resumes without it.
  if (trainer.max_grad_norm > 0) c["max_grad_norm"] = trainer.max_grad_norm;
  return c;
}

void add_training_options(CLI::App& app, RunOptions& o) {
  app.add_option("--corpus", o.corpus, "Text file or directory of text files (default: Debian's fortunes)");
  app.add_option("--preset", o.preset, "Transformer size (byte vocabulary 256)")
      ->check(CLI::IsMember(TransformerConfig::preset_names()));
  app.add_option("--context", o.context, "Tokens (bytes) per sequence")->check(PositiveInt);
  app.add_option("--batch", o.batch, "Global batch: sequences per step over all ranks")->check(PositiveInt);
  app.add_option("--accumulate", o.accumulate, "Micro-batches per step on each rank")->check(PositiveInt);
  app.add_option("--steps", o.steps, "Optimizer steps in all (a resumed run counts from 0 too)")->check(PositiveInt);
  app.add_option("--lr", o.lr, "AdamW learning rate after warm-up")->check(PositiveFinite);
  app.add_option("--warmup", o.warmup, "Steps of linear learning-rate warm-up")->check(NonNegativeFinite);
}

void validate_run_options(const RunOptions& o) {
  if ((o.checkpoint_every > 0 || o.resume) && o.checkpoint.empty())
    throw UsageError("--checkpoint-every and --resume need --checkpoint FILE");
  if (o.resume && !std::filesystem::exists(o.checkpoint))
    throw UsageError(
        fmt::format("--resume: checkpoint {} does not exist; run without --resume to start from step 0", o.checkpoint));
  // Every file the run will write, checked before any work: a typo costs a second, not the run.
  if (!o.checkpoint.empty()) check_writable("--checkpoint", o.checkpoint);
  if (!o.curve.empty()) check_writable("--curve", o.curve);
  if (!std::filesystem::exists(o.corpus)) load_corpus(o.corpus, 0, 0);  // throws its message, with the remedy
  if (o.warmup > o.steps)
    throw UsageError(
        fmt::format("--warmup {} is longer than --steps {}: the learning rate would never reach --lr; "
                    "give --warmup {} or less (0: no warm-up)",
                    o.warmup, o.steps, o.steps));
}

void check_run_fits(const RunOptions& o, int world_size, int ranks_here, bool on_gpu) {
  validate_sync(o.trainer, world_size);  // what a registered scheme cannot take (hsdp: a node count)
  const int64_t split = world_size * o.accumulate;
  if (o.batch % split != 0)
    throw UsageError(
        fmt::format("--batch {} does not split into {} ranks x --accumulate {} equal micro-batches; use a "
                    "multiple of {}",
                    o.batch, world_size, o.accumulate, split));
  auto m = TransformerConfig::preset(o.preset, o.context);
  m.vocab_size = TextCorpus::kVocab;                        // as make_byte_lm() builds it
  const MemoryPool pool = memory_pool(ranks_here, on_gpu);  // this machine's, or one GPU's
  // Resuming holds the file's bytes (weights and AdamW's moments, 12 bytes a parameter) and the state read
  // from them (12 more); saving streams the state to the file (DDP: its live tensors; ZeRO-1 and FSDP gather
  // it, 12 bytes a parameter). Measured on `small` (114 M parameters, DDP), peak resident: 2.84 GB
  // training, 2.81 GB saving, 5.30 GB resuming (21 bytes a parameter more).
  const double checkpoint = o.checkpoint.empty() || on_gpu ? 0 : 32.0 * static_cast<double>(m.num_parameters());
  // A scheme registered by a later stage is estimated as DDP's whole replica: more than any sharding holds.
  const std::string design = o.trainer.sync == "zero1" || o.trainer.sync == "fsdp" ? o.trainer.sync : "ddp";
  check_fits_in_memory(peak_training_bytes(m, design, world_size, o.batch / split) + checkpoint, pool.ranks,
                       fmt::format("--sync {} --preset {} --context {} with micro-batches of {} sequences",
                                   o.trainer.sync, o.preset, o.context, o.batch / split),
                       fmt::format("use a smaller --preset or --context, a larger --accumulate, fewer ranks on this "
                                   "machine{}{}",
                                   o.checkpoint.empty() ? "" : ", no --checkpoint (it gathers the whole state)",
                                   o.trainer.sync == "fsdp" ? ", or more machines"
                                                            : ", or --sync fsdp (stage 07: every "
                                                              "state sharded)"),
                       pool.available, pool.where);
}

std::vector<Batch> micro_batches(const TextCorpus& c, const std::vector<int64_t>& ids, int64_t k, int64_t context,
                                 torch::Device device) {
  const int64_t per = static_cast<int64_t>(ids.size()) / k;
  std::vector<Batch> out;
  for (int64_t i = 0; i < k; ++i)
    out.push_back(windows(c.train, {ids.begin() + i * per, ids.begin() + (i + 1) * per}, context, device));
  return out;
}

TransformerLM make_byte_lm(const std::string& preset, int64_t context, uint64_t seed, torch::Device device) {
  auto cfg = TransformerConfig::preset(preset, context);
  cfg.vocab_size = TextCorpus::kVocab;  // bytes
  torch::manual_seed(seed);             // the same initial weights on every rank (and DDP broadcasts anyway)
  TransformerLM lm(cfg);
  lm->to(device);  // initialised on the host, so the weights are the same whatever the device
  return lm;
}

double lr_at(const RunOptions& o, int64_t step) {
  return o.warmup > 0 ? o.lr * std::min(1.0, static_cast<double>(step + 1) / o.warmup) : o.lr;
}

static double mean_over_ranks(ProcessGroup& pg, double v) {
  const auto all = pg.all_gather(v);  // every rank holds an equal share, so the plain mean is the global one
  double s = 0;
  for (double x : all) s += x;
  return s / all.size();
}

// Validation: `batch` windows spread evenly over the held-out text, the same whatever the world size;
// each rank scores its equal share.
static double validation_loss(ProcessGroup& pg, LmTrainer& t, const RunOptions& o, const TextCorpus& c) {
  const int64_t nv = window_count(c.val, o.context), per_rank = o.batch / pg.world_size();
  std::vector<int64_t> ids;
  for (int64_t j = pg.rank() * per_rank; j < (pg.rank() + 1) * per_rank; ++j) ids.push_back(j * (nv / o.batch));
  return mean_over_ranks(pg, t.eval_loss(windows(c.val, ids, o.context, pg.device())));
}

// The model runs on `device`; each token is drawn on the host from its 256 logits, brought back with
// cpu(), so that the seeded CPU generator draws it whatever the device.
static std::string sample_text(TransformerLM model, const RunOptions& o, int64_t n, torch::Device device) {
  torch::NoGradGuard no_grad;
  auto gen = at::detail::createCPUGenerator(o.seed + 7);
  const std::string prompt = "The ";
  std::vector<int64_t> toks(prompt.begin(), prompt.end());
  for (int64_t i = 0; i < n; ++i) {
    const int64_t from = std::max<int64_t>(0, static_cast<int64_t>(toks.size()) - o.context);
    auto x = torch::tensor(std::vector<int64_t>(toks.begin() + from, toks.end()), torch::kLong).unsqueeze(0).to(device);
    auto logits = model->forward(x).select(1, -1).squeeze(0).cpu() / 0.8;  // [256], temperature 0.8
    toks.push_back(torch::multinomial(torch::softmax(logits, -1), 1, false, gen).item<int64_t>());
  }
  std::string s(toks.begin(), toks.end());
  for (auto& ch : s)
    if ((static_cast<unsigned char>(ch) < 32 && ch != '\n') || static_cast<unsigned char>(ch) > 126) ch = '?';
  return s;
}

static double median(const std::vector<double>& v) { return summarize(v).median; }  // common/measure/timing.hpp

// [loop]
json train(ProcessGroup& pg, const RunOptions& o, const TextCorpus& corpus, DistributedSampler& sampler) {
  TransformerLM model = make_byte_lm(o.preset, o.context, o.seed, pg.device());
  auto trainer = std::make_unique<LmTrainer>(pg, model, o.trainer);
  print0("{}; {}\n{}; global batch {} x {} bytes, {} of {} per rank; AdamW lr {:g} (warm-up {} steps)",
         describe(model->cfg), trainer->describe(), o.trainer.sync, o.batch, o.context,
         count_of(o.accumulate, "micro-batch"), o.batch / pg.world_size() / o.accumulate, o.lr, o.warmup);
  json curve = {{"train", json::array()}, {"val", json::array()}};
  int64_t start = 0;
  if (o.resume) {
    // The shapes to check come from the model itself: full_state() would gather (ZeRO-1, FSDP). The state
    // is read into host memory; each Strategy copies it into its own tensors on pg.device().
    auto [meta, state] = load_lm_checkpoint(o.checkpoint, o.config(), unique_named_parameters(*model, true));
    trainer->load_full_state(state);
    start = meta.step;
    curve = meta.curve;
    print0("resumed from {} at step {} (saved by {} rank(s), --sync {}){}", o.checkpoint, start,
           meta.config.value("world_size", 0), meta.config.value("sync", "?"),
           start == o.steps ? "; nothing left to train before --steps" : "");
  }
  std::vector<double> data_s, fwd_s, bwd_s, sync_s, opt_s;
  const int64_t every = std::max<int64_t>(1, o.steps / 20);
  for (int64_t step = start; step < o.steps; ++step) {
    Timer wall(pg.device());  // on a GPU they synchronize before reading the clock
    Timer d(pg.device());
    const auto ids = sampler.local_ids(step);  // this rank's share of the step's global batch
    const auto micro = micro_batches(corpus, ids, o.accumulate, o.context, pg.device());
    data_s.push_back(d.seconds());
    StepTimes t;
    const double local = trainer->step(micro, lr_at(o, step), t);
    const double loss = mean_over_ranks(pg, local);  // the same number on every rank: they stop together
    if (!std::isfinite(loss))  // nothing after this step is worth keeping: stop before any checkpoint
      throw NonFiniteLoss(fmt::format(
          "the training loss is {} at step {} (lr {:.3g}); the model has diverged, so the run stops here and "
          "writes no checkpoint{}. Lower --lr (or lengthen --warmup) and start again{}",
          std::isnan(loss) ? "nan"
          : loss > 0       ? "inf"
                           : "-inf",
          step + 1, lr_at(o, step),
          o.checkpoint.empty() ? "" : fmt::format(" ({} keeps its last good state)", o.checkpoint),
          o.checkpoint.empty() ? "" : ", or --resume from the last checkpoint"));
    const double secs = wall.seconds();
    fwd_s.push_back(t.forward);
    bwd_s.push_back(t.backward);
    sync_s.push_back(t.sync);
    opt_s.push_back(t.optimizer);
    curve["train"].push_back({step, loss, secs});
    const bool clips = o.trainer.max_grad_norm > 0;  // the norm is global: the same number on every rank
    if (clips) curve["grad_norm"].push_back({step, trainer->last_grad_norm()});
    const bool last = step + 1 == o.steps, eval = (step + 1) % o.eval_every == 0 || last;
    double val = NAN;
    if (eval) curve["val"].push_back({step, val = validation_loss(pg, *trainer, o, corpus)});
    if ((step + 1) % every == 0 || eval || step == start)
      print0("step {:5d}/{}  loss {:.4f}{}{}  lr {:.2e}  {:.0f} tokens/s", step + 1, o.steps, loss,
             eval ? fmt::format("  val {:.4f}", val) : std::string(),
             clips ? fmt::format("  |g| {:.3f}", trainer->last_grad_norm()) : std::string(), lr_at(o, step),
             static_cast<double>(o.batch * o.context) / secs);
    // Every N steps with --checkpoint-every, and at the end whenever --checkpoint was asked for.
    if (!o.checkpoint.empty() && (last || (o.checkpoint_every > 0 && (step + 1) % o.checkpoint_every == 0))) {
      save_lm_checkpoint(o.checkpoint, pg, {step + 1, o.config(), curve}, trainer->full_state_view());
      print0("checkpoint step {} written to {}", step + 1, o.checkpoint);
    }
  }
  // [loop]
  if (!data_s.empty())
    print0("per step on rank 0 (median s): data {:.4f}, forward {:.4f}, backward {:.4f}, sync {:.4f}, optimizer {:.4f}",
           median(data_s), median(fwd_s), median(bwd_s), median(sync_s), median(opt_s));
  curve["phases"] = {{"data", median(data_s)},
                     {"forward", median(fwd_s)},
                     {"backward", median(bwd_s)},
                     {"sync", median(sync_s)},
                     {"optimizer", median(opt_s)}};
  curve["config"] = o.config();
  curve["command"] = o.command;
  curve["machine"] = machine_description();
  curve["link"] = link_description();
  curve["threads"] = torch::get_num_threads();  // per rank: the order of a matmul's sums depends on it
  // The run's last collective. Rank 0 samples after it, alone: a peer waiting in a collective meanwhile would
  // fail after --timeout, however long sampling takes (--sample 3000 at --timeout 3s did).
  pg.barrier();
  if (o.sample_bytes > 0 && pg.rank() == 0) {
    if (!trainer->holds_whole_model()) {
      print0("(no sample: under {} no rank holds the whole model)", o.trainer.sync);
    } else {
      curve["sample"] = sample_text(model, o, o.sample_bytes, pg.device());
      print0("sampled from the model (prompt \"The \", temperature 0.8):\n{}", curve["sample"].get<std::string>());
    }
  }
  if (pg.rank() == 0 && !o.curve.empty()) {
    std::ofstream f(o.curve);
    f << curve.dump(1) << "\n";
    if (!f) throw UsageError(fmt::format("cannot write --curve {}", o.curve));
  }
  return curve;
}

int train_lm_main(int argc, char** argv, const std::string& program, const std::string& description,
                  const std::function<void(CLI::App&)>& add_options) {
  Cli cli(program, description);
  RunOptions o;
  add_training_options(cli.app(), o);  // --corpus, --preset, --context, --batch, --accumulate, --steps, --lr, --warmup
  cli.app().add_option("--sync", o.trainer.sync, sync_help())->check(CLI::IsMember(sync_names()));
  cli.app()
      .add_option("--bucket-mb", o.trainer.bucket_mb, "DDP's bucket cap in MB (stage 05; default 25)")
      ->check(PositiveFinite);
  cli.app()
      .add_option("--clip-grad-norm", o.trainer.max_grad_norm,
                  "Clip the gradient's global L2 norm to this before each step, as torch's clip_grad_norm_ (0: off)")
      ->check(NonNegativeFinite);
  cli.app()
      .add_option("--eval-every", o.eval_every, "Validation loss every N steps (and at the end)")
      ->check(PositiveInt);
  cli.app().add_option("--checkpoint", o.checkpoint, "Checkpoint file (written atomically)");
  cli.app()
      .add_option("--checkpoint-every", o.checkpoint_every, "Save every N steps (needs --checkpoint)")
      ->check(PositiveInt);
  cli.app().add_flag("--resume", o.resume, "Continue from --checkpoint (any world size, --sync or --accumulate)");
  cli.app().add_option("--curve", o.curve, "Write the loss curve, timings and sample as JSON (rank 0)");
  cli.app()
      .add_option("--sample", o.sample_bytes, "Bytes of text to sample from the model at the end (0: none)")
      ->check(NonNegativeFinite);
  if (add_options) add_options(cli.app());
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;
  o.seed = cli.common().seed;

  return run_main([&] {
    o.command = command_line(argc, argv);  // reads the launch environment: inside run_main, whose errors exit 2
    configure_cpu_threads();
    check_blas();
    // Bad input exits 2 before the process group forms: flags, a missing checkpoint or corpus, a batch the
    // world size does not split, a model this machine cannot hold. The launch environment knows this rank
    // and the world size already.
    validate_run_options(o);
    if (cli.app().count("--bucket-mb") && o.trainer.sync != "ddp")  // given, it would be ignored
      throw UsageError(fmt::format("--bucket-mb sets DDP's buckets; --sync {} has none: leave it out", o.trainer.sync));
    const LaunchEnv env = LaunchEnv::from_environment();
    const TextCorpus corpus = load_corpus(o.corpus, o.batch, o.context);
    DistributedSampler sampler(window_count(corpus.train, o.context), o.batch, o.seed, env.rank, env.world_size);
    check_run_fits(o, env.world_size, env.ranks_on_this_machine(), cli.dist_options().on_gpu());
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    o.world_size = pg.world_size();
    print0("process group: backend {}, world size {}; corpus {}: {} bytes of training text, {} held out", pg.backend(),
           pg.world_size(), corpus.source, corpus.train.numel(), corpus.val.numel());

    // [check]
    const LmCheck check = check_against_one_process(pg, o, corpus);
    print0(
        "{} {} trains like one process: 2 steps of a 2-layer model on real batches, max |diff| {:.3g} "
        "(ratio {:.2f} to its bound; bound = {})",
        check.ok() ? "PASS" : "FAIL", o.trainer.sync, check.max_abs_diff, check.worst_ratio, check.derivation);
    if (!check.ok()) throw CheckFailed("the synchronized model differs from single-process training");
    // [check]

    const json curve = train(pg, o, corpus, sampler);  // ends with a barrier: every rank has trained every step

    const auto& train_curve = curve.at("train");
    const double first = train_curve.front().at(1).get<double>(), last = train_curve.back().at(1).get<double>();
    if (!std::isfinite(last) || last >= first)
      throw CheckFailed(
          fmt::format("the training loss did not fall: {:.4f} at the first step, {:.4f} at the last", first, last));
    print0("PASS stage 08: {} trained {} steps on {}, loss {:.3f} -> {:.3f}", o.trainer.sync, o.steps,
           count_of(pg.world_size(), "rank"), first, last);
    pg.shutdown();
    return 0;
  });
}

}  // namespace dp
