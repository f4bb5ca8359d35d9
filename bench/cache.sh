#!/usr/bin/env bash
# The action cache and chaining, each against a baseline in this same run
# (medians of N interleaved runs):
#  1. a cache hit of the hello build (`fhsx build build.toml`, answered from
#     the record: a lookup, a signature check, a presence walk of the
#     output) vs `fhsx store ls OUTPUT` of its output (aim <= 2x);
#  2. the hello example's graph by name (`fhsx build run.toml`: three
#     actions, two toolchain files, all cached) vs the same three actions
#     written with digests, one `fhsx build` each (aim: no measurable
#     difference, ratio ~1).
# Usage: bench/cache.sh [N=30]   (runs examples/hello/run.sh first, on a bench store)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-30}
cargo build --release -q -p fhsx
F=$PWD/target/release/fhsx
work=$(mktemp -d "${BENCH_DIR:-$PWD/target}/bench-cache.XXXXXX")
trap 'rm -rf "$work"' EXIT
export FHSX_STORE=$work/store
FHSX=$F examples/hello/run.sh >/dev/null 2>&1 || { echo "examples/hello/run.sh failed" >&2; exit 1; }
ex=examples/hello
json() { "$F" --json build "$1" 2>/dev/null; }
out=$(json $ex/build.toml | python3 -c 'import json,sys; print(json.load(sys.stdin)["outputs"]["out"])')

# The same three actions, every input a digest (what the graph resolves to).
python3 - "$ex" "$work" "$F" <<'PY'
import json, os, re, subprocess, sys
ex, work, f = sys.argv[1:4]
def atoms(tc):
    return [l.split('"')[1] for l in open(os.path.join(ex, tc)) if l.startswith("atom = ")]
def outputs(action):
    r = subprocess.run([f, "--json", "build", os.path.join(ex, action)], capture_output=True, text=True, check=True)
    return json.loads(r.stdout)["outputs"]["out"]
def q(ds): return ", ".join('"%s"' % d for d in ds)
for name, subst in [
    ("fetch.toml", {'closure = ["busybox.toolchain"]': "closure = [%s]" % q(atoms("busybox.toolchain"))}),
    ("build.toml", {'closure = ["fetch.toml#out"]': 'closure = ["%s"]' % outputs("fetch.toml"),
                    'toolchain = ["gcc.toolchain"]': "toolchain = [%s]" % q(atoms("gcc.toolchain"))}),
    ("run.toml", {'closure = ["build.toml#out", "runtime.toolchain"]': 'closure = [%s]' % q([outputs("build.toml")] + atoms("runtime.toolchain"))}),
]:
    text = open(os.path.join(ex, name)).read()
    for a, b in subst.items():
        assert a in text, (name, a)
        text = text.replace(a, b)
    text = text.replace('lock = "fetch.lock"', 'lock = "%s"' % os.path.abspath(os.path.join(ex, "fetch.lock")))
    open(os.path.join(work, "d-" + name), "w").write(text)
PY
for a in fetch build run; do
  v=$(json "$work/d-$a.toml"); echo "$v" | grep -q '"cached":true' || { echo "d-$a.toml is not a cache hit: $v" >&2; exit 1; }
done

median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
: >"$work/hit"; : >"$work/ls"; : >"$work/chain"; : >"$work/digests"
for ((k = 0; k < N; k++)); do
  t0=${EPOCHREALTIME/./}; "$F" build $ex/build.toml >/dev/null 2>&1; t1=${EPOCHREALTIME/./}
  "$F" store ls "$out" >/dev/null; t2=${EPOCHREALTIME/./}
  "$F" build $ex/run.toml >/dev/null 2>&1; t3=${EPOCHREALTIME/./}
  for a in fetch build run; do "$F" build "$work/d-$a.toml" >/dev/null 2>&1; done; t4=${EPOCHREALTIME/./}
  echo $((t1 - t0)) >>"$work/hit"; echo $((t2 - t1)) >>"$work/ls"
  echo $((t3 - t2)) >>"$work/chain"; echo $((t4 - t3)) >>"$work/digests"
done
hit=$(median <"$work/hit"); ls=$(median <"$work/ls"); chain=$(median <"$work/chain"); dig=$(median <"$work/digests")
printf 'cache hit of the hello build: %.2f ms; fhsx store ls of its output: %.2f ms; ratio %.2f (aim <= 2)\n' \
  "$(echo "$hit / 1000" | bc -l)" "$(echo "$ls / 1000" | bc -l)" "$(echo "$hit / $ls" | bc -l)"
printf 'graph by name (run.toml, 3 actions cached): %.2f ms; the same 3 actions by digest, one build each: %.2f ms; ratio %.2f (aim ~1)\n' \
  "$(echo "$chain / 1000" | bc -l)" "$(echo "$dig / 1000" | bc -l)" "$(echo "$chain / $dig" | bc -l)"
