//! The scratch pool of `fhsx build` (`--scratch-pool N`, `FHSX_SCRATCH_POOL`):
//! disk scratch file systems kept between the actions of one graph build,
//! in one process. An action on a recycled scratch sees nothing of the one
//! before it — not its files, modes, xattrs, ACLs, inode flags, `/build`'s
//! times, nor which inodes it used — and once `fhsx build` exits, nothing
//! of the pool is left mounted.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use support::{busybox, fhsx, text};

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "scratch file systems (and so their pool) need root: run the tests as root"
    );
}

/// Mount points under `dir`.
fn mounts_under(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|mp| mp.starts_with(&d))
        .map(str::to_owned)
        .collect()
}

/// What a failed test leaves: nothing mounted under its directory, so the
/// directory can go.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        for mp in mounts_under(self.0) {
            let _ = Command::new("umount").arg("-l").arg(&mp).status();
        }
    }
}

/// `fhsx build --rebuild ACTION` with a pool of `n`: the `out` output's
/// digest and how many of the graph's builds ran on a recycled scratch.
fn build(store: &Path, action: &Path, n: usize) -> (String, u64) {
    let o = fhsx(store)
        .env("FHSX_SCRATCH_POOL", n.to_string())
        .env("FHSX_TIMINGS", "1")
        .args(["--json", "build", "--rebuild"])
        .arg(action)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    let recycled = err
        .lines()
        .find_map(|l| {
            l.strip_prefix("fhsx: timings: ")?
                .strip_suffix(" of the graph's builds ran on a recycled scratch")
        })
        .map_or(0, |n| n.parse().unwrap());
    (
        v["outputs"]["out"].as_str().unwrap_or_default().to_owned(),
        recycled,
    )
}

fn write_action(dir: &Path, name: &str, closure: &[&str], script: &str, env: &str) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    let closure: Vec<String> = closure.iter().map(|c| format!("\"{c}\"")).collect();
    fs::write(
        &p,
        format!(
            "[inputs]\nclosure = [{}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"{script}\"]\nenv = {{ {env} }}\n[limits]\ndisk = 268435456\n",
            closure.join(", ")
        ),
    )
    .unwrap();
    p
}

/// A graph of two actions: `first` (run anew each time: `nonce` is in its
/// environment) leaves its traces, then the probe, which names `first`'s
/// output so that it runs after it, prints everything it can see of its
/// scratch. On a pool of one the probe runs on `first`'s recycled scratch;
/// on none, on a fresh one. Their outputs are equal: nothing crossed. One
/// that grows `/build` past a block is not recycled.
#[test]
fn a_recycled_scratch_shows_nothing_of_the_build_before() {
    require_root();
    let t = tempfile::tempdir().unwrap();
    let _unmount = Unmount(t.path());
    let store = t.path().join("store");
    let bb = busybox(&store);
    let probe = support::scratch_probe(&store, t.path());
    let graph = |mode: &str, nonce: u32| {
        write_action(
            t.path(),
            mode,
            &[&bb, &probe],
            &format!("busybox mkdir $out && /usr/bin/scratch-probe {mode} > $out/state"),
            &format!("NONCE = \"{nonce}\""),
        );
        write_action(
            t.path(),
            &format!("probe-after-{mode}"),
            &[&bb, &probe, &format!("{mode}.toml#out")],
            // The probe looks before anything changes `/build` (its own
            // `mkdir $out` would set the directory's mtime).
            "/usr/bin/scratch-probe probe > /build/home/state && busybox mkdir $out && busybox mv /build/home/state $out/state",
            "",
        )
    };
    let state = |out: &str| {
        let o = fhsx(&store)
            .args(["store", "cat", out, "state"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };

    let (fresh, recycled) = build(&store, &graph("litter", 1), 0);
    assert_eq!(recycled, 0);
    let (again, recycled) = build(&store, &graph("litter", 2), 1);
    assert_eq!(recycled, 1, "the probe did not run on the littered scratch");
    assert!(
        mounts_under(t.path()).is_empty(),
        "the pool outlived fhsx: {:?}",
        mounts_under(t.path())
    );
    assert_eq!(
        again,
        fresh,
        "the recycled scratch differs from a fresh one:\nfresh:\n{}\nrecycled:\n{}",
        state(&fresh),
        state(&again)
    );
    assert!(
        state(&fresh).contains("atime 1.000000000 mtime 1.000000000\n"),
        "{}",
        state(&fresh)
    );

    let (_, recycled) = build(&store, &graph("grow", 3), 1);
    assert_eq!(
        recycled, 0,
        "a scratch whose /build outgrew its block was recycled"
    );
    support::no_leftovers(t.path());
}

/// The littering action itself reported each trace as left: otherwise
/// the comparison above would prove less.
#[test]
fn every_trace_the_probe_leaves_is_left() {
    require_root();
    let t = tempfile::tempdir().unwrap();
    let _unmount = Unmount(t.path());
    let store = t.path().join("store");
    let bb = busybox(&store);
    let probe = support::scratch_probe(&store, t.path());
    let litter = write_action(
        t.path(),
        "litter",
        &[&bb, &probe],
        "busybox mkdir $out && /usr/bin/scratch-probe litter > $out/state",
        "",
    );
    let (out, _) = build(&store, &litter, 1);
    let o = fhsx(&store)
        .args(["store", "cat", &out, "state"])
        .output()
        .unwrap();
    let littered = String::from_utf8_lossy(&o.stdout);
    assert!(
        littered.contains("times done") && !littered.contains("refused"),
        "a trace could not even be left: {littered}"
    );
    assert!(mounts_under(t.path()).is_empty());
}

/// Builds one after another, each its own process with a pool: none
/// leaves a scratch mounted once it has exited.
#[test]
fn nothing_of_a_pool_outlives_its_process() {
    require_root();
    let t = tempfile::tempdir().unwrap();
    let _unmount = Unmount(t.path());
    let store = t.path().join("store");
    let bb = busybox(&store);
    let a = write_action(t.path(), "a", &[&bb], "busybox mkdir $out", "");
    for _ in 0..5 {
        build(&store, &a, 2);
        assert!(
            mounts_under(t.path()).is_empty(),
            "a pool outlived its process: {:?}",
            mounts_under(t.path())
        );
    }
    support::no_leftovers(t.path());
}
