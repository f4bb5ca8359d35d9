//! The seccomp filter bwrap installs (`--seccomp FD`) before it starts the
//! supervisor: no setuid or setgid bit can be set on a file.
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

fn rules(a: &mut Asm, table: Table, allow: usize, deny_eperm: usize) {
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
        }
    }
}

/// The compiled filter as the bytes bwrap reads (`struct sock_filter[]`),
/// or `None` on an architecture without a table here.
pub fn filter_bytes() -> Option<Vec<u8>> {
    #[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
    {
        let mut a = Asm::default();
        let (allow, eperm, enosys) = (a.label(), a.label(), a.label());
        let native = a.label();
        let other = a.label();
        a.ld(OFF_ARCH);
        a.jump(JEQ_K, NATIVE_ARCH, native, other);
        a.place(other);
        match COMPAT {
            Some((arch, table)) => {
                let compat = a.label();
                a.jump(JEQ_K, arch, compat, allow);
                a.place(compat);
                rules(&mut a, table, allow, eperm);
            }
            // An arch this kernel cannot run for us: nothing to filter.
            None => a.ret(RET_ALLOW),
        }
        a.place(native);
        if let Some(bit) = X32_BIT {
            let native_rules = a.label();
            a.ld(OFF_NR);
            a.jump(JGE_K, bit, enosys, native_rules);
            a.place(native_rules);
        }
        rules(&mut a, NATIVE, allow, eperm);
        a.place(allow);
        a.ret(RET_ALLOW);
        a.place(eperm);
        a.ret(RET_ERRNO | EPERM);
        a.place(enosys);
        a.ret(RET_ERRNO | ENOSYS);
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
}
