# Empty compiler generated dependencies file for fabpool.
# This may be replaced when dependencies are built.
