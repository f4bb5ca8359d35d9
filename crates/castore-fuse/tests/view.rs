//! The view against the tree it serves: same bytes, same listing, no writes,
//! no corrupt byte.

mod common;

use std::ffi::CString;
use std::fs;
use std::io::Read;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use castore::store::{LocalStore, ObjectKind};
use castore::Digest;
use common::*;

/// Mount == `store export`: bytes, exec bits, symlink targets, listings; and
/// find, cat, stat, ls -l, cp -a and exec work on it.
#[test]
fn mount_matches_export_and_tools_work() {
    let fx = Fixture::new(sample_tree);
    let exported = fx.export("export");
    let g = fx.mount("view");
    let m = g.mountpoint().to_path_buf();

    assert_eq!(
        snapshot(&m),
        snapshot(&exported),
        "view differs from export"
    );

    let md = m.display();
    let find_view = sh_ok(&format!("cd {md} && find . | sort"));
    let find_exp = sh_ok(&format!("cd {} && find . | sort", exported.display()));
    assert_eq!(find_view, find_exp);
    assert_eq!(sh_ok(&format!("cat {md}/README")), "hello view\n");
    assert_eq!(
        sh_ok(&format!("stat -c '%a %s %F' {md}/bin/tool.sh")),
        "555 29 regular file\n"
    );
    assert_eq!(
        sh_ok(&format!("stat -c '%a %F' {md}/README")),
        "444 regular file\n"
    );
    assert_eq!(
        sh_ok(&format!("stat -c '%a %F' {md}/share")),
        "555 directory\n"
    );
    let ls = sh_ok(&format!("ls -l {md}/bin"));
    assert!(
        ls.contains("-r-xr-xr-x") && ls.contains("tool -> tool.sh"),
        "{ls}"
    );
    assert_eq!(sh_ok(&format!("{md}/bin/tool x y")), "tool-ran x y\n");
    assert_eq!(sh_ok(&format!("cat {md}/bin/docs/a.txt")), "a\n");

    let copy = fx.tmp.path().join("copy");
    sh_ok(&format!("cp -a {md} {}", copy.display()));
    assert_eq!(
        snapshot(&copy),
        snapshot(&exported),
        "cp -a of the view differs from export"
    );

    // The digest xattr names the blob.
    let c = CString::new(m.join("README").as_os_str().as_bytes()).unwrap();
    let name = CString::new(castore_fuse::DIGEST_XATTR).unwrap();
    let mut buf = [0u8; 128];
    // SAFETY: valid C strings and a buffer of the given length.
    let n = unsafe {
        libc::getxattr(
            c.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    assert!(n > 0, "getxattr: {}", std::io::Error::last_os_error());
    assert_eq!(
        std::str::from_utf8(&buf[..n as usize]).unwrap(),
        Digest::of(b"hello view\n").to_string()
    );

    // Reads at odd offsets and sizes return the right bytes.
    let big = fs::read(fx.src.join("share/data/big.bin")).unwrap();
    let mut f = fs::File::open(m.join("share/data/big.bin")).unwrap();
    let mut got = Vec::new();
    let mut chunk = vec![0u8; 65_537];
    loop {
        let k = f.read(&mut chunk).unwrap();
        if k == 0 {
            break;
        }
        got.extend_from_slice(&chunk[..k]);
    }
    assert_eq!(got.len(), big.len());
    assert!(got == big);

    let out = g.finish(&fx.store).unwrap();
    assert!(out.integrity_failures.is_empty());
    assert!(!is_mounted(&m));
}

fn errno_of<T>(r: std::io::Result<T>) -> Option<i32> {
    r.err().and_then(|e| e.raw_os_error())
}

fn store_state(store: &LocalStore) -> Vec<(String, u64, String)> {
    let mut v = Vec::new();
    fn go(p: &Path, v: &mut Vec<(String, u64, String)>) {
        for e in fs::read_dir(p).unwrap() {
            let e = e.unwrap();
            let m = e.metadata().unwrap();
            if m.is_dir() {
                go(&e.path(), v);
            } else {
                v.push((
                    e.path().display().to_string(),
                    m.len(),
                    Digest::of(&fs::read(e.path()).unwrap()).to_string(),
                ));
            }
        }
    }
    go(&store.root().join("blobs"), &mut v);
    go(&store.root().join("dirs"), &mut v);
    v.sort();
    v
}

/// Every write-type operation fails with EROFS, even for root, and the store
/// is byte-for-byte untouched.
#[test]
fn every_write_fails_with_erofs_and_store_is_untouched() {
    let fx = Fixture::new(sample_tree);
    let before = store_state(&fx.store);
    let g = fx.mount("view");
    let m = g.mountpoint();
    let erofs = Some(libc::EROFS);
    let file = m.join("README");
    let dir = m.join("share");

    assert_eq!(
        errno_of(fs::OpenOptions::new().write(true).open(&file)),
        erofs,
        "open O_WRONLY"
    );
    assert_eq!(
        errno_of(fs::OpenOptions::new().read(true).write(true).open(&file)),
        erofs,
        "open O_RDWR"
    );
    assert_eq!(
        errno_of(fs::OpenOptions::new().append(true).open(&file)),
        erofs,
        "open O_APPEND"
    );
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .open(&file)
        ),
        erofs,
        "open O_TRUNC"
    );
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(m.join("new"))
        ),
        erofs,
        "create"
    );
    assert_eq!(
        errno_of(
            fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_TRUNC)
                .open(&file)
        ),
        erofs,
        "O_RDONLY|O_TRUNC"
    );
    assert_eq!(errno_of(fs::create_dir(m.join("newdir"))), erofs, "mkdir");
    assert_eq!(errno_of(fs::remove_file(&file)), erofs, "unlink");
    assert_eq!(
        errno_of(fs::remove_dir(m.join("var/empty-dir"))),
        erofs,
        "rmdir"
    );
    assert_eq!(
        errno_of(fs::rename(&file, m.join("README2"))),
        erofs,
        "rename"
    );
    assert_eq!(errno_of(fs::hard_link(&file, m.join("hl"))), erofs, "link");
    assert_eq!(
        errno_of(std::os::unix::fs::symlink("x", m.join("sl"))),
        erofs,
        "symlink"
    );
    assert_eq!(
        errno_of(fs::set_permissions(
            &file,
            fs::Permissions::from_mode(0o777)
        )),
        erofs,
        "chmod"
    );
    assert_eq!(
        errno_of(std::os::unix::fs::chown(&file, Some(1), Some(1))),
        erofs,
        "chown"
    );
    let c = |p: &Path| CString::new(p.as_os_str().as_bytes()).unwrap();
    let last = || std::io::Error::last_os_error().raw_os_error();
    // SAFETY: every pointer below is to a live C string or a null timespec.
    unsafe {
        assert_eq!(libc::truncate(c(&file).as_ptr(), 0), -1);
        assert_eq!(last(), erofs, "truncate");
        assert_eq!(
            libc::utimensat(libc::AT_FDCWD, c(&file).as_ptr(), std::ptr::null(), 0),
            -1
        );
        assert_eq!(last(), erofs, "utimes");
        let n = CString::new("user.x").unwrap();
        assert_eq!(
            libc::setxattr(c(&file).as_ptr(), n.as_ptr(), b"v".as_ptr().cast(), 1, 0),
            -1
        );
        assert_eq!(last(), erofs, "setxattr");
        assert_eq!(libc::removexattr(c(&file).as_ptr(), n.as_ptr()), -1);
        assert_eq!(last(), erofs, "removexattr");
        assert_eq!(
            libc::mknod(c(&dir.join("fifo")).as_ptr(), libc::S_IFIFO | 0o644, 0),
            -1
        );
        assert_eq!(last(), erofs, "mknod");
        assert_eq!(libc::access(c(&file).as_ptr(), libc::W_OK), -1);
        assert_eq!(last(), erofs, "access(W_OK)");
    }
    // A shell, as a build would try it.
    let o = sh(&format!("echo x > {}/README", m.display()));
    assert!(!o.status.success());
    assert!(String::from_utf8_lossy(&o.stderr).contains("Read-only file system"));

    assert_eq!(fs::read(&file).unwrap(), b"hello view\n");
    drop(g);
    assert_eq!(store_state(&fx.store), before, "the store changed");
}

/// A corrupt blob: reading it fails, the outcome names the path, every other
/// file stays readable.
#[test]
fn corrupt_blob_is_refused_and_named() {
    let fx = Fixture::new(sample_tree);
    let digest = Digest::of(b"b\n");
    let blob = fx.store.object_path(ObjectKind::Blob, &digest);
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&blob, b"X\n").unwrap();

    let g = fx.mount("view");
    let m = g.mountpoint();
    let e = fs::read(m.join("share/doc/b.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    // Asked again, still refused (verified once, remembered).
    assert!(fs::read(m.join("share/doc/b.txt")).is_err());
    assert_eq!(fs::read(m.join("share/doc/a.txt")).unwrap(), b"a\n");
    assert_eq!(fs::read(m.join("README")).unwrap(), b"hello view\n");
    assert_eq!(g.integrity_failures().len(), 1);

    let out = g.finish(&fx.store).unwrap();
    assert_eq!(out.integrity_failures.len(), 1);
    let f = &out.integrity_failures[0];
    assert_eq!(f.path, "/share/doc/b.txt");
    assert_eq!(f.digest, digest);
    assert_eq!(f.actual, Some(Digest::of(b"X\n")));
    let err = out.check().unwrap_err();
    assert_eq!(err.kind(), castore::ErrorKind::Integrity);
    assert!(err.to_string().contains("/share/doc/b.txt"), "{err}");
    // The refused open is still in the read set: the build tried to read it.
    assert!(out.read_set.get("/share/doc/b.txt").is_some());
}

/// Mounts sharing a [`castore_fuse::VerifiedBlobs`] table hash a blob once:
/// a later mount trusts the very file an earlier one hashed, and only while
/// it is unchanged. A blob rewritten in place after that (same size, so
/// only its times tell) is hashed again and refused.
#[test]
fn a_blob_hashed_by_an_earlier_mount_is_trusted_only_while_unchanged() {
    let fx = Fixture::new(sample_tree);
    let table = std::sync::Arc::new(castore_fuse::VerifiedBlobs::default());
    let opts = castore_fuse::MountOptions {
        verified: table.clone(),
        ..fx.opts()
    };
    let mount =
        |name: &str| castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint(name), &opts).unwrap();
    let a = mount("a");
    assert_eq!(
        fs::read(a.mountpoint().join("share/doc/b.txt")).unwrap(),
        b"b\n"
    );
    assert_eq!(
        fs::read(a.mountpoint().join("share/doc/a.txt")).unwrap(),
        b"a\n"
    );
    a.finish(&fx.store).unwrap().check().unwrap();
    assert_eq!(
        table.hits(),
        0,
        "the first mount hashed nothing it was told of"
    );

    let b = mount("b");
    assert_eq!(
        fs::read(b.mountpoint().join("share/doc/a.txt")).unwrap(),
        b"a\n"
    );
    assert_eq!(
        table.hits(),
        1,
        "the second mount hashed a file already known"
    );
    b.finish(&fx.store).unwrap().check().unwrap();

    std::thread::sleep(std::time::Duration::from_millis(20));
    let digest = Digest::of(b"b\n");
    let blob = fx.store.object_path(ObjectKind::Blob, &digest);
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&blob, b"X\n").unwrap();
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o444)).unwrap();
    let c = mount("c");
    let e = fs::read(c.mountpoint().join("share/doc/b.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let out = c.finish(&fx.store).unwrap();
    assert_eq!(out.integrity_failures.len(), 1);
    assert_eq!(out.integrity_failures[0].actual, Some(Digest::of(b"X\n")));
    assert_eq!(table.hits(), 1, "a rewritten blob was trusted");
}

/// `warm` does what the build's first exec would, before it comes: a child
/// lists the root and reads the first byte of each path it is given, inside
/// the view (a link cannot lead out of it), so the file is recorded as
/// read, verified (by a thread that also hashes it for the mounts sharing
/// the table) and, without opens, stored whole in the page cache. A
/// corrupt blob fails that read as the exec's would, and is reported.
#[test]
fn a_warmed_mount_has_its_first_opens_read_verified_and_cached() {
    use castore_fuse::FirstOpen;
    let fx = Fixture::new(sample_tree);
    let table = std::sync::Arc::new(castore_fuse::VerifiedBlobs::default());
    let opts = castore_fuse::MountOptions {
        verified: table.clone(),
        zero_message_open: true,
        ..fx.opts()
    };
    let mount =
        |name: &str| castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint(name), &opts).unwrap();
    let big: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i * 7 % 251) as u8).collect();
    let first = |path: &str, _bytes: &[u8]| FirstOpen {
        path: path.as_bytes().to_vec(),
    };
    let mut a = mount("a");
    let want = vec![
        first("/share/data/big.bin", &big),
        first("/bin/docs/../../share/doc/a.txt", b"a\n"),
    ];
    a.warm(move || want).unwrap();
    a.root_listed().unwrap();
    let f = fs::File::open(a.mountpoint().join("share/data/big.bin")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut resident, pages) = resident_pages(&f, big.len());
    while resident < pages && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
        resident = resident_pages(&f, big.len()).0;
    }
    assert_eq!(
        resident, pages,
        "the warmed file is not in the page cache: {resident} of {pages} pages"
    );
    drop(f);
    let out = a.finish(&fx.store).unwrap();
    out.check().unwrap();
    let read = |p: &str| {
        out.read_set
            .entries
            .iter()
            .any(|e| e.path == p && e.access == castore_fuse::Access::Read)
    };
    assert!(read("/"), "the root was not listed");
    assert!(read("/share/data/big.bin") && read("/share/doc/a.txt"));
    let b = mount("b");
    assert_eq!(
        fs::read(b.mountpoint().join("share/data/big.bin")).unwrap(),
        big
    );
    assert_eq!(table.hits(), 1, "the warmed blob was hashed again");
    b.finish(&fx.store).unwrap().check().unwrap();

    // A link out of the view is resolved inside it: its target is looked
    // up in the view (absent there), nothing of the host is read.
    let mut c = mount("c");
    let dangling = vec![first("/dangling", b"")];
    c.warm(move || dangling).unwrap();
    c.root_listed().unwrap();
    let out = c.finish(&fx.store).unwrap();
    assert!(
        out.read_set
            .entries
            .iter()
            .any(|e| e.path == "/nonexistent" && e.kind == castore_fuse::EntryKind::Absent),
        "{:?}",
        out.read_set.entries
    );

    // Corrupt in the store: the warming read fails and says so.
    let digest = Digest::of(b"b\n");
    let blob = fx.store.object_path(ObjectKind::Blob, &digest);
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&blob, b"X\n").unwrap();
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o444)).unwrap();
    let mut d = mount("d");
    d.warm(move || vec![first("/share/doc/b.txt", b"b\n")])
        .unwrap();
    d.root_listed().unwrap();
    let out = d.finish(&fx.store).unwrap();
    assert_eq!(out.integrity_failures.len(), 1);
    assert_eq!(out.integrity_failures[0].actual, Some(Digest::of(b"X\n")));
}

/// Many readers at once, through both serving paths: every byte right, and
/// the read set the same as one reader's.
#[test]
fn concurrent_readers_get_the_right_bytes() {
    let fx = Fixture::new(sample_tree);
    for passthrough in [true, false] {
        let opts = castore_fuse::MountOptions {
            passthrough,
            ..fx.opts()
        };
        let mp = fx.mountpoint(if passthrough { "pt" } else { "daemon" });
        let g = castore_fuse::mount(&fx.store, &fx.root, &mp, &opts).unwrap();
        let big = fs::read(fx.src.join("share/data/big.bin")).unwrap();
        std::thread::scope(|s| {
            for t in 0..8 {
                let (mp, big) = (&mp, &big);
                s.spawn(move || {
                    for i in 0..300 {
                        let i = (i * 7 + t * 13) % 300;
                        let got = fs::read(mp.join(format!("many/f{i:04}"))).unwrap();
                        assert_eq!(got, format!("{i}\n").as_bytes());
                    }
                    assert!(fs::read(mp.join("share/data/big.bin")).unwrap() == *big);
                });
            }
        });
        let out = g.finish(&fx.store).unwrap();
        assert!(out.integrity_failures.is_empty());
        let reads = out
            .read_set
            .entries
            .iter()
            .filter(|e| e.access == castore_fuse::Access::Read)
            .count();
        assert_eq!(reads, 301, "300 small files and big.bin");
    }
}

/// A corrupt directory object: listing or resolving below it fails with EIO
/// and is named; its siblings are unaffected.
#[test]
fn corrupt_directory_is_refused_and_named() {
    let fx = Fixture::new(sample_tree);
    let castore::Node::Directory { digest, .. } =
        castore::walk::lookup(&fx.store, &fx.root, "share/doc").unwrap()
    else {
        panic!("share/doc is not a directory");
    };
    let obj = fx.store.object_path(ObjectKind::Directory, &digest);
    fs::set_permissions(&obj, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&obj, b"not a directory").unwrap();

    let g = fx.mount("view");
    let m = g.mountpoint();
    let e = fs::read_dir(m.join("share/doc"))
        .and_then(|mut d| d.next().transpose())
        .unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    assert_eq!(
        fs::read(m.join("share/doc/a.txt"))
            .unwrap_err()
            .raw_os_error(),
        Some(libc::EIO)
    );
    assert_eq!(fs::read(m.join("README")).unwrap(), b"hello view\n");
    let out = g.finish(&fx.store).unwrap();
    assert_eq!(out.integrity_failures.len(), 1);
    assert_eq!(out.integrity_failures[0].path, "/share/doc");
    assert_eq!(out.integrity_failures[0].digest, digest);
    assert_eq!(
        out.check().unwrap_err().kind(),
        castore::ErrorKind::Integrity
    );
}

/// This process's threads named `fhsx-prefill` (only this file's prefill
/// test mounts without opens, so only it makes them).
fn prefill_threads() -> usize {
    (fs::read_dir("/proc/self/task").unwrap())
        .filter_map(|t| fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|c| c.trim_end() == "fhsx-prefill")
        .count()
}

/// The pages of `f` (of `len` bytes) in the page cache, by `mincore` of a
/// mapping of it.
fn resident_pages(f: &fs::File, len: usize) -> (usize, usize) {
    use std::os::fd::AsRawFd;
    let page = 4096;
    let pages = len.div_ceil(page);
    let mut vec = vec![0u8; pages];
    // SAFETY: a fresh shared read-only mapping of an open file, only
    // inspected by mincore (which faults nothing in) and unmapped here.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            f.as_raw_fd(),
            0,
        );
        assert_ne!(p, libc::MAP_FAILED, "{}", std::io::Error::last_os_error());
        assert_eq!(libc::mincore(p, len, vec.as_mut_ptr()), 0);
        libc::munmap(p, len);
    }
    (vec.iter().filter(|b| **b & 1 == 1).count(), pages)
}

/// Without opens, a file's first READ has the daemon store the rest of the
/// verified file in the page cache (so an exec's page faults do not each
/// come back as a READ): after one byte of a 3 MiB file is read, every
/// page of it is resident, and what is resident is the file's bytes. A
/// corrupt file is stored nowhere: its first READ fails.
#[test]
fn a_file_read_once_without_opens_is_stored_whole_in_the_page_cache() {
    use std::os::unix::fs::FileExt;
    let fx = Fixture::new(sample_tree);
    let opts = castore_fuse::MountOptions {
        zero_message_open: true,
        ..fx.opts()
    };
    let g = castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint("prefill"), &opts).unwrap();
    let path = g.mountpoint().join("share/data/big.bin");
    let want: Vec<u8> = (0..(3 << 20) + 17).map(|i| (i * 7 % 251) as u8).collect();
    let f = fs::File::open(&path).unwrap();
    let mut one = [0u8; 1];
    assert_eq!(f.read_at(&mut one, 0).unwrap(), 1);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let (mut resident, pages) = resident_pages(&f, want.len());
    while resident < pages && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
        resident = resident_pages(&f, want.len()).0;
    }
    assert_eq!(
        resident, pages,
        "after one byte read, {resident} of {pages} pages are in the page cache"
    );
    assert_eq!(
        fs::read(&path).unwrap(),
        want,
        "the stored pages are not the file's bytes"
    );
    assert_eq!(
        prefill_threads(),
        1,
        "the mount has no prefill thread to end"
    );
    let out = g.finish(&fx.store).unwrap();
    assert_eq!(prefill_threads(), 0, "a prefill thread outlived its mount");
    assert!(out.integrity_failures.is_empty());
    assert!(out
        .read_set
        .entries
        .iter()
        .any(|e| e.path == "/share/data/big.bin" && e.access == castore_fuse::Access::Read));

    // The same file, corrupt in the store: its first READ fails, and no
    // page of it is served, by READ or from a store.
    let blob = fx.store.object_path(ObjectKind::Blob, &Digest::of(&want));
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    let mut bad = want.clone();
    bad[(2 << 20) + 5] ^= 1;
    fs::write(&blob, &bad).unwrap();
    let opts = castore_fuse::MountOptions {
        verified: std::sync::Arc::default(),
        ..opts
    };
    let g = castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint("prefill2"), &opts).unwrap();
    let path = g.mountpoint().join("share/data/big.bin");
    let f = fs::File::open(&path).unwrap();
    assert_eq!(errno_of(f.read_at(&mut one, 0)), Some(libc::EIO));
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(
        resident_pages(&f, want.len()).0,
        0,
        "a page of a corrupt file is cached"
    );
    assert_eq!(errno_of(f.read_at(&mut one, 2 << 20)), Some(libc::EIO));
    let out = g.finish(&fx.store).unwrap();
    assert_eq!(out.integrity_failures.len(), 1);
    assert_eq!(prefill_threads(), 0, "a prefill thread outlived its mount");
}
