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
