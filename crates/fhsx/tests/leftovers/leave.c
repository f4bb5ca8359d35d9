/* What a hostile build leaves behind, made from inside the sandbox:
 *
 *   leave chain DIR N      N directories nested below DIR, each made and
 *                          entered relative to the last (no path is ever
 *                          longer than one name), a file at the bottom;
 *                          stops early, saying where, when the file system
 *                          is full.
 *   leave links DIR N      N hard links in DIR (to one file per 60,000).
 *   leave sparse PATH N    a sparse file of N bytes (one byte written).
 *   leave bridge N LEVEL MESSAGE
 *                          N log requests to the RPC bridge (/run/wf.sock);
 *                          `\xNN` in LEVEL and MESSAGE is that byte. The
 *                          first, the last and any refused answer are
 *                          printed as ANSWER <first 80 bytes, escaped>.
 *   leave marks DIR        every mark it can leave on DIR: times, mode,
 *                          an xattr; prints what it could not.
 *   leave observe DIR      prints what a build can observe of DIR and its
 *                          file system, one fact a line.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

static int chain(const char *dir, long n) {
    if (chdir(dir) != 0) { perror(dir); return 1; }
    long i;
    for (i = 0; i < n; i++) {
        if (mkdir("d", 0755) != 0 || chdir("d") != 0) break;
    }
    int fd = open("f", O_CREAT | O_WRONLY, 0644);
    if (fd >= 0) close(fd);
    printf("CHAIN %ld\n", i);
    return 0;
}

static int links(const char *dir, long n) {
    if (chdir(dir) != 0) { perror(dir); return 1; }
    /* A file per 60,000 links: ext4 allows 65,000 to one inode. */
    char name[32], target[32];
    long i;
    for (i = 0; i < n; i++) {
        snprintf(target, sizeof target, "f%ld", i / 60000);
        if (i % 60000 == 0) {
            int fd = open(target, O_CREAT | O_WRONLY, 0644);
            if (fd < 0) break;
            close(fd);
        }
        snprintf(name, sizeof name, "l%ld", i);
        if (link(target, name) != 0) break;
    }
    printf("LINKS %ld\n", i);
    return 0;
}

static int sparse(const char *path, long long n) {
    int fd = open(path, O_CREAT | O_WRONLY, 0644);
    if (fd < 0 || pwrite(fd, "x", 1, n - 1) != 1) { perror(path); return 1; }
    close(fd);
    printf("SPARSE %lld\n", n);
    return 0;
}

static int send_frame(int s, const char *body) {
    uint32_t len = strlen(body);
    unsigned char hdr[4] = {len >> 24, len >> 16, len >> 8, len};
    return write(s, hdr, 4) == 4 && write(s, body, len) == (ssize_t)len ? 0 : -1;
}

/* `\xNN` decoded, then JSON-quoted into out. */
static void json_string(const char *in, char *out, size_t cap) {
    size_t o = 0;
    out[o++] = '"';
    for (const char *p = in; *p && o + 8 < cap; p++) {
        unsigned c = (unsigned char)*p;
        if (p[0] == '\\' && p[1] == 'x' && p[2] && p[3]) {
            char hex[3] = {p[2], p[3], 0};
            c = strtoul(hex, NULL, 16);
            p += 3;
        }
        if (c == '"' || c == '\\') { out[o++] = '\\'; out[o++] = c; }
        else if (c < 0x20) o += snprintf(out + o, cap - o, "\\u%04x", c);
        else out[o++] = c;
    }
    out[o++] = '"';
    out[o] = 0;
}

static int bridge(long n, const char *level, const char *message) {
    static char json[1 << 16], l[4096], m[1 << 15];
    json_string(level, l, sizeof l);
    json_string(message, m, sizeof m);
    snprintf(json, sizeof json, "{\"op\":\"log\",\"level\":%s,\"message\":%s}", l, m);
    int s = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    strcpy(a.sun_path, "/run/wf.sock");
    if (connect(s, (struct sockaddr *)&a, sizeof a) != 0) { perror("connect"); return 1; }
    long sent = 0;
    for (long i = 0; i < n; i++) {
        if (send_frame(s, json) != 0) break;
        unsigned char hdr[4];
        if (read(s, hdr, 4) != 4) break;
        uint32_t len = (uint32_t)hdr[0] << 24 | hdr[1] << 16 | hdr[2] << 8 | hdr[3];
        static char buf[65536];
        if (len >= sizeof buf) break;
        uint32_t got = 0;
        while (got < len) {
            ssize_t k = read(s, buf + got, len - got);
            if (k <= 0) break;
            got += k;
        }
        buf[got] = 0;
        sent++;
        if (i == 0 || i == n - 1 || strstr(buf, "\"error\"")) {
            printf("ANSWER ");
            for (uint32_t j = 0; j < got && j < 80; j++)
                printf(buf[j] >= 0x20 && buf[j] < 0x7f ? "%c" : "\\x%02x", (unsigned char)buf[j]);
            printf("\n");
            if (strstr(buf, "\"error\"")) break;
        }
    }
    printf("SENT %ld\n", sent);
    return 0;
}

static int marks(const char *dir) {
    struct timespec t[2] = {{.tv_sec = 0x5eed, .tv_nsec = 12345}, {.tv_sec = 0xbeef, .tv_nsec = 678}};
    if (utimensat(AT_FDCWD, dir, t, 0) != 0) printf("NOMARK times %s\n", strerror(errno));
    if (chmod(dir, 01777) != 0) printf("NOMARK mode %s\n", strerror(errno));
    if (setxattr(dir, "user.mark", "1", 1, 0) != 0) printf("NOMARK xattr %s\n", strerror(errno));
    char p[4096];
    snprintf(p, sizeof p, "%s/lost+found", dir);
    rmdir(p);
    return 0;
}

static int observe(const char *dir) {
    struct stat st;
    if (stat(dir, &st) != 0) { perror(dir); return 1; }
    printf("mode %o uid %u gid %u nlink %lu size %lld\n", st.st_mode, st.st_uid, st.st_gid,
           (unsigned long)st.st_nlink, (long long)st.st_size);
    printf("atime %lld.%09ld mtime %lld.%09ld\n", (long long)st.st_atim.tv_sec, st.st_atim.tv_nsec,
           (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
    struct statvfs v;
    if (statvfs(dir, &v) == 0)
        printf("bfree %llu bavail %llu ffree %llu\n", (unsigned long long)v.f_bfree,
               (unsigned long long)v.f_bavail, (unsigned long long)v.f_ffree);
    char names[1024];
    ssize_t k = listxattr(dir, names, sizeof names);
    printf("xattrs %zd\n", k);
    char p[4096];
    snprintf(p, sizeof p, "%s/lost+found", dir);
    printf("lost+found %s\n", access(p, F_OK) == 0 ? "yes" : "no");
    return 0;
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    if (argc == 4 && !strcmp(argv[1], "chain")) return chain(argv[2], atol(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "links")) return links(argv[2], atol(argv[3]));
    if (argc == 4 && !strcmp(argv[1], "sparse")) return sparse(argv[2], atoll(argv[3]));
    if (argc == 5 && !strcmp(argv[1], "bridge")) return bridge(atol(argv[2]), argv[3], argv[4]);
    if (argc == 3 && !strcmp(argv[1], "marks")) return marks(argv[2]);
    if (argc == 3 && !strcmp(argv[1], "observe")) return observe(argv[2]);
    fprintf(stderr, "usage: leave chain|links|sparse|bridge|marks|observe ...\n");
    return 2;
}
