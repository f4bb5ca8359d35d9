//! The properties each fuzz target checks, shared by the libFuzzer targets
//! (`fuzz_targets/`, run by `fuzz/run.sh`) and the plain random-input tests
//! (`tests/random.rs`, `cargo test` in this directory on stable).
//!
//! Every function must not panic for any input; where it accepts an input,
//! the result must round-trip.

use std::io::Cursor;
use std::path::Path;

/// `castore::Directory::decode`: never panics; what it accepts re-encodes
/// to exactly the same bytes (canonical encoding) and decodes again.
pub fn directory_decode(data: &[u8]) {
    if let Ok(d) = castore::Directory::decode(data) {
        let enc = d.encode();
        assert_eq!(enc, data, "an accepted directory is not canonical");
        let again = castore::Directory::decode(&enc).expect("re-decode");
        assert_eq!(again.encode(), enc);
    }
}

/// Archive import (tar, compressed tar, .deb — the format is sniffed):
/// never panics, with unpacking bounded to 64 MiB.
pub fn archive_import(data: &[u8]) {
    use std::sync::OnceLock;
    // One store for the whole run (opening one per input is slow); inputs
    // are small, so what they add is small.
    static STORE: OnceLock<(tempfile::TempDir, castore::LocalStore)> = OnceLock::new();
    let (dir, store) = STORE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = castore::LocalStore::open(dir.path().join("store")).expect("open store");
        (dir, store)
    });
    let file = tempfile::NamedTempFile::new_in(dir.path()).expect("input file");
    std::fs::write(file.path(), data).expect("write input");
    let limits = castore::import::Limits {
        max_unpacked: 64 << 20,
        ..castore::import::Limits::default()
    };
    let _ = castore::import::import_path_with(store, file.path(), &limits, &());
}

/// `executor_core::Action::parse`: never panics; an accepted action's
/// digest is stable.
pub fn action_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(a) = executor_core::Action::parse(text, Path::new("fuzz.toml")) {
        assert_eq!(a.digest(None), a.digest(None));
    }
}

/// `fetch_proxy::Lock::parse`: never panics; an accepted lock serialises
/// to TOML that parses back to the same bytes (recording twice gives the
/// same file).
pub fn lock_parse(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(l) = fetch_proxy::Lock::parse(text) {
        let t = l.to_toml();
        let again = fetch_proxy::Lock::parse(&t).expect("a written lock parses");
        assert_eq!(again.to_toml(), t, "lock serialisation is not stable");
    }
}

/// URL normalisation: never panics; normalising is idempotent.
pub fn url_normalise(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(u) = fetch_proxy::url::NormUrl::parse(text) {
        let s = u.to_string();
        let again = fetch_proxy::url::NormUrl::parse(&s)
            .unwrap_or_else(|e| panic!("normal form {s:?} of {text:?} does not parse: {e}"));
        assert_eq!(again.to_string(), s, "normalisation of {text:?} is not idempotent");
    }
    let _ = fetch_proxy::url::norm_query(text);
    let _ = fetch_proxy::url::norm_pct(text);
}

/// The supervisor RPC frame codec: never panics or allocates past the
/// frame bound; what it reads writes back to the same bytes.
pub fn rpc_frame(data: &[u8]) {
    let mut r = Cursor::new(data);
    while let Ok(Some(frame)) = executor_sandbox::rpc::read_frame(&mut r) {
        assert!(frame.len() <= 1 << 20);
        let mut out = Vec::new();
        executor_sandbox::rpc::write_frame(&mut out, &frame).expect("write a read frame");
        assert_eq!(&out[4..], &frame[..]);
        let _ = serde_json::from_slice::<executor_sandbox::rpc::Request>(&frame);
    }
}

/// Ingest of a build's output: the bytes drive the making of a tree in a
/// scratch directory — directories entered and left, files dense and
/// sparse, symlinks (into an output, the scratch, out of the output, to a
/// host file), hard links, FIFOs, odd modes, chains hundreds to thousands
/// of levels deep — which is then ingested as output `out` under small
/// limits. Ingest never panics, and it imports or refuses: an import holds
/// no more entries than the limit allows.
pub fn ingest_tree(data: &[u8]) {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    use std::sync::OnceLock;
    static STORE: OnceLock<(tempfile::TempDir, castore::LocalStore)> = OnceLock::new();
    let (dir, store) = STORE.get_or_init(|| {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = castore::LocalStore::open(dir.path().join("store")).expect("open store");
        (dir, store)
    });
    let scratch = tempfile::tempdir_in(dir.path()).expect("scratch");
    let out = scratch.path().join("out");
    std::fs::create_dir(&out).expect("out");
    const TARGETS: [&str; 8] = [
        "/build/out/usr/lib/x",
        "/build/src/y",
        "../../..",
        "/etc/passwd",
        "a/../b",
        ".",
        "",
        "/build/out",
    ];
    let mut here = out.clone();
    let mut depth = 0usize;
    let mut last_file: Option<std::path::PathBuf> = None;
    let mut bytes = data.iter().copied();
    let mut next = move || bytes.next();
    while let Some(op) = next() {
        let arg = next().unwrap_or(0);
        // A name of 1-8 bytes from the input, never `/`, NUL, `.` or `..`.
        let name: Vec<u8> = (0..1 + arg % 8)
            .map(|_| next().unwrap_or(b'n'))
            .map(|b| if b == b'/' || b == 0 { b'_' } else { b })
            .collect();
        let name = if name == b"." || name == b".." { b"dots".to_vec() } else { name };
        let p = here.join(std::ffi::OsStr::from_bytes(&name));
        match op % 9 {
            0 => {
                if std::fs::create_dir(&p).is_ok() {
                    here = p;
                    depth += 1;
                }
            }
            1 if depth > 0 => {
                here.pop();
                depth -= 1;
            }
            2 => {
                let _ = std::fs::write(&p, vec![arg; usize::from(arg) * 3]);
                last_file = Some(p);
            }
            3 => {
                // Sparse: long as it reads, no blocks.
                if let Ok(f) = std::fs::File::create(&p) {
                    let _ = f.set_len(u64::from(arg) << 16);
                }
            }
            4 => {
                let _ = std::os::unix::fs::symlink(TARGETS[usize::from(arg) % TARGETS.len()], &p);
            }
            5 => {
                if let Some(f) = &last_file {
                    let _ = std::fs::hard_link(f, &p);
                }
            }
            6 => {
                let c = std::ffi::CString::new(p.as_os_str().as_bytes()).expect("no NUL");
                // SAFETY: a NUL-terminated path.
                unsafe { libc::mkfifo(c.as_ptr(), 0o600) };
            }
            7 => {
                let _ = std::fs::set_permissions(&here, std::fs::Permissions::from_mode(u32::from(arg) << 1));
            }
            _ => {
                // A chain from here, each level made relative to the last.
                use rustix::fs::{Mode, OFlags};
                let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC;
                let Ok(mut cur) = rustix::fs::open(&here, flags, Mode::empty()) else {
                    continue;
                };
                for _ in 0..usize::from(arg) * 8 {
                    let _ = rustix::fs::mkdirat(&cur, "c", Mode::from_raw_mode(0o755));
                    match rustix::fs::openat(&cur, "c", flags | OFlags::NOFOLLOW, Mode::empty()) {
                        Ok(next) => cur = next,
                        Err(_) => break,
                    }
                }
            }
        }
    }
    let names = ["out".parse().expect("a valid output name")];
    let limits = fhs_executor::ingest::OutputLimits {
        bytes: 4 << 20,
        entries: 2000,
    };
    let places = std::collections::BTreeMap::new();
    match fhs_executor::ingest::ingest_outputs(store, scratch.path(), &names, &places, limits) {
        Ok(ingested) => {
            let root = ingested.outputs.values().next().expect("one output");
            let d = castore::store::DirectoryStore::get_directory(store, root).expect("stored");
            assert!(d.size() <= 2000, "imported {} entries past the limit", d.size());
        }
        Err(_) => {}
    }
    // Whatever the build left, the scratch can be removed.
    castore::fs_tree::remove_tree(scratch.path()).expect("the scratch is removable");
    std::mem::forget(scratch);
}
