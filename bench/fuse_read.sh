#!/usr/bin/env bash
# Sequential read of a 1 GiB file through the view vs. the same bytes on a
# native directory (`store export` of the same tree), in one run.
#
#   bench/fuse_read.sh        (root; BENCH_DIR picks the scratch disk, default target/)
#
# cold = page cache dropped, fresh mount (includes the once-per-mount digest check);
# warm = read again through the same mount (best of 5; a page-cache read of 1 GiB takes ~50 ms, so single runs are noisy). Aim: cold >= 0.5x, warm >= 0.9x native.
# Rows: passthrough (default) and --no-passthrough (every read served by the daemon).
# shellcheck source=bench/fuse_common.sh
. "$(dirname "$0")/fuse_common.sh"
SIZE_MB=${SIZE_MB:-1024}
mkdir -p "$WORK/src"
head -c "${SIZE_MB}M" /dev/urandom > "$WORK/src/big"
VIEW=$(import "$WORK/src")
rm -rf "$WORK/src"
"$F" --store "$STORE" store export "$VIEW" "$WORK/native" >/dev/null 2>&1
rd() { dd if="$1" of=/dev/null bs=1M 2>/dev/null; }
mbs() { awk -v s="$1" -v m="$SIZE_MB" 'BEGIN{printf "%.0f", m/s}'; }
bestof() { local b=999 t; for _ in 1 2 3 4 5; do t=$(tm rd "$1"); b=$(awk -v a="$b" -v c="$t" 'BEGIN{print (c<a)?c:a}'); done; echo "$b"; }
drop_caches; NC=$(tm rd "$WORK/native/big"); NW=$(bestof "$WORK/native/big")
printf '%-26s cold %6s MB/s   warm %6s MB/s\n' "native" "$(mbs "$NC")" "$(mbs "$NW")"
for mode in passthrough no-passthrough; do
  flags=(); [ "$mode" = no-passthrough ] && flags=(--no-passthrough)
  serve "$VIEW" "$WORK/mnt" "${flags[@]}"
  drop_caches; FC=$(tm rd "$WORK/mnt/big"); FW=$(bestof "$WORK/mnt/big")
  unserve
  printf '%-26s cold %6s MB/s   warm %6s MB/s   ratio cold %s (aim >= 0.5)  warm %s (aim >= 0.9)\n' \
    "view ($mode)" "$(mbs "$FC")" "$(mbs "$FW")" "$(ratio "$NC" "$FC")" "$(ratio "$NW" "$FW")"
done
