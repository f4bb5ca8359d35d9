#!/usr/bin/env bash
# A real compile with the toolchain served from the view: `gcc -O2 -c` of a C
# file that includes many system headers, run in a chroot of the view (private
# mount namespace, tmpfs /tmp) vs. the same chroot on a native export of the
# same tree, in one run.
#
#   bench/fuse_compile.sh      (root; needs gcc on the host to build the view from)
#
# The view is the host's /usr/bin, /usr/lib/gcc, /usr/lib/x86_64-linux-gnu,
# /usr/lib64 and /usr/include (~1.2 GB) imported as one tree.
# One measurement = UNITS (default 10) gcc runs in one chroot.
# first = first build on a fresh mount (every blob it touches verified);
# warm = best of 5 afterwards on the same mount / the warm native tree.
# Aim: view <= 1.2x native.
# shellcheck source=bench/fuse_common.sh
. "$(dirname "$0")/fuse_common.sh"
command -v gcc >/dev/null || { echo "needs gcc: apt-get install gcc" >&2; exit 2; }
R=$WORK/rootfs
mkdir -p "$R/usr/lib" "$R/tmp" "$R/src"
for d in bin lib/gcc lib/x86_64-linux-gnu lib64 include; do
  cp -al "/usr/$d" "$R/usr/$d" 2>/dev/null || cp -a "/usr/$d" "$R/usr/$d"
done
ln -s usr/bin "$R/bin"; ln -s usr/lib "$R/lib"; ln -s usr/lib64 "$R/lib64"
cat > "$R/src/x.c" <<'C'
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#include <pthread.h>
#include <unistd.h>
#include <fcntl.h>
#include <signal.h>
#include <time.h>
#include <errno.h>
#include <ctype.h>
#include <locale.h>
#include <wchar.h>
#include <dirent.h>
#include <regex.h>
#include <sys/stat.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <zlib.h>
static int cmp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }
int main(int argc, char **argv) {
  qsort(argv, argc, sizeof *argv, cmp);
  for (int i = 0; i < argc; i++) printf("%s %f\n", argv[i], sqrt((double)strlen(argv[i])));
  return 0;
}
C
echo "importing the toolchain view ($(du -sh "$R" | cut -f1))…"
VIEW=$(import "$R")
rm -rf "$R"
"$F" --store "$STORE" store export "$VIEW" "$WORK/native" >/dev/null 2>&1
# One "build": $UNITS compiles of the file, each its own gcc process, in one chroot.
UNITS=${UNITS:-10}
cc_in() { unshare -m sh -c "mount -t tmpfs t '$1/tmp' && exec chroot '$1' /bin/sh -c 'i=0; while [ \$i -lt $UNITS ]; do /usr/bin/gcc -O2 -c /src/x.c -o /tmp/x\$i.o || exit 1; i=\$((i+1)); done'"; }
best5() { local b=999 t; for _ in 1 2 3 4 5; do t=$(tm cc_in "$1"); b=$(awk -v a="$b" -v c="$t" 'BEGIN{print (c<a)?c:a}'); done; echo "$b"; }
cc_in "$WORK/native" || { echo "the compile fails in the native chroot" >&2; exit 1; }
NW=$(best5 "$WORK/native")
serve "$VIEW" "$WORK/mnt"
F1=$(tm cc_in "$WORK/mnt")
cc_in "$WORK/mnt" || { echo "the compile fails in the view" >&2; exit 1; }
FW=$(best5 "$WORK/mnt")
unserve
printf "%s x gcc -O2 -c:\n" "$UNITS"
printf '  native %6.3f s   view first %6.3f s (ratio %s)   view warm %6.3f s (ratio %s, aim <= 1.2)\n' \
  "$NW" "$F1" "$(ratio "$F1" "$NW")" "$FW" "$(ratio "$FW" "$NW")"
