//! The reaper with the real bwrap: timeouts, grace, lingering daemons,
//! fork bombs, and the exit status telling them apart.

mod common;

use std::time::Duration;

use common::*;
use executor_sandbox::{HostEnv, Outcome, ReaperMode, ReaperPreference, RunOptions};

/// The timeouts leave the shell ample time to install its trap even on a
/// loaded machine; nothing asserts how long anything took.
fn timed(timeout_ms: u64, grace_ms: u64) -> RunOptions {
    RunOptions {
        timeout: Some(Duration::from_millis(timeout_ms)),
        grace: Duration::from_millis(grace_ms),
        ..opts()
    }
}

/// No host process has `marker` in its command line.
fn assert_none_left(marker: &str) {
    let mut left = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        if let Ok(c) = std::fs::read(e.path().join("cmdline")) {
            let c = String::from_utf8_lossy(&c).replace('\0', " ");
            if c.contains(marker) {
                left.push(format!("{}: {c}", e.file_name().to_string_lossy()));
            }
        }
    }
    assert!(left.is_empty(), "processes left running: {left:?}");
}

#[test]
fn reaper_timeout_sends_sigterm_first() {
    let ws = workspace();
    let r = sh_with(
        ws.path(),
        "trap 'echo got-sigterm; exit 0' TERM; echo started; while :; do sleep 0.05; done",
        &HostEnv::new(),
        timed(1500, 20_000),
    );
    assert_eq!(
        r.outcome,
        Outcome::TimedOut { killed: false },
        "{}",
        err(&r)
    );
    assert!(out(&r).contains("got-sigterm"), "{}", out(&r));
}

#[test]
fn reaper_sigkills_after_grace_when_sigterm_is_ignored() {
    let ws = workspace();
    let r = sh_with(
        ws.path(),
        "trap '' TERM; echo started; while :; do sleep 0.05; done; echo unreachable",
        &HostEnv::new(),
        timed(1500, 300),
    );
    assert_eq!(r.outcome, Outcome::TimedOut { killed: true }, "{}", err(&r));
    assert!(!out(&r).contains("unreachable"));
}

#[test]
fn reaper_pidfd_fallback_also_kills_after_grace() {
    let ws = workspace();
    let r = sh_with(
        ws.path(),
        "trap '' TERM; (trap '' TERM; setsid sleep 987653 &); while :; do sleep 0.05; done",
        &HostEnv::new(),
        RunOptions {
            reaper: ReaperPreference::PidfdOnly,
            ..timed(1500, 300)
        },
    );
    assert_eq!(r.reaper, ReaperMode::Pidfd);
    assert_eq!(r.outcome, Outcome::TimedOut { killed: true }, "{}", err(&r));
    assert_none_left("987653");
}

#[test]
fn reaper_uses_a_cgroup_when_root_can_make_one() {
    if unsafe { libc::geteuid() } != 0 {
        return; // unprivileged hosts get the pidfd mode, tested above
    }
    let ws = workspace();
    // A run cgroup left by an fhsx process that was killed (PID 0 never
    // names a live creator) is swept by the next run.
    let stale = std::path::Path::new("/sys/fs/cgroup/unified/fhsx-run-0-0");
    let made_stale = std::fs::create_dir(stale).is_ok();
    let r = sh_in(ws.path(), "true");
    match &r.reaper {
        ReaperMode::Cgroup(dir) => {
            assert!(!dir.exists(), "the run's cgroup was not removed");
            if made_stale && dir.parent() == stale.parent() {
                assert!(!stale.exists(), "a stale run cgroup was not swept");
            }
        }
        ReaperMode::Pidfd => {
            // Allowed only if this host has no writable cgroup2 with cgroup.kill.
            let mi = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
            assert!(!mi.contains(" - cgroup2 "), "cgroup2 is mounted but unused");
        }
    }
    let _ = std::fs::remove_dir(stale);
}

#[test]
fn reaper_kills_a_setsid_double_forked_daemon_when_main_exits() {
    let ws = workspace();
    let r = sh_in(
        ws.path(),
        "setsid sh -c 'sleep 987651 & echo up > /tmp/daemon-up' &
         while [ ! -e /tmp/daemon-up ]; do sleep 0.01; done
         echo main-done; exit 5",
    );
    assert_eq!(r.outcome, Outcome::Exited(5), "{}", err(&r));
    assert!(r.lingering_killed >= 1, "the daemon was not counted: {r:?}");
    assert!(!r.cgroup_leftovers, "the supervisor left processes behind");
    // The proof a build user is released idle on: it must hold when a
    // daemon tried to outlive the run, and then nothing may be left.
    assert!(r.sandbox_emptied, "the namespace's end was not seen: {r:?}");
    assert_none_left("987651");
}

#[test]
fn reaper_ends_a_fork_bomb_at_the_timeout_with_nothing_left() {
    let ws = workspace();
    // Forks as fast as it can, every child lingering; ignores SIGTERM.
    let r = sh_with(
        ws.path(),
        "trap '' TERM; while :; do sleep 987652 & done",
        &HostEnv::new(),
        timed(700, 200),
    );
    assert!(
        matches!(r.outcome, Outcome::TimedOut { .. }),
        "{:?} {}",
        r.outcome,
        err(&r)
    );
    assert_none_left("987652");
}

#[test]
fn reaper_pidfd_fallback_ends_a_fork_bomb_with_nothing_left() {
    // Without a cgroup the run returns only once PID 1 inside has finished
    // exiting, which the kernel allows only when its namespace is empty.
    let ws = workspace();
    let r = sh_with(
        ws.path(),
        "trap '' TERM; while :; do sleep 987654 & done",
        &HostEnv::new(),
        RunOptions {
            reaper: ReaperPreference::PidfdOnly,
            ..timed(700, 200)
        },
    );
    assert_eq!(r.reaper, ReaperMode::Pidfd);
    assert!(
        matches!(r.outcome, Outcome::TimedOut { .. }),
        "{:?}",
        r.outcome
    );
    assert_none_left("987654");
}

#[test]
fn exit_status_tells_exit_from_signal() {
    let ws = workspace();
    assert_eq!(sh_in(ws.path(), "exit 7").outcome, Outcome::Exited(7));
    assert_eq!(
        sh_in(ws.path(), "kill -USR1 $$").outcome,
        Outcome::Signaled(libc::SIGUSR1)
    );
    // The supervisor reads SIGTERM from a signalfd; the command must not
    // inherit it blocked.
    assert_eq!(
        sh_in(ws.path(), "kill -TERM $$").outcome,
        Outcome::Signaled(libc::SIGTERM)
    );
    assert_eq!(Outcome::Signaled(9).exit_code(), 137);
    assert!(matches!(
        Outcome::TimedOut { killed: false }.into_result(Some(Duration::from_secs(1))),
        Err(executor_sandbox::SandboxError::Timeout(_))
    ));
    assert!(matches!(
        Outcome::Signaled(9).into_result(None),
        Err(executor_sandbox::SandboxError::KilledBySignal(9))
    ));
    assert_eq!(Outcome::Exited(3).into_result(None).unwrap(), 3);
    assert_eq!(Outcome::TimedOut { killed: true }.exit_code(), 124);
}
