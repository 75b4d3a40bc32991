file(REMOVE_RECURSE
  "CMakeFiles/fabsim.dir/sim_core.c.o"
  "CMakeFiles/fabsim.dir/sim_core.c.o.d"
  "CMakeFiles/fabsim.dir/sim_procaddr.c.o"
  "CMakeFiles/fabsim.dir/sim_procaddr.c.o.d"
  "CMakeFiles/fabsim.dir/sim_vmm.c.o"
  "CMakeFiles/fabsim.dir/sim_vmm.c.o.d"
  "libcuda.pdb"
  "libcuda.so"
  "libcuda.so.1"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/fabsim.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
