#!/usr/bin/env bash
# fhsx's own footprint under hostile builds, against a silent build in this
# same run (peak RSS of the `fhsx build` process, GNU time's %M):
#  1. a silent trivial build (the baseline);
#  2. a build that writes 3 GB to stdout with [limits] log = 4 GiB (so all
#     of it streams into the store) — aim: peak RSS <= baseline + 64 MiB;
#  3. the same flood under the default [limits] log (64 MiB): stopped there;
#  4. a build that stats 2,000,000 distinct absent paths (default [limits]
#     reads = 4,000,000), RSS and wall time;
#  5. 150 concurrent `fhsx build --rebuild` of the trivial action: wall
#     time and failures;
#  6. what a build leaves (crates/fhsx/tests/leftovers/leave.c, built
#     static): 2,000,000 entries in one output directory, under the default
#     [limits] output_entries (refused at 2^20) and with room for them,
#     and 1,000,000 (within the default) — aim: peak RSS <= 256 MiB; a 1 GiB sparse file under
#     disk = 64 MiB (refused), with how much the store grew; a 30,000-deep
#     chain left in /build.
# Usage: bench/bounds.sh   (busybox-static via `fhsx toolchain apt`)
#        PARTS=leftovers bench/bounds.sh   (only 6; PARTS=base: only 1-5)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
export FHSX_STORE=$WORK/store TMPDIR=$WORK
"$F" toolchain apt busybox-static -o "$WORK/bb.toolchain" 2>/dev/null
act() { # name script [limits]
  cat >"$WORK/$1.toml" <<A
[inputs]
closure = ["bb.toolchain"]
[run]
command = ["/bin/busybox", "sh", "-c", "busybox mkdir \$out; $2"]
timeout = "30m"
[limits]
${3:-}
A
}
act silent "true"
act flood "busybox dd if=/dev/zero bs=1M count=3000 2>/dev/null" "log = 4294967296"
act capped "busybox dd if=/dev/zero bs=1M count=3000 2>/dev/null"
act probe "i=0; while [ \$i -lt 2000000 ]; do [ -e /usr/absent-\$i ]; i=\$((i+1)); done"
mkdir -p "$WORK/leave-atom/usr/bin"
gcc -static -O1 -o "$WORK/leave-atom/usr/bin/leave" crates/fhsx/tests/leftovers/leave.c
leave=$("$F" store import "$WORK/leave-atom" | cut -f1)
lact() { # name script [limits]: an action with the leave probe
  act "$@"
  sed -i "s|closure = \[\"bb.toolchain\"\]|closure = [\"bb.toolchain\", \"$leave\"]|" "$WORK/$1.toml"
}
lact wide "leave links \$out 2000000"
lact wide_ok "leave links \$out 2000000" "output_entries = 3000000"
lact wide_1m "leave links \$out 1000000"
lact sparse "leave sparse \$out/big 1073741824" "disk = 67108864"
lact deep "busybox mkdir /build/j; leave chain /build/j 30000"
rss() { # action → "peak_kib wall_s exit"
  /usr/bin/time -f '%M %e %x' -o "$WORK/t" "$F" build --rebuild "$WORK/$1.toml" >/dev/null 2>&1 || true
  tail -1 "$WORK/t"
}
want() { [ "${PARTS:-all}" = all ] || [ "${PARTS}" = "$1" ]; }
read -r s_kib _ _ <<<"$(rss silent)"
printf 'silent build:            peak RSS %6.1f MiB\n' "$(echo "$s_kib / 1024" | bc -l)"
if want base; then
read -r f_kib f_wall f_exit <<<"$(rss flood)"
read -r c_kib c_wall c_exit <<<"$(rss capped)"
read -r p_kib p_wall p_exit <<<"$(rss probe)"
printf '3 GB log, all kept:      peak RSS %6.1f MiB (+%.1f MiB; aim <= +64), %.1f s, exit %s\n' \
  "$(echo "$f_kib / 1024" | bc -l)" "$(echo "($f_kib - $s_kib) / 1024" | bc -l)" "$f_wall" "$f_exit"
printf '3 GB log, default cap:   peak RSS %6.1f MiB, %.1f s, exit %s (stopped at [limits] log)\n' \
  "$(echo "$c_kib / 1024" | bc -l)" "$c_wall" "$c_exit"
printf '2M absent-path probes:   peak RSS %6.1f MiB (+%.1f MiB, %.0f bytes/entry), %.1f s, exit %s\n' \
  "$(echo "$p_kib / 1024" | bc -l)" "$(echo "($p_kib - $s_kib) / 1024" | bc -l)" "$(echo "($p_kib - $s_kib) * 1024 / 2000000" | bc -l)" "$p_wall" "$p_exit"
fi
if want leftovers; then
read -r w_kib w_wall w_exit <<<"$(rss wide)"
read -r o_kib o_wall o_exit <<<"$(rss wide_ok)"
read -r m_kib m_wall m_exit <<<"$(rss wide_1m)"
before=$(du -sb "$FHSX_STORE" | cut -f1)
read -r sp_kib sp_wall sp_exit <<<"$(rss sparse)"
after=$(du -sb "$FHSX_STORE" | cut -f1)
read -r d_kib d_wall d_exit <<<"$(rss deep)"
printf '2M entries, refused:     peak RSS %6.1f MiB (aim <= 256), %.1f s, exit %s\n' \
  "$(echo "$w_kib / 1024" | bc -l)" "$w_wall" "$w_exit"
printf '2M entries, imported:    peak RSS %6.1f MiB (aim <= 256), %.1f s, exit %s\n' \
  "$(echo "$o_kib / 1024" | bc -l)" "$o_wall" "$o_exit"
printf '1M entries, imported:    peak RSS %6.1f MiB (aim <= 256), %.1f s, exit %s\n' \
  "$(echo "$m_kib / 1024" | bc -l)" "$m_wall" "$m_exit"
printf '1 GiB sparse, 64 MiB:    peak RSS %6.1f MiB, %.1f s, exit %s, store +%.1f MiB\n' \
  "$(echo "$sp_kib / 1024" | bc -l)" "$sp_wall" "$sp_exit" "$(echo "($after - $before) / 1048576" | bc -l)"
printf '30,000-deep scratch:     peak RSS %6.1f MiB, %.1f s, exit %s\n' \
  "$(echo "$d_kib / 1024" | bc -l)" "$d_wall" "$d_exit"
fi
want base || exit 0
t0=${EPOCHREALTIME/./}
fails=0
pids=()
for _ in $(seq 150); do "$F" build --rebuild "$WORK/silent.toml" >/dev/null 2>&1 & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
t1=${EPOCHREALTIME/./}
printf '150 concurrent builds:   %.2f s wall, %d failed\n' "$(echo "($t1 - $t0) / 1000000" | bc -l)" "$fails"
