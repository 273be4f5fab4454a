// Extension 08a, on stage 08: the capstone trained with DDP's gradients in fewer bytes, and its loss curve against
// fp32's. Stage 08 picks its synchronization by name (register_sync()); here "ddp-bf16" and "ddp-int8" are added:
// stage 05's bucketed DDP with a communication hook that sends each bucket as bf16 or block-scaled int8 and adds the
// ranks' pieces in fp32 (common/comm/low_byte_hook.hpp, the hook extension 05e measured). Then one launch trains the
// capstone's model on its real text with each of --hooks from the same weights and batches, and fp32 once more on
// other batches (the sampler's seed + 1): how far a hook moves the curve, against how far other data moves it.
//
// What it adds: (1) the check each hook passes before any training: its collective equals the one-process model bit
// for bit and lies within the derived bound of the exact average, on buffers of the model's tensor sizes (stage
// 08's check against one process holds fp32 syncs to fp32's roundings; a rounding hook has its own bound, so this
// program uses stage 08's loop, not its check). (2) The runs, each stage 08's train(): the same sampler, schedule
// and validation. (3) A table of final training and validation losses, each hook's distance from fp32's.
//
// Run it:
//   ./build/bin/ddp_launch --nproc 2 -- ./build/bin/ext08a_low_byte_lm --steps 300 --json curves.json
// Correct output: "PASS hook ..." lines, each run's stage 08 log, then the table: each hook's final validation loss
// "within" fp32's other-data distance, and last "PASS extension 08a".
//
// What it leaves: FSDP's weights and gradients in fewer bytes (extension 07c) in the capstone, which would need its
// LowByteFsdp reachable from here; timing: the runs here share the machine, stage 08's --curve times one alone.
#include "common/base/errors.hpp"
#include "common/comm/low_byte_hook.hpp"
#include "common/contract/strategy.hpp"  // ddp_strategy
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/measure/cli.hpp"
#include "common/measure/error_study.hpp"  // final_loss
#include "common/measure/results.hpp"
#include "common/model/params.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/08_train_lm/train_loop.hpp"
#include "stages/08_train_lm/trainer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>

using namespace dp;

namespace {

// "bf16" or "int8" (blocks of `block`), fp32 sums.
LowByteOptions hook_options(const std::string& hook, int64_t block) {
  return {parse_wire_format(hook, block), SumIn::fp32};
}

// [register]
// --sync ddp-bf16 and ddp-int8: stage 05's bucketed DDP (o.bucket_mb) with the low-byte hook, then AdamW as stage
// 08's ddp has it (ddp_strategy).
void register_low_byte_syncs(int64_t block) {
  for (const std::string hook : {"bf16", "int8"})
    register_sync(
        "ddp-" + hook, fmt::format("stage 05's DDP, gradients as {} on the wire, fp32 sums", hook),
        [hook, block](const TrainerOptions& o) {
          const double cap = o.bucket_mb;
          const MakeGradSync make = [hook, block, cap](ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) {
            auto ddp = std::make_unique<BucketedDdp>(pg, std::move(m), cap);
            ddp->register_comm_hook(low_byte_hook(std::make_shared<LowByteHook>(pg, hook_options(hook, block))));
            return std::unique_ptr<GradSync>(std::move(ddp));
          };
          return ddp_strategy(make, "ddp-" + hook);
        });
}
// [register]

// The losses of a curve's [step, loss, ...] entries.
std::vector<double> losses_of(const nlohmann::json& points) {
  std::vector<double> out;
  for (const auto& p : points) out.push_back(p.at(1).get<double>());
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  Cli cli("ext08a_low_byte_lm",
          "Extension 08a: the capstone with DDP's gradients in fewer bytes, its curve against fp32's");
  RunOptions o;
  o.steps = 300;
  o.sample_bytes = 0;
  add_training_options(cli.app(), o);  // --corpus, --preset, --context, --batch, --accumulate, --steps, --lr, --warmup
  std::vector<std::string> hooks{"int8", "bf16"};
  int64_t block = 256;
  cli.app()
      .add_option("--hooks", hooks, "Wires to train with besides fp32: bf16, int8")
      ->delimiter(',')
      ->check(CLI::IsMember({"bf16", "int8"}));
  cli.app().add_option("--block", block, "int8: values per scale")->check(PositiveInt);
  cli.app()
      .add_option("--eval-every", o.eval_every, "Validation loss every N steps (and at the end)")
      ->check(PositiveInt);
  if (int rc = cli.parse(argc, argv); rc >= 0) return rc;
  o.seed = cli.common().seed;
  register_low_byte_syncs(block);

  return run_main([&] {
    o.command = command_line(argc, argv);
    configure_cpu_threads();
    check_blas();
    validate_run_options(o);
    const LaunchEnv env = LaunchEnv::from_environment();
    const TextCorpus corpus = load_corpus(o.corpus, o.batch, o.context);
    check_run_fits(o, env.world_size, env.ranks_on_this_machine(), cli.dist_options().on_gpu());
    auto pg = ProcessGroup::init_from_env(cli.dist_options());
    o.world_size = pg.world_size();

    // The hooks' check, on buffers of the capstone model's tensor sizes.
    std::vector<int64_t> sizes;
    for (const auto& p : unique_parameters(*make_byte_lm(o.preset, o.context, o.seed, torch::kCPU)))
      sizes.push_back(p.numel());
    for (const auto& h : hooks) {
      check_low_byte_all_reduce(pg, hook_options(h, block), sizes, "hook " + h, o.seed);
      print0(
          "PASS hook {} ({}): every tensor's average equals the one-process model bit for bit, within the derived "
          "bound of the exact average",
          h, hook_options(h, block).name());
    }

    // The runs: fp32, each hook, and fp32 on the sampler's next seed (other batches of the same text).
    std::vector<std::pair<std::string, uint64_t>> runs{{"ddp", o.seed}};
    for (const auto& h : hooks) runs.emplace_back("ddp-" + h, o.seed);
    runs.emplace_back("ddp", o.seed + 1);
    nlohmann::json out = nlohmann::json::array();
    for (const auto& [sync, data] : runs) {
      RunOptions r = o;
      r.trainer.sync = sync;
      print0("\n== --sync {}{}", sync, data != o.seed ? ", other batches (sampler seed + 1)" : "");
      DistributedSampler sampler(window_count(corpus.train, o.context), o.batch, data, pg.rank(), pg.world_size());
      const auto curve = train(pg, r, corpus, sampler);
      out.push_back({{"sync", sync},
                     {"other_data", data != o.seed},
                     {"train", curve.at("train")},
                     {"val", curve.at("val")},
                     {"final_train_loss", final_loss(losses_of(curve.at("train")))},
                     {"final_val_loss", curve.at("val").back().at(1).get<double>()}});
    }
    // The verdict is on the validation loss: every run is measured on the same held-out text, so the difference is
    // the models' alone. The training loss of other batches differs by the batches' own noise as well (a mean over
    // a tenth of the steps moves by about its spread / sqrt(steps / 10)), which may come out near zero by chance.
    const double ref = out[0]["final_train_loss"], other = out.back()["final_train_loss"];
    const double ref_val = out[0]["final_val_loss"], other_val = out.back()["final_val_loss"];
    print0(
        "\nafter {} steps: training loss (mean of the last tenth) and validation loss; fp32 on other batches "
        "{:.4f} / {:.4f}, |difference| {:.4f} / {:.4f}:",
        o.steps, other, other_val, std::abs(other - ref), std::abs(other_val - ref_val));
    for (size_t i = 0; i < out.size(); ++i) {
      const double f = out[i]["final_train_loss"], v = out[i]["final_val_loss"];
      const bool within = std::abs(v - ref_val) <= std::abs(other_val - ref_val);
      print0("  {:<10}{:<14} {:.4f} / {:.4f}, |difference to fp32| {:.4f} / {:.4f}{}",
             out[i]["sync"].get<std::string>(), out[i]["other_data"].get<bool>() ? " (other data)" : "", f, v,
             std::abs(f - ref), std::abs(v - ref_val),
             i == 0 || i + 1 == out.size() ? ""
             : within                      ? " (validation: within the other-data difference)"
                                           : " (validation: OUTSIDE the other-data difference)");
    }
    if (pg.rank() == 0 && !cli.common().json.empty()) {
      Results results("ext08a");
      results.meta["runs"] = out;
      results.meta["config"] = o.config();
      results.meta["hooks"] = hooks;
      results.meta["block"] = block;
      results.write_json(cli.common().json, o.command);
    }
    pg.barrier();
    print0("PASS extension 08a: every hook checked, {} runs of {} steps", out.size(), o.steps);
    pg.shutdown();
    return 0;
  });
}
