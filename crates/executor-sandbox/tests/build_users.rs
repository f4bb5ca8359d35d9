//! Build users with the real bwrap (root only; without root a spec with a
//! build user is refused): the run's processes are the build user on the
//! host and the sandbox user inside, what it writes is the build user's,
//! and a directory above a bind source that the build user may not pass
//! is an error naming it.

mod common;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};

use common::*;
use executor_sandbox::{BuildUsers, HostEnv, Outcome, Runtime, SandboxError};

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// A range of its own and a lock directory of its own per test process.
fn users(dir: &std::path::Path) -> BuildUsers {
    BuildUsers::new(2_100_000_000 + (std::process::id() % 1000) * 16, 16)
        .unwrap()
        .with_lock_dir(dir.join("locks"))
}

#[test]
fn host_isolation_a_build_user_runs_the_sandbox_and_owns_what_it_writes() {
    require_bwrap();
    let base = tempfile::tempdir().unwrap();
    let users = users(base.path());
    let user = match users.allocate() {
        Ok(u) => u,
        Err(e) => {
            assert!(!is_root(), "{e}");
            return;
        }
    };
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o711)).unwrap();
    let ws = base.path().join("ws");
    fs::create_dir(&ws).unwrap();
    std::os::unix::fs::chown(&ws, Some(user.uid()), Some(user.gid())).unwrap();
    fs::set_permissions(&ws, fs::Permissions::from_mode(0o700)).unwrap();
    let rt = Runtime::new().unwrap();
    let mut spec = host_spec(&rt, &ws);
    spec.build_user(&user);
    let script = "echo \"IDS $(id -u) $(id -g) $(id -G)\"; echo x > /workspace/made; \
                  grep -E '^(Uid|Gid|CapEff):' /proc/self/status";
    let r = rt
        .run(
            &spec,
            &HostEnv::new(),
            &os(&["/bin/sh", "-c", script]),
            opts(),
        )
        .unwrap();
    assert_eq!(r.outcome, Outcome::Exited(0), "{}{}", out(&r), err(&r));
    assert!(out(&r).contains("IDS 1000 100 100\n"), "{}", out(&r));
    assert!(out(&r).contains("CapEff:\t0000000000000000"), "{}", out(&r));
    let m = fs::metadata(ws.join("made")).unwrap();
    assert_eq!((m.uid(), m.gid()), (user.uid(), user.gid()));

    // A directory above the work directory that the build user may not
    // pass through: refused before bwrap starts, naming it.
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o700)).unwrap();
    let e = rt
        .run(&spec, &HostEnv::new(), &os(&["/bin/true"]), opts())
        .unwrap_err();
    match &e {
        SandboxError::BadPath { path, .. } => assert_eq!(path, base.path(), "{e}"),
        other => panic!("not a BadPath: {other}"),
    }
    assert!(e.to_string().contains("o+x"), "{e}");
    fs::set_permissions(base.path(), fs::Permissions::from_mode(0o711)).unwrap();
}

#[test]
fn host_isolation_a_build_user_needs_root() {
    if is_root() {
        return;
    }
    let base = tempfile::tempdir().unwrap();
    let e = users(base.path()).allocate().unwrap_err();
    assert!(matches!(e, SandboxError::NoBuildUser { .. }), "{e}");
}
