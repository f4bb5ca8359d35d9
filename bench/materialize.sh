#!/usr/bin/env bash
# Fast-tier materialization against `cp -a` of the same tree, on the same disk
# in this one run (aim: >= 10x faster); each figure best of 3 but cold.
#
#   bench/materialize.sh [SRC_DIR…]   (default: /usr/lib/x86_64-linux-gnu /usr/include /usr/share/doc /usr/bin)
#
# The view is SRC_DIRs imported side by side; "the same tree" for cp -a is that
# view written out by `fhsx store export`. Timed, page cache warm for all:
#   cp -a            a plain copy of the exported tree
#   fast (cold)      first materialization in a fresh store (makes the exec twins)
#   fast (warm)      a second DEST from the same store (twins exist): the steady state
#   fast (no-op)     the same view to the same DEST again
#   cp -al           a hard-link farm of the exported tree by cp: this filesystem's
#                    floor for one link per file, for reference
SRCS=("$@")
[ ${#SRCS[@]} -gt 0 ] || SRCS=(/usr/lib/x86_64-linux-gnu /usr/include /usr/share/doc /usr/bin)
# KEEP=1 keeps the work dir (as BENCH_KEEP=1 does for every bench).
BENCH_KEEP=${BENCH_KEEP:-${KEEP:-}}
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
mkdir -p "$WORK/src"
for s in "${SRCS[@]}"; do cp -a "$s" "$WORK/src/$(echo "$s" | tr / _)"; done
FS=("$F" --store "$WORK/store")
VIEW=$("${FS[@]}" store import "$WORK/src" | cut -f1)
rm -rf "$WORK/src"
"${FS[@]}" store export "$VIEW" "$WORK/tree"
BYTES=$(du -sb "$WORK/tree" | cut -f1)
FILES=$(find "$WORK/tree" -type f | wc -l)
EXECS=$(find "$WORK/tree" -type f -perm -u+x | wc -l)
echo "view $VIEW: $FILES files ($EXECS executable), $((BYTES / 1048576)) MiB"
find "$WORK/tree" "$WORK/store/blobs" -type f -print0 | xargs -0 cat >/dev/null
now() { date +%s.%N; }
t() { local a b; sync; a=$(now); "$@" >/dev/null; b=$(now); echo "$b - $a" | bc -l; }
# Best of 3 (cold: once, it needs a fresh store): this VM's disk is shared
# and single runs vary by 2-4x.
best() { local b=999999 x i; for i in 1 2 3; do x=$(t "$@" "$i"); b=$(echo "if ($x < $b) $x else $b" | bc -l); done; echo "$b"; }
cpa() { cp -a "$WORK/tree" "$WORK/cp$1"; }
cpl() { cp -al "$WORK/tree" "$WORK/cpl$1"; }
warm() { "${FS[@]}" materialize --tier fast "$VIEW" "$WORK/fast2-$1"; }
noop() { "${FS[@]}" materialize --tier fast "$VIEW" "$WORK/fast2-1"; }
check() { "${FS[@]}" materialize --check "$WORK/fast2-1"; }
CP=$(best cpa)
CPL=$(best cpl)
COLD=$(t "${FS[@]}" materialize --tier fast "$VIEW" "$WORK/fast1")
WARM=$(best warm)
NOOP=$(best noop)
CHECK=$(t check)
diff -r --no-dereference "$WORK/tree" "$WORK/fast2-1" >/dev/null || { echo "fast tree differs from the export" >&2; exit 1; }
printf 'cp -a              %8.3f s\n' "$CP"
printf 'fast (cold)        %8.3f s   cp/fast = %6.1fx\n' "$COLD" "$(echo "$CP / $COLD" | bc -l)"
printf 'fast (warm)        %8.3f s   cp/fast = %6.1fx  (aim >= 10)\n' "$WARM" "$(echo "$CP / $WARM" | bc -l)"
printf 'fast (no-op)       %8.3f s   cp/fast = %6.1fx\n' "$NOOP" "$(echo "$CP / $NOOP" | bc -l)"
printf 'cp -al (reference) %8.3f s   cp/cpl  = %6.1fx\n' "$CPL" "$(echo "$CP / $CPL" | bc -l)"
printf 'materialize --check %7.3f s   (re-hashes every file)\n' "$CHECK"
