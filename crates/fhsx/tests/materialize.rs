//! `fhsx materialize` (Fast and Export tiers) and `fhsx run --view`, end to
//! end on the real filesystem: what the tiers must hold, one test each.
//!
//! Prerequisites fail the test with the Debian package to install, never
//! skip it: `umoci` (OCI layout validation), `util-linux` (setpriv, to write
//! as a non-root user), `coreutils` (sha256sum), `bubblewrap` and apt
//! (`apt-get download busybox-static`) for `run --view`.

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

fn fhsx(store: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fhsx"));
    c.arg("--store").arg(store);
    c.env_remove("SOURCE_DATE_EPOCH");
    c
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

fn ok(c: &mut Command) -> Output {
    let o = c.output().expect("run fhsx");
    assert!(o.status.success(), "{c:?}: {}", text(&o));
    o
}

fn is_root() -> bool {
    // SAFETY: getuid has no preconditions.
    unsafe { libc::getuid() == 0 }
}

/// A test directory every user can traverse (for the non-root write test).
fn workdir() -> tempfile::TempDir {
    let base = Path::new(env!("CARGO_TARGET_TMPDIR")).join("materialize");
    fs::create_dir_all(&base).unwrap();
    let d = tempfile::tempdir_in(&base).unwrap();
    fs::set_permissions(d.path(), fs::Permissions::from_mode(0o755)).unwrap();
    d
}

/// Import `p`; its root digest.
fn import(store: &Path, p: &Path) -> String {
    let o = ok(fhsx(store).args(["store", "import"]).arg(p));
    String::from_utf8_lossy(&o.stdout)
        .split('\t')
        .next()
        .unwrap()
        .to_owned()
}

fn write(p: &Path, bytes: &[u8], mode: u32) {
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, bytes).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with every kind of entry the tiers must carry: plain and
/// executable files, one blob shared by an executable and a plain file,
/// empty files and directories, symlinks (relative, absolute, dangling,
/// long), a path longer than a tar header's 100 bytes.
fn fixture(at: &Path) {
    let shared = b"#!/bin/sh\necho shared blob\n";
    write(&at.join("usr/bin/tool"), shared, 0o755);
    write(&at.join("usr/share/doc/tool/example.sh"), shared, 0o644);
    write(&at.join("usr/bin/other"), b"\x7fELF not really\n", 0o755);
    write(&at.join("usr/lib/libx.so.1.2"), &vec![7u8; 300_000], 0o644);
    write(&at.join("etc/empty"), b"", 0o644);
    write(&at.join("etc/empty-exec"), b"", 0o755);
    fs::create_dir_all(at.join("var/empty")).unwrap();
    let long = "d".repeat(60);
    write(
        &at.join(format!("usr/share/{long}/{long}/file-with-a-long-path.txt")),
        b"long\n",
        0o644,
    );
    std::os::unix::fs::symlink("usr/bin", at.join("bin")).unwrap();
    std::os::unix::fs::symlink("libx.so.1.2", at.join("usr/lib/libx.so.1")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/anywhere", at.join("etc/dangling")).unwrap();
    std::os::unix::fs::symlink("x".repeat(300), at.join("etc/long-link")).unwrap();
}

#[derive(Debug, PartialEq, Eq)]
enum Entry {
    Dir,
    File { bytes: Vec<u8>, exec: bool },
    Symlink(PathBuf),
}

/// Everything below `root` by relative path: kinds, bytes, exec bits,
/// link targets (the listing is the map's key set).
fn snapshot(root: &Path) -> BTreeMap<PathBuf, Entry> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, Entry>) {
        for e in fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let p = root.join(&r);
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                out.insert(r.clone(), Entry::Dir);
                walk(root, &r, out);
            } else if m.file_type().is_symlink() {
                out.insert(r, Entry::Symlink(fs::read_link(&p).unwrap()));
            } else {
                let bytes = fs::read(&p).unwrap();
                out.insert(
                    r,
                    Entry::File {
                        bytes,
                        exec: m.mode() & 0o100 != 0,
                    },
                );
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// (inode, ctime ns) of every entry below `root`, by relative path.
fn inodes(root: &Path) -> BTreeMap<PathBuf, (u64, i64, i64)> {
    fn walk(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, (u64, i64, i64)>) {
        for e in fs::read_dir(root.join(rel)).unwrap() {
            let e = e.unwrap();
            let r = rel.join(e.file_name());
            let m = fs::symlink_metadata(root.join(&r)).unwrap();
            out.insert(r.clone(), (m.ino(), m.ctime(), m.ctime_nsec()));
            if m.is_dir() {
                walk(root, &r, out);
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(root, Path::new(""), &mut out);
    out
}

/// The store's blob file for the file at `path` in tree `view`.
fn blob_path(store: &Path, view: &str, path: &str) -> PathBuf {
    let o = ok(fhsx(store).args(["--json", "store", "ls", view, path]));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let d = v[0]["digest"].as_str().unwrap().to_owned();
    let hex = d.strip_prefix("b3:").unwrap();
    store.join("blobs").join(&hex[..2]).join(hex)
}

fn marker(dest: &Path) -> serde_json::Value {
    let mut p = dest.as_os_str().to_owned();
    p.push(".fhsx-view");
    serde_json::from_slice(&fs::read(PathBuf::from(p)).unwrap()).unwrap()
}

fn materialize_json(store: &Path, view: &str, dest: &Path, extra: &[&str]) -> serde_json::Value {
    let o = ok(fhsx(store)
        .args(["--json", "materialize", "--tier", "fast"])
        .args(extra)
        .arg(view)
        .arg(dest));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// Must hold: a Fast-tier tree equals `store export` byte for byte (bytes,
/// exec bits, symlinks, listings); it is read-only (files 0444/0555,
/// directories 0555); plain files are the store's own blob inodes; a blob
/// shared by an executable and a plain file is right for both.
#[test]
fn fast_tree_equals_store_export_and_is_read_only() {
    let w = workdir();
    let store = w.path().join("store");
    let src = w.path().join("src");
    fixture(&src);
    let view = import(&store, &src);
    let dest = w.path().join("fast");
    let r = materialize_json(&store, &view, &dest, &[]);
    assert_eq!(r["unchanged"], false);
    assert_eq!(r["copied"], 0, "same filesystem must not copy: {r}");
    assert_eq!(marker(&dest)["root"], view.as_str());

    let exported = w.path().join("exported");
    ok(fhsx(&store).args(["store", "export", &view]).arg(&exported));
    let (a, b) = (snapshot(&dest), snapshot(&exported));
    assert_eq!(
        a.keys().collect::<Vec<_>>(),
        b.keys().collect::<Vec<_>>(),
        "listings differ"
    );
    assert_eq!(a, b, "Fast tree differs from store export");
    assert_eq!(
        snapshot(&src),
        a,
        "Fast tree differs from the imported source"
    );

    // Read-only: every file 0444 or 0555, every directory 0555.
    let mut dirs = vec![dest.clone()];
    while let Some(d) = dirs.pop() {
        assert_eq!(fs::metadata(&d).unwrap().mode() & 0o7777, 0o555, "{d:?}");
        for e in fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.is_dir() {
                dirs.push(p);
            } else if m.is_file() {
                let want = if m.mode() & 0o100 != 0 { 0o555 } else { 0o444 };
                assert_eq!(m.mode() & 0o7777, want, "{p:?}");
            }
        }
    }

    // Plain files share the blob's inode; the shared blob's executable use
    // is a different (0555) inode; both read the same bytes.
    let shared = b"#!/bin/sh\necho shared blob\n";
    let blob = fs::metadata(blob_path(&store, &view, "usr/share/doc/tool/example.sh")).unwrap();
    let plain = fs::metadata(dest.join("usr/share/doc/tool/example.sh")).unwrap();
    let exec = fs::metadata(dest.join("usr/bin/tool")).unwrap();
    assert_eq!(plain.ino(), blob.ino(), "plain file is not the store blob");
    assert_eq!(blob.mode() & 0o7777, 0o444, "the store blob's mode changed");
    assert_ne!(
        exec.ino(),
        blob.ino(),
        "executable shares the 0444 blob inode"
    );
    assert_eq!(exec.mode() & 0o7777, 0o555);
    assert_eq!(plain.mode() & 0o7777, 0o444);
    assert_eq!(fs::read(dest.join("usr/bin/tool")).unwrap(), shared);
    assert_eq!(
        fs::read(dest.join("usr/share/doc/tool/example.sh")).unwrap(),
        shared
    );
    // New twins were published under their names; no temporaries remain.
    let twins: Vec<PathBuf> = fs::read_dir(store.join("exec-blobs"))
        .unwrap()
        .flat_map(|shard| fs::read_dir(shard.unwrap().path()).unwrap())
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(twins.len(), 3, "one twin per executable blob: {twins:?}");
    assert!(twins
        .iter()
        .all(|t| fs::metadata(t).unwrap().mode() & 0o7777 == 0o555
            && !t.file_name().unwrap().to_string_lossy().starts_with('.')));
    // A second tree links the same executable twin: made once per store.
    let dest2 = w.path().join("fast2");
    let r2 = materialize_json(&store, &view, &dest2, &[]);
    assert_eq!(r2["exec_twins_created"], 0, "{r2}");
    assert_eq!(
        fs::metadata(dest2.join("usr/bin/tool")).unwrap().ino(),
        exec.ino()
    );

    // `--check` of an untouched tree is clean.
    ok(fhsx(&store).args(["materialize", "--check"]).arg(&dest));

    // A shared inode loosened through a tree (chmod 0644 on DEST, so on the
    // store blob) is tightened again by the next materialization, not handed on.
    let ex = dest.join("usr/share/doc/tool/example.sh");
    fs::set_permissions(&ex, fs::Permissions::from_mode(0o644)).unwrap();
    let dest3 = w.path().join("fast3");
    materialize_json(&store, &view, &dest3, &[]);
    let m3 = fs::metadata(dest3.join("usr/share/doc/tool/example.sh")).unwrap();
    assert_eq!(m3.mode() & 0o7777, 0o444);
    let blob = blob_path(&store, &view, "usr/share/doc/tool/example.sh");
    assert_eq!(fs::metadata(blob).unwrap().mode() & 0o7777, 0o444);
    ok(fhsx(&store).args(["materialize", "--check"]).arg(&dest3));
}

/// Must hold: writes through DEST fail — for a non-root user outright (EACCES),
/// and where root can force one (chmod), `--check` reports it (exit 3) and a
/// re-materialization with `--verify` refuses the damaged blob.
#[test]
fn fast_tree_cannot_be_modified_and_tampering_is_detected() {
    assert!(
        is_root(),
        "this test checks root's view of modes and tampers as root; run as root"
    );
    let w = workdir();
    let store = w.path().join("store");
    let src = w.path().join("src");
    fixture(&src);
    let view = import(&store, &src);
    let dest = w.path().join("fast");
    materialize_json(&store, &view, &dest, &[]);

    // As an unprivileged user: append, truncate, replace, create all fail.
    let lib = dest.join("usr/lib/libx.so.1.2");
    let o = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["sh", "-c"])
        .arg(
            "for f in \"$1\" \"$2\"; do \
               if (echo x >> \"$f\") 2>/dev/null; then echo WROTE \"$f\"; fi; \
               if (: > \"$f\") 2>/dev/null; then echo TRUNCATED \"$f\"; fi; \
             done; \
             if mv \"$1\" \"$1.moved\" 2>/dev/null; then echo MOVED; fi; \
             if (echo x > \"$3/new\") 2>/dev/null; then echo CREATED; fi; echo done",
        )
        .arg("sh")
        .arg(&lib)
        .arg(dest.join("usr/bin/tool"))
        .arg(dest.join("usr/lib"))
        .output()
        .expect("setpriv (Debian package util-linux) is needed: apt-get install util-linux");
    assert_eq!(
        text(&o).trim(),
        "done",
        "a non-root user modified DEST: {}",
        text(&o)
    );
    assert_eq!(fs::read(&lib).unwrap(), vec![7u8; 300_000]);

    // Root can chmod and write; the tree (and the shared store blob) changes,
    // and --check names the file, exit 3.
    fs::set_permissions(&lib, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bytes = fs::read(&lib).unwrap();
    bytes[1000] = 8;
    fs::write(&lib, &bytes).unwrap();
    fs::set_permissions(&lib, fs::Permissions::from_mode(0o444)).unwrap();
    let o = fhsx(&store)
        .args(["--json", "materialize", "--check"])
        .arg(&dest)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let probs = r["problems"].as_array().unwrap();
    assert_eq!(probs.len(), 1, "{r}");
    assert_eq!(probs[0]["path"], "usr/lib/libx.so.1.2");
    assert!(
        probs[0]["problem"].as_str().unwrap().contains("hashes to"),
        "{r}"
    );

    // An added file and a loosened mode are tampering too.
    let etc = dest.join("etc");
    fs::set_permissions(&etc, fs::Permissions::from_mode(0o755)).unwrap();
    fs::write(etc.join("planted"), b"x").unwrap();
    let o = fhsx(&store)
        .args(["--json", "materialize", "--check"])
        .arg(&dest)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let paths: Vec<_> = r["problems"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["path"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(paths, ["etc", "etc/planted", "usr/lib/libx.so.1.2"], "{r}");

    // The damage went through to the store blob (that is what a hard link
    // is): re-materializing with --verify refuses it as an integrity error.
    let o = fhsx(&store)
        .args(["materialize", "--verify"])
        .arg(&view)
        .arg(w.path().join("fast-verified"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("corrupt"), "{}", text(&o));
    assert!(!w.path().join("fast-verified").exists());
}

/// Must hold: materializing a ~1 GB view a second time to the same DEST is a
/// no-op: no entry is recreated or rewritten (inode numbers and ctimes
/// unchanged), the marker untouched.
#[test]
fn second_materialization_of_a_large_view_is_a_noop() {
    let w = workdir();
    let store = w.path().join("store");
    let src = w.path().join("src");
    // 256 distinct 4 MiB files (1 GiB) in 16 directories, some executable.
    let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut buf = vec![0u8; 4 << 20];
    for i in 0..256 {
        for chunk in buf.chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            chunk.copy_from_slice(&x.to_le_bytes()[..chunk.len()]);
        }
        let mode = if i % 5 == 0 { 0o755 } else { 0o644 };
        write(&src.join(format!("d{:02}/f{i:03}", i % 16)), &buf, mode);
    }
    let view = import(&store, &src);
    fs::remove_dir_all(&src).unwrap();
    let dest = w.path().join("fast");
    let first = materialize_json(&store, &view, &dest, &[]);
    assert_eq!(first["files"], 256);
    assert_eq!(first["bytes"], 256u64 << 22);
    let before = inodes(&dest);
    let mut mk = dest.as_os_str().to_owned();
    mk.push(".fhsx-view");
    let mk = PathBuf::from(mk);
    let marker_before = fs::metadata(&mk).unwrap();
    let dest_before = fs::metadata(&dest).unwrap();

    let second = materialize_json(&store, &view, &dest, &[]);
    assert_eq!(second["unchanged"], true, "{second}");
    assert_eq!(second["linked"], 0);
    assert_eq!(second["copied"], 0);
    assert_eq!(
        inodes(&dest),
        before,
        "the second materialization rewrote entries"
    );
    let marker_after = fs::metadata(&mk).unwrap();
    assert_eq!(marker_after.ino(), marker_before.ino());
    assert_eq!(marker_after.ctime_nsec(), marker_before.ctime_nsec());
    let dest_after = fs::metadata(&dest).unwrap();
    assert_eq!(dest_after.ino(), dest_before.ino());
    assert_eq!(dest_after.ctime_nsec(), dest_before.ctime_nsec());
}

/// Another view replaces a Fast tree in one swap (marker follows); a
/// non-empty directory fhsx did not make is refused (exit 2) and left alone;
/// a destination on another filesystem (tmpfs) gets verified copies.
#[test]
fn replacement_refusal_and_cross_device_copies() {
    let w = workdir();
    let store = w.path().join("store");
    let a = w.path().join("a");
    fixture(&a);
    let b = w.path().join("b");
    write(&b.join("only/in/b"), b"b\n", 0o755);
    let (va, vb) = (import(&store, &a), import(&store, &b));
    let dest = w.path().join("fast");
    materialize_json(&store, &va, &dest, &[]);
    let r = materialize_json(&store, &vb, &dest, &[]);
    assert_eq!(r["replaced"], true, "{r}");
    assert_eq!(snapshot(&dest), snapshot(&b));
    assert_eq!(marker(&dest)["root"], vb.as_str());
    let leftovers: Vec<_> = fs::read_dir(w.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with('.'))
        .collect();
    assert!(leftovers.is_empty(), "staging left behind: {leftovers:?}");

    let foreign = w.path().join("foreign");
    write(&foreign.join("keep"), b"mine", 0o644);
    let o = fhsx(&store)
        .args(["materialize", &va])
        .arg(&foreign)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert_eq!(fs::read(foreign.join("keep")).unwrap(), b"mine");

    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "/dev/shm (a tmpfs) is needed for the cross-device case"
    );
    let other = tempfile::tempdir_in(shm).unwrap();
    let cross = other.path().join("fast");
    let r = materialize_json(&store, &va, &cross, &[]);
    assert_eq!(r["linked"], 0, "{r}");
    assert_eq!(r["copied"], r["files"], "{r}");
    assert_eq!(snapshot(&cross), snapshot(&a));
    ok(fhsx(&store).args(["materialize", "--check"]).arg(&cross));
    fs::set_permissions(&cross, fs::Permissions::from_mode(0o755)).unwrap();
    let status = Command::new("chmod")
        .arg("-R")
        .arg("u+w")
        .arg(&cross)
        .status()
        .unwrap();
    assert!(status.success());
}

/// One tar header: (type, path, mode, uid, gid, mtime, uname, gname).
type Header = (u8, Vec<u8>, u64, u64, u64, u64, Vec<u8>, Vec<u8>);

fn octal(b: &[u8]) -> u64 {
    let s = String::from_utf8_lossy(b);
    u64::from_str_radix(s.trim_matches(|c: char| c == '\0' || c == ' '), 8).unwrap_or(0)
}

fn cstr(b: &[u8]) -> Vec<u8> {
    b.iter().copied().take_while(|&c| c != 0).collect()
}

/// Parse a tar stream's headers (GNU long names resolved).
fn tar_headers(data: &[u8]) -> Vec<Header> {
    let mut out = Vec::new();
    let mut i = 0;
    let mut long: Option<Vec<u8>> = None;
    while i + 512 <= data.len() {
        let h = &data[i..i + 512];
        if h.iter().all(|&c| c == 0) {
            break;
        }
        let size = octal(&h[124..136]) as usize;
        let kind = h[156];
        let body = &data[i + 512..i + 512 + size];
        i += 512 + size.div_ceil(512) * 512;
        match kind {
            b'L' => long = Some(cstr(body)),
            b'K' => {}
            _ => {
                let name = long.take().unwrap_or_else(|| cstr(&h[0..100]));
                out.push((
                    kind,
                    name,
                    octal(&h[100..108]),
                    octal(&h[108..116]),
                    octal(&h[116..124]),
                    octal(&h[136..148]),
                    cstr(&h[265..297]),
                    cstr(&h[297..329]),
                ));
            }
        }
    }
    out
}

/// Must hold: the export tarball re-imports to the same digest; two exports
/// are byte-identical; entries sorted, uid/gid 0, no owner names, mtime
/// SOURCE_DATE_EPOCH (or 0).
#[test]
fn export_tarballs_are_deterministic_and_round_trip() {
    let w = workdir();
    let store = w.path().join("store");
    let src = w.path().join("src");
    fixture(&src);
    let view = import(&store, &src);
    for name in ["one.tar", "two.tar", "one.tar.zst", "two.tar.zst"] {
        ok(fhsx(&store)
            .args(["materialize", "--tier", "export", &view])
            .arg(w.path().join(name)));
        assert_eq!(
            import(&store, &w.path().join(name)),
            view,
            "{name} re-imports differently"
        );
    }
    for (x, y) in [("one.tar", "two.tar"), ("one.tar.zst", "two.tar.zst")] {
        assert!(
            fs::read(w.path().join(x)).unwrap() == fs::read(w.path().join(y)).unwrap(),
            "{x} and {y} differ"
        );
    }
    let plain = fs::read(w.path().join("one.tar")).unwrap();
    let hs = tar_headers(&plain);
    let names: Vec<_> = hs.iter().map(|h| h.1.clone()).collect();
    assert!(
        names.iter().any(|n| n.len() > 100),
        "no long path exercised"
    );
    // Depth-first, each directory before its children, siblings by name bytes.
    let key = |n: &Vec<u8>| -> Vec<Vec<u8>> {
        n.split(|&c| c == b'/')
            .filter(|c| !c.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    let mut sorted = names.clone();
    sorted.sort_by_key(key);
    assert_eq!(names, sorted, "entries not in sorted order");
    for h in &hs {
        assert_eq!(
            (h.3, h.4, h.5),
            (0, 0, 0),
            "{:?}",
            String::from_utf8_lossy(&h.1)
        );
        assert!(
            h.6.is_empty() && h.7.is_empty(),
            "owner names in the tarball"
        );
        let want = match h.0 {
            b'5' => 0o755,
            b'2' => 0o777,
            _ => h.2 & 0o755,
        };
        assert_eq!(h.2, want);
    }
    assert!(hs.iter().any(|h| h.1 == b"usr/bin/tool" && h.2 == 0o755));
    assert!(hs
        .iter()
        .any(|h| h.1 == b"usr/share/doc/tool/example.sh" && h.2 == 0o644));

    // SOURCE_DATE_EPOCH sets every mtime, and only that changes.
    let sde = w.path().join("sde.tar");
    ok(fhsx(&store)
        .env("SOURCE_DATE_EPOCH", "1700000000")
        .args(["materialize", "--tier", "export", &view])
        .arg(&sde));
    let hs2 = tar_headers(&fs::read(&sde).unwrap());
    assert_eq!(hs2.len(), hs.len());
    assert!(hs2.iter().all(|h| h.5 == 1_700_000_000));
    assert_eq!(import(&store, &sde), view);
    // A name that is no tarball is refused.
    let o = fhsx(&store)
        .args(["materialize", "--tier", "export", &view])
        .arg(w.path().join("out.zip"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

fn sha256_file(p: &Path) -> String {
    let o = Command::new("sha256sum")
        .arg(p)
        .output()
        .expect("sha256sum (Debian package coreutils) is needed");
    assert!(o.status.success());
    String::from_utf8_lossy(&o.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

/// Check one descriptor: mediaType as expected, the blob exists, its size
/// and sha256 match. Returns the blob's path.
fn check_descriptor(layout: &Path, d: &serde_json::Value, media_type: &str) -> PathBuf {
    assert_eq!(d["mediaType"], media_type, "{d}");
    let digest = d["digest"].as_str().unwrap();
    let hex = digest.strip_prefix("sha256:").expect("sha256 digest");
    assert_eq!(hex.len(), 64);
    let p = layout.join("blobs/sha256").join(hex);
    assert_eq!(
        fs::metadata(&p).unwrap().len(),
        d["size"].as_u64().unwrap(),
        "{d}"
    );
    assert_eq!(sha256_file(&p), hex, "blob {hex} does not hash to its name");
    p
}

/// Must hold: the OCI layout validates — `umoci unpack` accepts it and its
/// rootfs equals the view; every JSON document has the image-spec fields and
/// every digest and size matches; two exports are byte-identical.
#[test]
fn oci_layout_validates_and_is_deterministic() {
    let w = workdir();
    let store = w.path().join("store");
    let src = w.path().join("src");
    fixture(&src);
    let view = import(&store, &src);
    let (l1, l2) = (w.path().join("oci1"), w.path().join("oci2"));
    for l in [&l1, &l2] {
        ok(fhsx(&store)
            .args(["materialize", "--tier", "export", "--format", "oci", &view])
            .arg(l));
    }
    let (s1, s2) = (snapshot(&l1), snapshot(&l2));
    assert!(s1 == s2, "two OCI exports differ");

    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&fs::read(l1.join("oci-layout")).unwrap())
            .unwrap(),
        serde_json::json!({"imageLayoutVersion": "1.0.0"})
    );
    let index: serde_json::Value =
        serde_json::from_slice(&fs::read(l1.join("index.json")).unwrap()).unwrap();
    assert_eq!(index["schemaVersion"], 2);
    assert_eq!(
        index["mediaType"],
        "application/vnd.oci.image.index.v1+json"
    );
    let ms = index["manifests"].as_array().unwrap();
    assert_eq!(ms.len(), 1);
    assert_eq!(
        ms[0]["annotations"]["org.opencontainers.image.ref.name"],
        "latest"
    );
    let mp = check_descriptor(&l1, &ms[0], "application/vnd.oci.image.manifest.v1+json");
    let manifest: serde_json::Value = serde_json::from_slice(&fs::read(mp).unwrap()).unwrap();
    assert_eq!(manifest["schemaVersion"], 2);
    assert_eq!(manifest["annotations"]["dev.fhsx.view"], view.as_str());
    let cp = check_descriptor(
        &l1,
        &manifest["config"],
        "application/vnd.oci.image.config.v1+json",
    );
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1);
    let lp = check_descriptor(
        &l1,
        &layers[0],
        "application/vnd.oci.image.layer.v1.tar+gzip",
    );
    let config: serde_json::Value = serde_json::from_slice(&fs::read(cp).unwrap()).unwrap();
    assert_eq!(config["os"], "linux");
    assert!(config["architecture"]
        .as_str()
        .is_some_and(|a| !a.is_empty()));
    assert_eq!(config["rootfs"]["type"], "layers");
    // diff_id: the sha256 of the uncompressed layer.
    let tar = w.path().join("layer.tar");
    let o = Command::new("sh")
        .arg("-c")
        .arg("gzip -dc \"$1\" > \"$2\"")
        .arg("sh")
        .arg(&lp)
        .arg(&tar)
        .output()
        .expect("gzip (Debian package gzip) is needed");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        config["rootfs"]["diff_ids"],
        serde_json::json!([format!("sha256:{}", sha256_file(&tar))])
    );
    // Exactly the three blobs, nothing else in the layout.
    assert_eq!(fs::read_dir(l1.join("blobs/sha256")).unwrap().count(), 3);
    assert_eq!(fs::read_dir(&l1).unwrap().count(), 3);
    // The layer re-imports to the view.
    assert_eq!(import(&store, &tar), view);

    // umoci validates digests and unpacks: the rootfs is the view.
    let bundle = w.path().join("bundle");
    let o = Command::new("umoci")
        .current_dir(w.path())
        .args(["unpack", "--image", "oci1:latest", "bundle"])
        .output()
        .expect("umoci is needed to validate OCI layouts: apt-get install umoci");
    assert!(o.status.success(), "umoci unpack: {}", text(&o));
    assert_eq!(snapshot(&bundle.join("rootfs")), snapshot(&src));
    let o = Command::new("umoci")
        .current_dir(w.path())
        .args(["stat", "--image", "oci1:latest"])
        .output()
        .unwrap();
    assert!(o.status.success(), "umoci stat: {}", text(&o));
}

/// busybox-static's .deb, fetched once per target directory.
fn busybox_deb() -> &'static Path {
    static P: OnceLock<PathBuf> = OnceLock::new();
    P.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("materialize-debs");
        fs::create_dir_all(&dir).unwrap();
        let find = || {
            fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("busybox-static_"))
                })
        };
        if let Some(p) = find() {
            return p;
        }
        let o = Command::new("apt-get")
            .current_dir(&dir)
            .args(["download", "busybox-static"])
            .output()
            .expect("apt-get is needed to fetch busybox-static");
        assert!(
            o.status.success(),
            "apt-get download busybox-static failed (run `apt-get update`): {}",
            text(&o)
        );
        find().expect("apt-get download left no busybox-static .deb")
    })
}

/// `fhsx run --view` runs a real binary (busybox-static's) contained on the
/// view's Fast-tier root: the view is `/`, read-only; the workspace is
/// /build; the root is kept per store and reused.
#[test]
fn run_view_runs_a_binary_from_a_fast_tier_root() {
    let w = workdir();
    let store = w.path().join("store");
    let view = import(&store, busybox_deb());
    let ws = w.path().join("ws");
    fs::create_dir_all(&ws).unwrap();
    fs::set_permissions(&ws, fs::Permissions::from_mode(0o777)).unwrap();
    let script = "busybox echo hello from the view; \
                  busybox ls /; \
                  busybox touch /bin/planted 2>/dev/null && busybox echo WROTE-ROOT; \
                  busybox echo out > /build/result";
    let run = || {
        fhsx(&store)
            .args(["run", "--view", &view, "--workspace"])
            .arg(&ws)
            .args(["--", "/bin/busybox", "sh", "-c", script])
            .output()
            .unwrap()
    };
    let o = run();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("hello from the view"), "{}", text(&o));
    assert!(out.contains("bin") && out.contains("usr"), "{out}");
    assert!(
        !out.contains("WROTE-ROOT"),
        "the view root was writable: {out}"
    );
    assert_eq!(fs::read(ws.join("result")).unwrap(), b"out\n");

    let root = store.join("fast").join(view.strip_prefix("b3:").unwrap());
    assert!(
        root.join("bin/busybox").is_file(),
        "no Fast-tier root at {root:?}"
    );
    let before = inodes(&root);
    let o = run();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    assert_eq!(inodes(&root), before, "the cached root was rebuilt");
    ok(fhsx(&store).args(["materialize", "--check"]).arg(&root));
}

#[test]
fn gc_sweeps_the_fast_tier_caches_of_views_not_kept() {
    let w = workdir();
    let store = w.path().join("store");
    let src = w.path().join("src");
    fixture(&src);
    let view = import(&store, &src);
    let other_src = w.path().join("other");
    write(&other_src.join("keep.txt"), b"kept\n", 0o644);
    let other = import(&store, &other_src);
    let dest = w.path().join("dest");
    ok(fhsx(&store).args(["materialize", &view]).arg(&dest));
    let twins = store.join("exec-blobs");
    let count = |d: &Path| -> usize {
        fs::read_dir(d)
            .map(|r| {
                r.flatten()
                    .map(|s| fs::read_dir(s.path()).map(|x| x.count()).unwrap_or(0))
                    .sum()
            })
            .unwrap_or(0)
    };
    assert!(count(&twins) > 0, "the fixture's executables made no twins");
    // Keeping the view keeps its twins.
    ok(fhsx(&store).args(["store", "gc", "--keep", &view, &other]));
    assert!(count(&twins) > 0, "gc removed twins of a kept view");
    // Dropping it sweeps them; the materialized DEST (its own inodes) still reads.
    ok(fhsx(&store).args(["store", "gc", "--keep", &other]));
    assert_eq!(count(&twins), 0, "twins of dead blobs survived gc");
    assert_eq!(
        fs::read(dest.join("usr/bin/tool")).unwrap(),
        b"#!/bin/sh\necho shared blob\n"
    );
    ok(fhsx(&store).args(["store", "verify"]));
}
