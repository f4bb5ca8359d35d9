#!/usr/bin/env bash
# Making the hello toolchain, against the by-hand way in this same run:
#  1. `fhsx toolchain apt --essential gcc make libc6-dev` into a fresh store
#     (resolve, download, import each .deb) vs `apt-get download` of the
#     same packages plus one `fhsx store import` per .deb (the loop the
#     tool replaces) — both downloading from the same apt state;
#  2. the same command again with every .deb already imported: it should
#     cost the resolution and a store lookup per package.
# Usage: bench/toolchain.sh   (needs apt and `apt-get update`)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
pkgs=(--essential gcc make libc6-dev)
# Warm apt's own caches and the network path, so both sides start alike.
"$F" --store "$WORK/warm" toolchain apt "${pkgs[@]}" -o "$WORK/warm.toolchain" 2>/dev/null
names=$(sed -n 's/^name = "\(.*\)"/\1/p' "$WORK/warm.toolchain")
t0=${EPOCHREALTIME/./}
"$F" --store "$WORK/s1" toolchain apt "${pkgs[@]}" -o "$WORK/t1.toolchain" 2>/dev/null
t1=${EPOCHREALTIME/./}
mkdir -p "$WORK/debs"
# shellcheck disable=SC2086  # one word per package
(cd "$WORK/debs" && apt-get download -qq $names 2>/dev/null)
for d in "$WORK"/debs/*.deb; do "$F" --store "$WORK/s2" store import "$d" >/dev/null; done
t2=${EPOCHREALTIME/./}
"$F" --store "$WORK/s1" toolchain apt "${pkgs[@]}" -o "$WORK/t3.toolchain" 2>/dev/null
t3=${EPOCHREALTIME/./}
cmp -s "$WORK/t1.toolchain" "$WORK/t3.toolchain" || { echo "the second toolchain file differs" >&2; exit 1; }
n=$(grep -c '^\[\[package\]\]' "$WORK/t1.toolchain")
printf 'toolchain of %d packages from nothing: %.2f s; apt-get download + %d imports: %.2f s; ratio %.2f\n' \
  "$n" "$(echo "($t1 - $t0) / 1000000" | bc -l)" "$n" "$(echo "($t2 - $t1) / 1000000" | bc -l)" "$(echo "($t1 - $t0) / ($t2 - $t1)" | bc -l)"
printf 'again, every .deb imported: %.2f s (%.2f ms per package); ratio to from-nothing %.3f\n' \
  "$(echo "($t3 - $t2) / 1000000" | bc -l)" "$(echo "($t3 - $t2) / 1000 / $n" | bc -l)" "$(echo "($t3 - $t2) / ($t1 - $t0)" | bc -l)"
