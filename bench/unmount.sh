# Shared by the bench scripts whose builds keep their scratch in a $TMPDIR
# of their own: what a build parks there (`fhsx build --scratch-pool`, on
# by default as root) is a mount, which `rm -rf` cannot take. Source it;
# do not run it.
# unmount_under DIR: lazily unmount every mount below DIR, deepest first.
unmount_under() {
  awk -v d="$1/" 'index($5, d) == 1 {print $5}' /proc/self/mountinfo | sort -r |
    while read -r m; do umount -l "$m" 2>/dev/null || true; done
}
