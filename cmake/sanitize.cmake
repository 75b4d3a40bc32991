# Sanitizer builds and fuzzers (docs/reliability.md).
#   FABPOOL_SANITIZE=address  ASan + UBSan over the library, the simulated driver and the tests
#   FABPOOL_SANITIZE=thread   TSan
#   FABPOOL_FUZZ=ON           libFuzzer targets in fuzz/ (needs clang: CC=clang)
set(FABPOOL_SANITIZE "" CACHE STRING "Sanitizer build: empty (none), address (ASan+UBSan) or thread (TSan)")
set_property(CACHE FABPOOL_SANITIZE PROPERTY STRINGS "" address thread)
option(FABPOOL_FUZZ "Build the libFuzzer targets (clang only)" OFF)

if(FABPOOL_SANITIZE STREQUAL "address")
  set(fabpool_san_flags -fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
elseif(FABPOOL_SANITIZE STREQUAL "thread")
  set(fabpool_san_flags -fsanitize=thread -fno-omit-frame-pointer)
elseif(NOT FABPOOL_SANITIZE STREQUAL "")
  message(FATAL_ERROR "FABPOOL_SANITIZE='${FABPOOL_SANITIZE}': accepted are '' (none), address, thread")
endif()
if(fabpool_san_flags)
  add_compile_options(${fabpool_san_flags})
  add_link_options(${fabpool_san_flags})
  message(STATUS "fabpool: sanitizer build (${FABPOOL_SANITIZE})")
endif()

if(FABPOOL_FUZZ AND NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "FABPOOL_FUZZ=ON needs clang for libFuzzer: configure with CC=clang CXX=clang++ "
                      "(apt-get install clang)")
endif()
if(FABPOOL_FUZZ)
  # coverage for libFuzzer in the library and the sim as well, and ASan+UBSan to catch what inputs break
  add_compile_options(-fsanitize=fuzzer-no-link,address,undefined -fno-omit-frame-pointer)
  add_link_options(-fsanitize=address,undefined)
endif()
