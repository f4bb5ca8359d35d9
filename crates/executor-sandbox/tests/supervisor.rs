//! The supervisor binary: on its own, and how it starts the command
//! (as `execvp` does: a bare name searched on `PATH`, a file without `#!`
//! run by `/bin/sh`, a failure reported as exit 127 naming the command).

mod common;

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

fn run_in(
    ws: &std::path::Path,
    path: Option<&str>,
    command: &[&str],
) -> executor_sandbox::RunReport {
    common::require_bwrap();
    let rt = executor_sandbox::Runtime::new().unwrap();
    let mut spec = common::host_spec(&rt, ws);
    if let Some(p) = path {
        spec.set_env("PATH", p).unwrap();
    }
    rt.run(
        &spec,
        &executor_sandbox::HostEnv::new(),
        &common::os(command),
        common::opts(),
    )
    .unwrap()
}

/// The command exited with `code`; else fail showing its stderr.
fn assert_exited(r: &executor_sandbox::RunReport, code: i32) {
    assert_eq!(
        r.outcome,
        executor_sandbox::Outcome::Exited(code),
        "{}",
        common::err(r)
    );
}

#[test]
fn a_bare_command_name_is_found_on_path_or_the_default_path() {
    let ws = common::workspace();
    // No PATH in the sandbox's environment: execvp's default, /bin:/usr/bin.
    let r = run_in(ws.path(), None, &["true"]);
    assert_exited(&r, 0);
    // A PATH naming the workspace first: the tool there, not a host one.
    let tool = ws.path().join("true");
    std::fs::write(&tool, "#!/bin/sh\necho workspace-true \"$@\"\n").unwrap();
    std::fs::set_permissions(&tool, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = run_in(
        ws.path(),
        Some("/workspace:/usr/bin:/bin"),
        &["true", "a b"],
    );
    assert_exited(&r, 0);
    assert_eq!(common::out(&r), "workspace-true a b\n");
}

#[test]
fn a_script_without_an_interpreter_line_runs_under_bin_sh() {
    let ws = common::workspace();
    let script = ws.path().join("plain");
    std::fs::write(&script, "echo plain-script \"$1\"; exit 7\n").unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let r = run_in(ws.path(), None, &["/workspace/plain", "arg"]);
    assert_exited(&r, 7);
    assert_eq!(common::out(&r), "plain-script arg\n");
}

#[test]
fn a_name_found_nowhere_on_path_exits_127_naming_it() {
    let ws = common::workspace();
    let r = run_in(
        ws.path(),
        Some("/workspace:/usr/bin"),
        &["no-such-tool-here"],
    );
    assert_exited(&r, 127);
    let e = common::err(&r);
    assert!(
        e.contains("cannot run \"no-such-tool-here\"") && e.contains("No such file or directory"),
        "{e}"
    );
    // Found but not executable: permission denied, as execvp reports.
    std::fs::write(ws.path().join("noexec"), "echo never\n").unwrap();
    std::fs::set_permissions(
        ws.path().join("noexec"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let r = run_in(ws.path(), Some("/workspace:/usr/bin"), &["noexec"]);
    assert_exited(&r, 127);
    assert!(
        common::err(&r).contains("Permission denied"),
        "{}",
        common::err(&r)
    );
}
