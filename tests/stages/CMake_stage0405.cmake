# Stages 04 (overlapped DDP) and 05 (bucketed DDP). Included from tests/stages/CMakeLists.txt.
# Each TEST() becomes its own ctest test; the CS336 scenarios loop 5 times inside the test.
dp_add_gtest(test_stage04 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_stage04.cpp
  LINK stage04_lib dp_test_support LABELS "stage04;dist" TIMEOUT 180)
dp_add_gtest(test_stage05 SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_stage05.cpp
  LINK stage05_lib dp_test_support LABELS "stage05;dist" TIMEOUT 240)
