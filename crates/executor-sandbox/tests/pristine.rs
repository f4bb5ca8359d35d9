//! Nothing of the caller's process state crosses into the sandbox. One
//! test in its own binary: it spoils its own process state (which every
//! thread of a test binary shares) before it runs the sandbox.

mod common;

use common::*;
use executor_sandbox::Outcome;

/// What the command sees of its process state (`/proc/self/...` of a
/// child of the shell, as a build's tools see theirs).
const PROBE: &str = r#"
grep -E '^(SigIgn|SigBlk|Cpus_allowed_list):' /proc/self/status
echo "umask $(umask)"
echo "nice $(cut -d' ' -f19 /proc/self/stat)"
echo "policy $(cut -d' ' -f41 /proc/self/stat)"
echo "personality $(cat /proc/self/personality)"
echo "oom_score_adj $(cat /proc/self/oom_score_adj)"
echo "stack $(ulimit -S -s) $(ulimit -H -s)"
echo "core $(ulimit -S -c) $(ulimit -H -c)"
echo "nofile $(ulimit -S -n) $(ulimit -H -n)"
echo "cpu $(ulimit -S -t) $(ulimit -H -t)"
echo "as $(ulimit -S -v) $(ulimit -H -v)"
echo "memlock $(ulimit -S -l) $(ulimit -H -l)"
"#;

fn state(ws: &std::path::Path) -> String {
    let r = sh_in(ws, PROBE);
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    out(&r)
}

fn line<'a>(s: &'a str, key: &str) -> &'a str {
    s.lines()
        .find_map(|l| l.strip_prefix(key))
        .map(str::trim)
        .unwrap_or_else(|| panic!("no {key} in:\n{s}"))
}

#[test]
fn host_isolation_the_callers_process_state_never_crosses() {
    let ws = workspace();
    let clean = state(ws.path());
    // Raising a hard limit takes CAP_SYS_RESOURCE and lowering nice
    // CAP_SYS_NICE (root may lack either, in a container).
    let raise = has_cap(24);
    let renice = has_cap(23);

    // Spoil everything a caller's process state can carry.
    // SAFETY: plain calls on this process; the harness runs no other test
    // in this binary.
    unsafe {
        for sig in [
            libc::SIGINT,
            libc::SIGQUIT,
            libc::SIGHUP,
            libc::SIGTERM,
            libc::SIGUSR1,
        ] {
            libc::signal(sig, libc::SIG_IGN);
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGUSR2);
        libc::sigaddset(&mut set, libc::SIGWINCH);
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        libc::umask(0o077);
        libc::setpriority(libc::PRIO_PROCESS, 0, 7);
        let param = libc::sched_param { sched_priority: 0 };
        libc::sched_setscheduler(0, libc::SCHED_BATCH, &param);
        let mut cpus: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut cpus);
        libc::sched_setaffinity(0, std::mem::size_of_val(&cpus), &cpus);
        libc::personality(libc::ADDR_NO_RANDOMIZE as libc::c_ulong);
        let lim = |res, cur: u64, max: u64| {
            let l = libc::rlimit {
                rlim_cur: cur,
                rlim_max: max,
            };
            libc::setrlimit(res, &l);
        };
        let hard = |res| {
            let mut l: libc::rlimit = std::mem::zeroed();
            libc::getrlimit(res, &mut l);
            l.rlim_max
        };
        // Without CAP_SYS_RESOURCE a hard limit, once lowered, stays
        // lowered: spoil only the soft ones there.
        let stack_max = if raise {
            1 << 20
        } else {
            hard(libc::RLIMIT_STACK)
        };
        lim(libc::RLIMIT_STACK, 1 << 20, stack_max);
        let cpu_max = if raise {
            100_000
        } else {
            hard(libc::RLIMIT_CPU)
        };
        lim(libc::RLIMIT_CPU, 100_000, cpu_max);
        lim(libc::RLIMIT_NOFILE, 200, hard(libc::RLIMIT_NOFILE));
        lim(
            libc::RLIMIT_CORE,
            0,
            if raise { 0 } else { hard(libc::RLIMIT_CORE) },
        );
        let adj = b"300";
        let _ = std::fs::write("/proc/self/oom_score_adj", adj);
    }
    let spoiled = state(ws.path());

    assert_eq!(line(&clean, "SigIgn:"), "0000000000000000", "{clean}");
    assert_eq!(line(&clean, "SigBlk:"), "0000000000000000", "{clean}");
    assert_eq!(line(&clean, "umask"), "0022", "{clean}");
    assert_eq!(line(&clean, "policy"), "0", "{clean}");
    assert_eq!(line(&clean, "personality"), "00000000", "{clean}");
    assert_eq!(line(&clean, "oom_score_adj"), "500", "{clean}");
    assert_eq!(line(&clean, "stack"), "8192 unlimited", "{clean}");
    assert_eq!(line(&clean, "cpu"), "unlimited unlimited", "{clean}");
    assert_eq!(line(&clean, "as"), "unlimited unlimited", "{clean}");
    assert!(line(&clean, "core").starts_with("0 "), "{clean}");
    assert!(line(&clean, "nofile").starts_with("1024 "), "{clean}");
    if raise {
        assert_eq!(line(&clean, "core"), "0 unlimited", "{clean}");
        assert_eq!(line(&clean, "nofile"), "1024 524288", "{clean}");
        assert_eq!(line(&clean, "memlock"), "8192 8192", "{clean}");
    }
    if renice {
        assert_eq!(line(&clean, "nice"), "0", "{clean}");
        assert_eq!(spoiled, clean, "the caller's process state crossed");
    } else {
        // A raised nice value is the one thing a caller without
        // CAP_SYS_NICE (or RLIMIT_NICE) cannot take back.
        let without_nice = |s: &str| -> Vec<String> {
            s.lines()
                .filter(|l| !l.starts_with("nice "))
                .map(String::from)
                .collect()
        };
        assert_eq!(
            without_nice(&spoiled),
            without_nice(&clean),
            "the caller's process state crossed"
        );
    }
}

/// Whether this process has capability `bit` in its effective set.
fn has_cap(bit: u32) -> bool {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << bit) != 0)
}
