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

use crate::sys::{self, CStr, Errno};

const CREATE_RULESET_VERSION: usize = 1;
const RULE_PATH_BENEATH: usize = 1;

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
    fd: i32,
    pub abi: usize,
}

/// Every write-type right this kernel's Landlock knows.
fn write_rights(abi: usize) -> u64 {
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
pub fn abi() -> usize {
    // SAFETY: the version query takes no attribute pointer.
    unsafe {
        sys::syscall(
            sys::SYS_LANDLOCK_CREATE_RULESET,
            [0, 0, CREATE_RULESET_VERSION, 0, 0, 0],
        )
    }
    .unwrap_or(0)
}

/// What failed while building a ruleset: the call, the path (if any) and
/// the errno.
pub struct Failure {
    pub call: &'static str,
    pub path: Option<CStr>,
    pub errno: Errno,
}

/// Build the ruleset: all write rights beneath `rw`, writes to existing
/// files beneath `files`, both scopes where known. `Ok(None)`: no Landlock.
pub fn build(rw: &[CStr], files: &[CStr]) -> Result<Option<Ruleset>, Failure> {
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
        sys::syscall(
            sys::SYS_LANDLOCK_CREATE_RULESET,
            [
                &attr as *const RulesetAttr as usize,
                core::mem::size_of::<RulesetAttr>(),
                0,
                0,
                0,
                0,
            ],
        )
    }
    .map_err(|errno| Failure {
        call: "landlock_create_ruleset",
        path: None,
        errno,
    })?;
    let rs = Ruleset { fd: fd as i32, abi };
    let existing = rights & (WRITE_FILE | TRUNCATE);
    for (paths, allowed) in [(rw, rights), (files, existing)] {
        for &p in paths {
            rs.allow_beneath(p, allowed)?;
        }
    }
    Ok(Some(rs))
}

impl Ruleset {
    fn allow_beneath(&self, path: CStr, allowed: u64) -> Result<(), Failure> {
        // SAFETY: path comes from argv: NUL-terminated.
        let Ok(dir) = (unsafe { sys::open(path, sys::O_PATH | sys::O_CLOEXEC) }) else {
            // A writable place the layout did not create grants nothing.
            return Ok(());
        };
        let rule = PathBeneathAttr {
            allowed_access: allowed,
            parent_fd: dir,
        };
        // SAFETY: rule is valid for the call.
        let r = unsafe {
            sys::syscall(
                sys::SYS_LANDLOCK_ADD_RULE,
                [
                    self.fd as usize,
                    RULE_PATH_BENEATH,
                    &rule as *const PathBeneathAttr as usize,
                    0,
                    0,
                    0,
                ],
            )
        };
        sys::close(dir);
        r.map(|_| ()).map_err(|errno| Failure {
            call: "landlock_add_rule",
            path: Some(path),
            errno,
        })
    }

    /// Enforce on the calling process and what it execs; raw syscalls
    /// only, so it is safe between fork and exec. The errno on failure.
    pub fn restrict_self(&self) -> Result<(), Errno> {
        sys::prctl(sys::PR_SET_NO_NEW_PRIVS, 1)?;
        // SAFETY: integer arguments.
        unsafe {
            sys::syscall(
                sys::SYS_LANDLOCK_RESTRICT_SELF,
                [self.fd as usize, 0, 0, 0, 0, 0],
            )
        }
        .map(|_| ())
    }
}
