// The main() of every LibTorch test program (dp_add_gtest): GoogleTest's own, except that it ends through
// dp::leave_process() (common/dist/runtime.hpp), as the programs' dp::run_main() does: the output flushed, then
// _exit(). Returning from main() would run the destructors of LibTorch's globals, 0.1-0.3 s of CPU per
// process, and the suite starts some 120 test processes. DP_FULL_EXIT=1 (for a leak checker) returns instead.
#include "common/dist/runtime.hpp"

#include <gtest/gtest.h>

int main(int argc, char** argv) {
  testing::InitGoogleTest(&argc, argv);
  return dp::leave_process(RUN_ALL_TESTS());
}
