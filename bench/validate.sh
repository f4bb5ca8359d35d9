#!/usr/bin/env bash
# The read-set-validated cache on the hello build, against baselines in this
# same run (medians of N):
#  1. a validated hit — hello's build.toml with one more atom it never
#     reads (a fresh one each run, so each is a validation, not an exact
#     hit): compose the new view, check hello's read set against it, sign
#     a new record — vs the hello build itself (aim: a tiny fraction);
#  2. the same validated hit vs an exact cache hit of build.toml.
# Usage: bench/validate.sh [N=10]   (runs examples/hello/run.sh first, on a bench store)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${1:-10}
export FHSX_STORE=$WORK/store
FHSX=$F examples/hello/run.sh >/dev/null 2>&1 || { echo "examples/hello/run.sh failed" >&2; exit 1; }
ex=$PWD/examples/hello
built=$(ms "$F" build --rebuild "$ex/build.toml")
json_build() { "$F" --json build "$1" >"$WORK/out.json" 2>/dev/null; }
: >"$WORK/valid"; : >"$WORK/exact"
for ((k = 0; k < N; k++)); do
  mkdir -p "$WORK/extra-$k/usr/share/bench-extra"
  echo "$k $RANDOM" >"$WORK/extra-$k/usr/share/bench-extra/never-read"
  sed -e "s|toolchain = \[\"gcc.toolchain\"\]|toolchain = [\"$ex/gcc.toolchain\", \"$WORK/extra-$k\"]|" \
      -e "s|closure = \[\"fetch.toml#out\"\]|closure = [\"$ex/fetch.toml#out\"]|" "$ex/build.toml" >"$WORK/b-$k.toml"
  ms json_build "$WORK/b-$k.toml" >>"$WORK/valid"
  grep -q '"cached":true' "$WORK/out.json" || { echo "not a validated hit: $(cat "$WORK/out.json")" >&2; exit 1; }
  ms "$F" build "$ex/build.toml" >>"$WORK/exact"
done
v=$(median <"$WORK/valid"); e=$(median <"$WORK/exact")
printf 'validated hit (hello + an unread atom): %.1f ms; the hello build: %.2f s; ratio %.4f\n' \
  "$v" "$(echo "$built / 1000" | bc -l)" "$(echo "$v / $built" | bc -l)"
printf 'validated hit vs exact hit (%.1f ms): ratio %.2f\n' "$e" "$(echo "$v / $e" | bc -l)"
