# fn_cuda: the CUDA backend (src/ops/cuda/*.cu and *.cpp). The baseline kernel set uses only SM70 instructions;
# scripts/check-sm70.sh proves it by compiling every .cu file to sm_70 code with CUDA 12.9 (NVRTC + ptxas from PyPI).
# Kernel sources (*.cu) include neither fmt nor cuBLAS: argument checks and cuBLAS calls live in the .cpp wrappers.
# Inputs: FLASHNEXT_ROOT (default: the project source dir) and FN_CUDA_CORE (the target that provides core/error.h
# and fmt; default fn_core). tests/cuda/CMakeLists.txt reuses this file for its standalone GPU-machine build.
if(NOT DEFINED FLASHNEXT_ROOT)
  set(FLASHNEXT_ROOT ${PROJECT_SOURCE_DIR})
endif()
if(NOT DEFINED FN_CUDA_CORE)
  set(FN_CUDA_CORE fn_core)
endif()
if(NOT TARGET fn_ops)  # the standalone GPU build (tests/cuda/CMakeLists.txt): the backend-shared ops code
  file(GLOB ops_srcs CONFIGURE_DEPENDS ${FLASHNEXT_ROOT}/src/ops/*.cpp ${FLASHNEXT_ROOT}/src/ops/contract/*.cpp)
  add_library(fn_ops STATIC ${ops_srcs})
  target_include_directories(fn_ops PUBLIC ${FLASHNEXT_ROOT}/src)
  target_link_libraries(fn_ops PUBLIC ${FN_CUDA_CORE})
endif()
file(GLOB_RECURSE cuda_srcs CONFIGURE_DEPENDS ${FLASHNEXT_ROOT}/src/ops/cuda/*.cu ${FLASHNEXT_ROOT}/src/ops/cuda/*.cpp)
if(cuda_srcs)
  add_library(fn_cuda STATIC ${cuda_srcs})
  target_include_directories(fn_cuda PUBLIC ${FLASHNEXT_ROOT}/src)
  # NCCL is loaded at run time (dlopen: ops/cuda/nccl_communicator.cpp), only its header is needed here.
  target_link_libraries(fn_cuda PUBLIC fn_ops ${FN_CUDA_CORE} CUDA::cudart_static CUDA::cublas ${CMAKE_DL_LIBS})
  if(TARGET CUDA::cupti)  # launch counting in `flashnext bench` (src/ops/cuda/api_counter.cpp); optional
    target_link_libraries(fn_cuda PUBLIC CUDA::cupti)
    target_compile_definitions(fn_cuda PRIVATE FLASHNEXT_HAVE_CUPTI=1)
  endif()
  # Kernels are C++17: CMake 3.25 knows no C++20 flag for nvcc, and the CUDA 12 SM70 check needs none.
  set_target_properties(fn_cuda PROPERTIES CUDA_STANDARD 17 CUDA_SEPARABLE_COMPILATION OFF POSITION_INDEPENDENT_CODE ON)
  target_compile_options(fn_cuda PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:--expt-relaxed-constexpr -lineinfo>)
else()
  set(FLASHNEXT_HAVE_CUDA OFF)
endif()
