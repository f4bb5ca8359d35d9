//! The fetch proxy forwarder with the real bwrap: the supervisor listens on
//! 127.0.0.1:3128 inside the sandbox's own network namespace and forwards
//! to a host UNIX socket; nothing else of the host's network is reachable.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use common::*;
use executor_sandbox::{HostEnv, Outcome, RunReport, Runtime, DEFAULT_PROXY_PORT, PROXY_CA_PATH};

/// The tools these tests run inside (host-root mode shows the host's /usr).
fn require(tool: &str) {
    if !Path::new(tool).exists() {
        panic!("{tool} is missing: install it (CI: .ci/apt-packages); the proxy tests use it inside the sandbox");
    }
}

/// A host-side server on a UNIX socket; `serve` handles each connection
/// on its own thread. Returns the socket path (in `dir`) and a counter of
/// accepted connections.
fn unix_server(dir: &Path, serve: fn(UnixStream)) -> (PathBuf, Arc<AtomicUsize>) {
    let path = dir.join("proxy.sock");
    let l = UnixListener::bind(&path).expect("bind the host socket");
    let n = Arc::new(AtomicUsize::new(0));
    let n2 = n.clone();
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            n2.fetch_add(1, Ordering::SeqCst);
            std::thread::spawn(move || serve(c));
        }
    });
    (path, n)
}

/// A minimal HTTP proxy: answers every request with its request line.
fn http_echo(c: UnixStream) {
    let mut r = BufReader::new(c.try_clone().unwrap());
    let mut first = String::new();
    let _ = r.read_line(&mut first);
    loop {
        let mut l = String::new();
        if r.read_line(&mut l).unwrap_or(0) == 0 || l == "\r\n" {
            break;
        }
    }
    let body = format!("proxied: {}", first.trim_end());
    let mut c = c;
    let _ = write!(
        c,
        "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
}

/// Reads to EOF (the client's half-close), then sends it all back and
/// closes: works only if half-closes cross in both directions.
fn echo_after_eof(mut c: UnixStream) {
    let mut data = Vec::new();
    if c.read_to_end(&mut data).is_ok() {
        let _ = c.write_all(&data);
    }
}

fn run_with_proxy(ws: &Path, sock: Option<&Path>, script: &str) -> RunReport {
    require_bwrap();
    let rt = Runtime::new().expect("runtime");
    let mut spec = host_spec(&rt, ws);
    if let Some(s) = sock {
        spec.proxy(s, DEFAULT_PROXY_PORT).expect("proxy option");
    }
    rt.run(
        &spec,
        &HostEnv::new(),
        &os(&["/bin/bash", "-c", script]),
        opts(),
    )
    .expect("sandbox run")
}

#[test]
fn proxy_forwards_http_from_inside_to_the_host_socket() {
    require("/usr/bin/curl");
    let ws = workspace();
    let dir = workspace();
    let (sock, accepted) = unix_server(dir.path(), http_echo);
    // The listener must be up before the command starts: its very first
    // act is to connect.
    let r = run_with_proxy(
        ws.path(),
        Some(&sock),
        "exec 3<>/dev/tcp/127.0.0.1/3128 && echo listener-up; exec 3>&-
         curl -sS --max-time 20 --proxy http://127.0.0.1:3128 http://example.invalid/hello?x=1",
    );
    assert_eq!(r.outcome, Outcome::Exited(0), "{}\n{}", out(&r), err(&r));
    let o = out(&r);
    assert!(o.starts_with("listener-up\n"), "{o}");
    assert!(
        o.contains("proxied: GET http://example.invalid/hello?x=1 HTTP/1.1"),
        "{o}\n{}",
        err(&r)
    );
    assert!(accepted.load(Ordering::SeqCst) >= 2);
}

#[test]
fn proxy_carries_large_data_and_half_closes_both_ways_concurrently() {
    require("/usr/bin/python3");
    let ws = workspace();
    let dir = workspace();
    let (sock, accepted) = unix_server(dir.path(), echo_after_eof);
    // 8 connections at once, 1 MiB each way, each half-closed by the
    // client; the server only answers after seeing that EOF.
    let script = r#"exec /usr/bin/python3 - <<'PY'
import socket, threading, hashlib
res = {}
def one(i):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=30)
    data = hashlib.sha256(str(i).encode()).digest() * 32768
    s.sendall(data)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(65536)
        if not b:
            break
        got += b
    res[i] = (got == data)
ts = [threading.Thread(target=one, args=(i,)) for i in range(8)]
[t.start() for t in ts]
[t.join() for t in ts]
print("ok" if len(res) == 8 and all(res.values()) else "bad %r" % res)
PY"#;
    let r = run_with_proxy(ws.path(), Some(&sock), script);
    assert_eq!(r.outcome, Outcome::Exited(0), "{}\n{}", out(&r), err(&r));
    assert_eq!(out(&r).trim(), "ok", "{}", err(&r));
    assert_eq!(accepted.load(Ordering::SeqCst), 8);
}

#[test]
fn proxy_forwards_at_most_64_connections_at_once_and_queues_the_rest() {
    require("/usr/bin/python3");
    let ws = workspace();
    let dir = workspace();
    let path = dir.path().join("proxy.sock");
    let l = UnixListener::bind(&path).unwrap();
    let now = Arc::new(AtomicUsize::new(0));
    let max = Arc::new(AtomicUsize::new(0));
    let (n2, m2) = (now.clone(), max.clone());
    std::thread::spawn(move || {
        for c in l.incoming().flatten() {
            let cur = n2.fetch_add(1, Ordering::SeqCst) + 1;
            m2.fetch_max(cur, Ordering::SeqCst);
            let n3 = n2.clone();
            std::thread::spawn(move || {
                let mut c = c;
                let mut data = Vec::new();
                let _ = c.read_to_end(&mut data);
                let _ = c.write_all(&data);
                // Counted out before the close that lets the forwarder
                // free the slot, so the count never runs ahead.
                n3.fetch_sub(1, Ordering::SeqCst);
                drop(c);
            });
        }
    });
    // 70 connections opened and held idle for a while, then each used.
    let script = r#"exec /usr/bin/python3 - <<'PY'
import socket, time
ss = [socket.create_connection(("127.0.0.1", 3128), timeout=30) for i in range(70)]
time.sleep(1.5)
ok = 0
for i, s in enumerate(ss):
    s.sendall(b"conn %d" % i)
    s.shutdown(socket.SHUT_WR)
    got = b""
    while True:
        b = s.recv(4096)
        if not b:
            break
        got += b
    s.close()
    ok += got == b"conn %d" % i
print(ok)
PY"#;
    let r = run_with_proxy(ws.path(), Some(&path), script);
    assert_eq!(r.outcome, Outcome::Exited(0), "{}\n{}", out(&r), err(&r));
    assert_eq!(out(&r).trim(), "70", "{}", err(&r));
    assert_eq!(
        max.load(Ordering::SeqCst),
        64,
        "at most 64 forwarded at once"
    );
}

#[test]
fn without_the_option_nothing_listens_on_3128() {
    let ws = workspace();
    let r = run_with_proxy(
        ws.path(),
        None,
        "if exec 3<>/dev/tcp/127.0.0.1/3128; then echo connected; else echo refused; fi 2>/dev/null
         test -e /run/fhsx/proxy.sock && echo socket-present; true",
    );
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    assert_eq!(out(&r).trim(), "refused");
}

#[test]
fn with_the_proxy_host_loopback_tcp_stays_unreachable() {
    let ws = workspace();
    let dir = workspace();
    let (sock, _) = unix_server(dir.path(), http_echo);
    let host = TcpListener::bind("127.0.0.1:0").unwrap();
    host.set_nonblocking(true).unwrap();
    let port = host.local_addr().unwrap().port();
    let r = run_with_proxy(
        ws.path(),
        Some(&sock),
        &format!(
            "if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo connected; else echo refused; fi 2>/dev/null"
        ),
    );
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    assert!(out(&r).starts_with("refused\n"), "{}", out(&r));
    assert!(
        host.accept().is_err(),
        "the host listener must not have seen a connection"
    );
}

#[test]
fn a_proxy_that_is_gone_fails_the_connection_not_the_run() {
    let ws = workspace();
    let dir = workspace();
    let path = dir.path().join("proxy.sock");
    // A socket with nobody accepting any more.
    drop(UnixListener::bind(&path).unwrap());
    let r = run_with_proxy(
        ws.path(),
        Some(&path),
        // Only reads: a write could race the close and end in SIGPIPE.
        "exec 3<>/dev/tcp/127.0.0.1/3128 || exit 9; cat <&3; echo eof",
    );
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    assert_eq!(out(&r).trim(), "eof");
    assert!(
        err(&r).contains("cannot reach the fetch proxy"),
        "{}",
        err(&r)
    );
}

#[test]
fn ro_bind_file_shows_the_ca_bundle_read_only() {
    let ws = workspace();
    let dir = workspace();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\nfhsx test\n").unwrap();
    require_bwrap();
    let rt = Runtime::new().expect("runtime");
    let mut spec = host_spec(&rt, ws.path());
    spec.ro_bind_file(&ca, PROXY_CA_PATH).unwrap();
    spec.set_env("SSL_CERT_FILE", PROXY_CA_PATH).unwrap();
    let r = rt
        .run(
            &spec,
            &HostEnv::new(),
            &os(&[
                "/bin/sh",
                "-c",
                "cat \"$SSL_CERT_FILE\"; (echo x >> /run/fhsx/ca.pem) 2>/dev/null && echo WROTE; rm -f /run/fhsx/ca.pem 2>/dev/null && echo REMOVED; true",
            ]),
            opts(),
        )
        .expect("sandbox run");
    assert_eq!(r.outcome, Outcome::Exited(0), "{}", err(&r));
    assert_eq!(out(&r), "-----BEGIN CERTIFICATE-----\nfhsx test\n");
    assert_eq!(
        std::fs::read_to_string(&ca).unwrap(),
        "-----BEGIN CERTIFICATE-----\nfhsx test\n"
    );
}

/// A minimal view (bash and its libraries, merged-usr symlinks) standing
/// in for the FUSE view the executor uses.
fn bash_view(tree: &Path) {
    let ldd = std::process::Command::new("ldd")
        .arg("/usr/bin/bash")
        .output()
        .expect("ldd (libc-bin) is needed to build the test view");
    let mut files: Vec<PathBuf> = vec!["/usr/bin/bash".into()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some(p) = line.split_whitespace().find(|w| w.starts_with('/')) {
            files.push(p.into());
        }
    }
    for f in files {
        let real = std::fs::canonicalize(&f).unwrap();
        let dest = tree.join(real.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&real, &dest).unwrap();
        let via = std::fs::canonicalize(f.parent().unwrap())
            .unwrap()
            .join(f.file_name().unwrap());
        if let Ok(t) = std::fs::read_link(&via) {
            let at = tree.join(via.strip_prefix("/").unwrap());
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            let _ = std::os::unix::fs::symlink(t, at);
        }
    }
    for top in ["bin", "lib", "lib64", "sbin"] {
        if let Ok(t) = std::fs::read_link(Path::new("/").join(top)) {
            std::os::unix::fs::symlink(t, tree.join(top)).unwrap();
        }
    }
}

/// What the executor does: a view root, the proxy, the CA bundle.
#[test]
fn view_root_reaches_the_proxy_and_reads_the_ca_bundle() {
    require_bwrap();
    let tree = tempfile::tempdir().unwrap();
    bash_view(tree.path());
    let scratch = tempfile::tempdir().unwrap();
    let dir = workspace();
    let (sock, _) = unix_server(dir.path(), http_echo);
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, "CA-LINE\n").unwrap();
    let rt = Runtime::new().unwrap();
    let mut spec = rt.view_spec(tree.path(), scratch.path()).unwrap();
    spec.proxy(&sock, DEFAULT_PROXY_PORT).unwrap();
    spec.ro_bind_file(&ca, PROXY_CA_PATH).unwrap();
    let script = "exec 3<>/dev/tcp/127.0.0.1/3128 || exit 9
        printf 'GET http://view.invalid/x HTTP/1.1\\r\\nHost: view.invalid\\r\\n\\r\\n' >&3
        while IFS= read -r l <&3 || [ -n \"$l\" ]; do echo \"$l\"; l=; done
        read -r c < /run/fhsx/ca.pem; echo \"ca=$c\"";
    let r = rt
        .run(
            &spec,
            &HostEnv::new(),
            &os(&["/bin/bash", "-c", script]),
            opts(),
        )
        .unwrap();
    assert_eq!(r.outcome, Outcome::Exited(0), "{}\n{}", out(&r), err(&r));
    let o = out(&r);
    assert!(o.starts_with("HTTP/1.1 200 OK\r\n"), "{o}");
    assert!(
        o.contains("proxied: GET http://view.invalid/x HTTP/1.1\nca=CA-LINE\n"),
        "{o}"
    );
}
