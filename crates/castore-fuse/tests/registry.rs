//! The mount registry's promise for registered (non-view) mounts: a dead
//! owner's mount is detached by the next cleanup, but only while the mount
//! table still shows it from the recorded source — never whatever another
//! party mounted there since. Real tmpfs mounts, so this runs as root.

use std::path::Path;
use std::process::Command;

fn mounted(p: &Path) -> bool {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    info.lines()
        .any(|l| l.split(' ').nth(4) == Some(p.to_str().unwrap()))
}

fn mount_tmpfs(source: &str, at: &Path) {
    let o = Command::new("mount")
        .args(["-t", "tmpfs", source])
        .arg(at)
        .output()
        .expect("mount (util-linux) is needed: apt-get install mount");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

/// A record as a process that has since exited would have left it.
fn dead_owner_record(registry: &Path, name: &str, at: &Path, source: &str) {
    let mut child = Command::new("true").spawn().unwrap();
    let pid = child.id();
    child.wait().unwrap();
    std::fs::create_dir_all(registry).unwrap();
    let rec = serde_json::json!({
        "mountpoint": at, "pid": pid, "start_time": 1, "source": source,
    });
    std::fs::write(registry.join(format!("{name}.json")), rec.to_string()).unwrap();
}

#[test]
fn a_dead_owners_registered_mount_is_detached_and_nothing_else() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "mounting tmpfs needs root (CI runs as root)"
    );
    let d = tempfile::tempdir().unwrap();
    let registry = d.path().join("registry");
    let at = std::fs::canonicalize(d.path()).unwrap().join("m");
    std::fs::create_dir(&at).unwrap();

    // Someone else's mount now sits where the dead owner's was.
    mount_tmpfs("someone-else", &at);
    dead_owner_record(&registry, "a", &at, "fhsx-scratch-test");
    castore_fuse::cleanup_stale_mounts(&registry).unwrap();
    assert!(mounted(&at), "cleanup detached a mount it did not record");
    assert!(!registry.join("a.json").exists(), "the stale record stayed");

    // The recorded mount itself goes.
    Command::new("umount").arg(&at).status().unwrap();
    mount_tmpfs("fhsx-scratch-test", &at);
    dead_owner_record(&registry, "b", &at, "fhsx-scratch-test");
    let cleaned = castore_fuse::cleanup_stale_mounts(&registry).unwrap();
    assert_eq!(cleaned, vec![at.clone()]);
    assert!(!mounted(&at), "the dead owner's mount outlived the cleanup");

    // A live owner's registration is left alone, and forgotten on drop.
    mount_tmpfs("fhsx-scratch-test", &at);
    let reg = castore_fuse::register_mount(&registry, &at, "fhsx-scratch-test").unwrap();
    castore_fuse::cleanup_stale_mounts(&registry).unwrap();
    assert!(mounted(&at), "a live owner's mount was detached");
    drop(reg);
    assert_eq!(std::fs::read_dir(&registry).unwrap().count(), 0);
    Command::new("umount").arg(&at).status().unwrap();
}

/// A parked mount (no owner process) stays through every cleanup while its
/// lock file was touched within its time to live, and after that while
/// anyone holds its lock; then the next cleanup detaches it. A parked
/// record whose lock file is gone names nothing of ours and just goes.
#[test]
fn a_parked_mount_lives_until_its_time_and_while_its_lock_is_held() {
    use std::os::fd::AsRawFd;
    use std::time::{Duration, SystemTime};
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "mounting tmpfs needs root (CI runs as root)"
    );
    let d = tempfile::tempdir().unwrap();
    let registry = d.path().join("registry");
    let at = std::fs::canonicalize(d.path()).unwrap().join("m");
    std::fs::create_dir(&at).unwrap();
    let lock = d.path().join("lock");
    std::fs::write(&lock, b"").unwrap();
    let touch = |ago: u64| {
        std::fs::File::options()
            .write(true)
            .open(&lock)
            .unwrap()
            .set_modified(SystemTime::now() - Duration::from_secs(ago))
            .unwrap()
    };
    mount_tmpfs("fhsx-scratch-test", &at);
    castore_fuse::register_parked(
        &registry,
        &at,
        "fhsx-scratch-test",
        &lock,
        Duration::from_secs(300),
    )
    .unwrap();

    touch(10);
    castore_fuse::cleanup_stale_mounts(&registry).unwrap();
    assert!(mounted(&at), "a parked mount was detached before its time");

    touch(400);
    let held = std::fs::File::open(&lock).unwrap();
    // SAFETY: flock on an fd we own.
    assert_eq!(unsafe { libc::flock(held.as_raw_fd(), libc::LOCK_EX) }, 0);
    castore_fuse::cleanup_stale_mounts(&registry).unwrap();
    assert!(
        mounted(&at),
        "an expired parked mount was detached while held"
    );
    drop(held);
    // A child the other test forks meanwhile holds a copy of our locked
    // descriptor until it execs: the lock may stay held a moment longer.
    let mut cleaned = Vec::new();
    for _ in 0..100 {
        cleaned = castore_fuse::cleanup_stale_mounts(&registry).unwrap();
        if !cleaned.is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(cleaned, vec![at.clone()]);
    assert!(!mounted(&at), "an expired, free parked mount stayed");
    assert_eq!(std::fs::read_dir(&registry).unwrap().count(), 0);

    // Its lock gone (the area removed), the record names nothing of ours.
    mount_tmpfs("someone-else", &at);
    castore_fuse::register_parked(
        &registry,
        &at,
        "fhsx-scratch-test",
        &lock,
        Duration::from_secs(300),
    )
    .unwrap();
    std::fs::remove_file(&lock).unwrap();
    castore_fuse::cleanup_stale_mounts(&registry).unwrap();
    assert!(mounted(&at), "another party's mount was detached");
    assert_eq!(std::fs::read_dir(&registry).unwrap().count(), 0);
    Command::new("umount").arg(&at).status().unwrap();
}
