#!/usr/bin/env bash
# Download the test suite's real inputs into DIR (default: examples/hello/inputs):
# a fixed list of .debs (toolchain.txt) with `apt-get download`, busybox-static,
# and GNU hello's upstream tarball (fetch-source.sh). The example itself makes
# its toolchains with `fhsx toolchain apt` instead (see run.sh).
# Idempotent: what is already there is not fetched again.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/inputs}
mkdir -p "$dir/debs" "$dir/src" "$dir/fetch-debs"
(cd "$dir/fetch-debs" && { compgen -G "busybox-static_*.deb" >/dev/null ||
  apt-get download busybox-static 2> >(grep -v 'Download is performed unsandboxed' >&2); })
cd "$dir/debs"
missing=()
while read -r pkg; do
  case "$pkg" in ''|'#'*) continue ;; esac
  compgen -G "${pkg}_*.deb" >/dev/null || missing+=("$pkg")
done < "$here/toolchain.txt"
if [ ${#missing[@]} -gt 0 ]; then
  apt-get download "${missing[@]}" 2> >(grep -v 'Download is performed unsandboxed' >&2) ||
    { echo "apt-get download failed: run 'apt-get update' first" >&2; exit 2; }
fi
"$here/fetch-source.sh" "$dir" >/dev/null
echo "$dir"
