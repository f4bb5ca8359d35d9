//! `fhsx proxy`, `fhsx lock verify`, `fhsx lock diff` as a user runs them:
//! record through curl, stop with SIGTERM, replay (refusal logged on stderr
//! as JSON), verify the lock against the store (and catch a corrupt blob),
//! diff two locks, serve over a UNIX socket. Loopback only.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::Path;
use std::process::{Child, Command, Stdio};

const BODY: &[u8] = b"upstream file body\n";

fn fhsx(store: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fhsx"));
    c.arg("--store").arg(store);
    c
}

/// A tiny upstream: answers every request with BODY, then closes.
fn upstream() -> u16 {
    upstream_serving(BODY)
}

/// An upstream that answers every request with `body`, then closes.
fn upstream_serving(body: &'static [u8]) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { continue };
            std::thread::spawn(move || {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf);
                let _ = write!(
                    s,
                    "HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                let _ = s.write_all(body);
            });
        }
    });
    port
}

/// Start `fhsx proxy`; returns the child and the address it printed.
fn start_proxy(store: &Path, lock: &Path, mode: &str, extra: &[&str]) -> (Child, String) {
    let mut child = fhsx(store)
        .args(["proxy", "--mode", mode, "--lock"])
        .arg(lock)
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    out.read_line(&mut line).unwrap();
    let addr = line
        .trim()
        .strip_prefix("listening on ")
        .unwrap_or_else(|| panic!("unexpected first line {line:?}"))
        .to_string();
    std::thread::spawn(move || {
        let mut rest = String::new();
        let _ = out.read_to_string(&mut rest);
    });
    (child, addr)
}

/// SIGTERM, wait; returns (exit code, stderr).
fn stop(mut child: Child) -> (i32, String) {
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let code = child.wait().unwrap().code().unwrap_or(-1);
    (code, err)
}

fn curl(proxy: &str, url: &str) -> (u16, Vec<u8>) {
    let out = tempfile::NamedTempFile::new().unwrap();
    let o = Command::new("curl")
        .env_remove("http_proxy")
        .env_remove("no_proxy")
        .args(["-sS", "--noproxy", "", "--proxy"])
        .arg(format!("http://{proxy}"))
        .arg("-o")
        .arg(out.path())
        .args(["-w", "%{http_code}"])
        .arg(url)
        .output()
        .unwrap_or_else(|e| panic!("curl is required (apt-get install -y curl): {e}"));
    let code = String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .unwrap_or(0);
    (code, std::fs::read(out.path()).unwrap())
}

#[test]
fn proxy_record_replay_verify_diff_via_the_cli() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let lock = dir.path().join("fetch.lock");
    let port = upstream();
    let url = format!("http://127.0.0.1:{port}/file.txt");

    let (child, addr) = start_proxy(&store, &lock, "record", &["--listen", "127.0.0.1:0"]);
    assert_eq!(curl(&addr, &url), (200, BODY.to_vec()));
    let (code, err) = stop(child);
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("\"event\":\"recorded\""), "{err}");
    assert!(store.join("ca/ca.crt").exists());

    let (child, addr) = start_proxy(&store, &lock, "replay", &["--listen", "127.0.0.1:0"]);
    assert_eq!(curl(&addr, &url), (200, BODY.to_vec()));
    let (c, body) = curl(&addr, &format!("{url}?other=1"));
    assert_eq!(c, 403);
    assert!(String::from_utf8_lossy(&body).contains("refused"));
    let (code, err) = stop(child);
    assert_eq!(code, 0, "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("\"event\":\"refused\""))
        .unwrap_or_else(|| panic!("no refusal log line in {err}"));
    let v: serde_json::Value = serde_json::from_str(line).unwrap();
    assert_eq!(v["url"], format!("{url}?other=1"));
    assert_eq!(v["nearest"], format!("GET {url}"));
    assert_eq!(v["differs"], serde_json::json!(["query"]));

    // verify: ok, then corrupt the blob and get exit 3.
    let o = fhsx(&store)
        .args(["lock", "verify"])
        .arg(&lock)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(String::from_utf8_lossy(&o.stdout).contains("ok: 1 entries"));

    // diff against an empty lock.
    let empty = dir.path().join("empty.lock");
    std::fs::write(&empty, "version = 1\n").unwrap();
    let o = fhsx(&store)
        .args(["lock", "diff"])
        .arg(&lock)
        .arg(&empty)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&o.stdout).contains(&format!("- GET {url}")));
    let o = fhsx(&store)
        .args(["lock", "diff"])
        .arg(&lock)
        .arg(&lock)
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&o.stdout).contains("no differences"));

    let text = std::fs::read_to_string(&lock).unwrap();
    let hex = text
        .lines()
        .find_map(|l| l.strip_prefix("blake3 = \"b3:"))
        .unwrap()
        .trim_end_matches('"')
        .to_string();
    let blob = store.join("blobs").join(&hex[..2]).join(&hex);
    let mut perms = std::fs::metadata(&blob).unwrap().permissions();
    #[allow(clippy::permissions_set_readonly_false)]
    perms.set_readonly(false);
    std::fs::set_permissions(&blob, perms).unwrap();
    std::fs::write(&blob, b"tampered body here\n").unwrap();
    let o = fhsx(&store)
        .args(["lock", "verify"])
        .arg(&lock)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );

    // A malformed lock is a usage error.
    let bad = dir.path().join("bad.lock");
    std::fs::write(&bad, "version = 7\n").unwrap();
    let o = fhsx(&store)
        .args(["lock", "verify"])
        .arg(&bad)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
}

#[test]
fn proxy_listens_on_a_unix_socket() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let lock = dir.path().join("fetch.lock");
    let sock = dir.path().join("proxy.sock");
    let port = upstream();
    let (child, addr) = start_proxy(&store, &lock, "record", &["--unix", sock.to_str().unwrap()]);
    assert_eq!(addr, format!("unix:{}", sock.display()));
    let mut s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
    write!(
        s,
        "GET http://127.0.0.1:{port}/u HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut resp = Vec::new();
    s.read_to_end(&mut resp).unwrap();
    assert!(resp.starts_with(b"HTTP/1.1 200"));
    assert!(resp.ends_with(BODY));
    let (code, err) = stop(child);
    assert_eq!(code, 0, "{err}");
    assert!(!sock.exists());
}

/// `fhsx` is linked statically (tools/rustc-static-bin), yet it must still
/// resolve an upstream by host name through the host's NSS: a recording
/// through `localhost` reaches the loopback upstream.
#[test]
fn the_static_binary_resolves_upstream_host_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let lock = dir.path().join("fetch.lock");
    let port = upstream();
    let url = format!("http://localhost:{port}/named.txt");
    let (child, addr) = start_proxy(&store, &lock, "record", &["--listen", "127.0.0.1:0"]);
    let got = curl(&addr, &url);
    let (code, err) = stop(child);
    assert_eq!(got, (200, BODY.to_vec()), "proxy log: {err}");
    assert_eq!(code, 0, "{err}");
    assert!(err.contains("\"event\":\"recorded\""), "{err}");
}

/// Clients that go away in the middle of a body leave the proxy serving:
/// three curls, each slowed to 64 KiB/s, are killed a moment into a 32 MiB
/// body, so the proxy is mid-write to each; then the same URL comes back
/// whole. The proxy's writes to the reset connections fail (ECONNRESET
/// from its vectored writes, which carry no `MSG_NOSIGNAL`; `fhsx proxy`
/// keeps SIGPIPE ignored in any case, see `Command::holds_no_socket`).
#[test]
fn a_client_that_leaves_mid_body_does_not_end_the_proxy() {
    static BIG: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let big = BIG.get_or_init(|| (0..32u32 << 20).map(|i| (i % 251) as u8).collect());
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let lock = dir.path().join("fetch.lock");
    let port = upstream_serving(big);
    let (mut child, addr) = start_proxy(&store, &lock, "record", &["--listen", "127.0.0.1:0"]);
    for _ in 0..3 {
        let mut slow = Command::new("curl")
            .env_remove("http_proxy")
            .args([
                "-sS",
                "--noproxy",
                "",
                "--limit-rate",
                "64K",
                "-o",
                "/dev/null",
            ])
            .arg("--proxy")
            .arg(format!("http://{addr}"))
            .arg(format!("http://127.0.0.1:{port}/big"))
            .spawn()
            .unwrap_or_else(|e| panic!("curl is required (apt-get install -y curl): {e}"));
        std::thread::sleep(std::time::Duration::from_millis(700));
        slow.kill().unwrap();
        slow.wait().unwrap();
    }
    // Let the proxy meet the closed connections.
    std::thread::sleep(std::time::Duration::from_millis(500));
    if let Some(st) = child.try_wait().unwrap() {
        let mut err = String::new();
        let _ = child.stderr.take().unwrap().read_to_string(&mut err);
        panic!("the proxy ended when a client left mid-body ({st}; SIGPIPE is signal 13): {err}");
    }
    let (code, body) = curl(&addr, &format!("http://127.0.0.1:{port}/big"));
    assert_eq!(code, 200);
    assert!(
        body == *big,
        "the whole fetch after the killed ones came back altered"
    );
    let (code, err) = stop(child);
    assert_eq!(code, 0, "{err}");
}
