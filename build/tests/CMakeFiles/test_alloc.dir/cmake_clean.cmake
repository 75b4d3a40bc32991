file(REMOVE_RECURSE
  "CMakeFiles/test_alloc.dir/test_alloc.c.o"
  "CMakeFiles/test_alloc.dir/test_alloc.c.o.d"
  "test_alloc"
  "test_alloc.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/test_alloc.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
