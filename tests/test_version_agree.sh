#!/bin/sh
# test_version_agree.sh <source tree> <cmake> <version>: cmake/version.cmake accepts the tree as it is, and
# refuses, naming the file, a copy of it where one place says another version: fabpool.h's macros,
# pyproject.toml, CHANGELOG.md's heading, a SONAME in the docs, the install test's find_package.
set -u
src=$1 cmake=$2 version=$3
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0
copy() {
  rm -rf "$tmp/t" && mkdir -p "$tmp/t/include" "$tmp/t/docs" "$tmp/t/tests/install/consumer" &&
  cp "$src/include/fabpool.h" "$tmp/t/include/" && cp "$src/pyproject.toml" "$src/CHANGELOG.md" "$src/README.md" "$tmp/t/" &&
  cp "$src"/docs/*.md "$tmp/t/docs/" && cp "$src/tests/install/consumer/CMakeLists.txt" "$tmp/t/tests/install/consumer/"
}
check() {   # check <what> <expected: ok or a word of the message>
  out=$("$cmake" -DFABPOOL_SRC="$tmp/t" -DPROJECT_VERSION="$version" -P "$src/cmake/version.cmake" 2>&1)
  rc=$?
  if [ "$2" = ok ]; then
    [ $rc -eq 0 ] || { echo "FAIL: $1: refused: $out"; fails=$((fails + 1)); }
  elif [ $rc -eq 0 ] || ! printf '%s' "$out" | grep -q "$2"; then
    echo "FAIL: $1: rc $rc, expected a refusal naming '$2': $out"; fails=$((fails + 1))
  fi
}
copy && check "the tree as it is" ok
copy && sed -i 's/^version = "[^"]*"/version = "9.9.9"/' "$tmp/t/pyproject.toml" && check "pyproject.toml" pyproject.toml
copy && sed -i 's/^#define FABPOOL_VERSION_PATCH [0-9]*/#define FABPOOL_VERSION_PATCH 99/' "$tmp/t/include/fabpool.h" &&
  check "FABPOOL_VERSION_PATCH" FABPOOL_VERSION_PATCH
copy && sed -i 's/^#define FABPOOL_VERSION_STRING .*/#define FABPOOL_VERSION_STRING "9.9.9"/' "$tmp/t/include/fabpool.h" &&
  check "FABPOOL_VERSION_STRING" FABPOOL_VERSION_STRING
copy && sed -i "s/^## $version\$/## 9.9.9/" "$tmp/t/CHANGELOG.md" && check "CHANGELOG.md" CHANGELOG.md
copy && echo 'the SONAME is `libfabpool.so.0.1`' >> "$tmp/t/docs/api.md" && check "a SONAME in the docs" docs/api.md
copy && sed -i 's/find_package(fabpool [0-9.]*/find_package(fabpool 0.1/' "$tmp/t/tests/install/consumer/CMakeLists.txt" &&
  check "the consumer's find_package" consumer
echo "test_version_agree: $fails failed"
[ $fails -eq 0 ]
