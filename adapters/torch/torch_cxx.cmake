# libfabpool_torch_cxx.so: fabpool as PyTorch's CUDAAllocator (torch_cxx.cpp on
# torch_core.cpp), built against the PyTorch that python3 imports.  Skipped,
# with a message, where torch cannot be imported (CI here); the Python module
# then falls back to the pluggable shim.  FABPOOL_TORCH_INCLUDE names a torch
# include folder to compile torch_cxx.cpp against without linking, where
# torch is not installed (a header check).
option(FABPOOL_TORCH_CXX "Build libfabpool_torch_cxx.so against the installed PyTorch (skipped where torch is not importable)" ON)
set(FABPOOL_TORCH_INCLUDE "" CACHE PATH "A PyTorch include folder to compile torch_cxx.cpp against, without linking")

# what the configured module says of the C++ allocator (build_info()): the PyTorch it is built for, or nothing
set(FABPOOL_TORCH_CXX_BUILT_FOR "")
if(FABPOOL_TORCH_CXX)
  find_program(FABPOOL_TORCH_PYTHON NAMES python3)
  set(_probe_rc 1)
  if(FABPOOL_TORCH_PYTHON)
    execute_process(COMMAND ${FABPOOL_TORCH_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/torch_probe.py
                    OUTPUT_VARIABLE _probe RESULT_VARIABLE _probe_rc ERROR_VARIABLE _probe_err TIMEOUT 300)
  endif()
  if(_probe_rc EQUAL 0)
    # key=value lines: include, lib, abi, version, cuda, cudart
    string(REPLACE "\n" ";" _probe_lines "${_probe}")
    foreach(_l ${_probe_lines})
      if(_l MATCHES "^([a-z]+)=(.*)$")
        set(_torch_${CMAKE_MATCH_1} "${CMAKE_MATCH_2}")
      endif()
    endforeach()
    string(REPLACE "," ";" _torch_include "${_torch_include}")
    message(STATUS "fabpool_torch_cxx: PyTorch ${_torch_version} (CUDA ${_torch_cuda}, C++11 ABI ${_torch_abi}) in ${_torch_lib}")
    set(FABPOOL_TORCH_CXX_BUILT_FOR "${_torch_version}")
    set(_torch_rpath "${_torch_lib}")
    if(_torch_cudart)
      get_filename_component(_cudart_dir "${_torch_cudart}" DIRECTORY)
      list(APPEND _torch_rpath "${_cudart_dir}")
    else()
      set(_torch_cudart CUDA::cudart)
    endif()
    add_library(fabpool_torch_cxx SHARED torch_cxx.cpp torch_core.cpp torch_ipc.cpp $<TARGET_OBJECTS:fabpool_torch_shim>
                $<TARGET_OBJECTS:fabpool_objects>)
    target_include_directories(fabpool_torch_cxx PRIVATE ${CMAKE_SOURCE_DIR}/include)
    target_include_directories(fabpool_torch_cxx SYSTEM PRIVATE ${_torch_include} ${CUDAToolkit_INCLUDE_DIRS})
    target_compile_definitions(fabpool_torch_cxx PRIVATE _GLIBCXX_USE_CXX11_ABI=${_torch_abi}
                               FABPOOL_TORCH_BUILT_FOR="${_torch_version}")
    target_link_libraries(fabpool_torch_cxx PRIVATE ${_torch_lib}/libc10_cuda.so ${_torch_lib}/libc10.so
                          ${_torch_cudart} Threads::Threads ${CMAKE_DL_LIBS})
    set_target_properties(fabpool_torch_cxx PROPERTIES C_VISIBILITY_PRESET hidden CXX_VISIBILITY_PRESET hidden
                          LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/adapters/torch
                          BUILD_RPATH "${_torch_rpath}" INSTALL_RPATH "${_torch_rpath}" LINK_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/fabpool_torch_cxx.map)
    # -Bsymbolic: the library's calls of its own fabpool_torch_* stay inside it, even where the shim's
    # libfabpool_torch.so, which exports the same names, is loaded into the process too
    target_link_options(fabpool_torch_cxx PRIVATE
                        "LINKER:--version-script=${CMAKE_CURRENT_LIST_DIR}/fabpool_torch_cxx.map" "LINKER:-Bsymbolic")
  else()
    message(STATUS "fabpool_torch_cxx: skipped (no PyTorch to build against: ${FABPOOL_TORCH_PYTHON} cannot import "
                   "torch); fabpool_torch.install() will use the pluggable shim")
    if(FABPOOL_TORCH_INCLUDE)
      # the header check: torch_cxx.cpp compiled against the given headers, not linked
      add_library(fabpool_torch_cxx_check OBJECT torch_cxx.cpp)
      target_include_directories(fabpool_torch_cxx_check PRIVATE ${CMAKE_SOURCE_DIR}/include)
      target_include_directories(fabpool_torch_cxx_check SYSTEM PRIVATE ${FABPOOL_TORCH_INCLUDE}
                                 ${FABPOOL_TORCH_INCLUDE}/torch/csrc/api/include ${CUDAToolkit_INCLUDE_DIRS})
      target_compile_definitions(fabpool_torch_cxx_check PRIVATE FABPOOL_TORCH_BUILT_FOR="headers only")
    endif()
  endif()
endif()
