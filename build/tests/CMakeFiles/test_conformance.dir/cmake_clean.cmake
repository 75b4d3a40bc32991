file(REMOVE_RECURSE
  "CMakeFiles/test_conformance.dir/test_conformance.c.o"
  "CMakeFiles/test_conformance.dir/test_conformance.c.o.d"
  "test_conformance"
  "test_conformance.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/test_conformance.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
