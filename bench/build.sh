#!/usr/bin/env bash
# fhsx build overheads, each against a native baseline in this same run:
#  1. per-action overhead: an action running `true` (busybox closure) vs a bare
#     `bwrap --unshare-all … true`: median of N runs each, and the difference;
#  2. the hello build in fhsx vs the same `./configure && make` natively on
#     the host's own toolchain, same source, same -j (ROUNDS=3 rounds,
#     taking turns to go first, medians; each round's ratio and that of
#     the totals too).
# Usage: bench/build.sh [N=20]   (needs apt, bwrap, gcc)
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-20}
cargo build --release -q -p fhsx
F=$PWD/target/release/fhsx
work=$(mktemp -d "${BENCH_DIR:-$PWD/target}/bench-build.XXXXXX")
trap 'rm -rf "$work"' EXIT
export FHSX_STORE=$work/store
debs=${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}
"$F" toolchain apt busybox-static --deb-cache "$debs" -o "$work/bb.toolchain" 2>/dev/null
cat > "$work/true.toml" <<A
[inputs]
closure = ["bb.toolchain"]
[run]
command = ["/bin/busybox", "mkdir", "/build/out"]
A
ms() { date +%s%N; }
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
"$F" build "$work/true.toml" >/dev/null 2>&1   # warm: key, composition
# --rebuild: each one really runs (else the cache answers).
for i in $(seq "$N"); do a=$(ms); "$F" build --rebuild "$work/true.toml" >/dev/null 2>&1; b=$(ms); echo $(( (b - a) / 1000 )); done | median > "$work/fhsx_us"
for i in $(seq "$N"); do a=$(ms); bwrap --unshare-all --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib64 /lib64 --symlink usr/lib /lib --proc /proc --dev /dev --tmpfs /tmp --die-with-parent /bin/true; b=$(ms); echo $(( (b - a) / 1000 )); done | median > "$work/bwrap_us"
f=$(cat "$work/fhsx_us"); w=$(cat "$work/bwrap_us")
printf 'action `true`: fhsx build median %.1f ms, bare bwrap median %.1f ms, added %.1f ms (aim <= 30 ms)\n' \
  "$(echo "$f / 1000" | bc -l)" "$(echo "$w / 1000" | bc -l)" "$(echo "($f - $w) / 1000" | bc -l)"

"$F" toolchain apt --essential gcc make libc6-dev --deb-cache "$debs" -o "$work/gcc.toolchain" 2>/dev/null
tarball=$(examples/hello/fetch-source.sh "${INPUTS:-$PWD/examples/hello/inputs}" | tail -n 1)
src=$("$F" store import "$tarball" | cut -f1)
cat > "$work/hello.toml" <<A
[inputs]
toolchain = ["gcc.toolchain"]
source = "$src"
[run]
command = ["/bin/sh", "-c", "cd hello-2.10 && ./configure --prefix=/usr >/dev/null && make -j2 >/dev/null && make install DESTDIR=\$out >/dev/null"]
workdir = "/build/src"
timeout = "20m"
A
"$F" store export "$src" "$work/native-src"
"$F" build "$work/hello.toml" >/dev/null 2>&1   # warm: the toolchain's composition, its pages
# ROUNDS rounds (default 3), native and fhsx taking turns to go first, each
# native build on a fresh copy of the source; medians.
: >"$work/native_us"; : >"$work/fhsx_hello_us"
native_once() {
  rm -rf "$work/ns" "$work/native-out"; cp -a "$work/native-src" "$work/ns"
  a=$(ms); (cd "$work/ns/hello-2.10" && ./configure --prefix=/usr >/dev/null && make -j2 >/dev/null 2>&1 && make install DESTDIR="$work/native-out" >/dev/null); b=$(ms)
  echo $(( (b - a) / 1000 )) >>"$work/native_us"
}
fhsx_once() {
  a=$(ms); "$F" build --rebuild "$work/hello.toml" >/dev/null 2>&1; b=$(ms)
  echo $(( (b - a) / 1000 )) >>"$work/fhsx_hello_us"
}
for k in $(seq "${ROUNDS:-3}"); do
  if ((k % 2)); then native_once; fhsx_once; else fhsx_once; native_once; fi
done
native=$(median <"$work/native_us"); sandboxed=$(median <"$work/fhsx_hello_us")
printf 'hello build, medians of %s rounds: fhsx %.2f s, native %.2f s, ratio %.3f (aim <= 1.03)\n' "${ROUNDS:-3}" \
  "$(echo "$sandboxed / 1000000" | bc -l)" "$(echo "$native / 1000000" | bc -l)" "$(echo "$sandboxed / $native" | bc -l)"
# A native build alone varies by a fifth between rounds on these VMs, so
# each round's ratio and the ratio of the totals are printed too: a
# median of three can land 5-10% off where ten rounds settle.
paste "$work/fhsx_hello_us" "$work/native_us" | awk '
  { r = r sprintf(" %.3f", $1 / $2); f += $1; n += $2 }
  END { printf "hello build, each round (fhsx/native):%s; totals %.3f\n", r, f / n }'
