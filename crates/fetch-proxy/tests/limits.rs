//! Recording is bounded and leaves nothing half-done: per-body and
//! per-recording byte limits abort the recording naming the limit, and a
//! body that was not received whole and entered in the lock never becomes a
//! store object. Real loopback upstreams (see `common/`).

mod common;

use std::io::{Read, Write};
use std::time::{Duration, Instant};

use common::*;
use fetch_proxy::{Abort, Error, Lock, Mode, RecordLimit};

fn assert_no_partial_blob(h: &Harness) {
    assert_eq!(
        h.blob_files(),
        Vec::<std::path::PathBuf>::new(),
        "a blob was stored"
    );
    assert_eq!(h.staged_bytes(), 0, "staged bytes left behind");
}

/// A declared Content-Length over `max_body_bytes`: refused before a byte
/// is stored, the abort names the limit, every later request is refused,
/// and shutdown fails with `RecordLimit` (a violation, not an integrity
/// error).
#[test]
fn declared_oversized_body_aborts_naming_max_body_bytes() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let p = h.proxy_with(Mode::Record, &lock, None, |c| c.max_body_bytes = 1 << 20);
    let a = p.tcp_addr().unwrap();
    let url = format!("http://127.0.0.1:{}/big/3000000", up.port());
    let r = raw_get(a, &url, "");
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-fhsx-refused"), Some("limit"));
    let body = String::from_utf8_lossy(&r.body).to_string();
    assert!(body.contains("max_body_bytes = 1048576"), "{body}");
    assert!(matches!(
        p.abort(),
        Some(Abort::Limit {
            limit: RecordLimit::BodyBytes,
            max: 1048576,
            ..
        })
    ));
    assert!(p.aborted().unwrap().contains("max_body_bytes"));
    let later = raw_get(a, &format!("http://127.0.0.1:{}/hello", up.port()), "");
    assert_eq!(later.status, 403);
    assert_eq!(later.header("x-fhsx-refused"), Some("aborted"));
    let err = p.shutdown().unwrap_err();
    assert!(
        matches!(
            err,
            Error::RecordLimit {
                limit: RecordLimit::BodyBytes,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.is_violation() && !err.is_integrity());
    assert!(err.to_string().contains("max_body_bytes"), "{err}");
    up.stop();
    assert!(Lock::load_or_empty(&lock).unwrap().is_empty());
    assert_no_partial_blob(&h);
}

/// An endless chunked body (no length to check up front) is cut off at
/// `max_body_bytes` while streaming: nothing of it is kept.
#[test]
fn endless_body_aborts_at_the_limit_and_stores_nothing() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let p = h.proxy_with(Mode::Record, &lock, None, |c| c.max_body_bytes = 3 << 20);
    let a = p.tcp_addr().unwrap();
    let t0 = Instant::now();
    let r = raw_get(a, &format!("http://127.0.0.1:{}/endless", up.port()), "");
    assert!(t0.elapsed() < Duration::from_secs(30));
    assert_eq!(r.status, 403);
    assert_eq!(r.header("x-fhsx-refused"), Some("limit"));
    assert!(p.aborted().unwrap().contains("max_body_bytes = 3145728"));
    let err = p.shutdown().unwrap_err();
    assert!(err.is_violation(), "{err}");
    up.stop();
    assert!(Lock::load_or_empty(&lock).unwrap().is_empty());
    assert_no_partial_blob(&h);
}

/// The recording's total: bodies that fit are recorded (and stay), the one
/// that crosses `max_record_bytes` aborts and leaves nothing — both when
/// its declared length already crosses it and when only streaming does.
#[test]
fn total_limit_aborts_naming_max_record_bytes() {
    for (second, declared) in [("/big/300001", true), ("/endless", false)] {
        let h = Harness::new();
        let lock = h.path("fetch.lock");
        let mut up = Upstream::http(0);
        let p = h.proxy_with(Mode::Record, &lock, None, |c| {
            c.max_record_bytes = 500_000;
        });
        let a = p.tcp_addr().unwrap();
        let first = raw_get(a, &format!("http://127.0.0.1:{}/big/300000", up.port()), "");
        assert_eq!(first.status, 200);
        assert_eq!(first.body, big_body(300_000));
        let blobs = h.blob_files();
        assert_eq!(blobs.len(), 1);
        let r = raw_get(a, &format!("http://127.0.0.1:{}{second}", up.port()), "");
        assert_eq!(r.status, 403, "{second}");
        assert_eq!(r.header("x-fhsx-refused"), Some("limit"));
        let why = p.aborted().unwrap();
        assert!(why.contains("max_record_bytes = 500000"), "{why}");
        assert!(why.contains(second), "{why}");
        let err = p.shutdown().unwrap_err();
        assert!(
            matches!(
                err,
                Error::RecordLimit {
                    limit: RecordLimit::RecordBytes,
                    max: 500_000,
                    ..
                }
            ),
            "{err}"
        );
        up.stop();
        // The first is recorded and stored; nothing of the second.
        assert_eq!(Lock::load(&lock).unwrap().len(), 1, "declared={declared}");
        assert_eq!(h.blob_files(), blobs, "declared={declared}");
        assert_eq!(h.staged_bytes(), 0);
    }
}

/// An upstream that promises 1 MiB and hangs up after 300 KiB: an upstream
/// failure (502, not a violation), no lock entry, no blob.
#[test]
fn body_cut_short_is_not_stored() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    let r = raw_get(a, &format!("http://127.0.0.1:{}/cut", up.port()), "");
    assert_eq!(r.status, 502);
    assert_eq!(r.header("x-fhsx-error"), Some("1"));
    assert!(p.aborted().is_none());
    p.shutdown().unwrap();
    up.stop();
    assert!(Lock::load_or_empty(&lock).unwrap().is_empty());
    assert_no_partial_blob(&h);
}

/// Stopping the proxy while a body is streaming (the build hit its
/// timeout): shutdown returns only once the unfinished body is discarded,
/// and nothing of it is in the store — a stopped proxy once committed such
/// a partial body, a 2.94 GB leftover.
#[test]
fn stopping_mid_body_leaves_no_blob_and_no_staging() {
    // With a Content-Length, and chunked (where only the missing end of
    // the body tells a partial body from a whole one).
    stop_mid_body("/stall");
    stop_mid_body("/stall-chunked");
}

fn stop_mid_body(route: &str) {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    let stall = format!("http://127.0.0.1:{}{route}", up.port());
    let client = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(a).unwrap();
        let _ = write!(
            s,
            "GET {stall} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        buf
    });
    let t0 = Instant::now();
    while h.staged_bytes() < 2 << 20 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "the body never started streaming into the store"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p.shutdown().unwrap();
    // Checked right after shutdown returns, before anyone reopens the store.
    assert_no_partial_blob(&h);
    let got = client.join().unwrap();
    assert!(!String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"));
    up.stop();
    assert!(Lock::load_or_empty(&lock).unwrap().is_empty());
}

/// What the proxy records and serves is in its temp roots while it runs
/// (and in the caller's, when given): a gc in the middle keeps it.
#[test]
fn recorded_blobs_survive_gc_while_rooted() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let store = castore::LocalStore::open(&h.store).unwrap();
    let roots = std::sync::Arc::new(store.temp_roots(&[]).unwrap());
    let r2 = roots.clone();
    let p = h.proxy_with(Mode::Record, &lock, None, move |c| c.temp_roots = Some(r2));
    let a = p.tcp_addr().unwrap();
    let url = format!("http://127.0.0.1:{}/big/200000", up.port());
    assert_eq!(raw_get(a, &url, "").status, 200);
    castore::gc::gc(&store, &[]).unwrap();
    assert_eq!(h.blob_files().len(), 1);
    p.shutdown().unwrap();
    up.stop();
    // Still held by the caller's roots after the proxy is gone.
    castore::gc::gc(&store, &[]).unwrap();
    assert_eq!(h.blob_files().len(), 1);
    let entry = Lock::load(&lock)
        .unwrap()
        .entries()
        .next()
        .cloned()
        .unwrap();
    assert_eq!(roots.digests(), vec![entry.blake3]);
    drop(roots);
    castore::gc::gc(&store, &[]).unwrap();
    assert!(h.blob_files().is_empty());
}
