# Empty dependencies file for test_conformance.
# This may be replaced when dependencies are built.
