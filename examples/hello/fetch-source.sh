#!/usr/bin/env bash
# Download GNU hello's pristine upstream tarball (from Debian's source
# package `hello`, through a private apt configuration: the system's
# sources are not touched) into DIR (default: examples/hello/inputs) and
# print its path. Idempotent. `fetch-source.sh DIR PACKAGE` does the same
# for another source package of bookworm (bench/big_build.sh: busybox).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/inputs}/src
pkg=${2:-hello}
mkdir -p "$dir"
cd "$dir"
if ! compgen -G "${pkg}_*.orig.tar.*" >/dev/null; then
  apt_dir=$(mktemp -d)
  trap 'rm -rf "$apt_dir"' EXIT
  mkdir -p "$apt_dir/lists/partial"
  cat > "$apt_dir/debian-src.sources" <<SRC
Types: deb-src
URIs: http://deb.debian.org/debian
Suites: bookworm
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
SRC
  opts=(-o "Dir::Etc::SourceList=/dev/null" -o "Dir::Etc::SourceParts=$apt_dir"
        -o "Dir::State::Lists=$apt_dir/lists" -o "APT::Sandbox::User=root")
  apt-get "${opts[@]}" update -qq
  apt-get "${opts[@]}" source --download-only "$pkg" >/dev/null
  rm -f "${pkg}"_*.dsc "${pkg}"_*.debian.tar.* "${pkg}"_*.asc
fi
compgen -G "$dir/${pkg}_*.orig.tar.*" | head -n 1
