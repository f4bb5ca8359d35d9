//! Run options with the real bwrap: cancellation, one combined output
//! stream, and resource limits.

mod common;

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use executor_sandbox::{
    HostEnv, Limits, MemoryEnforcement, Outcome, Output, RunOptions, RunReport, Runtime,
    SandboxError,
};

fn pipe() -> (File, OwnedFd) {
    let mut fds = [0; 2];
    // SAFETY: fds is a valid two-int array.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both descriptors were just created and are ours.
    unsafe {
        use std::os::fd::FromRawFd;
        (File::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1]))
    }
}

/// No host process has `marker` in its command line.
fn assert_none_left(marker: &str) {
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            assert!(!c.contains(marker), "left running: {c}");
        }
    }
}

fn run(
    ws: &std::path::Path,
    script: &str,
    o: RunOptions,
    limits: Option<Limits>,
) -> Result<RunReport, SandboxError> {
    require_bwrap();
    let rt = Runtime::new().expect("runtime");
    let mut spec = host_spec(&rt, ws);
    if let Some(l) = limits {
        spec.limits(l);
    }
    rt.run(&spec, &HostEnv::new(), &os(&["/bin/sh", "-c", script]), o)
}

/// Streams `script`'s combined output through a pipe and sets the cancel
/// flag as soon as the line `started` arrives: the output is live, and
/// the run ends by cancellation.
fn cancel_after_started(
    script: &str,
    grace_ms: u64,
) -> (Result<RunReport, SandboxError>, String, Duration) {
    let ws = workspace();
    let (r, w) = pipe();
    let cancel = Arc::new(AtomicBool::new(false));
    let c2 = cancel.clone();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        let mut r = BufReader::new(r);
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            if line == "started\n" {
                c2.store(true, Ordering::SeqCst);
            }
            all.push_str(&line);
            line.clear();
        }
        all
    });
    let t = Instant::now();
    let res = run(
        ws.path(),
        script,
        RunOptions {
            output: Output::Fd(w),
            cancel: Some(cancel),
            grace: Duration::from_millis(grace_ms),
            timeout: Some(Duration::from_secs(120)),
            ..opts()
        },
        None,
    );
    let took = t.elapsed();
    (res, reader.join().unwrap(), took)
}

#[test]
fn cancel_stops_the_run_with_sigterm_first() {
    let (res, log, took) = cancel_after_started(
        "trap 'echo got-sigterm; exit 0' TERM; echo started; while :; do sleep 0.05; done # cancel-term-marker",
        20_000,
    );
    assert!(
        matches!(res, Err(SandboxError::Cancelled { killed: false })),
        "{res:?}\n{log}"
    );
    assert!(log.contains("got-sigterm"), "{log}");
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert_none_left("cancel-term-marker");
}

#[test]
fn cancel_sigkills_after_the_grace_period_when_sigterm_is_ignored() {
    let (res, log, _) = cancel_after_started(
        "trap '' TERM; echo started; while :; do sleep 0.05; done # cancel-kill-marker",
        300,
    );
    assert!(
        matches!(res, Err(SandboxError::Cancelled { killed: true })),
        "{res:?}\n{log}"
    );
    assert_none_left("cancel-kill-marker");
}

/// The process group of our child whose command line holds `marker`.
fn child_pgid(marker: &str) -> Option<(i32, i32)> {
    let me = std::process::id() as i32;
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        let Ok(c) = std::fs::read(e.path().join("cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&c).contains(marker) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // pid (comm) state ppid pgrp ...
        let rest = &stat[stat.rfind(')')? + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let (ppid, pgrp): (i32, i32) = (f[1].parse().ok()?, f[2].parse().ok()?);
        if ppid == me {
            return Some((e.file_name().to_str()?.parse().ok()?, pgrp));
        }
    }
    None
}

/// With a cancel flag, a terminal's Ctrl-C must reach only the caller:
/// bwrap leads a process group of its own. Without one, nothing changes.
#[test]
fn with_a_cancel_flag_bwrap_is_out_of_the_callers_process_group() {
    for with_flag in [true, false] {
        let ws = workspace();
        let marker = format!("pgrp-marker-{with_flag}");
        let m2 = marker.clone();
        let probe = std::thread::spawn(move || {
            let until = Instant::now() + Duration::from_secs(30);
            while Instant::now() < until {
                if let Some(found) = child_pgid(&m2) {
                    return Some(found);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            None
        });
        let cancel = with_flag.then(|| Arc::new(AtomicBool::new(false)));
        let r = run(
            ws.path(),
            &format!("sleep 1 # {marker}"),
            RunOptions { cancel, ..opts() },
            None,
        )
        .unwrap();
        assert_eq!(r.outcome, Outcome::Exited(0));
        let (pid, pgrp) = probe.join().unwrap().expect("bwrap was seen running");
        // SAFETY: getpgrp has no preconditions.
        let ours = unsafe { libc::getpgrp() };
        if with_flag {
            assert_eq!(pgrp, pid, "bwrap leads its own group");
        } else {
            assert_eq!(pgrp, ours, "bwrap stays in the caller's group");
        }
    }
}

#[test]
fn an_already_cancelled_run_starts_nothing() {
    let ws = workspace();
    let res = run(
        ws.path(),
        "touch ran",
        RunOptions {
            cancel: Some(Arc::new(AtomicBool::new(true))),
            ..opts()
        },
        None,
    );
    assert!(
        matches!(res, Err(SandboxError::Cancelled { killed: false })),
        "{res:?}"
    );
    assert!(!ws.path().join("ran").exists());
}

#[test]
fn an_unset_cancel_flag_changes_nothing() {
    let ws = workspace();
    let r = run(
        ws.path(),
        "sleep 0.2; echo done; exit 4",
        RunOptions {
            cancel: Some(Arc::new(AtomicBool::new(false))),
            ..opts()
        },
        None,
    )
    .unwrap();
    assert_eq!(r.outcome, Outcome::Exited(4));
    assert_eq!(out(&r), "done\n");
    // A timeout is still a timeout.
    let r = run(
        ws.path(),
        "sleep 30",
        RunOptions {
            cancel: Some(Arc::new(AtomicBool::new(false))),
            timeout: Some(Duration::from_millis(500)),
            grace: Duration::from_millis(200),
            ..opts()
        },
        None,
    )
    .unwrap();
    assert!(
        matches!(r.outcome, Outcome::TimedOut { .. }),
        "{:?}",
        r.outcome
    );
}

#[test]
fn combined_output_keeps_the_order_of_interleaved_writes() {
    let ws = workspace();
    let (mut r, w) = pipe();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        r.read_to_string(&mut s).unwrap();
        s
    });
    let rep = run(
        ws.path(),
        "i=0; while [ $i -lt 500 ]; do i=$((i+1)); echo \"out $i\"; echo \"err $i\" >&2; done; exit 2",
        RunOptions {
            output: Output::Fd(w),
            ..opts()
        },
        None,
    )
    .unwrap();
    let log = reader.join().unwrap();
    assert_eq!(rep.outcome, Outcome::Exited(2));
    let want: String = (1..=500).map(|i| format!("out {i}\nerr {i}\n")).collect();
    assert_eq!(log, want);
    assert!(rep.stdout.is_empty() && rep.stderr.is_empty());
}

#[test]
fn combined_output_into_a_file_and_capture_mode() {
    let ws = workspace();
    let dir = workspace();
    let path = dir.path().join("log");
    let f = File::create(&path).unwrap();
    let rep = run(
        ws.path(),
        "echo a; echo b >&2; echo c",
        RunOptions {
            output: Output::Fd(f.into()),
            ..opts()
        },
        None,
    )
    .unwrap();
    assert_eq!(rep.outcome, Outcome::Exited(0));
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "a\nb\nc\n");
    // Output::Capture is capture_output.
    let rep = run(
        ws.path(),
        "echo a; echo b >&2",
        RunOptions {
            capture_output: false,
            output: Output::Capture,
            ..opts()
        },
        None,
    )
    .unwrap();
    assert_eq!((out(&rep).as_str(), err(&rep).as_str()), ("a\n", "b\n"));
}

#[test]
fn file_size_limit_fails_the_write_and_leaves_the_host_alone() {
    let ws = workspace();
    let limits = Limits {
        file_size: Some(1 << 20),
        ..Limits::default()
    };
    let r = run(
        ws.path(),
        "head -c 4194304 /dev/zero > big; echo rc=$?; ulimit -f",
        opts(),
        Some(limits),
    )
    .unwrap();
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    let o = out(&r);
    // head was stopped (SIGXFSZ: 128+25) or saw EFBIG: either way not 0.
    assert!(o.starts_with("rc=") && !o.starts_with("rc=0\n"), "{o}");
    assert!(
        o.ends_with("\n2048\n"),
        "ulimit -f is in 512-byte blocks: {o}"
    );
    let len = std::fs::metadata(ws.path().join("big")).unwrap().len();
    assert!(len <= 1 << 20, "the file grew past the limit: {len}");
    // The host (this test process) is not limited.
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: lim is a valid out-pointer.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_FSIZE, &mut lim) }, 0);
    assert_eq!(lim.rlim_cur, libc::RLIM_INFINITY);
    std::fs::write(ws.path().join("host-big"), vec![0u8; 2 << 20]).unwrap();
}

#[test]
fn open_files_limit_applies_to_the_command() {
    let ws = workspace();
    let r = run(
        ws.path(),
        "ulimit -n",
        opts(),
        Some(Limits {
            open_files: Some(64),
            ..Limits::default()
        }),
    )
    .unwrap();
    assert_eq!(out(&r).trim(), "64", "{}", err(&r));
}

/// Whether this process can make a per-run memory cgroup: root with the
/// cgroup v1 memory hierarchy mounted (a pure cgroup v2 host depends on
/// delegation; the report says which it got either way).
fn memory_cgroup_expected() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|m| {
        m.lines().any(|l| {
            l.contains(" - cgroup ")
                && l.rsplit(' ')
                    .next()
                    .is_some_and(|o| o.split(',').any(|x| x == "memory"))
        })
    })
}

#[test]
fn memory_limit_stops_an_allocation_past_it() {
    if !std::path::Path::new("/usr/bin/python3").exists() {
        panic!("/usr/bin/python3 is missing: install python3 (CI: .ci/apt-packages)");
    }
    let ws = workspace();
    let limits = Some(Limits {
        memory: Some(256 << 20),
        ..Limits::default()
    });
    let alloc = |mib: u32| {
        format!("/usr/bin/python3 -c 'b = bytearray({mib} << 20); b[::4096] = b\"x\" * len(b[::4096]); print(\"allocated\")'")
    };
    let small = run(ws.path(), &alloc(16), opts(), limits).unwrap();
    assert_eq!(small.outcome, Outcome::Exited(0), "{}", err(&small));
    assert_eq!(small.oom_kills, 0);
    let big = run(ws.path(), &alloc(1024), opts(), limits).unwrap();
    assert_ne!(big.outcome, Outcome::Exited(0), "{}", out(&big));
    assert!(!out(&big).contains("allocated"));
    if memory_cgroup_expected() {
        assert!(big.memory.is_cgroup(), "{:?}", big.memory);
    }
    if big.memory.is_cgroup() {
        // The OOM killer in the run's cgroup, and the run says so.
        assert!(big.oom_kills >= 1, "{big:?}");
        assert!(
            err(&big).contains("fhsx: the run reached its [limits] memory (256 MiB): the kernel's OOM killer ended"),
            "{}",
            err(&big)
        );
    } else {
        // RLIMIT_AS: MemoryError (exit 1), and the run says what held.
        assert_eq!(big.memory, MemoryEnforcement::AddressSpace);
        assert!(
            err(&big).contains("fhsx: [limits] memory (256 MiB) is enforced as an address-space limit (RLIMIT_AS) here"),
            "{}",
            err(&big)
        );
    }
}

/// A memory limit limits memory, not address space: a 16 GiB reservation
/// (`PROT_NONE`, `MAP_NORESERVE`) runs under 256 MiB where a memory cgroup
/// holds the limit; only the `RLIMIT_AS` fallback refuses it.
#[test]
fn memory_limit_lets_a_reservation_past_it_run() {
    let ws = workspace();
    let limits = Some(Limits {
        memory: Some(256 << 20),
        ..Limits::default()
    });
    let reserve = "/usr/bin/python3 -c 'import mmap; m = mmap.mmap(-1, 16 << 30, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | 0x4000, prot=0); print(\"reserved\")'";
    let r = run(ws.path(), reserve, opts(), limits).unwrap();
    if memory_cgroup_expected() {
        assert!(r.memory.is_cgroup(), "{:?}", r.memory);
    }
    if r.memory.is_cgroup() {
        assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
        assert_eq!(out(&r).trim(), "reserved");
        assert!(!err(&r).contains("RLIMIT_AS"), "{}", err(&r));
    } else {
        assert_ne!(r.outcome, Outcome::Exited(0), "{}", out(&r));
    }
    // No limit, no enforcement to speak of.
    let r = run(ws.path(), "true", opts(), None).unwrap();
    assert_eq!(r.memory, MemoryEnforcement::None);
}
