//! Hostile archives: each gets a clear error and leaves the store unchanged.

mod common;

use std::io::Write;
use std::path::Path;

use castore::import::{import_path, import_path_with, Limits};
use castore::Error;
use common::*;

/// A raw ustar header with arbitrary name bytes (tar::Builder refuses the
/// hostile ones, which is exactly what we need to write).
fn header(name: &[u8], kind: u8, size: u64, link: &[u8]) -> [u8; 512] {
    let mut h = tar::Header::new_ustar();
    {
        let raw = h.as_ustar_mut().expect("ustar");
        raw.name[..name.len()].copy_from_slice(name);
        raw.linkname[..link.len()].copy_from_slice(link);
    }
    h.set_size(size);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::new(kind));
    h.set_cksum();
    *h.as_bytes()
}

/// (name, type flag, data, link name)
type RawEntry<'a> = (&'a [u8], u8, &'a [u8], &'a [u8]);

fn archive(entries: &[RawEntry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (name, kind, data, link) in entries {
        out.extend_from_slice(&header(name, *kind, data.len() as u64, link));
        out.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        out.extend(std::iter::repeat_n(0u8, pad));
    }
    out.extend_from_slice(&[0u8; 1024]);
    out
}

fn assert_refused(env: &Env, file: &Path, needle: &str) {
    let before = snapshot(&env.store);
    let err = import_path(&env.store, file, &()).expect_err("hostile archive was accepted");
    assert!(
        matches!(err, Error::HostileInput { .. }),
        "wrong error kind for {needle}: {err}"
    );
    let msg = err.to_string();
    assert!(
        msg.contains(needle),
        "error {msg:?} does not mention {needle:?}"
    );
    assert_eq!(
        snapshot(&env.store),
        before,
        "store changed after refusing {needle}"
    );
    assert!(castore::verify::verify(&env.store, None, &())
        .unwrap()
        .is_clean());
    // No staging directory left behind either.
    let tmp: Vec<_> = std::fs::read_dir(env.store.root().join("tmp"))
        .unwrap()
        .collect();
    assert!(tmp.is_empty(), "staging left behind: {tmp:?}");
}

fn case(name: &str, entries: &[RawEntry], needle: &str) {
    let env = Env::new();
    // A good file first, so a partial import would have something to leave.
    let mut all: Vec<RawEntry> = vec![(b"ok/good.txt", b'0', b"good content", b"")];
    all.extend_from_slice(entries);
    let p = env.path(&format!("{name}.tar"));
    std::fs::write(&p, archive(&all)).unwrap();
    assert_refused(&env, &p, needle);
}

#[test]
fn dot_dot_entry() {
    case("dotdot", &[(b"../evil", b'0', b"x", b"")], "..");
    case("dotdot-mid", &[(b"a/../../evil", b'0', b"x", b"")], "..");
}

#[test]
fn absolute_path() {
    case("abs", &[(b"/etc/evil", b'0', b"x", b"")], "absolute path");
}

#[test]
fn write_through_symlink() {
    case(
        "symlink-through",
        &[
            (b"link", b'2', b"", b"/tmp"),
            (b"link/evil", b'0', b"x", b""),
        ],
        "through the symlink",
    );
}

#[test]
fn hard_link_to_outside() {
    case(
        "hardlink-abs",
        &[(b"h", b'1', b"", b"/etc/passwd")],
        "absolute path",
    );
    case("hardlink-up", &[(b"h", b'1', b"", b"../x")], "..");
    case(
        "hardlink-missing",
        &[(b"h", b'1', b"", b"not/there")],
        "not a regular file earlier",
    );
}

#[test]
fn device_nodes_and_fifos() {
    case("chr", &[(b"dev/null", b'3', b"", b"")], "device node");
    case("blk", &[(b"dev/sda", b'4', b"", b"")], "device node");
    case("fifo", &[(b"run/fifo", b'6', b"", b"")], "FIFO");
}

#[test]
fn duplicate_names() {
    case(
        "dup",
        &[(b"ok/good.txt", b'0', b"other", b"")],
        "duplicate entry",
    );
    case(
        "dup-kind",
        &[(b"ok/good.txt", b'5', b"", b"")],
        "duplicate entry",
    );
}

#[test]
fn name_with_nul_via_pax() {
    // A pax `path` record can carry any bytes, NUL included.
    let rec = b"14 path=a\0b/c\n";
    case(
        "nul",
        &[
            (b"PaxHeader", b'x', rec, b""),
            (b"placeholder", b'0', b"x", b""),
        ],
        "NUL",
    );
}

#[test]
fn truncated_streams() {
    let env = Env::new();
    let src = env.path("src");
    small_tree(&src);
    let full = env.path("t.tar.gz");
    assert!(std::process::Command::new("tar")
        .arg("-C")
        .arg(&src)
        .arg("-czf")
        .arg(&full)
        .arg(".")
        .status()
        .unwrap()
        .success());
    let bytes = std::fs::read(&full).unwrap();
    let cut = env.path("cut.tar.gz");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    assert_refused(&env, &cut, "truncated");

    // And a plain tar cut in the middle of a file's data.
    let plain = archive(&[(b"f", b'0', &[1u8; 5000], b"")]);
    let cut = env.path("cut.tar");
    std::fs::write(&cut, &plain[..2048]).unwrap();
    assert_refused(&env, &cut, "truncated");
}

#[test]
fn gzip_bomb_is_refused_with_default_limits() {
    let env = Env::new();
    // 200 MiB of zeros in one entry packs to ~200 KiB: over 200:1.
    let size: u64 = 200 << 20;
    let p = env.path("bomb.tar.gz");
    let f = std::fs::File::create(&p).unwrap();
    let mut gz = flate2::write::GzEncoder::new(f, flate2::Compression::best());
    gz.write_all(&header(b"zeros", b'0', size, b"")).unwrap();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..(size >> 20) {
        gz.write_all(&chunk).unwrap();
    }
    gz.write_all(&[0u8; 1024]).unwrap();
    gz.finish().unwrap();
    assert_refused(&env, &p, "decompression bomb");
}

#[test]
fn total_size_limit() {
    let env = Env::new();
    let p = env.path("big.tar");
    std::fs::write(&p, archive(&[(b"f", b'0', &[1u8; 100_000], b"")])).unwrap();
    let before = snapshot(&env.store);
    let limits = Limits {
        max_unpacked: 50_000,
        ..Limits::default()
    };
    let err = import_path_with(&env.store, &p, &limits, &()).unwrap_err();
    assert!(err.to_string().contains("import limit"), "{err}");
    assert_eq!(snapshot(&env.store), before);
}

#[test]
fn special_files_in_a_directory_are_refused() {
    let env = Env::new();
    let src = env.path("src");
    small_tree(&src);
    let fifo = src.join("etc/fifo");
    let c = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0);
    let before = snapshot(&env.store);
    let err = import_path(&env.store, &src, &()).unwrap_err();
    assert!(err.to_string().contains("FIFOs"), "{err}");
    assert_eq!(snapshot(&env.store), before);
}

/// Found by fuzz/ (archive_import): an ar member named `/<digits>` (a GNU
/// long-name reference with no name table) made the `ar` crate panic. A
/// hostile .deb must be a clear error, not a crash.
#[test]
fn deb_with_a_dangling_gnu_long_name_is_refused_not_a_panic() {
    let env = Env::new();
    let mut deb = b"!<arch>\n/".to_vec();
    deb.extend(std::iter::repeat_n(b'7', 79));
    let p = env.path("dangling.deb");
    std::fs::write(&p, &deb).unwrap();
    assert_refused(&env, &p, ".deb");
}
