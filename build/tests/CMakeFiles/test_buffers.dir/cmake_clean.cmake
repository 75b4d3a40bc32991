file(REMOVE_RECURSE
  "CMakeFiles/test_buffers.dir/test_buffers.c.o"
  "CMakeFiles/test_buffers.dir/test_buffers.c.o.d"
  "test_buffers"
  "test_buffers.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/test_buffers.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
