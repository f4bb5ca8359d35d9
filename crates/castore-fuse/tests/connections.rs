//! Ending one view's FUSE connection never ends another's. (Alone in its
//! binary: it relies on the kernel handing a freed connection number to
//! the next mount, and on every `fuser-*` thread being view A's.)

mod common;

use std::fs;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;

fn connection(p: &Path) -> u32 {
    libc::minor(fs::metadata(p).unwrap().dev())
}

/// The serving threads of the views mounted so far (fuser names them).
fn serving_threads() -> Vec<String> {
    fs::read_dir("/proc/self/task")
        .unwrap()
        .flatten()
        .filter(|t| {
            fs::read_to_string(t.path().join("comm")).is_ok_and(|c| c.starts_with("fuser-"))
        })
        .map(|t| t.file_name().to_string_lossy().into_owned())
        .collect()
}

/// Threads stopped in a cgroup v1 freezer of their own until dropped: a
/// daemon as slow as a loaded machine makes it, on demand.
struct Frozen(PathBuf);

impl Frozen {
    fn threads(tids: &[String]) -> Frozen {
        let base = Path::new("/sys/fs/cgroup/freezer");
        assert!(
            base.join("tasks").exists(),
            "this test stops threads with the cgroup v1 freezer: run it as root \
             with the freezer mounted (mount -t cgroup -o freezer freezer /sys/fs/cgroup/freezer)"
        );
        let dir = base.join(format!("fhsx-test-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        for t in tids {
            fs::write(dir.join("tasks"), t).unwrap();
        }
        fs::write(dir.join("freezer.state"), "FROZEN").unwrap();
        while fs::read_to_string(dir.join("freezer.state"))
            .unwrap()
            .trim()
            != "FROZEN"
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        Frozen(dir)
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        let _ = fs::write(self.0.join("freezer.state"), "THAWED");
        if let Ok(tasks) = fs::read_to_string(self.0.join("tasks")) {
            for t in tasks.lines() {
                let _ = fs::write("/sys/fs/cgroup/freezer/tasks", t);
            }
        }
        let _ = fs::remove_dir(&self.0);
    }
}

/// View A's serving threads are slow to end (frozen, as on a loaded
/// machine), so its superblock is gone and its connection number free
/// while A is still being finished. View B, mounted next, gets that
/// number. Finishing A must end A's connection and not B's: B keeps
/// serving. (Before the fix A aborted "its" number by fusectl 500 ms after
/// the detach — B's by then; seen as 2 of 150 concurrent builds failing
/// with ENOTCONN on their view.)
#[test]
fn a_slow_view_never_ends_the_next_views_connection() {
    let fx = Fixture::new(sample_tree);
    let a = fx.mount("a");
    let a_conn = connection(a.mountpoint());
    assert_eq!(
        a.connection(),
        Some(u64::from(a_conn)),
        "the guard knows another connection"
    );
    let frozen = Frozen::threads(&serving_threads());
    let finishing = std::thread::spawn({
        let store = fx.store.clone();
        move || a.finish(&store)
    });
    std::thread::sleep(Duration::from_millis(100));
    let b = fx.mount("b");
    assert_eq!(
        connection(b.mountpoint()),
        a_conn,
        "the kernel gave view B another connection number than A's \
         (another FUSE mount came in between?): this test proves nothing; rerun it"
    );
    // Past the moment the old code gave up waiting for A and aborted.
    std::thread::sleep(Duration::from_millis(700));
    let read = fs::read(b.mountpoint().join("README")).map_err(|e| e.to_string());
    drop(frozen);
    let finished = finishing.join().unwrap();
    assert_eq!(
        read,
        Ok(b"hello view\n".to_vec()),
        "finishing view A ended view B's connection"
    );
    finished.unwrap();
    b.finish(&fx.store).unwrap();
}
