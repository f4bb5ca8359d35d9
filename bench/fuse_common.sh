# Shared by bench/fuse_*.sh: bench/lib.sh's preamble (fhsx built, or
# FHSX=/path/to/fhsx; the work dir WORK), a store in it, and serving a view
# with `fhsx mount` in the background. Source it; do not run it.
# shellcheck shell=bash
[ -e /dev/fuse ] || { echo "no /dev/fuse: apt-get install fuse3 (and modprobe fuse)" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root (drop_caches, chroot)" >&2; exit 2; }
# shellcheck source=bench/lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
STORE=$WORK/store
VIEW_PID=
bench_cleanup() {
  if [ -n "$VIEW_PID" ]; then kill -TERM "$VIEW_PID" 2>/dev/null || true; wait "$VIEW_PID" 2>/dev/null || true; fi
}
now() { date +%s%N; }
# secs START END
secs() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.3f", (b-a)/1e9}'; }
# ratio A B  → A/B
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{printf "%.2f", a/b}'; }
# tm CMD… → seconds it took (output discarded)
tm() { local a b; a=$(now); "$@" >/dev/null 2>&1; b=$(now); secs "$a" "$b"; }
drop_caches() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# import DIR → root digest
import() { "$F" --store "$STORE" store import "$1" 2>/dev/null | tail -1 | awk '{print $1}'; }
# serve VIEW MOUNTPOINT [fhsx mount flags…]: mount in the background, wait until it is up.
serve() {
  local view=$1 mp=$2; shift 2
  mkdir -p "$mp"
  "$F" --store "$STORE" mount "$view" "$mp" "$@" >/dev/null 2>"$WORK/mount.err" &
  VIEW_PID=$!
  for _ in $(seq 1 500); do
    grep -q " $(realpath "$mp") .* fhsx-view " /proc/self/mountinfo && return 0
    sleep 0.01
  done
  cat "$WORK/mount.err" >&2; echo "mount did not come up" >&2; exit 1
}
unserve() { kill -TERM "$VIEW_PID"; wait "$VIEW_PID" || true; VIEW_PID=; }
