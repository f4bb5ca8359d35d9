//! gc roots (persistent and temporary), gc racing readers and writers, and
//! streamed blob writes.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use castore::gc::gc;
use castore::import::import_path;
use castore::store::ObjectKind;
use castore::{BlobStore, CappedWriter, Digest, LocalStore, Node};
use common::*;

fn import_tree(env: &Env, name: &str, seed: u64) -> Digest {
    let src = env.path(name);
    for i in 0..20 {
        write(
            &src.join(format!("{name}/d{}/f{i}", i % 3)),
            &pseudo_random(1000 + i * 37, seed * 100 + i as u64),
            0o644,
        );
    }
    import_path(&env.store, &src, &()).unwrap().root
}

/// Every blob of a tree, read and verified; panics on anything missing.
fn read_all(store: &LocalStore, root: &Digest) -> usize {
    let mut n = 0;
    let mut stack = vec![*root];
    while let Some(d) = stack.pop() {
        let dir = castore::DirectoryStore::get_directory(store, &d).unwrap();
        for (_, node) in dir.entries() {
            match node {
                Node::Directory { digest, .. } => stack.push(*digest),
                Node::File { digest, .. } => {
                    store.read_blob(digest).unwrap();
                    n += 1;
                }
                Node::Symlink { .. } => {}
            }
        }
    }
    n
}

fn blob_count(store: &LocalStore) -> usize {
    snapshot(store)
        .iter()
        .filter(|p| p.starts_with(store.root().join("blobs")))
        .count()
}

#[test]
fn blob_writer_streams_and_is_invisible_until_finished() {
    let env = Env::new();
    let mut all = Vec::new();
    let mut w = env.store.blob_writer().unwrap();
    for i in 0..500u64 {
        let chunk = pseudo_random(1 + (i as usize * 131) % 9000, i);
        w.write_all(&chunk).unwrap();
        all.extend_from_slice(&chunk);
    }
    assert_eq!(w.len(), all.len() as u64);
    // Nothing in the store yet.
    assert_eq!(blob_count(&env.store), 0);
    let (d, n) = w.finish().unwrap();
    assert_eq!(d, Digest::of(&all));
    assert_eq!(n, all.len() as u64);
    assert_eq!(env.store.read_blob(&d).unwrap(), all);
    // No staging left behind.
    assert_eq!(
        std::fs::read_dir(env.store.root().join("tmp"))
            .unwrap()
            .count(),
        0
    );

    // The same bytes again: deduplicated, still fine.
    let mut w = env.store.blob_writer().unwrap();
    w.write_all(&all).unwrap();
    assert_eq!(w.finish().unwrap(), (d, n));
    assert_eq!(blob_count(&env.store), 1);

    // Dropped unfinished: no blob, no temp file.
    let mut w = env.store.blob_writer().unwrap();
    w.write_all(b"half a log").unwrap();
    drop(w);
    assert_eq!(blob_count(&env.store), 1);
    assert!(!env.store.has(ObjectKind::Blob, &Digest::of(b"half a log")));
    assert_eq!(
        std::fs::read_dir(env.store.root().join("tmp"))
            .unwrap()
            .count(),
        0
    );

    // Empty blob.
    let (e, n) = env.store.blob_writer().unwrap().finish().unwrap();
    assert_eq!((e, n), (Digest::of(b""), 0));
}

/// A small streamed blob lives in memory until `finish`: no staging
/// directory while it is written, none if the store already holds it, and
/// one made, fsynced and renamed in if it does not; a large one spills to
/// a staging file on the way.
#[test]
fn a_small_streamed_blob_touches_no_file_unless_it_is_new() {
    let env = Env::new();
    let tmp_entries = || {
        std::fs::read_dir(env.store.root().join("tmp"))
            .unwrap()
            .count()
    };
    let log = b"a rebuilt action's log\n".repeat(100);
    let mut w = env.store.blob_writer().unwrap();
    w.write_all(&log).unwrap();
    assert_eq!(tmp_entries(), 0, "a small blob made a staging directory");
    let (d, n) = w.finish().unwrap();
    assert_eq!((d, n), (Digest::of(&log), log.len() as u64));
    assert_eq!(env.store.read_blob(&d).unwrap(), log);
    assert_eq!(tmp_entries(), 0);

    // The same bytes again: found, nothing written.
    let path = env.store.object_path(ObjectKind::Blob, &d);
    let before = std::fs::metadata(&path).unwrap();
    let mut w = env.store.blob_writer().unwrap();
    w.write_all(&log).unwrap();
    assert_eq!(w.finish().unwrap(), (d, n));
    let after = std::fs::metadata(&path).unwrap();
    use std::os::unix::fs::MetadataExt;
    assert_eq!(
        (before.ino(), before.ctime_nsec()),
        (after.ino(), after.ctime_nsec())
    );
    assert_eq!(tmp_entries(), 0);

    // Past 64 KiB the bytes go to a staging file before `finish`.
    let big = pseudo_random(200 << 10, 7);
    let mut w = env.store.blob_writer().unwrap();
    w.write_all(&big[..100 << 10]).unwrap();
    assert_eq!(tmp_entries(), 1, "a large blob is not staged on disk");
    w.write_all(&big[100 << 10..]).unwrap();
    let (d, _) = w.finish().unwrap();
    assert_eq!(env.store.read_blob(&d).unwrap(), big);
    assert_eq!(tmp_entries(), 0);
}

#[test]
fn capped_writer_keeps_the_head_and_counts_the_rest() {
    let env = Env::new();
    let mut c = CappedWriter::new(env.store.blob_writer().unwrap(), 10);
    c.write_all(b"0123456").unwrap();
    assert!(!c.is_full());
    c.write_all(b"789abcdef").unwrap();
    assert!(c.is_full());
    c.write_all(b"more").unwrap();
    assert_eq!((c.written(), c.dropped()), (10, 10));
    let (d, n) = c.into_inner().finish().unwrap();
    assert_eq!((d, n), (Digest::of(b"0123456789"), 10));
}

#[test]
fn gc_without_extra_roots_keeps_exactly_the_persistent_roots() {
    let env = Env::new();
    let a = import_tree(&env, "a", 1);
    let b = import_tree(&env, "b", 2);
    let log = env.store.put_blob(b"a log").unwrap();
    env.store.add_root("tree-a", &[a, log]).unwrap();
    assert_eq!(
        env.store.roots().unwrap(),
        vec![castore::Root {
            name: "tree-a".into(),
            digests: vec![a, log]
        }]
    );
    let r = gc(&env.store, &[]).unwrap();
    assert_eq!(r.persistent_roots, 2);
    assert!(r.deleted_blobs > 0 && r.deleted_directories > 0, "{r:?}");
    assert_eq!(read_all(&env.store, &a), 20);
    assert!(env.store.has(ObjectKind::Blob, &log));
    assert!(!env.store.has(ObjectKind::Directory, &b));

    // --keep still adds roots.
    let b = import_tree(&env, "b2", 2);
    gc(&env.store, &[b]).unwrap();
    assert_eq!(read_all(&env.store, &b), 20);

    // Removing the root frees it.
    assert!(env.store.remove_root("tree-a").unwrap());
    assert!(!env.store.remove_root("tree-a").unwrap());
    gc(&env.store, &[]).unwrap();
    assert!(!env.store.has(ObjectKind::Directory, &a));
    assert!(!env.store.has(ObjectKind::Blob, &log));

    // A root must name something present, and a sane name.
    let err = env.store.add_root("x", &[Digest::of(b"nope")]).unwrap_err();
    assert!(matches!(err, castore::Error::Missing { .. }), "{err}");
    for bad in ["", ".hidden", "a/b", "sp ace"] {
        assert!(env.store.add_root(bad, &[b]).is_err(), "{bad:?}");
    }
}

#[test]
fn composed_view_as_a_root_keeps_atoms_map_and_tree() {
    let env = Env::new();
    let a = import_tree(&env, "a", 1);
    let b = import_tree(&env, "b", 2);
    let roots = env.store.temp_roots(&[a, b]).unwrap();
    let c = roots
        .rooted(|| castore::compose(&env.store, &[a, b]), |c| vec![c.root])
        .unwrap();
    drop(roots);
    env.store.add_root("view", &[c.root]).unwrap();
    gc(&env.store, &[]).unwrap();
    assert!(castore::compose::load_composition(&env.store, &c.root)
        .unwrap()
        .is_some());
    assert_eq!(read_all(&env.store, &c.root), read_all(&env.store, &a) * 2);
    read_all(&env.store, &b);
}

/// A reader holding a temp root on a tree reads it over and over while gc
/// runs back to back with no other root: it never misses an object, and
/// what nobody holds is deleted.
#[test]
fn gc_racing_a_temp_root_holder_never_deletes_what_it_holds() {
    let env = Env::new();
    let held = import_tree(&env, "held", 1);
    let stop = Arc::new(AtomicBool::new(false));
    let store = env.store.clone();
    let s = stop.clone();
    // Taken before any gc can run; the thread holds it from then on.
    let roots = store.temp_roots(&[held]).unwrap();
    let reader = std::thread::spawn(move || {
        let mut rounds = 0u64;
        while !s.load(Ordering::Relaxed) {
            assert_eq!(read_all(&store, &held), 20);
            rounds += 1;
        }
        drop(roots);
        rounds
    });
    // A writer that imports and roots through `rooted` while gc runs: its
    // fresh tree must survive too.
    let store = env.store.clone();
    let dir = env.path("w");
    let s = stop.clone();
    let writer = std::thread::spawn(move || {
        let roots = store.temp_roots(&[]).unwrap();
        let mut made = Vec::new();
        let mut i = 0;
        while !s.load(Ordering::Relaxed) && i < 40 {
            let src = dir.join(format!("t{i}"));
            write(&src.join("f"), &pseudo_random(5000, 900 + i), 0o644);
            let r = roots
                .rooted(|| import_path(&store, &src, &()), |r| vec![r.root])
                .unwrap();
            // Read right away and again later: present either way.
            read_all(&store, &r.root);
            made.push(r.root);
            i += 1;
        }
        for r in &made {
            read_all(&store, r);
        }
        made.len()
    });
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut gcs = 0;
    while Instant::now() < deadline {
        let unheld = env.store.put_blob(&pseudo_random(333, gcs)).unwrap();
        let r = gc(&env.store, &[]).unwrap();
        assert!(!env.store.has(ObjectKind::Blob, &unheld), "{r:?}");
        gcs += 1;
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = reader.join().unwrap();
    let made = writer.join().unwrap();
    assert!(rounds > 0 && gcs > 5 && made > 0, "{rounds} {gcs} {made}");
    // Once released, the next gc deletes them.
    gc(&env.store, &[]).unwrap();
    assert!(!env.store.has(ObjectKind::Directory, &held));
    assert_eq!(blob_count(&env.store), 0);
    assert_eq!(
        std::fs::read_dir(env.store.root().join("temproots"))
            .unwrap()
            .count(),
        0
    );
}

/// Not a test on its own: the child process of the next test. Takes temp
/// roots, says so, and waits to be killed.
#[test]
fn child_holds_temp_roots() {
    let (Ok(store), Ok(digest)) = (
        std::env::var("CASTORE_TEST_CHILD_STORE"),
        std::env::var("CASTORE_TEST_CHILD_DIGEST"),
    ) else {
        return;
    };
    let store = LocalStore::open(store).unwrap();
    let d: Digest = digest.parse().unwrap();
    let _roots = store.temp_roots(&[d]).unwrap();
    println!("HOLDING");
    std::io::stdout().flush().unwrap();
    std::thread::sleep(Duration::from_secs(600));
}

#[test]
fn a_killed_holders_temp_roots_are_reclaimed() {
    let env = Env::new();
    let t = import_tree(&env, "t", 3);
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_holds_temp_roots", "--nocapture"])
        .env("CASTORE_TEST_CHILD_STORE", env.store.root())
        .env("CASTORE_TEST_CHILD_DIGEST", t.to_string())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        let l = lines.next().expect("child exited early").unwrap();
        if l.contains("HOLDING") {
            break;
        }
    }
    // Alive: its roots hold.
    let r = gc(&env.store, &[]).unwrap();
    assert_eq!((r.temp_roots, r.reclaimed_temp_root_files), (1, 0));
    assert_eq!(read_all(&env.store, &t), 20);
    child.kill().unwrap();
    child.wait().unwrap();
    // Dead: its file is reclaimed and its roots no longer count.
    let r = gc(&env.store, &[]).unwrap();
    assert_eq!((r.temp_roots, r.reclaimed_temp_root_files), (0, 1), "{r:?}");
    assert!(!env.store.has(ObjectKind::Directory, &t));
    assert_eq!(
        std::fs::read_dir(env.store.root().join("temproots"))
            .unwrap()
            .count(),
        0
    );
}

#[test]
fn finish_rooted_survives_gc_and_temp_roots_grow() {
    let env = Env::new();
    let roots = env.store.temp_roots(&[]).unwrap();
    let mut w = env.store.blob_writer().unwrap();
    w.write_all(b"streamed log").unwrap();
    let (d, _) = w.finish_rooted(&roots).unwrap();
    let other = env.store.put_blob(b"other").unwrap();
    roots.add(&[other]).unwrap();
    roots.add(&[other]).unwrap();
    assert_eq!(roots.digests().len(), 2);
    gc(&env.store, &[]).unwrap();
    assert!(env.store.has(ObjectKind::Blob, &d));
    assert!(env.store.has(ObjectKind::Blob, &other));
    drop(roots);
    gc(&env.store, &[]).unwrap();
    assert!(!env.store.has(ObjectKind::Blob, &d));
}
