# Empty dependencies file for fabpool_objects.
# This may be replaced when dependencies are built.
