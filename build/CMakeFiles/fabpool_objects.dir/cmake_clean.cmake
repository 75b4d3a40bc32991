file(REMOVE_RECURSE
  "CMakeFiles/fabpool_objects.dir/lib/alloc.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/alloc.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/buffer.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/buffer.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/chunk.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/chunk.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/conf.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/conf.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/driver.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/driver.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/error.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/error.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/fdpass.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/fdpass.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/meta.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/meta.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/pool.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/pool.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/share.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/share.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/sizeclass.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/sizeclass.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/slab.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/slab.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/stats.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/stats.c.o.d"
  "CMakeFiles/fabpool_objects.dir/lib/vaspace.c.o"
  "CMakeFiles/fabpool_objects.dir/lib/vaspace.c.o.d"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/fabpool_objects.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
