# dp_add_stage(<dir-name> SOURCES <main.cpp> [LIB_SOURCES <files>...])
#   Adds executable <dir-name> (e.g. 01_allreduce -> stage01_allreduce) linked to dp_common.
#   LIB_SOURCES (optional) become a small library stageNN_lib so the tests can link the stage's classes.
#   Every test registered with dp_add_test(... LABELS stageNN) can then be selected with `ctest -L stageNN`.
function(dp_add_stage dir)
  cmake_parse_arguments(S "" "" "SOURCES;LIB_SOURCES" ${ARGN})
  string(SUBSTRING "${dir}" 0 2 num)
  string(SUBSTRING "${dir}" 3 -1 name)
  set(exe "stage${num}_${name}")
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
  set_target_properties(${exe} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/bin)
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
#   One GoogleTest executable; each TEST() becomes its own ctest test with the labels and timeout.
#   LABELS_BY_NAME adds <label> to the tests whose ctest name matches <regex> (a typed test's name ends
#   with its type: "Suite.Test<Type>").
function(dp_add_gtest target)
  cmake_parse_arguments(G "" "TIMEOUT" "SOURCES;LINK;LABELS;LABELS_BY_NAME" ${ARGN})
  if(NOT G_TIMEOUT)
    set(G_TIMEOUT 120)
  endif()
  add_executable(${target} ${G_SOURCES})
  target_link_libraries(${target} PRIVATE ${G_LINK} GTest::gtest_main)
  if(TARGET dp_common)
    target_precompile_headers(${target} REUSE_FROM dp_common)
  endif()
  set_target_properties(${target} PROPERTIES RUNTIME_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/tests)
  gtest_discover_tests(${target}
    PROPERTIES TIMEOUT ${G_TIMEOUT}
    TEST_LIST ${target}_TESTS
    DISCOVERY_TIMEOUT 60)
  # gtest_discover_tests splits list-valued PROPERTIES, so the labels are set by a script that ctest
  # runs after the discovered tests are defined.
  set(labels_script ${CMAKE_CURRENT_BINARY_DIR}/${target}_labels.cmake)
  set(script "foreach(t IN LISTS ${target}_TESTS)\n  set(labels \"${G_LABELS}\")\n")
  foreach(rule IN LISTS G_LABELS_BY_NAME)
    string(FIND "${rule}" "=" eq REVERSE)
    string(SUBSTRING "${rule}" 0 ${eq} regex)
    math(EXPR after "${eq} + 1")
    string(SUBSTRING "${rule}" ${after} -1 label)
    string(APPEND script "  if(t MATCHES [=[${regex}]=])\n    list(APPEND labels ${label})\n  endif()\n")
  endforeach()
  string(APPEND script "  set_tests_properties(\"\${t}\" PROPERTIES LABELS \"\${labels}\")\nendforeach()\n")
  file(WRITE ${labels_script} "${script}")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${labels_script})
endfunction()
