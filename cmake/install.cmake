# install.cmake - what `cmake --install <build> --prefix P` puts in P:
#   P/include/fabpool.h and the adapter headers beside it (fabpool_*.h, fabpool_*.hpp),
#   P/lib/libfabpool.so* (with its SONAME) and P/lib/libfabpool.a,
#   P/lib/cmake/fabpool/ (find_package(fabpool): fabpool::fabpool, fabpool::fabpool_static),
#   P/lib/pkgconfig/fabpool.pc (pkg-config --cflags --libs fabpool),
#   P/share/doc/fabpool/LICENSE and CHANGELOG.md,
#   P/bin/fabpool_trace, fabpool_replay and fabpool_bench (the tools for a trace and for measuring),
#   P/lib/fabpool/sim/libcuda.so.1, the simulated driver, with --component sim or -DFABPOOL_INSTALL_SIM=ON,
#   P/lib/fabpool/python/ (FABPOOL_INSTALL_PYTHONDIR): the PyTorch adapter, the package fabpool_torch
#   (the module with libfabpool_torch.so, and libfabpool_torch_cxx.so where it was built), fabpool_symm.py,
#   fabpool_memory_saver.py and fabpool_cumem.py (torch_memory_saver's and vLLM's APIs, docs/rl-serving.md) and
#   fabpool_stage.py (their host copies through the staging ring);
#   PYTHONPATH=P/lib/fabpool/python makes `import fabpool_torch` find it.  The wheel (pyproject.toml) is this
#   component (python) alone.
# docs/integration.md, "Installing fabpool".
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(FABPOOL_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/fabpool)

# the public headers: fabpool.h and the headers beside it, and each adapter's header, which lives with the
# adapter's code (adapters/<name>/) and installs beside fabpool.h
file(GLOB fabpool_public_headers ${CMAKE_CURRENT_SOURCE_DIR}/include/fabpool*.h
                                 ${CMAKE_CURRENT_SOURCE_DIR}/include/fabpool*.hpp)
set(FABPOOL_ADAPTER_HEADERS ${CMAKE_CURRENT_SOURCE_DIR}/adapters/hybridep/fabpool_hybridep.hpp
                            ${CMAKE_CURRENT_SOURCE_DIR}/adapters/torch/fabpool_torch.h)
list(APPEND fabpool_public_headers ${FABPOOL_ADAPTER_HEADERS})
install(FILES ${fabpool_public_headers} DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT devel)

# The targets' INSTALL_INTERFACE include dir is "include" (a path relative to the prefix).
# The object library is linked by neither target's interface, so it needs no export.
install(TARGETS fabpool fabpool_static EXPORT fabpoolTargets
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT devel
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT devel
        RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime
        INCLUDES DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(EXPORT fabpoolTargets NAMESPACE fabpool:: DESTINATION ${FABPOOL_CMAKE_DIR} COMPONENT devel)

configure_package_config_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/fabpool-config.cmake.in
                              ${CMAKE_CURRENT_BINARY_DIR}/fabpool-config.cmake
                              INSTALL_DESTINATION ${FABPOOL_CMAKE_DIR}
                              PATH_VARS CMAKE_INSTALL_INCLUDEDIR)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/fabpool-config-version.cmake
                                 VERSION ${PROJECT_VERSION} COMPATIBILITY ${FABPOOL_COMPATIBILITY})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fabpool-config.cmake ${CMAKE_CURRENT_BINARY_DIR}/fabpool-config-version.cmake
        DESTINATION ${FABPOOL_CMAKE_DIR} COMPONENT devel)

# pkg-config: relocatable (prefix found from the .pc file's own place), so
# that `cmake --install --prefix P` gives a .pc that points into P
file(RELATIVE_PATH fabpool_pc_up /x/${CMAKE_INSTALL_LIBDIR}/pkgconfig /x)
string(REGEX REPLACE "/$" "" fabpool_pc_up "${fabpool_pc_up}")
set(FABPOOL_PC_PREFIX "\${pcfiledir}/${fabpool_pc_up}")
list(TRANSFORM CMAKE_DL_LIBS PREPEND "-l" OUTPUT_VARIABLE fabpool_dl_flags)
string(JOIN " " FABPOOL_PC_PRIVATE_LIBS -pthread ${fabpool_dl_flags})
configure_file(${CMAKE_CURRENT_SOURCE_DIR}/cmake/fabpool.pc.in ${CMAKE_CURRENT_BINARY_DIR}/fabpool.pc @ONLY)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/fabpool.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT devel)

# the license goes wherever the library goes
install(FILES ${CMAKE_CURRENT_SOURCE_DIR}/LICENSE ${CMAKE_CURRENT_SOURCE_DIR}/CHANGELOG.md
        DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT runtime)

# the tools
set(fabpool_tools)
foreach(t fabpool_trace fabpool_replay fabpool_bench)
  if(TARGET ${t})
    list(APPEND fabpool_tools ${t})
  endif()
endforeach()
if(fabpool_tools)
  install(TARGETS ${fabpool_tools} RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT tools)
endif()

# the simulated driver, to try fabpool and its tools without a GPU (FABPOOL_CUDA_LIBRARY=<that path>): only
# with `cmake --install <build> --component sim`, or in every install with -DFABPOOL_INSTALL_SIM=ON; in a folder
# of its own, where no program finds it as its libcuda.so.1 unless told
option(FABPOOL_INSTALL_SIM "cmake --install puts the simulated driver in <libdir>/fabpool/sim (else: --component sim)" OFF)
set(fabpool_sim_all EXCLUDE_FROM_ALL)
if(FABPOOL_INSTALL_SIM)
  set(fabpool_sim_all)
endif()
install(TARGETS fabsim LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}/fabpool/sim COMPONENT sim NAMELINK_SKIP
        ${fabpool_sim_all})

# the PyTorch adapter: module and libraries in one folder, the module configured by this build (its version and
# build id, which it checks against the library's at load)
set(FABPOOL_INSTALL_PYTHONDIR ${CMAKE_INSTALL_LIBDIR}/fabpool/python CACHE STRING
    "Where cmake --install puts the Python modules (fabpool_torch, fabpool_symm), relative to the prefix")
if(TARGET fabpool_torch)
  set(fabpool_pkg ${FABPOOL_INSTALL_PYTHONDIR}/fabpool_torch)
  install(TARGETS fabpool_torch LIBRARY DESTINATION ${fabpool_pkg} COMPONENT python)
  if(TARGET fabpool_torch_cxx)
    install(TARGETS fabpool_torch_cxx LIBRARY DESTINATION ${fabpool_pkg} COMPONENT python)
  endif()
  install(FILES ${CMAKE_BINARY_DIR}/adapters/torch/fabpool_torch.py DESTINATION ${fabpool_pkg} RENAME __init__.py
          COMPONENT python)
  install(FILES ${CMAKE_BINARY_DIR}/adapters/torch/fabpool_symm.py ${CMAKE_BINARY_DIR}/adapters/torch/fabpool_memory_saver.py
          ${CMAKE_BINARY_DIR}/adapters/torch/fabpool_cumem.py ${CMAKE_BINARY_DIR}/adapters/torch/fabpool_stage.py
          DESTINATION ${FABPOOL_INSTALL_PYTHONDIR} COMPONENT python)
endif()

# ---------------------------------------------------------------- tests
# install into a fresh prefix, then build and run two consumers against it:
# one through find_package, one through pkg-config
if(BUILD_TESTING AND FABPOOL_TEST_DRIVER STREQUAL "sim")
  string(MD5 fabpool_inst_id "${CMAKE_BINARY_DIR}")
  string(SUBSTRING "${fabpool_inst_id}" 0 12 fabpool_inst_id)
  set(fabpool_inst_prefix /tmp/fabpool-install-${fabpool_inst_id})
  set(fabpool_inst_run sh ${CMAKE_CURRENT_SOURCE_DIR}/tests/install/run.sh)
  set(fabpool_inst_args ${CMAKE_COMMAND} ${CMAKE_BINARY_DIR} ${fabpool_inst_prefix}
      ${CMAKE_CURRENT_SOURCE_DIR}/tests/install ${CMAKE_C_COMPILER} ${CMAKE_INSTALL_LIBDIR})
  set(fabpool_inst_env "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/sim" "FABPOOL_SONAME=libfabpool.so.${FABPOOL_SOVERSION}"
      "FABPOOL_CUDA_LIBRARY=${CMAKE_BINARY_DIR}/sim/libcuda.so.1" "FABPOOL_PYTHONDIR=${FABPOOL_INSTALL_PYTHONDIR}"
      "FABPOOL_PYTHON=${FABPOOL_PYTHON}" "FABPOOL_VERSION=${PROJECT_VERSION}"
      "FABPOOL_INSTALL_SIM=${FABPOOL_INSTALL_SIM}")
  add_test(NAME test_install COMMAND ${fabpool_inst_run} install ${fabpool_inst_args})
  add_test(NAME test_install_find_package COMMAND ${fabpool_inst_run} find_package ${fabpool_inst_args})
  add_test(NAME test_install_pkgconfig COMMAND ${fabpool_inst_run} pkgconfig ${fabpool_inst_args})
  set(fabpool_inst_users test_install_find_package test_install_pkgconfig)
  if(FABPOOL_PYTHON AND TARGET fabpool_torch)
    # the installed fabpool_torch package on PYTHONPATH: the Python tests that need no GPU, from it
    add_test(NAME test_install_python COMMAND ${fabpool_inst_run} python ${fabpool_inst_args})
    list(APPEND fabpool_inst_users test_install_python)
  endif()
  set_tests_properties(test_install PROPERTIES FIXTURES_SETUP fabpool_installed)
  set_tests_properties(${fabpool_inst_users} PROPERTIES FIXTURES_REQUIRED fabpool_installed)
  foreach(t test_install ${fabpool_inst_users})
    set_tests_properties(${t} PROPERTIES LABELS install TIMEOUT 300
                         ENVIRONMENT "${fabpool_inst_env};FABSIM_MACHINE=${t}")
  endforeach()
endif()
