// Shared GoogleTest helpers: the call must throw dp::UsageError (std::logic_error) whose message contains
// every needle.
#pragma once

#include "common/dist/runtime.hpp"

#include <gtest/gtest.h>

#include <stdexcept>
#include <string>
#include <vector>

namespace dp::testing {

template <typename Fn>
void expect_usage_error(Fn fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected dp::UsageError";
  } catch (const UsageError& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

template <typename Fn>
void expect_logic_error(Fn fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected std::logic_error";
  } catch (const std::logic_error& e) {
    for (const auto& n : needles) EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << e.what();
  }
}

}  // namespace dp::testing
