// The DDP variants of stages 02-05 (and extension 05b) as types, for the typed test suites (GoogleTest TYPED_TEST, the
// c10d style: one test body, every implementation). Each type has
//   Sync                  the class under test,
//   make(pg, model)       a std::unique_ptr<Sync> wrapping `model` (usable as a dp::MakeGradSync).
// A new DDP variant gets every contract test by one type here and one entry in the suites' type lists.
//
// These types live in the global namespace so that GoogleTest prints them plainly: ctest names the
// tests "GradSyncContract.Cs336ToyWorld4<Bucketed<1600>>", and tests/stages/CMakeLists.txt labels
// each one with its stage from that name.
#pragma once

#include "common/dist/dist.hpp"
#include "extensions/05b_arrival_order/arrival_order_ddp.hpp"
#include "stages/02_naive_ddp/naive_ddp.hpp"
#include "stages/03_flat/flat_ddp.hpp"
#include "stages/04_overlap/overlap_ddp.hpp"
#include "stages/05_bucketed/bucketed_ddp.hpp"

#include "common/base/libtorch.hpp"

#include <cstdint>
#include <memory>

/// A variant built from the process group and the model alone.
template <typename S>
struct ConstructedFrom {
  using Sync = S;
  static std::unique_ptr<Sync> make(dp::ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) {
    return std::make_unique<Sync>(pg, std::move(m));
  }
};

struct Naive : ConstructedFrom<dp::NaiveDdp> {};      ///< stage 02
struct Flat : ConstructedFrom<dp::FlatDdp> {};        ///< stage 03
struct Overlap : ConstructedFrom<dp::OverlapDdp> {};  ///< stage 04

/// Stage 05 at a bucket cap of kCapBytes bytes (1 MB = 10^6 B; C++17 takes no double template argument):
/// Bucketed<1600> is the 0.0016 MB of CS336's tests.
template <int kCapBytes>
struct Bucketed {
  using Sync = dp::BucketedDdp;
  static constexpr double kCapMb = kCapBytes / 1e6;
  static std::unique_ptr<Sync> make(dp::ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) {
    return std::make_unique<Sync>(pg, std::move(m), kCapMb);
  }
};

/// Extension 05b: stage 05 with buckets rebuilt in gradient-arrival order after the first step.
template <int kCapBytes>
struct BucketedArrival {
  using Sync = dp::ArrivalOrderDdp;
  static constexpr double kCapMb = kCapBytes / 1e6;
  static std::unique_ptr<Sync> make(dp::ProcessGroup& pg, std::shared_ptr<torch::nn::Module> m) {
    return std::make_unique<Sync>(pg, std::move(m), kCapMb);
  }
};
