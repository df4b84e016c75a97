# Optional CUDA target strata::cuda: exists when nvcc is found (STRATA_CUDA=AUTO) or required (ON).
if(STRATA_CUDA STREQUAL "OFF")
  return()
endif()
include(CheckLanguage)
check_language(CUDA)
if(NOT CMAKE_CUDA_COMPILER)
  if(STRATA_CUDA STREQUAL "ON")
    message(FATAL_ERROR "STRATA_CUDA=ON but no CUDA compiler was found; set CMAKE_CUDA_COMPILER or use -DSTRATA_CUDA=OFF")
  endif()
  message(STATUS "strata: no CUDA compiler found, strata::cuda is not built")
  return()
endif()
if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
  set(CMAKE_CUDA_ARCHITECTURES 90)
endif()
# CMake 3.25 does not know nvcc's C++20 flag yet.
set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION -std=c++20)
set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION -std=c++20)
enable_language(CUDA)
find_package(CUDAToolkit REQUIRED)

find_path(NCCL_INCLUDE_DIR nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATH_SUFFIXES include)
find_library(NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} PATH_SUFFIXES lib lib64)
if(NCCL_INCLUDE_DIR AND NCCL_LIBRARY AND NOT TARGET strata::nccl)
  add_library(strata::nccl UNKNOWN IMPORTED)
  set_target_properties(strata::nccl PROPERTIES IMPORTED_LOCATION "${NCCL_LIBRARY}"
                                                INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
endif()

add_library(strata_cuda INTERFACE)
add_library(strata::cuda ALIAS strata_cuda)
target_link_libraries(strata_cuda INTERFACE strata::strata CUDA::cudart CUDA::cublas)
if(TARGET strata::nccl)
  target_link_libraries(strata_cuda INTERFACE strata::nccl)
endif()
target_compile_features(strata_cuda INTERFACE cuda_std_20)
# The kernels promise the CPU code's bits (fp16 / int8 bytes, optimizer updates, the ring's sums):
# the host side must not contract a * b + c into an FMA either. GCC does by default wherever the
# target has FMA (aarch64 hosts such as Grace, or x86-64 with -march=native / -mfma).
target_compile_options(strata_cuda INTERFACE $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>
                                             $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-ffp-contract=off>)
set(STRATA_HAS_CUDA ON)
message(STATUS "strata: CUDA ${CMAKE_CUDA_COMPILER_VERSION}, architectures ${CMAKE_CUDA_ARCHITECTURES}")
