//! Mount/unmount cycles leave no mount, thread or file descriptor behind.
//! (Alone in its binary, so the thread count is this test's own.)

mod common;

use std::fs;

use common::*;

fn count(dir: &str) -> usize {
    fs::read_dir(dir).unwrap().count()
}

#[test]
fn twenty_cycles_leave_no_mount_thread_or_fd() {
    let fx = Fixture::new(sample_tree);
    // Warm-up cycle: one-time allocations (thread-locals, lazy statics).
    drop(fx.mount("view"));
    let threads = count("/proc/self/task");
    let fds = count("/proc/self/fd");
    for i in 0..20 {
        let g = fx.mount("view");
        let mp = g.mountpoint().to_path_buf();
        assert!(is_mounted(&mp));
        assert_eq!(fs::read(mp.join("README")).unwrap(), b"hello view\n");
        let f = fs::File::open(mp.join("share/data/big.bin")).unwrap();
        drop(f);
        if i % 2 == 0 {
            g.finish(&fx.store).unwrap();
        } else {
            drop(g);
        }
        assert!(!is_mounted(&mp), "cycle {i} left a mount");
    }
    // A file still open at unmount (a build's straggler) keeps the connection
    // alive after the detach: finish must still return and take every thread.
    for passthrough in [true, false] {
        let opts = castore_fuse::MountOptions {
            passthrough,
            ..fx.opts()
        };
        let g = castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint("held"), &opts).unwrap();
        let held = fs::File::open(g.mountpoint().join("README")).unwrap();
        let mp = g.mountpoint().to_path_buf();
        g.finish(&fx.store).unwrap();
        assert!(!is_mounted(&mp));
        drop(held);
    }
    assert_eq!(count("/proc/self/task"), threads, "threads left behind");
    assert_eq!(count("/proc/self/fd"), fds, "file descriptors left behind");
    assert_eq!(
        fs::read_dir(fx.tmp.path().join("registry"))
            .unwrap()
            .count(),
        0
    );
}
