//! Shared fixtures for the real-mount tests.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::fs;
use std::os::unix::fs::{symlink, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use castore::store::LocalStore;
use castore::Digest;
use castore_fuse::{MountGuard, MountOptions};
use tempfile::TempDir;

/// Fail (never skip) when this machine cannot run the tests.
pub fn require_fuse() {
    let have_fusermount = Command::new("sh")
        .args(["-c", "command -v fusermount3"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !Path::new("/dev/fuse").exists() || !have_fusermount {
        panic!(
            "these tests need real FUSE mounts: /dev/fuse and fusermount3 must exist; \
             run `apt-get install fuse3` (and `modprobe fuse`)"
        );
    }
    if let Err(e) = castore_fuse::preflight() {
        panic!("{e}");
    }
}

pub struct Fixture {
    pub tmp: TempDir,
    pub store: LocalStore,
    pub root: Digest,
    pub src: PathBuf,
}

impl Fixture {
    /// Import the tree `build` writes into a fresh store.
    pub fn new(build: impl FnOnce(&Path)) -> Fixture {
        require_fuse();
        let tmp = TempDir::new().unwrap();
        let src = tmp.path().join("src");
        fs::create_dir(&src).unwrap();
        build(&src);
        let store = LocalStore::open(tmp.path().join("store")).unwrap();
        let root = castore::import::import_path(&store, &src, &())
            .unwrap()
            .root;
        Fixture {
            tmp,
            store,
            root,
            src,
        }
    }

    pub fn mountpoint(&self, name: &str) -> PathBuf {
        let p = self.tmp.path().join(name);
        fs::create_dir_all(&p).unwrap();
        p
    }

    pub fn opts(&self) -> MountOptions {
        MountOptions {
            registry: self.tmp.path().join("registry"),
            ..MountOptions::default()
        }
    }

    pub fn mount(&self, name: &str) -> MountGuard {
        castore_fuse::mount(
            &self.store,
            &self.root,
            &self.mountpoint(name),
            &self.opts(),
        )
        .unwrap()
    }

    pub fn export(&self, name: &str) -> PathBuf {
        let p = self.tmp.path().join(name);
        castore::export::export(&self.store, &self.root, &p, &()).unwrap();
        p
    }
}

pub fn write(p: &Path, bytes: &[u8], exec: bool) {
    if let Some(d) = p.parent() {
        fs::create_dir_all(d).unwrap();
    }
    fs::write(p, bytes).unwrap();
    let mode = if exec { 0o755 } else { 0o644 };
    fs::set_permissions(p, fs::Permissions::from_mode(mode)).unwrap();
}

/// A tree with every kind of node and a few awkward names.
pub fn sample_tree(root: &Path) {
    write(&root.join("README"), b"hello view\n", false);
    write(&root.join("empty"), b"", false);
    write(
        &root.join("bin/tool.sh"),
        b"#!/bin/sh\necho tool-ran \"$@\"\n",
        true,
    );
    let big: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i * 7 % 251) as u8).collect();
    write(&root.join("share/data/big.bin"), &big, false);
    write(
        &root.join("share/data/name with spaces ü"),
        b"unicode\n",
        false,
    );
    write(&root.join("share/doc/a.txt"), b"a\n", false);
    write(&root.join("share/doc/b.txt"), b"b\n", false);
    write(&root.join("share/doc/c.txt"), b"c\n", false);
    write(&root.join("share/doc/d.txt"), b"d\n", false);
    fs::create_dir_all(root.join("var/empty-dir")).unwrap();
    symlink("tool.sh", root.join("bin/tool")).unwrap();
    symlink("../share/doc", root.join("bin/docs")).unwrap();
    symlink("/nonexistent/absolute", root.join("dangling")).unwrap();
    for i in 0..300 {
        write(
            &root.join(format!("many/f{i:04}")),
            format!("{i}\n").as_bytes(),
            false,
        );
    }
}

/// Every path below `root`: kind, exec bit, bytes or link target.
pub fn snapshot(root: &Path) -> BTreeMap<PathBuf, String> {
    let mut out = BTreeMap::new();
    fn go(root: &Path, rel: &Path, out: &mut BTreeMap<PathBuf, String>) {
        let p = root.join(rel);
        let m = fs::symlink_metadata(&p).unwrap();
        let ft = m.file_type();
        let v = if ft.is_symlink() {
            format!("symlink {}", fs::read_link(&p).unwrap().display())
        } else if ft.is_dir() {
            let mut names: Vec<_> = fs::read_dir(&p)
                .unwrap()
                .map(|e| e.unwrap().file_name())
                .collect();
            names.sort();
            for n in &names {
                go(root, &rel.join(n), out);
            }
            format!("dir {names:?}")
        } else {
            let exec = m.permissions().mode() & 0o111 != 0;
            format!("file exec={exec} {}", Digest::of(&fs::read(&p).unwrap()))
        };
        out.insert(rel.to_path_buf(), v);
    }
    go(root, Path::new(""), &mut out);
    out
}

pub fn sh(script: &str) -> std::process::Output {
    Command::new("sh").args(["-c", script]).output().unwrap()
}

pub fn sh_ok(script: &str) -> String {
    let o = sh(script);
    assert!(
        o.status.success(),
        "`{script}` failed: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

pub fn is_mounted(p: &Path) -> bool {
    let p = fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
    castore_fuse::live_mounts().contains(&p)
}
