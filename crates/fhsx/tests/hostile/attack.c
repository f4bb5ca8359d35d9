/* Hostile probes run inside `fhsx build` by crates/fhsx/tests/hostile.rs.
 * Built static on the host (`gcc -static`), imported as an atom.
 *
 * Usage: attack NAME[=ARG] ...
 * Each probe prints one or more lines "BLOCKED name: why" or
 * "ESCAPED name: what"; the test fails on any ESCAPED. Exit status 0
 * unless the probe's own setup failed (then 2, "SETUP").
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/keyctl.h>
#include <linux/perf_event.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

static void blocked(const char *n, const char *what, int e) {
    printf("BLOCKED %s: %s: %s (errno=%d)\n", n, what, strerror(e), e);
}
static void escaped(const char *n, const char *what) {
    printf("ESCAPED %s: %s\n", n, what);
}
/* A syscall result: -1 is blocked (with errno), anything else escaped. */
static void expect_fail(const char *n, const char *what, long r) {
    if (r == -1) blocked(n, what, errno);
    else { char b[256]; snprintf(b, sizeof b, "%s returned %ld", what, r); escaped(n, b); }
}

static void p_read(const char *path) {
    int fd = open(path, O_RDONLY);
    if (fd < 0) { blocked("read", path, errno); return; }
    char buf[128] = {0};
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n < 0) { blocked("read", path, errno); return; }
    for (ssize_t i = 0; i < n; i++) if (buf[i] == '\n') buf[i] = ' ';
    char b[512]; snprintf(b, sizeof b, "%s: %s", path, buf);
    escaped("read", b);
}

static void p_write(const char *path) {
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) { blocked("write", path, errno); return; }
    ssize_t n = write(fd, "hostile\n", 8);
    close(fd);
    if (n < 0) { blocked("write", path, errno); return; }
    escaped("write", path);
}

static void p_mkdir(const char *path) {
    expect_fail("mkdir", path, mkdir(path, 0755));
}

static int parse_addr(const char *arg, struct sockaddr_in *sa) {
    char host[64]; int port;
    if (sscanf(arg, "%63[^:]:%d", host, &port) != 2) return -1;
    memset(sa, 0, sizeof *sa);
    sa->sin_family = AF_INET;
    sa->sin_port = htons(port);
    return inet_pton(AF_INET, host, &sa->sin_addr) == 1 ? 0 : -1;
}

static int connect_timeout(int fd, struct sockaddr *sa, socklen_t len) {
    fcntl(fd, F_SETFL, O_NONBLOCK);
    if (connect(fd, sa, len) == 0) return 0;
    if (errno != EINPROGRESS) return -1;
    struct pollfd p = {fd, POLLOUT, 0};
    if (poll(&p, 1, 3000) <= 0) { errno = ETIMEDOUT; return -1; }
    int err = 0; socklen_t l = sizeof err;
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &l);
    if (err) { errno = err; return -1; }
    return 0;
}

static void p_tcp(const char *arg) {
    struct sockaddr_in sa;
    if (parse_addr(arg, &sa)) { printf("SETUP tcp: bad address %s\n", arg); exit(2); }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) { blocked("tcp", arg, errno); return; }
    if (connect_timeout(fd, (struct sockaddr *)&sa, sizeof sa) < 0) blocked("tcp", arg, errno);
    else escaped("tcp", arg);
    close(fd);
}

static void p_dns(const char *ip) {
    /* A real query for example.com A, over UDP to ip:53. */
    static const unsigned char q[] = {0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0,
        7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1};
    struct sockaddr_in sa = {0};
    sa.sin_family = AF_INET; sa.sin_port = htons(53);
    inet_pton(AF_INET, ip, &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_DGRAM, 0);
    if (fd < 0) { blocked("dns", ip, errno); return; }
    if (sendto(fd, q, sizeof q, 0, (struct sockaddr *)&sa, sizeof sa) < 0) { blocked("dns", ip, errno); close(fd); return; }
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 3000) <= 0) { blocked("dns", ip, ETIMEDOUT); close(fd); return; }
    unsigned char r[512];
    if (recv(fd, r, sizeof r, 0) > 0) escaped("dns", ip); else blocked("dns", ip, errno);
    close(fd);
}

static void p_raw(void) {
    int fd = socket(AF_INET, SOCK_RAW, IPPROTO_ICMP);
    expect_fail("raw", "socket(AF_INET, SOCK_RAW)", fd);
    if (fd >= 0) close(fd);
    fd = socket(AF_PACKET, SOCK_RAW, htons(3));
    expect_fail("raw", "socket(AF_PACKET, SOCK_RAW)", fd);
    if (fd >= 0) close(fd);
}

static socklen_t abstract_addr(const char *name, struct sockaddr_un *sa) {
    memset(sa, 0, sizeof *sa);
    sa->sun_family = AF_UNIX;
    size_t n = strlen(name);
    if (n > sizeof sa->sun_path - 1) n = sizeof sa->sun_path - 1;
    memcpy(sa->sun_path + 1, name, n);
    return offsetof(struct sockaddr_un, sun_path) + 1 + n;
}

static void p_abstract(const char *name) {
    struct sockaddr_un sa; socklen_t len = abstract_addr(name, &sa);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (connect(fd, (struct sockaddr *)&sa, len) < 0) blocked("abstract", name, errno);
    else {
        /* If it connects, try to receive an fd (the CVE-2024-27297 class). */
        char c; char ctl[CMSG_SPACE(sizeof(int))];
        struct iovec io = {&c, 1};
        struct msghdr m = {0}; m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
        struct pollfd p = {fd, POLLIN, 0};
        char b[256];
        if (poll(&p, 1, 3000) > 0 && recvmsg(fd, &m, 0) > 0 && CMSG_FIRSTHDR(&m)) {
            snprintf(b, sizeof b, "%s: connected and received an fd", name);
        } else snprintf(b, sizeof b, "%s: connected", name);
        escaped("abstract", b);
    }
    close(fd);
}

/* Listen on an abstract socket and hand an fd of our scratch to whoever
 * connects, for up to `secs` seconds. */
static void p_fdleak_listen(const char *arg) {
    char name[100]; int secs = 60;
    if (sscanf(arg, "%99[^,],%d", name, &secs) < 1) { printf("SETUP fdleak\n"); exit(2); }
    struct sockaddr_un sa; socklen_t len = abstract_addr(name, &sa);
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    if (bind(fd, (struct sockaddr *)&sa, len) < 0 || listen(fd, 8) < 0) { blocked("fdleak-listen", "bind", errno); return; }
    printf("LISTENING %s\n", name); fflush(stdout);
    struct pollfd p = {fd, POLLIN, 0};
    int got = poll(&p, 1, secs * 1000);
    if (got > 0) {
        int c = accept(fd, NULL, NULL);
        int dir = open("/build", O_RDONLY | O_DIRECTORY);
        char x = 'x'; char ctl[CMSG_SPACE(sizeof(int))] = {0};
        struct iovec io = {&x, 1};
        struct msghdr m = {0}; m.msg_iov = &io; m.msg_iovlen = 1; m.msg_control = ctl; m.msg_controllen = sizeof ctl;
        struct cmsghdr *h = CMSG_FIRSTHDR(&m);
        h->cmsg_level = SOL_SOCKET; h->cmsg_type = SCM_RIGHTS; h->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(h), &dir, sizeof dir);
        sendmsg(c, &m, 0);
        escaped("fdleak-listen", "another build connected and was sent an fd");
    } else printf("NOBODY-CAME %s\n", name);
    fflush(stdout);
    close(fd);
}

static void p_tty(void) {
    char c = 'x';
    int sub = 2; /* TIOCL_SETSEL-ish selector byte */
    int fds[3] = {0, 1, 2};
    for (int i = 0; i < 3; i++) {
        char w[64];
        snprintf(w, sizeof w, "ioctl(%d, TIOCSTI)", fds[i]);
        expect_fail("tiocsti", w, ioctl(fds[i], TIOCSTI, &c));
        snprintf(w, sizeof w, "ioctl(%d, TIOCSTI|1<<32)", fds[i]);
        expect_fail("tiocsti", w, syscall(SYS_ioctl, fds[i], (unsigned long)TIOCSTI | (1UL << 32), &c));
        snprintf(w, sizeof w, "ioctl(%d, TIOCLINUX)", fds[i]);
        expect_fail("tioclinux", w, ioctl(fds[i], TIOCLINUX, &sub));
    }
    int t = open("/dev/tty", O_RDWR);
    if (t < 0) blocked("tiocsti", "open /dev/tty", errno);
    else {
        expect_fail("tiocsti", "ioctl(/dev/tty, TIOCSTI)", ioctl(t, TIOCSTI, &c));
        close(t);
    }
    /* A terminal of our own: TIOCSTI into it is still refused. */
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m >= 0 && grantpt(m) == 0 && unlockpt(m) == 0) {
        int s = open(ptsname(m), O_RDWR);
        if (s >= 0) {
            expect_fail("tiocsti", "ioctl(own pty, TIOCSTI)", ioctl(s, TIOCSTI, &c));
            close(s);
        }
    }
    if (m >= 0) close(m);
}

static void p_keys(void) {
    expect_fail("keyctl", "add_key(user, session)", syscall(SYS_add_key, "user", "fhsx-hostile", "secret", 6, KEY_SPEC_SESSION_KEYRING));
    expect_fail("keyctl", "add_key(user, user keyring)", syscall(SYS_add_key, "user", "fhsx-hostile", "secret", 6, KEY_SPEC_USER_KEYRING));
    expect_fail("keyctl", "request_key(user)", syscall(SYS_request_key, "user", "fhsx-hostile", NULL, KEY_SPEC_SESSION_KEYRING));
    expect_fail("keyctl", "keyctl(GET_KEYRING_ID, user)", syscall(SYS_keyctl, KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0));
    expect_fail("keyctl", "keyctl(JOIN_SESSION_KEYRING, named)", syscall(SYS_keyctl, KEYCTL_JOIN_SESSION_KEYRING, "_ses.host"));
}

static void p_perf(void) {
    struct perf_event_attr a = {0};
    a.size = sizeof a; a.type = PERF_TYPE_SOFTWARE; a.config = PERF_COUNT_SW_CPU_CLOCK;
    a.exclude_kernel = 1; a.exclude_hv = 1;
    long fd = syscall(SYS_perf_event_open, &a, 0, -1, -1, 0);
    expect_fail("perf", "perf_event_open(self, sw clock)", fd);
    a.type = PERF_TYPE_HARDWARE; a.config = PERF_COUNT_HW_CPU_CYCLES;
    fd = syscall(SYS_perf_event_open, &a, -1, 0, -1, 0);
    expect_fail("perf", "perf_event_open(all processes, cpu 0)", fd);
}

static void p_ptrace(void) {
    expect_fail("ptrace", "PTRACE_ATTACH pid 1 (the supervisor)", ptrace(PTRACE_ATTACH, 1, 0, 0));
    expect_fail("ptrace", "PTRACE_SEIZE pid 1", ptrace(PTRACE_SEIZE, 1, 0, 0));
    pid_t c = fork();
    if (c == 0) { pause(); _exit(0); }
    expect_fail("ptrace", "PTRACE_ATTACH own child", ptrace(PTRACE_ATTACH, c, 0, 0));
    kill(c, SIGKILL); waitpid(c, NULL, 0);
    int fd = open("/proc/1/mem", O_RDONLY);
    expect_fail("ptrace", "open /proc/1/mem", fd);
    if (fd >= 0) close(fd);
}

static void p_kill(const char *arg) {
    pid_t pid = atoi(arg);
    char b[64]; snprintf(b, sizeof b, "kill(%d, SIGKILL)", pid);
    expect_fail("kill", b, kill(pid, SIGKILL));
    /* Every process we may signal: only the sandbox's own. */
    pid_t c = fork();
    if (c == 0) { kill(-1, SIGKILL); _exit(0); }
    waitpid(c, NULL, 0);
    printf("KILLED-ALL-VISIBLE\n");
}

static void p_namespaces(void) {
    static const struct { int flag; const char *name; } ns[] = {
        {CLONE_NEWUSER, "unshare(CLONE_NEWUSER)"}, {CLONE_NEWNS, "unshare(CLONE_NEWNS)"},
        {CLONE_NEWNET, "unshare(CLONE_NEWNET)"}, {CLONE_NEWPID, "unshare(CLONE_NEWPID)"},
        {CLONE_NEWUTS, "unshare(CLONE_NEWUTS)"}, {CLONE_NEWIPC, "unshare(CLONE_NEWIPC)"},
        {CLONE_NEWCGROUP, "unshare(CLONE_NEWCGROUP)"},
    };
    for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) expect_fail("unshare", ns[i].name, unshare(ns[i].flag));
    int fd = open("/proc/1/ns/mnt", O_RDONLY);
    if (fd < 0) blocked("setns", "open /proc/1/ns/mnt", errno);
    else { expect_fail("setns", "setns(pid 1 mnt)", setns(fd, 0)); close(fd); }
}

static void p_mount(void) {
    expect_fail("mount", "mount tmpfs on /tmp", mount("none", "/tmp", "tmpfs", 0, NULL));
    expect_fail("mount", "bind / on /build/m", mount("/", "/build", NULL, MS_BIND | MS_REC, NULL));
    expect_fail("mount", "remount / rw", mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND, NULL));
    expect_fail("mount", "remount /usr rw", mount(NULL, "/usr", NULL, MS_REMOUNT | MS_BIND, NULL));
    expect_fail("mount", "mount proc", mount("proc", "/tmp", "proc", 0, NULL));
    expect_fail("mount", "umount2 /usr", umount2("/usr", MNT_DETACH));
    expect_fail("mount", "umount2 /proc", umount2("/proc", MNT_DETACH));
    mkdir("/tmp/new", 0755); mkdir("/tmp/new/old", 0755);
    expect_fail("pivot_root", "pivot_root(/tmp/new, /tmp/new/old)", syscall(SYS_pivot_root, "/tmp/new", "/tmp/new/old"));
    expect_fail("pivot_root", "pivot_root(., .)", syscall(SYS_pivot_root, ".", "."));
    expect_fail("chroot", "chroot /tmp", chroot("/tmp"));
    /* The new mount API. */
    expect_fail("newmount", "open_tree(/, OPEN_TREE_CLONE)", syscall(428, AT_FDCWD, "/", 1 /* OPEN_TREE_CLONE */));
    expect_fail("newmount", "open_tree(/build)", syscall(428, AT_FDCWD, "/build", 0));
    expect_fail("newmount", "fsopen(tmpfs)", syscall(430, "tmpfs", 0));
    expect_fail("newmount", "fspick(/)", syscall(433, AT_FDCWD, "/", 0));
    expect_fail("newmount", "mount_setattr(/)", syscall(442, AT_FDCWD, "/", 0, NULL, 0));
    expect_fail("newmount", "move_mount", syscall(429, -1, "", AT_FDCWD, "/tmp", 0));
    expect_fail("newmount", "fsmount", syscall(432, -1, 0, 0));
    expect_fail("newmount", "fsconfig", syscall(431, -1, 0, NULL, NULL, 0));
}

static void p_kernel_surface(void) {
    unsigned char params[120] = {0}; /* struct io_uring_params */
    expect_fail("io_uring", "io_uring_setup(8)", syscall(425, 8, params));
    expect_fail("io_uring", "io_uring_enter(-1)", syscall(426, -1, 0, 0, 0, NULL, 0));
    expect_fail("userfaultfd", "userfaultfd(0)", syscall(SYS_userfaultfd, 0));
    /* BPF_MAP_CREATE with a zeroed attr: EINVAL from a kernel that let it
     * through, EPERM from the filter. */
    unsigned char attr[128] = {0};
    expect_fail("bpf", "bpf(BPF_MAP_CREATE)", syscall(SYS_bpf, 0, attr, sizeof attr));
    /* SYSLOG_ACTION_SIZE_BUFFER (10) needs no capability where
     * dmesg_restrict is 0: only the filter refuses it everywhere. */
    expect_fail("syslog", "syslog(SIZE_BUFFER)", syscall(SYS_syslog, 10, NULL, 0));
}

static void p_personality(void) {
    long cur = syscall(SYS_personality, 0xffffffffUL);
    printf("INFO personality query: %#lx\n", cur);
    expect_fail("personality", "personality(ADDR_NO_RANDOMIZE)", syscall(SYS_personality, ADDR_NO_RANDOMIZE));
    expect_fail("personality", "personality(READ_IMPLIES_EXEC)", syscall(SYS_personality, READ_IMPLIES_EXEC));
    expect_fail("personality", "personality(PER_LINUX32)", syscall(SYS_personality, PER_LINUX32));
}

static void p_setuid(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/suid", dir);
    int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC, 0755);
    if (fd < 0) { printf("SETUP setuid: create %s: %s\n", p, strerror(errno)); exit(2); }
    (void)!write(fd, "#!/bin/sh\n", 10);
    expect_fail("setuid", "fchmod 04755", fchmod(fd, 04755));
    close(fd);
    expect_fail("setuid", "chmod 04755", chmod(p, 04755));
    expect_fail("setuid", "chmod 02755", chmod(p, 02755));
    expect_fail("setuid", "fchmodat 06755", fchmodat(AT_FDCWD, p, 06755, 0));
    snprintf(p, sizeof p, "%s/suid-created", dir);
    expect_fail("setuid", "open(O_CREAT, 04755)", open(p, O_WRONLY | O_CREAT, 04755));
    expect_fail("setuid", "creat(02755)", creat(p, 02755));
    snprintf(p, sizeof p, "%s/sgid-dir", dir);
    mkdir(p, 0755);
    expect_fail("setuid", "chmod dir g+s", chmod(p, 02755));
    struct stat st;
    if (stat(p, &st) == 0 && (st.st_mode & 06000)) escaped("setuid", "directory has S_ISGID");
}

static void p_mknod(const char *dir) {
    char p[512];
    snprintf(p, sizeof p, "%s/null", dir);
    expect_fail("mknod", "char device 1:3", mknod(p, S_IFCHR | 0666, makedev(1, 3)));
    snprintf(p, sizeof p, "%s/sda", dir);
    expect_fail("mknod", "block device 8:0", mknod(p, S_IFBLK | 0666, makedev(8, 0)));
    snprintf(p, sizeof p, "%s/kmem", dir);
    expect_fail("mknod", "char device 1:2 (kmem)", mknodat(AT_FDCWD, p, S_IFCHR | 0600, makedev(1, 2)));
    struct stat st;
    if (stat("/dev/mem", &st) == 0 || stat("/dev/kmem", &st) == 0 || stat("/dev/sda", &st) == 0) escaped("mknod", "a host device is in /dev");
    else blocked("mknod", "no /dev/mem, /dev/kmem, /dev/sda", ENOENT);
}

static void p_forkbomb(void) {
    int n = 0;
    /* Bounded: if no limit holds, 1000 sleeping processes still leave the
     * host usable, and the probe says ESCAPED. */
    for (int i = 0; i < 1000; i++) {
        pid_t c = fork();
        if (c < 0) break;
        if (c == 0) { sleep(60); _exit(0); }
        n++;
    }
    if (n >= 1000) printf("ESCAPED forkbomb: forked %d\n", n);
    else printf("FORKED %d\n", n);
    fflush(stdout);
    exit(n >= 1000 ? 0 : 1);
}

static void p_memory(const char *mb) {
    size_t total = (size_t)atol(mb) << 20, done = 0, step = 8 << 20;
    while (done < total) {
        char *p = malloc(step);
        if (!p) { printf("MEMORY refused after %zu MiB\n", done >> 20); fflush(stdout); exit(1); }
        memset(p, 0xa5, step);
        done += step;
    }
    printf("ALLOCATED %zu MiB\n", done >> 20);
    exit(0);
}

static void p_disk(const char *mb) {
    signal(SIGXFSZ, SIG_IGN);
    size_t total = (size_t)atol(mb) << 20, done = 0;
    static char buf[1 << 16];
    int fd = open("/build/big", O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { printf("SETUP disk\n"); exit(2); }
    while (done < total) {
        ssize_t n = write(fd, buf, sizeof buf);
        if (n <= 0) { printf("DISK refused after %zu KiB: %s\n", done >> 10, strerror(errno)); fflush(stdout); exit(1); }
        done += n;
    }
    printf("WROTE %zu MiB\n", done >> 20);
    exit(0);
}

/* Many files, each well under any per-file limit: only a cap on the sum
 * (the scratch's own file system) stops this. */
static void p_diskfiles(const char *mb) {
    signal(SIGXFSZ, SIG_IGN);
    size_t total = (size_t)atol(mb) << 20, done = 0;
    static char buf[1 << 16];
    memset(buf, 'x', sizeof buf);
    for (int i = 0; done < total; i++) {
        char name[64];
        snprintf(name, sizeof name, "/build/fill-%d", i);
        int fd = open(name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
        if (fd < 0) { printf("DISK refused after %zu KiB: %s\n", done >> 10, strerror(errno)); fflush(stdout); exit(1); }
        for (int k = 0; k < 8; k++) {
            ssize_t n = write(fd, buf, sizeof buf);
            if (n <= 0) { printf("DISK refused after %zu KiB: %s\n", done >> 10, strerror(errno)); fflush(stdout); exit(1); }
            done += n;
        }
        close(fd);
    }
    printf("WROTE %zu MiB\n", done >> 20);
    exit(0);
}

static void p_files(const char *count) {
    long want = atol(count), n = 0;
    for (; n < want; n++) if (open("/dev/null", O_RDONLY) < 0) break;
    printf("OPENED %ld\n", n);
    exit(n >= want ? 0 : 1);
}

/* The proxy port with something that is not a recorded HTTP(S) fetch. */
static void p_proxy(const char *arg) {
    struct sockaddr_in sa;
    parse_addr("127.0.0.1:3128", &sa);
    const char *reqs[3];
    char connect_req[256], get_req[256];
    snprintf(connect_req, sizeof connect_req, "CONNECT %s HTTP/1.1\r\nHost: %s\r\n\r\nSSH-2.0-OpenSSH_9.2\r\n", arg, arg);
    snprintf(get_req, sizeof get_req, "GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", arg, arg);
    reqs[0] = "SSH-2.0-OpenSSH_9.2\r\n";
    reqs[1] = connect_req;
    reqs[2] = get_req;
    for (int i = 0; i < 3; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (connect_timeout(fd, (struct sockaddr *)&sa, sizeof sa) < 0) { blocked("proxy", "connect 127.0.0.1:3128", errno); close(fd); continue; }
        fcntl(fd, F_SETFL, 0);
        (void)!write(fd, reqs[i], strlen(reqs[i]));
        struct pollfd p = {fd, POLLIN, 0};
        char r[256] = {0};
        ssize_t n = 0;
        if (poll(&p, 1, 10000) > 0) n = read(fd, r, sizeof r - 1);
        char *nl = strpbrk(r, "\r\n"); if (nl) *nl = 0;
        printf("PROXY %d answered: %s\n", i, n > 0 ? r : "(nothing)");
        close(fd);
    }
}

/* Only reserve address space, as JITs, sanitizers, Go, the JVM and
 * WebAssembly engines do: PROT_NONE, MAP_NORESERVE, then make 1 MiB of it
 * usable and use it. A memory limit must not refuse this. */
static void p_reserve(const char *mb) {
    size_t len = (size_t)atol(mb) << 20;
    char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) {
        printf("RESERVE refused %zu MiB: %s\n", len >> 20, strerror(errno));
        fflush(stdout);
        exit(1);
    }
    if (mprotect(p, 1 << 20, PROT_READ | PROT_WRITE) != 0) {
        printf("RESERVE mprotect failed: %s\n", strerror(errno));
        fflush(stdout);
        exit(1);
    }
    memset(p, 0x5a, 1 << 20);
    printf("RESERVED %zu MiB\n", len >> 20);
}

/* Whether fd is the file at `path` (same device and inode). */
static int same_file(int fd, const struct stat *want) {
    struct stat st;
    return fstat(fd, &st) == 0 && st.st_dev == want->st_dev && st.st_ino == want->st_ino;
}

/* Try to read a byte of the supervisor (PID 1) by every way there is:
 * `path` (where an older fhsx bound it; bwrap now execs it from a
 * descriptor PID 1 closes at once, so no path should lead to it), PID 1's
 * exe link, maps, mem, map_files and fds, process_vm_readv, an exec of
 * /proc/1/exe, and — should `path` exist — a copy of it the command
 * execs itself. */
static void p_supervisor(const char *path) {
    struct stat sup;
    int has_path = stat(path, &sup) == 0;
    if (!has_path) {
        blocked("supervisor", path, errno);
        memset(&sup, 0, sizeof sup);
    }
    char b[400], buf[64];
    const char *files[] = {path, "/proc/1/exe", "/proc/1/mem", "/proc/1/maps",
                           "/proc/1/environ", "/proc/1/task/1/mem"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        int fd = open(files[i], O_RDONLY);
        if (fd < 0) { blocked("supervisor", files[i], errno); continue; }
        ssize_t n = read(fd, buf, sizeof buf);
        int e = errno;
        close(fd);
        if (n < 0) { blocked("supervisor", files[i], e); continue; }
        snprintf(b, sizeof b, "read %zd bytes of %s", n, files[i]);
        escaped("supervisor", b);
    }
    char link[256];
    expect_fail("supervisor", "readlink /proc/1/exe", readlink("/proc/1/exe", link, sizeof link));
    const char *dirs[] = {"/proc/1/map_files", "/proc/1/fd"};
    for (size_t i = 0; i < 2; i++) {
        DIR *d = opendir(dirs[i]);
        if (!d) { blocked("supervisor", dirs[i], errno); continue; }
        struct dirent *de;
        int any = 0;
        while ((de = readdir(d))) {
            if (de->d_name[0] == '.') continue;
            char f[300];
            snprintf(f, sizeof f, "%s/%s", dirs[i], de->d_name);
            int fd = open(f, O_RDONLY);
            if (fd < 0) { any = 1; continue; }
            if (read(fd, buf, 1) >= 0 || same_file(fd, &sup)) {
                snprintf(b, sizeof b, "read %s", f);
                escaped("supervisor", b);
            }
            close(fd);
        }
        closedir(d);
        blocked("supervisor", any ? "entries listed, none opened" : "nothing listed", EACCES);
    }
    struct iovec local = {buf, 1}, remote = {(void *)0x400000, 1};
    expect_fail("supervisor", "process_vm_readv(1)", process_vm_readv(1, &local, 1, &remote, 1, 0));
    char *pid1_argv[] = {"/proc/1/exe", NULL};
    expect_fail("supervisor", "execv /proc/1/exe", execv("/proc/1/exe", pid1_argv));
    if (!has_path) goto self_exe;
    /* Exec a copy of it and race for that process's exe and memory. */
    pid_t c = fork();
    if (c == 0) {
        char *argv[] = {(char *)path, NULL};
        execv(path, argv);
        _exit(127);
    }
    char exe[64], mem[64];
    snprintf(exe, sizeof exe, "/proc/%d/exe", c);
    snprintf(mem, sizeof mem, "/proc/%d/mem", c);
    int got = 0, tries = 0;
    for (; tries < 100000; tries++) {
        int fd = open(exe, O_RDONLY);
        if (fd >= 0) {
            if (same_file(fd, &sup) && read(fd, buf, 1) == 1) got = 1;
            close(fd);
        }
        if (got || waitpid(c, NULL, WNOHANG) == c) break;
    }
    if (!got) waitpid(c, NULL, 0);
    if (got) escaped("supervisor", "read the supervisor through an exec'd copy's /proc/PID/exe");
    else blocked("supervisor", "an exec'd copy's /proc/PID/exe", EACCES);
self_exe:
    /* The command's own exe is the command. */
    struct stat self, cmd;
    if (stat("/proc/self/exe", &self) == 0 && stat("/opt/hostile/attack", &cmd) == 0 &&
        self.st_ino == cmd.st_ino && self.st_dev == cmd.st_dev)
        printf("SELF-EXE is the command\n");
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    for (int i = 1; i < argc; i++) {
        char *name = argv[i], *arg = strchr(name, '=');
        if (arg) *arg++ = 0;
        if (!strcmp(name, "read")) p_read(arg);
        else if (!strcmp(name, "write")) p_write(arg);
        else if (!strcmp(name, "mkdir")) p_mkdir(arg);
        else if (!strcmp(name, "tcp")) p_tcp(arg);
        else if (!strcmp(name, "dns")) p_dns(arg);
        else if (!strcmp(name, "raw")) p_raw();
        else if (!strcmp(name, "abstract")) p_abstract(arg);
        else if (!strcmp(name, "fdleak-listen")) p_fdleak_listen(arg);
        else if (!strcmp(name, "tty")) p_tty();
        else if (!strcmp(name, "keys")) p_keys();
        else if (!strcmp(name, "perf")) p_perf();
        else if (!strcmp(name, "ptrace")) p_ptrace();
        else if (!strcmp(name, "kill")) p_kill(arg);
        else if (!strcmp(name, "namespaces")) p_namespaces();
        else if (!strcmp(name, "mount")) p_mount();
        else if (!strcmp(name, "personality")) p_personality();
        else if (!strcmp(name, "kernel-surface")) p_kernel_surface();
        else if (!strcmp(name, "setuid")) p_setuid(arg);
        else if (!strcmp(name, "mknod")) p_mknod(arg);
        else if (!strcmp(name, "forkbomb")) p_forkbomb();
        else if (!strcmp(name, "memory")) p_memory(arg);
        else if (!strcmp(name, "disk")) p_disk(arg);
        else if (!strcmp(name, "files")) p_files(arg);
        else if (!strcmp(name, "diskfiles")) p_diskfiles(arg);
        else if (!strcmp(name, "proxy")) p_proxy(arg);
        else if (!strcmp(name, "reserve")) p_reserve(arg);
        else if (!strcmp(name, "supervisor")) p_supervisor(arg);
        else { printf("SETUP unknown probe %s\n", name); return 2; }
    }
    printf("DONE\n");
    return 0;
}
