//! Landlock, the second wall: each test takes away the first wall (a
//! writable bind the ruleset does not list, the host's network namespace)
//! by running the real supervisor under a hand-built bwrap, and shows that
//! Landlock alone still refuses — and that without the ruleset the same
//! attempt succeeds, so the test is not vacuous. The scoping of signals is
//! checked in the real sandbox.
//!
//! These need a kernel with Landlock ABI ≥ 6 (Linux 6.12, `lsm=…,landlock`)
//! and fail, naming that, where it is missing.

mod common;

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixListener};
use std::path::Path;
use std::process::{Command, Output};

use common::*;
use executor_sandbox::Runtime;

fn landlock_abi() -> i64 {
    // SAFETY: the version query takes no attribute pointer.
    unsafe { libc::syscall(444, std::ptr::null::<u8>(), 0usize, 1u32) }
}

fn require_landlock_scopes() -> i64 {
    let abi = landlock_abi();
    assert!(
        abi >= 6,
        "this kernel's Landlock ABI is {abi} (<0: none); these tests need ABI 6 (Linux ≥ 6.12 booted with landlock in `lsm=`)"
    );
    abi
}

/// `bwrap` around the real supervisor: host root read-only, `ws` bound
/// writable at /var/tmp (a mount point every Debian host has), the host network namespace shared; the supervisor
/// gets `landlock` flags, then runs `sh -c script`.
fn supervised(ws: &Path, landlock: &[&str], script: &str) -> Output {
    require_bwrap();
    let rt = Runtime::new().expect("runtime");
    Command::new(rt.bwrap())
        .args(["--unshare-pid", "--as-pid-1", "--die-with-parent"])
        .args(["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"])
        .args(["--tmpfs", "/tmp", "--tmpfs", "/run", "--ro-bind"])
        .arg(&rt.paths().supervisor)
        .arg("/run/supervisor")
        .arg("--bind")
        .arg(ws)
        .arg("/var/tmp")
        .args(["--", "/run/supervisor"])
        .args(landlock)
        .args(["--", "/bin/sh", "-c", script])
        .output()
        .expect("run bwrap")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn no_write_outside_build_scratch_even_through_a_writable_mount_landlock_does_not_list() {
    require_landlock_scopes();
    let ws = workspace();
    let script =
        "echo x > /var/tmp/planted && echo WROTE; mkdir /var/tmp/d 2>/dev/null && echo MKDIR; \
                  ln -s / /var/tmp/l 2>/dev/null && echo SYMLINK; echo ok > /tmp/t && echo TMP; \
                  echo > /dev/null && echo DEVNULL";
    let o = supervised(
        ws.path(),
        &["--landlock-rw", "/tmp", "--landlock-files", "/dev"],
        script,
    );
    let s = stdout(&o);
    assert!(
        o.status.success(),
        "{s}{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(
        !s.contains("WROTE") && !s.contains("MKDIR") && !s.contains("SYMLINK"),
        "{s}"
    );
    // The listed places still work.
    assert!(s.contains("TMP") && s.contains("DEVNULL"), "{s}");
    assert_eq!(std::fs::read_dir(ws.path()).unwrap().count(), 0);

    // Without a ruleset the very same mount takes the writes.
    let o = supervised(ws.path(), &[], script);
    let s = stdout(&o);
    assert!(s.contains("WROTE") && s.contains("MKDIR"), "{s}");
}

#[test]
fn network_containment_host_abstract_socket_refused_even_in_the_host_network_namespace() {
    require_landlock_scopes();
    let name = format!("fhsx-landlock-abstract-{}", std::process::id());
    let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    let ws = workspace();
    let script = format!(
        "python3 -c \"import socket; s = socket.socket(socket.AF_UNIX); s.connect('\\0{name}'); print('CONNECTED')\" 2>&1"
    );
    let o = supervised(ws.path(), &["--landlock-rw", "/tmp"], &script);
    let s = stdout(&o);
    assert!(!s.contains("CONNECTED"), "{s}");
    assert!(
        s.contains("PermissionError") || s.contains("Operation not permitted"),
        "{s}"
    );
    assert!(
        listener.accept().is_err(),
        "the host socket saw a connection"
    );

    // Without a ruleset the shared namespace lets it through.
    let o = supervised(ws.path(), &[], &script);
    assert!(stdout(&o).contains("CONNECTED"), "{}", stdout(&o));
    assert!(listener.accept().is_ok());
}

#[test]
fn host_isolation_the_command_cannot_signal_its_supervisor() {
    let abi = require_landlock_scopes();
    let ws = workspace();
    // Same uid, same PID namespace: only Landlock's signal scope stands
    // between the command and PID 1 (whose status report it could forge
    // or whose termination relay it could trigger).
    let r = sh_in(
        ws.path(),
        "kill -0 1 2>/dev/null && echo ESCAPED signal; \
         sleep 30 & kill -0 $! && echo OWN-CHILD-OK; kill $!",
    );
    let o = out(&r);
    assert!(!o.contains("ESCAPED"), "{o}");
    assert!(o.contains("OWN-CHILD-OK"), "{o}{}", err(&r));
    assert_eq!(
        i64::from(r.landlock_abi),
        abi,
        "the supervisor reports the ABI it enforced"
    );
}
