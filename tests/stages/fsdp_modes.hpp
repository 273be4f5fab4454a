// FSDP's four modes as types, for typed test suites: fp32 or bf16 compute x resharding after forward or
// keeping the gathered weights until backward (stage 07's suite and extension 07a's).
#pragma once

#include "common/base/format.hpp"
#include "stages/07_fsdp/fsdp.hpp"

#include <gtest/gtest.h>

#include <string>

namespace dp::testing {

template <bool Bf16, bool Reshard>
struct FsdpMode {
  static FsdpOptions options() {
    FsdpOptions f;
    f.compute_dtype = Bf16 ? torch::kBFloat16 : torch::kFloat32;
    f.reshard_after_forward = Reshard;
    return f;
  }
  static constexpr bool reshard = Reshard;
};
using FsdpModes =
    ::testing::Types<FsdpMode<false, true>, FsdpMode<false, false>, FsdpMode<true, true>, FsdpMode<true, false>>;
/// Names the typed tests "float32Reshard", "bfloat16Keep", ...
struct FsdpModeNames {
  template <typename T>
  static std::string GetName(int) {
    auto f = T::options();
    return dtype_name(f.compute_dtype) + (f.reshard_after_forward ? "Reshard" : "Keep");
  }
};

}  // namespace dp::testing
