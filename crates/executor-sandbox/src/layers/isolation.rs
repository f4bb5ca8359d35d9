//! Isolation flags: no capabilities, a new session (no TIOCSTI into the
//! caller's terminal), the supervisor as PID 1 that dies with its parent,
//! and the starting directory.

use crate::spec::{Argv, SandboxSpec};

pub(crate) fn emit(spec: &SandboxSpec, a: &mut Argv) {
    a.flag2("--cap-drop", "ALL");
    a.push("--new-session");
    a.push("--die-with-parent");
    a.push("--as-pid-1");
    let dir = spec.chdir.clone().unwrap_or_else(|| spec.work_dir().into());
    a.flag2("--chdir", dir);
}
