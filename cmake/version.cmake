# version.cmake - one version for the whole project, and the places that must say it.
# project() holds it; configuring fails, with a message that says what to change, unless
#   - include/fabpool.h's FABPOOL_VERSION_MAJOR / _MINOR / _PATCH and FABPOOL_VERSION_STRING say it,
#   - pyproject.toml's version (the wheel's) says it,
#   - CHANGELOG.md has a section "## <version>",
#   - every SONAME (libfabpool.so.X.Y) and find_package(fabpool X.Y) written in the README, the docs and the
#     install test's consumer is this version's (CHANGELOG.md's older sections may name older ones).
# The ABI changes only with the major version, and before 1.0 with the minor version too (CHANGELOG.md): the
# SONAME is libfabpool.so.0.4 for 0.4.x, libfabpool.so.1 for 1.x (FABPOOL_SOVERSION), and the CMake package
# accepts the same minor (before 1.0) or major version (FABPOOL_COMPATIBILITY).
# Also a script (tests/test_version_agree.sh): cmake -DFABPOOL_SRC=<tree> -DPROJECT_VERSION=X.Y.Z -P version.cmake
if(CMAKE_SCRIPT_MODE_FILE)
  string(REGEX MATCH "^([0-9]+)\\.([0-9]+)\\.([0-9]+)$" fabpool_v "${PROJECT_VERSION}")
  set(PROJECT_VERSION_MAJOR ${CMAKE_MATCH_1})
  set(PROJECT_VERSION_MINOR ${CMAKE_MATCH_2})
  set(PROJECT_VERSION_PATCH ${CMAKE_MATCH_3})
else()
  set(FABPOOL_SRC ${CMAKE_CURRENT_SOURCE_DIR})
endif()
if(PROJECT_VERSION_MAJOR EQUAL 0)
  set(FABPOOL_SOVERSION ${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR})
  set(FABPOOL_COMPATIBILITY SameMinorVersion)
else()
  set(FABPOOL_SOVERSION ${PROJECT_VERSION_MAJOR})
  set(FABPOOL_COMPATIBILITY SameMajorVersion)
endif()

set(fabpool_src ${FABPOOL_SRC})
string(CONCAT fabpool_bump "a release changes project() in CMakeLists.txt, include/fabpool.h's FABPOOL_VERSION_* "
              "macros, pyproject.toml's version and CHANGELOG.md's heading together")

foreach(part MAJOR MINOR PATCH)
  file(STRINGS ${fabpool_src}/include/fabpool.h fabpool_h_line REGEX "^#define FABPOOL_VERSION_${part} [0-9]+$")
  string(REGEX REPLACE ".* " "" fabpool_h_${part} "${fabpool_h_line}")
  if(NOT fabpool_h_${part} STREQUAL PROJECT_VERSION_${part})
    message(FATAL_ERROR "include/fabpool.h says FABPOOL_VERSION_${part} '${fabpool_h_${part}}', project() says "
                        "${PROJECT_VERSION}: ${fabpool_bump}")
  endif()
endforeach()
file(STRINGS ${fabpool_src}/include/fabpool.h fabpool_h_line REGEX "^#define FABPOOL_VERSION_STRING ")
if(NOT fabpool_h_line STREQUAL "#define FABPOOL_VERSION_STRING \"${PROJECT_VERSION}\"")
  message(FATAL_ERROR "include/fabpool.h's FABPOOL_VERSION_STRING is not \"${PROJECT_VERSION}\" (project()): "
                      "${fabpool_bump}")
endif()

file(STRINGS ${fabpool_src}/pyproject.toml fabpool_py_line REGEX "^version *= *\"")
string(REGEX REPLACE "^version *= *\"([^\"]*)\".*" "\\1" fabpool_py_version "${fabpool_py_line}")
if(NOT fabpool_py_version STREQUAL PROJECT_VERSION)
  message(FATAL_ERROR "pyproject.toml says version \"${fabpool_py_version}\", project() says ${PROJECT_VERSION}: "
                      "${fabpool_bump}")
endif()

file(STRINGS ${fabpool_src}/CHANGELOG.md fabpool_cl_line REGEX "^## ${PROJECT_VERSION}$")
if(NOT fabpool_cl_line)
  message(FATAL_ERROR "CHANGELOG.md has no section '## ${PROJECT_VERSION}' (project()): ${fabpool_bump}")
endif()

# SONAMEs and package versions written down: each must be this version's
string(REPLACE "." "\\." fabpool_so_re "${FABPOOL_SOVERSION}")
string(REPLACE "." "\\." fabpool_mm_re "${PROJECT_VERSION_MAJOR}.${PROJECT_VERSION_MINOR}")
file(GLOB fabpool_version_docs ${fabpool_src}/README.md ${fabpool_src}/docs/*.md
     ${fabpool_src}/tests/install/consumer/CMakeLists.txt)
foreach(f ${fabpool_version_docs})
  file(STRINGS ${f} fabpool_lines REGEX "libfabpool\\.so\\.[0-9]|find_package\\(fabpool [0-9]")
  foreach(l IN LISTS fabpool_lines)
    string(REGEX MATCHALL "libfabpool\\.so\\.[0-9][0-9.]*[0-9]|find_package\\(fabpool [0-9][0-9.]*" found "${l}")
    foreach(m ${found})
      if(m MATCHES "^libfabpool" AND NOT m MATCHES "^libfabpool\\.so\\.${fabpool_so_re}(\\.[0-9]+)?$")
        set(fabpool_bad "${m}")
      elseif(m MATCHES "^find_package" AND NOT m MATCHES "^find_package\\(fabpool ${fabpool_mm_re}(\\.[0-9]+)?$")
        set(fabpool_bad "${m}")
      else()
        set(fabpool_bad "")
      endif()
      if(fabpool_bad)
        file(RELATIVE_PATH rel ${fabpool_src} ${f})
        message(FATAL_ERROR "${rel} says '${fabpool_bad}', but this is fabpool ${PROJECT_VERSION} (SONAME "
                            "libfabpool.so.${FABPOOL_SOVERSION}): write this version's")
      endif()
    endforeach()
  endforeach()
endforeach()
