#!/usr/bin/env bash
# Mount + unmount of a large view, timed in-process (no CLI start-up):
# mount until the root is listable, then unmount + read-set collection + store.
#
#   bench/fuse_mount.sh [SRC_DIR]   (root; default SRC_DIR /usr/include, ~10^4 files)
#
# The view is served lazily, so mount time does not grow with the tree.
# Aim: total <= 20 ms.
# shellcheck source=bench/fuse_common.sh
. "$(dirname "$0")/fuse_common.sh"
SRC=${1:-/usr/include}
if [ -z "${MOUNT_CYCLES:-}" ]; then
  cargo build --release -q -p castore-fuse --example mount_cycles
  MOUNT_CYCLES=$PWD/target/release/examples/mount_cycles
fi
VIEW=$(import "$SRC")
echo "view: $SRC ($(find "$SRC" | wc -l) entries) = $VIEW"
mkdir -p "$WORK/mnt"
"$MOUNT_CYCLES" "$STORE" "$VIEW" "$WORK/mnt" "${CYCLES:-20}"
