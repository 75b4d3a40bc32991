# Empty dependencies file for test_mpi_share.
# This may be replaced when dependencies are built.
