file(REMOVE_RECURSE
  "CMakeFiles/test_share.dir/test_share.c.o"
  "CMakeFiles/test_share.dir/test_share.c.o.d"
  "test_share"
  "test_share.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/test_share.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
