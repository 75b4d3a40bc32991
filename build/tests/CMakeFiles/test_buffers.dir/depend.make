# Empty dependencies file for test_buffers.
# This may be replaced when dependencies are built.
