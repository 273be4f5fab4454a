# Finds everything the project needs and records what it found for the summary.

option(DP_TORCH_PIP "Build against the pip torch 2.x in build-venv/torch2 (presets torch2 and cuda)" OFF)
option(DP_CUDA "Build with CUDA and NCCL (needs a CUDA LibTorch and the CUDA toolkit; preset cuda)" OFF)
set(DP_CUDA_MSG "")
set(DP_TORCH_ABI_MSG "as the compiler's default (Debian builds LibTorch with it)")
if(DP_TORCH_PIP)
  include(DpTorchPip)
else()
  # A LibTorch named by Torch_DIR (a zip from pytorch.org): its config looks its libraries up with PATHS,
  # which come after the system folders, and would take Debian's 1.13 libtorch.so where that is installed.
  if(Torch_DIR AND EXISTS "${Torch_DIR}/../../../lib/libtorch.so")
    get_filename_component(_dp_prefix "${Torch_DIR}/../../.." ABSOLUTE)
    set(TORCH_LIBRARY "${_dp_prefix}/lib/libtorch.so" CACHE FILEPATH "libtorch of Torch_DIR" FORCE)
    set(c10_LIBRARY "${_dp_prefix}/lib/libc10.so" CACHE FILEPATH "libc10 of Torch_DIR" FORCE)
  endif()
  find_package(Torch REQUIRED)
  if(Torch_VERSION VERSION_GREATER_EQUAL 2.0)
    set(CMAKE_CXX_STANDARD 20)  # LibTorch 2.x headers of recent releases refuse anything older
  endif()
  if(DP_CUDA AND NOT (TARGET torch_cuda OR "${TORCH_LIBRARIES}" MATCHES "torch_cuda"))
    message(FATAL_ERROR "DP_CUDA=ON needs a CUDA LibTorch; this one (${TORCH_INSTALL_PREFIX}) is CPU-only. "
                        "Use the cuda preset, which builds against the pip wheel: "
                        "bash scripts/install_torch2.sh && cmake --preset cuda")
  endif()
endif()
find_package(Threads REQUIRED)
find_package(CLI11 CONFIG QUIET)
find_package(nlohmann_json 3 REQUIRED)
find_package(fmt REQUIRED)
find_package(Doxygen QUIET)
if(DP_BUILD_TESTS)
  find_package(GTest REQUIRED)
  include(GoogleTest)
endif()

# CLI11 is header-only; Debian 12 ships its CMake config, older set-ups only the header.
if(NOT TARGET CLI11::CLI11)
  find_path(CLI11_INCLUDE_DIR CLI/CLI.hpp REQUIRED)
  add_library(CLI11::CLI11 INTERFACE IMPORTED)
  set_target_properties(CLI11::CLI11 PROPERTIES INTERFACE_INCLUDE_DIRECTORIES ${CLI11_INCLUDE_DIR})
endif()

# --- What this LibTorch can do --------------------------------------------------------------
# The c10d headers hide ProcessGroupGloo / ProcessGroupNCCL behind USE_C10D_GLOO / USE_C10D_NCCL,
# and Torch's CMake config does not define them, so we probe and define them ourselves.
set(DP_TORCH_VERSION "${Torch_VERSION}")
string(REGEX MATCH "^[0-9]+" DP_TORCH_VERSION_MAJOR "${Torch_VERSION}")
find_file(DP_GLOO_HEADER torch/csrc/distributed/c10d/ProcessGroupGloo.hpp PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
find_file(DP_NCCL_HEADER torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp PATHS ${TORCH_INCLUDE_DIRS} NO_DEFAULT_PATH)
find_path(DP_GLOO_INCLUDE gloo/config.h PATHS ${TORCH_INCLUDE_DIRS} /usr/include)

set(DP_HAVE_GLOO OFF)
if(DP_GLOO_HEADER AND DP_GLOO_INCLUDE)
  set(DP_HAVE_GLOO ON)
endif()

# CUDA LibTorch: its config defines the torch_cuda / c10_cuda targets (absent from Debian's CPU build).
set(DP_HAVE_CUDA OFF)
if(DP_CUDA AND (TARGET torch_cuda OR TARGET c10_cuda OR "${TORCH_LIBRARIES}" MATCHES "torch_cuda"))
  set(DP_HAVE_CUDA ON)
endif()
find_path(DP_NCCL_INCLUDE nccl.h HINTS $ENV{NCCL_HOME}/include ${CUDAToolkit_INCLUDE_DIRS} /usr/local/cuda/include)
set(DP_HAVE_NCCL OFF)
if(DP_HAVE_CUDA AND DP_NCCL_HEADER AND DP_NCCL_INCLUDE)
  set(DP_HAVE_NCCL ON)
endif()

# The one interface target every project target links: torch, c10d switches, and our include root.
add_library(dp_torch INTERFACE)
target_link_libraries(dp_torch INTERFACE ${TORCH_LIBRARIES} Threads::Threads)
target_include_directories(dp_torch INTERFACE ${PROJECT_SOURCE_DIR})
target_compile_options(dp_torch INTERFACE -Wall -Wextra -Wno-unused-parameter)
if(NOT TORCH_INSTALL_PREFIX STREQUAL "/usr" AND EXISTS "${TORCH_INSTALL_PREFIX}/include/fmt/core.h")
  # A wheel's or zip's include folder carries its own {fmt} (newer than Debian's), and it comes first on
  # the include path; use it header-only so nothing links against Debian's libfmt built from other headers.
  target_compile_definitions(dp_torch INTERFACE FMT_HEADER_ONLY=1)
endif()
if(DP_HAVE_GLOO)
  target_compile_definitions(dp_torch INTERFACE USE_C10D_GLOO)
endif()
if(DP_HAVE_CUDA)
  target_compile_definitions(dp_torch INTERFACE DP_WITH_CUDA)
endif()
if(DP_HAVE_NCCL)
  target_compile_definitions(dp_torch INTERFACE USE_C10D_NCCL DP_WITH_NCCL)
  target_include_directories(dp_torch INTERFACE ${DP_NCCL_INCLUDE})
endif()

function(dp_print_summary)
  message(STATUS "")
  message(STATUS "---------------- ddp_from_scratch configuration ----------------")
  message(STATUS "  LibTorch      : ${DP_TORCH_VERSION} (${TORCH_INSTALL_PREFIX})")
  message(STATUS "  Gloo backend  : ${DP_HAVE_GLOO}")
  message(STATUS "  C++ ABI       : ${DP_TORCH_ABI_MSG}; C++${CMAKE_CXX_STANDARD}")
  message(STATUS "  CUDA LibTorch : ${DP_HAVE_CUDA} ${DP_CUDA_MSG}")
  message(STATUS "  NCCL backend  : ${DP_HAVE_NCCL}${DP_NCCL_INCLUDE_MSG}")
  message(STATUS "  GoogleTest    : ${GTest_FOUND}")
  message(STATUS "  Doxygen       : ${DOXYGEN_FOUND} ${DOXYGEN_VERSION}")
  message(STATUS "  Sanitizers    : ${DP_SANITIZE}")
  message(STATUS "  Build type    : ${CMAKE_BUILD_TYPE}")
  message(STATUS "-----------------------------------------------------------------")
  if(DP_CUDA AND NOT DP_HAVE_NCCL)
    message(FATAL_ERROR "DP_CUDA=ON but no NCCL: ProcessGroupNCCL.hpp ${DP_NCCL_HEADER}, nccl.h ${DP_NCCL_INCLUDE}")
  endif()
  if(NOT DP_HAVE_GLOO)
    message(FATAL_ERROR "LibTorch without Gloo headers: install libgloo-dev (Debian) or use a LibTorch built with Gloo.")
  endif()
endfunction()
