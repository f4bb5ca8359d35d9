#!/usr/bin/env bash
# The hello example, end to end, on the default store (or $FHSX_STORE):
#  1. fetch the inputs: the toolchain's .debs and hello's upstream tarball;
#  2. import each .deb as an atom (the toolchain) and the tarball as the source;
#  3. build: hello's own `./configure && make && make install DESTDIR=$out`,
#     no network, in the sandbox, on the composed FHS view;
#  4. verify the signed record, then run the `hello` it built.
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
source=$("$FHSX" store import "$inputs/src/hello_2.10.orig.tar.gz" | cut -f1)

cat > "$work/build.toml" <<ACTION
[inputs]
toolchain = [$toolchain]
source = "$source"
[run]
command = ["/bin/sh", "-c", "cd hello-2.10 && ./configure --prefix=/usr && make -j\$(nproc) && make install DESTDIR=\$out"]
workdir = "/build/src"
timeout = "20m"
[network]
mode = "none"
ACTION

echo "== building (log on stderr)" >&2
"$FHSX" --json build "$work/build.toml" > "$work/result.json"
field() { sed -n "s/.*\"$1\":\"\\([^\"]*\\)\".*/\\1/p" "$work/result.json"; }
record=$(field record)
output=$(field output)
"$FHSX" record verify "$record" --trust "$("$FHSX" key show)"
"$FHSX" store export "$output" "$work/out"
echo "== running the built hello" >&2
"$work/out/out/usr/bin/hello"
echo "record $record" >&2
echo "output $output" >&2
