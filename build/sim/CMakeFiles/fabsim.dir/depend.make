# Empty dependencies file for fabsim.
# This may be replaced when dependencies are built.
