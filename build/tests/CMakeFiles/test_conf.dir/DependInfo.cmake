
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/lib/conf.c" "tests/CMakeFiles/test_conf.dir/__/lib/conf.c.o" "gcc" "tests/CMakeFiles/test_conf.dir/__/lib/conf.c.o.d"
  "/work/main/lib/error.c" "tests/CMakeFiles/test_conf.dir/__/lib/error.c.o" "gcc" "tests/CMakeFiles/test_conf.dir/__/lib/error.c.o.d"
  "/work/main/tests/test_conf.c" "tests/CMakeFiles/test_conf.dir/test_conf.c.o" "gcc" "tests/CMakeFiles/test_conf.dir/test_conf.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
