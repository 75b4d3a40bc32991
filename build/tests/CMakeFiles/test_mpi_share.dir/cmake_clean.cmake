file(REMOVE_RECURSE
  "CMakeFiles/test_mpi_share.dir/test_mpi_share.c.o"
  "CMakeFiles/test_mpi_share.dir/test_mpi_share.c.o.d"
  "test_mpi_share"
  "test_mpi_share.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/test_mpi_share.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
