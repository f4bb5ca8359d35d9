#!/usr/bin/env bash
# Download GNU hello's pristine upstream tarball (from Debian's source
# package `hello`, through a private apt configuration: the system's
# sources are not touched) into DIR (default: examples/hello/inputs) and
# print its path. Idempotent.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
dir=${1:-$here/inputs}/src
mkdir -p "$dir"
cd "$dir"
if ! compgen -G "hello_2.10.orig.tar.gz" >/dev/null; then
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
  apt-get "${opts[@]}" source --download-only hello >/dev/null
  rm -f hello_*.dsc hello_*.debian.tar.* hello_*.asc
fi
echo "$dir/hello_2.10.orig.tar.gz"
