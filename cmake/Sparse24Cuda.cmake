# Whether to build the CUDA extension: JAX_SPARSE24_CUDA = auto | ON | OFF.
#
#   auto: build only where it can be used — a CUDA 13 nvcc AND an NVIDIA GPU driver on this machine
#         (/proc/driver/nvidia/version, a loadable libcuda.so.1, or a working `nvidia-smi -L`);
#         anywhere else the install is pure Python (reference ops), which takes about a minute
#         instead of the ~10 minutes nvcc needs for the extension on 2 cores.
#   ON:   build it whenever nvcc is found (CI, or building on a machine without a GPU for another
#         one); what is missing is an error.
#   OFF:  never.
#
# sp24_cuda_decision(<mode> <out_build> <out_reason>) sets <out_build> to TRUE/FALSE and
# <out_reason> to one sentence; a mode other than the three is a FATAL_ERROR. It also sets
# SP24_NVCC / SP24_NVCC_VERSION in the caller's scope (empty when no nvcc was found).
#
# Inputs that tests (tests/test_install.py) override: SP24_DRIVER_PROC (file whose existence means
# a driver, default /proc/driver/nvidia/version), SP24_LIBCUDA (library to load, default
# libcuda.so.1), PATH (nvcc, nvidia-smi), CUDACXX, Python_EXECUTABLE.
#
# Script mode (used by the tests): cmake -DSP24_MODE=auto [-D...] -P cmake/Sparse24Cuda.cmake
# prints "SP24_DECISION build=<0|1> nvcc=<version> reason=<sentence>".

set(SP24_CUDA_MAJOR_REQUIRED 13)
if(NOT DEFINED SP24_DRIVER_PROC)
  set(SP24_DRIVER_PROC "/proc/driver/nvidia/version")
endif()
if(NOT DEFINED SP24_LIBCUDA)
  set(SP24_LIBCUDA "libcuda.so.1")
endif()

# nvcc as CMake's CUDA detection would find it: CMAKE_CUDA_COMPILER, $CUDACXX, PATH, then the
# usual install locations.
function(sp24_find_nvcc out_path out_version)
  set(nvcc "")
  if(CMAKE_CUDA_COMPILER)
    set(nvcc "${CMAKE_CUDA_COMPILER}")
  elseif(DEFINED ENV{CUDACXX} AND NOT "$ENV{CUDACXX}" STREQUAL "")
    set(nvcc "$ENV{CUDACXX}")
  else()
    find_program(_sp24_nvcc nvcc HINTS ENV CUDA_HOME ENV CUDA_PATH PATH_SUFFIXES bin
                 PATHS /usr/local/cuda/bin NO_CACHE)
    if(_sp24_nvcc)
      set(nvcc "${_sp24_nvcc}")
    endif()
  endif()
  set(version "")
  if(nvcc)
    execute_process(COMMAND "${nvcc}" --version OUTPUT_VARIABLE out ERROR_QUIET RESULT_VARIABLE rc)
    if(rc EQUAL 0 AND out MATCHES "release ([0-9]+)\\.([0-9]+)")
      set(version "${CMAKE_MATCH_1}.${CMAKE_MATCH_2}")
    else()
      set(nvcc "")
    endif()
  endif()
  set(${out_path} "${nvcc}" PARENT_SCOPE)
  set(${out_version} "${version}" PARENT_SCOPE)
endfunction()

# An NVIDIA driver on this machine (so the extension can be used here): sets <out_found> and
# <out_how> (what was found, or what was looked for).
function(sp24_find_driver out_found out_how)
  if(EXISTS "${SP24_DRIVER_PROC}")
    set(${out_found} TRUE PARENT_SCOPE)
    set(${out_how} "${SP24_DRIVER_PROC}" PARENT_SCOPE)
    return()
  endif()
  if(Python_EXECUTABLE)
    set(py "${Python_EXECUTABLE}")
  else()
    find_program(py NAMES python3 python NO_CACHE)
  endif()
  if(py)
    execute_process(COMMAND "${py}" -c "import ctypes, sys; ctypes.CDLL(sys.argv[1])" "${SP24_LIBCUDA}"
                    RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET)
    if(rc EQUAL 0)
      set(${out_found} TRUE PARENT_SCOPE)
      set(${out_how} "${SP24_LIBCUDA} loads" PARENT_SCOPE)
      return()
    endif()
  endif()
  find_program(smi nvidia-smi NO_CACHE)
  if(smi)
    execute_process(COMMAND "${smi}" -L RESULT_VARIABLE rc OUTPUT_QUIET ERROR_QUIET TIMEOUT 20)
    if(rc EQUAL 0)
      set(${out_found} TRUE PARENT_SCOPE)
      set(${out_how} "nvidia-smi -L works" PARENT_SCOPE)
      return()
    endif()
  endif()
  set(${out_found} FALSE PARENT_SCOPE)
  set(${out_how} "no ${SP24_DRIVER_PROC}, ${SP24_LIBCUDA} does not load, no working nvidia-smi" PARENT_SCOPE)
endfunction()

function(sp24_cuda_decision mode out_build out_reason)
  string(TOUPPER "${mode}" m)
  if(m STREQUAL "OFF" OR m STREQUAL "0" OR m STREQUAL "FALSE")
    set(m OFF)
  elseif(m STREQUAL "ON" OR m STREQUAL "1" OR m STREQUAL "TRUE")
    set(m ON)
  elseif(NOT m STREQUAL "AUTO")
    message(FATAL_ERROR "jax_sparse24: JAX_SPARSE24_CUDA must be auto, ON or OFF, got '${mode}'")
  endif()
  set(SP24_NVCC "" PARENT_SCOPE)
  set(SP24_NVCC_VERSION "" PARENT_SCOPE)
  if(m STREQUAL "OFF")
    set(${out_build} FALSE PARENT_SCOPE)
    set(${out_reason} "JAX_SPARSE24_CUDA=${mode}" PARENT_SCOPE)
    return()
  endif()
  sp24_find_nvcc(nvcc version)
  set(SP24_NVCC "${nvcc}" PARENT_SCOPE)
  set(SP24_NVCC_VERSION "${version}" PARENT_SCOPE)
  if(m STREQUAL "ON")
    # ON: CMake's own checks below report what is missing (nvcc, headers) as errors.
    set(${out_build} TRUE PARENT_SCOPE)
    set(${out_reason} "JAX_SPARSE24_CUDA=${mode}" PARENT_SCOPE)
    return()
  endif()
  set(${out_build} FALSE PARENT_SCOPE)
  if(NOT nvcc)
    set(${out_reason} "no CUDA compiler (nvcc) was found (put CUDA ${SP24_CUDA_MAJOR_REQUIRED}'s nvcc on PATH or set CUDACXX)" PARENT_SCOPE)
    return()
  endif()
  string(REGEX MATCH "^[0-9]+" major "${version}")
  if(NOT major EQUAL SP24_CUDA_MAJOR_REQUIRED)
    set(${out_reason} "${nvcc} is CUDA ${version}, the extension needs CUDA ${SP24_CUDA_MAJOR_REQUIRED}" PARENT_SCOPE)
    return()
  endif()
  sp24_find_driver(driver how)
  if(NOT driver)
    set(${out_reason} "nvcc ${version} was found but no NVIDIA GPU driver (${how}), so the kernels could not run here" PARENT_SCOPE)
    return()
  endif()
  set(${out_build} TRUE PARENT_SCOPE)
  set(${out_reason} "nvcc ${version} and an NVIDIA driver (${how}) were found" PARENT_SCOPE)
endfunction()

if(CMAKE_SCRIPT_MODE_FILE STREQUAL CMAKE_CURRENT_LIST_FILE)
  if(NOT DEFINED SP24_MODE)
    set(SP24_MODE auto)
  endif()
  sp24_cuda_decision("${SP24_MODE}" build reason)
  if(build)
    set(b 1)
  else()
    set(b 0)
  endif()
  message("SP24_DECISION build=${b} nvcc=${SP24_NVCC_VERSION} reason=${reason}")
endif()
