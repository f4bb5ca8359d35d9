//! Import → export reproduces a tree exactly, and the digest is a function
//! of content alone.

mod common;

use std::fs;
use std::os::unix::fs::PermissionsExt;

use castore::import::import_path;
use castore::{Digest, DirectoryStore, Node};
use common::*;

#[test]
fn import_export_round_trip_is_exact() {
    let env = Env::new();
    let src = env.path("src");
    sample_tree(&src);
    let imported = import_path(&env.store, &src, &()).unwrap();
    let out = env.path("out");
    castore::export::export(&env.store, &imported.root, &out, &()).unwrap();
    assert_same_tree(&src, &out);
    // And importing the export gives the same digest.
    assert_eq!(
        import_path(&env.store, &out, &()).unwrap().root,
        imported.root
    );
    assert!(castore::verify::verify(&env.store, None, &())
        .unwrap()
        .is_clean());
}

#[test]
fn digest_ignores_mtimes_owners_umask_and_creation_order() {
    let env = Env::new();
    let a = env.path("a");
    sample_tree(&a);
    let first = import_path(&env.store, &a, &()).unwrap().root;

    // Same content, created in another order, other permissions (exec bit
    // kept), other mtimes and another owner.
    let b = env.path("b");
    write(
        &b.join("usr/lib/big.bin"),
        &pseudo_random(17 << 20, 1),
        0o600,
    );
    write(&b.join("usr/lib/small.bin"), &pseudo_random(3000, 2), 0o444);
    fs::create_dir_all(b.join("var/empty")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/absolute", {
        fs::create_dir_all(b.join("etc")).unwrap();
        b.join("etc/dangling")
    })
    .unwrap();
    write(&b.join("etc/config"), &vec![7u8; 100_000], 0o664);
    write(&b.join("usr/share/empty-file"), b"", 0o400);
    write(&b.join("usr/share/doc/hello/README"), b"read me\n", 0o640);
    std::os::unix::fs::symlink("../../usr/bin/hello", b.join("usr/share/hello-link")).unwrap();
    write(&b.join("usr/bin/hello"), b"#!/bin/sh\necho hello\n", 0o700);
    std::os::unix::fs::symlink("usr/bin", b.join("bin")).unwrap();
    let old = fs::File::open(b.join("etc/config")).unwrap();
    old.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(1000))
        .unwrap();
    if is_root() {
        std::os::unix::fs::chown(b.join("usr/share/doc/hello/README"), Some(4242), Some(4242))
            .unwrap();
    }
    assert_eq!(import_path(&env.store, &b, &()).unwrap().root, first);

    // Flipping an exec bit changes it.
    fs::set_permissions(b.join("etc/config"), fs::Permissions::from_mode(0o755)).unwrap();
    assert_ne!(import_path(&env.store, &b, &()).unwrap().root, first);
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

#[test]
fn test_vectors() {
    let env = Env::new();
    let empty = env.path("empty");
    fs::create_dir(&empty).unwrap();
    let d = import_path(&env.store, &empty, &()).unwrap().root;
    assert_eq!(
        d.to_string(),
        "b3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262"
    );
    assert_eq!(d, Digest::of(b""));

    let keep = env.path("keep");
    write(&keep.join(".keep"), b"", 0o644);
    let d = import_path(&env.store, &keep, &()).unwrap().root;
    // Directory { files: [FileNode { name: ".keep", digest: blake3("") }] },
    // written out by hand: field 2 (files), length 41; inside, field 1
    // (name) length 5, field 2 (digest) length 32; size 0 and executable
    // false are defaults and omitted.
    let mut pb = vec![
        0x12, 0x29, 0x0a, 0x05, b'.', b'k', b'e', b'e', b'p', 0x12, 0x20,
    ];
    pb.extend_from_slice(blake3::hash(b"").as_bytes());
    assert_eq!(d, Digest::from_bytes(*blake3::hash(&pb).as_bytes()));
    let dir = env.store.get_directory(&d).unwrap();
    assert_eq!(dir.encode(), pb);
    assert!(matches!(
        dir.get(b".keep"),
        Some(Node::File {
            size: 0,
            executable: false,
            ..
        })
    ));
}

#[test]
fn directory_sizes_count_entries_recursively() {
    let env = Env::new();
    let src = env.path("src");
    sample_tree(&src);
    let r = import_path(&env.store, &src, &()).unwrap();
    // usr bin hello share doc hello README empty-file hello-link lib big.bin
    // small.bin etc config dangling var empty bin = 18
    assert_eq!(r.size, 18);
}

#[test]
fn tarball_and_deb_formats_import_to_the_same_tree() {
    let env = Env::new();
    let src = env.path("src");
    small_tree(&src);
    let want = import_path(&env.store, &src, &()).unwrap().root;
    for (flag, ext) in [
        ("", "tar"),
        ("z", "tar.gz"),
        ("J", "tar.xz"),
        ("", "tar.zst"),
        ("j", "tar.bz2"),
    ] {
        let out = env.path(&format!("t.{ext}"));
        let mut cmd = std::process::Command::new("tar");
        cmd.arg("-C").arg(&src);
        if ext == "tar.zst" {
            cmd.arg("--zstd");
        }
        let st = cmd
            .arg(format!("-c{flag}f"))
            .arg(&out)
            .arg(".")
            .status()
            .expect("tar is required: apt-get install tar zstd xz-utils bzip2");
        assert!(
            st.success(),
            "tar failed for {ext} (apt-get install zstd xz-utils bzip2)"
        );
        let got = import_path(&env.store, &out, &()).unwrap().root;
        assert_eq!(got, want, "{ext} imported differently");
    }
    // A .deb built by the real dpkg-deb, with each compressor it offers.
    let pkg = env.path("pkg");
    small_tree(&pkg);
    fs::create_dir_all(pkg.join("DEBIAN")).unwrap();
    fs::write(
        pkg.join("DEBIAN/control"),
        "Package: fhsx-test\nVersion: 1.0\nArchitecture: all\nMaintainer: t <t@example.invalid>\nDescription: test\n",
    )
    .unwrap();
    let mut reference = env.path("ref");
    fs::create_dir_all(&reference).unwrap();
    for entry in fs::read_dir(&pkg).unwrap() {
        let e = entry.unwrap();
        if e.file_name() != "DEBIAN" {
            let st = std::process::Command::new("cp")
                .arg("-a")
                .arg(e.path())
                .arg(&reference)
                .status()
                .unwrap();
            assert!(st.success());
        }
    }
    let want_deb = import_path(&env.store, &reference, &()).unwrap().root;
    reference.push("unused");
    for z in ["gzip", "xz", "zstd", "none"] {
        let deb = env.path(&format!("p-{z}.deb"));
        let st = std::process::Command::new("dpkg-deb")
            .args(["--root-owner-group", &format!("-Z{z}"), "--build"])
            .arg(&pkg)
            .arg(&deb)
            .output()
            .expect("dpkg-deb is required: apt-get install dpkg");
        assert!(
            st.status.success(),
            "dpkg-deb -Z{z}: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        assert_eq!(
            import_path(&env.store, &deb, &()).unwrap().root,
            want_deb,
            "deb -Z{z}"
        );
    }
}
