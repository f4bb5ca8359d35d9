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
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${1:-30}
export FHSX_STORE=$WORK/store
FHSX=$F examples/hello/run.sh >/dev/null 2>&1 || { echo "examples/hello/run.sh failed" >&2; exit 1; }
ex=examples/hello
json() { "$F" --json build "$1" 2>/dev/null; }
out=$(json $ex/build.toml | python3 -c 'import json,sys; print(json.load(sys.stdin)["outputs"]["out"])')

# The same three actions, every input a digest (what the graph resolves to).
python3 - "$ex" "$WORK" "$F" <<'PY'
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
  v=$(json "$WORK/d-$a.toml"); echo "$v" | grep -q '"cached":true' || { echo "d-$a.toml is not a cache hit: $v" >&2; exit 1; }
done

by_digest() { local a; for a in fetch build run; do "$F" build "$WORK/d-$a.toml" || return; done; }
: >"$WORK/hit"; : >"$WORK/ls"; : >"$WORK/chain"; : >"$WORK/digests"
for ((k = 0; k < N; k++)); do
  ms "$F" build "$ex/build.toml" >>"$WORK/hit"
  ms "$F" store ls "$out" >>"$WORK/ls"
  ms "$F" build "$ex/run.toml" >>"$WORK/chain"
  ms by_digest >>"$WORK/digests"
done
hit=$(median <"$WORK/hit"); ls=$(median <"$WORK/ls"); chain=$(median <"$WORK/chain"); dig=$(median <"$WORK/digests")
printf 'cache hit of the hello build: %.2f ms; fhsx store ls of its output: %.2f ms; ratio %.2f (aim <= 2)\n' \
  "$hit" "$ls" "$(echo "$hit / $ls" | bc -l)"
printf 'graph by name (run.toml, 3 actions cached): %.2f ms; the same 3 actions by digest, one build each: %.2f ms; ratio %.2f (aim ~1)\n' \
  "$chain" "$dig" "$(echo "$chain / $dig" | bc -l)"
