// Stage 08's parts on their own: the corpus split, the windows, the world-size-free sampler, and the
// checkpoint's refusals. (The training itself is tested end to end by tests/train_lm.py.)
#include "common/dist/runtime.hpp"
#include "stages/08_train_lm/corpus.hpp"
#include "stages/08_train_lm/lm_checkpoint.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>

namespace {

using namespace dp::testing;
using dp::DistributedSampler;

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("dp_test_train_lm_" + name)).string();
}

// 20 blocks of 4 KiB: block 19 (the 20th) is held out, the rest is training text, in order.
TEST(Corpus, EveryTwentiethBlockIsHeldOut) {
  const std::string path = temp_path("corpus.txt");
  std::string text;
  for (int b = 0; b < 20; ++b) text += std::string(4096, static_cast<char>('a' + b));
  std::ofstream(path, std::ios::binary) << text;
  const auto c = dp::load_corpus(path, 9, 99);  // needs 10 x 100 bytes of training text, 100 held out
  EXPECT_EQ(c.train.numel(), 19 * 4096);
  EXPECT_EQ(c.val.numel(), 4096);
  EXPECT_EQ(c.val[0].item<int64_t>(), 'a' + 19);
  EXPECT_EQ(c.train[18 * 4096].item<int64_t>(), 'a' + 18);
  EXPECT_THROW(dp::load_corpus(path, 999, 99), dp::UsageError);  // 1000 x 100 bytes: too little training text
  // One window of --context 4096 needs 4097 held-out bytes: refused here, not in the first validation.
  try {
    dp::load_corpus(path, 1, 4096);
    ADD_FAILURE() << "a held-out text shorter than one window was accepted";
  } catch (const dp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("4096 held out, too little for --batch 1 and --context 4096"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(dp::load_corpus(temp_path("missing"), 1, 1), dp::UsageError);
  std::remove(path.c_str());
}

// A text under 20 blocks of 4 KiB (a single small file) is cut into 20 blocks of n / 20 bytes: it too
// holds out its 20th block, rather than nothing (which no run could validate on).
TEST(Corpus, SmallTextHoldsOutItsTwentiethPart) {
  const std::string path = temp_path("small.txt");
  std::string text;
  for (int b = 0; b < 20; ++b) text += std::string(100, static_cast<char>('a' + b));
  std::ofstream(path, std::ios::binary) << text;
  const auto c = dp::load_corpus(path, 1, 63);
  EXPECT_EQ(c.train.numel(), 19 * 100);
  ASSERT_EQ(c.val.numel(), 100);
  EXPECT_EQ(c.val[0].item<int64_t>(), 'a' + 19);
  EXPECT_EQ(c.val[99].item<int64_t>(), 'a' + 19);
  std::remove(path.c_str());
}

// Window j is tokens [jT, jT + T + 1): inputs and the next tokens.
TEST(Corpus, WindowsAreInputsAndNextTokens) {
  auto tokens = torch::arange(0, 50, torch::kLong);
  EXPECT_EQ(dp::window_count(tokens, 8), 6);  // (50 - 1) / 8
  auto [x, y] = dp::windows(tokens, {0, 5}, 8);
  EXPECT_TRUE(torch::equal(x[1], torch::arange(40, 48, torch::kLong)));
  EXPECT_TRUE(torch::equal(y[1], torch::arange(41, 49, torch::kLong)));
}

// The contract the capstone's curves rest on: for every world size the ranks' shares of step s, in rank
// order, are the same G windows; shares are disjoint; an epoch visits every window at most once.
TEST(Sampler, SameGlobalBatchForEveryWorldSize) {
  const int64_t n = 103, G = 12;
  DistributedSampler one(n, G, 5, 0, 1);
  std::set<int64_t> epoch0;
  for (int64_t step = 0; step < 2 * one.steps_per_epoch() + 1; ++step) {
    const auto want = one.global_ids(step);
    ASSERT_EQ(static_cast<int64_t>(want.size()), G);
    if (step < one.steps_per_epoch()) {
      for (auto id : want) EXPECT_TRUE(epoch0.insert(id).second) << "window " << id << " twice in epoch 0";
    }
    for (int W : {2, 3, 4}) {
      std::vector<int64_t> joined;
      for (int r = 0; r < W; ++r) {
        DistributedSampler s(n, G, 5, r, W);
        const auto mine = s.local_ids(step);
        EXPECT_EQ(static_cast<int64_t>(mine.size()), G / W);
        joined.insert(joined.end(), mine.begin(), mine.end());
      }
      EXPECT_EQ(joined, want) << "step " << step << ", " << W << " ranks";
    }
  }
  EXPECT_NE(one.global_ids(0), one.global_ids(one.steps_per_epoch()));            // a new shuffle each epoch
  EXPECT_NE(DistributedSampler(n, G, 6, 0, 1).global_ids(0), one.global_ids(0));  // the seed matters
  EXPECT_THROW(DistributedSampler(n, 10, 5, 0, 4), dp::UsageError);               // 10 sequences over 4 ranks
  EXPECT_THROW(DistributedSampler(n, 104, 5, 0, 1), dp::UsageError);              // more than the corpus holds
}

// A checkpoint resumes only the run it was written by: another model, batch or data is refused by name;
// another world size or synchronization is fine. Tensors come back exactly.
TEST(LmCheckpoint, RoundTripAndRefusals) {
  run_ranks(1, [](dp::ProcessGroup& pg) {
    const std::string path = temp_path("lm.ckpt");
    dp::FullState s;
    s.params = {{"w", torch::randn({3, 2})}, {"b", torch::randn({4})}};
    for (const auto& [name, p] : s.params) {
      dp::ParamState st;
      st.present = true;
      st.step = 7;
      st.tensors = {{"exp_avg", torch::randn(p.sizes())}, {"exp_avg_sq", torch::rand(p.sizes())}};
      s.optimizer.push_back(st);
    }
    nlohmann::json cfg = {{"preset", "tiny"}, {"batch", 16},   {"world_size", 2},
                          {"accumulate", 1},  {"sync", "ddp"}, {"steps", 20}};
    dp::save_lm_checkpoint(path, pg, {20, cfg, {{"train", {{0, 5.5, 0.1}}}}}, s);
    auto other = cfg;
    // the same batch, split otherwise
    other["world_size"] = 1;
    other["accumulate"] = 2;
    other["sync"] = "fsdp";
    auto [meta, got] = dp::load_lm_checkpoint(path, other, s.params);
    EXPECT_EQ(meta.step, 20);
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(got.params[i].first, s.params[i].first);
      EXPECT_TRUE(torch::equal(got.params[i].second, s.params[i].second));
      EXPECT_EQ(got.optimizer[i].step, 7);
      EXPECT_TRUE(torch::equal(got.optimizer[i].tensors.at("exp_avg"), s.optimizer[i].tensors.at("exp_avg")));
      EXPECT_TRUE(torch::equal(got.optimizer[i].tensors.at("exp_avg_sq"), s.optimizer[i].tensors.at("exp_avg_sq")));
    }
    other["steps"] = 19;  // fewer steps than the checkpoint has done: nothing to resume to
    try {
      dp::load_lm_checkpoint(path, other, s.params);
      ADD_FAILURE() << "a checkpoint at step 20 was resumed with --steps 19";
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("is at step 20, past --steps 19"), std::string::npos) << e.what();
    }
    other["steps"] = 20;  // a finished run resumed again: accepted (it trains nothing)
    EXPECT_EQ(dp::load_lm_checkpoint(path, other, s.params).first.step, 20);
    other["batch"] = 32;
    try {
      dp::load_lm_checkpoint(path, other, s.params);
      ADD_FAILURE() << "a checkpoint of another batch size was accepted";
    } catch (const dp::UsageError& e) {
      EXPECT_NE(std::string(e.what()).find("batch = 16, this run has 32"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("only the number of ranks, --accumulate, --sync,"), std::string::npos)
          << e.what();
    }
    dp::FullState bigger = s;
    bigger.params[1].second = torch::zeros({5});
    EXPECT_THROW(dp::load_lm_checkpoint(path, cfg, bigger.params), dp::UsageError);  // another model shape
    std::filesystem::remove(path);
  });
}

}  // namespace
