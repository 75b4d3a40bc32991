# Empty dependencies file for test_conf.
# This may be replaced when dependencies are built.
