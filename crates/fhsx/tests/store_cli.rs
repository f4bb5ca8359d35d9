//! The store CLI against a real store on disk: exit codes, corruption,
//! crash safety, concurrency.

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn fhsx(store: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fhsx"));
    c.arg("--store").arg(store);
    c
}

fn run(store: &Path, args: &[&str]) -> Output {
    fhsx(store).args(args).output().expect("run fhsx")
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn write(p: &Path, content: &[u8], mode: u32) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

fn tree(root: &Path) {
    write(&root.join("usr/bin/hello"), b"#!/bin/sh\necho hi\n", 0o755);
    write(
        &root.join("usr/share/doc/hello/README"),
        b"the readme\n",
        0o644,
    );
    write(
        &root.join("usr/share/doc/other/README.copy"),
        b"the readme\n",
        0o644,
    );
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
}

fn import(store: &Path, src: &Path) -> String {
    let o = run(store, &["store", "import", src.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout)
        .split('\t')
        .next()
        .unwrap()
        .to_owned()
}

fn blob_digest(store: &Path, root: &str, path: &str) -> String {
    let o = run(store, &["--json", "store", "ls", root, path]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v[0]["digest"].as_str().unwrap().to_owned()
}

fn object(store: &Path, digest: &str) -> PathBuf {
    let hex = digest.strip_prefix("b3:").unwrap();
    store.join("blobs").join(&hex[..2]).join(hex)
}

#[test]
fn corrupt_blob_is_named_and_never_served() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let src = t.path().join("src");
    tree(&src);
    let root = import(&store, &src);
    assert_eq!(run(&store, &["store", "verify"]).status.code(), Some(0));

    let d = blob_digest(&store, &root, "usr/share/doc/hello/README");
    let p = object(&store, &d);
    let mut bytes = fs::read(&p).unwrap();
    bytes[0] ^= 0x01;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&p, &bytes).unwrap();

    let o = run(&store, &["store", "verify"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains(&d), "verify does not name the blob: {out}");
    assert!(
        out.contains("usr/share/doc/hello/README"),
        "verify does not name the path: {out}"
    );
    assert!(
        out.contains("usr/share/doc/other/README.copy"),
        "verify misses the second path: {out}"
    );

    let o = run(&store, &["store", "verify", &root]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("usr/share/doc/hello/README"));

    let o = run(
        &store,
        &["store", "cat", &root, "usr/share/doc/hello/README"],
    );
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(o.stdout.is_empty(), "corrupt bytes were served");
    assert!(text(&o).contains("integrity"), "{}", text(&o));

    let dest = t.path().join("out");
    let o = run(&store, &["store", "export", &root, dest.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(!dest.exists(), "a partial export is visible");
    let leftovers: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().contains("fhsx-export"))
        .collect();
    assert!(leftovers.is_empty(), "export staging left behind");

    // Other files are still served.
    let o = run(&store, &["store", "cat", &root, "usr/bin/hello"]);
    assert_eq!(o.stdout, b"#!/bin/sh\necho hi\n");
}

#[test]
fn bad_input_gets_usage_exit_code_and_a_hint() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let o = run(&store, &["store", "ls", "b3:nothex"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let missing = format!("b3:{}", "ab".repeat(32));
    let o = run(&store, &["store", "ls", &missing]);
    assert_eq!(o.status.code(), Some(2));
    assert!(text(&o).contains("not in the store"), "{}", text(&o));
    let o = run(&store, &["store", "import", "/nonexistent/path"]);
    assert_ne!(o.status.code(), Some(0));
    assert!(text(&o).contains("/nonexistent/path"));
    let o = run(&store, &["store", "import", "/etc/hostname"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

#[test]
fn compose_and_gc_via_cli() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let a = t.path().join("a");
    let b = t.path().join("b");
    write(&a.join("usr/bin/a"), b"a", 0o755);
    write(&b.join("usr/bin/b"), b"b", 0o755);
    let (da, db) = (import(&store, &a), import(&store, &b));
    let o = run(&store, &["--json", "compose", &da, &db]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let root = v["root"].as_str().unwrap().to_owned();
    let o = run(&store, &["store", "cat", &root, "usr/bin/b"]);
    assert_eq!(o.stdout, b"b");

    let o = run(&store, &["store", "gc", "--keep", &root]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(run(&store, &["store", "verify"]).status.code(), Some(0));
    assert_eq!(
        run(&store, &["store", "cat", &root, "usr/bin/a"]).stdout,
        b"a"
    );
    // Only the composed tree was kept: atom a's own root is gone unless reachable.
    let o = run(&store, &["store", "gc", "--keep", &da]);
    assert!(o.status.success());
    assert_eq!(run(&store, &["store", "ls", &root]).status.code(), Some(2));
    assert_eq!(run(&store, &["store", "verify"]).status.code(), Some(0));
}

/// A tree big enough that an import takes a while.
fn big_tree(root: &Path, files: usize, seed: u8) {
    for i in 0..files {
        let content: Vec<u8> = (0..(64 * 1024))
            .map(|j| (j as u8) ^ (i as u8) ^ seed.wrapping_mul(i as u8))
            .collect();
        write(&root.join(format!("d{}/f{i}", i % 16)), &content, 0o644);
    }
}

#[test]
fn kill_during_import_leaves_a_store_that_verifies() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let src = t.path().join("src");
    big_tree(&src, 3000, 1);
    // Make the store exist first.
    assert!(run(&store, &["store", "verify"]).status.success());
    let mut child = fhsx(&store)
        .args(["store", "import", src.to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Wait until it has staged something, then kill it hard.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let staged = fs::read_dir(store.join("tmp")).unwrap().flatten().any(|e| {
            fs::read_dir(e.path())
                .map(|d| d.count() > 10)
                .unwrap_or(false)
        });
        if staged || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    assert!(
        child.try_wait().unwrap().is_none(),
        "the import finished before it could be killed; make the tree bigger"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let o = run(&store, &["store", "verify"]);
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    // Opening the store removed the dead writer's staging directory.
    assert_eq!(fs::read_dir(store.join("tmp")).unwrap().count(), 0);
    // And the import, re-run, completes.
    let root = import(&store, &src);
    assert_eq!(
        run(&store, &["store", "verify", &root]).status.code(),
        Some(0)
    );
}

#[test]
fn concurrent_overlapping_imports_both_succeed() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let a = t.path().join("a");
    let b = t.path().join("b");
    big_tree(&a, 600, 7);
    big_tree(&b, 600, 7);
    write(&b.join("extra"), b"only in b", 0o644);
    assert!(run(&store, &["store", "verify"]).status.success());
    let spawn = |p: &Path| {
        fhsx(&store)
            .args(["store", "import", p.to_str().unwrap()])
            .output()
    };
    let (oa, ob) = std::thread::scope(|s| {
        let ha = s.spawn(|| spawn(&a));
        let hb = s.spawn(|| spawn(&b));
        (ha.join().unwrap().unwrap(), hb.join().unwrap().unwrap())
    });
    assert!(oa.status.success(), "{}", text(&oa));
    assert!(ob.status.success(), "{}", text(&ob));
    assert_eq!(run(&store, &["store", "verify"]).status.code(), Some(0));
    for (src, o) in [(&a, &oa), (&b, &ob)] {
        let root = String::from_utf8_lossy(&o.stdout)
            .split('\t')
            .next()
            .unwrap()
            .to_owned();
        let dest = t.path().join(format!(
            "out-{}",
            src.file_name().unwrap().to_string_lossy()
        ));
        let e = run(&store, &["store", "export", &root, dest.to_str().unwrap()]);
        assert!(e.status.success(), "{}", text(&e));
        let diff = Command::new("diff")
            .arg("-r")
            .arg(src)
            .arg(&dest)
            .status()
            .unwrap();
        assert!(diff.success(), "export of {} differs", src.display());
    }
}

/// Many writers starting at once: each one's start-up cleanup must never
/// take another's live staging directory for a dead one.
#[test]
fn many_concurrent_small_imports_never_disturb_each_other() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let src = t.path().join("src");
    big_tree(&src, 40, 3);
    assert!(run(&store, &["store", "verify"]).status.success());
    for _round in 0..5 {
        let children: Vec<_> = (0..8)
            .map(|_| {
                fhsx(&store)
                    .args(["store", "import", src.to_str().unwrap()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        for c in children {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        }
    }
    assert_eq!(run(&store, &["store", "verify"]).status.code(), Some(0));
}

/// `gc` racing an import: the import reuses blobs that only an unkept tree
/// holds, which gc would sweep. The store lock makes gc wait for the
/// import's commit, so the store never holds a directory whose children gc
/// deleted: every round ends with a clean `store verify`.
#[test]
fn gc_concurrent_with_an_import_never_leaves_dangling_references() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let keep_src = t.path().join("keep");
    write(&keep_src.join("k"), b"kept", 0o644);
    let keep = import(&store, &keep_src);
    let src = t.path().join("src");
    big_tree(&src, 400, 9);
    for _round in 0..4 {
        // The blobs exist (from an earlier, unkept import) when the next
        // import checks for them.
        import(&store, &src);
        let imp = fhsx(&store)
            .args(["store", "import", src.to_str().unwrap()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let gc = run(&store, &["store", "gc", "--keep", &keep]);
        assert!(gc.status.success(), "{}", text(&gc));
        let o = imp.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let v = run(&store, &["store", "verify"]);
        assert_eq!(v.status.code(), Some(0), "{}", text(&v));
    }
}

/// `fhsx store root add|list|remove` and `fhsx store gc` without --keep:
/// exactly the persistent roots are kept; with no root at all gc refuses
/// unless told --no-roots-ok.
#[test]
fn gc_keeps_persistent_roots_and_refuses_to_empty_an_unrooted_store() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    write(&a.join("usr/bin/a"), b"a", 0o755);
    write(&b.join("usr/bin/b"), b"b", 0o755);
    let (da, db) = (import(&store, &a), import(&store, &b));

    // No roots yet: refused, nothing deleted.
    let o = run(&store, &["store", "gc"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no persistent roots"), "{}", text(&o));
    assert_eq!(run(&store, &["store", "ls", &db]).status.code(), Some(0));

    let o = run(&store, &["store", "root", "add", &da, "--name", "atom-a"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run(&store, &["store", "root", "list"]);
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        format!("atom-a\t{da}\n")
    );
    let o = run(&store, &["store", "gc"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        run(&store, &["store", "cat", &da, "usr/bin/a"]).stdout,
        b"a"
    );
    assert_eq!(run(&store, &["store", "ls", &db]).status.code(), Some(2));
    assert_eq!(run(&store, &["store", "verify"]).status.code(), Some(0));

    // A root must name something the store has; a bad name is usage.
    let o = run(&store, &["store", "root", "add", &db]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let o = run(&store, &["store", "root", "add", &da, "--name", "../x"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));

    // Removed by digest: the next gc (told it may) empties the store.
    let o = run(&store, &["store", "root", "remove", &da]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(run(&store, &["store", "root", "list"]).stdout.is_empty());
    let o = run(&store, &["store", "gc", "--no-roots-ok"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(run(&store, &["store", "ls", &da]).status.code(), Some(2));
    let o = run(&store, &["store", "root", "remove", "--name", "atom-a"]);
    assert_eq!(o.status.code(), Some(2));
}

/// A command that holds no socket ends quietly when what it prints goes
/// to a closed pipe (`fhsx store cat … | head -c 1`), like any Unix tool:
/// killed by SIGPIPE, nothing on stderr (`Command::holds_no_socket`; the
/// commands with a peer keep SIGPIPE ignored).
#[test]
fn store_cat_into_a_closed_pipe_ends_quietly_by_sigpipe() {
    use std::io::Read;
    use std::os::unix::process::ExitStatusExt;
    let t = tempfile::tempdir().unwrap();
    let (src, store) = (t.path().join("src"), t.path().join("store"));
    // Far more than a pipe holds (64 KiB), so the writer meets the close.
    let big: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    write(&src.join("big"), &big, 0o644);
    let root = import(&store, &src);
    let mut child = fhsx(&store)
        .args(["store", "cat", &root, "big"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = [0u8; 1];
    child.stdout.take().unwrap().read_exact(&mut first).unwrap();
    // The read end is closed here, with the rest unread.
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.signal(), Some(libc::SIGPIPE), "{}", text(&o));
    assert_eq!(o.stderr, b"");
}
