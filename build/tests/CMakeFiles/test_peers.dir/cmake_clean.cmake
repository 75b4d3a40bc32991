file(REMOVE_RECURSE
  "CMakeFiles/test_peers.dir/test_peers.c.o"
  "CMakeFiles/test_peers.dir/test_peers.c.o.d"
  "test_peers"
  "test_peers.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/test_peers.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
