# Empty dependencies file for fabpool_static.
# This may be replaced when dependencies are built.
