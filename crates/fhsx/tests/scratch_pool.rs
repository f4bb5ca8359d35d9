//! The scratch pool of `fhsx build` (`--scratch-pool N`, `FHSX_SCRATCH_POOL`):
//! disk scratch file systems parked in `$TMPDIR` between the builds of
//! separate processes. A build on a parked scratch sees nothing of the one
//! before it; at most N of a size are parked; an expired one, or one whose
//! owner is not root alone, is never used, and the expired ones go.

mod support;

use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
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

/// The parked areas in `dir`.
fn parked(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fhsx-parked-"))
        .map(|e| e.path())
        .collect();
    v.sort();
    v
}

/// Mount points under `dir`, each with the device it is mounted from and
/// its mount id (one mount's own: a device number may be reused).
fn mounts_under(dir: &Path) -> Vec<(String, String)> {
    let d = dir.to_string_lossy().into_owned();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let id = pre.split(' ').next()?;
            let mp = pre.split(' ').nth(4)?;
            let src = post.split(' ').nth(1)?;
            mp.starts_with(&d)
                .then(|| (mp.to_owned(), format!("{src} (mount {id})")))
        })
        .collect()
}

/// What a test leaves: nothing mounted under its directory (parked
/// scratches included), so the directory can go.
struct Unmount<'a>(&'a Path);

impl Drop for Unmount<'_> {
    fn drop(&mut self) {
        for (mp, _) in mounts_under(self.0) {
            let _ = Command::new("umount").arg("-l").arg(&mp).status();
        }
    }
}

/// `fhsx build --rebuild` with a pool of `n`; the output's digest.
fn build(store: &Path, action: &Path, n: usize) -> String {
    let o = fhsx(store)
        .env("FHSX_SCRATCH_POOL", n.to_string())
        .args(["--json", "build", "--rebuild"])
        .arg(action)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["outputs"]["out"].as_str().unwrap_or_default().to_owned()
}

fn write_action(dir: &Path, name: &str, closure: &[&str], script: &str) -> PathBuf {
    let p = dir.join(format!("{name}.toml"));
    let closure: Vec<String> = closure.iter().map(|c| format!("\"{c}\"")).collect();
    fs::write(
        &p,
        format!(
            "[inputs]\nclosure = [{}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"{script}\"]\n[limits]\ndisk = 268435456\n",
            closure.join(", ")
        ),
    )
    .unwrap();
    p
}

/// A build parks its scratch, and the next process's build runs on it
/// (the same loop device) and sees exactly what a fresh scratch shows:
/// one action litters it (a hidden directory, one of mode 000, a FIFO, a
/// symlink, an xattr and a default ACL on `/build`, inode flags new files
/// inherit, mode 1777), and the probe run after it on the parked scratch
/// prints the same as on a fresh one. One that grows `/build` past a block
/// or writes 80 MiB to the device is removed, not parked.
#[test]
fn a_parked_scratch_is_reused_and_shows_nothing_of_the_build_before() {
    require_root();
    let t = tempfile::tempdir().unwrap();
    let _unmount = Unmount(t.path());
    let store = t.path().join("store");
    let bb = busybox(&store);
    let probe = support::scratch_probe(&store, t.path());
    let action = |name: &str, mode: &str| {
        write_action(
            t.path(),
            name,
            &[&bb, &probe],
            &format!("busybox mkdir $out && /usr/bin/scratch-probe {mode} > $out/state"),
        )
    };
    let state = |out: &str| {
        let o = fhsx(&store)
            .args(["store", "cat", out, "state"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (probe_a, litter_a, grow_a) = (
        action("probe", "probe"),
        action("litter", "litter"),
        action("grow", "grow"),
    );

    let fresh = build(&store, &probe_a, 1);
    let first = mounts_under(t.path());
    assert_eq!(parked(t.path()).len(), 1, "nothing was parked: {first:?}");
    assert_eq!(first.len(), 1, "{first:?}");
    assert!(first[0].0.ends_with("/build"), "{first:?}");
    let area = parked(t.path()).remove(0);
    let m = fs::metadata(&area).unwrap();
    assert_eq!(
        (m.uid(), m.mode() & 0o7777),
        (0, 0o700),
        "a parked area is not root's alone"
    );

    let littered = state(&build(&store, &litter_a, 1));
    assert!(
        !littered.contains("refused"),
        "a trace could not even be left, so this proves less: {littered}"
    );
    assert_eq!(
        mounts_under(t.path()),
        first,
        "the littered scratch was not parked again on its own device"
    );
    let again = build(&store, &probe_a, 1);
    assert_eq!(
        mounts_under(t.path()),
        first,
        "the probe did not run on the parked scratch"
    );
    assert_eq!(
        again,
        fresh,
        "the parked scratch differs from a fresh one:\nfresh:\n{}\nparked:\n{}",
        state(&fresh),
        state(&again)
    );

    build(&store, &grow_a, 1);
    assert!(
        parked(t.path()).is_empty() && mounts_under(t.path()).is_empty(),
        "a scratch whose /build outgrew its block was parked: {:?}",
        mounts_under(t.path())
    );
    assert_eq!(
        build(&store, &probe_a, 1),
        fresh,
        "a fresh scratch after the removed one differs"
    );
    let spill = write_action(
        t.path(),
        "spill",
        &[&bb],
        "busybox mkdir $out && busybox dd if=/dev/zero of=/build/spill bs=1M count=80 2>/dev/null; busybox sync; busybox rm -f /build/spill",
    );
    build(&store, &spill, 1);
    assert!(
        parked(t.path()).is_empty(),
        "a scratch that wrote 80 MiB to the host was parked: {:?}",
        mounts_under(t.path())
    );
    support::no_leftovers(t.path());
}

/// Builds at once park at most N scratches of a size; the rest are
/// removed. Parked ones whose time is up are taken down by the next
/// build's sweep (without a pool of its own), mounts and all; a build
/// with `FHSX_SCRATCH_POOL=0` parks nothing.
#[test]
fn at_most_n_are_parked_and_expired_ones_go() {
    require_root();
    let t = tempfile::tempdir().unwrap();
    let _unmount = Unmount(t.path());
    let store = t.path().join("store");
    let bb = busybox(&store);
    let slow = write_action(
        t.path(),
        "slow",
        &[&bb],
        "busybox mkdir $out && busybox sleep 1",
    );
    // Three builds at once (each sleeps a second: they overlap).
    let procs: Vec<_> = (0..3)
        .map(|_| {
            fhsx(&store)
                .env("FHSX_SCRATCH_POOL", "2")
                .args(["build", "--rebuild"])
                .arg(&slow)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut p in procs {
        assert!(p.wait().unwrap().success());
    }
    let areas = parked(t.path());
    assert!(
        !areas.is_empty() && areas.len() <= 2,
        "expected one or two parked scratches: {areas:?}"
    );
    assert_eq!(mounts_under(t.path()).len(), areas.len());

    // Their time up (as if parked ten minutes ago): the next build, which
    // parks nothing, takes them down.
    for a in &areas {
        let old = std::time::SystemTime::now() - std::time::Duration::from_secs(600);
        fs::File::options()
            .write(true)
            .open(a.join(".lock"))
            .unwrap()
            .set_modified(old)
            .unwrap();
    }
    build(&store, &slow, 0);
    assert!(
        parked(t.path()).is_empty(),
        "expired parked scratches stayed: {:?}",
        parked(t.path())
    );
    support::no_leftovers(t.path());
}

/// A directory under a parked area's name that is not root's alone (one
/// planted in a shared `/tmp` by another user) is never taken, never
/// swept and never written: the build makes its own scratch, and with
/// that slot taken, parks nothing.
#[test]
fn a_planted_slot_is_left_alone() {
    require_root();
    let t = tempfile::tempdir().unwrap();
    let _unmount = Unmount(t.path());
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = write_action(t.path(), "a", &[&bb], "busybox mkdir $out");
    let planted = t.path().join("fhsx-parked-268435456-0");
    fs::create_dir_all(planted.join("build")).unwrap();
    fs::write(planted.join(".lock"), b"").unwrap();
    fs::write(planted.join(".fresh"), b"{}").unwrap();
    fs::write(planted.join("build/bait"), b"bait").unwrap();
    fs::set_permissions(&planted, fs::Permissions::from_mode(0o755)).unwrap();
    std::os::unix::fs::lchown(&planted, Some(65534), Some(65534)).unwrap();
    // Long expired: a sweep that took it would remove it.
    let old = std::time::SystemTime::now() - std::time::Duration::from_secs(3600);
    fs::File::options()
        .write(true)
        .open(planted.join(".lock"))
        .unwrap()
        .set_modified(old)
        .unwrap();
    build(&store, &action, 1);
    build(&store, &action, 1);
    assert_eq!(
        fs::read(planted.join("build/bait")).unwrap(),
        b"bait",
        "the planted slot was touched"
    );
    assert_eq!(fs::metadata(&planted).unwrap().uid(), 65534);
    assert!(
        mounts_under(t.path()).is_empty(),
        "with the only slot planted, a scratch was parked anyway: {:?}",
        mounts_under(t.path())
    );
    assert_eq!(parked(t.path()), vec![planted]);
}

/// A build killed outright while on a parked scratch leaves it dirty (and
/// its view mounted) under the slot's name: the next build does not take
/// it, takes it down instead (nothing of it stays mounted), and parks its
/// own fresh scratch there.
#[test]
fn a_killed_builds_slot_is_taken_down_not_reused() {
    require_root();
    let t = tempfile::tempdir().unwrap();
    let _unmount = Unmount(t.path());
    let store = t.path().join("store");
    let bb = busybox(&store);
    let quick = write_action(t.path(), "quick", &[&bb], "busybox mkdir $out");
    let slow = write_action(
        t.path(),
        "slow",
        &[&bb],
        "busybox mkdir $out && busybox touch /build/dirt && busybox sleep 300",
    );
    build(&store, &quick, 1);
    let slot = parked(t.path());
    assert_eq!(slot.len(), 1, "nothing was parked");
    let mut child = fhsx(&store)
        .env("FHSX_SCRATCH_POOL", "1")
        .args(["build", "--rebuild"])
        .arg(&slow)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !slot[0].join("build/dirt").exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the slow build never ran on the parked scratch"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    assert!(
        mounts_under(t.path()).len() >= 2,
        "the killed build should leave its scratch and view: {:?}",
        mounts_under(t.path())
    );
    build(&store, &quick, 1);
    let left = mounts_under(t.path());
    assert_eq!(left.len(), 1, "the killed build's mounts stayed: {left:?}");
    assert!(
        !slot[0].join("build/dirt").exists(),
        "the killed build's scratch was parked again"
    );
    assert_eq!(parked(t.path()), slot);
}
