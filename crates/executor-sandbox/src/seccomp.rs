//! The seccomp filter bwrap installs (`--seccomp FD`) before it starts the
//! supervisor: no setuid or setgid bit can be set on a file, and the kernel
//! interfaces namespaces do not fence off are refused.
//!
//! Why: when the caller is root, the sandbox uid maps to host uid 0, so a
//! file the command creates in the workspace is owned by root on the host.
//! Mounts are `nosuid`, so a setuid bit has no effect *inside*; but the
//! workspace outlives the run, and a setuid-root file left there would be
//! a privilege escalation on the host. As Nix does, the filter makes
//! `chmod`-family calls, `open`/`creat` with `O_CREAT`/`O_TMPFILE`, and
//! `mknod` fail with `EPERM` when the mode holds `S_ISUID` or `S_ISGID`.
//! `openat2` (its mode sits behind a pointer the filter cannot read) fails
//! with `ENOSYS`, which callers treat as an old kernel and fall back to
//! `openat`. On x86_64 the i386 entry points get the same rules and the
//! x32 ones are refused.
//!
//! Beyond modes, with `EPERM` (what namespaces and a zero capability set do
//! not fully cover, as in Docker's and Nix's profiles):
//! - `ioctl` `TIOCSTI` (push input into a terminal) and `TIOCLINUX`
//!   (console selection paste), comparing the command's low 32 bits as the
//!   kernel does, so a set high half does not slip past;
//! - the key management calls `add_key` and `request_key`, and `keyctl`
//!   except `keyctl(KEYCTL_JOIN_SESSION_KEYRING, NULL)` — the supervisor's
//!   own fresh anonymous keyring (the caller's keys are never reachable);
//! - `perf_event_open` (a large, often-exploited kernel surface and a side
//!   channel);
//! - `ptrace` (and so `strace`/`gdb` inside builds: a build has no process
//!   outside to reach, and the supervisor is not dumpable, but the call is
//!   a classic escalation path);
//! - the new mount API `open_tree`, `open_tree_attr`, `move_mount`,
//!   `fsopen`, `fsconfig`, `fsmount`, `fspick`, `mount_setattr` (`mount`
//!   and `pivot_root` already fail without `CAP_SYS_ADMIN`);
//! - `personality` with anything but `PER_LINUX` (0) or the query
//!   `0xffffffff` (no `ADDR_NO_RANDOMIZE`, `READ_IMPLIES_EXEC`, …);
//! - `userfaultfd` (a tool for widening kernel race windows);
//! - `bpf` (the verifier and JIT are a kernel attack surface wherever
//!   unprivileged BPF is enabled) and `syslog` (the host's kernel log where
//!   `dmesg_restrict` is off), as Docker's default profile does.
//!
//! And with `ENOSYS`, so programs fall back as on a kernel without it:
//! `io_uring_setup`/`io_uring_enter`/`io_uring_register` (its operations
//! bypass this filter, and it has been a steady source of kernel bugs).
//!
//! Why hand-assembled rather than the `seccompiler` crate: a seccompiler
//! filter validates one architecture and kills the process on any other,
//! so a build running i386 code (`gcc -m32` test binaries) would die
//! instead of meeting the same rules; and one filter has one match action,
//! where this one needs both `EPERM` and `ENOSYS`. The program is small,
//! and `tests` run it through a classic-BPF interpreter.

/// One classic-BPF instruction (`struct sock_filter`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Insn {
    code: u16,
    jt: u8,
    jf: u8,
    k: u32,
}

const LD_W_ABS: u16 = 0x20;
const JEQ_K: u16 = 0x15;
const JGE_K: u16 = 0x35;
const JSET_K: u16 = 0x45;
const RET_K: u16 = 0x06;

const RET_ALLOW: u32 = 0x7fff_0000;
const RET_ERRNO: u32 = 0x0005_0000;
const EPERM: u32 = 1;
const ENOSYS: u32 = 38;

const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
/// The low 32 bits of argument `i` (little-endian).
const fn off_arg(i: u32) -> u32 {
    16 + 8 * i
}

const S_ISUID_ISGID: u32 = 0o6000;
const TIOCSTI: u32 = 0x5412;
const TIOCLINUX: u32 = 0x541c;
const KEYCTL_JOIN_SESSION_KEYRING: u32 = 1;
const PER_LINUX: u32 = 0;
const PER_QUERY: u32 = 0xffff_ffff;
/// `O_CREAT | __O_TMPFILE` (the same on x86_64, i386 and aarch64).
const CREATES: u32 = 0o100 | 0o2000_0000;

/// What a rule checks.
#[derive(Debug, Clone, Copy)]
enum Rule {
    /// The mode is argument `mode`.
    Mode { mode: u32 },
    /// Creates only if argument `flags` has O_CREAT/O_TMPFILE; mode in `mode`.
    OpenLike { flags: u32, mode: u32 },
    /// Refused outright with ENOSYS.
    NoSys,
    /// Refused outright with EPERM.
    Deny,
    /// `ioctl`: EPERM when the command (argument 1, low 32 bits) is
    /// TIOCSTI or TIOCLINUX.
    Ioctl,
    /// `keyctl`: only `KEYCTL_JOIN_SESSION_KEYRING` with a NULL name.
    Keyctl,
    /// `personality`: only PER_LINUX and the query.
    Personality,
}

/// (syscall number, rule) for one architecture.
type Table = &'static [(u32, Rule)];

#[cfg(target_arch = "x86_64")]
const NATIVE_ARCH: u32 = 0xc000_003e; // AUDIT_ARCH_X86_64
#[cfg(target_arch = "x86_64")]
const NATIVE: Table = &[
    (90, Rule::Mode { mode: 1 }),                // chmod
    (91, Rule::Mode { mode: 1 }),                // fchmod
    (268, Rule::Mode { mode: 2 }),               // fchmodat
    (452, Rule::Mode { mode: 2 }),               // fchmodat2
    (2, Rule::OpenLike { flags: 1, mode: 2 }),   // open
    (257, Rule::OpenLike { flags: 2, mode: 3 }), // openat
    (85, Rule::Mode { mode: 1 }),                // creat
    (133, Rule::Mode { mode: 1 }),               // mknod
    (259, Rule::Mode { mode: 2 }),               // mknodat
    (437, Rule::NoSys),                          // openat2
    (16, Rule::Ioctl),                           // ioctl
    (248, Rule::Deny),                           // add_key
    (249, Rule::Deny),                           // request_key
    (250, Rule::Keyctl),                         // keyctl
    (298, Rule::Deny),                           // perf_event_open
    (101, Rule::Deny),                           // ptrace
    (135, Rule::Personality),                    // personality
    (428, Rule::Deny),                           // open_tree
    (429, Rule::Deny),                           // move_mount
    (430, Rule::Deny),                           // fsopen
    (431, Rule::Deny),                           // fsconfig
    (432, Rule::Deny),                           // fsmount
    (433, Rule::Deny),                           // fspick
    (442, Rule::Deny),                           // mount_setattr
    (467, Rule::Deny),                           // open_tree_attr
    (323, Rule::Deny),                           // userfaultfd
    (321, Rule::Deny),                           // bpf
    (103, Rule::Deny),                           // syslog
    (425, Rule::NoSys),                          // io_uring_setup
    (426, Rule::NoSys),                          // io_uring_enter
    (427, Rule::NoSys),                          // io_uring_register
];
#[cfg(target_arch = "x86_64")]
const COMPAT: Option<(u32, Table)> = Some((
    0x4000_0003, // AUDIT_ARCH_I386
    &[
        (15, Rule::Mode { mode: 1 }),                // chmod
        (94, Rule::Mode { mode: 1 }),                // fchmod
        (306, Rule::Mode { mode: 2 }),               // fchmodat
        (452, Rule::Mode { mode: 2 }),               // fchmodat2
        (5, Rule::OpenLike { flags: 1, mode: 2 }),   // open
        (295, Rule::OpenLike { flags: 2, mode: 3 }), // openat
        (8, Rule::Mode { mode: 1 }),                 // creat
        (14, Rule::Mode { mode: 1 }),                // mknod
        (297, Rule::Mode { mode: 2 }),               // mknodat
        (437, Rule::NoSys),                          // openat2
        (54, Rule::Ioctl),                           // ioctl
        (286, Rule::Deny),                           // add_key
        (287, Rule::Deny),                           // request_key
        (288, Rule::Keyctl),                         // keyctl
        (336, Rule::Deny),                           // perf_event_open
        (26, Rule::Deny),                            // ptrace
        (136, Rule::Personality),                    // personality
        (428, Rule::Deny),                           // open_tree
        (429, Rule::Deny),                           // move_mount
        (430, Rule::Deny),                           // fsopen
        (431, Rule::Deny),                           // fsconfig
        (432, Rule::Deny),                           // fsmount
        (433, Rule::Deny),                           // fspick
        (442, Rule::Deny),                           // mount_setattr
        (467, Rule::Deny),                           // open_tree_attr
        (374, Rule::Deny),                           // userfaultfd
        (357, Rule::Deny),                           // bpf
        (103, Rule::Deny),                           // syslog
        (425, Rule::NoSys),                          // io_uring_setup
        (426, Rule::NoSys),                          // io_uring_enter
        (427, Rule::NoSys),                          // io_uring_register
    ],
));
/// x32 system calls arrive with the native arch and this bit set.
#[cfg(target_arch = "x86_64")]
const X32_BIT: Option<u32> = Some(0x4000_0000);

#[cfg(target_arch = "aarch64")]
const NATIVE_ARCH: u32 = 0xc000_00b7; // AUDIT_ARCH_AARCH64
#[cfg(target_arch = "aarch64")]
const NATIVE: Table = &[
    (52, Rule::Mode { mode: 1 }),               // fchmod
    (53, Rule::Mode { mode: 2 }),               // fchmodat
    (452, Rule::Mode { mode: 2 }),              // fchmodat2
    (56, Rule::OpenLike { flags: 2, mode: 3 }), // openat
    (33, Rule::Mode { mode: 2 }),               // mknodat
    (437, Rule::NoSys),                         // openat2
    (29, Rule::Ioctl),                          // ioctl
    (217, Rule::Deny),                          // add_key
    (218, Rule::Deny),                          // request_key
    (219, Rule::Keyctl),                        // keyctl
    (241, Rule::Deny),                          // perf_event_open
    (117, Rule::Deny),                          // ptrace
    (92, Rule::Personality),                    // personality
    (428, Rule::Deny),                          // open_tree
    (429, Rule::Deny),                          // move_mount
    (430, Rule::Deny),                          // fsopen
    (431, Rule::Deny),                          // fsconfig
    (432, Rule::Deny),                          // fsmount
    (433, Rule::Deny),                          // fspick
    (442, Rule::Deny),                          // mount_setattr
    (467, Rule::Deny),                          // open_tree_attr
    (282, Rule::Deny),                          // userfaultfd
    (280, Rule::Deny),                          // bpf
    (116, Rule::Deny),                          // syslog
    (425, Rule::NoSys),                         // io_uring_setup
    (426, Rule::NoSys),                         // io_uring_enter
    (427, Rule::NoSys),                         // io_uring_register
];
#[cfg(target_arch = "aarch64")]
const COMPAT: Option<(u32, Table)> = None;
#[cfg(target_arch = "aarch64")]
const X32_BIT: Option<u32> = None;

/// A tiny assembler with forward labels.
#[derive(Default)]
struct Asm {
    items: Vec<Item>,
    labels: usize,
}

enum Item {
    Insn(Insn),
    /// A conditional jump to labels (true, false).
    Jump {
        code: u16,
        k: u32,
        jt: usize,
        jf: usize,
    },
    Label(usize),
}

impl Asm {
    fn label(&mut self) -> usize {
        self.labels += 1;
        self.labels - 1
    }
    fn place(&mut self, l: usize) {
        self.items.push(Item::Label(l));
    }
    fn ld(&mut self, off: u32) {
        self.items.push(Item::Insn(Insn {
            code: LD_W_ABS,
            jt: 0,
            jf: 0,
            k: off,
        }));
    }
    fn ret(&mut self, k: u32) {
        self.items.push(Item::Insn(Insn {
            code: RET_K,
            jt: 0,
            jf: 0,
            k,
        }));
    }
    fn jump(&mut self, code: u16, k: u32, jt: usize, jf: usize) {
        self.items.push(Item::Jump { code, k, jt, jf });
    }
    fn finish(self) -> Vec<Insn> {
        let mut at = vec![0usize; self.labels];
        let mut pc = 0;
        for it in &self.items {
            match it {
                Item::Label(l) => at[*l] = pc,
                _ => pc += 1,
            }
        }
        let mut out = Vec::with_capacity(pc);
        for it in self.items {
            match it {
                Item::Label(_) => {}
                Item::Insn(i) => out.push(i),
                Item::Jump { code, k, jt, jf } => {
                    let here = out.len() + 1;
                    let rel = |l: usize| -> u8 {
                        let d = at[l] - here;
                        u8::try_from(d).unwrap_or_else(|_| unreachable!("filter jump too long"))
                    };
                    out.push(Insn {
                        code,
                        jt: rel(jt),
                        jf: rel(jf),
                        k,
                    });
                }
            }
        }
        out
    }
}

/// One architecture's rules, with its own exits (so no jump grows past
/// the 255 instructions classic BPF can skip).
fn rules(a: &mut Asm, table: Table) {
    let (allow, deny_eperm) = (a.label(), a.label());
    a.ld(OFF_NR);
    let blocks: Vec<(usize, Rule)> = table.iter().map(|(_, r)| (a.label(), *r)).collect();
    for ((nr, _), (l, _)) in table.iter().zip(&blocks) {
        let next = a.label();
        a.jump(JEQ_K, *nr, *l, next);
        a.place(next);
    }
    a.ret(RET_ALLOW);
    for (l, rule) in blocks {
        a.place(l);
        match rule {
            Rule::NoSys => a.ret(RET_ERRNO | ENOSYS),
            Rule::Deny => a.ret(RET_ERRNO | EPERM),
            Rule::Mode { mode } => {
                a.ld(off_arg(mode));
                a.jump(JSET_K, S_ISUID_ISGID, deny_eperm, allow);
            }
            Rule::OpenLike { flags, mode } => {
                let check = a.label();
                a.ld(off_arg(flags));
                a.jump(JSET_K, CREATES, check, allow);
                a.place(check);
                a.ld(off_arg(mode));
                a.jump(JSET_K, S_ISUID_ISGID, deny_eperm, allow);
            }
            Rule::Ioctl => {
                // The kernel takes the command as an unsigned int: only the
                // low word counts, whatever the high word holds.
                let next = a.label();
                a.ld(off_arg(1));
                a.jump(JEQ_K, TIOCSTI, deny_eperm, next);
                a.place(next);
                a.jump(JEQ_K, TIOCLINUX, deny_eperm, allow);
            }
            Rule::Keyctl => {
                let (lo, hi) = (a.label(), a.label());
                a.ld(off_arg(0));
                a.jump(JEQ_K, KEYCTL_JOIN_SESSION_KEYRING, lo, deny_eperm);
                a.place(lo);
                a.ld(off_arg(1));
                a.jump(JEQ_K, 0, hi, deny_eperm);
                a.place(hi);
                a.ld(off_arg(1) + 4);
                a.jump(JEQ_K, 0, allow, deny_eperm);
            }
            Rule::Personality => {
                let next = a.label();
                a.ld(off_arg(0));
                a.jump(JEQ_K, PER_LINUX, allow, next);
                a.place(next);
                a.jump(JEQ_K, PER_QUERY, allow, deny_eperm);
            }
        }
    }
    a.place(allow);
    a.ret(RET_ALLOW);
    a.place(deny_eperm);
    a.ret(RET_ERRNO | EPERM);
}

/// The compiled filter as the bytes bwrap reads (`struct sock_filter[]`),
/// or `None` on an architecture without a table here.
pub fn filter_bytes() -> Option<Vec<u8>> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let mut a = Asm::default();
        let native = a.label();
        let other = a.label();
        a.ld(OFF_ARCH);
        a.jump(JEQ_K, NATIVE_ARCH, native, other);
        a.place(other);
        match COMPAT {
            Some((arch, table)) => {
                let (compat, allow) = (a.label(), a.label());
                a.jump(JEQ_K, arch, compat, allow);
                a.place(allow);
                // An arch this kernel cannot run for us: nothing to filter.
                a.ret(RET_ALLOW);
                a.place(compat);
                rules(&mut a, table);
            }
            None => a.ret(RET_ALLOW),
        }
        a.place(native);
        if let Some(bit) = X32_BIT {
            let (native_rules, enosys) = (a.label(), a.label());
            a.ld(OFF_NR);
            a.jump(JGE_K, bit, enosys, native_rules);
            a.place(enosys);
            a.ret(RET_ERRNO | ENOSYS);
            a.place(native_rules);
        }
        rules(&mut a, NATIVE);
        let prog = a.finish();
        let mut bytes = Vec::with_capacity(prog.len() * 8);
        for i in prog {
            bytes.extend_from_slice(&i.code.to_ne_bytes());
            bytes.push(i.jt);
            bytes.push(i.jf);
            bytes.extend_from_slice(&i.k.to_ne_bytes());
        }
        Some(bytes)
    }
    #[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
    {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A classic-BPF interpreter for the subset the filter uses.
    fn run(prog: &[u8], nr: u32, arch: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend_from_slice(&nr.to_ne_bytes());
        data.extend_from_slice(&arch.to_ne_bytes());
        data.extend_from_slice(&0u64.to_ne_bytes());
        for a in args {
            data.extend_from_slice(&a.to_ne_bytes());
        }
        let insns: Vec<Insn> = prog
            .chunks_exact(8)
            .map(|c| Insn {
                code: u16::from_ne_bytes([c[0], c[1]]),
                jt: c[2],
                jf: c[3],
                k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
            })
            .collect();
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = insns[pc];
            pc += 1;
            match i.code {
                LD_W_ABS => {
                    let o = i.k as usize;
                    acc = u32::from_ne_bytes([data[o], data[o + 1], data[o + 2], data[o + 3]]);
                }
                RET_K => return i.k,
                JEQ_K | JGE_K | JSET_K => {
                    let t = match i.code {
                        JEQ_K => acc == i.k,
                        JGE_K => acc >= i.k,
                        _ => acc & i.k != 0,
                    };
                    pc += if t { i.jt } else { i.jf } as usize;
                }
                c => panic!("unexpected opcode {c:#x}"),
            }
        }
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn filter_denies_setuid_modes_and_nothing_else() {
        let p = filter_bytes().unwrap();
        let x = NATIVE_ARCH;
        let deny = RET_ERRNO | EPERM;
        // chmod(path, 04755), fchmodat(fd, path, 02755): denied.
        assert_eq!(run(&p, 90, x, [0, 0o4755, 0, 0, 0, 0]), deny);
        assert_eq!(run(&p, 268, x, [0, 0, 0o2755, 0, 0, 0]), deny);
        assert_eq!(run(&p, 91, x, [3, 0o6755, 0, 0, 0, 0]), deny);
        // Plain modes pass.
        assert_eq!(run(&p, 90, x, [0, 0o755, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 268, x, [0, 0, 0o1777, 0, 0, 0]), RET_ALLOW);
        // openat with O_CREAT and a setuid mode: denied; without O_CREAT the
        // mode argument is garbage and ignored.
        assert_eq!(run(&p, 257, x, [0, 0, 0o101, 0o4755, 0, 0]), deny);
        assert_eq!(run(&p, 257, x, [0, 0, 0o1, 0o4755, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 257, x, [0, 0, 0o101, 0o644, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 2, x, [0, 0o2000_0000, 0o4700, 0, 0, 0]), deny);
        assert_eq!(run(&p, 85, x, [0, 0o4755, 0, 0, 0, 0]), deny);
        assert_eq!(run(&p, 259, x, [0, 0, 0o104755, 0, 0, 0]), deny);
        // openat2 cannot be inspected: ENOSYS.
        assert_eq!(run(&p, 437, x, [0; 6]), RET_ERRNO | ENOSYS);
        // Unrelated calls pass; x32 calls are refused.
        assert_eq!(run(&p, 0, x, [0, 0o4755, 0o4755, 0o4755, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 0x4000_0000 | 90, x, [0; 6]), RET_ERRNO | ENOSYS);
        // i386: chmod is 15; read (3) passes.
        assert_eq!(run(&p, 15, 0x4000_0003, [0, 0o4755, 0, 0, 0, 0]), deny);
        assert_eq!(run(&p, 3, 0x4000_0003, [0, 0o4755, 0, 0, 0, 0]), RET_ALLOW);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn filter_refuses_tty_injection_keyrings_perf_ptrace_new_mount_api_and_personality() {
        let p = filter_bytes().unwrap();
        let x = NATIVE_ARCH;
        let i386 = 0x4000_0003;
        let deny = RET_ERRNO | EPERM;
        // ioctl(fd, TIOCSTI/TIOCLINUX): refused, also with garbage in the
        // command's high word (the kernel truncates it to 32 bits).
        for cmd in [0x5412u64, 0x541c, 0xdead_beef_0000_5412, 1 << 32 | 0x541c] {
            assert_eq!(run(&p, 16, x, [1, cmd, 0, 0, 0, 0]), deny, "{cmd:#x}");
            assert_eq!(run(&p, 54, i386, [1, cmd, 0, 0, 0, 0]), deny, "{cmd:#x}");
        }
        // Other ioctls pass (TCGETS, FIONREAD, TIOCGWINSZ).
        for cmd in [0x5401u64, 0x541b, 0x5413, 0x1_0000_5401] {
            assert_eq!(run(&p, 16, x, [1, cmd, 0, 0, 0, 0]), RET_ALLOW, "{cmd:#x}");
        }
        // Keyrings: add_key, request_key refused; keyctl only to join a
        // fresh anonymous session keyring (the supervisor's call).
        assert_eq!(run(&p, 248, x, [1, 2, 3, 4, 0xffff_fffd, 0]), deny);
        assert_eq!(run(&p, 249, x, [1, 2, 3, 0xffff_fffd, 0, 0]), deny);
        assert_eq!(run(&p, 250, x, [1, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 250, x, [1, 0x7ffd_0000, 0, 0, 0, 0]), deny);
        assert_eq!(run(&p, 250, x, [1, 0x1_0000_0000, 0, 0, 0, 0]), deny);
        assert_eq!(run(&p, 250, x, [1 | 1 << 32, 0, 0, 0, 0, 0]), RET_ALLOW);
        for cmd in [0u64, 2, 6, 11, 29] {
            assert_eq!(run(&p, 250, x, [cmd, 0, 0, 0, 0, 0]), deny, "keyctl {cmd}");
        }
        assert_eq!(run(&p, 286, i386, [0; 6]), deny);
        assert_eq!(run(&p, 288, i386, [1, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 288, i386, [11, 0, 0, 0, 0, 0]), deny);
        // perf_event_open, ptrace: refused whatever the arguments.
        for (nr, arch) in [(298, x), (101, x), (336, i386), (26, i386)] {
            assert_eq!(run(&p, nr, arch, [0; 6]), deny, "{nr}");
            assert_eq!(run(&p, nr, arch, [16, 1, 0, 0, 0, 0]), deny, "{nr}");
        }
        // The new mount API, on both entry points.
        for nr in [428, 429, 430, 431, 432, 433, 442, 467] {
            assert_eq!(run(&p, nr, x, [0; 6]), deny, "{nr}");
            assert_eq!(run(&p, nr, i386, [0; 6]), deny, "{nr}");
        }
        // personality: PER_LINUX and the query only.
        assert_eq!(run(&p, 135, x, [0, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 135, x, [0xffff_ffff, 0, 0, 0, 0, 0]), RET_ALLOW);
        assert_eq!(run(&p, 135, i386, [0xffff_ffff, 0, 0, 0, 0, 0]), RET_ALLOW);
        for per in [0x0040000u64, 0x0400000, 0x0008, 0x0800_0000, 1] {
            assert_eq!(run(&p, 135, x, [per, 0, 0, 0, 0, 0]), deny, "{per:#x}");
            assert_eq!(run(&p, 136, i386, [per, 0, 0, 0, 0, 0]), deny, "{per:#x}");
        }
        // Neighbours of the refused numbers still pass (mount, umount2,
        // pivot_root fail on capabilities, not here; unshare on --disable-userns).
        // userfaultfd: EPERM; io_uring: ENOSYS (callers fall back).
        assert_eq!(run(&p, 323, x, [0; 6]), deny);
        assert_eq!(run(&p, 374, i386, [0; 6]), deny);
        // bpf, syslog: refused on both entry points.
        for (nr, arch) in [(321, x), (103, x), (357, i386), (103, i386)] {
            assert_eq!(run(&p, nr, arch, [5, 0, 0, 0, 0, 0]), deny, "{nr}");
        }
        for nr in [425, 426, 427] {
            assert_eq!(run(&p, nr, x, [0; 6]), RET_ERRNO | ENOSYS, "{nr}");
            assert_eq!(run(&p, nr, i386, [0; 6]), RET_ERRNO | ENOSYS, "{nr}");
        }
        for nr in [165, 166, 155, 272, 424, 434, 441, 443] {
            assert_eq!(run(&p, nr, x, [0; 6]), RET_ALLOW, "{nr}");
        }
        // The setuid rules still hold with the new ones in place.
        assert_eq!(run(&p, 90, x, [0, 0o4755, 0, 0, 0, 0]), deny);
        assert_eq!(run(&p, 15, i386, [0, 0o2755, 0, 0, 0, 0]), deny);
    }

    #[test]
    fn filter_fits_classic_bpf_limits() {
        let p = filter_bytes().unwrap();
        // BPF_MAXINSNS; every jump target checked by the assembler.
        assert!(p.len() / 8 <= 4096);
    }
}
