# Empty dependencies file for fabpool_bench.
# This may be replaced when dependencies are built.
