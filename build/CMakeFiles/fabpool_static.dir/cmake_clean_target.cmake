file(REMOVE_RECURSE
  "libfabpool.a"
)
