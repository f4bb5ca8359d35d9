#!/usr/bin/env bash
# Reproducibility checks, against baselines in this same run:
#  1. listing a 20,000-entry directory of the view 20 times in a build,
#     shuffled (`--check --vary readdir`) vs sorted (a plain rebuild):
#     the cost of the seeded shuffle (aim ~1);
#  2. `--check --vary all` of hello vs two plain hello builds (aim ~1: one
#     varied rebuild, no bisection when nothing differs).
# Usage: bench/vary.sh   (runs examples/hello/run.sh first, on a bench store)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
export FHSX_STORE=$WORK/store
FHSX=$F examples/hello/run.sh >/dev/null 2>&1 || { echo "examples/hello/run.sh failed" >&2; exit 1; }
ex=$PWD/examples/hello
mkdir -p "$WORK/big/usr/share/big"
(cd "$WORK/big/usr/share/big" && seq -f 'entry-%05g' 20000 | xargs touch)
cat >"$WORK/list.toml" <<A
[inputs]
closure = ["$ex/busybox.toolchain", "$WORK/big"]
[run]
command = ["/bin/busybox", "sh", "-c", "busybox mkdir \$out; for i in \$(busybox seq 20); do busybox find /usr/share/big | busybox wc -l; done > \$out/n"]
A
"$F" build "$WORK/list.toml" >/dev/null 2>&1
# Each timed run counts whether it passes or not (a check may differ).
sorted=0; shuffled=0
for _ in 1 2 3; do
  sorted=$(echo "$sorted + $(ms "$F" build --rebuild "$WORK/list.toml" || true)" | bc -l)
  shuffled=$(echo "$shuffled + $(ms "$F" build --check --vary readdir "$WORK/list.toml" || true)" | bc -l)
done
printf '20 listings of 20k entries: shuffled %.2f s, sorted %.2f s, ratio %.2f\n' \
  "$(echo "$shuffled / 3000" | bc -l)" "$(echo "$sorted / 3000" | bc -l)" "$(echo "$shuffled / $sorted" | bc -l)"
plain=$(echo "$(ms "$F" build --rebuild "$ex/build.toml" || true) + $(ms "$F" build --rebuild "$ex/build.toml" || true)" | bc -l)
varied=$(ms "$F" build --check --vary all "$ex/build.toml" || true)
printf 'hello: --check --vary all %.2f s, two plain builds %.2f s, ratio %.2f\n' \
  "$(echo "$varied / 1000" | bc -l)" "$(echo "$plain / 1000" | bc -l)" "$(echo "$varied / $plain" | bc -l)"
