# Empty dependencies file for test_alloc.
# This may be replaced when dependencies are built.
