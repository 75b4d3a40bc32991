file(REMOVE_RECURSE
  "CMakeFiles/test_conf.dir/__/lib/conf.c.o"
  "CMakeFiles/test_conf.dir/__/lib/conf.c.o.d"
  "CMakeFiles/test_conf.dir/__/lib/error.c.o"
  "CMakeFiles/test_conf.dir/__/lib/error.c.o.d"
  "CMakeFiles/test_conf.dir/test_conf.c.o"
  "CMakeFiles/test_conf.dir/test_conf.c.o.d"
  "test_conf"
  "test_conf.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/test_conf.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
