#!/usr/bin/env bash
# Download the hello example's inputs into DIR (default: examples/hello/inputs):
# the toolchain's .debs (toolchain.txt) with `apt-get download`, the fetch
# action's tool (busybox-static, for its wget), and GNU
# hello's pristine upstream tarball from Debian's source package `hello`,
# through a private apt configuration (the system's sources are not touched).
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
cd "$dir/src"
if ! compgen -G "hello_2.10.orig.tar.gz" >/dev/null; then
  apt_dir=$(mktemp -d)
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir/lists/partial"
  cat > "$apt_dir/src.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir"
        -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Sandbox::User=root")
  mv "$apt_dir/src.sources" "$apt_dir/debian-src.sources"
  apt-get "${opts[@]}" update -qq
  apt-get "${opts[@]}" source --download-only hello
  rm -f hello_*.dsc hello_*.debian.tar.* hello_*.asc
fi
echo "$dir"
