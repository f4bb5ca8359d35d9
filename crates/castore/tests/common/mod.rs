//! Helpers shared by castore's integration tests.
#![allow(dead_code)]

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use castore::LocalStore;

pub struct Env {
    pub dir: tempfile::TempDir,
    pub store: LocalStore,
}

impl Env {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalStore::open(dir.path().join("store")).expect("open store");
        Env { dir, store }
    }

    pub fn path(&self, p: &str) -> PathBuf {
        self.dir.path().join(p)
    }
}

/// Every object file in the store (blobs, dirs, compositions), for
/// "the store is unchanged" checks.
pub fn snapshot(store: &LocalStore) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for sub in ["blobs", "dirs", "compositions"] {
        walk(&store.root().join(sub), &mut out);
    }
    out.sort();
    out
}

fn walk(p: &Path, out: &mut Vec<PathBuf>) {
    for e in fs::read_dir(p).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            walk(&p, out);
        } else {
            out.push(p);
        }
    }
}

pub fn write(p: &Path, content: &[u8], mode: u32) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(p, content).unwrap();
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A small tree with every node kind and some edge cases, plus one file
/// big enough to take the large-file import path.
pub fn sample_tree(root: &Path) {
    small_tree(root);
    write(
        &root.join("usr/lib/big.bin"),
        &pseudo_random(17 << 20, 1),
        0o644,
    );
}

/// [`sample_tree`] without the big file.
pub fn small_tree(root: &Path) {
    write(
        &root.join("usr/bin/hello"),
        b"#!/bin/sh\necho hello\n",
        0o755,
    );
    write(
        &root.join("usr/share/doc/hello/README"),
        b"read me\n",
        0o644,
    );
    write(&root.join("usr/share/empty-file"), b"", 0o644);
    write(&root.join("etc/config"), &vec![7u8; 100_000], 0o600);
    fs::create_dir_all(root.join("var/empty")).unwrap();
    std::os::unix::fs::symlink("usr/bin", root.join("bin")).unwrap();
    std::os::unix::fs::symlink("/nonexistent/absolute", root.join("etc/dangling")).unwrap();
    std::os::unix::fs::symlink("../../usr/bin/hello", root.join("usr/share/hello-link")).unwrap();
    write(
        &root.join("usr/lib/small.bin"),
        &pseudo_random(3000, 2),
        0o644,
    );
}

pub fn pseudo_random(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Assert two directory trees are identical: bytes, exec bits, symlink targets, listings.
pub fn assert_same_tree(a: &Path, b: &Path) {
    let mut ea: Vec<_> = fs::read_dir(a)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    let mut eb: Vec<_> = fs::read_dir(b)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    ea.sort();
    eb.sort();
    assert_eq!(ea, eb, "listings differ at {}", a.display());
    for n in ea {
        let (pa, pb) = (a.join(&n), b.join(&n));
        let (ma, mb) = (
            fs::symlink_metadata(&pa).unwrap(),
            fs::symlink_metadata(&pb).unwrap(),
        );
        assert_eq!(
            ma.file_type(),
            mb.file_type(),
            "type differs at {}",
            pa.display()
        );
        if ma.is_symlink() {
            assert_eq!(fs::read_link(&pa).unwrap(), fs::read_link(&pb).unwrap());
        } else if ma.is_dir() {
            assert_same_tree(&pa, &pb);
        } else {
            assert_eq!(
                fs::read(&pa).unwrap(),
                fs::read(&pb).unwrap(),
                "bytes differ at {}",
                pa.display()
            );
            assert_eq!(
                ma.permissions().mode() & 0o100,
                mb.permissions().mode() & 0o100,
                "exec bit differs at {}",
                pa.display()
            );
        }
    }
}
