//! Landlock, the second wall around the command.
//!
//! The mount layout already makes every path but the writable ones
//! read-only, and the network and PID namespaces already hide every
//! abstract socket and process of the host. Landlock restates those
//! promises in a different kernel subsystem, so one bug (a mount flag
//! dropped, a namespace shared by mistake) is not enough to escape:
//!
//! - file-system writes of any kind (write, truncate, create, remove,
//!   rename/link across directories) only beneath the paths the host names
//!   with `--landlock-rw`, and writes to existing files only beneath the
//!   `--landlock-files` paths (`/dev`: null, tty, pts, …; `/proc`);
//! - (ABI 6, Linux 6.12) no connection to an abstract UNIX socket and no
//!   signal to a process created outside the command's domain — which
//!   includes this supervisor.
//!
//! Reads are not restricted here: everything the sandbox can see is the
//! declared closure, and the FUSE view records what was read.
//!
//! Best effort by design, as in every Landlock user: a kernel without it
//! (or with it disabled) gets the rights it knows and the mount layout
//! alone; `LANDLOCK <abi>` on the control channel tells the host what held.
//! Once the kernel accepted a ruleset, failing to enforce it fails the
//! command instead.

use std::ffi::OsString;
use std::os::raw::c_int;
use std::os::unix::ffi::OsStrExt;

extern "C" {
    fn syscall(n: i64, ...) -> i64;
    fn open(path: *const u8, flags: c_int, ...) -> c_int;
    fn close(fd: c_int) -> c_int;
}

// The same numbers on every architecture (allocated after the unification).
const SYS_LANDLOCK_CREATE_RULESET: i64 = 444;
const SYS_LANDLOCK_ADD_RULE: i64 = 445;
const SYS_LANDLOCK_RESTRICT_SELF: i64 = 446;
const SYS_PRCTL: i64 = if cfg!(target_arch = "aarch64") { 167 } else { 157 };
const PR_SET_NO_NEW_PRIVS: i64 = 38;
const CREATE_RULESET_VERSION: u32 = 1;
const RULE_PATH_BENEATH: i64 = 1;
const O_PATH: c_int = 0o10000000;
const O_CLOEXEC: c_int = 0o2000000;

const WRITE_FILE: u64 = 1 << 1;
const REMOVE_DIR: u64 = 1 << 4;
const REMOVE_FILE: u64 = 1 << 5;
const MAKE_CHAR: u64 = 1 << 6;
const MAKE_DIR: u64 = 1 << 7;
const MAKE_REG: u64 = 1 << 8;
const MAKE_SOCK: u64 = 1 << 9;
const MAKE_FIFO: u64 = 1 << 10;
const MAKE_BLOCK: u64 = 1 << 11;
const MAKE_SYM: u64 = 1 << 12;
/// ABI 2: rename and link across directories.
const REFER: u64 = 1 << 13;
/// ABI 3: truncate(2), ftruncate and `O_TRUNC`.
const TRUNCATE: u64 = 1 << 14;
const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
const SCOPE_SIGNAL: u64 = 1 << 1;

#[repr(C)]
struct RulesetAttr {
    handled_access_fs: u64,
    handled_access_net: u64,
    scoped: u64,
}

#[repr(C, packed)]
struct PathBeneathAttr {
    allowed_access: u64,
    parent_fd: i32,
}

/// A ruleset the kernel accepted, ready to enforce in the command's child.
pub struct Ruleset {
    fd: c_int,
    pub abi: i64,
}

/// Every write-type right this kernel's Landlock knows.
fn write_rights(abi: i64) -> u64 {
    let mut r = WRITE_FILE
        | REMOVE_DIR
        | REMOVE_FILE
        | MAKE_CHAR
        | MAKE_DIR
        | MAKE_REG
        | MAKE_SOCK
        | MAKE_FIFO
        | MAKE_BLOCK
        | MAKE_SYM;
    if abi >= 2 {
        r |= REFER;
    }
    if abi >= 3 {
        r |= TRUNCATE;
    }
    r
}

/// The Landlock ABI version, or 0 where the kernel has none (or has it
/// disabled).
pub fn abi() -> i64 {
    // SAFETY: the version query takes no attribute pointer.
    let v = unsafe {
        syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            std::ptr::null::<RulesetAttr>(),
            0usize,
            CREATE_RULESET_VERSION,
        )
    };
    v.max(0)
}

/// Build the ruleset: all write rights beneath `rw`, writes to existing
/// files beneath `files`, both scopes where known. `Ok(None)`: no Landlock.
pub fn build(rw: &[OsString], files: &[OsString]) -> Result<Option<Ruleset>, String> {
    let abi = abi();
    if abi == 0 {
        return Ok(None);
    }
    let rights = write_rights(abi);
    let attr = RulesetAttr {
        handled_access_fs: rights,
        handled_access_net: 0,
        scoped: if abi >= 6 {
            SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL
        } else {
            0
        },
    };
    // Older kernels take the shorter struct: the fields they do not know
    // must be zero, which they are below ABI 6.
    // SAFETY: attr is valid for its size.
    let fd = unsafe {
        syscall(
            SYS_LANDLOCK_CREATE_RULESET,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0u32,
        )
    };
    if fd < 0 {
        return Err(format!(
            "landlock_create_ruleset failed (errno {})",
            super::errno()
        ));
    }
    let rs = Ruleset {
        fd: fd as c_int,
        abi,
    };
    let existing = rights & (WRITE_FILE | TRUNCATE);
    for (paths, allowed) in [(rw, rights), (files, existing)] {
        for p in paths {
            rs.allow_beneath(p, allowed)?;
        }
    }
    Ok(Some(rs))
}

impl Ruleset {
    fn allow_beneath(&self, path: &OsString, allowed: u64) -> Result<(), String> {
        let mut c = path.as_bytes().to_vec();
        c.push(0);
        // SAFETY: c is NUL-terminated.
        let dir = unsafe { open(c.as_ptr(), O_PATH | O_CLOEXEC) };
        if dir < 0 {
            // A writable place the layout did not create grants nothing.
            return Ok(());
        }
        let rule = PathBeneathAttr {
            allowed_access: allowed,
            parent_fd: dir,
        };
        // SAFETY: rule is valid for the call; dir is ours to close.
        let r = unsafe {
            let r = syscall(
                SYS_LANDLOCK_ADD_RULE,
                self.fd as i64,
                RULE_PATH_BENEATH,
                &rule as *const PathBeneathAttr,
                0u32,
            );
            close(dir);
            r
        };
        if r < 0 {
            return Err(format!(
                "landlock_add_rule({}) failed (errno {})",
                path.to_string_lossy(),
                super::errno()
            ));
        }
        Ok(())
    }

    /// Enforce on the calling thread and what it execs; only raw syscalls,
    /// so it is safe between fork and exec. Returns the errno on failure.
    pub fn restrict_self(&self) -> Result<(), c_int> {
        // SAFETY: plain syscalls on integers.
        unsafe {
            if syscall(SYS_PRCTL, PR_SET_NO_NEW_PRIVS, 1i64, 0i64, 0i64, 0i64) != 0
                || syscall(SYS_LANDLOCK_RESTRICT_SELF, self.fd as i64, 0u32) != 0
            {
                return Err(super::errno());
            }
        }
        Ok(())
    }
}
