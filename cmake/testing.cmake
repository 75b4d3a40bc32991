# What every test of the project shares, wherever it is declared (tests/,
# tests/reliability, tests/multigpu, fuzz/, perf/, adapters/): the driver it
# runs against, the libraries a test program links, the MPI runner, and a
# simulated machine of its own for each test.
#
# FABPOOL_TEST_DRIVER=sim (the default): LD_LIBRARY_PATH and
# FABPOOL_CUDA_LIBRARY point at this build's simulated libcuda.so.1.  Test
# programs that call the driver API themselves link the simulated driver only
# for its symbols; which libcuda.so.1 they load is decided at run time.
# FABPOOL_TEST_DRIVER=real: the machine's libcuda.so.1.
if(FABPOOL_TEST_DRIVER STREQUAL "sim")
  set(FABPOOL_TEST_ENV "LD_LIBRARY_PATH=${CMAKE_BINARY_DIR}/sim;FABPOOL_CUDA_LIBRARY=${CMAKE_BINARY_DIR}/sim/libcuda.so.1")
else()
  set(FABPOOL_TEST_ENV "FABPOOL_TEST_REAL_DRIVER=1")
endif()

# a test of the library: fabpool (static, so no rpath is needed) + the driver API
find_library(FABPOOL_JEMALLOC NAMES jemalloc)
set(FABPOOL_TEST_LIBS fabpool_static fabsim Threads::Threads ${CMAKE_DL_LIBS})
if(FABPOOL_JEMALLOC)
  # the program has jemalloc, so the pool's metadata goes to a private arena
  list(APPEND FABPOOL_TEST_LIBS ${FABPOOL_JEMALLOC})
endif()

find_program(FABPOOL_PYTHON NAMES python3)

# Open MPI from Debian (openmpi-bin, libopenmpi-dev): 4 ranks on one host, as root
find_package(MPI COMPONENTS C CXX)
if(MPIEXEC_EXECUTABLE)
  set(FABPOOL_MPIRUN ${MPIEXEC_EXECUTABLE} ${MPIEXEC_NUMPROC_FLAG} 4 --oversubscribe --allow-run-as-root
      --mca btl self,vader --mca btl_vader_single_copy_mechanism none)
  set(FABPOOL_MPI_ENV "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endif()

# fabpool_test_env(test [env...]): the test runs with the driver's environment,
# then env, and on the simulated driver as a machine of its own, so that tests
# running at the same time (ctest -j) never count each other's memory when they
# ask what the whole machine holds.
#
# On the real driver the tests read the device's used memory less what NVML
# says the other processes use (tests/held.h), so that other processes on the
# GPU do not count.  Memory that no process maps but an open fd or dma-buf
# keeps alive is nobody's in NVML's count, and several tests make such memory
# on purpose: side by side under ctest -j they would count each other's.  So
# by default (FABPOOL_TEST_DEVICE_LOCK) every test of the real-driver build
# takes one CTest resource lock and they run one at a time whatever -j says
# (tests without the driver still run beside them).
function(fabpool_test_env name)
  set(env "${FABPOOL_TEST_ENV};${ARGN}")
  if(FABPOOL_TEST_DRIVER STREQUAL "sim")
    # one simulated machine per test and per build folder: two builds testing at once do not see each other
    string(MD5 build_id "${CMAKE_BINARY_DIR}")
    string(SUBSTRING "${build_id}" 0 8 build_id)
    list(APPEND env "FABSIM_MACHINE=${name}-${build_id}")
  elseif(FABPOOL_TEST_DEVICE_LOCK)
    set_tests_properties(${name} PROPERTIES RESOURCE_LOCK fabpool_device_memory)
  endif()
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env}")
endfunction()

# <test>_fabric: the test again with fabric handles, which the simulated driver permits on request (sim only);
# its labels, then any other test properties, follow the name.
function(fabpool_fabric_variant test label)
  if(FABPOOL_TEST_DRIVER STREQUAL "sim")
    add_test(NAME ${test}_fabric COMMAND ${test})
    fabpool_test_env(${test}_fabric FABSIM_FABRIC=1 FABPOOL_CONF=handle_type:fabric)
    set_tests_properties(${test}_fabric PROPERTIES LABELS ${label} ${ARGN})
  endif()
endfunction()

# fabpool_test(name SOURCES src... [LIBS libs] [ARGS args] [ENV env] [LABELS l] [TIMEOUT s])
function(fabpool_test name)
  cmake_parse_arguments(T "" "TIMEOUT" "SOURCES;LIBS;ARGS;ENV;LABELS" ${ARGN})
  if(NOT T_TIMEOUT)
    set(T_TIMEOUT 600)
  endif()
  add_executable(${name} ${T_SOURCES})
  target_include_directories(${name} PRIVATE ${CMAKE_SOURCE_DIR}/include ${CUDAToolkit_INCLUDE_DIRS} ${FABPOOL_LIB_DIRS})
  target_link_libraries(${name} PRIVATE ${T_LIBS})
  set_target_properties(${name} PROPERTIES SKIP_BUILD_RPATH ON)
  add_test(NAME ${name} COMMAND ${name} ${T_ARGS})
  fabpool_test_env(${name} ${T_ENV})
  set_tests_properties(${name} PROPERTIES LABELS "${T_LABELS}" TIMEOUT ${T_TIMEOUT})
endfunction()
