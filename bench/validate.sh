#!/usr/bin/env bash
# The read-set-validated cache on the hello build, against baselines in this
# same run (medians of N):
#  1. a validated hit — hello's build.toml with one more atom it never
#     reads (a fresh one each run, so each is a validation, not an exact
#     hit): compose the new view, check hello's read set against it, sign
#     a new record — vs the hello build itself (aim: a tiny fraction);
#  2. the same validated hit vs an exact cache hit of build.toml.
# Usage: bench/validate.sh [N=10]   (runs examples/hello/run.sh first, on a bench store)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-10}
cargo build --release -q -p fhsx
F=$PWD/target/release/fhsx
work=$(mktemp -d "${BENCH_DIR:-$PWD/target}/bench-validate.XXXXXX")
trap 'rm -rf "$work"' EXIT
export FHSX_STORE=$work/store
FHSX=$F examples/hello/run.sh >/dev/null 2>&1 || { echo "examples/hello/run.sh failed" >&2; exit 1; }
ex=$PWD/examples/hello
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
t0=${EPOCHREALTIME/./}; "$F" build --rebuild $ex/build.toml >/dev/null 2>&1; t1=${EPOCHREALTIME/./}
built=$((t1 - t0))
: >"$work/valid"; : >"$work/exact"
for ((k = 0; k < N; k++)); do
  mkdir -p "$work/extra-$k/usr/share/bench-extra"
  echo "$k $RANDOM" >"$work/extra-$k/usr/share/bench-extra/never-read"
  sed -e "s|toolchain = \[\"gcc.toolchain\"\]|toolchain = [\"$ex/gcc.toolchain\", \"$work/extra-$k\"]|" \
      -e "s|closure = \[\"fetch.toml#out\"\]|closure = [\"$ex/fetch.toml#out\"]|" $ex/build.toml >"$work/b-$k.toml"
  t0=${EPOCHREALTIME/./}; out=$("$F" --json build "$work/b-$k.toml" 2>/dev/null); t1=${EPOCHREALTIME/./}
  echo "$out" | grep -q '"cached":true' || { echo "not a validated hit: $out" >&2; exit 1; }
  "$F" build $ex/build.toml >/dev/null 2>&1; t2=${EPOCHREALTIME/./}
  echo $((t1 - t0)) >>"$work/valid"; echo $((t2 - t1)) >>"$work/exact"
done
v=$(median <"$work/valid"); e=$(median <"$work/exact")
printf 'validated hit (hello + an unread atom): %.1f ms; the hello build: %.2f s; ratio %.4f\n' \
  "$(echo "$v / 1000" | bc -l)" "$(echo "$built / 1000000" | bc -l)" "$(echo "$v / $built" | bc -l)"
printf 'validated hit vs exact hit (%.1f ms): ratio %.2f\n' "$(echo "$e / 1000" | bc -l)" "$(echo "$v / $e" | bc -l)"
