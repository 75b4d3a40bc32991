#!/bin/sh
# insn_count.sh - instructions per allocation + free pair, counted by
# valgrind's cachegrind (Ir) as the difference between two run lengths of
# perf/insn_count.c, so that set-up cancels: fabpool through libfabpool.so
# (the driver of FABPOOL_CUDA_LIBRARY, the simulated one in a build) beside
# glibc's malloc and, where their libraries are installed, jemalloc,
# tcmalloc and mimalloc (preloaded).
#
#   insn_count.sh INSN_COUNT_BINARY [--cases small,rep16k,uniform]
#                 [--allocators fabpool,glibc,jemalloc,tcmalloc,mimalloc]
#                 [--repeat R] [--max-small IR] [--max-uniform IR] [--misses]
#
# Each count is the median of R runs of each length (3 by default; the
# counts are deterministic but for the rare decay tick or lock contention).
# Nothing is timed.  --max-small IR: exit 1 if fabpool's 256-byte pair takes
# more than IR instructions (the ctest entry insn_count_small); --max-uniform
# IR: the same for the uniform mix's pair (insn_count_uniform); exit 77 when
# valgrind is not installed.  --misses counts first-level data cache misses
# a pair instead (cachegrind's cache model: a 48 KiB, 12-way L1 and a 2 MiB,
# 16-way last level, 64-byte lines), the other figure a hot path's time
# depends on where its loop touches many blocks' metadata at random.
set -eu

bin=${1:?usage: insn_count.sh INSN_COUNT_BINARY [options]}
shift
cases=small,rep16k,uniform
allocators=fabpool,glibc,jemalloc,tcmalloc,mimalloc
repeat=3
max_small=
max_uniform=
misses=0
while [ $# -gt 0 ]; do
    case $1 in
        --cases) cases=$2; shift 2 ;;
        --allocators) allocators=$2; shift 2 ;;
        --repeat) repeat=$2; shift 2 ;;
        --max-small) max_small=$2; shift 2 ;;
        --max-uniform) max_uniform=$2; shift 2 ;;
        --misses) misses=1; shift ;;
        *) echo "insn_count.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
if ! command -v valgrind >/dev/null 2>&1; then
    echo "insn_count.sh: valgrind is not installed: nothing counted (apt-get install valgrind)"
    exit 77
fi

libdir=
for d in /usr/lib/x86_64-linux-gnu /usr/lib64 /usr/lib /usr/local/lib; do
    [ -d "$d" ] && libdir="$libdir $d"
done
# the preload of a host allocator: its library, or nothing where it is not installed
find_lib() {
    for d in $libdir; do
        for n in "$@"; do
            [ -e "$d/$n" ] && { echo "$d/$n"; return 0; }
        done
    done
    return 1
}

# Ir of one run: the summary line "I refs: 1,234,567" (or "I   refs:"); with --misses "D1  misses:"
count() {   # allocator-kind preload case n
    kind=$1 pre=$2 c=$3 n=$4
    out=$(if [ -n "$pre" ]; then export LD_PRELOAD="$pre"; fi
          if [ "$misses" = 1 ]; then set -- --cache-sim=yes --D1=49152,12,64 --LL=2097152,16,64; else set -- --cache-sim=no; fi
          valgrind --tool=cachegrind "$@" --cachegrind-out-file=/dev/null "$bin" "$kind" "$c" "$n" 2>&1) || {
        echo "insn_count.sh: $bin $kind $c $n failed:" >&2; echo "$out" >&2; return 1; }
    if [ "$misses" = 1 ]; then
        echo "$out" | sed -n 's/.*D1 *misses: *\([0-9,]*\).*/\1/p' | tr -d , | head -1
    else
        echo "$out" | sed -n 's/.*I *refs: *\([0-9,]*\).*/\1/p' | tr -d , | head -1
    fi
}

median() { tr ' ' '\n' | grep . | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

lengths() {   # case -> "short long"
    case $1 in
        uniform) echo "20000 60000" ;;
        *) echo "20000 120000" ;;
    esac
}

# instructions a pair: (median Ir at long - median Ir at short) / (long - short)
per_pair() {   # kind preload case
    set -- "$1" "$2" "$3" $(lengths "$3")
    a= b=
    i=0
    while [ $i -lt "$repeat" ]; do
        a="$a $(count "$1" "$2" "$3" "$4")" || return 1
        b="$b $(count "$1" "$2" "$3" "$5")" || return 1
        i=$((i + 1))
    done
    ma=$(echo "$a" | median) mb=$(echo "$b" | median)
    echo "$ma $mb $4 $5" | awk '{v = ($2 - $1) / ($4 - $3); if (v < 0.05 && v > -0.05) v = 0; printf "%.1f", v}'
}

printf '%-10s' "case"
cols=
for al in $(echo "$allocators" | tr , ' '); do
    pre=
    case $al in
        fabpool) kind=fabpool ;;
        glibc) kind=malloc ;;
        jemalloc) kind=malloc; pre=$(find_lib libjemalloc.so.2 libjemalloc.so) || continue ;;
        tcmalloc) kind=malloc; pre=$(find_lib libtcmalloc_minimal.so.4 libtcmalloc.so.4) || continue ;;
        mimalloc) kind=malloc; pre=$(find_lib libmimalloc.so.2 libmimalloc.so) || continue ;;
        *) echo "insn_count.sh: unknown allocator $al" >&2; exit 2 ;;
    esac
    cols="$cols $al:$kind:$pre"
    printf ' %12s' "$al"
done
if [ "$misses" = 1 ]; then what="first-level data misses"; else what=instructions; fi
printf ' %s\n' "($what per alloc+free pair; fabpool/x ratios below)"

rc=0
for c in $(echo "$cases" | tr , ' '); do
    printf '%-10s' "$c"
    fab=
    ratios=
    for col in $cols; do
        al=${col%%:*} rest=${col#*:}
        kind=${rest%%:*} pre=${rest#*:}
        v=$(per_pair "$kind" "$pre" "$c") || exit 1
        printf ' %12s' "$v"
        if [ "$al" = fabpool ]; then
            fab=$v
            case $c in small) max=$max_small ;; uniform) max=$max_uniform ;; *) max= ;; esac
            [ "$misses" = 1 ] && max=
            if [ -n "$max" ] && [ "$(echo "$v $max" | awk '{print ($1 > $2)}')" = 1 ]; then
                echo "insn_count.sh: fabpool's $c pair takes $v instructions, more than $max" >&2
                rc=1
            fi
        elif [ -n "$fab" ]; then
            ratios="$ratios $al $(echo "$fab $v" | awk '{if ($2 + 0 > 0) printf "%.2f", $1 / $2; else printf "-"}')"
        fi
    done
    printf '\n'
    [ -n "$ratios" ] && printf '%-10s fabpool/x:%s\n' "" "$ratios"
done
exit $rc
