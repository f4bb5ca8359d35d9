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
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
J=${1:-$(nproc)}
export FHSX_STORE=$WORK/store TMPDIR=$WORK
debs=${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}
"$F" toolchain apt --essential gcc make libc6-dev --deb-cache "$debs" -o "$WORK/gcc.toolchain" 2>/dev/null
tarball=$(examples/hello/fetch-source.sh "${INPUTS:-$PWD/examples/hello/inputs}" busybox | tail -n 1)
src=$("$F" store import "$tarball" | cut -f1)
"$F" store export "$src" "$WORK/native-src" >/dev/null
top=$(ls "$WORK/native-src")
build="cd $top && make defconfig >/dev/null && make -j$J >/dev/null 2>&1 && find . -name '*.o' | wc -l > /build/units && mkdir -p \$out/bin && cp busybox \$out/bin/"
cat > "$WORK/big.toml" <<A
[inputs]
toolchain = ["gcc.toolchain"]
source = "$src"
[run]
command = ["/bin/sh", "-c", "$build"]
workdir = "/build/src"
timeout = "60m"
A
mkdir -p "$WORK/native-out"
native_build() { (cd "$WORK/native-src" && out="$WORK/native-out" sh -c "${build//\/build\/units/$WORK/units}"); }
fhsx_build() { "$F" build --rebuild --opens "$1" "$WORK/big.toml" >"$WORK/fhsx.out" 2>"$WORK/fhsx.err"; }
native=$(ms native_build)
for opens in kernel daemon; do
  sandboxed=$(ms fhsx_build "$opens") || { tail -30 "$WORK/fhsx.err" >&2; exit 1; }
  printf 'busybox build (%s compile units natively, -j%s): fhsx --opens %s %.2f s, native %.2f s, ratio %.3f (aim <= 1.03)\n' \
    "$(tr -d ' ' <"$WORK/units")" "$J" "$opens" "$(echo "$sandboxed / 1000" | bc -l)" "$(echo "$native / 1000" | bc -l)" "$(echo "$sandboxed / $native" | bc -l)"
done
