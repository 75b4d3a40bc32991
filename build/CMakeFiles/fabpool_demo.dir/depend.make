# Empty dependencies file for fabpool_demo.
# This may be replaced when dependencies are built.
