#!/usr/bin/env bash
# Metadata and small-file work over ~20k files: `find` + `stat` of every file,
# and open+read of every file, on a fresh mount vs. the native export, in one run.
#
#   bench/fuse_meta.sh        (root; FILES=20000 by default)
#
# warm = native dentry/page cache warm, view freshly mounted (store files cached);
# cold = page cache dropped before each run on both sides. Aim: view <= 3x native.
# shellcheck source=bench/fuse_common.sh
. "$(dirname "$0")/fuse_common.sh"
FILES=${FILES:-20000}
python3 - "$WORK/src" "$FILES" <<'PY'
import os, sys
root, n = sys.argv[1], int(sys.argv[2])
per = 100
for i in range(n):
    d = os.path.join(root, "d%03d" % (i // per // 20), "s%02d" % (i // per % 20))
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "f%05d.h" % i), "w") as f:
        f.write(("/* file %d */\n" % i) * (1 + i % 40))
PY
VIEW=$(import "$WORK/src")
"$F" --store "$STORE" store export "$VIEW" "$WORK/native" >/dev/null 2>&1
echo "tree: $(find "$WORK/native" -type f | wc -l) files, $(find "$WORK/native" -type d | wc -l) directories"
findstat() { (cd "$1" && find . -type f -print0 | xargs -0 stat -c '%s %a' >/dev/null); }
openread() { (cd "$1" && find . -type f -print0 | xargs -0 cat >/dev/null); }
# Warm everything the store and native side will need.
"$F" --store "$STORE" store verify >/dev/null 2>&1 || true
findstat "$WORK/native"; openread "$WORK/native"
for work in findstat openread; do
  NW=$(tm $work "$WORK/native")
  serve "$VIEW" "$WORK/mnt"; FW=$(tm $work "$WORK/mnt"); unserve
  drop_caches; NC=$(tm $work "$WORK/native")
  serve "$VIEW" "$WORK/mnt"; drop_caches; FC=$(tm $work "$WORK/mnt"); unserve
  printf '%-9s native warm %6.3f s  view fresh %6.3f s  ratio %5s   |  cold: native %6.3f s  view %6.3f s  ratio %5s  (aim <= 3)\n' \
    "$work" "$NW" "$FW" "$(ratio "$FW" "$NW")" "$NC" "$FC" "$(ratio "$FC" "$NC")"
done
