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
#     time and failures.
# Usage: bench/bounds.sh   (busybox-static via `fhsx toolchain apt`)
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
rss() { # action → "peak_kib wall_s exit"
  /usr/bin/time -f '%M %e %x' -o "$WORK/t" "$F" build --rebuild "$WORK/$1.toml" >/dev/null 2>&1 || true
  tail -1 "$WORK/t"
}
read -r s_kib _ _ <<<"$(rss silent)"
read -r f_kib f_wall f_exit <<<"$(rss flood)"
read -r c_kib c_wall c_exit <<<"$(rss capped)"
read -r p_kib p_wall p_exit <<<"$(rss probe)"
printf 'silent build:            peak RSS %6.1f MiB\n' "$(echo "$s_kib / 1024" | bc -l)"
printf '3 GB log, all kept:      peak RSS %6.1f MiB (+%.1f MiB; aim <= +64), %.1f s, exit %s\n' \
  "$(echo "$f_kib / 1024" | bc -l)" "$(echo "($f_kib - $s_kib) / 1024" | bc -l)" "$f_wall" "$f_exit"
printf '3 GB log, default cap:   peak RSS %6.1f MiB, %.1f s, exit %s (stopped at [limits] log)\n' \
  "$(echo "$c_kib / 1024" | bc -l)" "$c_wall" "$c_exit"
printf '2M absent-path probes:   peak RSS %6.1f MiB (+%.1f MiB, %.0f bytes/entry), %.1f s, exit %s\n' \
  "$(echo "$p_kib / 1024" | bc -l)" "$(echo "($p_kib - $s_kib) / 1024" | bc -l)" "$(echo "($p_kib - $s_kib) * 1024 / 2000000" | bc -l)" "$p_wall" "$p_exit"
t0=${EPOCHREALTIME/./}
fails=0
pids=()
for _ in $(seq 150); do "$F" build --rebuild "$WORK/silent.toml" >/dev/null 2>&1 & pids+=($!); done
for p in "${pids[@]}"; do wait "$p" || fails=$((fails + 1)); done
t1=${EPOCHREALTIME/./}
printf '150 concurrent builds:   %.2f s wall, %d failed\n' "$(echo "($t1 - $t0) / 1000000" | bc -l)" "$fails"
