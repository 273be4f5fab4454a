// Stage 09's training loop: generations of ranks, each a process group of its own.
#include "stages/09_elastic/elastic_loop.hpp"

#include "common/base/errors.hpp"
#include "common/base/format.hpp"
#include "common/base/hash.hpp"
#include "common/base/log.hpp"
#include "common/base/timeline.hpp"
#include "common/contract/strategy.hpp"
#include "common/measure/results.hpp"  // machine_description
#include "common/model/params.hpp"     // parameter_hash
#include "common/model/transformer.hpp"
#include "common/state/checkpoint_file.hpp"  // broadcast_text
#include "stages/05_bucketed/bucketed_ddp.hpp"
#include "stages/08_train_lm/lm_checkpoint.hpp"
#include "stages/08_train_lm/trainer.hpp"

#include <fmt/format.h>

#include <fstream>
#include <memory>
#include <numeric>
#include <optional>

namespace dp {

using json = nlohmann::json;

void validate_elastic_options(const ElasticOptions& o) {
  if (o.run.trainer.sync == "hsdp")
    throw UsageError(
        "--sync hsdp: an elastic run loses and gains single ranks, and HSDP's mesh needs whole nodes of equal size: "
        "a lost rank would break its node's shard group. Train it with ext10a_train_lm --sync hsdp and resume from "
        "its checkpoint at another world size instead (or use --sync ddp here)");
  if (o.run.trainer.sync != "ddp")
    throw UsageError(fmt::format(
        "--sync {}: elastic training needs every rank to hold the whole model and optimizer state, and with {} a "
        "dead rank's shard dies with it. Use --sync ddp here; keep a replica of every shard (HSDP: shard within a "
        "group, replicate across groups) or a buddy copy on another rank; or train with stage 08 and resume from "
        "its last checkpoint",
        o.run.trainer.sync, o.run.trainer.sync == "zero1" ? "ZeRO-1" : "FSDP"));
  if (o.min_ranks > o.max_ranks)
    throw UsageError(fmt::format("--min-ranks {} is above the {} ranks started; use 1 .. {}", o.min_ranks, o.max_ranks,
                                 o.max_ranks));
  // The global batch is fixed: every membership from min to max ranks must split it into equal micro-batches.
  int64_t need = o.run.accumulate;
  for (int n = o.min_ranks; n <= o.max_ranks; ++n) need = std::lcm(need, int64_t{n} * o.run.accumulate);
  if (o.run.batch % need != 0)
    throw UsageError(
        fmt::format("--batch {} does not split evenly over every membership from {} to {} ranks (x "
                    "--accumulate {}); use a multiple of {}",
                    o.run.batch, o.min_ranks, o.max_ranks, o.run.accumulate, need));
}

namespace {

// [heal]
// Everyone takes the source's state: its step count, its curve, every parameter and its AdamW moments.
// Nothing changes here until every broadcast has arrived: a failure halfway leaves each rank its own
// state. Returns the bytes sent (4P for the parameters, 8P more for the moments once AdamW has stepped).
int64_t heal(ProcessGroup& pg, int source, Strategy& s, int64_t& done, json& curve) {
  FullState st = s.full_state();  // copies: the source's state; on the others only the shapes matter
  auto step = torch::tensor({done}, torch::kInt64);
  pg.broadcast(step, source);
  json c = json::parse(broadcast_text(pg, curve.dump(), source));
  int64_t bytes = 0;
  for (size_t i = 0; i < st.params.size(); ++i) {
    torch::Tensor& p = st.params[i].second;
    pg.broadcast(p, source);
    st.optimizer[i] = broadcast_param_state(pg, source, st.optimizer[i], p);
    bytes += p.nbytes();
    for (const auto& [name, t] : st.optimizer[i].tensors) bytes += t.nbytes();
  }
  s.load_full_state(st);
  done = step.item<int64_t>();
  curve = std::move(c);
  return bytes;
}
// [heal]

// Every member already holds the state (survivors of one generation, or newcomers that all loaded the
// checkpoint): nothing is sent. One all-gather checks it: the step and a hash of every parameter and moment.
void check_same_state(ProcessGroup& pg, Strategy& s, int64_t done) {
  const FullState st = s.full_state_view();  // DDP: the live tensors, hashed in place
  uint64_t h = kFnv1a64Basis;
  for (size_t i = 0; i < st.params.size(); ++i) {
    std::vector<torch::Tensor> ts{st.params[i].second};
    for (const auto& [name, t] : st.optimizer[i].tensors) ts.push_back(t);
    for (const auto& t : ts) h = fnv1a64(t.contiguous().data_ptr(), t.nbytes(), h);
  }
  const auto all = pg.all_gather(std::vector<double>{double(done), double(h >> 32), double(h & 0xffffffffu)});
  for (const auto& v : all)
    if (v != all[0])
      throw CheckFailed(
          fmt::format("the members of a generation that needs no heal differ: step {} here, {} on "
                      "rank 0, or the state's hashes disagree",
                      done, int64_t(all[0][0])));
}

// [step]
// One optimizer step of the global batch; this rank's share of it in K micro-batches. The loss and a
// hash of the parameters going into the step are gathered before the optimizer steps: a rank whose
// collectives all succeeded has all it needs to step, and a rank that saw one fail steps nothing.
double elastic_step(ProcessGroup& pg, Strategy& s, TransformerLM& model, const std::vector<Batch>& micro, double lr,
                    int64_t step) {
  const double K = static_cast<double>(micro.size());
  s.zero_grad();
  double loss = 0;
  for (size_t k = 0; k < micro.size(); ++k) {
    s.set_requires_gradient_sync(k + 1 == micro.size());
    torch::Tensor l = lm_loss(model->forward(micro[k].first), micro[k].second);
    (l / K).backward();
    loss += l.item<double>();
    s.after_backward();  // the gradient all-reduce: throws when a peer died or hung past --timeout
  }
  const uint64_t h = parameter_hash(*model);
  const auto all = pg.all_gather(std::vector<double>{loss / K, double(h >> 32), double(h & 0xffffffffu)});
  double mean = 0;
  for (const auto& v : all) {
    if (v[1] != all[0][1] || v[2] != all[0][2])
      throw CheckFailed(fmt::format("the replicas differ going into step {}: parameter hashes disagree", step + 1));
    mean += v[0];  // equal shares, so the plain mean is the global batch's
  }
  set_learning_rate(s, lr);
  s.step();
  return mean / static_cast<double>(all.size());
}
// [step]

// What a process carries from one generation to the next.
struct Carried {
  int64_t done = 0;                // optimizer steps its state has taken
  std::optional<FullState> state;  // its state between generations (none: the model as built)
  bool has_state = false;          // false: a newcomer, not healed yet
  json curve = {{"train", json::array()}, {"events", json::array()}};
  int64_t redone = 0;                 // steps trained before a fallback that the checkpoint did not hold
  std::string why = "start";          // why the next generation forms
  double failed_at = -1;              // when the failure happened (step 5 below says how it knows); -1: none
  double seen_s = -1;                 // from the failure to this process seeing it
  double last_seen = wall_seconds();  // when it last saw a failure (at first: when it started)
};

// The generation's line, its event in the curve and its spans in the timeline.
void record(const Quorum& q, Carried& c, double t0, double t_quorum, double t_group, double t_healed, int64_t healed) {
  std::string ids;
  for (const auto& m : q.members) ids += (ids.empty() ? "" : " ") + m.id;
  c.curve["events"].push_back({{"round", q.round},
                               {"step", c.done},
                               {"ranks", q.size()},
                               {"members", ids},
                               {"why", c.why},
                               {"quorum_s", t_quorum - t0},
                               {"group_s", t_group - t_quorum},
                               {"heal_s", t_healed - t_group},
                               {"heal_bytes", healed}});
  if (c.seen_s >= 0) c.curve["events"].back()["seen_s"] = c.seen_s;
  if (q.source < 0) c.curve["events"].back()["redone"] = c.redone;
  const std::string from = q.source < 0 ? std::string("the checkpoint") : q.members[q.source].id;
  timeline::span(fmt::format("round {}", q.round), t0, t_quorum, {{"members", ids}, {"why", c.why}});
  timeline::span("new group", t_quorum, t_group, {{"ranks", q.size()}, {"rank", q.rank}});
  timeline::span(healed > 0 ? "heal" : "state check", t_group, t_healed, {{"from", from}, {"bytes", healed}});
  print0("generation {}: {} ({}) at step {}, {}; round {:.3f} s, group {:.3f} s, state {} ({:.2f} MB) {:.3f} s",
         q.round, count_of(q.size(), "rank"), ids, c.done, c.why, t_quorum - t0, t_group - t_quorum,
         healed > 0 ? "from " + from : "held by every member, checked", healed / 1e6, t_healed - t_group);
}

// [checkpoint]
// Level 0 under level 1: the state on disk, for when nobody alive holds it. Written atomically (rank 0
// writes PATH.tmp, then renames it over PATH: a kill mid-write leaves the checkpoint before); the store then
// says this run has one, so that a fallback never loads a file of some other run.
void save_checkpoint(const RunOptions& r, ProcessGroup& pg, Strategy& s, Membership& members, const Carried& c) {
  save_lm_checkpoint(r.checkpoint, pg, {c.done, r.config(), c.curve}, s.full_state_view());
  if (pg.rank() == 0) members.set_count("saved", c.done);
  print0("checkpoint step {} written to {}", c.done, r.checkpoint);
}

// Nobody alive holds the state (every holder died; the round closed with newcomers only): every member
// loads this run's last checkpoint, and the steps trained since are done again. Before the first one is
// written, step 0 is that checkpoint: the model as built from --seed, which a newcomer still holds.
void fall_back(const RunOptions& r, TransformerLM& model, Membership& members, Carried& c) {
  if (r.checkpoint.empty())
    throw CannotContinue(
        "nobody holds the model any more (every process that held it died) and this run has no checkpoint to go "
        "back to; run it with --checkpoint FILE --checkpoint-every N, and a run that loses every holder goes on "
        "from the last checkpoint");
  int64_t step = 0;
  std::string from = "no checkpoint written yet, step 0 (the model as --seed builds it)";
  if (members.count("saved") >= 0) {
    auto [meta, state] = load_lm_checkpoint(r.checkpoint, r.config(), unique_named_parameters(*model, true));
    step = meta.step;
    from = fmt::format("{} loaded, step {}", r.checkpoint, meta.step);
    c.curve = meta.curve;
    c.state = std::move(state);
  }
  c.redone = std::max<int64_t>(0, members.count("done") - step);
  c.why = fmt::format("nobody held the state: {}, {} to redo", from, count_of(c.redone, "step"));
  c.done = step;
  c.has_state = true;
}
// [checkpoint]

// The run's end, in its last generation: the checkpoint, the curve, the merged timeline.
void finish(const ElasticOptions& o, ProcessGroup& pg, Strategy& s, Membership& members, Carried& c) {
  const RunOptions& r = o.run;
  if (!r.checkpoint.empty()) save_checkpoint(r, pg, s, members, c);
  if (pg.rank() == 0 && !r.curve.empty()) {
    c.curve["config"] = r.config();
    c.curve["command"] = r.command;
    c.curve["machine"] = machine_description();
    std::ofstream(r.curve) << c.curve.dump(1) << "\n";
  }
  pg.barrier();  // every member has recorded its last step
  if (!o.trace.empty() && pg.rank() == 0) {
    timeline::merge(o.trace);
    print0("timeline of every process written to {}", o.trace);
  }
}

// Steps until the run is over (true) or somebody waits to join (false); throws when a collective fails.
bool train_generation(const ElasticOptions& o, const TextCorpus& corpus, ProcessGroup& pg, Strategy& s,
                      TransformerLM& model, const Quorum& q, Membership& members, Faults& faults, Carried& c) {
  const RunOptions& r = o.run;
  DistributedSampler sampler(window_count(corpus.train, r.context), r.batch, r.seed, q.rank, q.size());
  const int64_t every = std::max<int64_t>(1, r.steps / 10);
  while (c.done < r.steps) {
    // A step boundary. Does anyone wait to join? Rank 0 looks; one broadcast tells everyone.
    auto grow = torch::tensor({int64_t{q.rank == 0 && members.someone_waiting(q.round + 1)}}, torch::kInt64);
    pg.broadcast(grow, 0);
    if (grow.item<int64_t>() != 0) return false;
    faults.at(fmt::format("step{}", c.done));
    const double t_step = wall_seconds();
    const auto micro = micro_batches(corpus, sampler.local_ids(c.done), r.accumulate, r.context, torch::kCPU);
    const double loss = elastic_step(pg, s, model, micro, lr_at(r, c.done), c.done);
    const double now = wall_seconds();
    c.curve["train"].push_back({c.done++, loss, now - t_step});
    if (q.rank == 0) members.set_count("done", c.done);  // what a fallback to the checkpoint would redo
    timeline::span(fmt::format("step {}", c.done), t_step, now, {{"generation", q.round}, {"ranks", q.size()}});
    if (c.failed_at >= 0) {  // the first step after a failure: how long the survivors were without one
      c.curve["events"].back()["recovery_s"] = now - c.failed_at;
      c.curve["events"].back()["redone_step_s"] = now - t_step;
      print0("step {} done {:.3f} s after the failure (the step itself {:.3f} s)", c.done, now - c.failed_at,
             now - t_step);
      c.failed_at = c.seen_s = -1;
    }
    if (c.done % every == 0 || c.done == r.steps)
      print0("step {:5d}/{}  loss {:.4f}  on {}", c.done, r.steps, loss, count_of(q.size(), "rank"));
    if (r.checkpoint_every > 0 && c.done % r.checkpoint_every == 0 && c.done < r.steps)
      save_checkpoint(r, pg, s, members, c);  // (the last step's is finish()'s)
  }
  return true;
}

}  // namespace

// [loop]
json train_elastic(const ElasticOptions& o, const TextCorpus& corpus, Membership& members, Faults& faults,
                   const DistOptions& dist, bool with_state) {
  const RunOptions& r = o.run;
  TransformerLM model = make_byte_lm(r.preset, r.context, r.seed, torch::kCPU);  // the same on every process
  const auto adamw = lm_adamw(r.trainer);
  const MakeOptimizer make_optimizer = [adamw](std::vector<torch::Tensor> p) {
    return std::unique_ptr<torch::optim::Optimizer>(std::make_unique<torch::optim::AdamW>(std::move(p), adamw));
  };
  Carried c;
  c.has_state = with_state;
  if (r.resume && with_state) {
    auto [meta, state] = load_lm_checkpoint(r.checkpoint, r.config(), unique_named_parameters(*model, true));
    c.done = meta.step;
    c.curve = meta.curve;
    c.state = std::move(state);
    c.curve["events"] = json::array();
    members.set_count("saved", c.done);  // a fallback may load it: it is this run's
  }
  set_checkpoint_write_hook([&] { faults.at(fmt::format("checkpoint{}", c.done)); });
  int64_t generation = -1, joined = 0;       // the last round this process was in; rounds joined
  std::optional<Membership::Claim> claimed;  // a survivor's slot in the next round
  const auto on_claim = [&] {
    if (joined > 0) faults.at(fmt::format("quorum{}", joined));
  };
  const auto claim_next = [&] {
    return members.claim(generation + 1, c.has_state ? c.done : -1, generation, on_claim);
  };
  for (;;) {
    // 1. A round: who is in the next generation, and whose state everyone takes.
    const double t0 = wall_seconds();
    if (!claimed) claimed = claim_next();
    const Quorum q = members.join(*claimed, on_claim);
    ++joined;
    generation = q.round;
    claimed.reset();
    const double t_quorum = wall_seconds();
    if (q.source < 0) fall_back(r, model, members, c);  // throws CannotContinue without a checkpoint
    std::unique_ptr<ProcessGroup> pg;
    std::unique_ptr<Strategy> s;
    try {
      // 2. Its process group, in a store prefix of its own, and stage 05's DDP over it.
      pg = ProcessGroup::init_with_store_or_give_up(members.generation_store(q.round), q.rank, q.size(), dist,
                                                    std::chrono::seconds(5));
      s = bucketed_ddp_strategy(r.trainer.bucket_mb)(*pg, model.ptr(), make_optimizer);
      if (c.state) s->load_full_state(*c.state);
      const double t_group = wall_seconds();
      // 3. The heal: everyone takes the source's state; unless every member holds it already (survivors of one
      // generation, at one step; or newcomers that all loaded the checkpoint).
      bool newcomers = false;
      bool same = true;
      for (const auto& m : q.members) {
        newcomers = newcomers || m.fresh();
        same = same && !m.fresh() && m.step == q.members.front().step;
      }
      if (q.rank == q.source && newcomers) faults.at("heal");
      int64_t healed = 0;
      if (q.source < 0 || same)
        check_same_state(*pg, *s, c.done);
      else
        healed = heal(*pg, q.source, *s, c.done, c.curve);
      c.has_state = true;
      record(q, c, t0, t_quorum, t_group, wall_seconds(), healed);
      if (q.size() < o.min_ranks) {
        std::string saved;
        if (!r.checkpoint.empty()) {
          save_checkpoint(r, *pg, *s, members, c);
          saved = fmt::format("; checkpoint of step {} written to {} (stage 08 or 09 resumes it with --resume)", c.done,
                              r.checkpoint);
        }
        if (!o.trace.empty() && pg->rank() == 0) timeline::merge(o.trace);
        throw BelowMinRanks(fmt::format("{} left, fewer than --min-ranks {}: the run stops at step {}{}",
                                        count_of(q.size(), "rank"), o.min_ranks, c.done, saved));
      }
      // 4. Train until the run is over or somebody waits to join.
      if (train_generation(o, corpus, *pg, *s, model, q, members, faults, c)) {
        members.close_run(c.done);  // a replacement still on its way is told, rather than left waiting
        faults.at("over");          // (tests/elastic.py's "late": survivors that pause here meet a late replacement)
        finish(o, *pg, *s, members, c);
        pg->shutdown();
        return c.curve;
      }
      c.why = "a newcomer waits";
      c.state = s->full_state();  // leave this generation for the next round, state in hand
    } catch (const UsageError&) {
      throw;
    } catch (const CheckFailed&) {
      throw;
    } catch (const BelowMinRanks&) {
      throw;
    } catch (const CannotContinue&) {
      throw;
    } catch (const std::exception& e) {
      // 5. A collective failed: a peer died, or hung past --timeout. What this rank committed is `done` steps.
      timeline::instant("failure seen", wall_seconds(), {{"what", first_line(e.what())}});
      if (c.failed_at < 0) {  // an injected fault fired since the last failure seen, else now (not "since this
        c.failed_at = faults.last_fired() > c.last_seen ? faults.last_fired() : wall_seconds();  // process's last
        c.seen_s = wall_seconds() - c.failed_at;  // step": a slower member may stamp that after the fault fired)
      }
      c.last_seen = wall_seconds();
      c.why = fmt::format("after a failure at step {} (seen {:.3f} s after it: {})", c.done + 1, c.seen_s,
                          first_line(e.what()));
      print_rank(
          "generation {} failed {}: {}", q.round,
          c.has_state ? fmt::format("at step {}", c.done + 1) : std::string("before this newcomer had the state"),
          first_line(e.what()));
      // Into the next round at once: its settle time runs from the first survivor's claim, and this
      // rank's state copy and teardown below, however slow, cannot make it miss the round.
      claimed = claim_next();
      faults.at("leaving");  // (tests/elastic.py's "slow": a survivor that pauses here is still in the round)
      if (s && c.has_state) c.state = s->full_state();
    }
    // Closing this rank's connections makes a peer still waiting on one of them fail at once.
    s.reset();
    pg.reset();
  }
}
// [loop]

}  // namespace dp
