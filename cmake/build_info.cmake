# build_info.cmake - run at every build (cmake -P, from CMakeLists.txt's fabpool_build_info target): writes
# OUT from cmake/build_info.c.in with the string fabpool_build_info() returns,
#   "fabpool <version> commit <12 hex digits, '-dirty' if the tree differs from it, or 'unknown'> build <type>
#    driver <sim|real>"
# and leaves OUT untouched when the string is the same, so that nothing is rebuilt for it.
# Inputs (-D): SRC (the source tree), OUT, VERSION, BUILD_TYPE, DRIVER.
set(commit unknown)
find_package(Git QUIET)
if(GIT_FOUND AND EXISTS ${SRC}/.git)
  execute_process(COMMAND ${GIT_EXECUTABLE} -C ${SRC} rev-parse --short=12 HEAD RESULT_VARIABLE rc
                  OUTPUT_VARIABLE head OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  if(rc EQUAL 0 AND head MATCHES "^[0-9a-f]+$")
    set(commit ${head})
    # no optional locks: a build never takes the index lock from a git command running beside it
    execute_process(COMMAND ${GIT_EXECUTABLE} --no-optional-locks -C ${SRC} status --porcelain --untracked-files=no
                    RESULT_VARIABLE rc OUTPUT_VARIABLE changed ERROR_QUIET)
    if(rc EQUAL 0 AND NOT changed STREQUAL "")
      string(APPEND commit -dirty)
    endif()
  endif()
endif()
if(NOT BUILD_TYPE)
  set(BUILD_TYPE none)
endif()
set(FABPOOL_BUILD_INFO "fabpool ${VERSION} commit ${commit} build ${BUILD_TYPE} driver ${DRIVER}")
configure_file(${SRC}/cmake/build_info.c.in ${OUT} @ONLY)
