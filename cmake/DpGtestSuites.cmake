# Run after a GoogleTest executable is built (dp_add_gtest's POST_BUILD step): lists its tests and writes
# the ctest file that registers them, each ctest test one process:
#   - a typed suite: one test per type, "Suite.*<Type>" (the contracts: each implementation its own test);
#   - the other suites ("Suite.*", "Prefix/Suite.*" for a parameterized one): those with the same labels run
#     together, a few at a time, as one test named by its gtest filter ("Cli.*:Sizes.*:CountOf.*"), at most
#     MAX_NAME characters, so `ctest -R Sizes` still finds it and the name is the command that reruns it.
# Loading LibTorch costs ~0.5 s of CPU a process: one process per test (~500) was a third of the suite's wall
# time, and one per suite still spent ~60 processes on suites that finish in milliseconds (test_cli's six
# suites: 4.3 s one by one, 1.8 s as one). A failing test's output names each failing gtest test.
# Inputs (-D): CONFIG, a file that sets EXE, OUT, WORKDIR, TIMEOUT, PER_TEST, LABELS and RULES.
include(${CONFIG})
set(MAX_NAME 72)  # characters: the longest typed suite's name, so ctest's columns do not widen
execute_process(COMMAND ${EXE} --gtest_list_tests OUTPUT_VARIABLE listing RESULT_VARIABLE rc ERROR_VARIABLE err)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${EXE} --gtest_list_tests failed (${rc}): ${err}")
endif()
string(REPLACE ";" "," listing "${listing}")
string(REPLACE "\n" ";" lines "${listing}")
set(script "")

function(labels_of name out)  # LABELS plus those of the RULES whose regex matches the suite's name
  set(labels "${LABELS}")
  foreach(rule IN LISTS RULES)
    string(FIND "${rule}" "=" eq REVERSE)
    string(SUBSTRING "${rule}" 0 ${eq} regex)
    math(EXPR after "${eq} + 1")
    string(SUBSTRING "${rule}" ${after} -1 label)
    if(name MATCHES "${regex}")
      list(APPEND labels ${label})
    endif()
  endforeach()
  set(${out} "${labels}" PARENT_SCOPE)
endfunction()

macro(add_one name filter count labels)
  math(EXPR timeout "${TIMEOUT} + ${PER_TEST} * ${count}")
  string(APPEND script "add_test([=[${name}]=] [=[${EXE}]=] [=[--gtest_filter=${filter}]=])\n")
  string(APPEND script "set_tests_properties([=[${name}]=] PROPERTIES TIMEOUT ${timeout} LABELS [=[${labels}]=] "
                       "WORKING_DIRECTORY [=[${WORKDIR}]=])\n")
endmacro()

# Pass 1: the suites in listing order. Typed ones are registered at once; the others are kept by label set
# (the set joined with '|', its MD5 naming the group's variables).
set(keys "")
set(name "")
macro(flush)
  if(NOT name STREQUAL "")
    labels_of("${name}" labels)
    if(typed)
      add_one("${name}" "${filter}" ${count} "${labels}")
    else()
      string(REPLACE ";" "|" key "${labels}")
      string(MD5 id "${key}")
      if(NOT DEFINED group_${id})
        list(APPEND keys ${id})
        set(labels_${id} "${labels}")
        set(group_${id} "")
      endif()
      list(APPEND group_${id} "${filter}=${count}")
    endif()
  endif()
endmacro()
foreach(line IN LISTS lines)
  if(line MATCHES "^([^ #][^ ]*)\\.( +# TypeParam = (.*))?$")
    set(next_raw "${CMAKE_MATCH_1}")  # before flush(): its MATCHES overwrite CMAKE_MATCH_<n>
    set(next_type "${CMAKE_MATCH_3}")
    flush()
    set(filter "${next_raw}.*")
    set(count 0)
    if(next_type STREQUAL "")
      set(typed FALSE)
      set(name "${filter}")
    else()
      set(typed TRUE)
      string(REGEX REPLACE "/[0-9]+$" "" base "${next_raw}")
      set(name "${base}.*<${next_type}>")
    endif()
  elseif(line MATCHES "^  [^ ]")
    math(EXPR count "${count} + 1")
  endif()
endforeach()
flush()

# Pass 2: each label set's suites, in listing order, joined while the name stays within MAX_NAME.
foreach(id IN LISTS keys)
  set(chunk "")
  set(total 0)
  foreach(entry IN LISTS group_${id})
    string(REGEX MATCH "^(.*)=([0-9]+)$" _ "${entry}")
    set(f "${CMAKE_MATCH_1}")
    set(n "${CMAKE_MATCH_2}")
    string(LENGTH "${chunk}:${f}" len)
    if(NOT chunk STREQUAL "" AND len GREATER MAX_NAME)
      add_one("${chunk}" "${chunk}" ${total} "${labels_${id}}")
      set(chunk "")
      set(total 0)
    endif()
    if(chunk STREQUAL "")
      set(chunk "${f}")
    else()
      string(APPEND chunk ":${f}")
    endif()
    math(EXPR total "${total} + ${n}")
  endforeach()
  add_one("${chunk}" "${chunk}" ${total} "${labels_${id}}")
endforeach()
file(WRITE ${OUT} "${script}")
