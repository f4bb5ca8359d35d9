//! End-to-end tests of the fetch proxy against real loopback servers and real
//! clients (curl, Python urllib, raw sockets). See `common/` for fixtures.

mod common;

use std::sync::atomic::Ordering;

use common::*;
use fetch_proxy::{Event, Lock, Mode};

/// Record through curl and Python over HTTP and HTTPS (name and IP literal),
/// then replay with every upstream stopped: bytes identical, and no upstream
/// connection in replay.
#[test]
fn record_then_replay_with_curl_and_python_over_http_and_https() {
    let h = Harness::new();
    let ca = TestCa::new(h.dir.path());
    let mut up = Upstream::http(0);
    let mut ups = Upstream::https(&ca);
    let lock = h.path("fetch.lock");
    let big = 300_000u64; // above the small-body threshold: streamed
    let urls = vec![
        format!("http://127.0.0.1:{}/hello", up.port()),
        format!("http://127.0.0.1:{}/big/{big}", up.port()),
        format!("https://localhost:{}/hello", ups.port()),
        format!("https://127.0.0.1:{}/big/{big}", ups.port()),
    ];
    let expect = |u: &str| {
        if u.ends_with("/hello") {
            HELLO.to_vec()
        } else {
            big_body(big)
        }
    };

    let p = h.proxy(Mode::Record, &lock, Some(&ca.pem_path));
    let addr = p.tcp_addr().unwrap();
    let mut recorded = Vec::new();
    for u in &urls {
        let (c, body) = curl(addr, &h.ca_cert(), u, &[]);
        assert_eq!(c, 200, "curl record {u}");
        assert_eq!(body, expect(u), "curl record body {u}");
        let (c, pbody) = python(addr, &h.ca_cert(), u, &[]);
        assert_eq!(c, 200, "python record {u}");
        assert_eq!(pbody, body, "python record body {u}");
        recorded.push(body);
    }
    // HTTP/2 to the proxy inside the tunnel while recording, too.
    let (c, body) = curl(addr, &h.ca_cert(), &urls[2], &["--http2"]);
    assert_eq!((c, body), (200, HELLO.to_vec()));
    let stats = p.shutdown().unwrap().stats;
    assert!(stats.upstream_connects >= 4);
    up.stop();
    ups.stop();
    let l = Lock::load(&lock).unwrap();
    assert_eq!(l.len(), 4);

    let p = h.proxy(Mode::Replay, &lock, None);
    let addr = p.tcp_addr().unwrap();
    for (u, want) in urls.iter().zip(&recorded) {
        for _ in 0..2 {
            let (c, body) = curl(addr, &h.ca_cert(), u, &[]);
            assert_eq!((c, &body), (200, want), "curl replay {u}");
            let (c, body) = python(addr, &h.ca_cert(), u, &[]);
            assert_eq!((c, &body), (200, want), "python replay {u}");
        }
    }
    // HTTP/2 inside the tunnel (ALPN h2) serves the same bytes.
    let (c, body) = curl(addr, &h.ca_cert(), &urls[2], &["--http2"]);
    assert_eq!((c, body), (200, HELLO.to_vec()));
    let s = p.shutdown().unwrap().stats;
    assert_eq!(s.upstream_connects, 0);
    assert_eq!(s.refused, 0);
    assert!(h.refusals().is_empty());
}

/// Replay refuses an unrecorded URL, another method, another query, the
/// recorded host on another port, and https to the canary; each is a 403
/// with a log line naming the nearest entry and the differing part, and the
/// canaries see no connection at all.
#[test]
fn replay_refuses_outside_the_lock_and_never_connects() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let port = up.port();
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    assert_eq!(
        raw_get(a, &format!("http://127.0.0.1:{port}/norm/a?x=1"), "").status,
        200
    );
    p.shutdown().unwrap();
    up.stop();

    // The canary takes over the recorded port; another canary is the "other port".
    let canary = Canary::start(port);
    let other = Canary::start(0);
    let p = h.proxy(Mode::Replay, &lock, None);
    let a = p.tcp_addr().unwrap();
    let base = format!("http://127.0.0.1:{port}");
    let cases: Vec<(String, String, &str)> = vec![
        ("GET".into(), format!("{base}/norm/unrecorded?x=1"), "path"),
        ("POST".into(), format!("{base}/norm/a?x=1"), "method"),
        ("GET".into(), format!("{base}/norm/a?x=2"), "query"),
        (
            "GET".into(),
            format!("http://127.0.0.1:{}/norm/a?x=1", other.addr.port()),
            "port",
        ),
    ];
    for (method, url, differs) in &cases {
        let host = url.split('/').nth(2).unwrap();
        let r = raw(
            a,
            &format!("{method} {url} HTTP/1.1\r\nHost: {host}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"),
        );
        assert_eq!(r.status, 403, "{method} {url}");
        assert_eq!(r.header("x-fhsx-refused"), Some("not-in-lock"));
        let text = String::from_utf8_lossy(&r.body).to_string();
        assert!(text.contains("refused"), "{text}");
        assert!(
            text.contains(&format!("GET {base}/norm/a?x=1")),
            "nearest named: {text}"
        );
        let ev = h.refusals().pop().unwrap();
        match ev {
            Event::Refused {
                method: m,
                url: u,
                nearest,
                differs: d,
                ..
            } => {
                assert_eq!(&m, method);
                assert_eq!(&u, url);
                assert_eq!(
                    nearest.as_deref(),
                    Some(format!("GET {base}/norm/a?x=1").as_str())
                );
                assert_eq!(d, vec![*differs], "{method} {url}");
            }
            other => panic!("unexpected event {other:?}"),
        }
    }
    // HTTPS to the canary port through CONNECT: terminated locally, refused.
    let (c, body) = curl(
        a,
        &h.ca_cert(),
        &format!("https://127.0.0.1:{port}/norm/a?x=1"),
        &[],
    );
    assert_eq!(c, 403, "{}", String::from_utf8_lossy(&body));
    // The recorded entry still replays, repeatedly.
    for _ in 0..3 {
        assert_eq!(raw_get(a, &format!("{base}/norm/a?x=1"), "").status, 200);
    }
    let s = p.shutdown().unwrap().stats;
    assert_eq!(s.upstream_connects, 0);
    assert_eq!(s.refused, 5);
    assert_eq!(canary.count(), 0, "replay connected to the recorded port");
    assert_eq!(other.count(), 0, "replay connected to another port");
}

/// An empty (or absent) lock refuses everything, HTTP and HTTPS.
#[test]
fn empty_lock_refuses_everything() {
    let h = Harness::new();
    let canary = Canary::start(0);
    for lock_text in [None, Some("version = 1\n")] {
        let lock = h.path("empty.lock");
        let _ = std::fs::remove_file(&lock);
        if let Some(t) = lock_text {
            std::fs::write(&lock, t).unwrap();
        }
        let p = h.proxy(Mode::Replay, &lock, None);
        let a = p.tcp_addr().unwrap();
        let port = canary.addr.port();
        for url in [
            format!("http://127.0.0.1:{port}/"),
            format!("http://localhost:{port}/x?y"),
        ] {
            let r = raw_get(a, &url, "");
            assert_eq!(r.status, 403);
            assert!(String::from_utf8_lossy(&r.body).contains("no entries"));
        }
        let (c, _) = curl(a, &h.ca_cert(), &format!("https://localhost:{port}/"), &[]);
        assert_eq!(c, 403);
        assert_eq!(p.shutdown().unwrap().stats.upstream_connects, 0);
    }
    assert_eq!(canary.count(), 0);
}

/// Reordered query, `%7E` vs `~`, host case and an explicit default port
/// hit; `%2F` vs `/` and `?` vs no query miss. A different User-Agent and
/// HTTP/1.0 vs 1.1 still hit.
#[test]
fn normalisation_and_irrelevant_request_differences() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let port = up.port();
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    for u in [
        format!("http://127.0.0.1:{port}/norm/%7Euser/f?b=2&a=1&b=1"),
        format!("http://127.0.0.1:{port}/norm/a%2Fb"),
        format!("http://127.0.0.1:{port}/norm/q"),
        format!("http://localhost:{port}/norm/host"),
    ] {
        assert_eq!(
            raw_get(a, &u, "User-Agent: recorder/1\r\n").status,
            200,
            "{u}"
        );
    }
    p.shutdown().unwrap();
    up.stop();
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(
        text.contains(&format!("http://127.0.0.1:{port}/norm/~user/f?a=1&b=2&b=1")),
        "{text}"
    );

    let p = h.proxy(Mode::Replay, &lock, None);
    let a = p.tcp_addr().unwrap();
    let hits = [
        format!("http://127.0.0.1:{port}/norm/~user/f?a=1&b=2&b=1"),
        format!("http://127.0.0.1:{port}/norm/%7euser/f?b=2&a=1&b=1"),
        format!("http://LocalHost:{port}/norm/host"),
        format!("http://127.0.0.1:{port}/norm/a%2fb"),
        format!("http://127.0.0.1:{port}/norm/q#fragment"),
    ];
    for u in &hits {
        let r = raw_get(a, u, "User-Agent: somebody-else/9\r\n");
        assert_eq!(r.status, 200, "{u}: {}", String::from_utf8_lossy(&r.body));
    }
    // HTTP/1.0, no User-Agent at all.
    let r = raw(
        a,
        &format!("GET http://127.0.0.1:{port}/norm/q HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\r\n"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"norm body for /norm/q\n".to_vec());
    let misses = [
        (format!("http://127.0.0.1:{port}/norm/a/b"), "path"),
        (format!("http://127.0.0.1:{port}/norm/q?"), "query"),
        (
            format!("http://127.0.0.1:{port}/norm/~user/f?a=1&b=1&b=2"),
            "query",
        ),
    ];
    for (u, _) in &misses {
        assert_eq!(raw_get(a, u, "").status, 403, "{u}");
    }
    let s = p.shutdown().unwrap().stats;
    assert_eq!(s.refused, 3);
    assert_eq!(s.upstream_connects, 0);
}

/// The default port is dropped from the key: `http://h:80/` and `http://h/`
/// are the same entry (checked on the lock, since tests cannot bind :80).
#[test]
fn default_port_is_the_same_key() {
    let a = fetch_proxy::url::NormUrl::parse("http://Example.org:80/x").unwrap();
    let b = fetch_proxy::url::NormUrl::parse("http://example.org/x").unwrap();
    assert_eq!(a.to_string(), b.to_string());
    let a = fetch_proxy::url::NormUrl::parse("https://example.org:443/x").unwrap();
    assert_eq!(a.to_string(), "https://example.org/x");
}

/// Authorization, cookies, userinfo and a signed-URL query: the requests
/// reach upstream intact and work, replay works (even re-signed), and none
/// of the secret values is in the lock.
#[test]
fn secrets_never_reach_the_lock() {
    let h = Harness::new();
    let ca = TestCa::new(h.dir.path());
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let mut ups = Upstream::https(&ca);
    let port = up.port();
    let sport = ups.port();
    let auth = format!("Authorization: Bearer {SECRET_TOKEN}");
    let cookie = format!("session={SECRET_COOKIE}");
    let signed = |sig: &str| {
        format!("https://localhost:{sport}/signed?v=1&X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential={SECRET_CRED}&X-Amz-Date=20260101T000000Z&X-Amz-Expires=300&X-Amz-SignedHeaders=host&X-Amz-Signature={sig}")
    };
    let private = format!("http://127.0.0.1:{port}/private");
    let userinfo = format!("http://user:{SECRET_PASS}@127.0.0.1:{port}/private");

    for mode in [Mode::Record, Mode::Replay] {
        let p = h.proxy(mode, &lock, Some(&ca.pem_path));
        let a = p.tcp_addr().unwrap();
        let (c, b) = curl(
            a,
            &h.ca_cert(),
            &private,
            &["-H", &auth, "--cookie", &cookie],
        );
        assert_eq!((c, b.as_slice()), (200, &b"private data\n"[..]), "{mode:?}");
        let (c, b) = curl(a, &h.ca_cert(), &userinfo, &["--cookie", &cookie]);
        assert_eq!((c, b.as_slice()), (200, &b"private data\n"[..]), "{mode:?}");
        let (c, b) = python(
            a,
            &h.ca_cert(),
            &private,
            &[&auth, &format!("Cookie: {cookie}")],
        );
        assert_eq!((c, b.as_slice()), (200, &b"private data\n"[..]), "{mode:?}");
        // Userinfo written literally into the absolute-form request target.
        let r = raw_get(a, &userinfo, &format!("{auth}\r\nCookie: {cookie}\r\n"));
        assert_eq!(r.status, 200, "{mode:?}");
        let sig = if mode == Mode::Record {
            SECRET_SIG
        } else {
            "resignedlater0000"
        };
        let (c, b) = curl(a, &h.ca_cert(), &signed(sig), &[]);
        assert_eq!((c, b.as_slice()), (200, &b"signed data\n"[..]), "{mode:?}");
        p.shutdown().unwrap();
        if mode == Mode::Record {
            up.stop();
            ups.stop();
        }
    }
    let text = std::fs::read_to_string(&lock).unwrap();
    for secret in [
        SECRET_TOKEN,
        SECRET_COOKIE,
        SECRET_PASS,
        SECRET_SIG,
        SECRET_CRED,
        "Basic",
        "tracking",
    ] {
        assert!(
            !text.contains(secret),
            "{secret} leaked into the lock:\n{text}"
        );
    }
    // base64 of user:PASS as curl sends it.
    let b64 = "dXNlcjpTRUNSRVQtUEFTUy03N2Fi";
    assert!(!text.contains(b64));
    assert!(
        text.contains(&format!("https://localhost:{sport}/signed?v=1\"")),
        "{text}"
    );
}

/// An upstream that gzips despite `Accept-Encoding: identity` (with a
/// different gzip header and level each time): the stored body is the
/// decoded content, its digest is stable across recordings, and it replays
/// correctly to clients that asked for gzip and to ones that did not.
#[test]
fn gzip_from_upstream_is_stable_and_replays_to_any_client() {
    let h = Harness::new();
    let mut up = Upstream::http(0);
    let url = format!("http://127.0.0.1:{}/gzip", up.port());
    let mut texts = Vec::new();
    for name in ["a.lock", "b.lock"] {
        let lock = h.path(name);
        let p = h.proxy(Mode::Record, &lock, None);
        let a = p.tcp_addr().unwrap();
        let (c, b) = curl(a, &h.ca_cert(), &url, &[]);
        assert_eq!((c, b), (200, GZ_TEXT.repeat(50).into_bytes()));
        p.shutdown().unwrap();
        texts.push(std::fs::read_to_string(&lock).unwrap());
    }
    assert_eq!(texts[0], texts[1], "gzip digest unstable");
    assert!(!texts[0].contains("content-encoding"));
    // Upstream really did send different bytes each time.
    let reqs = up.seen.requests.lock().unwrap().clone();
    assert!(reqs
        .iter()
        .all(|r| r.2.get("accept-encoding").map(String::as_str) == Some("identity")));
    up.stop();
    let p = h.proxy(Mode::Replay, &h.path("a.lock"), None);
    let a = p.tcp_addr().unwrap();
    let want = GZ_TEXT.repeat(50).into_bytes();
    assert_eq!(
        curl(a, &h.ca_cert(), &url, &["--compressed"]),
        (200, want.clone())
    );
    assert_eq!(curl(a, &h.ca_cert(), &url, &[]), (200, want.clone()));
    assert_eq!(
        python(a, &h.ca_cert(), &url, &["Accept-Encoding: gzip"]),
        (200, want.clone())
    );
    let r = raw_get(a, &url, "Accept-Encoding: gzip, br\r\n");
    assert_eq!(r.body, want);
    assert_eq!(r.header("content-encoding"), None);
}

/// Chunked upstream bodies replay byte-identically with a Content-Length; a
/// 302 -> 302 -> 200 chain replays; a recorded 404 is a 404, distinguishable
/// from a refusal.
#[test]
fn chunked_redirects_and_recorded_404() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let port = up.port();
    let chunked = format!("http://127.0.0.1:{port}/chunked");
    let r1 = format!("http://127.0.0.1:{port}/r1");
    let missing = format!("http://127.0.0.1:{port}/missing");

    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    let rec_chunked = curl(a, &h.ca_cert(), &chunked, &[]);
    assert_eq!(rec_chunked.0, 200);
    assert_eq!(
        curl(a, &h.ca_cert(), &r1, &["-L"]),
        (200, b"final destination\n".to_vec())
    );
    assert_eq!(
        python(a, &h.ca_cert(), &r1, &[]),
        (200, b"final destination\n".to_vec())
    );
    assert_eq!(
        curl(a, &h.ca_cert(), &missing, &[]),
        (404, b"not here\n".to_vec())
    );
    p.shutdown().unwrap();
    up.stop();

    let l = Lock::load(&lock).unwrap();
    let statuses: Vec<(String, u16)> = l.entries().map(|e| (e.url.clone(), e.status)).collect();
    assert_eq!(
        statuses,
        vec![
            (chunked.clone(), 200),
            (format!("http://127.0.0.1:{port}/final"), 200),
            (missing.clone(), 404),
            (r1.clone(), 302),
            (format!("http://127.0.0.1:{port}/r2"), 302),
        ]
    );

    let p = h.proxy(Mode::Replay, &lock, None);
    let a = p.tcp_addr().unwrap();
    let r = raw_get(a, &chunked, "");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, rec_chunked.1);
    assert_eq!(
        r.header("content-length"),
        Some(rec_chunked.1.len().to_string().as_str())
    );
    assert_eq!(r.header("transfer-encoding"), None);
    let expected: String = (0..50)
        .map(|i| format!("chunk {i:02} {}\n", "x".repeat(i * 3)))
        .collect();
    assert_eq!(r.body, expected.into_bytes());
    assert_eq!(
        curl(a, &h.ca_cert(), &r1, &["-L"]),
        (200, b"final destination\n".to_vec())
    );
    assert_eq!(
        python(a, &h.ca_cert(), &r1, &[]),
        (200, b"final destination\n".to_vec())
    );
    let r = raw_get(a, &r1, "");
    assert_eq!((r.status, r.header("location")), (302, Some("/r2")));
    let r = raw_get(a, &missing, "");
    assert_eq!((r.status, r.body.as_slice()), (404, &b"not here\n"[..]));
    assert_eq!(r.header("x-fhsx-refused"), None);
    let r = raw_get(a, &format!("http://127.0.0.1:{port}/never-recorded"), "");
    assert_eq!(r.status, 403);
    assert!(r.header("x-fhsx-refused").is_some());
    assert_eq!(p.shutdown().unwrap().stats.upstream_connects, 0);
}

/// Range, If-Range and HEAD are answered from the whole recorded blob.
#[test]
fn range_and_head_from_the_whole_blob() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let url = format!("http://127.0.0.1:{}/big/200000", up.port());
    let hello = format!("http://127.0.0.1:{}/hello", up.port());
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    // A ranged request while recording still records the whole body.
    let r = raw_get(a, &url, "Range: bytes=10-19\r\n");
    assert_eq!(r.status, 206);
    assert_eq!(r.body, big_chunk(10, 10));
    let r = raw_get(a, &hello, "If-None-Match: \"v1\"\r\n");
    assert_eq!(r.status, 200, "conditional headers are not forwarded");
    p.shutdown().unwrap();
    assert!(up
        .seen
        .requests
        .lock()
        .unwrap()
        .iter()
        .all(|r| !r.2.contains_key("range") && !r.2.contains_key("if-none-match")));
    up.stop();
    assert_eq!(
        Lock::load(&lock).unwrap().entries().next().map(|e| e.size),
        Some(200000)
    );

    let p = h.proxy(Mode::Replay, &lock, None);
    let a = p.tcp_addr().unwrap();
    let r = raw_get(a, &url, "Range: bytes=100000-\r\n");
    assert_eq!(r.status, 206);
    assert_eq!(
        r.header("content-range"),
        Some("bytes 100000-199999/200000")
    );
    assert_eq!(r.body, big_chunk(100000, 100000));
    let r = raw_get(a, &url, "Range: bytes=-5\r\n");
    assert_eq!(r.body, big_chunk(199995, 5));
    let r = raw_get(a, &url, "Range: bytes=300000-\r\n");
    assert_eq!(r.status, 416);
    let r = raw_get(a, &hello, "Range: bytes=0-4\r\nIf-Range: \"v1\"\r\n");
    assert_eq!((r.status, r.body.as_slice()), (206, &b"hello"[..]));
    let r = raw_get(a, &hello, "Range: bytes=0-4\r\nIf-Range: \"stale\"\r\n");
    assert_eq!((r.status, r.body.as_slice()), (200, HELLO));
    let r = raw(
        a,
        &format!("HEAD {hello} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
    );
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header("content-length"),
        Some(HELLO.len().to_string().as_str())
    );
    assert_eq!(r.header("etag"), Some("\"v1\""));
    assert!(r.body.is_empty());
    let (c, b) = curl(a, &h.ca_cert(), &url, &["-r", "5-9"]);
    assert_eq!((c, b), (206, big_chunk(5, 5)));
}

/// The same session recorded twice, into a fresh lock and over the existing
/// one, gives byte-identical lock files.
#[test]
fn recording_twice_gives_identical_lock_bytes() {
    let h = Harness::new();
    let ca = TestCa::new(h.dir.path());
    let mut up = Upstream::http(0);
    let mut ups = Upstream::https(&ca);
    let session = |lock: &std::path::Path| {
        let p = h.proxy(Mode::Record, lock, Some(&ca.pem_path));
        let a = p.tcp_addr().unwrap();
        for u in [
            format!("https://localhost:{}/r1", ups.port()),
            format!("http://127.0.0.1:{}/hello", up.port()),
            format!("http://127.0.0.1:{}/missing", up.port()),
            format!("http://127.0.0.1:{}/big/70000", up.port()),
            format!("http://127.0.0.1:{}/chunked", up.port()),
        ] {
            curl(a, &h.ca_cert(), &u, &["-L"]);
        }
        p.shutdown().unwrap();
        std::fs::read(lock).unwrap()
    };
    let first = session(&h.path("one.lock"));
    let second = session(&h.path("two.lock"));
    assert_eq!(first, second);
    let again = session(&h.path("one.lock"));
    assert_eq!(first, again);
    up.stop();
    ups.stop();
}

/// Entries replay any number of times concurrently, and concurrent
/// identical requests in record mode reach upstream once.
#[test]
fn concurrent_record_fetches_once_and_concurrent_replay() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let slow = format!("http://127.0.0.1:{}/slow", up.port());
    let big = format!("http://127.0.0.1:{}/big/500000", up.port());
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..8).map(|_| s.spawn(|| raw_get(a, &slow, ""))).collect();
        for t in hs {
            let r = t.join().unwrap();
            assert_eq!((r.status, r.body.as_slice()), (200, &b"slow body\n"[..]));
        }
    });
    assert_eq!(
        up.seen.count("/slow"),
        1,
        "concurrent identical requests fetched more than once"
    );
    assert_eq!(raw_get(a, &big, "").status, 200);
    p.shutdown().unwrap();
    up.stop();

    let p = h.proxy(Mode::Replay, &lock, None);
    let a = p.tcp_addr().unwrap();
    let want = big_body(500000);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..12)
            .map(|i| {
                let (slow, big, want) = (&slow, &big, &want);
                s.spawn(move || {
                    for _ in 0..5 {
                        if i % 2 == 0 {
                            let r = raw_get(a, big, "");
                            assert_eq!(r.status, 200);
                            assert!(r.body == *want);
                        } else {
                            let r = raw_get(a, slow, "");
                            assert_eq!(r.body, b"slow body\n");
                        }
                    }
                })
            })
            .collect();
        for t in hs {
            t.join().unwrap();
        }
    });
    let s = p.shutdown().unwrap().stats;
    assert_eq!(s.served, 60);
    assert_eq!(s.upstream_connects, 0);
}

/// The same key answered with a different body aborts the recording: the
/// client gets a 403 saying so, the lock keeps the first answer, and
/// shutdown reports the abort.
#[test]
fn non_deterministic_upstream_aborts_recording() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let url = format!("http://127.0.0.1:{}/counter", up.port());
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    let first = raw_get(a, &url, "");
    assert_eq!(first.status, 200);
    let second = raw_get(a, &url, "");
    assert_eq!(second.status, 403);
    assert_eq!(second.header("x-fhsx-refused"), Some("non-deterministic"));
    assert!(String::from_utf8_lossy(&second.body).contains("answered differently"));
    // Everything after the abort is refused.
    let third = raw_get(a, &format!("http://127.0.0.1:{}/hello", up.port()), "");
    assert_eq!(third.status, 403);
    let err = p.shutdown().unwrap_err();
    assert!(err.to_string().contains("non-deterministic"), "{err}");
    assert!(err.is_integrity());
    let l = Lock::load(&lock).unwrap();
    assert_eq!(l.len(), 1);
    assert_eq!(l.entries().next().unwrap().size, first.body.len() as u64);
    up.stop();
}

/// Same body with a drifting ETag is the same answer: no abort, and the
/// lock keeps the first recording byte for byte.
#[test]
fn drifting_validators_are_not_non_determinism() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let url = format!("http://127.0.0.1:{}/drift", up.port());
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    assert_eq!(raw_get(a, &url, "").status, 200);
    let first = std::fs::read(&lock).unwrap();
    assert_eq!(raw_get(a, &url, "").status, 200);
    p.shutdown().unwrap();
    up.stop();
    assert_eq!(up.seen.count("/drift"), 2);
    assert_eq!(std::fs::read(&lock).unwrap(), first);
}

/// Plain bytes after CONNECT, a WebSocket upgrade, a TLS ClientHello without
/// SNI, and a Host header that differs from the CONNECT target: refused,
/// never tunnelled, no upstream connection.
#[test]
fn tunnel_abuse_is_refused() {
    use std::io::{Read, Write};
    let h = Harness::new();
    let canary = Canary::start(0);
    let port = canary.addr.port();
    let lock = h.path("fetch.lock");
    for mode in [Mode::Replay, Mode::Record] {
        let p = h.proxy(mode, &lock, None);
        let a = p.tcp_addr().unwrap();
        // Plain HTTP inside a CONNECT tunnel.
        let mut s = std::net::TcpStream::connect(a).unwrap();
        write!(
            s,
            "CONNECT 127.0.0.1:{port} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n"
        )
        .unwrap();
        let mut buf = [0u8; 1024];
        let n = s.read(&mut buf).unwrap();
        assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
        // One write: the proxy answers after the first byte.
        s.write_all(format!("GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n\r\n").as_bytes())
            .unwrap();
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        let text = String::from_utf8_lossy(&rest);
        assert!(text.starts_with("HTTP/1.1 403"), "{mode:?}: {text}");
        assert!(text.contains("plain bytes after CONNECT"));

        // WebSocket upgrade.
        let r = raw(
            a,
            &format!("GET http://127.0.0.1:{port}/ws HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade, close\r\nUpgrade: websocket\r\nSec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"),
        );
        assert_eq!(r.status, 403, "{mode:?}");
        assert_eq!(r.header("x-fhsx-refused"), Some("upgrade"));

        // Host header differing from the CONNECT target (domain fronting).
        let (c, _) = curl(
            a,
            &h.ca_cert(),
            &format!("https://localhost:{port}/x"),
            &["-H", "Host: elsewhere.example"],
        );
        assert_eq!(c, 403, "{mode:?}");

        // No SNI for a host name: the handshake is refused.
        let before = h.refusals().len();
        let no_sni = no_sni_handshake(a, &format!("localhost:{port}"), &h.ca_cert());
        assert!(!no_sni, "{mode:?}: handshake without SNI succeeded");
        let refusals = h.refusals();
        assert!(refusals[before..]
            .iter()
            .any(|e| matches!(e, Event::Refused { reason, .. } if reason.contains("SNI"))));
        assert_eq!(p.shutdown().unwrap().stats.upstream_connects, 0);
    }
    assert_eq!(canary.count(), 0);
}

/// CONNECT, then a TLS handshake with SNI disabled. True if it succeeded.
fn no_sni_handshake(proxy: std::net::SocketAddr, target: &str, ca: &std::path::Path) -> bool {
    use rustls_pki_types::pem::PemObject;
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(proxy).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .unwrap();
    write!(s, "CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").unwrap();
    let mut buf = [0u8; 1024];
    let n = s.read(&mut buf).unwrap();
    assert!(String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"));
    let mut roots = rustls::RootCertStore::empty();
    for c in rustls_pki_types::CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let mut cfg = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    cfg.enable_sni = false;
    let name = rustls_pki_types::ServerName::try_from("localhost").unwrap();
    let mut conn = rustls::ClientConnection::new(std::sync::Arc::new(cfg), name).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut s);
    tls.write_all(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
        .is_ok()
        && {
            let mut out = Vec::new();
            tls.read_to_end(&mut out).is_ok() && !out.is_empty()
        }
}

/// The UNIX-socket listener (what the executor uses) serves the same.
#[test]
fn unix_socket_listener_replays() {
    use std::io::{Read, Write};
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let url = format!("http://127.0.0.1:{}/hello", up.port());
    let p = h.proxy(Mode::Record, &lock, None);
    assert_eq!(raw_get(p.tcp_addr().unwrap(), &url, "").status, 200);
    p.shutdown().unwrap();
    up.stop();

    let sock = h.path("proxy.sock");
    let store = castore::LocalStore::open(&h.store).unwrap();
    let cfg = fetch_proxy::ProxyConfig::new(Mode::Replay, lock.clone(), store).unwrap();
    let p = fetch_proxy::RunningProxy::start(cfg, fetch_proxy::Listen::Unix(sock.clone())).unwrap();
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    write!(
        s,
        "GET {url} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut buf = Vec::new();
    s.read_to_end(&mut buf).unwrap();
    let r = parse_raw(&buf, false);
    assert_eq!((r.status, r.body.as_slice()), (200, HELLO));
    let st = p.shutdown().unwrap().stats;
    assert_eq!((st.served, st.upstream_connects), (1, 0));
    assert!(!sock.exists(), "socket file left behind");
    let _ = Ordering::SeqCst;
}

/// A redirect to a presigned URL: the live client follows the real signed
/// location while recording; the lock keeps the location without the
/// signature; replay follows that and still hits.
#[test]
fn redirect_to_a_presigned_url() {
    let h = Harness::new();
    let ca = TestCa::new(h.dir.path());
    let lock = h.path("fetch.lock");
    let mut ups = Upstream::https(&ca);
    let url = format!("https://localhost:{}/presign", ups.port());
    for mode in [Mode::Record, Mode::Replay] {
        let p = h.proxy(mode, &lock, Some(&ca.pem_path));
        let a = p.tcp_addr().unwrap();
        assert_eq!(
            curl(a, &h.ca_cert(), &url, &["-L"]),
            (200, b"signed data\n".to_vec()),
            "{mode:?}"
        );
        assert_eq!(
            python(a, &h.ca_cert(), &url, &[]),
            (200, b"signed data\n".to_vec()),
            "{mode:?}"
        );
        p.shutdown().unwrap();
        ups.stop();
    }
    let text = std::fs::read_to_string(&lock).unwrap();
    assert!(
        !text.contains(SECRET_SIG) && !text.contains(SECRET_CRED),
        "{text}"
    );
    assert!(
        text.contains(&format!(
            "location = \"https://localhost:{}/signed?v=1\"",
            ups.port()
        )),
        "{text}"
    );
}

/// Upstream 5xx and an unreachable upstream are not recorded: the client
/// gets a 502 marked as a proxy error (not a refusal), the lock stays empty.
#[test]
fn upstream_failures_are_not_recorded() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = h.proxy(Mode::Record, &lock, None);
    let a = p.tcp_addr().unwrap();
    for url in [
        format!("http://127.0.0.1:{}/error", up.port()),
        format!("http://127.0.0.1:{closed}/x"),
    ] {
        let r = raw_get(a, &url, "");
        assert_eq!(r.status, 502, "{url}");
        assert_eq!(r.header("x-fhsx-error"), Some("1"));
        assert_eq!(r.header("x-fhsx-refused"), None);
    }
    assert!(
        h.events
            .lock()
            .unwrap()
            .iter()
            .filter(|e| matches!(e, Event::RecordFailed { .. }))
            .count()
            == 2
    );
    p.shutdown().unwrap();
    up.stop();
    assert!(Lock::load_or_empty(&lock).unwrap().is_empty());
}

/// The executor may call `start` from inside its own tokio runtime; a port
/// already taken is a clean `Listen` error.
#[test]
fn starts_inside_a_tokio_runtime_and_reports_busy_ports() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let p = rt.block_on(async { h.proxy(Mode::Replay, &lock, None) });
    let a = p.tcp_addr().unwrap();
    assert_eq!(raw_get(a, "http://127.0.0.1:9/x", "").status, 403);
    let store = castore::LocalStore::open(&h.store).unwrap();
    let cfg = fetch_proxy::ProxyConfig::new(Mode::Replay, lock.clone(), store).unwrap();
    let err = fetch_proxy::RunningProxy::start(cfg, fetch_proxy::Listen::Tcp(a))
        .err()
        .expect("second bind on the same port succeeded");
    assert!(matches!(err, fetch_proxy::Error::Listen { .. }), "{err}");
    rt.block_on(async { drop(p) });
}
