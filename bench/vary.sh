#!/usr/bin/env bash
# Reproducibility checks, against baselines in this same run:
#  1. listing a 20,000-entry directory of the view 20 times in a build,
#     shuffled (`--check --vary readdir`) vs sorted (a plain rebuild):
#     the cost of the seeded shuffle (aim ~1);
#  2. `--check --vary all` of hello vs two plain hello builds (aim ~1: one
#     varied rebuild, no bisection when nothing differs).
# Usage: bench/vary.sh   (runs examples/hello/run.sh first, on a bench store)
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release -q -p fhsx
F=$PWD/target/release/fhsx
work=$(mktemp -d "${BENCH_DIR:-$PWD/target}/bench-vary.XXXXXX")
trap 'rm -rf "$work"' EXIT
export FHSX_STORE=$work/store
FHSX=$F examples/hello/run.sh >/dev/null 2>&1 || { echo "examples/hello/run.sh failed" >&2; exit 1; }
ex=$PWD/examples/hello
mkdir -p "$work/big/usr/share/big"
(cd "$work/big/usr/share/big" && seq -f 'entry-%05g' 20000 | xargs touch)
cat >"$work/list.toml" <<A
[inputs]
closure = ["$ex/busybox.toolchain", "$work/big"]
[run]
command = ["/bin/busybox", "sh", "-c", "busybox mkdir \$out; for i in \$(busybox seq 20); do busybox find /usr/share/big | busybox wc -l; done > \$out/n"]
A
"$F" build "$work/list.toml" >/dev/null 2>&1
ms() { local t0=${EPOCHREALTIME/./}; "$@" >/dev/null 2>&1 || true; echo $(( ${EPOCHREALTIME/./} - t0 )); }
sorted=0; shuffled=0
for _ in 1 2 3; do
  sorted=$((sorted + $(ms "$F" build --rebuild "$work/list.toml")))
  shuffled=$((shuffled + $(ms "$F" build --check --vary readdir "$work/list.toml")))
done
printf '20 listings of 20k entries: shuffled %.2f s, sorted %.2f s, ratio %.2f\n' \
  "$(echo "$shuffled / 3000000" | bc -l)" "$(echo "$sorted / 3000000" | bc -l)" "$(echo "$shuffled / $sorted" | bc -l)"
plain=$(( $(ms "$F" build --rebuild $ex/build.toml) + $(ms "$F" build --rebuild $ex/build.toml) ))
varied=$(ms "$F" build --check --vary all $ex/build.toml)
printf 'hello: --check --vary all %.2f s, two plain builds %.2f s, ratio %.2f\n' \
  "$(echo "$varied / 1000000" | bc -l)" "$(echo "$plain / 1000000" | bc -l)" "$(echo "$varied / $plain" | bc -l)"
