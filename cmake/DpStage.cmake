# dp_program_optimization(<target>)
#   A program's own sources (its main, its command line, its tables) compile at -Og in Release: what it
#   times runs in the libraries (dp_common, the stages' libraries, LibTorch, Gloo), which stay at -O3. -Og
#   compiles a LibTorch-heavy main.cpp about a third faster with GCC (stage 08's: 10.1 s at -O3, 7.5 s at
#   -O1, 7.0 s at -Og; Clang reads -Og as -O1) and still defines __OPTIMIZE__, so the shared precompiled
#   header stays valid (-O0 would not: the header parsed again, 19 s for stage 05's main with GCC). The
#   tests do the same (tests/CMakeLists.txt).
function(dp_program_optimization target)
  if(CMAKE_BUILD_TYPE STREQUAL "Release")
    target_compile_options(${target} PRIVATE -Og)
  endif()
endfunction()

# dp_stage_sources(<dir-name> <out-var> <files>...)
#   The stage's source files; in a workbook build (DP_WORKBOOK) a file the learner has a copy of,
#   workbook/stages/<dir-name>/<file>, is taken from there.
function(dp_stage_sources dir out)
  set(files)
  foreach(f ${ARGN})
    if(DP_WORKBOOK AND EXISTS ${PROJECT_SOURCE_DIR}/workbook/stages/${dir}/${f})
      list(APPEND files ${PROJECT_SOURCE_DIR}/workbook/stages/${dir}/${f})
    else()
      list(APPEND files ${CMAKE_CURRENT_SOURCE_DIR}/${f})
    endif()
  endforeach()
  set(${out} ${files} PARENT_SCOPE)
endfunction()

# dp_add_stage(<dir-name> SOURCES <main.cpp> [LIB_SOURCES <files>...])
#   Adds executable <dir-name> (e.g. 01_allreduce -> stage01_allreduce) linked to dp_common.
#   LIB_SOURCES (optional) become a small library stageNN_lib so the tests can link the stage's classes.
#   Every test registered with dp_add_test(... LABELS stageNN) can then be selected with `ctest -L stageNN`.
function(dp_add_stage dir)
  cmake_parse_arguments(S "" "" "SOURCES;LIB_SOURCES" ${ARGN})
  string(SUBSTRING "${dir}" 0 2 num)
  string(SUBSTRING "${dir}" 3 -1 name)
  set(exe "stage${num}_${name}")
  dp_stage_sources(${dir} S_SOURCES ${S_SOURCES})
  dp_stage_sources(${dir} S_LIB_SOURCES ${S_LIB_SOURCES})
  if(S_LIB_SOURCES)
    add_library(stage${num}_lib STATIC ${S_LIB_SOURCES})
    target_link_libraries(stage${num}_lib PUBLIC dp_common)
    target_precompile_headers(stage${num}_lib REUSE_FROM dp_common)
    set_target_properties(stage${num}_lib PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
    set(extra stage${num}_lib)
  endif()
  add_executable(${exe} ${S_SOURCES})
  target_link_libraries(${exe} PRIVATE dp_common ${extra})
  target_precompile_headers(${exe} REUSE_FROM dp_common)
  dp_program_optimization(${exe})
  set_target_properties(${exe} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
endfunction()

# dp_add_extension(<dir-name> [SOURCES <main.cpp>] [LIB_SOURCES <files>...] LINK <libs>...)
#   An extension of a stage (extensions/NNx_name). LIB_SOURCES become its own library, extNNx_name_lib, linked to
#   exactly what it builds on (LINK: its stage's library, the stages' before it, an extension's of the same stage
#   with an earlier letter); SOURCES become the program bin/extNNx_name, linked to that library and LINK.
#   extNN_lib names every library of stage NN's extensions at once, for the tests that check them together.
function(dp_add_extension dir)
  cmake_parse_arguments(E "" "" "SOURCES;LIB_SOURCES;LINK" ${ARGN})
  string(SUBSTRING "${dir}" 0 2 num)
  if(NOT TARGET ext${num}_lib)
    add_library(ext${num}_lib INTERFACE)
  endif()
  set(own)
  if(E_LIB_SOURCES)
    set(own ext${dir}_lib)
    add_library(${own} STATIC ${E_LIB_SOURCES})
    target_link_libraries(${own} PUBLIC dp_common ${E_LINK})
    target_precompile_headers(${own} REUSE_FROM dp_common)
    target_link_libraries(ext${num}_lib INTERFACE ${own})
  endif()
  if(E_SOURCES)
    add_executable(ext${dir} ${E_SOURCES})
    target_link_libraries(ext${dir} PRIVATE dp_common ${own} ${E_LINK})
    target_precompile_headers(ext${dir} REUSE_FROM dp_common)
    dp_program_optimization(ext${dir})
    set_target_properties(ext${dir} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
  endif()
endfunction()

# dp_add_test(<name> COMMAND <cmd...> LABELS <labels...> [TIMEOUT s] [COST s] [RUN_SERIAL])
#   A ctest test with a mandatory timeout: a hang is a failure, never a wait. COST: the seconds it took
#   on 2 cores, so that `ctest -j` starts the longest tests first instead of leaving one of them alone at
#   the end (ctest uses it until a run of its own has recorded times).
function(dp_add_test name)
  cmake_parse_arguments(T "RUN_SERIAL" "TIMEOUT;COST" "COMMAND;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 120)
  endif()
  add_test(NAME ${name} COMMAND ${T_COMMAND})
  set_tests_properties(${name} PROPERTIES TIMEOUT ${T_TIMEOUT} LABELS "${T_LABELS}")
  if(T_COST)
    set_tests_properties(${name} PROPERTIES COST ${T_COST})
  endif()
  if(T_RUN_SERIAL)
    set_tests_properties(${name} PROPERTIES RUN_SERIAL TRUE)
  endif()
endfunction()

# dp_add_gtest(<target> SOURCES <files> LINK <libs> LABELS <labels> [LABELS_BY_NAME <regex>=<label>...]
#              [TIMEOUT s])
#   One GoogleTest executable, its tests registered with ctest by cmake/DpGtestSuites.cmake: a typed suite
#   one ctest test per type ("Suite.*<Type>"), the other suites with the same labels a few to a ctest test
#   named by its gtest filter ("Cli.*:Sizes.*"), each one process, with the labels and a timeout of TIMEOUT
#   plus 30 s per test. LABELS_BY_NAME adds <label> to the suites whose name ("Suite.*") matches <regex>.
#   Run one test alone with the executable: build/tests/<target> --gtest_filter='Suite.Test'.
function(dp_add_gtest target)
  cmake_parse_arguments(G "" "TIMEOUT" "SOURCES;LINK;LABELS;LABELS_BY_NAME" ${ARGN})
  if(NOT G_TIMEOUT)
    set(G_TIMEOUT 120)
  endif()
  add_executable(${target} ${G_SOURCES})
  target_link_libraries(${target} PRIVATE ${G_LINK} dp_gtest_main)  # tests/support/gtest_main.cpp
  # A program's test files compile as one unit, four files at most: each unit pays ~3 s of CPU to load the
  # precompiled LibTorch header whatever its size (test_ext06's three files: 12 s as one unit, 31 s one by one).
  set_target_properties(${target} PROPERTIES UNITY_BUILD ON UNITY_BUILD_BATCH_SIZE 4)
  if(TARGET dp_common)
    target_precompile_headers(${target} REUSE_FROM dp_common)
  endif()
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  set(config ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites_config.cmake)
  set(out ${CMAKE_CURRENT_BINARY_DIR}/${target}_suites.cmake)
  file(WRITE ${config} "set(EXE [=[${PROJECT_BINARY_DIR}/tests/${target}]=])\nset(OUT [=[${out}]=])\n"
                       "set(WORKDIR [=[${CMAKE_CURRENT_BINARY_DIR}]=])\nset(TIMEOUT ${G_TIMEOUT})\nset(PER_TEST 30)\n"
                       "set(LABELS [=[${G_LABELS}]=])\nset(RULES [=[${G_LABELS_BY_NAME}]=])\n")
  # Relinked (and so listed again) when the registering script changes, not only when the tests do.
  set_property(TARGET ${target} APPEND PROPERTY LINK_DEPENDS ${PROJECT_SOURCE_DIR}/cmake/DpGtestSuites.cmake)
  add_custom_command(TARGET ${target} POST_BUILD
    COMMAND ${CMAKE_COMMAND} -D CONFIG=${config} -P ${PROJECT_SOURCE_DIR}/cmake/DpGtestSuites.cmake
    COMMENT "Listing the test suites of ${target}" VERBATIM)
  set(include_file ${CMAKE_CURRENT_BINARY_DIR}/${target}_include.cmake)
  file(WRITE ${include_file} "if(EXISTS [=[${out}]=])\n  include([=[${out}]=])\nelse()\n"
                             "  add_test(${target}_NOT_BUILT ${target}_NOT_BUILT)\nendif()\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${include_file})
endfunction()
