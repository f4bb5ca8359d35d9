//! Tests that need the proxy in its own process: SIGKILL mid-record, and the
//! resident memory of recording a 1 GiB body. The child is this same test
//! binary re-executed on `child_proxy_process` with `FHSX_TEST_CHILD_*` set.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use fetch_proxy::{Lock, Mode, ProxyConfig, RunningProxy};

/// Not a test on its own: the entry point of the child proxy process. Runs
/// a record-mode proxy until its stdin closes (or it is killed).
#[test]
fn child_proxy_process() {
    let (Ok(store), Ok(lock)) = (
        std::env::var("FHSX_TEST_CHILD_STORE"),
        std::env::var("FHSX_TEST_CHILD_LOCK"),
    ) else {
        return;
    };
    let store = castore::LocalStore::open(store).unwrap();
    let mut cfg = ProxyConfig::new(Mode::Record, lock.into(), store).unwrap();
    cfg.system_roots = false;
    let p = RunningProxy::start(
        cfg,
        fetch_proxy::Listen::Tcp("127.0.0.1:0".parse().unwrap()),
    )
    .unwrap();
    println!("ADDR {}", p.tcp_addr().unwrap());
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    p.shutdown().unwrap();
}

#[allow(clippy::zombie_processes)] // every caller waits on the child
fn spawn_child(store: &Path, lock: &Path) -> (Child, SocketAddr) {
    let exe = std::env::current_exe().unwrap();
    let mut child = Command::new(exe)
        .args([
            "--exact",
            "child_proxy_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env("FHSX_TEST_CHILD_STORE", store)
        .env("FHSX_TEST_CHILD_LOCK", lock)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    loop {
        let line = lines
            .next()
            .expect("child exited before listening")
            .unwrap();
        // libtest prints `test child_proxy_process ... ` before it.
        if let Some((_, a)) = line.split_once("ADDR ") {
            let addr = a.trim().parse().unwrap();
            // Keep draining, so the child never writes into a closed pipe.
            std::thread::spawn(move || lines.for_each(drop));
            return (child, addr);
        }
    }
}

fn staged_bytes(store: &Path) -> u64 {
    let mut total = 0;
    if let Ok(rd) = std::fs::read_dir(store.join("tmp")) {
        for txn in rd.flatten() {
            if let Ok(rd2) = std::fs::read_dir(txn.path()) {
                for f in rd2.flatten() {
                    total += f.metadata().map(|m| m.len()).unwrap_or(0);
                }
            }
        }
    }
    total
}

/// SIGKILL while a body is streaming into the store: the lock gains no
/// entry for it, no partial blob lands in the store, and the next opener of
/// the store sweeps the staging area.
#[test]
fn kill_mid_record_leaves_no_entry_and_no_partial_blob() {
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let (mut child, addr) = spawn_child(&h.store, &lock);
    let hello = format!("http://127.0.0.1:{}/hello", up.port());
    assert_eq!(raw_get(addr, &hello, "").status, 200);
    let blobs_before = h.blob_files();
    assert_eq!(blobs_before.len(), 1);
    let lock_before = std::fs::read(&lock).unwrap();

    let stall = format!("http://127.0.0.1:{}/stall", up.port());
    let client = std::thread::spawn(move || {
        let mut s = std::net::TcpStream::connect(addr).unwrap();
        use std::io::Write;
        let _ = write!(
            s,
            "GET {stall} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        );
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        buf
    });
    let t0 = Instant::now();
    while staged_bytes(&h.store) < 2 << 20 {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "body never started streaming into the store"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let got = client.join().unwrap();
    assert!(
        !String::from_utf8_lossy(&got).starts_with("HTTP/1.1 200"),
        "a partial body was served"
    );
    up.stop();

    assert_eq!(std::fs::read(&lock).unwrap(), lock_before, "lock changed");
    assert_eq!(Lock::load(&lock).unwrap().len(), 1);
    assert_eq!(
        h.blob_files(),
        blobs_before,
        "a partial blob reached the store"
    );
    castore::LocalStore::open(&h.store).unwrap();
    assert_eq!(staged_bytes(&h.store), 0, "staging not swept");
}

/// Recording a large body keeps the proxy's resident memory bounded:
/// 1 GiB (override with FHSX_TEST_BIG_MIB) under 64 MiB peak RSS.
#[test]
fn record_of_a_large_body_stays_under_64_mib_resident() {
    require("curl", "curl");
    let mib: u64 = std::env::var("FHSX_TEST_BIG_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let size = mib << 20;
    let h = Harness::new();
    let lock = h.path("fetch.lock");
    let mut up = Upstream::http(0);
    let (mut child, addr) = spawn_child(&h.store, &lock);
    let url = format!("http://127.0.0.1:{}/big/{size}", up.port());
    let o = Command::new("curl")
        .args([
            "-sS",
            "--noproxy",
            "",
            "-o",
            "/dev/null",
            "-w",
            "%{http_code} %{size_download}",
            "--proxy",
        ])
        .arg(format!("http://{addr}"))
        .arg(&url)
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout).to_string();
    assert_eq!(out, format!("200 {size}"));
    let hwm = vm_hwm_kib(child.id());
    drop(child.stdin.take());
    assert!(child.wait().unwrap().success());
    up.stop();
    eprintln!("peak RSS of the recording proxy for {mib} MiB: {} KiB", hwm);
    assert!(hwm > 0, "could not read VmHWM");
    assert!(hwm < 64 * 1024, "peak RSS {hwm} KiB >= 64 MiB");
    let l = Lock::load(&lock).unwrap();
    assert_eq!(l.entries().next().map(|e| e.size), Some(size));
    let store = castore::LocalStore::open(&h.store).unwrap();
    assert!(l.verify(&store).is_empty());
}
