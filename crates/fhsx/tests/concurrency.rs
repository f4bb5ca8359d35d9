//! Many builds at once never fail each other, and builds killed outright
//! leave nothing that outlives the next build: real bwrap, FUSE, loop
//! devices and cgroups.

mod support;

use std::fs;
use std::path::Path;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use support::{busybox, fhsx, text};

/// Loop devices whose backing file lies under `dir`.
fn loops_under(dir: &Path) -> Vec<String> {
    let Ok(rd) = fs::read_dir("/sys/block") else {
        return Vec::new();
    };
    rd.flatten()
        .filter_map(|e| fs::read_to_string(e.path().join("loop/backing_file")).ok())
        .filter(|b| b.starts_with(dir.to_str().unwrap()))
        .collect()
}

/// Per-run cgroups (`fhsx-run-PID-N`) that the fhsx processes `pids` left
/// in any hierarchy. Only theirs: the chaos test in this binary kill -9s
/// builds at the same time, whose cgroups stay until a later build sweeps
/// them (a full run caught this).
fn run_cgroups_of(pids: &std::collections::HashSet<u32>) -> Vec<String> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut left = Vec::new();
    for line in mounts.lines().filter(|l| l.contains(" - cgroup")) {
        let Some(point) = line.split(' ').nth(4) else {
            continue;
        };
        let mut stack = vec![std::path::PathBuf::from(point)];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
                    let name = e.file_name().to_string_lossy().into_owned();
                    if let Some(rest) = name.strip_prefix("fhsx-run-") {
                        let creator = rest.split('-').next().and_then(|p| p.parse().ok());
                        if creator.is_some_and(|p| pids.contains(&p)) {
                            left.push(e.path().display().to_string());
                        }
                    } else if stack.len() < 64 {
                        stack.push(e.path());
                    }
                }
            }
        }
    }
    left
}

fn assert_nothing_left(dir: &Path, store: &Path) {
    support::no_leftovers(dir);
    assert!(
        loops_under(dir).is_empty(),
        "loop devices left: {:?}",
        loops_under(dir)
    );
    let v = fhsx(store).args(["store", "verify"]).output().unwrap();
    assert!(v.status.success(), "store damaged: {}", text(&v));
}

/// `dir/a.toml`: `script` run by busybox's sh over the closure `bb`.
fn busybox_action(dir: &Path, bb: &str, script: &str) -> std::path::PathBuf {
    let action = dir.join("a.toml");
    fs::write(
        &action,
        format!("[inputs]\nclosure = [\"{bb}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {script:?}]\ntimeout = \"10m\"\n"),
    )
    .unwrap();
    action
}

fn start(store: &Path, action: &Path) -> Child {
    fhsx(store)
        .args(["--json", "build", "--rebuild"])
        .arg(action)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// 150 builds of one trivial action started at once (each `--rebuild`, so
/// each really runs): every one succeeds, and nothing is left.
#[test]
fn one_hundred_fifty_concurrent_builds_all_succeed() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = busybox_action(t.path(), &bb, "busybox mkdir $out && echo ok > $out/f");
    let children: Vec<Child> = (0..150).map(|_| start(&store, &action)).collect();
    let pids: std::collections::HashSet<u32> = children.iter().map(Child::id).collect();
    let mut failed = Vec::new();
    let mut records = std::collections::HashSet::new();
    for c in children {
        let o = c.wait_with_output().unwrap();
        if o.status.success() {
            let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
            records.insert(v["record"].as_str().unwrap().to_owned());
        } else {
            failed.push(text(&o));
        }
    }
    assert!(
        failed.is_empty(),
        "{} of 150 failed; first: {}",
        failed.len(),
        failed[0]
    );
    // Records differ only by their wall time, so some coincide.
    for r in &records {
        let v = fhsx(&store).args(["record", "verify", r]).output().unwrap();
        assert!(v.status.success(), "{}", text(&v));
    }
    assert_nothing_left(t.path(), &store);
    let left = run_cgroups_of(&pids);
    assert!(left.is_empty(), "cgroups left: {left:?}");
}

/// 24 builds at once while a driver kill -9s a third of them at random
/// moments: every build not killed succeeds with a record that verifies;
/// the next build sweeps what the killed ones left; nothing stays mounted
/// or attached, and the store verifies.
#[test]
fn chaos_builds_killed_at_random_leave_nothing_and_fail_no_other() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = busybox_action(
        t.path(),
        &bb,
        "busybox mkdir $out && busybox ls -R /usr > $out/ls && busybox usleep $(( $$ % 7 * 50000 )) && echo ok > $out/f",
    );
    let key = String::from_utf8(
        fhsx(&store)
            .args(["key", "generate"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    let key = key.trim().to_owned();
    let n = 24;
    let mut children: Vec<Option<Child>> = (0..n).map(|_| Some(start(&store, &action))).collect();
    // A cheap deterministic shuffle: which to kill, and when (0–600 ms).
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15 ^ u64::from(std::process::id());
    let mut next = || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let mut victims: Vec<(usize, Duration)> = Vec::new();
    while victims.len() < n / 3 {
        let i = (next() % n as u64) as usize;
        if !victims.iter().any(|(v, _)| *v == i) {
            victims.push((i, Duration::from_millis(next() % 600)));
        }
    }
    victims.sort_by_key(|v| v.1);
    let t0 = Instant::now();
    for (i, at) in &victims {
        if let Some(d) = at.checked_sub(t0.elapsed()) {
            std::thread::sleep(d);
        }
        if let Some(c) = children[*i].as_mut() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(c.id() as i32, libc::SIGKILL) };
        }
    }
    let mut failed = Vec::new();
    for (i, c) in children.iter_mut().enumerate() {
        let o = c.take().unwrap().wait_with_output().unwrap();
        if victims.iter().any(|(v, _)| *v == i) {
            continue;
        }
        if !o.status.success() {
            failed.push(text(&o));
            continue;
        }
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let check = fhsx(&store)
            .args([
                "record",
                "verify",
                v["record"].as_str().unwrap(),
                "--trust",
                &key,
            ])
            .output()
            .unwrap();
        if !check.status.success() {
            failed.push(text(&check));
        }
    }
    assert!(
        failed.is_empty(),
        "{} builds not killed failed; first: {}",
        failed.len(),
        failed[0]
    );
    // The orphans die with their bwrap parent; the next build sweeps the rest.
    std::thread::sleep(Duration::from_millis(500));
    let o = start(&store, &action).wait_with_output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_nothing_left(t.path(), &store);
}
