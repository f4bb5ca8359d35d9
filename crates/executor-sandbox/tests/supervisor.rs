//! The supervisor binary on its own.

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use executor_sandbox::supervisor::SUPERVISOR_BYTES;

/// Outside a PID namespace of its own the supervisor must refuse to start:
/// as anything but PID 1 its `kill(-1)` would reach the host's processes.
/// Tried inside a throw-away PID namespace (as PID 2), so that even a
/// regression could only hit that namespace.
#[test]
fn supervisor_refuses_to_run_unless_pid_1() {
    let dir = tempfile::tempdir().unwrap();
    let sup = dir.path().join("fhsx-supervisor");
    std::fs::write(&sup, SUPERVISOR_BYTES).unwrap();
    std::fs::set_permissions(&sup, std::fs::Permissions::from_mode(0o755)).unwrap();
    let script = format!("{} -- /bin/true; echo rc=$?", sup.display());
    let out = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--pid",
            "--fork",
            "/bin/sh",
            "-c",
            &script,
        ])
        .output()
        .expect("unshare (util-linux) is needed: `apt-get install util-linux`");
    let so = String::from_utf8_lossy(&out.stdout);
    let se = String::from_utf8_lossy(&out.stderr);
    assert!(so.contains("rc=125"), "stdout: {so}\nstderr: {se}");
    assert!(se.contains("must run as PID 1"), "{se}");
}
