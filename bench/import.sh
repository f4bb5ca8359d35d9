#!/usr/bin/env bash
# Import speed against `cp -a`, re-import against import, and `store verify`
# against `b3sum`, each pair timed in this one run on the same disk.
#
#   bench/import.sh [SRC_DIR…]     (default: /usr/lib/x86_64-linux-gnu /usr/include /usr/share/doc)
#
# Prints each time and each ratio against its aim. Needs: b3sum (apt-get install b3sum).
command -v b3sum >/dev/null || { echo "b3sum missing: apt-get install b3sum" >&2; exit 2; }
SRCS=("$@")
[ ${#SRCS[@]} -gt 0 ] || SRCS=(/usr/lib/x86_64-linux-gnu /usr/include /usr/share/doc)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
# One tree to import: copies of the sources side by side (also warms the page cache).
mkdir -p "$WORK/src"
for s in "${SRCS[@]}"; do cp -a "$s" "$WORK/src/$(echo "$s" | tr / _)"; done
BYTES=$(du -sb "$WORK/src" | cut -f1)
FILES=$(find "$WORK/src" -type f | wc -l)
echo "tree: $FILES files, $((BYTES / 1048576)) MiB"
now() { date +%s.%N; }
t() { local a b; a=$(now); "$@" >/dev/null; b=$(now); echo "$b - $a" | bc -l; }
sync
CP=$(t cp -a "$WORK/src" "$WORK/cp"); sync
IMP=$(t "$F" --store "$WORK/store" store import "$WORK/src"); sync
REIMP=$(t "$F" --store "$WORK/store" store import "$WORK/src")
VER=$(t "$F" --store "$WORK/store" store verify)
B3=$(t sh -c "find '$WORK/store/blobs' -type f -print0 | xargs -0 -P2 -n 256 b3sum --num-threads 1")
printf 'cp -a            %8.3f s\n' "$CP"
printf 'fhsx import      %8.3f s   ratio import/cp      = %.2f  (aim <= 1.5)\n' "$IMP" "$(echo "$IMP / $CP" | bc -l)"
printf 'fhsx re-import   %8.3f s   speedup import/re    = %.2f  (aim >= 3)\n' "$REIMP" "$(echo "$IMP / $REIMP" | bc -l)"
printf 'b3sum (2 procs)  %8.3f s\n' "$B3"
printf 'fhsx verify      %8.3f s   ratio verify/b3sum   = %.2f  (aim ~1)\n' "$VER" "$(echo "$VER / $B3" | bc -l)"
