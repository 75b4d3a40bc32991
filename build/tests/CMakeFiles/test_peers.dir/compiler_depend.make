# Empty compiler generated dependencies file for test_peers.
# This may be replaced when dependencies are built.
