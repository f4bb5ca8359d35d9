//! A mount whose owner is `kill -9`ed: the cleanup path leaves nothing mounted.

mod common;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use castore::store::LocalStore;
use castore_fuse::{cleanup_stale_mounts, MountOptions};
use common::*;

const HELPER: &str = "CASTORE_FUSE_TEST_HELPER";

/// Not a test of its own: when the kill test re-runs this binary with
/// `HELPER` set, this mounts a view and serves until killed.
#[test]
fn helper_serve_until_killed() {
    let Some(spec) = std::env::var_os(HELPER) else {
        return;
    };
    let spec = spec.into_string().unwrap();
    let parts: Vec<&str> = spec.split('|').collect();
    let store = LocalStore::open(parts[0]).unwrap();
    let root = parts[1].parse().unwrap();
    let opts = MountOptions {
        registry: PathBuf::from(parts[3]),
        ..MountOptions::default()
    };
    let _g = castore_fuse::mount(&store, &root, Path::new(parts[2]), &opts).unwrap();
    loop {
        std::thread::sleep(Duration::from_secs(60));
    }
}

fn spawn_and_kill(fx: &Fixture, mp: &Path, registry: &Path) {
    let spec = format!(
        "{}|{}|{}|{}",
        fx.store.root().display(),
        fx.root,
        mp.display(),
        registry.display()
    );
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "helper_serve_until_killed", "--test-threads=1"])
        .env(HELPER, spec)
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while !is_mounted(mp) {
        assert!(Instant::now() < deadline, "the helper never mounted");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(fs::read(mp.join("README")).unwrap(), b"hello view\n");
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    // The kernel aborted the connection; the mount point is dead but still there.
    assert!(is_mounted(mp), "expected a stale mount after kill -9");
    let e = fs::read(mp.join("README")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOTCONN), "{e}");
}

#[test]
fn kill_9_then_cleanup_leaves_nothing_mounted() {
    if std::env::var_os(HELPER).is_some() {
        return;
    }
    let fx = Fixture::new(sample_tree);
    let registry = fx.tmp.path().join("registry");
    let mp = fs::canonicalize(fx.mountpoint("view")).unwrap();

    // The explicit cleanup path.
    spawn_and_kill(&fx, &mp, &registry);
    let cleaned = cleanup_stale_mounts(&registry).unwrap();
    assert_eq!(cleaned, vec![mp.clone()]);
    assert!(!is_mounted(&mp));
    assert_eq!(
        fs::read_dir(&registry).unwrap().count(),
        0,
        "registry not emptied"
    );

    // The next mount by anyone runs it too.
    spawn_and_kill(&fx, &mp, &registry);
    let g = castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint("other"), &fx.opts()).unwrap();
    assert!(!is_mounted(&mp));
    assert_eq!(
        fs::read(g.mountpoint().join("README")).unwrap(),
        b"hello view\n"
    );
    drop(g);
    assert!(castore_fuse::live_mounts()
        .iter()
        .all(|m| !m.starts_with(fx.tmp.path())));
    assert_eq!(fs::read_dir(&registry).unwrap().count(), 0);
}
