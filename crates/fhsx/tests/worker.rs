//! `fhsx worker` and `fhsx build --remote`: real worker processes on
//! loopback, real builds (busybox-static and the hello toolchain, real
//! Debian packages fetched by `fhsx toolchain apt`, tests/support).

mod support;

use std::collections::HashSet;
use std::fs;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use castore::store::{DirectoryStore, LocalStore, ObjectKind};
use castore::{Digest, Node};
use support::{busybox, fhsx, import, inputs, mirror, text};
use worker::client::{Ask, Client};
use worker::Endpoint;

fn sh_action(dir: &Path, name: &str, closure: &str, script: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(
        &p,
        format!(
            "[inputs]\nclosure = [\"{closure}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {:?}]\ntimeout = \"300s\"\n",
            format!("busybox mkdir -p $out; {script}")
        ),
    )
    .unwrap();
    p
}

/// A temporary directory, a client store in it holding busybox-static,
/// and where a worker's store goes: (the directory, the client store, the
/// worker store, busybox's closure).
fn busybox_stores() -> (tempfile::TempDir, PathBuf, PathBuf, String) {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("client-store");
    let ws = t.path().join("worker-store");
    let bb = busybox(&cs);
    (t, cs, ws, bb)
}

/// A worker process; killed (SIGKILL) when dropped if still running.
struct Worker {
    child: Child,
    addr: String,
    store: PathBuf,
}

impl Worker {
    fn start(store: &Path, tmp: &Path, jobs: usize, extra: &[&str]) -> Worker {
        let jobs = jobs.to_string();
        let mut args = vec!["--jobs", &jobs];
        args.extend_from_slice(extra);
        // Nothing parked, so a test can tell what a build left mounted;
        // the pool's own test asks for one.
        if !extra.contains(&"--scratch-pool") {
            args.extend(["--scratch-pool", "0"]);
        }
        let (child, addr) = support::spawn_worker(store, tmp, &args, Stdio::inherit());
        Worker {
            child,
            addr,
            store: store.to_path_buf(),
        }
    }

    fn client(&self) -> Client {
        self.client_with(b"")
    }

    fn client_with(&self, token: &[u8]) -> Client {
        Client::connect(&Endpoint::parse(&self.addr), token, &[]).unwrap()
    }

    fn signal(&self, sig: i32) {
        // Our own child, by its pid.
        unsafe { libc::kill(self.child.id() as i32, sig) };
    }

    /// Poll the worker's stats until `f` holds.
    fn wait_for(&self, what: &str, f: impl Fn(&worker::client::Stats) -> bool) {
        let c = self.client();
        let end = Instant::now() + Duration::from_secs(60);
        loop {
            let s = c.stats().unwrap();
            if f(&s) {
                return;
            }
            assert!(Instant::now() < end, "timed out waiting for {what}: {s:?}");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn remote(client_store: &Path, w: &Worker, action: &Path, json: bool) -> Command {
    let mut c = fhsx(client_store);
    if json {
        c.arg("--json");
    }
    c.args(["build", "--remote", &w.addr]).arg(action);
    c
}

/// Every directory and blob digest of the trees at `roots`.
fn tree_objects(store: &Path, roots: &[Digest]) -> (HashSet<Digest>, HashSet<Digest>) {
    let s = LocalStore::open(store).unwrap();
    let (mut dirs, mut blobs) = (HashSet::new(), HashSet::new());
    let mut stack = roots.to_vec();
    while let Some(d) = stack.pop() {
        if !dirs.insert(d) {
            continue;
        }
        for (_, n) in s.get_directory(&d).unwrap().entries() {
            match n {
                Node::Directory { digest, .. } => stack.push(*digest),
                Node::File { digest, .. } => {
                    blobs.insert(*digest);
                }
                Node::Symlink { .. } => {}
            }
        }
    }
    (dirs, blobs)
}

fn store_verifies(store: &Path) {
    let o = fhsx(store).args(["store", "verify"]).output().unwrap();
    assert!(o.status.success(), "store verify: {}", text(&o));
}

fn no_mounts_under(dir: &Path) {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let d = dir.to_string_lossy();
    assert!(
        !mounts.contains(d.as_ref()),
        "a mount is left under {d}:\n{mounts}"
    );
}

fn running(marker: &str) -> bool {
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    String::from_utf8_lossy(&ps.stdout)
        .lines()
        .any(|l| l.contains(marker))
}

fn wait_gone(marker: &str) {
    let end = Instant::now() + Duration::from_secs(30);
    while running(marker) {
        assert!(Instant::now() < end, "{marker:?} still running");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A remote build gives the local build's output and read set; the record
/// verifies in the client's store; a second remote build uploads nothing;
/// the log streams to the caller.
#[test]
fn remote_busybox_build_matches_local() {
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(
        t.path(),
        "a.toml",
        &bb,
        "echo streamed-line; busybox ls /usr/bin > $out/ls; echo done > $out/f",
    );
    let w = Worker::start(&ws, t.path(), 2, &[]);
    let o = remote(&cs, &w, &action, true).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(r["remote"]["uploaded"]["blobs"].as_u64().unwrap() > 0);
    let local = fhsx(&cs)
        .args(["--json", "build"])
        .arg(&action)
        .output()
        .unwrap();
    assert!(local.status.success(), "{}", text(&local));
    let l: serde_json::Value = serde_json::from_slice(&local.stdout).unwrap();
    assert_eq!(r["outputs"], l["outputs"]);
    assert_eq!(r["read_set"], l["read_set"]);
    assert_eq!(r["action"], l["action"]);
    assert_ne!(r["record"], l["record"], "signed by two different keys");
    // The downloaded record verifies locally (signature and every digest).
    let v = fhsx(&cs)
        .args(["record", "verify", r["record"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", text(&v));
    // Built again: a hit in the client's own cache (the worker signed it),
    // nothing sent.
    let o2 = remote(&cs, &w, &action, true).output().unwrap();
    assert!(o2.status.success(), "{}", text(&o2));
    let again: serde_json::Value = serde_json::from_slice(&o2.stdout).unwrap();
    assert_eq!(again["cached"], true, "{again}");
    assert_eq!(again["record"], r["record"]);
    // --rebuild: it runs on the worker again, the log streams live to
    // stderr, and nothing is uploaded twice.
    let o2 = remote(&cs, &w, &action, false)
        .arg("--rebuild")
        .output()
        .unwrap();
    assert!(o2.status.success(), "{}", text(&o2));
    let out = text(&o2);
    assert!(out.contains("streamed-line"), "{out}");
    assert!(
        out.contains("uploaded 0 blobs (0 bytes), 0 directories"),
        "{out}"
    );
    // --trust: the worker's key passes, another is refused (exit 3).
    let key = r["remote"]["worker_key"].as_str().unwrap();
    let ok = fhsx(&cs)
        .args(["build", "--remote", &w.addr, "--trust", key])
        .arg(&action)
        .output()
        .unwrap();
    assert!(ok.status.success(), "{}", text(&ok));
    let other = format!("ed25519:{}", "11".repeat(32));
    let bad = fhsx(&cs)
        .args(["build", "--remote", &w.addr, "--trust", &other])
        .arg(&action)
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(3), "{}", text(&bad));
    assert!(text(&bad).contains("not in --trust"), "{}", text(&bad));
    store_verifies(&ws);
    store_verifies(&cs);

    // The round trip only asks that what a record names is in the
    // client's store (its downloads were hashed as they came, and the
    // view is not re-hashed per action); `record verify` is the audit
    // that re-hashes, and it finds an output damaged after the fact.
    let out: Digest = r["outputs"]["out"].as_str().unwrap().parse().unwrap();
    let f = Digest::of(b"done\n");
    assert!(tree_objects(&cs, &[out]).1.contains(&f));
    let path = LocalStore::open(&cs)
        .unwrap()
        .object_path(castore::store::ObjectKind::Blob, &f);
    let mut perm = fs::metadata(&path).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o644);
    fs::set_permissions(&path, perm).unwrap();
    fs::write(&path, b"DONE\n").unwrap();
    let v = fhsx(&cs)
        .args(["record", "verify", r["record"].as_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(v.status.code(), Some(3), "{}", text(&v));
    assert!(
        text(&v).contains("corrupt") && text(&v).contains(&f.to_string()),
        "{}",
        text(&v)
    );
}

/// The hello example, remote and local: same output, same read set.
#[test]
fn remote_hello_build_matches_local() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("client-store");
    let ws = t.path().join("worker-store");
    let mut files: Vec<_> = fs::read_dir(inputs().join("debs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let o = fhsx(&cs)
        .args(["--json", "store", "import"])
        .args(&files)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let tc: Vec<String> = v
        .as_array()
        .unwrap()
        .iter()
        .map(|e| format!("\"{}\"", e["root"].as_str().unwrap()))
        .collect();
    let src = import(&cs, &inputs().join("src/hello_2.10.orig.tar.gz"));
    let action = t.path().join("hello.toml");
    fs::write(
        &action,
        format!(
            r#"[inputs]
toolchain = [{}]
source = "{src}"
[run]
command = ["/bin/sh", "-c", "cd hello-2.10 && ./configure --prefix=/usr && make -j2 && make install DESTDIR=$out"]
workdir = "/build/src"
timeout = "15m"
"#,
            tc.join(", ")
        ),
    )
    .unwrap();
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let o = remote(&cs, &w, &action, true).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let local = fhsx(&cs)
        .args(["--json", "build"])
        .arg(&action)
        .output()
        .unwrap();
    assert!(local.status.success(), "{}", text(&local));
    let l: serde_json::Value = serde_json::from_slice(&local.stdout).unwrap();
    assert_eq!(r["outputs"], l["outputs"], "remote and local hello differ");
    assert_eq!(r["read_set"], l["read_set"]);
    // The output tree was downloaded: it exports and runs.
    let out = t.path().join("out");
    let e = fhsx(&cs)
        .args(["store", "export", r["outputs"]["out"].as_str().unwrap()])
        .arg(&out)
        .output()
        .unwrap();
    assert!(e.status.success(), "{}", text(&e));
    let hello = Command::new(out.join("usr/bin/hello")).output().unwrap();
    assert_eq!(hello.stdout, b"Hello, world!\n");
}

/// (start, end) uptimes a timing action printed to its log.
fn intervals(log: &str) -> Vec<(f64, f64)> {
    log.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("INTERVAL ")?;
            let mut it = rest.split_whitespace();
            Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
        })
        .collect()
}

fn max_overlap(iv: &[(f64, f64)]) -> usize {
    iv.iter()
        .map(|(s, _)| iv.iter().filter(|(a, b)| a <= s && s < b).count())
        .max()
        .unwrap_or(0)
}

/// Two workers (2 slots each), three clients each sending three actions at
/// once: all complete, no worker runs more than 2 at a time (seen both by
/// the builds' own clocks and the worker's counter), and each worker
/// receives the shared closure exactly once.
#[test]
fn two_workers_many_clients_stay_within_jobs_and_upload_once() {
    let t = tempfile::tempdir().unwrap();
    let bb = busybox(&t.path().join("seed"));
    let (dirs, blobs) = tree_objects(&t.path().join("seed"), &[bb.parse().unwrap()]);
    let workers: Vec<Worker> = (0..2)
        .map(|i| Worker::start(&t.path().join(format!("w{i}")), t.path(), 2, &[]))
        .collect();
    let mut clients = Vec::new();
    for (wi, w) in workers.iter().enumerate() {
        for ci in 0..3 {
            let cs = t.path().join(format!("c{wi}-{ci}"));
            fs::create_dir_all(&cs).unwrap();
            busybox(&cs);
            for ai in 0..3 {
                // Distinct actions (the script differs), each ~1 s long.
                let a = sh_action(
                    &cs,
                    &format!("a{ai}.toml"),
                    &bb,
                    &format!(
                        "s=$(busybox cut -d' ' -f1 /proc/uptime); busybox sleep 1; e=$(busybox cut -d' ' -f1 /proc/uptime); echo \"INTERVAL $s $e\"; echo {wi}-{ci}-{ai} > $out/id"
                    ),
                );
                let child = remote(&cs, w, &a, false)
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .unwrap();
                clients.push((wi, child));
            }
        }
    }
    let mut per_worker: Vec<Vec<(f64, f64)>> = vec![Vec::new(), Vec::new()];
    for (wi, c) in clients {
        let o = c.wait_with_output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let iv = intervals(&text(&o));
        assert_eq!(iv.len(), 1, "{}", text(&o));
        per_worker[wi].extend(iv);
    }
    for (wi, w) in workers.iter().enumerate() {
        let iv = &per_worker[wi];
        assert_eq!(iv.len(), 9);
        let overlap = max_overlap(iv);
        assert!(
            overlap <= 2,
            "worker {wi} ran {overlap} builds at once: {iv:?}"
        );
        let s = w.client().stats().unwrap();
        assert_eq!(s.builds_started, 9, "{s:?}");
        assert!(s.max_concurrent_builds <= 2, "{s:?}");
        assert_eq!(
            s.blobs_written,
            blobs.len() as u64,
            "worker {wi} stored the closure's blobs more than once: {s:?}"
        );
        assert_eq!(s.directories_written, dirs.len() as u64, "{s:?}");
        assert_eq!(s.blob_bytes_written, s.bytes_received, "{s:?}");
        store_verifies(&w.store);
    }
}

/// `kill -9` of a worker mid-build: the client fails saying the worker went
/// away; a restarted worker detaches the dead run's view, its store
/// verifies clean, no process of the build is left.
#[test]
fn killed_worker_fails_the_client_and_restarts_clean() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("cs");
    let ws = t.path().join("ws");
    let bb = busybox(&cs);
    let marker = "busybox sleep 311";
    let a = sh_action(t.path(), "a.toml", &bb, &format!("echo started; {marker}"));
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let client = remote(&cs, &w, &a, false)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    w.wait_for("the build to start", |s| s.builds_running == 1);
    let end = Instant::now() + Duration::from_secs(30);
    while !running(marker) {
        assert!(Instant::now() < end, "the build never started its sleep");
        std::thread::sleep(Duration::from_millis(50));
    }
    w.signal(libc::SIGKILL);
    let o = client.wait_with_output().unwrap();
    assert!(!o.status.success());
    let msg = text(&o);
    assert!(
        msg.contains("worker went away") && msg.contains(&w.addr),
        "unclear client error: {msg}"
    );
    drop(w);
    wait_gone(marker);
    let w2 = Worker::start(&ws, t.path(), 1, &[]);
    no_mounts_under(t.path());
    store_verifies(&ws);
    // And it serves: the same store, a fresh build.
    let ok = sh_action(t.path(), "ok.toml", &bb, "echo fine > $out/f");
    let o = remote(&cs, &w2, &ok, true).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

fn unsynced_logs(store: &Path) -> Vec<String> {
    fs::read_dir(store.join("unsynced"))
        .map(|rd| {
            rd.flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.starts_with("log-"))
                .collect()
        })
        .unwrap_or_default()
}

/// An upload is answered before it is durable and made durable once
/// uploads pause: the worker's unsynced log goes away on its own. A worker
/// killed before that leaves its log; the next open of the store re-hashes
/// what it names, keeps what is intact, drops the log, and the store
/// verifies. Nothing the client sent has to be sent again.
#[test]
fn uploads_answered_before_durable_are_synced_when_quiet_and_recovered_after_a_kill() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("cs");
    let bb = busybox(&cs);
    let a = sh_action(t.path(), "a.toml", &bb, "echo fine > $out/f");

    // Left alone, the worker syncs what it received and drops its log.
    let ws = t.path().join("ws");
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let o = remote(&cs, &w, &a, true).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let end = Instant::now() + Duration::from_secs(30);
    while !unsynced_logs(&ws).is_empty() {
        assert!(
            Instant::now() < end,
            "uploads never made durable: {:?}",
            unsynced_logs(&ws)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(w);

    // Killed right after an upload: its log outlives it, and recovery
    // keeps every intact object.
    let ws2 = t.path().join("ws2");
    let w = Worker::start(&ws2, t.path(), 1, &[]);
    let o = remote(&cs, &w, &a, true).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let uploaded: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(uploaded["remote"]["uploaded"]["blobs"].as_u64().unwrap() > 0);
    assert!(
        uploaded["remote"]["upload_seconds"].as_f64().unwrap() > 0.0,
        "{uploaded}"
    );
    w.signal(libc::SIGKILL);
    drop(w);
    let left = unsynced_logs(&ws2);
    eprintln!("unsynced logs the killed worker left: {left:?}");
    store_verifies(&ws2);
    assert!(
        unsynced_logs(&ws2).is_empty(),
        "the dead worker's log {left:?} outlived an open of the store"
    );
    let w = Worker::start(&ws2, t.path(), 1, &[]);
    let o = remote(&cs, &w, &a, false)
        .arg("--rebuild")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("uploaded 0 blobs (0 bytes), 0 directories"),
        "recovery dropped intact uploads (log was {left:?}): {}",
        text(&o)
    );
}

/// A client that goes away cancels its build: the sandbox is torn down,
/// the view unmounted, the slot freed.
#[test]
fn client_disconnect_cancels_its_build() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("cs");
    let ws = t.path().join("ws");
    let bb = busybox(&cs);
    let marker = "busybox sleep 312";
    let a = sh_action(
        t.path(),
        "a.toml",
        &bb,
        &format!("trap '' TERM; {marker} & {marker}"),
    );
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let mut client = remote(&cs, &w, &a, false)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    w.wait_for("the build to start", |s| s.builds_running == 1);
    let end = Instant::now() + Duration::from_secs(30);
    while !running(marker) {
        assert!(Instant::now() < end, "the build never started its sleep");
        std::thread::sleep(Duration::from_millis(50));
    }
    client.kill().unwrap();
    client.wait().unwrap();
    w.wait_for("the build to be cancelled", |s| s.builds_running == 0);
    wait_gone(marker);
    no_mounts_under(t.path());
    let left: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("fhsx-build-") || n.starts_with("fhsx-remote-")
        })
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "scratch left behind: {left:?}");
    // The slot is free again.
    let ok = sh_action(t.path(), "ok.toml", &bb, "echo fine > $out/f");
    let o = remote(&cs, &w, &ok, true).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// SIGTERM: no new connections, a short build finishes, a long one is
/// cancelled at the deadline, the worker exits 0 and leaves nothing.
#[test]
fn sigterm_drains_then_cancels() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("cs");
    let ws = t.path().join("ws");
    let bb = busybox(&cs);
    let marker = "busybox sleep 313";
    let short = sh_action(t.path(), "s.toml", &bb, "busybox sleep 2; echo ok > $out/f");
    let long = sh_action(t.path(), "l.toml", &bb, marker);
    let mut w = Worker::start(&ws, t.path(), 2, &["--shutdown-grace", "4s"]);
    let spawn = |a: &Path| {
        remote(&cs, &w, a, false)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap()
    };
    let cs_short = spawn(&short);
    let cs_long = spawn(&long);
    w.wait_for("both builds to start", |s| s.builds_running == 2);
    w.signal(libc::SIGTERM);
    // It stops accepting at once, while both builds still run.
    let end = Instant::now() + Duration::from_secs(2);
    while std::net::TcpStream::connect(&w.addr).is_ok() {
        assert!(Instant::now() < end, "still accepting after SIGTERM");
        std::thread::sleep(Duration::from_millis(20));
    }
    let o = cs_short.wait_with_output().unwrap();
    assert!(
        o.status.success(),
        "the short build should finish: {}",
        text(&o)
    );
    let o = cs_long.wait_with_output().unwrap();
    assert!(!o.status.success());
    assert!(text(&o).contains("cancelled"), "{}", text(&o));
    let status = w.child.wait().unwrap();
    assert!(status.success(), "worker exit: {status:?}");
    wait_gone(marker);
    no_mounts_under(t.path());
    store_verifies(&ws);
}

/// The worker ends the connection (after at most an Abort message).
fn closed(s: &mut impl Read, what: &str) {
    let mut rest = Vec::new();
    assert!(
        s.read_to_end(&mut rest).is_ok(),
        "{what}: the connection stayed open"
    );
}

fn err<T>(r: Result<T, worker::Error>) -> String {
    match r {
        Ok(_) => panic!("accepted"),
        Err(e) => castore::Chain(&e).to_string(),
    }
}

/// A blob the client's own store has lost, found as the upload sends it
/// (in a batch, or streamed): the build fails as a local store error
/// (exit 2) naming it, where it was a failed call to the worker (exit 1,
/// "talking to the worker"), and the worker serves on.
#[test]
fn an_upload_missing_a_local_blob_fails_naming_it_and_the_worker_serves_on() {
    for streamed in [false, true] {
        let (t, cs, ws, bb) = busybox_stores();
        let action = sh_action(t.path(), "a.toml", &bb, "echo done > $out/f");
        let store = LocalStore::open(&cs).unwrap();
        let (lost, _) = files_under(&store, bb.parse().unwrap())
            .into_iter()
            .find(|(_, size)| (*size > worker::BATCH_BYTES as u64) == streamed)
            .expect("the busybox tree has small files and a big one");
        fs::remove_file(store.object_path(ObjectKind::Blob, &lost)).unwrap();
        let w = Worker::start(&ws, t.path(), 1, &[]);
        let o = remote(&cs, &w, &action, false).output().unwrap();
        let out = text(&o);
        assert_eq!(o.status.code(), Some(2), "streamed: {streamed}: {out}");
        assert!(
            out.contains(&lost.to_string()) && out.contains("not in the store"),
            "streamed: {streamed}: {out}"
        );
        assert!(w.client().stats().is_ok(), "the worker stopped serving");
    }
}

/// Every file of the tree at `root` in `store`: its digest and size.
fn files_under(store: &LocalStore, root: Digest) -> Vec<(Digest, u64)> {
    let mut files = Vec::new();
    let mut todo = vec![root];
    while let Some(d) = todo.pop() {
        for (_, node) in store.get_directory(&d).unwrap().entries() {
            match node {
                Node::Directory { digest, .. } => todo.push(*digest),
                Node::File { digest, size, .. } => files.push((*digest, *size)),
                Node::Symlink { .. } => {}
            }
        }
    }
    files
}

/// A directory the client's own store has lost is found while the upload
/// is already sending: the build fails as a local store error (exit 2)
/// naming it, not as a broken connection, and the worker serves on.
#[test]
fn an_upload_missing_a_local_directory_fails_naming_it_and_the_worker_serves_on() {
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(t.path(), "a.toml", &bb, "echo done > $out/f");
    let root: Digest = bb.parse().unwrap();
    let store = LocalStore::open(&cs).unwrap();
    let lost = store
        .get_directory(&root)
        .unwrap()
        .entries()
        .find_map(|(_, n)| match n {
            Node::Directory { digest, .. } => Some(*digest),
            _ => None,
        })
        .expect("the busybox tree has a subdirectory");
    fs::remove_file(store.object_path(ObjectKind::Directory, &lost)).unwrap();
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let o = remote(&cs, &w, &action, false).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains(&lost.to_string()) && text(&o).contains("not in the store"),
        "{}",
        text(&o)
    );
    assert!(w.client().stats().is_ok(), "the worker stopped serving");
}

/// Every malformed input is refused with a clear error, the store keeps
/// nothing of it, and the worker keeps serving.
#[test]
fn malformed_input_is_refused_and_the_worker_keeps_serving() {
    let t = tempfile::tempdir().unwrap();
    let ws = t.path().join("ws");
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let c = w.client();
    let data = b"some bytes".as_slice();
    let right = Digest::of(data);
    let wrong = Digest::of(b"other bytes");

    // A blob whose bytes don't match its digest: batched and streamed.
    let e = err(c.put_blobs_raw(&[(wrong.as_bytes(), data)]));
    assert!(
        e.contains("refused") && e.contains(&right.to_string()),
        "{e}"
    );
    let e = err(c.put_blob_raw(wrong.as_bytes(), data.len() as u64, &[data]));
    assert!(e.contains("hash to"), "{e}");
    // Fewer and more bytes than announced.
    let e = err(c.put_blob_raw(right.as_bytes(), 100, &[data]));
    assert!(e.contains("announced"), "{e}");
    let e = err(c.put_blob_raw(right.as_bytes(), 3, &[data]));
    assert!(e.contains("announced"), "{e}");
    // A digest that is not 32 bytes.
    let e = err(c.put_blobs_raw(&[(b"short".as_slice(), data)]));
    assert!(e.contains("32 bytes"), "{e}");
    let e = err(c.find_missing_raw_digest(b"short"));
    assert!(e.contains("32 bytes"), "{e}");
    assert_eq!(c.find_missing(&[right, wrong], &[]).unwrap().0.len(), 2);

    // Directories: garbage, non-canonical, missing children, wrong sizes.
    let e = err(c.put_directory_raw(b"\xff\xff\xff"));
    assert!(e.contains("invalid directory"), "{e}");
    let mut d = castore::Directory::new();
    d.insert(
        castore::Name::new("f").unwrap(),
        Node::File {
            digest: right,
            size: data.len() as u64,
            executable: false,
        },
    )
    .unwrap();
    let e = err(c.put_directory_raw(&d.encode()));
    assert!(
        e.contains("does not have") && e.contains(&right.to_string()),
        "{e}"
    );
    let mut nc = d.encode();
    nc.extend_from_slice(&[0x20, 0x00]); // an explicit default: not canonical
    let e = err(c.put_directory_raw(&nc));
    assert!(e.contains("invalid directory"), "{e}");
    let mut parent = castore::Directory::new();
    parent
        .insert(
            castore::Name::new("sub").unwrap(),
            Node::Directory {
                digest: d.digest(),
                size: 1,
            },
        )
        .unwrap();
    let e = err(c.put_directory_raw(&parent.encode()));
    assert!(
        e.contains("does not have") && e.contains(&d.digest().to_string()),
        "{e}"
    );
    // With the blob and child present, a lying size is still refused.
    assert!(c
        .put_blob_raw(right.as_bytes(), data.len() as u64, &[data])
        .unwrap());
    let mut liar = castore::Directory::new();
    liar.insert(
        castore::Name::new("f").unwrap(),
        Node::File {
            digest: right,
            size: 999,
            executable: false,
        },
    )
    .unwrap();
    let e = err(c.put_directory_raw(&liar.encode()));
    assert!(e.contains("999"), "{e}");
    // In one call, a parent before the child it names is refused (the
    // children are checked side by side, each only against those before
    // it), and a directory given twice is stored once.
    let e = err(c.put_directories_raw(&[&parent.encode(), &d.encode()]));
    assert!(
        e.contains("does not have") && e.contains(&d.digest().to_string()),
        "{e}"
    );
    c.put_directories_raw(&[&d.encode(), &d.encode(), &parent.encode()])
        .unwrap();
    assert_eq!(c.put_directory_raw(&d.encode()).unwrap(), d.digest());
    assert_eq!(
        c.put_directory_raw(&parent.encode()).unwrap(),
        parent.digest()
    );

    // Blobs asked for in one answer: given in order; refused when one is
    // missing, or when they come to more than a batch (the same blob twice
    // is counted twice: the answer would carry it twice).
    assert_eq!(
        c.get_blobs_raw(&[right, right]).unwrap(),
        vec![data.to_vec(), data.to_vec()]
    );
    let e = err(c.get_blobs_raw(&[right, wrong]));
    assert!(
        e.contains(&wrong.to_string()) && e.contains("not in the worker's store"),
        "{e}"
    );
    let half: Vec<u8> = (0..600 << 10).map(|i| (i % 241) as u8).collect();
    let big = Digest::of(&half);
    assert!(c
        .put_blob_raw(big.as_bytes(), half.len() as u64, &[&half])
        .unwrap());
    assert_eq!(c.get_blobs_raw(&[big]).unwrap(), vec![half.clone()]);
    let e = err(c.get_blobs_raw(&[big, big]));
    assert!(e.contains("ask for the bigger ones with getBlob"), "{e}");

    // Builds: an old client (protocol 0), a malformed action, record mode,
    // a missing input.
    let e = err(c.build_raw(0, "", b""));
    assert!(e.contains("protocol"), "{e}");
    let (class, msg) = c
        .build_raw(worker::PROTOCOL_VERSION, "[inputs\n", b"")
        .unwrap()
        .unwrap_err();
    assert_eq!(class, executor_core::ExitClass::Usage, "{msg}");
    let rec = format!(
        "[inputs]\nclosure = [\"{}\"]\n[run]\ncommand = [\"x\"]\n[network]\nmode = \"record\"\nlock = \"fetch.lock\"\n",
        parent.digest()
    );
    let (_, msg) = c
        .build_raw(worker::PROTOCOL_VERSION, &rec, b"")
        .unwrap()
        .unwrap_err();
    assert!(msg.contains("impure"), "{msg}");
    let missing = format!(
        "[inputs]\nclosure = [\"{}\"]\n[run]\ncommand = [\"x\"]\n",
        Digest::of(b"absent")
    );
    let (class, msg) = c
        .build_raw(worker::PROTOCOL_VERSION, &missing, b"")
        .unwrap()
        .unwrap_err();
    assert_eq!(class, executor_core::ExitClass::Usage, "{msg}");
    assert!(msg.contains("not in the store"), "{msg}");

    // TCP speaks TLS: bytes that are not a handshake end their connection.
    let mut s = std::net::TcpStream::connect(&w.addr).unwrap();
    s.write_all(&[0xff; 64]).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    closed(&mut s, "garbage instead of a TLS handshake not refused");

    // Oversized and malformed Cap'n Proto messages end only their own
    // connection: sent raw to the same store's worker on a UNIX socket
    // (plain Cap'n Proto, the same message reader and limits).
    let sock = t.path().join("raw.sock");
    let mut uw = Command::new(env!("CARGO_BIN_EXE_fhsx"))
        .arg("--store")
        .arg(&ws)
        .args(["worker", "--jobs", "1", "--scratch-pool", "0", "--unix"])
        .arg(&sock)
        .env("TMPDIR", {
            support::passable(t.path());
            t.path()
        })
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(uw.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let raw = || {
        let s = std::os::unix::net::UnixStream::connect(&sock).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s
    };
    let mut s = raw();
    // One segment of 2^28 words (2 GiB): above the reader's limit.
    s.write_all(&[0, 0, 0, 0, 0, 0, 0, 0x10]).unwrap();
    closed(&mut s, "oversized message not refused");
    let mut s = raw();
    s.write_all(&[0xff; 64]).unwrap();
    closed(&mut s, "garbage not refused");
    // A well-framed message that is no RPC message (a deep chain of
    // pointers; the nesting limit itself is unit-tested in the crate).
    let mut s = raw();
    let words = 200u32;
    let mut msg = Vec::new();
    msg.extend_from_slice(&0u32.to_le_bytes());
    msg.extend_from_slice(&words.to_le_bytes());
    for _ in 0..words {
        // A struct pointer with offset 0, 0 data words, 1 pointer: points
        // at the next word, which is the same shape again.
        msg.extend_from_slice(&[0, 0, 0, 0, 0, 0, 1, 0]);
    }
    s.write_all(&msg).unwrap();
    closed(&mut s, "a non-RPC message not refused");
    let uc = Client::connect(
        &Endpoint::parse(&format!("unix:{}", sock.display())),
        b"",
        &[],
    )
    .unwrap();
    assert_eq!(uc.get_blob(&right, 100).unwrap(), data);
    drop(uc);
    let _ = uw.kill();
    let _ = uw.wait();

    // Still serving, store consistent and without any refused object.
    let c2 = w.client();
    assert_eq!(c2.find_missing(&[wrong], &[]).unwrap().0, vec![wrong]);
    assert_eq!(c2.get_blob(&right, 100).unwrap(), data);
    store_verifies(&ws);
}

/// `--unix PATH` serves the same protocol; `--remote unix:PATH` reaches it.
#[test]
fn unix_socket_worker_serves_builds() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("cs");
    let bb = busybox(&cs);
    let (mut child, sock) = unix_worker(t.path());
    let a = sh_action(t.path(), "a.toml", &bb, "echo via-unix > $out/f");
    let o = fhsx(&cs)
        .args(["--json", "build", "--remote"])
        .arg(format!("unix:{}", sock.display()))
        .arg(&a)
        .output()
        .unwrap();
    // SIGTERM: an idle worker exits at once and removes its socket.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(status.success(), "{status:?}");
    assert!(!sock.exists(), "socket left behind");
}

/// A worker on a UNIX socket in `dir` (plain, no token), its store
/// `dir/ws`, once it listens; and the socket.
fn unix_worker(dir: &Path) -> (Child, PathBuf) {
    let sock = dir.join("w.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_fhsx"))
        .arg("--store")
        .arg(dir.join("ws"))
        .args(["worker", "--jobs", "1", "--scratch-pool", "0", "--unix"])
        .arg(&sock)
        .env("TMPDIR", {
            support::passable(dir);
            dir
        })
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert!(line.contains("unix:"), "{line}");
    (child, sock)
}

/// Record is refused remotely (impure, exit 2, before connecting
/// anything); a replay runs remotely with the lock and its bodies uploaded,
/// upstream gone, and gives the local replay's output.
#[test]
fn remote_replay_uploads_the_lock_and_its_bodies_and_record_is_refused() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("cs");
    let bb = busybox(&cs);
    let (port, stop) = mirror(b"upstream payload for the worker\n");
    let url = format!("http://127.0.0.1:{port}/pub/file-1.0.tar.gz");
    let action = |mode: &str| {
        let p = t.path().join(format!("{mode}.toml"));
        fs::write(
            &p,
            format!(
                "[inputs]\nclosure = [\"{bb}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox wget -O $out/file {url}\"]\ntimeout = \"60s\"\n[network]\nmode = \"{mode}\"\nlock = \"fetch.lock\"\n"
            ),
        )
        .unwrap();
        p
    };
    let rec = action("record");
    let w = Worker::start(&t.path().join("ws"), t.path(), 1, &[]);
    let o = remote(&cs, &w, &rec, true).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("impure"), "{}", text(&o));
    let o = fhsx(&cs)
        .args(["--json", "build", "--record"])
        .arg(&rec)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let rep = action("replay");
    let local = fhsx(&cs)
        .args(["--json", "build"])
        .arg(&rep)
        .output()
        .unwrap();
    assert!(local.status.success(), "{}", text(&local));
    let l: serde_json::Value = serde_json::from_slice(&local.stdout).unwrap();
    let o = remote(&cs, &w, &rep, true).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["outputs"], l["outputs"]);
    assert_eq!(r["action"], l["action"], "the lock digest differs remotely");
    let body = Digest::of(b"upstream payload for the worker\n");
    assert!(w.client().find_missing(&[body], &[]).unwrap().0.is_empty());
}

/// A worker with an access token serves only clients presenting it: no
/// token and a wrong one are refused before any capability but the version
/// is reachable (nothing uploaded, nothing built), the right one builds.
/// Without a token a worker will not listen beyond loopback, and a token
/// too short to resist guessing is refused.
#[test]
fn access_token_gates_the_worker() {
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(t.path(), "a.toml", &bb, "echo built > $out/f");
    let token = t.path().join("token");
    fs::write(&token, "c2VjcmV0LXRva2VuLWZvci10ZXN0cw==\n").unwrap();
    let wrong = t.path().join("wrong");
    fs::write(&wrong, "d3JvbmctdG9rZW4tZm9yLXRlc3Rz\n").unwrap();
    let w = Worker::start(&ws, t.path(), 1, &["--token-file", token.to_str().unwrap()]);

    for (what, extra) in [
        ("no token", vec![]),
        (
            "a wrong token",
            vec!["--token-file", wrong.to_str().unwrap()],
        ),
    ] {
        let o = fhsx(&cs)
            .args(["build", "--remote", &w.addr])
            .args(&extra)
            .arg(&action)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{what}: {}", text(&o));
        assert!(
            text(&o).contains("refused the access token"),
            "{what}: {}",
            text(&o)
        );
    }
    // The library client, too: the executor is out of reach.
    let e = err(Client::connect(
        &Endpoint::parse(&w.addr),
        b"not-the-token-at-all",
        &[],
    ));
    assert!(e.contains("refused the access token"), "{e}");
    let s = Client::connect(
        &Endpoint::parse(&w.addr),
        b"c2VjcmV0LXRva2VuLWZvci10ZXN0cw==",
        &[],
    )
    .unwrap()
    .stats()
    .unwrap();
    assert_eq!(
        (s.builds_started, s.blobs_written),
        (0, 0),
        "a refused client got something in"
    );

    let o = fhsx(&cs)
        .args(["build", "--remote", &w.addr, "--token-file"])
        .arg(&token)
        .arg(&action)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));

    // No token: loopback only.
    let o = fhsx(&ws)
        .args(["worker", "--listen", "0.0.0.0:0"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--token-file"), "{}", text(&o));
    // A short token.
    let short = t.path().join("short");
    fs::write(&short, "abc\n").unwrap();
    let o = fhsx(&ws)
        .args(["worker", "--token-file"])
        .arg(&short)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("at least 16"), "{}", text(&o));
}

/// A loopback relay in front of `to`: for each connection, `up` carries
/// the client's bytes to the worker and `down` the worker's to the
/// client, each on a thread of its own. Returns its address.
fn relay<U, D>(to: &str, up: U, down: D) -> String
where
    U: Fn(std::net::TcpStream, std::net::TcpStream) + Clone + Send + 'static,
    D: Fn(std::net::TcpStream, std::net::TcpStream) + Clone + Send + 'static,
{
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap().to_string();
    let to = to.to_owned();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(c) = c else { return };
            let Ok(w) = std::net::TcpStream::connect(&to) else {
                return;
            };
            let (c2, w2) = (c.try_clone().unwrap(), w.try_clone().unwrap());
            let (up, down) = (up.clone(), down.clone());
            std::thread::spawn(move || down(w2, c2));
            std::thread::spawn(move || up(c, w));
        }
    });
    addr
}

/// A loopback relay in front of `to`, keeping every byte the client sends.
fn recording_relay(to: &str) -> (String, std::sync::Arc<std::sync::Mutex<Vec<u8>>>) {
    use std::sync::{Arc, Mutex};
    let seen = Arc::new(Mutex::new(Vec::new()));
    let keep = seen.clone();
    let up = move |mut c: std::net::TcpStream, mut w: std::net::TcpStream| {
        let mut buf = [0u8; 65536];
        loop {
            match c.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    keep.lock().unwrap().extend_from_slice(&buf[..n]);
                    if w.write_all(&buf[..n]).is_err() {
                        break;
                    }
                }
            }
        }
        let _ = w.shutdown(std::net::Shutdown::Write);
    };
    let down = |mut w: std::net::TcpStream, mut c: std::net::TcpStream| {
        let _ = std::io::copy(&mut w, &mut c);
        let _ = c.shutdown(std::net::Shutdown::Write);
    };
    (relay(to, up, down), seen)
}

/// On TCP the token, the action and the inputs cross the wire inside TLS,
/// and a client pinning worker keys (`--trust`) finds out whom it reached
/// before it sends the token.
#[test]
fn tcp_is_tls_and_an_untrusted_worker_never_sees_the_token() {
    let (t, cs, ws, bb) = busybox_stores();
    let marker = "MARKER-in-the-action-7f3a";
    let action = sh_action(t.path(), "a.toml", &bb, &format!("echo {marker} > $out/f"));
    let token_text = "dG9rZW4tdGhhdC1tdXN0LW5vdC1sZWFr";
    let token = t.path().join("token");
    fs::write(&token, token_text).unwrap();
    let w = Worker::start(&ws, t.path(), 1, &["--token-file", token.to_str().unwrap()]);
    let (relay, seen) = recording_relay(&w.addr);

    let o = fhsx(&cs)
        .args(["build", "--remote", &relay, "--token-file"])
        .arg(&token)
        .arg(&action)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let wire = seen.lock().unwrap().clone();
    assert_eq!(
        wire.first(),
        Some(&0x16),
        "the client did not open with a TLS handshake"
    );
    for (what, needle) in [
        ("the token", token_text.as_bytes()),
        ("the action", marker.as_bytes()),
    ] {
        assert!(
            !wire.windows(needle.len()).any(|w| w == needle),
            "{what} crossed the wire in the clear"
        );
    }

    // Pinning another key: refused before the token leaves (exit 3).
    seen.lock().unwrap().clear();
    let other = format!("ed25519:{}", "11".repeat(32));
    let o = fhsx(&cs)
        .args([
            "build",
            "--remote",
            &relay,
            "--trust",
            &other,
            "--token-file",
        ])
        .arg(&token)
        .arg(&action)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("nothing was sent to it"), "{}", text(&o));
    let stats = w.client_with(token_text.as_bytes()).stats().unwrap();
    assert_eq!(
        stats.builds_started, 1,
        "the refused client built something"
    );
}

/// A remote build that floods its log, or probes past its read-set cap,
/// ends as a limit failure for that client, while the worker goes on
/// serving another client's build at the same time, and after.
#[test]
fn the_worker_stays_up_when_a_client_floods_its_log_or_read_set() {
    let t = tempfile::tempdir().unwrap();
    let (ca, cb) = (t.path().join("client-a"), t.path().join("client-b"));
    let ws = t.path().join("worker-store");
    let (bba, bbb) = (busybox(&ca), busybox(&cb));
    let flood = t.path().join("flood.toml");
    fs::write(
        &flood,
        format!("[inputs]\nclosure = [\"{bba}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir $out; while :; do echo flooding-the-log-flooding-the-log; done\"]\ntimeout = \"300s\"\n[limits]\nlog = 1048576\n"),
    )
    .unwrap();
    let probe = t.path().join("probe.toml");
    fs::write(
        &probe,
        format!("[inputs]\nclosure = [\"{bba}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir $out; i=0; while [ $i -lt 2000 ]; do busybox test -e /usr/absent-$i; i=$((i+1)); done\"]\ntimeout = \"300s\"\n[limits]\nreads = 500\n"),
    )
    .unwrap();
    let fine = sh_action(
        t.path(),
        "fine.toml",
        &bbb,
        "busybox sleep 1; echo fine > $out/f",
    );
    let w = Worker::start(&ws, t.path(), 2, &[]);
    for bad in [&flood, &probe] {
        let a = remote(&ca, &w, bad, true)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let b = remote(&cb, &w, &fine, true)
            .arg("--rebuild")
            .output()
            .unwrap();
        let a = a.wait_with_output().unwrap();
        assert!(
            b.status.success(),
            "the other client's build failed: {}",
            text(&b)
        );
        assert_eq!(a.status.code(), Some(1), "{}", text(&a));
        let v: serde_json::Value = serde_json::from_slice(&a.stdout).unwrap();
        let why = v["error"].as_str().unwrap_or_default();
        assert!(
            why.contains("[limits] log") || why.contains("[limits] reads"),
            "{v}"
        );
    }
    let again = remote(&cb, &w, &fine, false)
        .arg("--rebuild")
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "the worker stopped serving: {}",
        text(&again)
    );
}

/// Whether the worker's store holds every object of `dirs` and `blobs`.
fn holds_all(ws: &Path, dirs: &HashSet<Digest>, blobs: &HashSet<Digest>) -> bool {
    let s = LocalStore::open(ws).unwrap();
    dirs.iter()
        .all(|d| s.has(castore::store::ObjectKind::Directory, d))
        && blobs
            .iter()
            .all(|d| s.has(castore::store::ObjectKind::Blob, d))
}

fn gc(store: &Path) {
    let o = fhsx(store)
        .args(["store", "gc", "--no-roots-ok"])
        .output()
        .unwrap();
    assert!(o.status.success(), "store gc: {}", text(&o));
}

/// A gc on the worker between a client's upload and its build takes
/// nothing the client sent or was told is there (by `findMissing` or by a
/// claim): all are rooted until the client disconnects, and then a gc
/// takes them.
#[test]
fn uploads_and_what_clients_were_promised_survive_gc_until_they_disconnect() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("client-store");
    let ws = t.path().join("worker-store");
    let root: Digest = busybox(&cs).parse().unwrap();
    let (dirs, blobs) = tree_objects(&cs, &[root]);
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let client_store = LocalStore::open(&cs).unwrap();

    let uploader = w.client();
    let sent = uploader.upload(&client_store, &[root], &[]).unwrap();
    assert!(sent.blobs > 0, "nothing was uploaded: {sent:?}");
    gc(&ws);
    assert!(
        holds_all(&ws, &dirs, &blobs),
        "a gc took what a connected client had uploaded"
    );

    // A second client is told everything is there: it stays for it too.
    let told = w.client();
    let dv: Vec<Digest> = dirs.iter().copied().collect();
    let bv: Vec<Digest> = blobs.iter().copied().collect();
    let (mb, md) = told.find_missing(&bv, &dv).unwrap();
    assert!(mb.is_empty() && md.is_empty(), "missing {mb:?} {md:?}");
    // A third claims the blobs without asking findMissing about them: the
    // claim finds them there, sends nothing, and holds them for it.
    let claimer = w.client();
    let none = claimer.upload(&client_store, &[], &bv).unwrap();
    assert_eq!(none.blobs, 0, "sent blobs the worker has: {none:?}");
    // The uploader's roots go when the worker sees it disconnect.
    let holders = || fs::read_dir(ws.join("temproots")).unwrap().count();
    let with_both = holders();
    drop(uploader);
    let end = Instant::now() + Duration::from_secs(20);
    while holders() >= with_both {
        assert!(
            Instant::now() < end,
            "the uploader's roots stayed after it disconnected"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    gc(&ws);
    assert!(
        holds_all(&ws, &dirs, &blobs),
        "a gc took what a connected client was told the worker has"
    );

    // Once nobody holds the tree, gc takes it (the roots are not forever);
    // the blobs the claimer holds stay.
    drop(told);
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        gc(&ws);
        if !LocalStore::open(&ws)
            .unwrap()
            .has(castore::store::ObjectKind::Directory, &root)
        {
            break;
        }
        assert!(
            Instant::now() < end,
            "the uploads stayed rooted after both clients disconnected"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let store = LocalStore::open(&ws).unwrap();
    assert!(
        blobs
            .iter()
            .all(|b| store.has(castore::store::ObjectKind::Blob, b)),
        "a gc took blobs a connected client's claim found there"
    );
    drop(claimer);
}

/// The scratch file systems under `dir` that are still mounted (a worker's
/// parked ones, between builds).
fn scratch_mounts(dir: &Path) -> Vec<String> {
    let d = dir.to_string_lossy();
    fs::read_to_string("/proc/self/mountinfo")
        .unwrap()
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .filter(|m| m.starts_with(d.as_ref()) && m.ends_with("/build"))
        .map(str::to_owned)
        .collect()
}

/// With `--scratch-pool`, a build runs on the scratch file system the
/// build before it used, emptied — and sees nothing of that build. One
/// action litters its scratch (a hidden directory, one locked to mode
/// 000, a FIFO, a symlink, an xattr and a default ACL on `/build`, inode
/// flags new files inherit, mode 1777): the probe run after it on the
/// recycled scratch sees exactly what it saw on a fresh one (same output
/// digest: mode, size, links, flags, `/build`'s times, xattrs, free blocks
/// and inodes, entries, what a new file inherits and its inode number; the
/// probe looks before anything changes `/build`). One that grows `/build` past a
/// block cannot be made as new: its scratch is removed, not parked.
#[test]
fn a_recycled_scratch_shows_nothing_of_the_build_before() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "scratch file systems (and so their pool) need root: run the tests as root"
    );
    let t = tempfile::tempdir().unwrap();
    let (cs, ws) = (t.path().join("client"), t.path().join("worker"));
    let bb = busybox(&cs);
    let probe = support::scratch_probe(&cs, t.path());
    let w = Worker::start(&ws, t.path(), 1, &["--scratch-pool", "1"]);
    let action = |name: &str, mode: &str| {
        let p = t.path().join(format!("{name}.toml"));
        fs::write(
            &p,
            format!(
                "[inputs]\nclosure = [\"{bb}\", \"{probe}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"/usr/bin/scratch-probe {mode} > /build/home/state && busybox mkdir $out && busybox mv /build/home/state $out/state\"]\n"
            ),
        )
        .unwrap();
        p
    };
    let build = |a: &Path| {
        let o = remote(&cs, &w, a, true).arg("--rebuild").output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["outputs"]["out"].as_str().unwrap().to_owned()
    };
    let state = |out: &str| {
        let o = fhsx(&cs)
            .args(["store", "cat", out, "state"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let (probe_a, litter_a, grow_a) = (
        action("probe", "probe"),
        action("litter", "litter"),
        action("grow", "grow"),
    );

    let fresh = build(&probe_a);
    let parked = scratch_mounts(t.path());
    assert_eq!(
        parked.len(),
        1,
        "the probe's scratch was not parked: {parked:?}"
    );
    let littered = state(&build(&litter_a));
    assert!(
        !littered.contains("refused"),
        "a trace could not even be left, so this proves less: {littered}"
    );
    assert_eq!(
        scratch_mounts(t.path()),
        parked,
        "the littered scratch was not made as new"
    );
    let again = build(&probe_a);
    assert_eq!(
        scratch_mounts(t.path()),
        parked,
        "the probe did not run on the recycled scratch"
    );
    assert_eq!(
        again,
        fresh,
        "the recycled scratch differs from a fresh one:\nfresh:\n{}\nrecycled:\n{}",
        state(&fresh),
        state(&again)
    );

    build(&grow_a);
    assert!(
        scratch_mounts(t.path()).is_empty(),
        "a scratch whose /build outgrew its block was parked: {:?}",
        scratch_mounts(t.path())
    );
    assert_eq!(
        build(&probe_a),
        fresh,
        "a fresh scratch after the removed one differs"
    );

    // 80 MiB written to the device and deleted: the scratch looks as new,
    // but the host's sparse image keeps those blocks, so it is not parked.
    assert_eq!(scratch_mounts(t.path()).len(), 1);
    let spill = t.path().join("spill.toml");
    fs::write(
        &spill,
        format!(
            "[inputs]\nclosure = [\"{bb}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir $out && busybox dd if=/dev/zero of=/build/spill bs=1M count=80 && busybox sync && busybox rm /build/spill\"]\n"
        ),
    )
    .unwrap();
    build(&spill);
    assert!(
        scratch_mounts(t.path()).is_empty(),
        "a scratch that wrote 80 MiB to the host was parked: {:?}",
        scratch_mounts(t.path())
    );
    drop(w);
}

/// The worker's resident memory, in KiB.
fn resident_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or_else(|| panic!("no VmRSS in /proc/{pid}/status"))
}

fn threads_of(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Threads in /proc/{pid}/status"))
}

/// Whether the worker has closed `s` (end of file or reset), without waiting.
fn closed_by_peer(s: &std::net::TcpStream) -> bool {
    s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
    }
}

/// A peer that opens TCP connections and never starts TLS holds a slot —
/// and the TLS layer's read buffer — each until the handshake times out.
/// Beyond `MAX_CONNECTIONS` the worker closes new ones at once, so its
/// memory grows by no more than the cap's buffers (DESIGN: 512 KiB a
/// connection, 128 MiB at most), and it serves again once they are gone.
#[test]
fn silent_connections_beyond_the_cap_are_closed_and_memory_stays_bounded() {
    use worker::server::MAX_CONNECTIONS;
    let t = tempfile::tempdir().unwrap();
    let w = Worker::start(&t.path().join("ws"), t.path(), 1, &[]);
    // One connection held open through the flood: it takes one slot for
    // certain, where a client dropped here might still hold its slot or
    // not when the flood comes (in a loaded suite it did, and one more
    // was closed).
    let held = w.client();
    held.stats().unwrap();
    let before = resident_kib(w.child.id());
    let extra = 40;
    let flood: Vec<std::net::TcpStream> = (0..MAX_CONNECTIONS - 1 + extra)
        .map(|_| std::net::TcpStream::connect(&w.addr).unwrap())
        .collect();
    // Well inside the 10 s handshake timeout: only the refused ones close.
    let end = Instant::now() + Duration::from_secs(5);
    let mut closed = 0;
    while Instant::now() < end {
        std::thread::sleep(Duration::from_millis(200));
        closed = flood.iter().filter(|s| closed_by_peer(s)).count();
        if closed >= extra {
            break;
        }
    }
    std::thread::sleep(Duration::from_millis(300));
    closed = closed.max(flood.iter().filter(|s| closed_by_peer(s)).count());
    assert_eq!(
        closed, extra,
        "of {} silent connections beside one client the worker should close exactly those beyond its cap of {MAX_CONNECTIONS}",
        flood.len()
    );
    let grown = resident_kib(w.child.id()).saturating_sub(before);
    assert!(
        grown < 160 << 10,
        "the worker grew by {grown} KiB holding {MAX_CONNECTIONS} silent connections"
    );
    drop((flood, held));
    // Their slots come back as the worker sees them end.
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        match Client::connect(&Endpoint::parse(&w.addr), b"", &[]).and_then(|c| c.stats()) {
            Ok(_) => break,
            Err(e) => assert!(
                Instant::now() < end,
                "the worker stopped serving after the flood: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A loopback relay in front of `to` that passes everything the client
/// sends, but of what the worker sends only the first `pass` bytes; then
/// it stops reading, as a client that stalls would. Returns its address
/// and the count of bytes it passed to the client.
fn stalling_relay(to: &str, pass: u64) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
    use std::sync::atomic::{AtomicU64, Ordering};
    let passed = std::sync::Arc::new(AtomicU64::new(0));
    let count = passed.clone();
    let up = |mut c: std::net::TcpStream, mut w: std::net::TcpStream| {
        let _ = std::io::copy(&mut c, &mut w);
    };
    let down = move |mut w: std::net::TcpStream, mut c: std::net::TcpStream| {
        let mut buf = [0u8; 65536];
        loop {
            let room = pass.saturating_sub(count.load(Ordering::SeqCst));
            if room == 0 {
                // Reads no more. The connection stays open: `up` holds
                // its own handles until the client goes.
                break;
            }
            let n = match w.read(&mut buf[..room.min(65536) as usize]) {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if c.write_all(&buf[..n]).is_err() {
                break;
            }
            count.fetch_add(n as u64, Ordering::SeqCst);
        }
    };
    (relay(to, up, down), passed)
}

/// Clients that stop reading in the middle of downloading a 48 MiB output
/// cost the worker a few chunks each (under 4 MiB), not the blob: what it
/// sends waits for the client (capnp's flow control on the stream of
/// chunks, the TLS layer's 256 KiB of pending records), the blob is read
/// as it goes (a chunk ahead), and the worker serves other
/// clients meanwhile. When they go away mid-download, the worker serves
/// on (it died of SIGPIPE while `fhsx` reset it to its default for every
/// command).
#[test]
fn stalled_downloads_cost_the_worker_a_few_chunks_not_the_blob() {
    use std::sync::atomic::Ordering;
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(
        t.path(),
        "big.toml",
        &bb,
        "busybox dd if=/dev/zero of=$out/big bs=1048576 count=48 2>/dev/null",
    );
    // Stores holding the closure but not the output: one to warm the
    // worker's path for a download, one per stalled client, one for after.
    let copy = |name: &str| {
        let s = t.path().join(name);
        let o = Command::new("cp")
            .arg("-a")
            .arg(&cs)
            .arg(&s)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        s
    };
    let warm: Vec<PathBuf> = (0..3).map(|i| copy(&format!("warm-{i}"))).collect();
    let fresh = copy("fresh");
    let stalled_stores: Vec<PathBuf> = (0..3).map(|i| copy(&format!("stalled-{i}"))).collect();
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let o = remote(&cs, &w, &action, false).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // Three downloads at once before measuring, as after: each is read on
    // blocking threads, and a thread new to glibc's allocator may take a
    // fresh arena, whose first chunks stay resident once freed. Warmed by
    // one download, the stalled three grew the worker by ~4.8 MiB in most
    // runs and by 9.7-10.5 MiB in some.
    let warming: Vec<Child> = warm
        .iter()
        .map(|s| {
            remote(s, &w, &action, false)
                .stdout(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in warming {
        assert!(c.wait().unwrap().success(), "a warming download failed");
    }
    let before = resident_kib(w.child.id());

    // A handshake, the build's answer and about four chunks get through.
    let pass = 4 << 20;
    let mut stalled = Vec::new();
    for s in &stalled_stores {
        let (relay, passed) = stalling_relay(&w.addr, pass);
        let child = fhsx(s)
            .args(["build", "--remote", &relay])
            .arg(&action)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        stalled.push((child, passed));
    }
    let end = Instant::now() + Duration::from_secs(120);
    while stalled
        .iter()
        .any(|(_, passed)| passed.load(Ordering::SeqCst) < pass)
    {
        assert!(
            Instant::now() < end,
            "the downloads did not get going: {:?} bytes passed",
            stalled
                .iter()
                .map(|(_, p)| p.load(Ordering::SeqCst))
                .collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Long enough for the worker to fill every buffer it would. Measured
    // with a reader thread and a queue of four chunks: 4.8 MiB for the
    // three; with a queue of 1024 chunks, 111 MiB.
    std::thread::sleep(Duration::from_secs(2));
    let grown = resident_kib(w.child.id()).saturating_sub(before);
    assert!(
        grown < 3 * (4 << 10),
        "three stalled downloads of a 48 MiB blob grew the worker by {grown} KiB"
    );
    // Meanwhile another client is served.
    w.client().stats().unwrap();
    for (mut child, _) in stalled {
        let _ = child.kill();
        let _ = child.wait();
    }
    // And after: a fresh store downloads the whole output.
    let o = remote(&fresh, &w, &action, false).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// A client store at `cs` holding one small blob, and a file node naming it.
fn store_with_one_blob(cs: &Path) -> (LocalStore, Node) {
    use castore::store::BlobStore;
    let store = LocalStore::open(cs).unwrap();
    let blob = store.put_blob(b"one blob, named many times").unwrap();
    let file = Node::File {
        digest: blob,
        size: 26,
        executable: false,
    };
    (store, file)
}

/// A directory of `n` entries naming `file`, each name near the 255-byte
/// limit so that the directory is big (~260 bytes encoded an entry).
fn long_named(n: usize, tag: &str, file: &Node) -> castore::Directory {
    let long = "n".repeat(232);
    let mut d = castore::Directory::new();
    for j in 0..n {
        let name = format!("{j:06}-{tag}-{long}");
        d.insert(castore::Name::new(name.as_bytes()).unwrap(), file.clone())
            .unwrap();
    }
    d
}

/// Directories go to the worker in messages bounded by bytes, not by
/// count: a tree of 4,097 directories of ~18 KB each (~72 MB of
/// directories, past the 64 MiB one message may carry) uploads whole, and
/// the worker then holds every directory of it. Batched by count (4,096 a
/// message), the first message was refused and the upload failed.
#[test]
fn a_tree_of_many_large_directories_uploads_whole() {
    let t = tempfile::tempdir().unwrap();
    let (cs, ws) = (t.path().join("client-store"), t.path().join("worker-store"));
    let (store, file) = store_with_one_blob(&cs);
    let mut root = castore::Directory::new();
    for i in 0..4096 {
        let d = long_named(70, &format!("{i:04}"), &file);
        let size = d.size();
        let digest = store.put_directory(&d).unwrap();
        let name = format!("d{i:04}");
        root.insert(
            castore::Name::new(name.as_bytes()).unwrap(),
            Node::Directory { digest, size },
        )
        .unwrap();
    }
    let root = store.put_directory(&root).unwrap();
    let (dirs, blobs) = tree_objects(&cs, &[root]);
    assert_eq!((dirs.len(), blobs.len()), (4097, 1));

    let w = Worker::start(&ws, t.path(), 1, &[]);
    let sent = w.client().upload(&store, &[root], &[]).unwrap();
    assert_eq!((sent.directories, sent.blobs), (4097, 1));
    assert!(
        holds_all(&ws, &dirs, &blobs),
        "the worker lacks part of the tree"
    );

    // One directory bigger than any message (~270,000 long names, ~68 MB
    // encoded) is refused by the client, naming it, as bad input; the
    // worker serves on.
    let huge = store
        .put_directory(&long_named(270_000, "huge", &file))
        .unwrap();
    let e = w.client().upload(&store, &[huge], &[]).unwrap_err();
    assert_eq!(e.exit_class(), executor_core::ExitClass::Usage, "{e}");
    assert!(
        e.to_string().contains(&huge.to_string()) && e.to_string().contains("split it"),
        "{e}"
    );
    assert!(w.client().stats().is_ok(), "the worker stopped serving");
}

/// A client that opens many blob transfers on one connection and stalls
/// them all holds only that connection's turns (8 uploads, 2 downloads),
/// each only until the stall timeout, and nobody else's: another client's
/// build goes through meanwhile, the stalled transfers are ended after the
/// timeout (finishing one is refused, naming why) and the waiting ones get
/// their turns. Without turns all 20 uploads (each a blocking thread and a
/// queue of chunks in the worker) and all 6 downloads (each reading ahead)
/// were opened at once.
#[test]
fn stalled_transfers_take_turns_and_are_ended_after_the_stall_timeout() {
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(t.path(), "a.toml", &bb, "echo done > $out/f");
    // A zero timeout would end every transfer at once: refused as usage.
    let o = fhsx(&ws)
        .args(["worker", "--stall-timeout", "0s"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--stall-timeout 0"), "{}", text(&o));
    let w = Worker::start(&ws, t.path(), 1, &["--stall-timeout", "2s"]);
    let big = four_chunk_blob(&w);

    let start = Instant::now();
    let (probe, hold) = (Duration::from_secs(1), Duration::from_secs(7));
    let seen = std::thread::scope(|s| {
        let stalling = s.spawn(|| {
            let hostile = Client::connect(&Endpoint::parse(&w.addr), b"", &[]).unwrap();
            hostile
                .stall_transfers_raw(20, big, 6, probe, hold, true)
                .unwrap()
        });
        let o = remote(&cs, &w, &action, false).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            start.elapsed() < hold,
            "the other client's build ended after the stalling client let go"
        );
        stalling.join().unwrap()
    });
    let turns = (
        worker::transfers::UPLOADS_PER_CONNECTION,
        worker::transfers::DOWNLOADS_PER_CONNECTION,
    );
    assert_eq!(
        (seen.opened_at_probe, seen.begun_at_probe),
        turns,
        "{seen:?}"
    );
    // Ended at ~2, ~4 and ~6 s; the last had their turns at ~4 s.
    assert_eq!(
        (seen.opened_at_hold, seen.begun_at_hold),
        (20, 6),
        "{seen:?}"
    );
    assert_eq!(seen.finishes_refused, 20, "{seen:?}");
    assert!(seen.refusal.contains("ended the upload"), "{seen:?}");
    assert!(w.client().stats().is_ok(), "the worker stopped serving");
}

/// A blob of four chunks put in `w`'s store, for downloads to stall on
/// (a stalled one holds two chunks).
fn four_chunk_blob(w: &Worker) -> Digest {
    let data: Vec<u8> = (0..3 * worker::CHUNK + 7)
        .map(|i| (i % 251) as u8)
        .collect();
    let digest = Digest::of(&data);
    let chunks: Vec<&[u8]> = data.chunks(worker::CHUNK).collect();
    assert!(w
        .client()
        .put_blob_raw(digest.as_bytes(), data.len() as u64, &chunks)
        .unwrap());
    digest
}

/// A batch download (`getBlobs`) reads its blobs into memory and holds
/// them until answered, so it takes a download turn as `getBlob` does: on
/// a connection whose turns are held by stalled downloads it is answered
/// only once one of them is ended (at the stall timeout, 2 s here), while
/// on a connection of its own at once.
#[test]
fn a_batch_download_waits_for_a_download_turn() {
    let (t, _cs, ws, _bb) = busybox_stores();
    let w = Worker::start(&ws, t.path(), 1, &["--stall-timeout", "2s"]);
    let big = four_chunk_blob(&w);
    let small = b"a small blob".as_slice();
    assert!(w
        .client()
        .put_blob_raw(Digest::of(small).as_bytes(), small.len() as u64, &[small])
        .unwrap());
    let batch = [Digest::of(small)];
    let hold = Duration::from_secs(6);
    let connect = || Client::connect(&Endpoint::parse(&w.addr), b"", &[]).unwrap();
    let alone = connect()
        .batch_behind_stalled_downloads_raw(big, 0, &batch, hold)
        .unwrap()
        .expect("a batch on a connection of its own was not answered");
    assert!(alone < Duration::from_secs(1), "alone: {alone:?}");
    let behind = connect()
        .batch_behind_stalled_downloads_raw(
            big,
            worker::transfers::DOWNLOADS_PER_CONNECTION,
            &batch,
            hold,
        )
        .unwrap()
        .expect("the batch behind stalled downloads was never answered");
    assert!(
        behind > Duration::from_millis(1500),
        "answered after {behind:?}, before the stalled downloads gave a turn back"
    );
    assert!(w.client().stats().is_ok(), "the worker stopped serving");
}

/// A client that sends calls faster than they end — here 20,000
/// `putBlob`s behind its 8 stalled upload turns, each call waiting holding
/// its message and its state — gets no more than `CALLS_PER_CONNECTION`
/// of them read: the worker stops reading that connection, grows by
/// little, and serves another client meanwhile.
#[test]
fn a_connection_flooding_calls_is_not_read_past_its_cap() {
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(t.path(), "a.toml", &bb, "echo done > $out/f");
    let w = Worker::start(&ws, t.path(), 1, &[]);
    w.client().stats().unwrap();
    let (probe, hold) = (Duration::from_secs(4), Duration::from_secs(5));
    let (grown, seen) =
        grown_while_another_builds(&w, &cs, &action, Duration::from_secs(3), || {
            let hostile = Client::connect(&Endpoint::parse(&w.addr), b"", &[]).unwrap();
            let any = Digest::of(b"not downloaded");
            hostile
                .stall_transfers_raw(20_000, any, 0, probe, hold, false)
                .unwrap()
        });
    assert_eq!(
        seen.opened_at_probe,
        worker::transfers::UPLOADS_PER_CONNECTION,
        "{seen:?}"
    );
    assert!(
        grown < 16 << 10,
        "20,000 calls on one connection grew the worker by {grown} KiB"
    );
    assert!(w.client().stats().is_ok(), "the worker stopped serving");
}

/// Run `hostile` on a thread of its own; after `probe`, how much the worker
/// `w` grew since it began (KiB), then a build of `action` from the client
/// store `cs`, which must succeed meanwhile; and what `hostile` returned.
fn grown_while_another_builds<T: Send>(
    w: &Worker,
    cs: &Path,
    action: &Path,
    probe: Duration,
    hostile: impl FnOnce() -> T + Send,
) -> (u64, T) {
    let before = resident_kib(w.child.id());
    std::thread::scope(|s| {
        let hostile = s.spawn(hostile);
        std::thread::sleep(probe);
        let grown = resident_kib(w.child.id()).saturating_sub(before);
        let o = remote(cs, w, action, false).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        (grown, hostile.join().unwrap())
    })
}

/// A call holds its message while it waits, and a message may carry up to
/// 64 MiB: 64 batches of 8 MiB, each waiting for a blob whose upload the
/// same client began and stalled, would hold 512 MiB (and the batch's copy
/// as much again). The connection is not read past `CALL_BYTES` of such
/// messages, and another client's build goes through meanwhile.
#[test]
fn a_connection_sending_big_calls_is_not_read_past_a_byte_budget() {
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(t.path(), "a.toml", &bb, "echo done > $out/f");
    let w = Worker::start(&ws, t.path(), 1, &[]);
    w.client().stats().unwrap();
    let data: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    let (grown, answered) =
        grown_while_another_builds(&w, &cs, &action, Duration::from_secs(5), || {
            Client::connect(&Endpoint::parse(&w.addr), b"", &[])
                .unwrap()
                .batches_behind_a_claim_raw(&data, 64, Duration::from_secs(8))
                .unwrap()
        });
    assert_eq!(
        answered, 0,
        "a batch went through past the stalled upload's claim"
    );
    assert!(
        grown < 128 << 10,
        "64 waiting batches of 8 MiB grew the worker by {grown} KiB"
    );
    assert!(w.client().stats().is_ok(), "the worker stopped serving");
}

/// A build on a worker may make a directory bigger than any message can
/// carry back (here ~17,000 symlinks with ~4 KB targets, ~70 MB
/// encoded): the download fails with an error naming the directory and
/// the fix, not capnp's message-size refusal, nothing of the output is
/// kept, and the worker serves on.
#[test]
fn an_output_directory_too_big_for_a_message_fails_clearly() {
    let (t, cs, ws, bb) = busybox_stores();
    let part = "a".repeat(250);
    let prefix = vec![part.as_str(); 16].join("/");
    let action = sh_action(
        t.path(),
        "a.toml",
        &bb,
        &format!(
            "busybox mkdir $out/d && cd $out/d && busybox seq 1 17000 | busybox sed 's|^|{prefix}/|' \
             | busybox xargs busybox sh -c 'busybox ln -s \"$@\" .' sh"
        ),
    );
    let w = Worker::start(&ws, t.path(), 1, &[]);
    let o = remote(&cs, &w, &action, false).output().unwrap();
    let out = text(&o);
    // Like an output ingest refuses, the build's fault: exit 1.
    assert_eq!(o.status.code(), Some(1), "{out}");
    assert!(
        out.contains("output directory")
            && out.contains("17000 entries")
            && out.contains("split it"),
        "{out}"
    );
    store_verifies(&cs);
    assert!(w.client().stats().is_ok(), "the worker stopped serving");
}

/// A client that asks and never reads the answers (here 1,500 asks for a
/// directory of ~290 KB, behind a relay that stops passing the worker's
/// bytes) is not read past a bounded backlog of answers (16 MiB): capnp-rpc
/// queues every answer it cannot write, so without a bound the worker grew
/// by what the asks were worth (408 MiB; ~18 MiB with it). Other clients
/// are served meanwhile.
#[test]
fn a_client_reading_no_answers_is_not_read_past_a_backlog() {
    unread_answers_stay_under(
        |store, file| directory_asked(store, long_named(1000, "asked", file)),
        (1500, "answers of ~290 KB"),
        Duration::from_secs(3),
        32 << 10,
    );
}

/// The gate stops new calls once the backlog is reached, but not the calls
/// already in progress: 64 asks for a directory of ~8 MB, each read off
/// the event loop, made every answer at once and grew the worker by 1.5
/// GiB. A directory is now read one call at a time, once the answers not
/// yet written are under the backlog (~25 MiB).
#[test]
fn calls_in_progress_wait_for_the_backlog_before_they_answer() {
    unread_answers_stay_under(
        |store, file| directory_asked(store, long_named(28_000, "asked", file)),
        (64, "answers of ~8 MB"),
        Duration::from_secs(6),
        // ~25 MiB. Up to ~80 beside other tests when glibc gave each
        // blocking thread an arena of its own, which kept what it freed
        // (a directory decoded, encoded and answered): the worker now has
        // one arena per core.
        64 << 10,
    );
    // A batch of blobs waits in its download turn: 64 asks for a blob of
    // 900 KiB queued ~60 MiB past the backlog without.
    unread_answers_stay_under(
        |store, _| {
            use castore::store::BlobStore;
            let bytes = vec![7u8; 900 << 10];
            let blob = store.put_blob(&bytes).unwrap();
            let mut d = castore::Directory::new();
            let file = Node::File {
                digest: blob,
                size: bytes.len() as u64,
                executable: false,
            };
            d.insert(castore::Name::new("big").unwrap(), file).unwrap();
            (store.put_directory(&d).unwrap(), Ask::Blobs(vec![blob]))
        },
        (64, "batches of 900 KiB"),
        Duration::from_secs(3),
        40 << 10,
    );
}

/// Small answers are counted at what they cost the worker, not at their
/// size on the wire: 100,000 asks for the worker's counters (~145 bytes
/// an answer, ~800 in memory until written) from behind a relay that
/// stopped reading grew it by 77 MiB when each counted 128 bytes, as the
/// backlog of 16 MiB was never reached; now by ~17 MiB.
#[test]
fn a_flood_of_small_unread_answers_is_bounded_too() {
    unread_answers_stay_under(
        |store, file| {
            let (d, _) = directory_asked(store, long_named(1, "asked", file));
            (d, Ask::Stats)
        },
        (100_000, "small answers"),
        Duration::from_secs(16),
        32 << 10,
    );
}

/// A client that reads every answer is never held back by the count of
/// answers: 40,000 small answers (the worker's counters, ~145 bytes each,
/// counted at 1 KiB against the backlog) and 20,000 empty ones (~80
/// bytes) all come back on one connection. Counted as out later than they
/// were, the answers would have closed it at the backlog (after ~19,000).
#[test]
fn many_small_answers_read_by_their_client_leave_its_connection_open() {
    let t = tempfile::tempdir().unwrap();
    let w = Worker::start(&t.path().join("worker-store"), t.path(), 1, &[]);
    let c = Client::connect(&Endpoint::parse(&w.addr), b"", &[]).unwrap();
    let answered = c
        .ask_raw(&Ask::Stats, 40_000, Duration::from_secs(60))
        .unwrap();
    assert_eq!(answered, 40_000);
    for _ in 0..20_000 {
        c.put_blobs_raw(&[]).unwrap();
    }
}

/// Calls a client cancels are answered by a `canceled` `Return`, the
/// smallest answer: counted as more than it is, each ran the count of
/// answers not yet written ahead, until the connection was not read. Here
/// 48,000 `getBlob`s cancelled while they waited for a download turn, then
/// 40,000 asks for the counters on the same connection, all of which come
/// back.
#[test]
fn cancelled_calls_leave_their_connection_open() {
    let t = tempfile::tempdir().unwrap();
    let w = Worker::start(&t.path().join("worker-store"), t.path(), 1, &[]);
    let big = four_chunk_blob(&w);
    let c = Client::connect(&Endpoint::parse(&w.addr), b"", &[]).unwrap();
    // Well under the stall timeout (60 s), which would end the stalled
    // downloads and so unblock a connection the count had closed.
    c.cancel_calls_raw(big, 48_000, Duration::from_secs(20))
        .unwrap();
    let answered = c
        .ask_raw(&Ask::Stats, 40_000, Duration::from_secs(20))
        .unwrap();
    assert_eq!(answered, 40_000);
}

/// A directory to upload, and the ask for it.
fn directory_asked(store: &LocalStore, dir: castore::Directory) -> (Digest, Ask) {
    let d = store.put_directory(&dir).unwrap();
    (d, Ask::Directory(d))
}

/// Ask a worker `asks` times at once, from behind a relay that stops
/// reading after the handshake and the first answers, for what `made`
/// puts in the client store (its directory is uploaded first); assert
/// that not every answer got through and that the worker grew by less
/// than `bound` KiB by `probe`, while another client was served.
fn unread_answers_stay_under(
    made: impl FnOnce(&LocalStore, &Node) -> (Digest, Ask),
    (asks, what): (usize, &str),
    probe: Duration,
    bound: u64,
) {
    let t = tempfile::tempdir().unwrap();
    let (cs, ws) = (t.path().join("client-store"), t.path().join("worker-store"));
    let (store, file) = store_with_one_blob(&cs);
    let (d, ask) = made(&store, &file);
    let w = Worker::start(&ws, t.path(), 1, &[]);
    w.client().upload(&store, &[d], &[]).unwrap();
    let before = resident_kib(w.child.id());
    let (relay, _) = stalling_relay(&w.addr, 256 << 10);
    let asker = std::thread::spawn(move || {
        let c = Client::connect(&Endpoint::parse(&relay), b"", &[]).unwrap();
        c.ask_raw(&ask, asks, probe + Duration::from_secs(1))
            .unwrap()
    });
    std::thread::sleep(probe);
    let grown = resident_kib(w.child.id()).saturating_sub(before);
    // Meanwhile another client is served.
    w.client().stats().unwrap();
    let answered = asker.join().unwrap();
    assert!(answered < asks, "every answer got through the relay");
    assert!(
        grown < bound,
        "{asks} unread {what} grew the worker by {grown} KiB"
    );
}

/// `connections` clients of the worker at `addr`, each on a thread of its
/// own stalling `uploads` uploads and `downloads` downloads of `blob`
/// until `hold` (`Client::stall_transfers_raw`); what each saw.
fn stalled_clients(
    addr: &str,
    connections: usize,
    uploads: usize,
    blob: Digest,
    downloads: usize,
    probe: Duration,
    hold: Duration,
) -> Vec<std::thread::JoinHandle<worker::client::StalledTransfers>> {
    (0..connections)
        .map(|_| {
            let addr = addr.to_owned();
            std::thread::spawn(move || {
                Client::connect(&Endpoint::parse(&addr), b"", &[])
                    .unwrap()
                    .stall_transfers_raw(uploads, blob, downloads, probe, hold, false)
                    .unwrap()
            })
        })
        .collect()
}

/// Stalled uploads on many connections hold a blocking thread each (their
/// store writers), more than tokio's default pool of 512 (here 65
/// connections × 8 = 520): the other work on that pool (hashing a batch,
/// a build's stages) still runs at once, and each stalled writer costs
/// its thread and its chunk, not a copy buffer. With the default pool
/// another client's upload and build waited for the stall timeout (60 s).
#[test]
fn stalled_uploads_on_many_connections_leave_the_blocking_pool_to_others() {
    let (t, cs, ws, bb) = busybox_stores();
    let action = sh_action(t.path(), "a.toml", &bb, "echo done > $out/f");
    let w = Worker::start(&ws, t.path(), 1, &[]);
    w.client().stats().unwrap();
    let before = resident_kib(w.child.id());
    let connections = 65;
    // Held well past what the build may take: with the default pool it
    // waited until the stalled clients went away, at `hold`.
    let (probe, hold) = (Duration::from_secs(6), Duration::from_secs(24));
    let any = Digest::of(b"not downloaded");
    let stalled = stalled_clients(&w.addr, connections, 8, any, 0, probe, hold);
    std::thread::sleep(probe);
    let threads = threads_of(w.child.id());
    // Each stalled stream holds its thread and its one chunk; with a
    // copy buffer of 1 MiB per writer thread (glibc served it from
    // its arenas' padded heaps, zeroed) the worker grew by 297 MiB,
    // now by ~44 MiB, most of it the 65 connections' TLS buffers.
    let grown = resident_kib(w.child.id()).saturating_sub(before);
    assert!(
        grown < 96 << 10,
        "{connections} connections of stalled uploads grew the worker by {grown} KiB"
    );
    assert!(
        threads > 512,
        "the stalled uploads should hold more than 512 threads, the worker has {threads}"
    );
    let began = Instant::now();
    let o = remote(&cs, &w, &action, false)
        .arg("--rebuild")
        .output()
        .unwrap();
    let took = began.elapsed();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        took < Duration::from_secs(8),
        "a build beside {connections} connections of stalled uploads took {took:?}"
    );
    for h in stalled {
        let seen = h.join().unwrap();
        assert_eq!(seen.opened_at_probe, 8, "{seen:?}");
    }
}

/// A relay on a UNIX socket in front of the worker at `to` (no TLS there)
/// that rewrites `from` into `into` (same length) in what the worker
/// sends, as a worker serving other bytes than it was asked for would.
fn tampering_relay(dir: &Path, to: &Path, from: &'static [u8], into: &'static [u8]) -> PathBuf {
    use std::os::unix::net::{UnixListener, UnixStream};
    assert_eq!(from.len(), into.len());
    let at = dir.join("tampering.sock");
    let l = UnixListener::bind(&at).unwrap();
    let to = to.to_owned();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            let Ok(mut w) = UnixStream::connect(&to) else {
                return;
            };
            let (mut c2, mut w2) = (c.try_clone().unwrap(), w.try_clone().unwrap());
            std::thread::spawn(move || {
                let _ = std::io::copy(&mut c2, &mut w2);
            });
            std::thread::spawn(move || {
                // Holds back the last bytes that might begin `from`, and
                // sends them once the worker pauses.
                w.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                let mut held: Vec<u8> = Vec::new();
                let mut buf = [0u8; 65536];
                loop {
                    match w.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => held.extend_from_slice(&buf[..n]),
                        Err(e)
                            if e.kind() == std::io::ErrorKind::WouldBlock
                                || e.kind() == std::io::ErrorKind::TimedOut =>
                        {
                            if c.write_all(&held).is_err() {
                                break;
                            }
                            held.clear();
                            continue;
                        }
                        Err(_) => break,
                    }
                    let mut i = 0;
                    while i + from.len() <= held.len() {
                        if &held[i..i + from.len()] == from {
                            held[i..i + from.len()].copy_from_slice(into);
                        }
                        i += 1;
                    }
                    let keep = (from.len() - 1).min(held.len());
                    let send = held.len() - keep;
                    if c.write_all(&held[..send]).is_err() {
                        break;
                    }
                    held.drain(..send);
                }
                let _ = c.write_all(&held);
            });
        }
    });
    at
}

/// The client takes nothing from a worker it did not ask for: bytes
/// changed on the way (here by a relay, on a UNIX socket where no TLS
/// would catch it) are refused as an integrity failure (exit 3), naming
/// the object, whether they were a small file (downloaded in a batch), a
/// big one (streamed) or a directory's entry; the client's store keeps
/// none of it and has no record of the build.
#[test]
fn bytes_changed_on_the_way_from_the_worker_are_refused() {
    let t = tempfile::tempdir().unwrap();
    let cs = t.path().join("cs");
    let bb = busybox(&cs);
    let (mut child, sock) = unix_worker(t.path());
    let relay = tampering_relay(t.path(), &sock, b"TAMPER-ME-43690", b"TAMPER-ME-43691");
    // The marker is made in the sandbox, so that no script or log sent
    // back carries it.
    let cases = [
        ("small", "echo TAMPER-ME-$((0xAAAA)) > $out/f"),
        (
            "big",
            "busybox dd if=/dev/zero of=$out/big bs=1024 count=2048 2>/dev/null; echo TAMPER-ME-$((0xAAAA)) >> $out/big",
        ),
        ("name", "echo x > $out/TAMPER-ME-$((0xAAAA))"),
    ];
    for (name, script) in cases {
        let a = sh_action(t.path(), &format!("{name}.toml"), &bb, script);
        let o = fhsx(&cs)
            .args(["build", "--remote"])
            .arg(format!("unix:{}", relay.display()))
            .arg(&a)
            .output()
            .unwrap();
        let out = text(&o);
        assert_eq!(o.status.code(), Some(3), "{name}: {out}");
        assert!(
            out.contains("from the worker") && out.contains("refused"),
            "{name}: {out}"
        );
        store_verifies(&cs);
        // Nothing of it was kept: untampered, the outputs come from the
        // worker, not from a local record.
        let o = fhsx(&cs)
            .args(["build", "--remote"])
            .arg(format!("unix:{}", sock.display()))
            .arg(&a)
            .output()
            .unwrap();
        assert!(o.status.success(), "{name}, untampered: {}", text(&o));
        assert!(
            !text(&o).contains("nothing sent to the worker"),
            "{}",
            text(&o)
        );
    }
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
}

/// Downloads stalled on many connections (40 × 2, each of a blob of four
/// chunks, into sinks that never take a chunk) cost the worker two chunks
/// each (the one on its way, the next one read), not the blob, and no
/// thread, until the stall timeout.
#[test]
fn stalled_downloads_on_many_connections_cost_a_few_chunks_each() {
    let t = tempfile::tempdir().unwrap();
    let w = Worker::start(&t.path().join("ws"), t.path(), 1, &[]);
    let data: Vec<u8> = (0..4 * worker::CHUNK).map(|i| (i % 251) as u8).collect();
    let big = Digest::of(&data);
    let chunks: Vec<&[u8]> = data.chunks(worker::CHUNK).collect();
    assert!(w
        .client()
        .put_blob_raw(big.as_bytes(), data.len() as u64, &chunks)
        .unwrap());
    let before = resident_kib(w.child.id());
    let connections = 40;
    let (probe, hold) = (Duration::from_secs(4), Duration::from_secs(6));
    let stalled = stalled_clients(&w.addr, connections, 0, big, 2, probe, hold);
    std::thread::sleep(probe);
    // Measured: 150-180 MiB, each download's chunk on its way and the
    // next one read; with a reader thread and a queue of four chunks
    // (one: 277-288), 276-319 MiB.
    let grown = resident_kib(w.child.id()).saturating_sub(before);
    assert!(
        grown < 224 << 10,
        "{} stalled downloads grew the worker by {grown} KiB",
        2 * connections
    );
    for h in stalled {
        let seen = h.join().unwrap();
        assert_eq!(seen.begun_at_probe, 2, "{seen:?}");
    }
}
