#!/usr/bin/env bash
# The action cache and chaining, each against a baseline in this same run
# (medians of N interleaved runs):
#  1. a cache hit of the hello build (`fhsx build build.toml`, answered from
#     the record: a lookup, a signature check, a presence walk of the
#     output) vs `fhsx store ls OUTPUT` of its output (aim <= 2x);
#  2. the hello example's graph by name (`fhsx build run.toml`: three
#     actions, two toolchain files, all cached) vs the same three actions
#     written with digests, one `fhsx build` each (aim: no measurable
#     difference, ratio ~1);
#  3. a remote cache (BuildGrid's action cache and CAS in memory, started
#     here on loopback): the hello graph pushed by the bench store, then
#     built on a fresh store holding only the action files (wall time,
#     bytes fetched) vs what building it took (the records' wall times,
#     aim <= 1 s); then a 421-action graph pushed, its first pass on a
#     fresh store (every action a remote hit) and a no-op pass after it
#     (aim <= 1 s).
# Usage: bench/cache.sh [N=30]   (runs examples/hello/run.sh first, on a bench store;
#        CACHE_ONLY=local|remote runs one part)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${1:-30}
export FHSX_STORE=$WORK/store
FHSX=$F examples/hello/run.sh >/dev/null 2>&1 || { echo "examples/hello/run.sh failed" >&2; exit 1; }
ex=examples/hello
json() { "$F" --json build "$1" 2>/dev/null; }
out=$(json $ex/build.toml | python3 -c 'import json,sys; print(json.load(sys.stdin)["outputs"]["out"])')

if [ "${CACHE_ONLY:-}" != remote ]; then
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
fi

if [ "${CACHE_ONLY:-}" != local ]; then
  BG=${FHSX_BUILDGRID:-/opt/fhsx-ci/buildgrid}
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  cat >"$WORK/bgd.yml" <<YML
server:
  - !channel
    address: "127.0.0.1:$port"
    insecure-mode: true
authorization:
  method: none
storages:
  - !lru-storage &cas
    size: 2048MB
caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 100000
    allow-updates: true
instances:
  - name: ''
    services:
      - !action-cache
        cache: *ac
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
thread-pool-size: 16
YML
  "$BG/bin/bgd" server start "$WORK/bgd.yml" >"$WORK/bgd.log" 2>&1 &
  bgd=$!
  trap 'kill $bgd 2>/dev/null || true' EXIT
  for _ in $(seq 300); do (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null && break; sleep 0.1; done
  url=grpc://127.0.0.1:$port
  key=$("$F" key show)
  "$F" build "$ex/run.toml" --cache "$url" --cache-push >/dev/null 2>&1
  built=$(for a in fetch build run; do json "$ex/$a.toml"; done | python3 -c '
import json, subprocess, sys
total = 0
for line in sys.stdin:
    rec = json.loads(line)["record"]
    r = json.loads(subprocess.run([sys.argv[1], "--json", "record", "show", rec], capture_output=True, text=True).stdout)
    total += r["record"]["resources"]["wall_ms"]
print(total)' "$F")
  files=$WORK/files; mkdir -p "$files"; cp "$ex"/*.toml "$ex"/fetch.lock "$ex"/*.toolchain "$files"/
  : >"$WORK/remote"; : >"$WORK/bytes"
  for ((k = 0; k < N; k++)); do
    rm -rf "$WORK/fresh"
    FHSX_STORE=$WORK/fresh ms "$F" build "$files/run.toml" --cache "$url" --trust "$key" >>"$WORK/remote"
    find "$WORK/fresh/blobs" "$WORK/fresh/dirs" -type f -printf '%s\n' 2>/dev/null | awk '{s += $1} END {print s + 0}' >>"$WORK/bytes"
  done
  printf 'remote cache: the hello graph on a fresh store from the cache %.1f ms (aim <= 1000), %d bytes fetched (its three records); building it took %d ms\n' \
    "$(median <"$WORK/remote")" "$(median <"$WORK/bytes")" "$built"

  # 421 tiny actions: 400 leaves, 20 joins of 20, a root.
  g=$WORK/g421; mkdir -p "$g"
  "$F" --store "$WORK/g-store" toolchain apt busybox-static -o "$g/busybox.toolchain" >/dev/null 2>&1
  join_graph "$g" '"busybox.toolchain"' 20 20
  n=$(ls "$g"/*.toml | wc -l)
  "$F" --store "$WORK/g-store" build "$g/root.toml" --cache "$url" --cache-push >/dev/null 2>&1
  gkey=$("$F" --store "$WORK/g-store" key show)
  : >"$WORK/first"; : >"$WORK/noop"
  for ((k = 0; k < 5; k++)); do
    rm -rf "$WORK/g-fresh"
    ms "$F" --store "$WORK/g-fresh" build "$g/root.toml" --cache "$url" --trust "$gkey" >>"$WORK/first"
    ms "$F" --store "$WORK/g-fresh" build "$g/root.toml" --cache "$url" --trust "$gkey" >>"$WORK/noop"
  done
  printf 'remote cache: %d actions on a fresh store, every one a remote hit: %.0f ms; the no-op pass after it %.0f ms (aim <= 1000)\n' \
    "$n" "$(median <"$WORK/first")" "$(median <"$WORK/noop")"
fi
