//! Escapes tried from inside a real sandbox (host root, as `fhsx run` uses
//! it). Each must fail. These run the real bwrap; as root in CI, and a
//! subset as an unprivileged user (tests/unprivileged.rs).
//!
//! Test names start with the contract invariant they prove
//! (spec/executor-sandbox-contract.txt): `no_read_outside_declared_closure`,
//! `no_write_outside_build_scratch`, `network_containment`
//! (`[eos-build-sandbox-network-containment]`) and `host_isolation`
//! (`[eos-build-sandbox-host-isolation]`).

mod common;

use std::ffi::OsString;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use common::*;
use executor_sandbox::{HostEnv, Outcome, RunOptions, Runtime, Stdin};

fn ok(r: &executor_sandbox::RunReport) {
    assert_eq!(
        r.outcome,
        Outcome::Exited(0),
        "stdout:\n{}\nstderr:\n{}",
        out(r),
        err(r)
    );
}

/// Each line of `script` output must be `BLOCKED ...`; any `ESCAPED` fails.
fn assert_all_blocked(r: &executor_sandbox::RunReport) {
    ok(r);
    let o = out(r);
    assert!(
        !o.contains("ESCAPED"),
        "an escape worked:\n{o}\nstderr:\n{}",
        err(r)
    );
    assert!(
        o.contains("BLOCKED"),
        "the probe did not run:\n{o}\nstderr:\n{}",
        err(r)
    );
}

#[test]
fn no_read_outside_declared_closure_etc_shadow() {
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "if cat /etc/shadow >/dev/null 2>&1; then echo ESCAPED; else echo BLOCKED; fi
         if [ -e /etc/shadow ] || [ -e /etc/gshadow ] || [ -e /etc/sudoers ]; then echo ESCAPED; else echo BLOCKED; fi",
    );
    assert_all_blocked(&r);
}

#[test]
fn no_read_outside_declared_closure_root_home_and_unbound_host_paths() {
    let ws = workspace();
    // A file on the host next to the workspace: the sandbox's /tmp is its own.
    let marker = tempfile::NamedTempFile::new().unwrap();
    let marker = marker.path().to_str().unwrap().to_string();
    let script = format!(
        "for p in /root /home /var /work /srv /opt /mnt /boot /sys /etc/hostname /etc/hosts {marker} {ws}; do
           if ls \"$p\" >/dev/null 2>&1; then echo \"ESCAPED $p\"; else echo \"BLOCKED $p\"; fi
         done",
        ws = ws.path().display()
    );
    let r = sh_in(ws.path(), &script);
    assert_all_blocked(&r);
}

/// The supervisor is a host file bwrap execs as PID 1 from a descriptor
/// (no mount of it): the command finds no path to it, may not read it
/// through PID 1, and cannot exec it through the descriptor, which PID 1
/// closed before the command existed.
#[test]
fn no_read_outside_declared_closure_the_supervisor_runs_but_cannot_be_read() {
    use std::os::unix::fs::PermissionsExt;
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "for p in /run/fhsx/supervisor /proc/1/exe /proc/1/mem /proc/1/maps /proc/1/environ /proc/1/fd/6 /proc/self/fd/6; do
           if head -c 1 \"$p\" >/dev/null 2>&1; then echo \"ESCAPED $p\"; else echo \"BLOCKED $p\"; fi
         done
         if ls /proc/1/map_files/ 2>/dev/null | grep -q .; then echo ESCAPED map_files; else echo BLOCKED map_files; fi
         if readlink /proc/1/exe >/dev/null 2>&1; then echo ESCAPED readlink; else echo BLOCKED readlink; fi
         /proc/1/exe -- true 2>/dev/null; echo \"BLOCKED exec-pid1 $?\"
         /proc/self/fd/6 -- true 2>/dev/null; echo \"BLOCKED exec-fd $?\"
         if grep -qw supervisor /proc/self/mountinfo; then echo ESCAPED mounted; else echo BLOCKED mounted; fi
         [ \"$(readlink /proc/self/exe)\" = /usr/bin/readlink ] && echo BLOCKED self-exe-is-the-command",
    );
    assert_all_blocked(&r);
    let o = out(&r);
    // Neither the path through PID 1 nor the descriptor gets it run.
    assert!(o.contains("BLOCKED exec-pid1 126"), "{o}");
    assert!(o.contains("BLOCKED exec-fd 127"), "{o}");
    assert!(o.contains("BLOCKED self-exe-is-the-command"), "{o}");
    let rt = Runtime::new().expect("runtime");
    let mode = std::fs::metadata(&rt.paths().supervisor)
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(
        mode & 0o7777,
        0o111,
        "the installed supervisor is not execute-only"
    );
}

#[test]
fn no_write_outside_build_scratch_host_root() {
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "for d in / /usr /usr/bin /etc /etc/ssl/certs /run /run/fhsx /dev /proc /workspace/.. /bin /lib; do
           if ( : > \"$d/fhsx-probe\" ) 2>/dev/null; then echo \"ESCAPED $d\"; else echo \"BLOCKED $d\"; fi
           if mkdir \"$d/fhsx-probe-dir\" 2>/dev/null; then echo \"ESCAPED mkdir $d\"; fi
         done
         if ( echo 60 > /proc/sys/vm/swappiness ) 2>/dev/null; then echo ESCAPED sysctl; else echo BLOCKED sysctl; fi
         if ( : > /run/fhsx/supervisor ) 2>/dev/null; then echo ESCAPED supervisor; fi
         if chmod 777 /usr/bin 2>/dev/null; then echo ESCAPED chmod; else echo BLOCKED chmod; fi
         echo w > /workspace/inside.txt && echo t > /tmp/t && echo s > /dev/shm/s && echo BLOCKED-writable-ok",
    );
    assert_all_blocked(&r);
    assert!(out(&r).contains("BLOCKED-writable-ok"), "{}", out(&r));
    // The workspace write is the one that reached the host.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("inside.txt")).unwrap(),
        "w\n"
    );
    assert!(!std::path::Path::new("/fhsx-probe").exists());
    assert!(!std::path::Path::new("/usr/fhsx-probe").exists());
}

#[test]
fn host_isolation_mount_and_remount_rw_fail() {
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "mkdir -p /tmp/m
         if mount -t tmpfs none /tmp/m 2>/dev/null; then echo ESCAPED mount; else echo BLOCKED mount; fi
         if mount --bind /tmp /tmp/m 2>/dev/null; then echo ESCAPED bind; else echo BLOCKED bind; fi
         if mount -o remount,rw /usr 2>/dev/null; then echo ESCAPED remount-usr; else echo BLOCKED remount-usr; fi
         if mount -o remount,rw / 2>/dev/null; then echo ESCAPED remount-root; else echo BLOCKED remount-root; fi
         if mount -o remount,bind,rw /usr 2>/dev/null; then echo ESCAPED remount-bind; else echo BLOCKED remount-bind; fi
         if umount /usr 2>/dev/null; then echo ESCAPED umount; else echo BLOCKED umount; fi
         if ( : > /usr/fhsx-probe ) 2>/dev/null; then echo ESCAPED write-after; else echo BLOCKED write-after; fi",
    );
    assert_all_blocked(&r);
}

#[test]
fn host_isolation_unshare_user_namespace_fails() {
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "if unshare -U true 2>/dev/null; then echo ESCAPED unshare-U; else echo BLOCKED unshare-U; fi
         if unshare -r true 2>/dev/null; then echo ESCAPED unshare-r; else echo BLOCKED unshare-r; fi
         if unshare -m true 2>/dev/null; then echo ESCAPED unshare-m; else echo BLOCKED unshare-m; fi
         if unshare -n true 2>/dev/null; then echo ESCAPED unshare-n; else echo BLOCKED unshare-n; fi",
    );
    assert_all_blocked(&r);
}

fn python_connect(target: &str) -> String {
    format!(
        "python3 - <<'EOF'
import socket
{target}
try:
    s.settimeout(3)
    s.connect(addr)
    print('ESCAPED', addr)
except Exception as e:
    print('BLOCKED', type(e).__name__, e)
EOF"
    )
}

#[test]
fn network_containment_host_loopback_tcp() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        &python_connect(&format!(
            "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); addr = ('127.0.0.1', {port})"
        )),
    );
    assert_all_blocked(&r);
    assert!(
        listener.accept().is_err(),
        "the host listener saw a connection from the sandbox"
    );
}

#[test]
fn network_containment_host_abstract_unix_socket() {
    use std::os::linux::net::SocketAddrExt;
    let name = format!("fhsx-test-abstract-{}", std::process::id());
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&addr).unwrap();
    listener.set_nonblocking(true).unwrap();
    // The host can reach it (the probe is meaningful)…
    let probe = std::os::unix::net::UnixStream::connect_addr(&addr).unwrap();
    drop(probe);
    let _ = listener.accept();
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        &python_connect(&format!(
            "s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); addr = '\\0{name}'"
        )),
    );
    // …the sandbox cannot.
    assert_all_blocked(&r);
    assert!(
        listener.accept().is_err(),
        "the host abstract socket saw a connection"
    );
}

#[test]
fn network_containment_external_addresses() {
    let ws = workspace();
    let mut script = String::new();
    for target in [
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); addr = ('1.1.1.1', 80)",
        "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); addr = ('8.8.8.8', 53); s.connect(addr); s.send(b'x'); addr = ('8.8.8.8', 53)",
        "s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM); addr = ('2606:4700:4700::1111', 80)",
        "s = socket.socket(socket.AF_INET, socket.SOCK_STREAM); addr = (socket.gethostbyname('static.crates.io'), 443)",
    ] {
        script.push_str(&python_connect(target));
        script.push('\n');
    }
    script.push_str("ip -o link 2>/dev/null | grep -v ' lo:' | grep -q . && echo ESCAPED interfaces || echo BLOCKED interfaces\n");
    let r = sh_in(ws.path(), &script);
    assert_all_blocked(&r);
}

#[test]
fn host_isolation_tiocsti_on_the_terminal_fails() {
    let mut master: libc::c_int = -1;
    let mut slave: libc::c_int = -1;
    // SAFETY: valid out-pointers; null name/termios/winsize are allowed.
    let rc = unsafe {
        libc::openpty(
            &mut master,
            &mut slave,
            std::ptr::null_mut(),
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    assert_eq!(rc, 0, "openpty failed: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned these fds to us.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let ws = workspace();
    let o = RunOptions {
        stdin: Stdin::Fd(slave),
        ..opts()
    };
    let r = sh_with(
        ws.path(),
        "[ -t 0 ] && echo is-a-tty
         python3 - <<'EOF'
import fcntl, termios
try:
    fcntl.ioctl(0, termios.TIOCSTI, b'X')
    print('ESCAPED TIOCSTI')
except OSError as e:
    print('BLOCKED', e)
EOF",
        &HostEnv::new(),
        o,
    );
    assert_all_blocked(&r);
    assert!(
        out(&r).contains("is-a-tty"),
        "the probe had no terminal: {}",
        out(&r)
    );
    // Nothing was pushed into the terminal's input queue.
    let mut m = std::fs::File::from(master);
    // SAFETY: fcntl on our own fd.
    unsafe {
        libc::fcntl(
            std::os::fd::AsRawFd::as_raw_fd(&m),
            libc::F_SETFL,
            libc::O_NONBLOCK,
        )
    };
    let mut buf = [0u8; 64];
    if let Ok(n) = m.read(&mut buf) {
        assert!(!buf[..n].contains(&b'X'), "TIOCSTI injected input");
    }
}

#[test]
fn host_isolation_kill_minus_one_leaves_the_host_alone() {
    let mut bystander = std::process::Command::new("sleep")
        .arg("60")
        .spawn()
        .unwrap();
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "sleep 60 & bg=$!
         kill -9 -1
         kill -9 1 2>/dev/null
         wait $bg; st=$?
         if [ $st -eq 137 ]; then echo BLOCKED sandbox-only; else echo ESCAPED not-killed $st; fi",
    );
    // kill -1 inside reaches the sandbox's own processes (the background
    // job), not PID 1 and nothing on the host.
    assert_all_blocked(&r);
    assert!(
        bystander.try_wait().unwrap().is_none(),
        "a host process was killed from inside the sandbox"
    );
    bystander.kill().unwrap();
    let _ = bystander.wait();
}

#[test]
fn host_isolation_inherited_fd_without_cloexec_is_not_visible() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("leaky-secret-file");
    std::fs::write(&secret, b"secret").unwrap();
    let c = std::ffi::CString::new(secret.to_str().unwrap()).unwrap();
    // SAFETY: valid C string; deliberately without O_CLOEXEC.
    let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY) };
    assert!(fd >= 0);
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        &format!(
            "ls -l /proc/self/fd/ | grep -- '->' ;
             [ -e /proc/self/fd/{fd} ] && [ {fd} -gt 3 ] && echo ESCAPED self-fd
             for f in /proc/1/fd/*; do readlink $f >/dev/null 2>&1 && echo ESCAPED pid1-fd $f; done
             cat /proc/1/environ >/dev/null 2>&1 && echo ESCAPED pid1-environ
             echo BLOCKED"
        ),
    );
    // SAFETY: our own fd.
    unsafe { libc::close(fd) };
    assert_all_blocked(&r);
    let o = out(&r);
    assert!(
        !o.contains("leaky-secret"),
        "the leaked fd is visible:\n{o}"
    );
    // The command sees stdio and ls' own directory fd only; PID 1 adds only
    // its signalfd and control socket.
    let fds: Vec<&str> = o
        .lines()
        .filter(|l| l.contains("->"))
        .filter_map(|l| l.split("->").next()?.split_whitespace().last())
        .collect();
    assert!(
        fds.iter().all(|f| ["0", "1", "2", "3"].contains(f)),
        "unexpected fds: {fds:?}\n{o}"
    );
}

#[test]
fn host_isolation_env_outside_the_whitelist_is_not_seen() {
    require_bwrap();
    let ws = workspace();
    let rt = Runtime::new().unwrap();
    let mut spec = host_spec(&rt, ws.path());
    spec.allow_env("WF_RUN_ID").unwrap();
    spec.allow_env("ABSENT_VAR").unwrap();
    spec.set_env("LANG", "C.UTF-8").unwrap();
    let mut env: HostEnv = std::env::vars_os().collect();
    env.insert("WF_RUN_ID".into(), "r1".into());
    env.insert("DSH_HOME".into(), "/home/someone/.dsh".into());
    env.insert("AWS_SECRET_ACCESS_KEY".into(), "hunter2".into());
    let r = rt.run(&spec, &env, &os(&["/usr/bin/env"]), opts()).unwrap();
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    let mut seen: Vec<String> = out(&r).lines().map(|s| s.to_string()).collect();
    seen.sort();
    assert_eq!(
        seen,
        // PWD is bwrap's, from --chdir: the in-sandbox work directory.
        vec![
            "LANG=C.UTF-8",
            "PWD=/workspace",
            "WF_RPC_SOCK=/run/wf.sock",
            "WF_RUN_ID=r1"
        ],
        "only whitelisted variables may cross"
    );
}

#[test]
fn host_isolation_hostname_and_host_paths_in_proc_1_cmdline_are_hidden() {
    let host_name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "hostname; cat /proc/sys/kernel/hostname; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
    );
    ok(&r);
    let o = out(&r);
    let mut lines = o.lines();
    assert_eq!(lines.next(), Some("fhsx"));
    assert_eq!(lines.next(), Some("fhsx"));
    assert!(!o.contains(host_name.trim()), "host hostname leaked:\n{o}");
    let ws_s = ws.path().to_str().unwrap();
    // The host's temp dir below which runtimes live ("/tmp" alone is the
    // sandbox's own, named in the supervisor's Landlock flags).
    let tmp = format!("{}/", std::env::temp_dir().display());
    for needle in [ws_s, tmp.as_str(), "bwrap", "fhsx-0", "/root"] {
        assert!(!o.contains(needle), "{needle:?} visible in a cmdline:\n{o}");
    }
    assert!(
        o.contains("/proc/self/fd/6 --control-fd 3 --landlock-rw /workspace"),
        "{o}"
    );
}

#[test]
fn host_isolation_capabilities_are_all_zero() {
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "grep -E '^Cap(Inh|Prm|Eff|Bnd|Amb)' /proc/self/status; id -u; id -g",
    );
    ok(&r);
    let o = out(&r);
    for cap in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        let line = o
            .lines()
            .find(|l| l.starts_with(cap))
            .unwrap_or_else(|| panic!("{o}"));
        assert!(line.ends_with("0000000000000000"), "non-zero {line}");
    }
    assert!(o.contains("\n1000\n100"), "{o}");
}

#[test]
fn host_isolation_setuid_bit_does_not_take_effect() {
    let ws = workspace();
    let bin = ws.path().join("suid-id");
    std::fs::copy("/usr/bin/id", &bin).unwrap();
    let c = std::ffi::CString::new(bin.to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    unsafe {
        assert_eq!(
            libc::chown(c.as_ptr(), 4242, 4242),
            0,
            "chown (the test runs as root)"
        );
        assert_eq!(libc::chmod(c.as_ptr(), 0o6755), 0);
    }
    let r = sh_in(
        ws.path(),
        "ls -ln /workspace/suid-id; u=$(/workspace/suid-id -u); g=$(/workspace/suid-id -g)
         if [ \"$u\" = 1000 ] && [ \"$g\" = 100 ]; then echo BLOCKED; else echo ESCAPED $u $g; fi
         grep -q ' /workspace .*nosuid' /proc/self/mounts && echo BLOCKED nosuid || echo ESCAPED suid-mount",
    );
    assert_all_blocked(&r);
}

#[test]
fn host_isolation_no_setuid_file_can_be_planted_in_the_workspace() {
    // As root, files made inside are owned by host root: a setuid bit set
    // inside would make a setuid-root program on the host after the run.
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "cp /usr/bin/id /workspace/planted
         chmod u+s /workspace/planted 2>/dev/null && echo ESCAPED chmod-u+s
         chmod 4755 /workspace/planted 2>/dev/null && echo ESCAPED chmod-4755
         chmod g+s /workspace/planted 2>/dev/null && echo ESCAPED chmod-g+s
         install -m 4755 /usr/bin/id /workspace/installed 2>/dev/null && echo ESCAPED install
         mkdir -m 2755 /workspace/sgid-dir 2>/dev/null
         python3 -c \"import os; os.close(os.open('/workspace/created', os.O_CREAT | os.O_WRONLY, 0o6755))\" 2>/dev/null
         chmod 755 /workspace/planted && echo BLOCKED plain-chmod-still-works",
    );
    assert_all_blocked(&r);
    assert!(out(&r).contains("plain-chmod-still-works"), "{}", out(&r));
    for e in std::fs::read_dir(ws.path()).unwrap().flatten() {
        use std::os::unix::fs::PermissionsExt;
        let mode = e.metadata().unwrap().permissions().mode();
        let is_dir = e.file_type().unwrap().is_dir();
        assert!(
            mode & 0o4000 == 0 && (is_dir || mode & 0o2000 == 0),
            "{} has mode {mode:o} on the host",
            e.path().display()
        );
    }
}

#[test]
fn masked_state_and_dsh_home_never_cross() {
    require_bwrap();
    let ws = workspace();
    std::fs::create_dir(ws.path().join(".dsh-run")).unwrap();
    std::fs::write(ws.path().join(".dsh-run/state"), "run-secret").unwrap();
    std::fs::create_dir_all(ws.path().join("home/.dsh")).unwrap();
    std::fs::write(ws.path().join("home/.dsh/token"), "dsh-secret").unwrap();
    let rt = Runtime::new().unwrap();
    let spec = host_spec(&rt, ws.path());
    let mut env = HostEnv::new();
    env.insert(
        "DSH_HOME".into(),
        ws.path().join("home/.dsh").into_os_string(),
    );
    let cmd: Vec<OsString> = os(&[
        "/bin/sh",
        "-c",
        "ls -A /workspace/.dsh-run /workspace/home/.dsh; cat /workspace/.dsh-run/state /workspace/home/.dsh/token 2>/dev/null;
         if ( : > /workspace/.dsh-run/x ) 2>/dev/null; then echo ESCAPED; else echo BLOCKED; fi
         env | grep -c DSH || true",
    ]);
    let r = rt.run(&spec, &env, &cmd, opts()).unwrap();
    assert_all_blocked(&r);
    let o = out(&r);
    assert!(!o.contains("secret"), "{o}");
    assert!(o.trim_end().ends_with('0'), "DSH_HOME crossed as env: {o}");
    // The host's state is untouched.
    assert_eq!(
        std::fs::read_to_string(ws.path().join(".dsh-run/state")).unwrap(),
        "run-secret"
    );
}

#[test]
fn rpc_bridge_answers_a_ping_from_inside() {
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "python3 - <<'EOF'
import os, socket, struct, json
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(os.environ['WF_RPC_SOCK'])
for req in ({'op': 'ping'}, {'op': 'status'}):
    body = json.dumps(req).encode()
    s.sendall(struct.pack('>I', len(body)) + body)
    n = struct.unpack('>I', s.recv(4, socket.MSG_WAITALL))[0]
    print(json.loads(s.recv(n, socket.MSG_WAITALL)))
EOF",
    );
    ok(&r);
    let o = out(&r);
    assert!(o.contains("'result': 'pong'"), "{o}\n{}", err(&r));
    assert!(o.contains("'result': 'status'"), "{o}");
}

#[test]
fn a_missing_command_exits_127() {
    let ws = workspace();
    require_bwrap();
    let rt = Runtime::new().unwrap();
    let spec = host_spec(&rt, ws.path());
    let r = rt
        .run(&spec, &HostEnv::new(), &os(&["/no/such/cmd"]), opts())
        .unwrap();
    assert_eq!(r.outcome, Outcome::Exited(127));
    assert!(err(&r).contains("cannot run"), "{}", err(&r));
    let _ = Duration::ZERO;
}
