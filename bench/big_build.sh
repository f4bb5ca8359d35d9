#!/usr/bin/env bash
# A large real C build in fhsx against the same commands natively, in this
# same run: BusyBox 1.35.0 from Debian bookworm's source package (its
# defconfig: several hundred compile units), `make defconfig && make -jN`,
# on the same toolchain (bookworm's gcc, make and libc6-dev: the host's
# packages natively, the same packages imported into the store for fhsx),
# same source tree, same -j. Prints both times, the compile units and the
# ratio (aim <= 1.03), for `fhsx build` as it comes (opens without a
# message to the view's daemon) and with `--opens daemon` (each open a
# message, passthrough: a worker's default). The fhsx time includes what only fhsx does (the
# view, the source's export into the scratch, ingest, signing); native
# starts from the exported tree.
# Usage: bench/big_build.sh [JOBS=nproc]   (as root: apt for the toolchain)
set -euo pipefail
cd "$(dirname "$0")/.."
J=${1:-$(nproc)}
cargo build --release -q -p fhsx
F=$PWD/target/release/fhsx
work=$(mktemp -d "${BENCH_DIR:-$PWD/target}/bench-big.XXXXXX")
chmod o+x "$work"
. bench/unmount.sh
trap 'unmount_under "$work"; rm -rf "$work"' EXIT
export FHSX_STORE=$work/store TMPDIR=$work
debs=${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}
"$F" toolchain apt --essential gcc make libc6-dev --deb-cache "$debs" -o "$work/gcc.toolchain" 2>/dev/null
tarball=$(examples/hello/fetch-source.sh "${INPUTS:-$PWD/examples/hello/inputs}" busybox | tail -n 1)
src=$("$F" store import "$tarball" | cut -f1)
"$F" store export "$src" "$work/native-src" >/dev/null
top=$(ls "$work/native-src")
build="cd $top && make defconfig >/dev/null && make -j$J >/dev/null 2>&1 && find . -name '*.o' | wc -l > /build/units && mkdir -p \$out/bin && cp busybox \$out/bin/"
cat > "$work/big.toml" <<A
[inputs]
toolchain = ["gcc.toolchain"]
source = "$src"
[run]
command = ["/bin/sh", "-c", "$build"]
workdir = "/build/src"
timeout = "60m"
A
mkdir -p "$work/native-out"
ms() { date +%s%N; }
a=$(ms); (cd "$work/native-src" && out="$work/native-out" sh -c "${build//\/build\/units/$work/units}"); b=$(ms)
native=$(( (b - a) / 1000000 ))
for opens in kernel daemon; do
  a=$(ms); "$F" build --rebuild --opens "$opens" "$work/big.toml" >"$work/fhsx.out" 2>"$work/fhsx.err" || { tail -30 "$work/fhsx.err" >&2; exit 1; }; b=$(ms)
  sandboxed=$(( (b - a) / 1000000 ))
  printf 'busybox build (%s compile units natively, -j%s): fhsx --opens %s %.2f s, native %.2f s, ratio %.3f (aim <= 1.03)\n' \
    "$(tr -d ' ' <"$work/units")" "$J" "$opens" "$(echo "$sandboxed / 1000" | bc -l)" "$(echo "$native / 1000" | bc -l)" "$(echo "$sandboxed / $native" | bc -l)"
done
