//! `fhsx run` end to end: exit status passthrough, --print-argv, timeout,
//! signals, environment flags. Runs the real bwrap.

use std::process::{Command, Output};

fn fhsx_run(ws: &std::path::Path, args: &[&str]) -> Output {
    assert!(
        Command::new("bwrap").arg("--version").output().is_ok(),
        "bubblewrap is not installed: `apt-get install bubblewrap`"
    );
    Command::new(env!("CARGO_BIN_EXE_fhsx"))
        .arg("run")
        .arg("--workspace")
        .arg(ws)
        .args(args)
        .env("FHSX_CLI_SECRET", "s3cret")
        .output()
        .expect("run fhsx")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn run_exits_with_the_commands_status() {
    let ws = tempfile::tempdir().unwrap();
    let o = fhsx_run(
        ws.path(),
        &["--", "/bin/sh", "-c", "echo hi > /workspace/f; exit 42"],
    );
    assert_eq!(o.status.code(), Some(42), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("f")).unwrap(),
        "hi\n"
    );
    let o = fhsx_run(ws.path(), &["--", "/bin/true"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
}

#[test]
fn run_reports_a_signal_as_128_plus_n() {
    let ws = tempfile::tempdir().unwrap();
    let o = fhsx_run(ws.path(), &["--", "/bin/sh", "-c", "kill -TERM $$"]);
    assert_eq!(o.status.code(), Some(128 + 15), "{o:?}");
    assert!(String::from_utf8_lossy(&o.stderr).contains("killed by SIGTERM"));
}

#[test]
fn run_timeout_stops_the_command_and_says_so() {
    let ws = tempfile::tempdir().unwrap();
    let o = fhsx_run(ws.path(), &["--timeout", "300ms", "--", "sleep", "30"]);
    assert_eq!(o.status.code(), Some(1), "{o:?}");
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("timeout"),
        "{o:?}"
    );
}

#[test]
fn run_print_argv_shows_the_argv_without_running() {
    let ws = tempfile::tempdir().unwrap();
    let o = fhsx_run(
        ws.path(),
        &[
            "--print-argv",
            "--allow-env",
            "FHSX_CLI_SECRET",
            "--set-env",
            "A=b",
            "--",
            "/bin/sh",
            "-c",
            "touch /workspace/ran",
        ],
    );
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let lines: Vec<String> = stdout(&o).lines().map(String::from).collect();
    assert!(lines[0].ends_with("bwrap"), "{lines:?}");
    assert!(lines
        .windows(2)
        .any(|w| w[0] == "--unshare-all" && w[1] == "--unshare-user"));
    assert!(lines
        .windows(3)
        .any(|w| w == ["--setenv", "FHSX_CLI_SECRET", "s3cret"]));
    assert!(lines.windows(3).any(|w| w == ["--setenv", "A", "b"]));
    assert!(
        !ws.path().join("ran").exists(),
        "--print-argv ran the command"
    );
}

#[test]
fn run_passes_only_whitelisted_environment() {
    let ws = tempfile::tempdir().unwrap();
    let o = fhsx_run(ws.path(), &["--set-env", "K=v", "--", "/usr/bin/env"]);
    assert_eq!(o.status.code(), Some(0), "{o:?}");
    let out = stdout(&o);
    assert!(out.contains("K=v\n"), "{out}");
    assert!(!out.contains("FHSX_CLI_SECRET"), "{out}");
    let o = fhsx_run(
        ws.path(),
        &["--allow-env", "FHSX_CLI_SECRET", "--", "/usr/bin/env"],
    );
    assert!(stdout(&o).contains("FHSX_CLI_SECRET=s3cret"), "{o:?}");
}

#[test]
fn run_refuses_dsh_home_and_a_missing_workspace() {
    let ws = tempfile::tempdir().unwrap();
    let o = fhsx_run(ws.path(), &["--allow-env", "DSH_HOME", "--", "/bin/true"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
    let o = fhsx_run(&ws.path().join("nope"), &["--", "/bin/true"]);
    assert_eq!(o.status.code(), Some(2), "{o:?}");
}

/// A command that asks the RPC bridge something and hangs up before the
/// answer leaves the bridge serving: fifty hang-ups, then a ping that
/// waits for its pong, and `fhsx run` ends with the command's status. The
/// answers meet closed sockets (EPIPE: std sends them with
/// `MSG_NOSIGNAL`, seen with strace), and each hung-up connection must
/// give its slot back — with the slot kept, the bridge refuses every
/// connection after the sixteenth and this fails.
#[test]
fn hang_ups_on_the_rpc_bridge_leave_it_serving() {
    let ws = tempfile::tempdir().unwrap();
    let script = "import os, socket, struct, json, time
def frame(req):
    body = json.dumps(req).encode()
    return struct.pack('>I', len(body)) + body
for _ in range(50):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ['WF_RPC_SOCK'])
    try:
        s.sendall(frame({'op': 'status'}))
    except (BrokenPipeError, ConnectionResetError):
        pass  # refused while at its limit: closed before the request
    s.close()
# The hung-up connections count against the bridge's limit until it has
# served them; until then it answers 'too many connections'.
for _ in range(100):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(os.environ['WF_RPC_SOCK'])
    s.sendall(frame({'op': 'ping'}))
    n = struct.unpack('>I', s.recv(4, socket.MSG_WAITALL))[0]
    answer = json.loads(s.recv(n, socket.MSG_WAITALL))
    s.close()
    if answer['result'] != 'error':
        break
    time.sleep(0.02)
print(answer['result'])
";
    let o = fhsx_run(ws.path(), &["--", "/usr/bin/python3", "-c", script]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "the command could not reach the bridge after the hang-ups, or fhsx run did not end with its status: {o:?}"
    );
    assert_eq!(stdout(&o), "pong\n", "{o:?}");
}
