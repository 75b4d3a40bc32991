# Empty dependencies file for test_share.
# This may be replaced when dependencies are built.
