#!/usr/bin/env bash
# What hashing each toolchain file once per worker (not once per build)
# saves: one compile action (`gcc -O2 -c` of a file including a dozen
# system headers, on the Debian gcc toolchain) sent again and again
# (`--rebuild`: each one runs) to two workers on one store, interleaved:
#   - a worker as it comes (a store file hashed by an earlier build, and
#     unchanged since, is trusted);
#   - the same worker with --hash-every-build (each build hashes every
#     blob it opens at its first open: cc1, as, ld, libc, the headers).
# Prints the medians and their ratio.
# Env: FHSX=/path/to/fhsx (default: build this tree in release), RUNS=20.
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
RUNS=${RUNS:-20}
DEBS=${FHSX_DEB_CACHE:-$PWD/target/tmp/bench-debs}
export TMPDIR=$WORK
PIDS=()
bench_cleanup() {
  for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done
}
# start_worker NAME FLAGS… → sets ADDR (its address); the worker joins PIDS
start_worker() {
  local name=$1
  shift
  "$F" --store "$WORK/w" worker --unix "$WORK/$name.sock" "$@" >"$WORK/$name.out" 2>"$WORK/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 200); do
    ADDR=$(sed -n 's/.*listening on \([^ ]*\) .*/\1/p' "$WORK/$name.out")
    if [ -n "$ADDR" ]; then return 0; fi
    sleep 0.05
  done
  cat "$WORK/$name.err" >&2; echo "worker $name did not come up" >&2; exit 1
}

CS=$WORK/client
"$F" --store "$CS" toolchain apt --essential gcc libc6-dev --deb-cache "$DEBS" -o "$WORK/gcc.toolchain" 2>/dev/null
mkdir -p "$WORK/src"
cat >"$WORK/src/unit.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <errno.h>
#include <unistd.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <signal.h>
#include <time.h>
#include <math.h>
#include <pthread.h>
int main(int argc, char **argv) {
  struct stat st;
  if (argc > 1 && stat(argv[1], &st) == 0) printf("%ld %f\n", (long)st.st_size, sqrt((double)st.st_size));
  return 0;
}
C
cat >"$WORK/cc.toml" <<'A'
[inputs]
toolchain = ["gcc.toolchain"]
source = "src"
[run]
command = ["/bin/sh", "-c", "mkdir $out && gcc -O2 -c /build/src/unit.c -o $out/unit.o"]
A

start_worker shared; shared=$ADDR
start_worker every --hash-every-build; every=$ADDR
# Upload once (both workers share the store), and warm the page cache.
"$F" --store "$CS" build --remote "$shared" "$WORK/cc.toml" >/dev/null
"$F" --store "$CS" build --rebuild --remote "$every" "$WORK/cc.toml" >/dev/null
: >"$WORK/.shared"; : >"$WORK/.every"
for _ in $(seq 1 "$RUNS"); do
  ms "$F" --store "$CS" build --rebuild --remote "$shared" "$WORK/cc.toml" >>"$WORK/.shared"
  ms "$F" --store "$CS" build --rebuild --remote "$every" "$WORK/cc.toml" >>"$WORK/.every"
done
s=$(median %.1f <"$WORK/.shared"); e=$(median %.1f <"$WORK/.every")
echo "compile action through a worker, medians of $RUNS interleaved runs: hashed once per worker ${s} ms, hashed every build ${e} ms"
awk -v a="$s" -v b="$e" 'BEGIN{printf "ratio %.2fx (saved %.1f ms a build)\n", a/b, b-a}'
