#!/usr/bin/env bash
# The hello example, end to end, on the default store (or $FHSX_STORE):
#  1. fetch the inputs: the toolchain's .debs, busybox-static (the fetch
#     action's wget) and hello's upstream tarball;
#  2. import each .deb as an atom;
#  3. the *fetch action*: busybox wget downloads hello-2.10.tar.gz from a
#     loopback HTTP server standing in for the GNU mirror, through the fetch
#     proxy in record mode (`--record`, the one impure step), which writes
#     fetch.lock; then the same action in replay mode with the server
#     stopped, which must give the same output;
#  4. the *build action*: hello's own `./configure && make && make install
#     DESTDIR=$out` on the fetched tarball, no network at all;
#  5. verify the signed record, then run the `hello` it built.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
FHSX=${FHSX:-$repo/target/release/fhsx}
[ -x "$FHSX" ] || FHSX=$repo/target/debug/fhsx
[ -x "$FHSX" ] || { echo "build fhsx first: cargo build --release" >&2; exit 2; }
inputs=$("$here/fetch-inputs.sh" "${INPUTS:-$here/inputs}" | tail -n 1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

echo "== importing $(ls "$inputs"/debs/*.deb | wc -l) Debian packages as atoms" >&2
toolchain=$("$FHSX" store import "$inputs"/debs/*.deb | cut -f1 | sed 's/.*/"&"/' | paste -sd, -)
busybox=$("$FHSX" store import "$inputs"/fetch-debs/busybox-static_*.deb | cut -f1)
field() { sed -n "s/.*\"$1\":\"\([^\"]*\)\".*/\\1/p" "$2"; }

# A loopback stand-in for the GNU mirror.
port=${MIRROR_PORT:-48080}
mkdir -p "$work/mirror/gnu/hello"
cp "$inputs/src/hello_2.10.orig.tar.gz" "$work/mirror/gnu/hello/hello-2.10.tar.gz"
touch -d @1416000000 "$work/mirror/gnu/hello/hello-2.10.tar.gz"   # hello 2.10 release day: a stable Last-Modified
python3 -m http.server --bind 127.0.0.1 --directory "$work/mirror" "$port" >/dev/null 2>&1 &
mirror=$!
trap 'kill $mirror 2>/dev/null || true; rm -rf "$work"' EXIT
for _ in $(seq 50); do (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null && break; sleep 0.1; done

fetch_action() {
  cat <<ACTION
[inputs]
closure = ["$busybox"]
[run]
command = ["/bin/busybox", "wget", "-O", "/build/out/hello-2.10.tar.gz", "http://127.0.0.1:$port/gnu/hello/hello-2.10.tar.gz"]
timeout = "5m"
[network]
mode = "$1"
lock = "fetch.lock"
ACTION
}
fetch_action record > "$work/fetch-record.toml"
fetch_action replay > "$work/fetch.toml"
echo "== fetch action, record mode (through the proxy, writes fetch.lock)" >&2
"$FHSX" --json build --record "$work/fetch-record.toml" > "$work/fetch-record.json"
kill $mirror; wait $mirror 2>/dev/null || true
echo "== fetch action, replay mode, mirror stopped" >&2
"$FHSX" --json build "$work/fetch.toml" > "$work/fetch.json"
source=$(field output "$work/fetch.json")
[ "$source" = "$(field output "$work/fetch-record.json")" ] || { echo "replay gave another output" >&2; exit 1; }
cat "$work/fetch.lock" >&2

cat > "$work/build.toml" <<ACTION
[inputs]
toolchain = [$toolchain]
source = "$source"
[run]
command = ["/bin/sh", "-c", "tar xzf out/hello-2.10.tar.gz && cd hello-2.10 && ./configure --prefix=/usr && make -j\$(nproc) && make install DESTDIR=\$out"]
workdir = "/build/src"
timeout = "20m"
[network]
mode = "none"
ACTION

echo "== build action, no network (log on stderr)" >&2
"$FHSX" --json build "$work/build.toml" > "$work/result.json"
record=$(field record "$work/result.json")
output=$(field output "$work/result.json")
"$FHSX" record verify "$record" --trust "$("$FHSX" key show)"
"$FHSX" store export "$output" "$work/out"
echo "== running the built hello" >&2
"$work/out/out/usr/bin/hello"
echo "record $record" >&2
echo "output $output" >&2
