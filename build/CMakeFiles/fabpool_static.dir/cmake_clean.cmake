file(REMOVE_RECURSE
  "libfabpool.a"
  "libfabpool.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/fabpool_static.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
