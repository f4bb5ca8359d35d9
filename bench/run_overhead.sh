#!/usr/bin/env bash
# Overhead of `fhsx run -- /bin/true` against a bare bwrap with the same
# namespaces and mounts (`bwrap --unshare-all … /bin/true`, no supervisor,
# no RPC bridge, no reaper). Prints both means and their ratio (issue 18: target <= 1.3).
#
# Usage: bench/run_overhead.sh [ITERATIONS]   (default 200)
# Env:   FHSX=path/to/fhsx (default: target/release/fhsx, built if missing)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-200}
FHSX=${FHSX:-target/release/fhsx}
if [[ ! -x $FHSX ]]; then
  cargo build --release -p fhsx >&2
fi
command -v bwrap >/dev/null || { echo "bwrap missing: apt-get install bubblewrap" >&2; exit 1; }
FHSX=$(realpath "$FHSX")

ws=$(mktemp -d)
trap 'rm -rf "$ws"' EXIT

# The bare command: fhsx's own argv minus what only fhsx adds (the RPC
# socket bind, whose socket exists only during a run, the supervisor, the
# seccomp filter passed on an fd).
mapfile -t full < <(cd "$ws" && "$FHSX" run --print-argv -- /bin/true)
bare=()
i=0
while (( i < ${#full[@]} )); do
  a=${full[$i]}
  if [[ $a == --ro-bind && ${full[$((i + 2))]:-} == /run/wf.sock ]]; then
    i=$((i + 3)); continue
  fi
  if [[ $a == --ro-bind && ${full[$((i + 2))]:-} == /run/fhsx/supervisor ]]; then
    i=$((i + 3)); continue
  fi
  if [[ $a == --seccomp ]]; then
    i=$((i + 2)); continue
  fi
  if [[ $a == --setenv && ${full[$((i + 1))]:-} == WF_RPC_SOCK ]]; then
    i=$((i + 3)); continue
  fi
  if [[ $a == -- ]]; then
    bare+=(-- /bin/true); break
  fi
  bare+=("$a"); i=$((i + 1))
done
(( ${#bare[@]} > 3 )) || { echo "could not get the argv from $FHSX run --print-argv" >&2; exit 1; }
"${bare[@]}" || { echo "the bare bwrap command failed: ${bare[*]}" >&2; exit 1; }

# Interleaved: one bare run, one fhsx run, N times, so load drifting on a
# shared machine hits both alike, which goes first taking turns (a
# sandbox's network namespace is freed by the kernel after it exits, and
# whatever runs next pays). Timed with bash's $EPOCHREALTIME (no extra
# process per sample). Reports the median and the mean of each.
cd "$ws"
for _ in 1 2 3 4 5; do "${bare[@]}" >/dev/null; "$FHSX" run --workspace "$ws" -- /bin/true >/dev/null; done
: >"$ws/.bare"; : >"$ws/.fhsx"
for ((k = 0; k < N; k++)); do
  if ((k % 2)); then
    t0=${EPOCHREALTIME/./}; "${bare[@]}" >/dev/null; t1=${EPOCHREALTIME/./}
    "$FHSX" run --workspace "$ws" -- /bin/true >/dev/null; t2=${EPOCHREALTIME/./}
    echo $((t1 - t0)) >>"$ws/.bare"; echo $((t2 - t1)) >>"$ws/.fhsx"
  else
    t0=${EPOCHREALTIME/./}; "$FHSX" run --workspace "$ws" -- /bin/true >/dev/null; t1=${EPOCHREALTIME/./}
    "${bare[@]}" >/dev/null; t2=${EPOCHREALTIME/./}
    echo $((t1 - t0)) >>"$ws/.fhsx"; echo $((t2 - t1)) >>"$ws/.bare"
  fi
done
stats() { sort -n "$1" | awk '{a[NR]=$1; s+=$1} END {printf "%.3f %.3f\n", a[int((NR+1)/2)]/1000, s/NR/1000}'; }
read -r bare_med bare_mean < <(stats "$ws/.bare")
read -r fhsx_med fhsx_mean < <(stats "$ws/.fhsx")
echo "bare bwrap:            median ${bare_med} ms, mean ${bare_mean} ms (n=$N)"
echo "fhsx run -- /bin/true: median ${fhsx_med} ms, mean ${fhsx_mean} ms (n=$N)"
echo "ratio (median):        $(echo "scale=2; $fhsx_med / $bare_med" | bc)x (target <= 1.3x)"
echo "ratio (mean):          $(echo "scale=2; $fhsx_mean / $bare_mean" | bc)x"
