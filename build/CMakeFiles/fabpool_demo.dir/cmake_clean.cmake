file(REMOVE_RECURSE
  "CMakeFiles/fabpool_demo.dir/examples/demo.c.o"
  "CMakeFiles/fabpool_demo.dir/examples/demo.c.o.d"
  "fabpool_demo"
  "fabpool_demo.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/fabpool_demo.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
