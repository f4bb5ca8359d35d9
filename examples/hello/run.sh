#!/usr/bin/env bash
# The hello example, end to end, on the default store (or $FHSX_STORE):
# three actions chained by name — fetch.toml → build.toml → run.toml — with
# no digest in any file.
#  1. toolchains from Debian packages, one command each (`fhsx toolchain apt`);
#  2. hello's upstream tarball, served by a loopback stand-in for the GNU
#     mirror on 127.0.0.1:48080, fetched through the proxy in record mode
#     (`--record`, the one impure step), which writes fetch.lock;
#  3. `fhsx build run.toml` with the mirror stopped: it builds what run.toml
#     names first — the fetch (replayed), then hello — then runs the built
#     hello with only its output, libc and busybox;
#  4. the same again: every action is a cache hit, nothing runs;
#  5. `--check` rebuilds hello and compares it bit for bit;
#  6. the signed record verifies.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
FHSX=${FHSX:-$repo/target/release/fhsx}
[ -x "$FHSX" ] || FHSX=$repo/target/debug/fhsx
[ -x "$FHSX" ] || { echo "build fhsx first: cargo build --release" >&2; exit 2; }
cd "$here"
step() { echo "== $*" >&2; }

step "toolchains from Debian packages (resolved by apt, each .deb imported once)"
"$FHSX" toolchain apt --essential gcc make libc6-dev -o gcc.toolchain
"$FHSX" toolchain apt busybox-static -o busybox.toolchain
"$FHSX" toolchain apt libc6 busybox-static -o runtime.toolchain

tarball=$("$here/fetch-source.sh" "${INPUTS:-$here/inputs}" | tail -n 1)
work=$(mktemp -d)
mkdir -p "$work/gnu/hello"
cp "$tarball" "$work/gnu/hello/hello-2.10.tar.gz"
touch -d @1416000000 "$work/gnu/hello/hello-2.10.tar.gz"   # hello 2.10's release day: a stable Last-Modified
python3 -m http.server --bind 127.0.0.1 --directory "$work" 48080 >/dev/null 2>&1 &
mirror=$!
trap 'kill $mirror 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 50); do (exec 3<>/dev/tcp/127.0.0.1/48080) 2>/dev/null && break; sleep 0.1; done

step "fetch.toml, recorded through the proxy (writes fetch.lock)"
"$FHSX" build --record fetch.toml >/dev/null
kill $mirror; wait $mirror 2>/dev/null || true
cat fetch.lock >&2

step "run.toml, mirror stopped: builds fetch.toml (replay) and build.toml first, then runs hello (log on stderr)"
"$FHSX" build run.toml

step "again: every action is answered from the cache"
for a in fetch.toml build.toml run.toml; do
  "$FHSX" --json build "$a" 2>/dev/null | A=$a python3 -c '
import json, os, sys
v = json.load(sys.stdin)
print("%-11s cached=%s record=%s" % (os.environ["A"], v["cached"], v["record"]))
sys.exit(0 if v["cached"] else 1)'
done

step "--check: hello rebuilt and compared bit for bit"
"$FHSX" build --check build.toml

result=$("$FHSX" --json build run.toml 2>/dev/null)
field() { echo "$result" | python3 -c "import json,sys; v=json.load(sys.stdin); print($1)"; }
step "the record of run.toml verifies against this store's key"
"$FHSX" record verify "$(field 'v["record"]')" --trust "$("$FHSX" key show)"
step "what the built hello said (run.toml's output)"
"$FHSX" store cat "$(field 'v["outputs"]["out"]')" greeting
