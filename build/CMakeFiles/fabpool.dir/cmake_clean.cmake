file(REMOVE_RECURSE
  "libfabpool.pdb"
  "libfabpool.so"
  "libfabpool.so.0"
  "libfabpool.so.0.1.0"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/fabpool.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
