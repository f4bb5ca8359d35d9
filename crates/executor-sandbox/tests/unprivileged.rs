//! The same sandbox run by an unprivileged user (bwrap over user
//! namespaces, pidfd reaper). As root, the test creates a system user and
//! re-runs this test binary as that user via `runuser`; the inner half is
//! `zz_unprivileged_inner`, which does nothing unless that re-run sets
//! `FHSX_UNPRIV_WS`. Not root: the checks run directly as the caller.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use common::*;
use executor_sandbox::{HostEnv, Outcome, ReaperMode, RunOptions, Runtime};

const USER: &str = "fhsx-sbx-test";

fn inner_checks(ws: &Path) {
    require_bwrap();
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    let r = sh_in(
        ws,
        "grep '^CapEff:' /proc/self/status; id -u
         cat /etc/shadow >/dev/null 2>&1 && echo ESCAPED shadow
         ls /root >/dev/null 2>&1 && echo ESCAPED root
         for d in / /usr /etc /run; do ( : > $d/probe ) 2>/dev/null && echo ESCAPED write $d; done
         ( echo 60 > /proc/sys/vm/swappiness ) 2>/dev/null && echo ESCAPED sysctl
         unshare -U true 2>/dev/null && echo ESCAPED unshare
         mount -t tmpfs none /tmp 2>/dev/null && echo ESCAPED mount
         python3 -c \"import socket; s=socket.socket(); s.settimeout(2); s.connect(('1.1.1.1', 80)); print('ESCAPED net')\" 2>/dev/null
         echo ok > /workspace/written && echo DONE",
    );
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    let o = out(&r);
    assert!(!o.contains("ESCAPED"), "as uid {euid}: {o}");
    assert!(o.contains("CapEff:\t0000000000000000\n1000\n"), "{o}");
    assert!(o.contains("DONE"), "{o}\n{}", err(&r));
    assert!(ws.join("written").exists());

    // The reaper without a cgroup: pidfds, SIGTERM via PID 1, then SIGKILL.
    let r = sh_with(
        ws,
        "trap '' TERM; while :; do sleep 0.05; done",
        &HostEnv::new(),
        RunOptions {
            timeout: Some(Duration::from_millis(1500)),
            grace: Duration::from_millis(300),
            ..opts()
        },
    );
    if euid != 0 {
        assert_eq!(r.reaper, ReaperMode::Pidfd);
    }
    assert_eq!(r.outcome, Outcome::TimedOut { killed: true });

    // The fetch proxy forwarder and a file size limit work the same
    // without privilege (the socket is the caller's own).
    {
        use std::io::{BufRead, BufReader, Write};
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("proxy.sock");
        let l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        std::thread::spawn(move || {
            for c in l.incoming().flatten() {
                let mut r = BufReader::new(c.try_clone().unwrap());
                let mut first = String::new();
                let _ = r.read_line(&mut first);
                let body = format!("via-proxy {}", first.trim_end());
                let mut c = c;
                let _ = write!(
                    c,
                    "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let rt = Runtime::new().unwrap();
        let mut spec = host_spec(&rt, ws);
        spec.proxy(&sock, executor_sandbox::DEFAULT_PROXY_PORT)
            .unwrap();
        spec.limits(executor_sandbox::Limits {
            file_size: Some(4096),
            ..Default::default()
        });
        let r = rt
            .run(
                &spec,
                &HostEnv::new(),
                &os(&[
                    "/bin/sh",
                    "-c",
                    "curl -sS --max-time 20 --proxy http://127.0.0.1:3128 http://unpriv.invalid/; echo
                     head -c 100000 /dev/zero > /workspace/big; echo rc=$?",
                ]),
                opts(),
            )
            .unwrap();
        assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
        assert!(
            out(&r).starts_with("via-proxy GET http://unpriv.invalid/ HTTP/1.1\n"),
            "{}\n{}",
            out(&r),
            err(&r)
        );
        assert!(!out(&r).contains("rc=0"), "{}", out(&r));
        assert!(std::fs::metadata(ws.join("big")).unwrap().len() <= 4096);
    }

    // A process cap (RLIMIT_NPROC, per user namespace) stops a fork bomb
    // cold when the caller is not root.
    if euid != 0 {
        let rt = Runtime::new().unwrap();
        let mut spec = host_spec(&rt, ws);
        spec.nproc(Some(40));
        let r = rt
            .run(
                &spec,
                &HostEnv::new(),
                &os(&[
                    "/usr/bin/python3",
                    "-c",
                    "import os, time\nn = 0\nfor i in range(200):\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    n += 1\nprint('spawned', n)",
                ]),
                opts(),
            )
            .unwrap();
        assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
        let n: u32 = out(&r)
            .trim()
            .strip_prefix("spawned ")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{}", out(&r)));
        assert!(n < 40, "nproc cap not applied: {n} children");
        assert_eq!(
            r.lingering_killed, n,
            "the children outlived the main process"
        );
    }
}

#[test]
fn unprivileged_user_subset() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        let ws = workspace();
        inner_checks(ws.path());
        return;
    }
    let add = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            USER,
        ])
        .output()
        .expect("useradd is needed to create the unprivileged test user: `apt-get install passwd`");
    // 9: the user already exists.
    assert!(
        add.status.success() || add.status.code() == Some(9),
        "useradd failed: {}",
        String::from_utf8_lossy(&add.stderr)
    );
    let id = Command::new("id").args(["-u", USER]).output().unwrap();
    let uid: u32 = String::from_utf8_lossy(&id.stdout).trim().parse().unwrap();
    let ws = workspace();
    let c = std::ffi::CString::new(ws.path().to_str().unwrap()).unwrap();
    // SAFETY: valid C string.
    assert_eq!(unsafe { libc::chown(c.as_ptr(), uid, uid) }, 0);
    // A copy of this test binary the user can surely execute (the checkout
    // may sit under a directory only root can enter).
    let bin_dir = tempfile::tempdir().unwrap();
    let exe = bin_dir.path().join("unprivileged-test");
    std::fs::copy(std::env::current_exe().unwrap(), &exe).unwrap();
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(bin_dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(&exe, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let run = Command::new("runuser")
        .args(["-u", USER, "--", "env"])
        .arg(format!("FHSX_UNPRIV_WS={}", ws.path().display()))
        .arg("TMPDIR=/tmp")
        .arg(&exe)
        .args([
            "--exact",
            "zz_unprivileged_inner",
            "--nocapture",
            "--test-threads=1",
        ])
        .output()
        .expect(
            "runuser (util-linux) is needed to run as the test user: `apt-get install util-linux`",
        );
    let so = String::from_utf8_lossy(&run.stdout);
    let se = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && so.contains("1 passed"),
        "the unprivileged run failed:\n{so}\n{se}"
    );
}

/// The half of `unprivileged_user_subset` that runs as the test user.
#[test]
fn zz_unprivileged_inner() {
    let Some(ws) = std::env::var_os("FHSX_UNPRIV_WS") else {
        return;
    };
    inner_checks(Path::new(&ws));
}
