file(REMOVE_RECURSE
  "CMakeFiles/fabpool_bench.dir/perf/bench.c.o"
  "CMakeFiles/fabpool_bench.dir/perf/bench.c.o.d"
  "fabpool_bench"
  "fabpool_bench.pdb"
)

# Per-language clean rules from dependency scanning.
foreach(lang C)
  include(CMakeFiles/fabpool_bench.dir/cmake_clean_${lang}.cmake OPTIONAL)
endforeach()
