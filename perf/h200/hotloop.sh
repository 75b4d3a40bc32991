#!/bin/bash
# hotloop.sh - the 256 B thread-cache hit of several trees in turns (hotloop.c), after compare.sh built them
# in /tmp/cmp-<side> (BASE_DIRS as for compare.sh; the current tree is "cur").  ROUNDS rounds, each tree once a
# round; prints each round and each tree's median.  LOOP=medloop times medium blocks instead (medloop.c: the
# bench's uniform 1 B..64 KiB shape, the median over batches of 32, POLLUTE bytes written between batches).
# Run from the repository root on the GPU machine.
set -u
read -r -a bases <<< "${BASE_DIRS:-.deps/base}"
sides=()
for i in "${!bases[@]}"; do sides+=("base$i"); done
sides+=(cur)
ROUNDS=${ROUNDS:-9}
LOOP=${LOOP:-hotloop}
case $LOOP in
  hotloop) gcc -O2 -Iinclude perf/h200/hotloop.c -o /tmp/hotloop -ldl || exit 1; args=(256 10000000 3) ;;
  medloop) gcc -O2 -Iinclude -Iperf perf/h200/medloop.c perf/shapes.c -o /tmp/medloop -ldl -lm || exit 1
           args=(3 "${POLLUTE:-0}") ;;
  *) echo "hotloop.sh: LOOP is hotloop or medloop" >&2; exit 2 ;;
esac
for i in "${!sides[@]}"; do
  s=${sides[$i]}; src=.; [ "$s" != cur ] && src=${bases[$i]}
  [ -f /tmp/cmp-$s/CMakeCache.txt ] || cmake -S "$src" -B /tmp/cmp-$s -DFABPOOL_TEST_DRIVER=real -DBUILD_TESTING=OFF \
    -DCMAKE_BUILD_TYPE=Release >/dev/null || exit 1
  cmake --build /tmp/cmp-$s -j16 --target fabpool >/dev/null || exit 1
done
declare -A all
for r in $(seq 1 "$ROUNDS"); do
  line="round $r:"
  for s in "${sides[@]}"; do
    v=$(/tmp/$LOOP "$(ls /tmp/cmp-$s/libfabpool.so | head -n 1)" "${args[@]}" | awk '{print $1 == "median" ? $2 : $1}')
    all[$s]="${all[$s]:-} $v"
    line="$line $s $v"
  done
  echo "$line"
done
for s in "${sides[@]}"; do
  echo "$s median $(echo ${all[$s]} | tr ' ' '\n' | sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}') ns $([ "$LOOP" = hotloop ] && echo a pair || echo an operation)"
done
