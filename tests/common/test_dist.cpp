// Collectives against closed forms, for 1 to 4 ranks (threads as ranks over an in-process store).
#include "common/base/c10d_compat.hpp"
#include "common/dist/dist.hpp"
#include "common/dist/launch_env.hpp"
#include "common/dist/runtime.hpp"
#include "common/harness/ddp_check.hpp"
#include "common/harness/optimizer_check.hpp"
#include "common/measure/timing.hpp"
#include "tests/support/ranks.hpp"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

#include <atomic>
#include <cmath>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

using dp::ProcessGroup;
using dp::testing::run_ranks;

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllReduceSumsRanks) {
  const int W = GetParam();
  run_ranks(W, [&](ProcessGroup& pg) {
    auto t = torch::full({1000}, static_cast<float>(pg.rank()));
    pg.all_reduce(t);
    EXPECT_TRUE(torch::all(t == W * (W - 1) / 2.0f).item<bool>()) << "rank " << pg.rank();
  });
}

TEST_P(Collectives, AllReduceIntegersExact) {
  const int W = GetParam();
  run_ranks(W, [&](ProcessGroup& pg) {
    auto t = torch::arange(10, torch::kInt64) * (pg.rank() + 1);
    pg.all_reduce(t);
    EXPECT_TRUE(torch::equal(t, torch::arange(10, torch::kInt64) * (W * (W + 1) / 2)));
  });
}

TEST_P(Collectives, BroadcastFromLastRank) {
  const int W = GetParam();
  run_ranks(W, [&](ProcessGroup& pg) {
    const int root = W - 1;  // a non-zero root whenever W > 1
    auto t = torch::full({3, 4}, static_cast<float>(pg.rank() * 10 + 1));
    pg.broadcast(t, root);
    EXPECT_TRUE(torch::all(t == root * 10 + 1.0f).item<bool>());
  });
}

TEST_P(Collectives, AllGatherKeepsRankOrder) {
  const int W = GetParam();
  run_ranks(W, [&](ProcessGroup& pg) {
    auto parts = pg.all_gather(torch::full({2}, static_cast<double>(pg.rank() * 7)));
    ASSERT_EQ(static_cast<int>(parts.size()), W);
    for (int r = 0; r < W; ++r) EXPECT_EQ(parts[r][0].item<double>(), r * 7.0);
    auto values = pg.all_gather(0.5 + pg.rank());
    for (int r = 0; r < W; ++r) EXPECT_EQ(values[r], 0.5 + r);
    auto vecs = pg.all_gather(std::vector<double>{1.0 * pg.rank(), -1.0 * pg.rank()});
    for (int r = 0; r < W; ++r) EXPECT_EQ(vecs[r], (std::vector<double>{1.0 * r, -1.0 * r}));
  });
}

// Every rank gets the lowest flagged rank (the one a refusal names), or -1 when none is flagged.
TEST_P(Collectives, FirstRankWithAFlagIsTheSameOnEveryRank) {
  const int W = GetParam();
  run_ranks(W, [&](ProcessGroup& pg) {
    EXPECT_EQ(pg.first_rank_with(false), -1);
    EXPECT_EQ(pg.first_rank_with(pg.rank() == W - 1), W - 1);  // one rank flagged: every rank names it
    EXPECT_EQ(pg.first_rank_with(pg.rank() >= W / 2), W / 2);  // several: the lowest
  });
}

TEST_P(Collectives, AsyncHandlesCompleteInAnyWaitOrder) {
  const int W = GetParam();
  run_ranks(W, [&](ProcessGroup& pg) {
    std::vector<torch::Tensor> ts;
    std::vector<dp::Work> works;
    for (int i = 0; i < 8; ++i) ts.push_back(torch::full({100 + i}, static_cast<float>(i + pg.rank())));
    for (auto& t : ts) works.push_back(pg.all_reduce_async(t));
    for (int i = 7; i >= 0; --i) works[i].wait();  // wait in reverse order: still correct
    for (int i = 0; i < 8; ++i) {
      EXPECT_TRUE(works[i].completed());
      EXPECT_TRUE(torch::all(ts[i] == static_cast<float>(W * i + W * (W - 1) / 2)).item<bool>());
    }
  });
}

// What the DDP check relies on when a strategy leaves a collective running (common/harness/ddp_check.cpp): while
// tracking, unfinished_async() names it, and wait_async() returns only once it has completed, its sum in place.
// Rank 0 joins 500 ms late, so on the other ranks the all-reduce is still running when they ask; a wait_async()
// that forgot to wait would leave their tensors unsummed.
TEST_P(Collectives, WaitAsyncWaitsForTheTrackedCollectives) {
  const int W = GetParam();
  run_ranks(W, [&](ProcessGroup& pg) {
    pg.track_async(true);
    if (pg.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(500));
    auto t = torch::full({1000}, static_cast<float>(pg.rank()));
    pg.all_reduce_async(t, "late");
    if (pg.rank() > 0) {
      const auto running = pg.unfinished_async();
      ASSERT_EQ(running.size(), 1u) << "rank " << pg.rank();
      EXPECT_NE(running.front().find("(late)"), std::string::npos) << running.front();
    }
    pg.wait_async();
    EXPECT_TRUE(pg.unfinished_async().empty()) << "rank " << pg.rank();
    EXPECT_TRUE(torch::all(t == W * (W - 1) / 2.0f).item<bool>()) << "rank " << pg.rank() << ": not summed yet";
    pg.track_async(false);
  });
}

// Point to point, as stage 01's ring uses it: each rank sends to the next and receives from the one before,
// into a view. A second wait on either handle returns at once (c10d's Gloo receive would block until its
// timeout, as if the peer were dead).
TEST_P(Collectives, SendAndReceiveAroundARing) {
  const int W = GetParam();
  if (W == 1) return;  // a ring of sends needs two ranks (stage 01's ring returns at once for one)
  run_ranks(
      W,
      [&](ProcessGroup& pg) {
        const int r = pg.rank();
        auto mine = torch::full({5}, r + 1.0f), buf = torch::zeros({2, 5});
        auto into = buf[1];
        auto recv = pg.recv_async(into, (r + W - 1) % W, 7);
        auto send = pg.send_async(mine, (r + 1) % W, 7);
        recv.wait();
        send.wait();
        recv.wait();
        send.wait();
        EXPECT_TRUE(recv.completed() && send.completed());
        EXPECT_TRUE(torch::all(buf[1] == static_cast<float>((r + W - 1) % W + 1)).item<bool>()) << buf;
        EXPECT_TRUE(torch::all(buf[0] == 0.0f).item<bool>()) << buf;
      },
      std::chrono::milliseconds(20000));
}

INSTANTIATE_TEST_SUITE_P(Ranks, Collectives, ::testing::Values(1, 2, 3, 4));

TEST(Barrier, NobodyPassesBeforeEveryoneArrives) {
  std::atomic<int> arrived{0};
  std::atomic<bool> early{false};
  run_ranks(3, [&](ProcessGroup& pg) {
    if (pg.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(300));
    arrived++;
    pg.barrier();
    if (arrived.load() != 3) early = true;
  });
  EXPECT_FALSE(early.load());
}

// Rank 1 never joins the collective that rank 0 runs: rank 0 must fail after the collective timeout,
// with an error naming the collective.
static void expect_missing_peer_error(const std::string& name, const std::function<void(ProcessGroup&)>& collective) {
  auto t0 = std::chrono::steady_clock::now();
  try {
    run_ranks(
        2,
        [&](ProcessGroup& pg) {
          if (pg.rank() == 0) {
            collective(pg);
          } else {
            std::this_thread::sleep_for(std::chrono::seconds(4));
            throw std::runtime_error("rank 1 gave up");
          }
        },
        std::chrono::milliseconds(1500));
    FAIL() << "expected an error";
  } catch (const std::exception& e) {
    std::string msg = e.what();
    EXPECT_NE(msg.find(name), std::string::npos) << msg;  // names the collective
  }
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(15));
}

TEST(Timeout, MissingPeerIsAnErrorNotAHang) {
  expect_missing_peer_error("all_reduce", [](ProcessGroup& pg) {
    auto t = torch::ones({4});
    pg.all_reduce(t);
  });
}

// A group whose other member never comes, behind a store that would wait an hour for it: forming it gives up
// after the timeout and the grace, with an error, whatever the store does (stage 09's survivors then meet in the
// next round). Without the give-up a store that waits for good makes the caller wait for good.
// Rank 0 of 2 forms a group over `store` alone, with a timeout of 1 s and a grace of 0.5 s: expects the give-up's
// error and returns how long it took, in seconds.
double seconds_to_give_up(c10::intrusive_ptr<c10d::Store> store) {
  dp::DistOptions opts;
  opts.timeout = std::chrono::milliseconds(1000);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_ANY_THROW(dp::ProcessGroup::init_with_store_or_give_up(store, 0, 2, opts, std::chrono::milliseconds(500)));
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

TEST(Timeout, GroupThatCannotFormIsGivenUp) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  store->setTimeout(std::chrono::hours(1));
  const double took = seconds_to_give_up(store);
  EXPECT_LT(took, 1.5 + 1.0) << "the limit is the timeout (1 s) + the grace (0.5 s)";
}

// A store that never answers a read of a key nobody wrote, whatever its timeout says: what a process stuck in
// Gloo's group formation saw (2 of 40 stage 09 chaos runs, before the give-up). Gloo's own timeout cannot end
// that wait; only the give-up does. The mutant, plain init_with_store, waits here for good (ctest's timeout).
class StoreThatNeverAnswers : public dp::compat::CloneableStore {
 public:
  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    std::lock_guard<std::mutex> g(m_);
    kv_[key] = value;
  }
  std::vector<uint8_t> compareSet(const std::string& key, const std::vector<uint8_t>&,
                                  const std::vector<uint8_t>& desired) override {
    set(key, desired);
    return desired;
  }
  std::vector<uint8_t> get(const std::string& key) override {
    wait({key});
    std::lock_guard<std::mutex> g(m_);
    return kv_.at(key);
  }
  int64_t add(const std::string&, int64_t value) override { return value; }
  bool deleteKey(const std::string&) override { return false; }
  bool check(const std::vector<std::string>& keys) override {
    std::lock_guard<std::mutex> g(m_);
    for (const auto& k : keys)
      if (!kv_.count(k)) return false;
    return true;
  }
  int64_t getNumKeys() override { return 0; }
  void wait(const std::vector<std::string>& keys) override {
    while (!check(keys)) std::this_thread::sleep_for(std::chrono::milliseconds(10));  // no timeout, ever
  }
  void wait(const std::vector<std::string>& keys, const std::chrono::milliseconds&) override { wait(keys); }
  dp::compat::StorePtr clone_store() override { return c10::make_intrusive<StoreThatNeverAnswers>(); }

 private:
  std::mutex m_;
  std::map<std::string, std::vector<uint8_t>> kv_;
};

TEST(Timeout, GroupStuckInAStoreIsGivenUp) {
  const double took = seconds_to_give_up(c10::make_intrusive<StoreThatNeverAnswers>());
  EXPECT_LT(took, 1.5 + 1.0) << "the limit is the timeout (1 s) + the grace (0.5 s)";
  EXPECT_GT(took, 1.5 - 0.2) << "given up before the timeout and the grace were out";
}

// A missing peer in an all-to-all, which Gloo runs as point-to-point sends and receives (common/dist/dist.cpp), is
// an error too, not a hang.
TEST(Timeout, MissingPeerInAllToAllIsAnErrorNotAHang) {
  expect_missing_peer_error("all_to_all", [](ProcessGroup& pg) {
    auto in = torch::ones({8}), out = torch::zeros({8});
    pg.all_to_all_async(out, in).wait();
  });
}

// The check against AdamW (common/harness/optimizer_check.hpp) with a design that issues a collective every step and is
// wrong on rank 1 only: every rank must return FAIL, none stop stepping early and leave the other waiting in
// that collective (which the 20 s collective timeout would turn into an exception here).
TEST(OptimizerCheck, AMismatchOnOneRankFailsEveryRankWithoutAHang) {
  run_ranks(2, [](ProcessGroup& pg) {
    auto make = [](ProcessGroup& g, const std::vector<torch::Tensor>& params, const torch::optim::AdamWOptions& o) {
      auto opt = std::make_shared<torch::optim::AdamW>(params, o);
      auto step = [opt, &g, params] {
        opt->step();
        auto t = torch::ones({1});
        g.all_reduce(t);  // as a design's communication
        torch::NoGradGuard no_grad;
        if (g.rank() == 1) params.front().add_(1.0);
      };
      return dp::ShardedSteps{[opt] { opt->zero_grad(); }, step, "AdamW, rank 1 off by one", false};
    };
    EXPECT_FALSE(dp::check_against_adamw(pg, "a design wrong on rank 1", make)) << "rank " << pg.rank();
  });
}

// Two all-to-alls in flight between the same ranks, waited in reverse order, each get their own data.
TEST(AllToAll, TwoInFlightKeepTheirData) {
  run_ranks(3, [](ProcessGroup& pg) {
    const int W = pg.world_size(), r = pg.rank();
    std::vector<torch::Tensor> in, out;
    std::vector<dp::Work> works;
    for (int k = 0; k < 2; ++k) {  // chunk j of rank r in exchange k holds 100k + 10r + j
      in.push_back(torch::arange(W, torch::kFloat32).repeat_interleave(4) + 100 * k + 10 * r);
      out.push_back(torch::zeros({4 * W}));
      works.push_back(pg.all_to_all_async(out[k], in[k]));
    }
    for (int k = 1; k >= 0; --k) works[k].wait();
    for (int k = 0; k < 2; ++k)
      for (int i = 0; i < W; ++i)  // piece i came from rank i: its chunk r
        EXPECT_TRUE(torch::all(out[k].narrow(0, 4 * i, 4) == static_cast<float>(100 * k + 10 * i + r)).item<bool>())
            << "exchange " << k << ", piece from rank " << i;
  });
}

// All-to-alls finish in the order they were issued, and a handle says it is complete as soon as its data
// is there, whether or not anybody waited (FSDP's timeline asks whether a gather was done before compute
// reached its unit). A large one first, small ones behind it: when the last is done, every earlier one
// reports done. Gloo's own point-to-point handles report completion only once waited on.
TEST(AllToAll, FinishInIssueOrder) {
  run_ranks(2, [](ProcessGroup& pg) {
    std::vector<torch::Tensor> in, out;
    std::vector<dp::Work> works;
    for (int k = 0; k < 6; ++k) {
      const int64_t n = (k == 0 ? 4'000'000 : 64) * pg.world_size();  // 16 MB, then 256 B per chunk
      in.push_back(torch::full({n}, static_cast<float>(k)));
      out.push_back(torch::zeros({n}));
      works.push_back(pg.all_to_all_async(out[k], in[k]));
    }
    works.back().wait();
    for (int k = 0; k < 5; ++k) EXPECT_TRUE(works[k].completed()) << "exchange " << k << " was overtaken";
    for (auto& w : works) w.wait();
    for (int k = 0; k < 6; ++k) EXPECT_TRUE(torch::all(out[k] == static_cast<float>(k)).item<bool>()) << k;
  });
}

TEST(Backends, NcclOnCpuBuildIsAUsageError) {
#ifndef DP_WITH_NCCL
  EXPECT_FALSE(dp::backend_available("nccl"));
  auto store = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THROW(ProcessGroup::init_with_store(store, 0, 1, {"nccl", std::chrono::milliseconds(1000), ""}),
               dp::UsageError);
#endif
  EXPECT_TRUE(dp::backend_available("gloo"));
  auto store2 = c10::make_intrusive<c10d::HashStore>();
  EXPECT_THROW(ProcessGroup::init_with_store(store2, 0, 1, {"mpi", std::chrono::milliseconds(1000), ""}),
               dp::UsageError);
}

// NCCL needs a CUDA build and one GPU per rank on the node; each refusal is a UsageError (exit 2).
TEST(Backends, NcclNeedsOneGpuPerLocalRank) {
  EXPECT_NO_THROW(dp::check_backend("gloo", 0));
  EXPECT_THROW(dp::check_backend("mpi", 8), dp::UsageError);
#ifndef DP_WITH_NCCL
  EXPECT_THROW(dp::check_backend("nccl", 8), dp::UsageError);  // not in this build, GPUs or not
#else
  EXPECT_THROW(dp::check_backend("nccl", 0), dp::UsageError);  // no GPU
  EXPECT_NO_THROW(dp::check_backend("nccl", 1));               // one process, one GPU
  for (auto [k, v] : {std::pair{"RANK", "0"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "4"}})
    setenv(k, v, 1);
  EXPECT_THROW(dp::check_backend("nccl", 2), dp::UsageError);  // 4 ranks on this node, 2 GPUs
  EXPECT_NO_THROW(dp::check_backend("nccl", 4));
  for (auto v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) unsetenv(v);
  try {
    dp::check_backend("nccl", 0);
  } catch (const dp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no GPU"), std::string::npos) << e.what();
  }
#endif
}

// --device: Gloo ranks may compute on a GPU (several sharing one); NCCL takes CUDA tensors only. A device
// this build or machine cannot give is a UsageError (exit 2) before any rendezvous.
TEST(Backends, DeviceMustSuitBackendBuildAndMachine) {
  EXPECT_NO_THROW(dp::check_backend("gloo", 0, "cpu"));
  EXPECT_THROW(dp::check_backend("gloo", 8, "tpu"), dp::UsageError);
  EXPECT_THROW(dp::check_backend("gloo", 0, "cuda"), dp::UsageError);  // no GPU (or no CUDA build)
#ifndef DP_WITH_CUDA
  EXPECT_FALSE(dp::cuda_build());
  try {
    dp::check_backend("gloo", 8, "cuda");  // GPUs or not: this build has no CUDA
    ADD_FAILURE() << "a CPU build accepted --device cuda";
  } catch (const dp::UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("no CUDA"), std::string::npos) << e.what();
  }
#else
  EXPECT_TRUE(dp::cuda_build());
  EXPECT_THROW(dp::check_backend("nccl", 1, "cpu"), dp::UsageError);  // NCCL moves CUDA tensors only
  for (auto [k, v] : {std::pair{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}})
    setenv(k, v, 1);
  EXPECT_NO_THROW(dp::check_backend("gloo", 1, "cuda"));               // two Gloo ranks share the one GPU
  EXPECT_THROW(dp::check_backend("nccl", 1, "cuda"), dp::UsageError);  // NCCL: one GPU per rank
  for (auto v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"}) unsetenv(v);
#endif
}

// Gloo ranks computing on a GPU (--device cuda; several ranks share one): Gloo's own all-reduce, broadcast
// and all-gather take CUDA tensors through host memory; our all-to-all and our send and receive (Gloo's point to
// point moves host memory only) stage them through host copies. Every result lands on the GPU, equal to the
// closed form.
TEST(GlooOnCuda, CollectivesMoveCudaTensors) {
  if (!dp::testing::gpu_visible())
    GTEST_SKIP() << "needs a CUDA build and a GPU (scripts/machines/gpu_check.sh runs it)";
  run_ranks(
      3,
      [](ProcessGroup& pg) {
        const int W = pg.world_size(), r = pg.rank();
        ASSERT_TRUE(pg.device().is_cuda());
        auto opts = torch::TensorOptions().device(pg.device());
        auto sum = torch::full({1000}, r + 1.0f, opts);
        pg.all_reduce(sum);
        EXPECT_TRUE(sum.is_cuda());
        EXPECT_TRUE(torch::all(sum == W * (W + 1) / 2.0f).item<bool>());
        auto b = torch::full({10}, static_cast<float>(r), opts);
        pg.broadcast(b, 1);
        EXPECT_TRUE(torch::all(b == 1.0f).item<bool>());
        auto parts = pg.all_gather(torch::full({3}, static_cast<float>(r), opts));
        for (int i = 0; i < W; ++i) EXPECT_TRUE(torch::all(parts[i] == static_cast<float>(i)).item<bool>());
        auto in = torch::arange(W, opts.dtype(torch::kFloat32)).repeat_interleave(4) + 10 * r;  // chunk j: j + 10r
        auto out = torch::zeros({4 * W}, opts);
        pg.all_to_all_async(out, in).wait();
        EXPECT_TRUE(out.is_cuda());
        for (int i = 0; i < W; ++i)  // piece i came from rank i: its chunk r
          EXPECT_TRUE(torch::all(out.narrow(0, 4 * i, 4) == static_cast<float>(r + 10 * i)).item<bool>()) << i;
        // Gloo's send and receive move host memory only: a CUDA tensor goes out from a host copy and comes in
        // through a host buffer that wait() copies to the GPU (a device pointer handed to Gloo's socket
        // aborted the process: "writev: Bad address"). A ring pass: each rank sends r + 1 and receives from
        // the rank before it, into a view (the ring all-reduce of stage 01 receives into views); as
        // Collectives.SendAndReceiveAroundARing does on the CPU.
        auto mine = torch::full({5}, r + 1.0f, opts), buf = torch::zeros({2, 5}, opts);
        auto into = buf[1];
        auto recv = pg.recv_async(into, (r + W - 1) % W, 7);
        auto send = pg.send_async(mine, (r + 1) % W, 7);
        recv.wait();
        send.wait();
        recv.wait();  // a second wait returns at once and copies nothing again
        EXPECT_TRUE(into.is_cuda());
        EXPECT_TRUE(torch::all(buf[1] == static_cast<float>((r + W - 1) % W + 1)).item<bool>()) << buf;
        EXPECT_TRUE(torch::all(buf[0] == 0.0f).item<bool>()) << buf;
      },
      std::chrono::milliseconds(60000), "cuda");
}

// One verdict for every rank (dp::worst_over_ranks()): each rank gets the margin of the rank whose ratio is
// worst, its own derivation kept. Rank 1 alone is over its bound, so every rank must fail.
TEST(WorstOverRanks, EveryRankGetsTheWorstRatio) {
  run_ranks(3, [](ProcessGroup& pg) {
    const int r = pg.rank();
    const dp::Margin mine(r == 1 ? 3e-7 : 1e-8 * (r + 1), r == 2 ? 2e-7 : 1e-7, "rank " + std::to_string(r));
    const dp::Margin worst = dp::worst_over_ranks(pg, mine);
    EXPECT_DOUBLE_EQ(worst.diff, 3e-7);
    EXPECT_DOUBLE_EQ(worst.bound, 1e-7);
    EXPECT_FALSE(worst.ok());
    EXPECT_EQ(worst.derivation, "rank " + std::to_string(r));
  });
}

// completed() promises the data is in the caller's tensor. A CUDA receive over Gloo lands in a host buffer
// that wait() copies to the GPU, so before wait() it must not say completed, and after it it must. The
// sender is done and the barrier passed, and 300 ms more let Gloo's own receive finish. (Gloo's receive
// handle completes only inside its wait(), so a handle forwarding it passes too: on the H200 the mutant did.
// The staged handle answers from its own copy, so this holds whatever a backend's handle does.)
TEST(GlooOnCuda, StagedReceiveCompletesOnlyWhenItsDataIsInPlace) {
  if (!dp::testing::gpu_visible())
    GTEST_SKIP() << "needs a CUDA build and a GPU (scripts/machines/gpu_check.sh runs it)";
  run_ranks(
      2,
      [](ProcessGroup& pg) {
        auto opts = torch::TensorOptions().device(pg.device());
        if (pg.rank() == 0) {
          auto mine = torch::full({1000}, 7.0f, opts);
          pg.send_async(mine, 1, 3).wait();
          pg.barrier();
          return;
        }
        auto into = torch::zeros({1000}, opts);
        auto recv = pg.recv_async(into, 0, 3);
        pg.barrier();
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
        const bool said_completed = recv.completed();
        const bool in_place = torch::all(into == 7.0f).item<bool>();
        EXPECT_TRUE(!said_completed || in_place) << "completed() before the data reached the GPU tensor";
        recv.wait();
        EXPECT_TRUE(recv.completed());
        EXPECT_TRUE(torch::all(into == 7.0f).item<bool>());
      },
      std::chrono::milliseconds(60000), "cuda");
}

TEST(LaunchEnv, ReadsTorchrunVariablesAndRejectsBadOnes) {
  setenv("RANK", "3", 1);
  setenv("WORLD_SIZE", "4", 1);
  setenv("LOCAL_RANK", "1", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("MASTER_ADDR", "10.1.2.3", 1);
  setenv("MASTER_PORT", "29999", 1);
  auto env = dp::LaunchEnv::from_environment();
  EXPECT_TRUE(env.launched);
  EXPECT_EQ(env.rank, 3);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.master_addr, "10.1.2.3");
  EXPECT_EQ(env.master_port, 29999);
  EXPECT_EQ(env.elastic_min, 1);  // ddp_launch's elastic variables, unset: their defaults
  EXPECT_EQ(env.restart, 0);
  setenv("DP_ELASTIC_STORE", "/tmp/store", 1);
  setenv("DP_ELASTIC_MIN", "2", 1);
  setenv("DP_RESTART", "1", 1);
  env = dp::LaunchEnv::from_environment();
  EXPECT_EQ(env.elastic_store, "/tmp/store");
  EXPECT_EQ(env.elastic_min, 2);
  EXPECT_EQ(env.restart, 1);
  setenv("DP_RESTART", "one", 1);  // atoi would have read 0: the first process, not a replacement
  EXPECT_THROW(dp::LaunchEnv::from_environment(), dp::UsageError);
  setenv("DP_ELASTIC_MIN", "0", 1);
  setenv("DP_RESTART", "1", 1);
  EXPECT_THROW(dp::LaunchEnv::from_environment(), dp::UsageError);
  for (auto v : {"DP_ELASTIC_STORE", "DP_ELASTIC_MIN", "DP_RESTART"}) unsetenv(v);
  setenv("RANK", "4", 1);
  EXPECT_THROW(dp::LaunchEnv::from_environment(), dp::UsageError);
  setenv("RANK", "x", 1);
  EXPECT_THROW(dp::LaunchEnv::from_environment(), dp::UsageError);
  for (auto v : {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}) unsetenv(v);
  env = dp::LaunchEnv::from_environment();
  EXPECT_FALSE(env.launched);
  EXPECT_EQ(env.world_size, 1);
}

// ddp_launch --nproc 4 --net 10gbit --net-nodes 2 --net-uplink 1gbit: rank 3 is local rank 1 of 2 on simulated
// node 1, and all 4 ranks share this machine: threads and memory are divided by 4, not by LOCAL_WORLD_SIZE.
TEST(LaunchEnv, SimulatedNodesShareThisMachine) {
  for (auto [k, v] : {std::pair{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"}})
    setenv(k, v, 1);
  auto env = dp::LaunchEnv::from_environment();
  EXPECT_EQ(env.net_nodes, 0);
  EXPECT_EQ(env.ranks_on_this_machine(), 2);  // two real machines of 2 ranks each
  EXPECT_FALSE(env.single_node());
  setenv("DP_NET_NODES", "2", 1);
  setenv("DP_NET_UPLINK", "1gbit", 1);
  setenv("DP_NET_UPLINK_BIT_S", "1000000000", 1);
  env = dp::LaunchEnv::from_environment();
  EXPECT_EQ(env.net_nodes, 2);
  EXPECT_EQ(env.net_uplink, "1gbit");
  EXPECT_EQ(env.net_uplink_bit_s, 1e9);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.ranks_on_this_machine(), 4);
  EXPECT_TRUE(env.single_node());
  setenv("DP_NET_NODES", "two", 1);
  EXPECT_THROW(dp::LaunchEnv::from_environment(), dp::UsageError);
  for (auto v :
       {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "DP_NET_NODES", "DP_NET_UPLINK", "DP_NET_UPLINK_BIT_S"})
    unsetenv(v);
}

// Stage 05's overhead model (common/measure/timing.hpp). The cap it predicts minimises t(n_b) = s / (n_b w) + n_b o:
// with o = 1 ms, w = 1 GB/s and s = 100 MB, sqrt(s w o) = 10 MB, i.e. 10 buckets, and 9 or 11 take longer.
TEST(CommModel, BestCapMinimisesTheModelledTime) {
  const dp::CommModel m{1e-3, 1e9};
  const double s = 1e8;
  EXPECT_NEAR(m.best_bucket_cap_mb(s), 10.0, 1e-9);
  auto t = [&](double n_b) { return s / (n_b * m.w) + n_b * m.o; };
  EXPECT_LT(t(10), t(9));
  EXPECT_LT(t(10), t(11));
}

// Measured over two ranks (threads): a call costs something, the bandwidth is finite, and every rank gets
// the same model (the slowest rank's medians).
TEST(CommModel, MeasuredTheSameOnEveryRank) {
  std::vector<dp::CommModel> got(2);
  run_ranks(2, [&](ProcessGroup& pg) { got[pg.rank()] = dp::measure_comm_model(pg); });
  for (const auto& m : got) {
    EXPECT_GT(m.o, 0);
    EXPECT_GT(m.w, 0);
    EXPECT_TRUE(std::isfinite(m.w));
  }
  EXPECT_EQ(got[0].o, got[1].o);
  EXPECT_EQ(got[0].w, got[1].w);
}
