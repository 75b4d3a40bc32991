#!/bin/sh
# replay_held.sh BUILD - fabpool_replay's peak held for cudaMallocAsync on the simulated driver: a small
# synthetic trace (fabpool_trace_gen) replayed with a sample at every operation; the held peak, read from the
# driver's ledger, must be more than nothing, at least the trace's live peak and within 2 % (plus a 2 MiB
# segment) of it, and equal to the pool's own RESERVED_MEM_HIGH.  fabpool's row is checked the same way, but
# against its mapped_bytes_peak and within 5 %.
set -u
build=$1
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
fails=0
fail() { printf "FAILED: %s\n" "$*"; fails=$((fails + 1)); }
"$build/fabpool_trace_gen" --steps 2 --layers 2 --d-model 256 --tokens 1024 "$tmp/t.trace" >/dev/null || exit 1
"$build/fabpool_replay" "$tmp/t.trace" --allocators fabpool,cudaMallocAsync --sample 1 --json "$tmp/r.json" ||
  fail "fabpool_replay exits $?"
json=$(cat "$tmp/r.json")
live=$(printf '%s' "$json" | sed -n 's/.*"live_peak":\([0-9]*\).*/\1/p')
# field of allocator: its object's text, then the number after "field":
field() {
  printf '%s' "$json" | sed 's/{"allocator":/\n&/g' | grep "^{\"allocator\":\"$1\"" |
    sed -n "s/.*\"$2\":\([0-9]*\).*/\1/p"
}
[ -n "$live" ] && [ "$live" -gt 0 ] || fail "no live peak in the JSON: $json"
for a in cudaMallocAsync:102 fabpool:105; do
  name=${a%%:*} pct=${a#*:}
  held=$(field "$name" held_peak) own=$(field "$name" own_peak)
  echo "$name: peak held $held, own peak $own, the trace's live peak $live"
  [ -n "$held" ] && [ "$held" -gt 0 ] || { fail "$name: peak held is '${held:-missing}'"; continue; }
  [ "$held" -ge "$live" ] || fail "$name: peak held $held is below the live peak $live"
  [ "$held" -le $((live * pct / 100 + 2097152)) ] || fail "$name: peak held $held is more than $pct % of the live peak $live"
  [ "$held" = "$own" ] || fail "$name: peak held $held (the driver's ledger) is not its own peak $own"
done
echo "replay_held: $fails failed"
[ $fails -eq 0 ]
