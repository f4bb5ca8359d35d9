#!/usr/bin/env bash
# Overhead of `fhsx run -- /bin/true` against a bare bwrap with the same
# namespaces and mounts (`bwrap --unshare-all … /bin/true`, no supervisor,
# no RPC bridge, no reaper). Prints both means and their ratio (target <= 1.5).
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
# socket bind, whose socket exists only during a run, and the supervisor).
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

time_loop() { # prints mean milliseconds of N runs of "$@"
  local start end
  for _ in 1 2 3 4 5; do "$@" >/dev/null 2>&1; done # warm up
  start=$(date +%s%N)
  for ((k = 0; k < N; k++)); do "$@" >/dev/null; done
  end=$(date +%s%N)
  echo "scale=3; ($end - $start) / $N / 1000000" | bc
}

if command -v hyperfine >/dev/null; then
  hyperfine -N --warmup 5 --runs "$N" \
    -n bare-bwrap "$(printf '%q ' "${bare[@]}")" \
    -n fhsx-run "$(printf '%q ' "$FHSX" run --workspace "$ws" -- /bin/true)"
fi

cd "$ws"
bare_ms=$(time_loop "${bare[@]}")
fhsx_ms=$(time_loop "$FHSX" run --workspace "$ws" -- /bin/true)
ratio=$(echo "scale=2; $fhsx_ms / $bare_ms" | bc)
echo "bare bwrap:            ${bare_ms} ms/run (n=$N)"
echo "fhsx run -- /bin/true: ${fhsx_ms} ms/run (n=$N)"
echo "ratio:                 ${ratio}x (target <= 1.5x)"
