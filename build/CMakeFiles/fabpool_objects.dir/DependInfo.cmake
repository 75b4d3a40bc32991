
# Consider dependencies only in project.
set(CMAKE_DEPENDS_IN_PROJECT_ONLY OFF)

# The set of languages for which implicit dependencies are needed:
set(CMAKE_DEPENDS_LANGUAGES
  )

# The set of dependency files which are needed:
set(CMAKE_DEPENDS_DEPENDENCY_FILES
  "/work/main/lib/alloc.c" "CMakeFiles/fabpool_objects.dir/lib/alloc.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/alloc.c.o.d"
  "/work/main/lib/buffer.c" "CMakeFiles/fabpool_objects.dir/lib/buffer.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/buffer.c.o.d"
  "/work/main/lib/chunk.c" "CMakeFiles/fabpool_objects.dir/lib/chunk.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/chunk.c.o.d"
  "/work/main/lib/conf.c" "CMakeFiles/fabpool_objects.dir/lib/conf.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/conf.c.o.d"
  "/work/main/lib/driver.c" "CMakeFiles/fabpool_objects.dir/lib/driver.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/driver.c.o.d"
  "/work/main/lib/error.c" "CMakeFiles/fabpool_objects.dir/lib/error.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/error.c.o.d"
  "/work/main/lib/fdpass.c" "CMakeFiles/fabpool_objects.dir/lib/fdpass.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/fdpass.c.o.d"
  "/work/main/lib/meta.c" "CMakeFiles/fabpool_objects.dir/lib/meta.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/meta.c.o.d"
  "/work/main/lib/pool.c" "CMakeFiles/fabpool_objects.dir/lib/pool.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/pool.c.o.d"
  "/work/main/lib/share.c" "CMakeFiles/fabpool_objects.dir/lib/share.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/share.c.o.d"
  "/work/main/lib/sizeclass.c" "CMakeFiles/fabpool_objects.dir/lib/sizeclass.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/sizeclass.c.o.d"
  "/work/main/lib/slab.c" "CMakeFiles/fabpool_objects.dir/lib/slab.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/slab.c.o.d"
  "/work/main/lib/stats.c" "CMakeFiles/fabpool_objects.dir/lib/stats.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/stats.c.o.d"
  "/work/main/lib/vaspace.c" "CMakeFiles/fabpool_objects.dir/lib/vaspace.c.o" "gcc" "CMakeFiles/fabpool_objects.dir/lib/vaspace.c.o.d"
  )

# Targets to which this target links.
set(CMAKE_TARGET_LINKED_INFO_FILES
  )

# Fortran module output directory.
set(CMAKE_Fortran_TARGET_MODULE_DIR "")
