# Symmetric memory over a group of processes (symm.c, python/fabpool_symm.py):
# part of libfabpool_torch.so, with its tests.  Included by CMakeLists.txt here.
target_sources(fabpool_torch_shim PRIVATE ${CMAKE_CURRENT_LIST_DIR}/symm.c)
configure_file(${CMAKE_CURRENT_LIST_DIR}/python/fabpool_symm.py ${CMAKE_BINARY_DIR}/adapters/torch/fabpool_symm.py
               COPYONLY)

if(BUILD_TESTING AND FABPOOL_PYTHON AND FABPOOL_TEST_DRIVER STREQUAL "sim")
  # 4 forked ranks, an all-gather hub in the parent: random resizes with the data checked across ranks, the
  # disagreement errors, a failed grow, a rank that leaves (no torch needed).  The simulated driver only: the
  # ranks read and write device memory through host pointers.
  add_test(NAME test_symm_python
           COMMAND ${FABPOOL_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_symm_python.py $<TARGET_FILE:fabpool_torch>)
  fabpool_test_env(test_symm_python)
  set_tests_properties(test_symm_python PROPERTIES LABELS "torch;share" TIMEOUT 120)
endif()

if(BUILD_TESTING)
  # the same in C (4 forked ranks, the parent as the all-gather), for the sanitizers and valgrind
  # test_symm.c compiles symm.c into itself (its message layout, and a cut fd send for one case)
  fabpool_test(test_symm SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_symm.c LIBS ${FABPOOL_TEST_LIBS}
               LABELS "torch;share" TIMEOUT 120)
  target_include_directories(test_symm PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_CURRENT_LIST_DIR})
endif()

if(BUILD_TESTING AND FABPOOL_TEST_DRIVER STREQUAL "sim")
  # driver faults (the sim's hooks) in a resize and its exchange, 2 to 4 forked ranks: after every call, failed
  # or not, every view reads its peer's bytes.  The cases, then the seeded property run (prop first seeds steps
  # twice): 1,100 seeds x 60 steps in CI, seeds 1-100 in the default run, 101-1100 in the configuration `long` (only
  # `ctest -C long` runs it; .ci/reliability does).  "twice": now and then a second fault, also in what mends the
  # first (seeds 993 and 1006 lose a refit's chunk: FABPOOL_ERR_PARTIAL on every rank)
  fabpool_test(test_symm_faults SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_symm_faults.c ${CMAKE_CURRENT_LIST_DIR}/symm.c
               LIBS ${FABPOOL_TEST_LIBS} LABELS "torch;share" TIMEOUT 120)
  target_include_directories(test_symm_faults PRIVATE ${CMAKE_SOURCE_DIR}/tests ${CMAKE_CURRENT_LIST_DIR})
  fabpool_fabric_variant(test_symm_faults share TIMEOUT 120)
  add_test(NAME test_symm_faults_prop COMMAND test_symm_faults prop 1 100 60 twice)
  fabpool_test_env(test_symm_faults_prop)
  set_tests_properties(test_symm_faults_prop PROPERTIES LABELS "torch;share;reliability" TIMEOUT 300)
  add_test(NAME test_symm_faults_prop_101 CONFIGURATIONS long COMMAND test_symm_faults prop 101 1000 60 twice)
  fabpool_test_env(test_symm_faults_prop_101)
  # COST 40: the dearest entry of `long` (40 s on 2 cores), started before the property ones (COST 20)
  set_tests_properties(test_symm_faults_prop_101 PROPERTIES LABELS "torch;share;long" TIMEOUT 600 COST 40)
endif()
