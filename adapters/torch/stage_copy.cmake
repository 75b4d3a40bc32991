# The pinned staging ring of the RL savers' host copies (stage_copy.c, docs/rl-serving.md): in the shim, so that
# both libfabpool_torch.so and libfabpool_torch_cxx.so export it; it calls the driver only through the entry
# points its caller passes.
target_sources(fabpool_torch_shim PRIVATE ${CMAKE_CURRENT_LIST_DIR}/stage_copy.c ${CMAKE_CURRENT_LIST_DIR}/stage_uffd.c)
if(BUILD_TESTING AND FABPOOL_TEST_DRIVER STREQUAL "sim")
  # bytes bitwise through the ring, pinned buffers counted, failed allocations and copies (the sim's faults),
  # and seeded random copies both ways through a ring with FABPOOL_STAGE_UFFD=1 and one without, faults armed
  fabpool_test(test_stage_copy SOURCES ${CMAKE_CURRENT_LIST_DIR}/test_stage_copy.c ${CMAKE_CURRENT_LIST_DIR}/stage_copy.c
                       ${CMAKE_CURRENT_LIST_DIR}/stage_uffd.c
               LIBS fabsim Threads::Threads ${CMAKE_DL_LIBS} LABELS torch TIMEOUT 120)
endif()
