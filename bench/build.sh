#!/usr/bin/env bash
# fhsx build overheads, each against a native baseline in this same run:
#  1. per-action overhead: an action running `true` (busybox closure) vs a bare
#     `bwrap --unshare-all … true`: median of N runs each, and the difference;
#  2. the hello build in fhsx vs the same `./configure && make` natively on
#     the host's own toolchain, same source, same -j (ROUNDS=3 rounds,
#     taking turns to go first, medians; each round's ratio and that of
#     the totals too).
# Usage: bench/build.sh [N=20]   (needs apt, bwrap, gcc)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
N=${1:-20}
export FHSX_STORE=$WORK/store
debs=${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}
"$F" toolchain apt busybox-static --deb-cache "$debs" -o "$WORK/bb.toolchain" 2>/dev/null
cat > "$WORK/true.toml" <<A
[inputs]
closure = ["bb.toolchain"]
[run]
command = ["/bin/busybox", "mkdir", "/build/out"]
A
"$F" build "$WORK/true.toml" >/dev/null 2>&1   # warm: key, composition
# --rebuild: each one really runs (else the cache answers).
for _ in $(seq "$N"); do ms "$F" build --rebuild "$WORK/true.toml"; done | median > "$WORK/fhsx_ms"
for _ in $(seq "$N"); do ms bwrap --unshare-all --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib64 /lib64 --symlink usr/lib /lib --proc /proc --dev /dev --tmpfs /tmp --die-with-parent /bin/true; done | median > "$WORK/bwrap_ms"
f=$(cat "$WORK/fhsx_ms"); w=$(cat "$WORK/bwrap_ms")
# shellcheck disable=SC2016  # backticks are text
printf 'action `true`: fhsx build median %.1f ms, bare bwrap median %.1f ms, added %.1f ms (aim <= 30 ms)\n' \
  "$f" "$w" "$(echo "$f - $w" | bc -l)"

"$F" toolchain apt --essential gcc make libc6-dev --deb-cache "$debs" -o "$WORK/gcc.toolchain" 2>/dev/null
tarball=$(examples/hello/fetch-source.sh "${INPUTS:-$PWD/examples/hello/inputs}" | tail -n 1)
src=$("$F" store import "$tarball" | cut -f1)
cat > "$WORK/hello.toml" <<A
[inputs]
toolchain = ["gcc.toolchain"]
source = "$src"
[run]
command = ["/bin/sh", "-c", "cd hello-2.10 && ./configure --prefix=/usr >/dev/null && make -j2 >/dev/null && make install DESTDIR=\$out >/dev/null"]
workdir = "/build/src"
timeout = "20m"
A
"$F" store export "$src" "$WORK/native-src"
"$F" build "$WORK/hello.toml" >/dev/null 2>&1   # warm: the toolchain's composition, its pages
# ROUNDS rounds (default 3), native and fhsx taking turns to go first, each
# native build on a fresh copy of the source; medians.
: >"$WORK/native_ms"; : >"$WORK/fhsx_hello_ms"
native_build() { (cd "$WORK/ns/hello-2.10" && ./configure --prefix=/usr && make -j2 && make install DESTDIR="$WORK/native-out"); }
native_once() {
  rm -rf "$WORK/ns" "$WORK/native-out"; cp -a "$WORK/native-src" "$WORK/ns"
  ms native_build >>"$WORK/native_ms"
}
fhsx_once() { ms "$F" build --rebuild "$WORK/hello.toml" >>"$WORK/fhsx_hello_ms"; }
for k in $(seq "${ROUNDS:-3}"); do
  if ((k % 2)); then native_once; fhsx_once; else fhsx_once; native_once; fi
done
native=$(median <"$WORK/native_ms"); sandboxed=$(median <"$WORK/fhsx_hello_ms")
printf 'hello build, medians of %s rounds: fhsx %.2f s, native %.2f s, ratio %.3f (aim <= 1.03)\n' "${ROUNDS:-3}" \
  "$(echo "$sandboxed / 1000" | bc -l)" "$(echo "$native / 1000" | bc -l)" "$(echo "$sandboxed / $native" | bc -l)"
# A native build alone varies by a fifth between rounds on these VMs, so
# each round's ratio and the ratio of the totals are printed too: a
# median of three can land 5-10% off where ten rounds settle.
paste "$WORK/fhsx_hello_ms" "$WORK/native_ms" | awk '
  { r = r sprintf(" %.3f", $1 / $2); f += $1; n += $2 }
  END { printf "hello build, each round (fhsx/native):%s; totals %.3f\n", r, f / n }'
