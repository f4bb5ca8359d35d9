//! Isolation flags: no capabilities, a seccomp filter against setuid bits,
//! a new session (no TIOCSTI into the caller's terminal), the supervisor as
//! PID 1 that dies with its parent, and the starting directory.

use crate::spec::{Argv, SandboxSpec, SECCOMP_FD};

pub(crate) fn emit(spec: &SandboxSpec, a: &mut Argv) {
    a.flag2("--cap-drop", "ALL");
    if spec.seccomp {
        a.flag2("--seccomp", SECCOMP_FD.to_string());
    }
    a.push("--new-session");
    a.push("--die-with-parent");
    a.push("--as-pid-1");
    let dir = spec.chdir.clone().unwrap_or_else(|| spec.work_dir().into());
    a.flag2("--chdir", dir);
}
