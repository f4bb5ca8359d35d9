#!/usr/bin/env bash
# A graph as fast as the machine: `fhsx build -jN` against itself at -j1
# and against the same commands run natively, in this same run.
#
#  scale     a graph of 1,000 tiny busybox actions (900 leaves, 90 joins of
#            ten leaves, 9 of ten joins, a root; each join reads what it
#            joins): built cold at -j1 and -jN on fresh stores (wall per
#            action, and wall x jobs per action: the overhead of each action
#            at -jN against -j1's), then the no-op pass and one changed leaf
#            (its join, their join and the root rebuild), medians of ROUNDS
#            (aims: each <= 0.3 s).
#  pair      two independent actions of 3 s and a join: -j1 against -jN.
#  packages  unmodified upstream packages from Debian bookworm's sources:
#            zlib, and libpng and file linking it (a chain), sed, diffutils,
#            grep, m4, patch, xz-utils, gzip, each `./configure && make &&
#            make install` with `make` without -j (its jobs come from the
#            jobserver), on a toolchain of bookworm's gcc, make and
#            libc6-dev (natively: the host's same packages):
#              fhsx -j1, fhsx -jN (one pool of N tokens),
#              native one after another (`make`, no jobserver: one job),
#              native best: one `make -jN` over a Makefile whose targets
#              are the packages (libpng and file after zlib), every
#              package's `$(MAKE)` sharing its jobserver.
#            Aims: -jN within 1.05x of native best; -j2 >= 1.5x faster
#            than -j1.
# Usage: bench/graph.sh [ROUNDS=5] [JOBS=nproc]   (as root; GRAPH_ONLY=scale|pair|packages)
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
ROUNDS=${1:-5}
J=${2:-$(nproc)}
ONLY=${GRAPH_ONLY:-}
export TMPDIR=$WORK FHSX_SCRATCH_POOL=${FHSX_SCRATCH_POOL:-2}
debs=${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}
ratio() { echo "$1 / $2" | bc -l; }
want() { [ -z "$ONLY" ] || [ "$ONLY" = "$1" ]; }

busybox_atom() { # STORE: busybox-static as an atom there
  "$F" --store "$1" toolchain apt busybox-static --deb-cache "$debs" -o "$WORK/busybox.toolchain" >/dev/null 2>&1
  "$F" --store "$1" store import "$(ls "$debs"/busybox-static_*.deb)" | cut -f1
}

if want scale; then
  g=$WORK/scale; mkdir -p "$g"
  bb=$(busybox_atom "$WORK/scale-store")
  join_graph "$g" "\"$bb\"" 9 10 10   # 900 leaves, 90 joins of 10, 9 of 10, the root
  n=$(ls "$g"/*.toml | wc -l)
  cold() { # JOBS: a fresh store, the same busybox atom
    rm -rf "$WORK/cold-store"; "$F" --store "$WORK/cold-store" store import "$(ls "$debs"/busybox-static_*.deb)" >/dev/null
    ms "$F" --store "$WORK/cold-store" build -j"$1" "$g/root.toml"
  }
  c1=$(cold 1); cj=$(cold "$J")
  printf 'scale: %d actions cold: -j1 %.0f ms (%.1f ms/action), -j%d %.0f ms (%.1f ms/action; x%d slots: %.1f ms of a slot per action, %.2fx -j1'"'"'s)\n' \
    "$n" "$c1" "$(ratio "$c1" "$n")" "$J" "$cj" "$(ratio "$cj" "$n")" "$J" "$(ratio "$cj*$J" "$n")" "$(ratio "$cj*$J" "$c1")"
  "$F" --store "$WORK/scale-store" build -j"$J" "$g/root.toml" >/dev/null 2>&1
  : >"$WORK/noop"; : >"$WORK/leaf"
  for ((k = 0; k < ROUNDS; k++)); do
    ms "$F" --store "$WORK/scale-store" build -j"$J" "$g/root.toml" >>"$WORK/noop"
    tiny_action "$g" l5-5-5.toml "\"$bb\"" "" "mkdir -p \$out/l; echo l5-5-5 round $k > \$out/l/5-5-5"
    ms "$F" --store "$WORK/scale-store" build -j"$J" "$g/root.toml" >>"$WORK/leaf"
  done
  noop=$(median <"$WORK/noop"); leaf=$(median <"$WORK/leaf")
  printf 'scale: no-op pass of %d actions %.0f ms (aim <= 300, %.2fx the aim); one changed leaf %.0f ms (aim <= 300, %.2fx)\n' \
    "$n" "$noop" "$(ratio "$noop" 300)" "$leaf" "$(ratio "$leaf" 300)"
fi

if want pair; then
  p=$WORK/pair; mkdir -p "$p"
  bb=$(busybox_atom "$WORK/pair-store")
  for x in a b; do
    printf '[inputs]\nclosure = ["%s"]\n[run]\ncommand = ["/bin/busybox", "sh", "-c", "sleep 3; mkdir $out; echo %s $R > $out/%s"]\nenv = { R = "0" }\n' "$bb" "$x" "$x" >"$p/$x.toml"
  done
  printf '[inputs]\nclosure = ["%s", "a.toml#out", "b.toml#out"]\n[run]\ncommand = ["/bin/busybox", "sh", "-c", "mkdir $out; cat /a /b > $out/ab"]\n' "$bb" >"$p/join.toml"
  : >"$WORK/p1"; : >"$WORK/pj"
  for ((k = 1; k <= ROUNDS; k++)); do
    sed -i "s/R = \"[0-9a-z]*\"/R = \"s$k\"/" "$p/a.toml" "$p/b.toml"
    ms "$F" --store "$WORK/pair-store" build -j1 "$p/join.toml" >>"$WORK/p1"
    sed -i "s/R = \"[0-9a-z]*\"/R = \"p$k\"/" "$p/a.toml" "$p/b.toml"
    ms "$F" --store "$WORK/pair-store" build -j"$J" "$p/join.toml" >>"$WORK/pj"
  done
  p1=$(median <"$WORK/p1"); pj=$(median <"$WORK/pj")
  printf 'pair: two 3 s actions and a join: -j1 %.0f ms, -j%d %.0f ms, %.2fx faster\n' "$p1" "$J" "$pj" "$(ratio "$p1" "$pj")"
fi

if want packages; then
  pk=$WORK/packages; mkdir -p "$pk" "$WORK/native"
  store=$WORK/pkg-store
  "$F" --store "$store" toolchain apt --essential gcc make libc6-dev --deb-cache "$debs" -o "$pk/gcc.toolchain" >/dev/null 2>&1
  srcdir=${BENCH_SRC:-$PWD/target/bench-src}
  pkgs="zlib libpng1.6 file sed diffutils grep m4 patch xz-utils gzip"
  common="--prefix=/usr --disable-nls --disable-dependency-tracking"
  # What configure gets beyond $common, by package; Z is zlib's prefix.
  flags() {
    case $1 in
      zlib) echo "--prefix=/usr" ;;
      libpng1.6) echo "$common CPPFLAGS=-I\$Z/include LDFLAGS=-L\$Z/lib" ;;
      file) echo "$common --disable-libseccomp --disable-bzlib --disable-xzlib --disable-zstdlib --disable-lzlib CPPFLAGS=-I\$Z/include LDFLAGS=-L\$Z/lib" ;;
      grep) echo "$common --disable-perl-regexp" ;;
      *) echo "$common" ;;
    esac
  }
  for p in $pkgs; do
    tarball=$(examples/hello/fetch-source.sh "$srcdir" "$p" | tail -n 1)
    src=$("$F" --store "$store" store import "$tarball" | cut -f1)
    deps=; z=/usr
    case $p in libpng1.6 | file) deps=', "zlib.toml#out"' ;; esac
    cat >"$pk/$p.toml" <<A
[inputs]
toolchain = ["gcc.toolchain"]
closure = [${deps#, }]
source = "$src"
[run]
command = ["/bin/sh", "-c", "cd */ && Z=$z && ./configure $(flags "$p") >/dev/null && make >/dev/null && make install DESTDIR=\$out >/dev/null"]
workdir = "/build/src"
timeout = "60m"
env = { ROUND = "0" }
A
    rm -rf "$WORK/native-src/$p"; mkdir -p "$WORK/native-src/$p"
    "$F" --store "$store" store export "$src" "$WORK/native-src/$p" >/dev/null
  done
  # The root lists what they installed, on busybox (the toolchain would
  # clash with what they install).
  roots=
  for p in $pkgs; do roots="$roots, \"$p.toml#out\""; done
  bb=$(busybox_atom "$store")
  printf '[inputs]\nclosure = ["%s"%s]\n[run]\ncommand = ["/bin/busybox", "sh", "-c", "mkdir $out && ls /usr/bin > $out/bin"]\n' "$bb" "$roots" >"$pk/all.toml"
  # Natively: the same commands; zlib's prefix is its staged install.
  native_cmd() { # PKG OUT
    local z=$WORK/native/zlib-out/usr
    echo "cd $WORK/native/$1/*/ && Z=$z && ./configure $(flags "$1") >/dev/null && \$(MAKE) >/dev/null && \$(MAKE) install DESTDIR=$2 >/dev/null"
  }
  {
    echo "all: $pkgs"
    echo "libpng1.6 file: zlib"
    for p in $pkgs; do
      printf '%s:\n\t+%s\n' "$p" "$(native_cmd "$p" "$WORK/native/$p-out" | sed 's/\$Z/$$Z/g')"
    done
  } >"$WORK/native.mk"
  fresh_native() { rm -rf "$WORK/native"; mkdir -p "$WORK/native"; for p in $pkgs; do cp -a "$WORK/native-src/$p" "$WORK/native/$p"; done; }
  native_serial() { for p in $pkgs; do MAKE=make sh -c "$(native_cmd "$p" "$WORK/native/$p-out" | sed 's/\$(MAKE)/make/g')" || return; done; }
  native_best() { make -s -j"$J" -f "$WORK/native.mk" all; }
  round() { sed -i "s/ROUND = \"[0-9a-z]*\"/ROUND = \"$1\"/" "$pk"/*.toml; }
  round warm; "$F" --store "$store" build -j"$J" "$pk/all.toml" >/dev/null 2>"$WORK/pkg.err" || { tail -40 "$WORK/pkg.err" >&2; exit 1; }
  round s; s1=$(ms "$F" --store "$store" build -j1 "$pk/all.toml") || { echo "fhsx -j1 failed" >&2; exit 1; }
  fresh_native; ns=$(ms native_serial) || { echo "native serial failed" >&2; exit 1; }
  round p; sj=$(ms "$F" --store "$store" build -j"$J" --trace "$WORK/packages.trace.json" "$pk/all.toml") || { echo "fhsx -j$J failed" >&2; exit 1; }
  fresh_native; nb=$(ms native_best) || { echo "native best failed" >&2; exit 1; }
  printf 'packages (%s; %d cores): fhsx -j1 %.1f s, fhsx -j%d %.1f s (%.2fx faster than -j1, aim >= 1.5); native one after another %.1f s (fhsx -j1 / it: %.3f), native best (one make -j%d) %.1f s (fhsx -j%d / it: %.3f, aim <= 1.05)\n' \
    "$pkgs" "$(nproc)" "$(ratio "$s1" 1000)" "$J" "$(ratio "$sj" 1000)" "$(ratio "$s1" "$sj")" \
    "$(ratio "$ns" 1000)" "$(ratio "$s1" "$ns")" "$J" "$(ratio "$nb" 1000)" "$J" "$(ratio "$sj" "$nb")"
  [ -n "${BENCH_KEEP:-}" ] && echo "trace of the -j$J run: $WORK/packages.trace.json"
fi
