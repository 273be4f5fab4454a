# Stage 06: ShardedOptimizer (ZeRO-1) and its checkpoints, ranks as threads.
dp_add_gtest(test_stage06
  SOURCES ${CMAKE_CURRENT_SOURCE_DIR}/test_stage06.cpp
  LINK stage06_lib dp_test_support
  LABELS "stage06;dist"
  TIMEOUT 240)
