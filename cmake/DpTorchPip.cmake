# LibTorch from a pip `torch` 2.x wheel (scripts/setup/install_torch2.sh puts one in build-venv/torch2).
# Used by the 'torch2' preset (CPU, Gloo) and the 'cuda' preset (CUDA, NCCL). Sets Torch_VERSION,
# TORCH_LIBRARIES, TORCH_INCLUDE_DIRS, TORCH_INSTALL_PREFIX as find_package(Torch) would.
#
# Choices settled here, each printed in the configure summary:
# - the C++ ABI: _GLIBCXX_USE_CXX11_ABI from torch.compiled_with_cxx11_abi();
# - CPU build (DP_CUDA OFF): link libtorch_cpu + libc10 only. The wheel is a CUDA build, but a CPU
#   program needs none of its CUDA libraries, nor a CUDA toolkit to configure;
# - CUDA build (DP_CUDA ON): Torch's own CMake config against the CUDA toolkit on this machine; the
#   wheel's CUDA version and the toolkit's are both printed, and a different major version is refused;
# - NCCL: the wheel's own nvidia-nccl (its header and library), the one libtorch_cuda was linked with.

set(DP_TORCH_PYTHON "${PROJECT_SOURCE_DIR}/build-venv/torch2/bin/python" CACHE FILEPATH
    "Python whose pip torch 2.x provides LibTorch (torch2 and cuda presets)")
if(NOT EXISTS "${DP_TORCH_PYTHON}")
  message(FATAL_ERROR "No pip torch at ${DP_TORCH_PYTHON}. Install the pinned one with:\n"
                      "  bash scripts/setup/install_torch2.sh\n"
                      "or pass -DDP_TORCH_PYTHON=/path/to/python of an environment that has torch 2.x.")
endif()
execute_process(  # with pip's build isolation undone: pip install ./python builds for the torch of its Python
  COMMAND ${CMAKE_COMMAND} -E env --unset=PYTHONPATH --unset=PYTHONNOUSERSITE "${DP_TORCH_PYTHON}" -c
    "import os, torch; print(torch.__version__.split('+')[0]); print(os.path.dirname(torch.__file__)); print(int(torch.compiled_with_cxx11_abi())); print(torch.version.cuda or '')"
  OUTPUT_VARIABLE _dp_out RESULT_VARIABLE _dp_rc ERROR_VARIABLE _dp_err OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _dp_rc EQUAL 0)
  message(FATAL_ERROR "${DP_TORCH_PYTHON} cannot import torch:\n${_dp_err}\nRun: bash scripts/setup/install_torch2.sh")
endif()
string(REPLACE "\n" ";" _dp_out "${_dp_out}")
list(GET _dp_out 0 Torch_VERSION)
list(GET _dp_out 1 TORCH_INSTALL_PREFIX)
list(GET _dp_out 2 DP_TORCH_CXX11_ABI)
list(LENGTH _dp_out _dp_n)
set(DP_TORCH_CUDA_VERSION "")
if(_dp_n GREATER 3)
  list(GET _dp_out 3 DP_TORCH_CUDA_VERSION)
endif()
if(Torch_VERSION VERSION_LESS 2.0)
  message(FATAL_ERROR "${DP_TORCH_PYTHON} has torch ${Torch_VERSION}; the torch2/cuda presets need 2.x "
                      "(bash scripts/setup/install_torch2.sh installs the pinned one)")
endif()
# LibTorch 2.x headers of recent releases refuse anything older than C++20 (all.h #errors).
set(CMAKE_CXX_STANDARD 20)
set(DP_TORCH_ABI_MSG "_GLIBCXX_USE_CXX11_ABI=${DP_TORCH_CXX11_ABI} (torch.compiled_with_cxx11_abi())")

if(DP_CUDA)
  if(DP_TORCH_CUDA_VERSION STREQUAL "")
    message(FATAL_ERROR "The cuda preset needs a CUDA LibTorch, but ${DP_TORCH_PYTHON} has a CPU-only torch "
                        "${Torch_VERSION}. Install the pinned CUDA wheel with: bash scripts/setup/install_torch2.sh")
  endif()
  find_package(CUDAToolkit QUIET)
  if(NOT CUDAToolkit_FOUND)
    message(FATAL_ERROR "The cuda preset needs the CUDA toolkit (nvcc on the PATH or CUDAToolkit_ROOT); "
                        "the wheel was built for CUDA ${DP_TORCH_CUDA_VERSION}.")
  endif()
  string(REGEX MATCH "^[0-9]+" _dp_wheel_major "${DP_TORCH_CUDA_VERSION}")
  if(NOT CUDAToolkit_VERSION_MAJOR STREQUAL _dp_wheel_major)
    message(FATAL_ERROR "CUDA mismatch: the torch wheel was built for CUDA ${DP_TORCH_CUDA_VERSION}, the toolkit "
                        "at ${CUDAToolkit_BIN_DIR} is ${CUDAToolkit_VERSION}. Use a toolkit of the same major "
                        "version (CUDAToolkit_ROOT=...) or a wheel built for CUDA ${CUDAToolkit_VERSION_MAJOR}.")
  endif()
  set(DP_CUDA_MSG "wheel built for ${DP_TORCH_CUDA_VERSION}, toolkit ${CUDAToolkit_VERSION} (same major: minor-version compatible)")
  # The wheel ships its own NCCL; libtorch_cuda is linked against it, so compile against its header too.
  get_filename_component(_dp_site "${TORCH_INSTALL_PREFIX}/.." ABSOLUTE)
  find_path(DP_NCCL_INCLUDE nccl.h HINTS "${_dp_site}/nvidia/nccl/include" "${_dp_site}/nvidia/cu13/include" NO_DEFAULT_PATH)
  # Torch's config looks its libraries up with PATHS, which come after the system folders: on a machine
  # with Debian's libtorch-dev it would pick /usr/lib's 1.13 libtorch.so and libc10.so. Name the wheel's.
  set(TORCH_LIBRARY "${TORCH_INSTALL_PREFIX}/lib/libtorch.so" CACHE FILEPATH "the wheel's libtorch" FORCE)
  set(c10_LIBRARY "${TORCH_INSTALL_PREFIX}/lib/libc10.so" CACHE FILEPATH "the wheel's libc10" FORCE)
  list(APPEND CMAKE_PREFIX_PATH "${TORCH_INSTALL_PREFIX}/share/cmake")
  find_package(Torch REQUIRED CONFIG PATHS "${TORCH_INSTALL_PREFIX}/share/cmake/Torch" NO_DEFAULT_PATH)
  # libtorch_cuda needs the wheel's libnccl.so.2 (2.30 here): the toolkit's older one, which the linker
  # would otherwise find first through /usr/local/cuda/lib, lacks symbols it uses (ncclSignal, ...).
  # Link the wheel's by path, and search the wheel's CUDA libraries first at run time too.
  find_library(DP_NCCL_LIB NAMES libnccl.so.2 nccl PATHS "${_dp_site}/nvidia/nccl/lib" NO_DEFAULT_PATH REQUIRED)
  list(APPEND TORCH_LIBRARIES "${DP_NCCL_LIB}")
  set(CMAKE_BUILD_RPATH "${_dp_site}/nvidia/nccl/lib" "${_dp_site}/nvidia/cu13/lib" "${TORCH_INSTALL_PREFIX}/lib")
  set(DP_NCCL_INCLUDE_MSG " (the wheel's nvidia-nccl: ${DP_NCCL_LIB})")
else()
  set(DP_CUDA_MSG "not used (CPU build against the wheel's libtorch_cpu; wheel built for CUDA ${DP_TORCH_CUDA_VERSION})")
  find_library(DP_TORCH_CPU_LIB torch_cpu PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
  find_library(DP_C10_LIB c10 PATHS "${TORCH_INSTALL_PREFIX}/lib" NO_DEFAULT_PATH REQUIRED)
  add_library(dp_torch_pip INTERFACE)
  target_link_libraries(dp_torch_pip INTERFACE "${DP_TORCH_CPU_LIB}" "${DP_C10_LIB}")
  target_compile_definitions(dp_torch_pip INTERFACE _GLIBCXX_USE_CXX11_ABI=${DP_TORCH_CXX11_ABI})
  set(TORCH_INCLUDE_DIRS "${TORCH_INSTALL_PREFIX}/include" "${TORCH_INSTALL_PREFIX}/include/torch/csrc/api/include")
  target_include_directories(dp_torch_pip SYSTEM INTERFACE ${TORCH_INCLUDE_DIRS})
  # The libraries' own RUNPATH finds their neighbours; ours must find libtorch_cpu at run time.
  set(CMAKE_BUILD_RPATH "${TORCH_INSTALL_PREFIX}/lib")
  set(TORCH_LIBRARIES dp_torch_pip)
endif()
