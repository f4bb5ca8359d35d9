/* What a build can see of its scratch (`probe`), and the traces a build
 * can leave in it for the next one (`litter`, `grow`). Built static by
 * tests/worker.rs and run inside the sandbox as the build user. */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

static int by_name(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static int flags_of(const char *p) {
  int f = -1, fd = open(p, O_RDONLY | O_NONBLOCK);
  if (fd >= 0) {
    if (ioctl(fd, FS_IOC_GETFLAGS, &f) != 0) f = -1;
    close(fd);
  }
  return f;
}

static void say(const char *what, int r) { printf("%s %s\n", what, r == 0 ? "done" : "refused"); }

static int litter(void) {
  /* Hidden, locked away, odd kinds. */
  say("dotdir", mkdir("/build/.hidden", 0700));
  close(creat("/build/.hidden/f", 0600));
  say("locked", mkdir("/build/locked", 0700));
  close(creat("/build/locked/f", 0600));
  say("lock", chmod("/build/locked", 0));
  say("fifo", mkfifo("/build/fifo", 0600));
  say("symlink", symlink("/etc/passwd", "/build/link"));
  /* On /build itself: an xattr, a default ACL (rwx for all, inherited by
   * every new file), inode flags new files inherit, a wide mode. */
  say("xattr", setxattr("/build", "user.fhsx-left", "x", 1, 0));
  struct { uint32_t version; struct { uint16_t tag, perm; uint32_t id; } e[3]; } acl = {
      2, {{0x01, 7, 0xffffffff}, {0x04, 7, 0xffffffff}, {0x20, 7, 0xffffffff}}};
  say("acl", setxattr("/build", "system.posix_acl_default", &acl, sizeof acl, 0));
  int fd = open("/build", O_RDONLY | O_DIRECTORY);
  int f = 0;
  ioctl(fd, FS_IOC_GETFLAGS, &f);
  f |= FS_NOATIME_FL | FS_SYNC_FL | FS_DIRSYNC_FL | FS_NODUMP_FL;
  say("flags", ioctl(fd, FS_IOC_SETFLAGS, &f));
  close(fd);
  say("mode", chmod("/build", 01777));
  /* Times a build chooses, 64 bits of them for the next build to read. */
  struct timespec t[2] = {{.tv_sec = 0x5eed, .tv_nsec = 12345}, {.tv_sec = 0xbeef, .tv_nsec = 678}};
  say("times", utimensat(AT_FDCWD, "/build", t, 0));
  /* Inodes used and freed, so the next file's number would move if the
   * file system did not give the lowest free one back. */
  char p[64];
  for (int i = 0; i < 50; i++) {
    snprintf(p, sizeof p, "/build/used-%02d", i);
    close(creat(p, 0600));
  }
  for (int i = 0; i < 50; i += 2) {
    snprintf(p, sizeof p, "/build/used-%02d", i);
    unlink(p);
  }
  return 0;
}

static int grow(void) {
  /* Enough names that /build's directory outgrows its one block. */
  char p[64];
  for (int i = 0; i < 400; i++) {
    snprintf(p, sizeof p, "/build/grown-%04d", i);
    close(creat(p, 0600));
  }
  return 0;
}

static int probe(void) {
  struct stat st;
  if (stat("/build", &st) != 0) return 1;
  printf("mode %o size %lld nlink %lld mine %d\n", st.st_mode, (long long)st.st_size,
         (long long)st.st_nlink, st.st_uid == getuid());
  printf("flags %x\n", flags_of("/build"));
  printf("atime %lld.%09ld mtime %lld.%09ld\n", (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec,
         (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
  char names[4096];
  printf("xattrs %zd\n", listxattr("/build", names, sizeof names));
  struct statvfs v;
  statvfs("/build", &v);
  printf("free blocks %llu inodes %llu\n", (unsigned long long)v.f_bfree,
         (unsigned long long)v.f_ffree);
  DIR *d = opendir("/build");
  char *e[256];
  int n = 0;
  struct dirent *de;
  while (d && (de = readdir(d)) && n < 256) e[n++] = strdup(de->d_name);
  qsort(e, n, sizeof *e, by_name);
  for (int i = 0; i < n; i++) printf("entry %s\n", e[i]);
  /* What a new file inherits, and which inode it gets: a second later
   * than anything freed before it (ext4 without a journal would skip
   * inodes freed in an earlier second, which is what this would show). */
  sleep(1);
  close(creat("/build/new", 0666));
  stat("/build/new", &st);
  printf("new file mode %o flags %x inode %llu\n", st.st_mode, flags_of("/build/new"),
         (unsigned long long)st.st_ino);
  unlink("/build/new");
  return 0;
}

int main(int argc, char **argv) {
  const char *m = argc > 1 ? argv[1] : "probe";
  if (!strcmp(m, "litter")) return litter();
  if (!strcmp(m, "grow")) return grow();
  return probe();
}
