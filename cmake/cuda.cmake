# Finds nvcc, the CUDA toolkit (cudart, cuBLAS) and NCCL, and sets TOUCHSTONE_HAVE_CUDA.
#
# Device code is compiled for CMAKE_CUDA_ARCHITECTURES, by default 80 (A100) and 90 (H100, H200);
# set it to your GPU's compute capability (or "native" on a machine with one) to build faster.
set(TOUCHSTONE_HAVE_CUDA OFF)
if(TOUCHSTONE_CUDA STREQUAL "OFF")
  message(STATUS "CUDA backend: off (TOUCHSTONE_CUDA=OFF)")
  return()
endif()

include(CheckLanguage)
check_language(CUDA)
set(missing "")
if(NOT CMAKE_CUDA_COMPILER)
  set(missing "nvcc")
else()
  find_package(CUDAToolkit)
  if(NOT CUDAToolkit_FOUND OR NOT TARGET CUDA::cublas)
    set(missing "the CUDA toolkit's cuBLAS")
  endif()
  find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
  find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib)
  if(NOT NCCL_INCLUDE_DIR OR NOT NCCL_LIBRARY)
    set(missing "NCCL (nccl.h, libnccl)")
  endif()
endif()

if(missing)
  if(TOUCHSTONE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "TOUCHSTONE_CUDA=ON but ${missing} was not found")
  endif()
  message(STATUS "CUDA backend: not built (${missing} not found; TOUCHSTONE_CUDA=AUTO)")
  return()
endif()

if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 80 90)
endif()
enable_language(CUDA)
# CMake 3.25 does not know nvcc 13's C++20 flag; it is the same as the host compiler's.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
set(CMAKE_CUDA_STANDARD 20)
set(CMAKE_CUDA_STANDARD_REQUIRED ON)
# Warnings are errors in device and host code alike; host warnings come from the host compiler.
add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings;-Xcompiler=-Wall,-Wextra,-Werror>")
set(TOUCHSTONE_HAVE_CUDA ON)
message(STATUS "CUDA backend: built (nvcc ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}, "
               "NCCL ${NCCL_LIBRARY})")
