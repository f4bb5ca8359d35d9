//! `fhsx worker --reapi`: fhsx as a Remote Execution API worker under a
//! real engine — BuildGrid 0.4.4 on Debian's PostgreSQL 15, both on
//! loopback, with BuildGrid's in-memory CAS — driven by real clients:
//! BuildGrid's `bgd execute`, Bazel 2.1.0, BuildStream 2.8.1 and a Python
//! gRPC client. Each test starts its own database, engine and workers.
//!
//! Prerequisites (`.ci/setup` installs them): `postgresql` (Debian), a
//! BuildGrid venv at /opt/fhsx-ci/buildgrid (or `FHSX_BUILDGRID=DIR`),
//! Bazel 2.1.0 from npm at /opt/fhsx-ci/bazel (or `FHSX_BAZEL=FILE`), a
//! BuildStream venv at /opt/fhsx-ci/buildstream (or `FHSX_BUILDSTREAM=DIR`),
//! and apt for the toolchains. A missing one fails the test saying so.

mod support;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use support::{
    bazel, buildgrid, buildgrid_storage, fhsx, free_port, linked_store, text, wait_port, S3,
};

const PG_BIN: &str = "/usr/lib/postgresql/15/bin";

fn bgd() -> Command {
    Command::new(buildgrid().join("bin/bgd"))
}

fn buildstream() -> PathBuf {
    let dir = std::env::var_os("FHSX_BUILDSTREAM")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/fhsx-ci/buildstream"));
    assert!(
        dir.join("bin/bst").exists(),
        "BuildStream is not installed at {}: run .ci/setup (it makes that venv with Debian's python3: `python3 -m venv {} && {}/bin/pip install buildstream==2.8.1`), or set FHSX_BUILDSTREAM",
        dir.display(),
        dir.display(),
        dir.display()
    );
    dir
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}", text(o));
}

/// How long a client command may take before the test gives up on it.
const CLIENT_LIMIT: Duration = Duration::from_secs(300);

/// Run a client command that must finish within [`CLIENT_LIMIT`].
fn run(c: Command, what: &str) -> Output {
    run_for(c, CLIENT_LIMIT).unwrap_or_else(|| panic!("{what} did not finish in {CLIENT_LIMIT:?}"))
}

/// Run a command, killing it after `limit`; `None` if it had to be killed.
fn run_for(mut c: Command, limit: Duration) -> Option<Output> {
    let child = c
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_for_child(child, limit)
}

/// Wait for a child (its pipes drained as it runs), SIGINT then SIGKILL
/// after `limit`; `None` if it had to be killed.
fn wait_for_child(mut child: Child, limit: Duration) -> Option<Output> {
    fn drain<R: std::io::Read + Send + 'static>(r: Option<R>) -> std::thread::JoinHandle<Vec<u8>> {
        std::thread::spawn(move || {
            let mut v = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut v);
            }
            v
        })
    }
    let out = drain(child.stdout.take());
    let err = drain(child.stderr.take());
    let end = Instant::now() + limit;
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break Some(st);
        }
        if Instant::now() > end {
            // Our own child, by its pid: SIGINT lets bgd cancel its operation.
            unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
            std::thread::sleep(Duration::from_secs(2));
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let (stdout, stderr) = (
        out.join().unwrap_or_default(),
        err.join().unwrap_or_default(),
    );
    status.map(|status| Output {
        status,
        stdout,
        stderr,
    })
}

/// PostgreSQL and BuildGrid on loopback, stopped when dropped.
struct Engine {
    dir: PathBuf,
    port: u16,
    server: Child,
}

impl Engine {
    /// `keepalive`: how long BuildGrid waits to hear from a bot before it
    /// takes the bot's leases back.
    fn start(dir: &Path, keepalive: u64) -> Engine {
        Self::start_with(dir, keepalive, None)
    }

    /// With `s3`, the engine's CAS (and action cache) live in that
    /// S3-compatible object store instead of its memory.
    fn start_with(dir: &Path, keepalive: u64, s3: Option<&S3>) -> Engine {
        assert!(
            Path::new(PG_BIN).join("initdb").exists(),
            "PostgreSQL 15 is not installed: `apt-get install postgresql` (listed in .ci/apt-packages)"
        );
        assert!(
            unsafe { libc::geteuid() } == 0,
            "the REAPI tests run PostgreSQL as its own user and need root (as CI runs them)"
        );
        let bg = buildgrid();
        let dir = dir.join("engine");
        fs::create_dir_all(&dir).unwrap();
        // The postgres user must reach its data directory.
        let mut p = dir.clone();
        loop {
            let _ = fs::set_permissions(&p, fs::Permissions::from_mode(0o755));
            if !p.pop() || p == Path::new("/tmp") || p.as_os_str().is_empty() {
                break;
            }
        }
        let pg = dir.join("pg");
        fs::create_dir_all(&pg).unwrap();
        let (uid, gid) = postgres_ids();
        std::os::unix::fs::chown(&pg, Some(uid), Some(gid)).unwrap();
        let as_pg = |bin: &str| {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"])
                .arg(Path::new(PG_BIN).join(bin));
            c
        };
        let data = pg.join("data");
        let o = as_pg("initdb")
            .arg("-D")
            .arg(&data)
            .args(["-A", "trust", "-U", "bgd", "--no-sync"])
            .output()
            .unwrap();
        ok(&o, "initdb");
        let pg_port = free_port();
        let o = as_pg("pg_ctl")
            .arg("-D")
            .arg(&data)
            .arg("-o")
            .arg(format!(
                "-c listen_addresses=127.0.0.1 -p {pg_port} -k {} -c fsync=off -c synchronous_commit=off -c full_page_writes=off",
                pg.display()
            ))
            .arg("-l")
            .arg(pg.join("log"))
            .args(["-w", "start"])
            .output()
            .unwrap();
        ok(&o, "pg_ctl start");
        let url = format!("postgresql+psycopg2://bgd@127.0.0.1:{pg_port}/postgres");
        let o = bgd().args(["migrate", "apply", &url]).output().unwrap();
        ok(&o, "bgd migrate apply");
        let port = free_port();
        let storage = buildgrid_storage(s3);
        let config = dir.join("bgd.yml");
        fs::write(
            &config,
            format!(
                r#"server:
  - !channel
    address: "127.0.0.1:{port}"
    insecure-mode: true
authorization:
  method: none
connections:
  - !sql-connection &sql
    connection-string: {url}
    pool-size: 10
    max-overflow: 20
storages:
{storage}caches:
  - !lru-action-cache &ac
    storage: *cas
    max-cached-refs: 10000
    allow-updates: true
    cache-failed-actions: true
schedulers:
  - !sql-scheduler &scheduler
    sql: *sql
    action-cache: *ac
    storage: *cas
    property-set: !dynamic-property-set
      match-property-keys: [fhsx-toolchain, fhsx-root]
    bot-session-keepalive-timeout: {keepalive}
instances:
  - name: ''
    services:
      - !action-cache
        cache: *ac
      - !execution
        scheduler: *scheduler
      - !cas
        storage: *cas
      - !bytestream
        storage: *cas
thread-pool-size: 64
"#
            ),
        )
        .unwrap();
        let log = dir.join("bgd.log");
        let server = Command::new(bg.join("bin/bgd"))
            .args(["server", "start"])
            .arg(&config)
            .stdout(fs::File::create(&log).unwrap())
            .stderr(Stdio::from(fs::File::create(dir.join("bgd.err")).unwrap()))
            .spawn()
            .unwrap();
        wait_port(port, "BuildGrid", &dir.join("bgd.err"));
        Engine { dir, port, server }
    }

    fn url(&self) -> String {
        format!("grpc://127.0.0.1:{}", self.port)
    }

    fn http(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// `bgd execute command` with a toolchain property (or none).
    fn execute(
        &self,
        input: &Path,
        props: &[(&str, &str)],
        outputs: &[&str],
        out_dir: &Path,
        argv: &[&str],
    ) -> Command {
        let mut c = bgd();
        c.args(["execute", "--remote", &self.http(), "command", "-c"]);
        for (k, v) in props {
            c.args(["-p", k, v]);
        }
        for o in outputs {
            c.args(["--output-file", o]);
        }
        c.arg("--output-directory")
            .arg(out_dir)
            .arg(input)
            .arg("--")
            .args(argv);
        c
    }

    /// The cached ActionResult of an action, as JSON.
    fn action_result(&self, action: &str) -> serde_json::Value {
        let o = bgd()
            .args([
                "actioncache",
                "--remote",
                &self.http(),
                "get",
                "--json",
                action,
            ])
            .output()
            .unwrap();
        ok(&o, "bgd actioncache get");
        let s = String::from_utf8_lossy(&o.stdout);
        let start = s.find('{').unwrap_or_else(|| panic!("no JSON in {s}"));
        serde_json::from_str(&s[start..]).unwrap_or_else(|e| panic!("{e}: {s}"))
    }

    fn download(&self, digest: &str, to: &Path) -> Vec<u8> {
        let o = bgd()
            .args([
                "cas",
                "--remote",
                &self.http(),
                "download-file",
                "--verify",
                digest,
            ])
            .arg(to)
            .output()
            .unwrap();
        ok(&o, "bgd cas download-file");
        fs::read(to).unwrap()
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
        let _ = Command::new("runuser")
            .args(["-u", "postgres", "--"])
            .arg(Path::new(PG_BIN).join("pg_ctl"))
            .arg("-D")
            .arg(self.dir.join("pg/data"))
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

fn postgres_ids() -> (u32, u32) {
    let passwd = fs::read_to_string("/etc/passwd").unwrap();
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .expect("no postgres user: `apt-get install postgresql` makes it");
    let f: Vec<&str> = line.split(':').collect();
    (f[2].parse().unwrap(), f[3].parse().unwrap())
}

/// The `Sent action=[hash: "…" size_bytes: N]` bgd prints, as `hash/size`.
fn sent_action(stdout: &str) -> String {
    let at = stdout
        .find("Sent action=")
        .unwrap_or_else(|| panic!("no action in {stdout}"));
    let s = &stdout[at..];
    let hash = s.split('"').nth(1).unwrap();
    let size = s
        .split("size_bytes:")
        .nth(1)
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .trim_end_matches(']');
    format!("{hash}/{size}")
}

/// The toolchains every worker registers, imported once per target dir:
/// `base` (Debian's essential set: sh, coreutils) and `gxx` (that plus
/// gcc, g++ and libc6-dev: what Bazel's autoconfigured C++ toolchain calls).
struct Seed {
    store: PathBuf,
    base: PathBuf,
    gxx: PathBuf,
}

fn seed() -> &'static Seed {
    static S: OnceLock<Seed> = OnceLock::new();
    S.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reapi-seed");
        fs::create_dir_all(&dir).unwrap();
        let store = dir.join("store");
        let base = dir.join("base.toolchain");
        let gxx = dir.join("gxx.toolchain");
        for (file, pkgs) in [
            (&base, &["coreutils"][..]),
            (&gxx, &["gcc", "g++", "libc6-dev"][..]),
        ] {
            let o = fhsx(&store)
                .args(["toolchain", "apt", "--essential"])
                .args(pkgs)
                .arg("-o")
                .arg(file)
                .output()
                .unwrap();
            ok(&o, "fhsx toolchain apt (needs apt and `apt-get update`)");
        }
        Seed { store, base, gxx }
    })
}

fn toolchain_id(file: &Path) -> String {
    let o = fhsx(&seed().store)
        .args(["toolchain", "id"])
        .arg(file)
        .output()
        .unwrap();
    ok(&o, "fhsx toolchain id");
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// A store of its own at `store` holding the seed's toolchains, hard-linked
/// (a store never rewrites an object), without the seed's key or state.
fn seed_copy(store: &Path) {
    linked_store(&seed().store, store);
}

/// An `fhsx worker --reapi` process (SIGKILLed when dropped).
struct Worker {
    child: Option<Child>,
    dir: PathBuf,
    store: PathBuf,
    url: String,
    id: String,
    jobs: usize,
}

impl Worker {
    /// A worker with its own store (the seed's toolchains, hard-linked: a
    /// store never rewrites an object) and its own key.
    fn new(dir: &Path, engine: &Engine, id: &str, jobs: usize) -> Worker {
        let dir = dir.join(id);
        let store = dir.join("store");
        fs::create_dir_all(&dir).unwrap();
        if !store.exists() {
            seed_copy(&store);
        }
        let mut w = Worker {
            child: None,
            dir,
            store,
            url: engine.url(),
            id: id.to_owned(),
            jobs,
        };
        w.start();
        w
    }

    fn start(&mut self) {
        let s = seed();
        let log = fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("worker.log"))
            .unwrap();
        let mut child = Command::new(env!("CARGO_BIN_EXE_fhsx"))
            .arg("--store")
            .arg(&self.store)
            .args([
                "worker", "--reapi", &self.url, "--bot-id", &self.id, "--jobs",
            ])
            .arg(self.jobs.to_string())
            // Nothing parked, so a test can tell what a build left mounted.
            .args(["--scratch-pool", "0"])
            .arg("--toolchain")
            .arg(&s.base)
            .arg("--toolchain")
            .arg(&s.gxx)
            .env("TMPDIR", &self.dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            // Read stdout to its end: on a closed pipe the worker's next
            // line would fail.
            let mut r = BufReader::new(stdout);
            let mut line = String::new();
            let _ = r.read_line(&mut line);
            let _ = tx.send(line);
            let _ = std::io::copy(&mut r, &mut std::io::sink());
        });
        let line = rx.recv_timeout(Duration::from_secs(90)).unwrap_or_default();
        if !line.contains("attached to") {
            let _ = child.kill();
            let _ = child.wait();
            panic!("worker {} did not attach: {line:?} {}", self.id, self.log());
        }
        self.child = Some(child);
    }

    fn log(&self) -> String {
        fs::read_to_string(self.dir.join("worker.log")).unwrap_or_default()
    }

    fn leases(&self) -> usize {
        self.log().matches(": took lease ").count()
    }

    fn key(&self) -> String {
        let o = fhsx(&self.store).args(["key", "show"]).output().unwrap();
        ok(&o, "fhsx key show");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Mount points under this worker's TMPDIR (its views and scratch file systems).
    fn mounts(&self) -> Vec<String> {
        let dir = self.dir.to_string_lossy().into_owned();
        fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .lines()
            .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
            .filter(|m| m.starts_with(&dir))
            .collect()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        self.kill9();
    }
}

fn wait_until(what: &str, limit: Duration, f: impl Fn() -> bool) {
    let end = Instant::now() + limit;
    while !f() {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// `bgd execute` runs a command with inputs and outputs on an fhsx worker:
/// the output files and exit code come back, the ActionResult names the
/// signed record and the read set in the engine's CAS, and the record the
/// client downloads is the one `fhsx record verify` accepts with the
/// worker's key, binding the toolchain the client asked for and an output
/// holding the very bytes the client got. A failing command's exit code
/// comes back too; the worker prints the properties it registers, among
/// them `OSFamily` and `ISA`, which BuildGrid always matches and an action
/// carrying them runs; an action naming no toolchain runs in its input root
/// (which has no shell here: not found), one naming a toolchain or an ISA no worker has stays queued, and a
/// client speaking BLAKE3 is refused by the engine before any worker sees it.
#[test]
fn bgd_execute_runs_on_fhsx_and_the_record_verifies() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let mut w = Worker::new(t.path(), &e, "w1", 1);
    let tc = toolchain_id(&seed().base);
    let input = t.path().join("in");
    fs::create_dir_all(input.join("sub")).unwrap();
    fs::write(input.join("a.txt"), "hello\n").unwrap();
    fs::write(input.join("sub/b.txt"), "world\n").unwrap();
    // Over the engine's batch limit (2 MiB), so it crosses both ways as a
    // stream: the worker's streamed download checks its SHA-256 as it
    // stores it, and the output goes back by a streamed upload.
    let big: Vec<u8> = (0..5u32 << 20).map(|i| (i % 251) as u8).collect();
    fs::write(input.join("big.bin"), &big).unwrap();
    let got = t.path().join("got");
    // The keys BuildGrid always matches, as BuildStream sends them: the
    // worker advertises them by default, and says so.
    for p in [
        "OSFamily=linux",
        "ISA=x86-64",
        &format!("fhsx-toolchain={tc}"),
    ] {
        assert!(
            w.log().contains(&format!("fhsx: worker: property {p}\n")),
            "{p}: {}",
            w.log()
        );
    }
    let o = run(e
        .execute(
            &input,
            &[("fhsx-toolchain", &tc), ("OSFamily", "linux"), ("ISA", "x86-64")],
            &["out/c.txt", "out/big.bin", "gen"],
            &got,
            &["/bin/sh", "-c", "mkdir gen && echo made > gen/x && cat a.txt sub/b.txt > out/c.txt && cp big.bin out/ && echo said-on-stdout"],
        ), "bgd execute");
    ok(&o, "bgd execute");
    assert_eq!(
        fs::read_to_string(got.join("out/c.txt")).unwrap(),
        "hello\nworld\n"
    );
    assert!(
        fs::read(got.join("out/big.bin")).unwrap() == big,
        "the 5 MiB file came back changed"
    );
    let action = sent_action(&String::from_utf8_lossy(&o.stdout));
    let r = e.action_result(&action);
    assert_eq!(
        r.get("exitCode").and_then(|c| c.as_i64()).unwrap_or(0),
        0,
        "{r}"
    );
    assert_eq!(r["outputDirectories"][0]["path"], "gen", "{r}");
    let meta = &r["executionMetadata"];
    assert_eq!(meta["worker"], "w1-0", "{r}");
    // The proof: OutputFile entries naming the record and the read set.
    let aux = &meta["auxiliaryMetadata"];
    let entry = |i: usize, path: &str| {
        let e = &aux[i];
        assert_eq!(e["path"], path, "{r}");
        let prop = |name: &str| {
            e["nodeProperties"]["properties"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["name"] == name))
                .and_then(|p| p["value"].as_str())
                .unwrap_or_else(|| panic!("no {name} in {e}"))
                .to_owned()
        };
        assert_eq!(prop("fhsx-signer"), w.key());
        let d = &e["digest"];
        (
            format!(
                "{}/{}",
                d["hash"].as_str().unwrap(),
                d["sizeBytes"].as_str().unwrap()
            ),
            prop("fhsx-b3"),
        )
    };
    let (record_sha, record_b3) = entry(0, "fhsx-record.json");
    let (read_set_sha, _) = entry(1, "fhsx-read-set");
    let record_b3 = record_b3.as_str();
    let stdout = e.download(
        &format!(
            "{}/{}",
            r["stdoutDigest"]["hash"].as_str().unwrap(),
            r["stdoutDigest"]["sizeBytes"].as_str().unwrap_or("0")
        ),
        &t.path().join("stdout"),
    );
    assert!(String::from_utf8_lossy(&stdout).contains("said-on-stdout"));

    // The record the client fetches is the one that verifies.
    let bytes = e.download(&record_sha, &t.path().join("record.json"));
    assert_eq!(castore::Digest::of(&bytes).to_string(), record_b3);
    let o = fhsx(&w.store)
        .args(["record", "verify", record_b3, "--trust", &w.key()])
        .output()
        .unwrap();
    ok(&o, "fhsx record verify");
    let rec: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    assert_eq!(
        rec["record"]["toolchain_digest"],
        tc.as_str(),
        "the record binds the toolchain asked for"
    );
    let read_set = e.download(&read_set_sha, &t.path().join("reads"));
    assert_eq!(
        castore::Digest::of(&read_set).to_string(),
        rec["record"]["observed_read_set_digest"].as_str().unwrap()
    );
    let out = rec["record"]["outputs"]["out"].as_str().unwrap();
    let o = fhsx(&w.store)
        .args(["store", "cat", out, "out/c.txt"])
        .output()
        .unwrap();
    ok(&o, "store cat");
    assert_eq!(
        o.stdout, b"hello\nworld\n",
        "the record's output holds what the client got"
    );

    // Every input object crossed the wire once: the same input root again
    // is fetched from the worker's own store.
    assert!(w.log().contains("fetched 5 objects"), "{}", w.log());

    // A failing command: its exit code and stderr come back.
    let o = run(
        e.execute(
            &input,
            &[("fhsx-toolchain", &tc)],
            &[],
            &got,
            &["/bin/sh", "-c", "echo broken >&2; exit 3"],
        ),
        "bgd execute",
    );
    ok(&o, "bgd execute (failing command)");
    let r = e.action_result(&sent_action(&String::from_utf8_lossy(&o.stdout)));
    assert_eq!(r["exitCode"], 3, "{r}");
    let stderr = e.download(
        &format!(
            "{}/{}",
            r["stderrDigest"]["hash"].as_str().unwrap_or_default(),
            r["stderrDigest"]["sizeBytes"].as_str().unwrap_or("0")
        ),
        &t.path().join("stderr"),
    );
    assert!(String::from_utf8_lossy(&stderr).contains("broken\n"), "{r}");
    assert!(
        w.log().contains("fetched 0 objects, 0 bytes"),
        "{}",
        w.log()
    );

    // A new input root over the same subtrees: only what is new crosses
    // (its root Directory and the one new file); `sub` and every other
    // blob are the worker's map's.
    let again = |argv: &[&str]| {
        let o = run(
            e.execute(&input, &[("fhsx-toolchain", &tc)], &[], &got, argv),
            "bgd execute",
        );
        ok(&o, "bgd execute (the same inputs)");
    };
    fs::write(input.join("new.txt"), "new\n").unwrap();
    again(&["/bin/sh", "-c", "cat new.txt sub/b.txt"]);
    assert!(w.log().contains(": fetched 2 objects, "), "{}", w.log());
    // The map is the store's, not the process's: a worker started anew
    // fetches nothing of a root it converted before.
    const NOTHING: &str = "fetched 0 objects, 0 bytes";
    let before_restart = w.log().matches(NOTHING).count();
    w.kill9();
    w.start();
    again(&["/bin/sh", "-c", "cat new.txt a.txt"]);
    assert_eq!(
        w.log().matches(NOTHING).count(),
        before_restart + 1,
        "{}",
        w.log()
    );

    // On a toolchain it does not name: refused with the reason.
    let before = w.leases();
    let o = run(
        e.execute(
            &input,
            &[("fhsx-root", "toolchain")],
            &[],
            &got,
            &["/bin/true"],
        ),
        "bgd execute",
    );
    let s = text(&o);
    assert!(s.contains("code: 9") && s.contains("names none"), "{s}");
    assert_eq!(w.leases(), before + 1);
    // No toolchain at all: the input root is the command's `/`, and this
    // one has no /bin/true. Not found: nothing runs on the host's tools.
    let o = run(
        e.execute(&input, &[], &[], &got, &["/bin/true"]),
        "bgd execute",
    );
    ok(&o, "bgd execute (no toolchain)");
    let r = e.action_result(&sent_action(&String::from_utf8_lossy(&o.stdout)));
    assert_eq!(r["exitCode"], 127, "{r}");
    let before = w.leases();

    // A toolchain nobody holds: the engine matches it to no worker.
    let unknown = castore::Digest::of(b"no such toolchain").to_string();
    // An action no worker matches stays queued: it neither completes nor
    // is leased.
    let stays_queued = |props: &[(&str, &str)], what: &str| {
        let mut c = e.execute(&input, props, &[], &got, &["/bin/true"]);
        c.env("PYTHONUNBUFFERED", "1");
        assert!(
            run_for(c, Duration::from_secs(6)).is_none(),
            "{what} completed"
        );
        assert_eq!(w.leases(), before, "a worker took {what}: {}", w.log());
    };
    stays_queued(
        &[("fhsx-toolchain", &unknown)],
        "an action for a toolchain it does not hold",
    );
    // Nor an ISA it does not run.
    stays_queued(
        &[("fhsx-toolchain", &tc), ("ISA", "sparc-v9")],
        "an action for another ISA",
    );

    // A BLAKE3 client: refused by the engine, which speaks SHA-256.
    let o = Command::new(buildgrid().join("bin/python"))
        .arg("-c")
        .arg(BLAKE3_CLIENT)
        .arg(format!("127.0.0.1:{}", e.port))
        .output()
        .unwrap();
    ok(&o, "the BLAKE3 client");
    let s = text(&o);
    assert!(
        s.contains("upload refused 3") && s.contains("execute refused FAILED_PRECONDITION"),
        "{s}"
    );
    assert_eq!(w.leases(), before);
    assert!(w.mounts().is_empty(), "{:?}", w.mounts());
}

/// A gc on the worker's store, run again and again while the worker
/// fetches a large input tree (1,500 files of their own) from the engine's
/// CAS and builds on it: nothing the job fetched is taken before its
/// directories are written and rooted, the build sees every file, and the
/// store verifies. (The fetch holds gc off; the tree stays rooted until the
/// job ends.)
#[test]
fn gc_during_an_input_fetch_takes_nothing_the_job_needs() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let w = Worker::new(t.path(), &e, "w1", 1);
    let o = fhsx(&w.store)
        .args(["store", "root", "add"])
        .arg(&seed().base)
        .output()
        .unwrap();
    ok(&o, "fhsx store root add (the toolchain)");
    let tc = toolchain_id(&seed().base);
    let input = t.path().join("in");
    for d in 0..30 {
        let dir = input.join(format!("d{d:02}"));
        fs::create_dir_all(&dir).unwrap();
        for f in 0..50 {
            fs::write(dir.join(format!("f{f:02}")), format!("file {d} {f}\n")).unwrap();
        }
    }
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let collector = std::thread::spawn({
        let stop = stop.clone();
        let store = w.store.clone();
        move || {
            let mut runs = 0;
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let o = fhsx(&store).args(["store", "gc"]).output().unwrap();
                assert!(o.status.success(), "store gc: {}", text(&o));
                runs += 1;
            }
            runs
        }
    });
    let got = t.path().join("got");
    let o = run(
        e.execute(
            &input,
            &[("fhsx-toolchain", &tc)],
            &["out/n"],
            &got,
            &[
                "/bin/sh",
                "-c",
                "cat d*/f* | wc -l > out/n && sort -c -k2n -k3n d00/f00 >/dev/null",
            ],
        ),
        "bgd execute",
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let runs = collector.join().unwrap();
    ok(&o, "bgd execute");
    assert_eq!(
        fs::read_to_string(got.join("out/n"))
            .map(|n| n.trim().to_owned())
            .map_err(|e| e.to_string()),
        Ok("1500".to_owned()),
        "the job did not see its 1,500 input files; bgd said: {}\nthe worker said: {}",
        text(&o),
        w.log()
    );
    assert!(w.log().contains("fetched 1531 objects"), "{}", w.log());
    assert!(runs >= 3, "only {runs} gc runs overlapped the job");
    let v = fhsx(&w.store).args(["store", "verify"]).output().unwrap();
    ok(&v, "fhsx store verify after the gcs");
}

/// `Action.timeout`, `do_not_cache` and cancellation, sent by a Python
/// gRPC client (bgd cannot set the first two): a build past its timeout is
/// stopped and reported `DEADLINE_EXCEEDED`; a `do_not_cache` action runs
/// every time while a cacheable one sent again (the engine's cache
/// skipped) is answered from fhsx's own action cache without running; an
/// operation the client cancels stops its build on the worker, which
/// leaves nothing mounted and serves the next action.
#[test]
fn timeouts_do_not_cache_and_cancellation_are_honoured() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let w = Worker::new(t.path(), &e, "w1", 1);
    let tc = toolchain_id(&seed().base);
    let client = |mode: &str| {
        let mut c = Command::new(buildgrid().join("bin/python"));
        c.arg("-c")
            .arg(PROPERTIES_CLIENT)
            .arg(format!("127.0.0.1:{}", e.port))
            .arg(&tc)
            .arg(mode);
        let o = run(c, "the Python client");
        ok(&o, mode);
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let started = || w.log().matches(" started").count();
    let cached = || w.log().matches("(cached: nothing ran)").count();

    let t0 = Instant::now();
    let out = client("timeout");
    assert!(out.contains("status 4 exit 137"), "{out}\n{}", w.log());
    assert!(
        t0.elapsed() < Duration::from_secs(25),
        "the 2 s timeout was not enforced"
    );

    let (s0, c0) = (started(), cached());
    let out = client("nocache");
    assert_eq!(out.matches("status 0 exit 0").count(), 2, "{out}");
    assert_eq!(
        (started() - s0, cached() - c0),
        (2, 0),
        "do_not_cache was answered from a cache: {}",
        w.log()
    );
    let out = client("cache");
    assert_eq!(out.matches("status 0 exit 0").count(), 2, "{out}");
    assert_eq!((started() - s0, cached() - c0), (4, 1), "{}", w.log());

    let out = client("cancel");
    assert!(out.contains("cancelled"), "{out}");
    wait_until(
        "the worker to stop the cancelled build",
        Duration::from_secs(30),
        || {
            w.log()
                .contains("was cancelled by the engine; stopping its build")
                && w.mounts().is_empty()
        },
    );
    let out = client("cache");
    assert!(
        out.contains("status 0 exit 0"),
        "the worker did not serve after a cancellation: {out}"
    );
}

/// The client of the test above: `ADDR TOOLCHAIN MODE`.
const PROPERTIES_CLIENT: &str = r#"
import hashlib, sys, threading, time, grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re, remote_execution_pb2_grpc as reg
from buildgrid._protos.google.longrunning import operations_pb2, operations_pb2_grpc
ch = grpc.insecure_channel(sys.argv[1]); tc = sys.argv[2]; mode = sys.argv[3]
cas = reg.ContentAddressableStorageStub(ch)
def put(m):
    b = m.SerializeToString(); d = re.Digest(hash=hashlib.sha256(b).hexdigest(), size_bytes=len(b))
    cas.BatchUpdateBlobs(re.BatchUpdateBlobsRequest(requests=[re.BatchUpdateBlobsRequest.Request(digest=d, data=b)]))
    return d
def action(script, timeout=0, nocache=False):
    c = re.Command(arguments=["/bin/sh", "-c", script],
                   platform=re.Platform(properties=[re.Platform.Property(name="fhsx-toolchain", value=tc)]))
    a = re.Action(command_digest=put(c), input_root_digest=put(re.Directory()), do_not_cache=nocache)
    if timeout: a.timeout.seconds = timeout
    return put(a)
def execute(d):
    last = None
    for op in reg.ExecutionStub(ch).Execute(re.ExecuteRequest(action_digest=d, skip_cache_lookup=True)):
        last = op
    r = re.ExecuteResponse(); last.response.Unpack(r)
    print("status", r.status.code, "exit", r.result.exit_code, r.status.message, flush=True)
if mode == "timeout":
    execute(action("sleep 30", timeout=2))
elif mode in ("nocache", "cache"):
    d = action("echo same", nocache=(mode == "nocache"))
    execute(d); execute(d)
elif mode == "cancel":
    stream = reg.ExecutionStub(ch).Execute(re.ExecuteRequest(action_digest=action("sleep 60"), skip_cache_lookup=True))
    name = next(stream).name
    time.sleep(5)
    operations_pb2_grpc.OperationsStub(ch).CancelOperation(operations_pb2.CancelOperationRequest(name=name))
    try:
        for op in stream: pass
    except grpc.RpcError as e:
        pass
    print("cancelled", flush=True)
"#;

/// A client that names its blobs by BLAKE3 and says so (`digest_function`).
const BLAKE3_CLIENT: &str = r#"
import sys, grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re, remote_execution_pb2_grpc as reg
ch = grpc.insecure_channel(sys.argv[1])
B3 = re.DigestFunction.BLAKE3
import hashlib
d = re.Digest(hash=hashlib.blake2s(b"hello").hexdigest(), size_bytes=5)
r = reg.ContentAddressableStorageStub(ch).BatchUpdateBlobs(re.BatchUpdateBlobsRequest(
    requests=[re.BatchUpdateBlobsRequest.Request(digest=d, data=b"hello")], digest_function=B3))
print("upload refused", r.responses[0].status.code, r.responses[0].status.message)
try:
    for op in reg.ExecutionStub(ch).Execute(re.ExecuteRequest(action_digest=d, digest_function=B3, skip_cache_lookup=True)):
        print("execute answered", op)
except grpc.RpcError as e:
    print("execute refused", e.code().name, e.details())
"#;

/// What a client of another family asks and reads back, sent by a Python
/// gRPC client as BuildStream shapes it: `OSFamily`, `ISA` and the
/// toolchain in `Action.platform`, `sh -c -e SCRIPT` run in
/// `buildstream/p/e`, and `output_paths` the spec allows — `.` (the
/// working directory, inputs included), `../../../buildstream-install`
/// (beside it, within the input root), a symlink the command made (returned
/// as one, not followed) and a path it never made (left out). The older
/// fields resolve alike (`output_directories [""]`, `output_files
/// ["a/../new2.txt"]`); a path out of the input root is `INVALID_ARGUMENT`
/// naming it, and no build runs. Each result carries the nine timestamps in
/// order, and stdout and stderr apart.
#[test]
fn output_paths_as_buildstream_sends_them_and_what_a_client_reads_back() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let w = Worker::new(t.path(), &e, "w1", 1);
    let tc = toolchain_id(&seed().base);
    let r = client(&e, &w, OUTPUTS_CLIENT, &[tc.as_ref()]);
    let a = &r["buildstream"];
    assert_eq!(
        (&a["status"], &a["exit"]),
        (&0.into(), &0.into()),
        "{r}\n{}",
        w.log()
    );
    assert_eq!(
        a["dirs"],
        serde_json::json!({
            ".": {"files": ["in.txt", "new.txt"], "dirs": [], "symlinks": ["link"]},
            "../../../buildstream-install": {"files": [], "dirs": ["bin"], "symlinks": []},
        }),
        "{r}"
    );
    assert_eq!(a["symlinks"], serde_json::json!({"link": "in.txt"}), "{r}");
    assert_eq!(a["files"], serde_json::json!({}), "{r}");
    // stdout and stderr apart, as the client reads them.
    let (out, err) = (
        a["stdout"].as_str().unwrap_or_default(),
        a["stderr"].as_str().unwrap_or_default(),
    );
    assert!(
        out.contains("to-stdout\n") && !out.contains("to-stderr"),
        "{r}"
    );
    assert!(
        err.contains("to-stderr\n") && !err.contains("to-stdout"),
        "{r}"
    );
    assert_eq!(a["timestamps"], "ordered", "{r}");

    let b = &r["older_fields"];
    assert_eq!((&b["status"], &b["exit"]), (&0.into(), &0.into()), "{r}");
    assert_eq!(
        b["dirs"][""]["files"],
        serde_json::json!(["in.txt", "new2.txt"]),
        "{r}"
    );
    assert_eq!(
        b["files"],
        serde_json::json!({"a/../new2.txt": "two\n"}),
        "{r}"
    );
    assert_eq!(b["timestamps"], "ordered", "{r}");

    let c = &r["escape"];
    assert_eq!(c["status"], 3, "{r}");
    let m = c["message"].as_str().unwrap_or_default();
    assert!(
        m.contains(r#""../../../../etc""#) && m.contains("out of the input root"),
        "{r}"
    );
    assert!(
        w.log().matches(" started").count() <= 2,
        "the escaping action ran: {}",
        w.log()
    );
    assert!(w.mounts().is_empty(), "{:?}", w.mounts());
}

/// Run the Python client `code` (after [`CLIENT_PRELUDE`]) against the
/// engine with `args`; the one JSON object it prints.
fn client(e: &Engine, w: &Worker, code: &str, args: &[&std::ffi::OsStr]) -> serde_json::Value {
    let o = Command::new(buildgrid().join("bin/python"))
        .arg("-c")
        .arg(format!("{CLIENT_PRELUDE}{code}"))
        .arg(format!("127.0.0.1:{}", e.port))
        .args(args)
        .output()
        .unwrap();
    ok(&o, "the REAPI client");
    let out = String::from_utf8_lossy(&o.stdout);
    serde_json::from_str(out.trim()).unwrap_or_else(|err| panic!("{err}: {out}\n{}", w.log()))
}

/// What the Python REAPI clients below share: `ADDR` first on their
/// command line; `put`/`get` through the engine's CAS; `run`, one action
/// through `Execute`, as a JSON-able dict of what a client reads back.
const CLIENT_PRELUDE: &str = r#"
import hashlib, json, sys, grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re, remote_execution_pb2_grpc as reg
ch = grpc.insecure_channel(sys.argv[1])
cas = reg.ContentAddressableStorageStub(ch)
def digest(b): return re.Digest(hash=hashlib.sha256(b).hexdigest(), size_bytes=len(b))
def put_bytes(b):
    d = digest(b)
    cas.BatchUpdateBlobs(re.BatchUpdateBlobsRequest(requests=[re.BatchUpdateBlobsRequest.Request(digest=d, data=b)]))
    return d
def put(m): return put_bytes(m.SerializeToString())
def get(d):
    if d.size_bytes == 0: return b""
    return cas.BatchReadBlobs(re.BatchReadBlobsRequest(digests=[d])).responses[0].data
def run(argv, wd, root, props, **outputs):
    platform = re.Platform(properties=[re.Platform.Property(name=k, value=v) for k, v in sorted(props)])
    c = re.Command(arguments=argv, working_directory=wd, **outputs)
    a = re.Action(command_digest=put(c), input_root_digest=root, platform=platform)
    last = None
    for op in reg.ExecutionStub(ch).Execute(re.ExecuteRequest(action_digest=put(a), skip_cache_lookup=True)):
        last = op
    resp = re.ExecuteResponse(); last.response.Unpack(resp)
    r = resp.result
    out = {"status": resp.status.code, "message": resp.status.message, "exit": r.exit_code}
    def listing(tree_digest):
        t = re.Tree(); t.ParseFromString(get(tree_digest))
        return {"files": [f.name for f in t.root.files], "dirs": [d.name for d in t.root.directories],
                "symlinks": [s.name for s in t.root.symlinks]}
    def flat(root):
        # Every file and symlink below the directory `root`, fetched by digest.
        paths, stack = [], [("", root)]
        while stack:
            p, digest = stack.pop()
            d = re.Directory(); d.ParseFromString(get(digest))
            paths += [p + f.name for f in d.files] + [p + s.name for s in d.symlinks]
            stack += [(p + c.name + "/", c.digest) for c in d.directories]
        return sorted(paths)
    out["dirs"] = {d.path: listing(d.tree_digest) for d in r.output_directories}
    out["paths"] = {d.path: flat(d.root_directory_digest) for d in r.output_directories}
    out["files"] = {f.path: get(f.digest).decode() for f in r.output_files}
    out["symlinks"] = {s.path: s.target for s in list(r.output_symlinks) + list(r.output_file_symlinks)}
    out["stdout"] = get(r.stdout_digest).decode(errors="replace") if r.HasField("stdout_digest") else None
    out["stderr"] = get(r.stderr_digest).decode(errors="replace") if r.HasField("stderr_digest") else None
    m = r.execution_metadata
    names = ["queued", "worker_start", "input_fetch_start", "input_fetch_completed", "execution_start",
             "execution_completed", "output_upload_start", "output_upload_completed", "worker_completed"]
    stamps = [(n, getattr(m, n + "_timestamp")) for n in names]
    missing = [n for n, s in stamps if not m.HasField(n + "_timestamp")]
    times = [s.ToNanoseconds() for _, s in stamps]
    out["timestamps"] = ("missing " + " ".join(missing)) if missing else (
        "ordered" if times == sorted(times) else "out of order: " + str(list(zip(names, times))))
    return out
"#;

/// The client of the test above, after [`CLIENT_PRELUDE`]: `ADDR
/// TOOLCHAIN`; prints one JSON object.
const OUTPUTS_CLIENT: &str = r#"
tc = sys.argv[2]
def nest(path, leaf):
    # The directory `leaf` at `path` below an otherwise empty root.
    d = leaf
    for name in reversed(path.split("/")):
        d = re.Directory(directories=[re.DirectoryNode(name=name, digest=put(d))])
    return d
inputs = put(nest("buildstream/p/e", re.Directory(files=[re.FileNode(name="in.txt", digest=put_bytes(b"in\n"))])))
props = [("ISA", "x86-64"), ("OSFamily", "linux"), ("fhsx-toolchain", tc)]
def execute(script, **outputs):
    return run(["sh", "-c", "-e", script], "buildstream/p/e", inputs, props, **outputs)
print(json.dumps({
    "buildstream": execute(
        "mkdir -p ../../../buildstream-install/bin && echo made > ../../../buildstream-install/bin/prog && "
        "echo new > new.txt && ln -s in.txt link && echo to-stdout && echo to-stderr >&2",
        output_paths=[".", "../../../buildstream-install", "link", "missing"]),
    "older_fields": execute("echo two > new2.txt", output_files=["a/../new2.txt"], output_directories=[""]),
    "escape": execute("true", output_paths=["../../../../etc"]),
}))
"#;

/// A static shell and tools (Debian's busybox-static, through `fhsx
/// toolchain apt` and `fhsx store export`): what an input root needs to be
/// a root that runs something, at 2 MB.
fn busybox() -> &'static Path {
    static B: OnceLock<PathBuf> = OnceLock::new();
    B.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("reapi-busybox");
        let bin = dir.join("tree/bin/busybox");
        if bin.exists() {
            return bin;
        }
        let store = dir.join("store");
        let file = dir.join("busybox.toolchain");
        let o = fhsx(&store)
            .args(["toolchain", "apt", "busybox-static", "-o"])
            .arg(&file)
            .output()
            .unwrap();
        ok(
            &o,
            "fhsx toolchain apt busybox-static (needs apt and `apt-get update`)",
        );
        let text = fs::read_to_string(&file).unwrap();
        let atom = text
            .lines()
            .find_map(|l| l.strip_prefix("atom = \"")?.strip_suffix('"'))
            .unwrap_or_else(|| panic!("no atom in {text}"));
        let _ = fs::remove_dir_all(dir.join("tree"));
        let o = fhsx(&store)
            .args(["store", "export", atom])
            .arg(dir.join("tree"))
            .output()
            .unwrap();
        ok(&o, "fhsx store export");
        bin
    })
}

/// Actions that name no toolchain, as BuildStream sends them: the input
/// root is their `/`, read-only but for the working directory and the
/// output paths; over a toolchain when they name one, their own entries
/// taking precedence; a failed command's outputs come back; asked for the
/// whole root, every top-level directory is writable and the output is
/// the root after the command.
#[test]
fn an_input_root_is_the_actions_root_writable_only_where_its_outputs_are() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let w = Worker::new(t.path(), &e, "w1", 1);
    let tc = toolchain_id(&seed().base);
    let r = client(
        &e,
        &w,
        INPUT_ROOT_CLIENT,
        &[busybox().as_os_str(), tc.as_ref()],
    );
    let a = &r["sysroot"];
    let log = a["stdout"].as_str().unwrap_or_default();
    assert_eq!(
        (&a["status"], &a["exit"]),
        (&0.into(), &0.into()),
        "{r}\n{}",
        w.log()
    );
    // The command ran in its own root: its shell, its /etc.
    assert!(log.contains("marker=from-the-input-root\n"), "{log}");
    assert!(log.contains("cwd=/buildstream/p/e\n"), "{log}");
    assert!(
        !log.contains("WROTE"),
        "a write outside the outputs landed: {log}"
    );
    assert!(log.contains("DONE") && !log.contains("on-stderr"), "{log}");
    assert!(
        a["stderr"]
            .as_str()
            .unwrap_or_default()
            .contains("on-stderr\n"),
        "{r}"
    );
    assert_eq!(
        a["dirs"],
        serde_json::json!({
            ".": {"files": ["in.txt", "seen"], "dirs": [], "symlinks": []},
            "../../../buildstream-install": {"files": [], "dirs": ["bin"], "symlinks": []},
        }),
        "{r}"
    );
    assert_eq!(a["timestamps"], "ordered", "{r}");

    let b = &r["over_a_toolchain"];
    let log = b["stdout"].as_str().unwrap_or_default();
    assert_eq!((&b["status"], &b["exit"]), (&0.into(), &0.into()), "{r}");
    // The input root's file, not the toolchain's (base-files has one too);
    // the toolchain's coreutils where the input root has none.
    assert!(log.contains("version=mine\n"), "{log}");
    assert!(log.contains("env=env (GNU coreutils)"), "{log}");

    // A command that failed still returns its outputs (a test's log).
    let f = &r["failed"];
    assert_eq!((&f["status"], &f["exit"]), (&0.into(), &3.into()), "{r}");
    assert_eq!(
        f["files"],
        serde_json::json!({"test.log": "failing\n"}),
        "{r}"
    );

    // The whole root asked for (BuildStream's integration commands): every
    // top-level directory is writable, and the output is the root after.
    let c = &r["whole_root"];
    assert_eq!((&c["status"], &c["exit"]), (&0.into(), &0.into()), "{r}");
    assert_eq!(
        c["paths"]["../../.."],
        serde_json::json!([
            "bin/busybox",
            "bin/sh",
            "buildstream/p/e/in.txt",
            "buildstream/p/e/made",
            "etc/debian_version",
            "etc/integrated",
            "etc/marker"
        ]),
        "{r}"
    );
    // A file directly in the root: the root's own entries cannot be made.
    let c = &r["root_file"];
    assert_eq!(c["status"], 3, "{r}");
    assert!(
        c["message"]
            .as_str()
            .unwrap_or_default()
            .contains("directly in the input root"),
        "{r}"
    );
    assert!(w.mounts().is_empty(), "{:?}", w.mounts());
}

/// The client of the test above, after [`CLIENT_PRELUDE`]: `ADDR BUSYBOX
/// TOOLCHAIN`; prints one JSON object.
const INPUT_ROOT_CLIENT: &str = r#"
busybox = open(sys.argv[2], "rb").read(); tc = sys.argv[3]
def tree(entries):
    # {"a/b": bytes | ("x", bytes) executable | ("l", target) symlink}, stored; its digest.
    top = {}
    for path, v in entries.items():
        d = top
        parts = path.split("/")
        for p in parts[:-1]: d = d.setdefault(p, {})
        d[parts[-1]] = v
    def build(d):
        m = re.Directory()
        for name in sorted(d):
            v = d[name]
            if isinstance(v, dict): m.directories.add(name=name, digest=put(build(v)))
            elif isinstance(v, tuple) and v[0] == "l": m.symlinks.add(name=name, target=v[1])
            elif isinstance(v, tuple): m.files.add(name=name, digest=put_bytes(v[1]), is_executable=True)
            else: m.files.add(name=name, digest=put_bytes(v))
        return m
    return put(build(top))
sysroot = {
    "bin/busybox": ("x", busybox), "bin/sh": ("l", "busybox"),
    "etc/marker": b"from-the-input-root\n", "etc/debian_version": b"mine\n",
    "buildstream/p/e/in.txt": b"in\n",
}
def execute(script, props, root, **outputs):
    return run(["/bin/sh", "-c", "-e", script], "buildstream/p/e", tree(root), props, **outputs)
bst = [("ISA", "x86-64"), ("OSFamily", "linux")]
probes = ("for p in /etc/x /bin/x /x /buildstream/x /buildstream/p/x /usr/x; do "
          "if (echo no > $p) 2>/dev/null; then echo WROTE $p; fi; done; ")
print(json.dumps({
    "sysroot": execute(
        "read m < /etc/marker; echo marker=$m; echo cwd=$(pwd); echo on-stderr >&2; cat /etc/marker in.txt > seen; " + probes +
        "mkdir -p /buildstream-install/bin && echo made > /buildstream-install/bin/prog; echo DONE",
        bst, sysroot, output_paths=[".", "../../../buildstream-install"]),
    "over_a_toolchain": execute(
        "read v < /etc/debian_version; echo version=$v; /usr/bin/env --version | { read l; echo env=$l; }",
        bst + [("fhsx-root", "input"), ("fhsx-toolchain", tc)],
        {k: v for k, v in sysroot.items() if not k.startswith("bin/")} | {"bin/sh": ("x", busybox)},
        output_paths=["."]),
    "whole_root": execute("echo integrated > /etc/integrated; echo made > made", bst, sysroot,
                          output_paths=["../../.."]),
    "root_file": execute("true", bst, sysroot, output_files=["../../../f"]),
    "failed": execute("echo failing > test.log; exit 3", bst, sysroot, output_paths=["test.log"]),
}))
"#;

/// A Bazel workspace: a genrule feeding a C binary, Bazel's rules_cc and
/// rules_java names served by local stubs over its built-in rules (Bazel
/// 2.1 would download them; this machine reaches no such host).
fn workspace(dir: &Path, extra_build: &str) {
    fs::create_dir_all(dir.join("rules_cc/cc")).unwrap();
    fs::create_dir_all(dir.join("rules_java/java")).unwrap();
    for f in [
        "rules_cc/WORKSPACE",
        "rules_cc/cc/BUILD",
        "rules_java/WORKSPACE",
        "rules_java/java/BUILD",
    ] {
        fs::write(dir.join(f), "").unwrap();
    }
    let stub = |rules: &[&str]| {
        rules
            .iter()
            .map(|r| format!("def {r}(**attrs):\n    native.{r}(**attrs)\n\n"))
            .collect::<String>()
    };
    fs::write(
        dir.join("rules_cc/cc/defs.bzl"),
        stub(&[
            "cc_binary",
            "cc_library",
            "cc_test",
            "cc_import",
            "cc_toolchain",
            "cc_toolchain_suite",
        ]),
    )
    .unwrap();
    fs::write(
        dir.join("rules_java/java/defs.bzl"),
        stub(&[
            "java_binary",
            "java_import",
            "java_library",
            "java_plugin",
            "java_test",
            "java_package_configuration",
            "java_runtime",
            "java_toolchain",
        ]),
    )
    .unwrap();
    fs::write(
        dir.join("WORKSPACE"),
        "local_repository(name = \"rules_cc\", path = \"rules_cc\")\nlocal_repository(name = \"rules_java\", path = \"rules_java\")\n",
    )
    .unwrap();
    fs::write(dir.join("msg.txt"), "hello from fhsx").unwrap();
    fs::write(
        dir.join("hello.c"),
        "#include <stdio.h>\n#include \"gen.h\"\nint main(void) { puts(MSG); return 0; }\n",
    )
    .unwrap();
    fs::write(
        dir.join("BUILD"),
        format!(
            r##"genrule(
    name = "gen",
    srcs = ["msg.txt"],
    outs = ["gen.h"],
    cmd = "echo \"#define MSG \\\"$$(cat $(location msg.txt))\\\"\" > $@",
)
cc_binary(
    name = "hello",
    srcs = ["hello.c", ":gen"],
)
{extra_build}"##
        ),
    )
    .unwrap();
}

/// Bazel in batch mode (no server left behind) against the engine, every
/// spawn remote, the toolchain named by the default platform property.
fn bazel_cmd(ws: &Path, root: &Path, engine: &Engine, tc: &str, args: &[&str]) -> Command {
    let mut c = Command::new(bazel());
    c.current_dir(ws)
        .arg(format!("--output_user_root={}", root.display()))
        .arg("--batch")
        .args(args);
    if args[0] != "clean" {
        c.arg(format!("--remote_executor={}", engine.url()))
            .args([
                "--spawn_strategy=remote",
                "--genrule_strategy=remote",
                "--noremote_local_fallback",
            ])
            .arg(format!(
                "--remote_default_exec_properties=fhsx-toolchain={tc}"
            ));
    }
    c.env("HOME", root);
    c
}

/// "INFO: N processes: …" from Bazel's summary.
fn processes(out: &str) -> String {
    out.lines()
        .rfind(|l| l.contains(" processes"))
        .unwrap_or("")
        .to_owned()
}

/// Bazel 2.1.0 builds a genrule and a C binary whose compiler and libc are
/// a composition of Debian packages (gcc, g++, libc6-dev): every action
/// runs remotely on fhsx, the binary runs, and after `bazel clean` the
/// rebuild is answered entirely from the engine's action cache. Meanwhile
/// `fhsx build --cache` shares that action cache and CAS: one store pushes,
/// a fresh one gets the result, and neither disturbs Bazel's entries (nor
/// Bazel theirs).
#[test]
fn bazel_builds_remotely_on_fhsx_and_rebuilds_from_the_remote_cache() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let w = Worker::new(t.path(), &e, "w1", 2);
    let tc = toolchain_id(&seed().gxx);
    let ws = t.path().join("ws");
    workspace(&ws, "");
    let root = t.path().join("bazel-root");
    let o = run(
        bazel_cmd(&ws, &root, &e, &tc, &["build", "//:hello"]),
        "bazel",
    );
    ok(&o, "bazel build");
    let s = text(&o);
    let p = processes(&s);
    assert!(
        p.contains("3 processes: 3 remote."),
        "not every action ran remotely: {p}\n{s}"
    );
    assert_eq!(w.leases(), 3, "{}", w.log());
    let o = Command::new(ws.join("bazel-bin/hello")).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&o.stdout), "hello from fhsx\n");

    // fhsx's own results in the same action cache and CAS.
    let action = t.path().join("fhsx-action.toml");
    fs::write(
        &action,
        format!(
            "[inputs]\nclosure = [{:?}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox echo beside bazel > $out/f\"]\n",
            support::busybox_deb().display().to_string()
        ),
    )
    .unwrap();
    let fhsx_build = |store: &str, flags: &[&str]| -> serde_json::Value {
        let o = fhsx(&t.path().join(store))
            .args(["--json", "build"])
            .arg(&action)
            .args(["--cache", &e.url()])
            .args(flags)
            .output()
            .unwrap();
        ok(&o, "fhsx build --cache");
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let pushed = fhsx_build("fhsx-a", &["--cache-push"]);
    assert_eq!(pushed["source"], "built");
    let key = fhsx(&t.path().join("fhsx-a"))
        .args(["key", "show"])
        .output()
        .unwrap();
    let key = String::from_utf8_lossy(&key.stdout).trim().to_owned();
    let hit = fhsx_build("fhsx-b", &["--trust", &key]);
    assert_eq!(hit["source"], "remote", "{hit}");
    assert_eq!(hit["record"], pushed["record"]);

    ok(
        &run(bazel_cmd(&ws, &root, &e, &tc, &["clean"]), "bazel"),
        "bazel clean",
    );
    let o = run(
        bazel_cmd(&ws, &root, &e, &tc, &["build", "//:hello"]),
        "bazel",
    );
    ok(&o, "bazel rebuild");
    let s = text(&o);
    assert!(
        processes(&s).contains("3 processes: 3 remote cache hit."),
        "{s}"
    );
    assert_eq!(w.leases(), 3, "the rebuild ran something: {}", w.log());
    assert!(w.mounts().is_empty(), "{:?}", w.mounts());
    // And fhsx's entry is still fhsx's.
    let again = fhsx_build("fhsx-c", &["--trust", &key]);
    assert_eq!(again["source"], "remote", "{again}");
    assert_eq!(again["outputs"], pushed["outputs"]);
}

/// What a hostile build does, as a shell script: read the host's shadow
/// file, write outside its directory, open a socket to the host.
const HOSTILE: [(&str, &str, &str); 3] = [
    (
        "shadow",
        "cat /etc/shadow",
        "/etc/shadow: No such file or directory",
    ),
    ("escape", "echo pwned > /usr/pwned", "/usr/pwned: "),
    (
        "socket",
        "echo hi > /dev/tcp/127.0.0.1/PORT",
        "/dev/tcp/127.0.0.1/PORT: ",
    ),
];

/// A hostile action sent through Bazel fails inside fhsx exactly as the
/// same command does with `fhsx build` (the same diagnostic, nothing
/// written on the host), and the worker keeps serving: a good action built
/// after them succeeds.
#[test]
fn hostile_actions_through_bazel_fail_as_with_fhsx_build_and_the_worker_keeps_serving() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let w = Worker::new(t.path(), &e, "w1", 2);
    let tc = toolchain_id(&seed().gxx);
    let port = e.port.to_string();
    let mut rules = String::new();
    for (name, script, _) in HOSTILE {
        let script = script.replace("PORT", &port);
        rules.push_str(&format!(
            "genrule(\n    name = \"{name}\",\n    outs = [\"{name}.out\"],\n    cmd = \"{script} > $@\",\n)\n"
        ));
    }
    let ws = t.path().join("ws");
    workspace(&ws, &rules);
    let root = t.path().join("bazel-root");
    for (name, script, want) in HOSTILE {
        let script = script.replace("PORT", &port);
        let want = want.replace("PORT", &port);
        let o = run(
            bazel_cmd(&ws, &root, &e, &tc, &["build", &format!("//:{name}")]),
            "bazel",
        );
        let s = text(&o);
        assert!(!o.status.success(), "{name} built: {s}");
        assert!(
            s.contains(&want),
            "{name}: Bazel did not show fhsx's diagnostic {want:?}: {s}"
        );

        // The same command through `fhsx build`, on the same toolchain.
        let dir = t.path().join(format!("local-{name}"));
        fs::create_dir_all(&dir).unwrap();
        fs::write(
            dir.join("a.toml"),
            format!(
                "[inputs]\ntoolchain = [{:?}]\n[run]\ncommand = [\"/bin/bash\", \"-c\", {:?}]\n",
                seed().gxx.display().to_string(),
                format!("mkdir -p $out; {script} > $out/{name}.out")
            ),
        )
        .unwrap();
        let o = fhsx(&w.store)
            .arg("build")
            .arg(dir.join("a.toml"))
            .output()
            .unwrap();
        let local = text(&o);
        assert_eq!(o.status.code(), Some(1), "{name} with fhsx build: {local}");
        let line = |s: &str| {
            s.lines()
                .find(|l| l.contains(&want))
                .map(|l| l.rsplit(&want).next().unwrap_or("").to_owned())
        };
        assert_eq!(
            line(&local),
            line(&s),
            "{name}: not the same failure remotely and locally:\n{local}\n---\n{s}"
        );
    }
    assert!(!Path::new("/usr/pwned").exists());
    let o = run(
        bazel_cmd(&ws, &root, &e, &tc, &["build", "//:hello"]),
        "bazel",
    );
    ok(&o, "a good build after the hostile ones");
    assert!(w.mounts().is_empty(), "{:?}", w.mounts());
}

/// Two workers on one engine: 20 actions complete, spread over both; a
/// worker killed with SIGKILL mid-action loses its lease to the other when
/// the engine stops hearing from it, the action completes there, and the
/// killed worker, restarted, leaves nothing mounted.
#[test]
fn two_workers_share_the_queue_and_a_killed_workers_lease_completes_on_the_other() {
    let t = tempfile::tempdir().unwrap();
    two_workers(t.path(), &Engine::start(t.path(), 6));
}

/// The same two workers with the engine's CAS on an S3-compatible object
/// store (moto on loopback): fhsx needs nothing of its own for a shared CAS.
#[test]
fn two_workers_on_an_engine_whose_cas_is_an_s3_object_store() {
    let t = tempfile::tempdir().unwrap();
    let s3 = S3::start(t.path());
    let e = Engine::start_with(t.path(), 6, Some(&s3));
    two_workers(t.path(), &e);
    assert!(s3.objects() > 20, "the CAS is not in the bucket");
}

fn two_workers(dir: &Path, e: &Engine) {
    let t = dir;
    let mut w = [Worker::new(t, e, "wa", 1), Worker::new(t, e, "wb", 1)];
    let tc = toolchain_id(&seed().base);
    let input = t.join("in");
    fs::create_dir_all(&input).unwrap();
    fs::write(input.join("x"), "x").unwrap();
    let mut clients = Vec::new();
    for i in 0..20 {
        let out = t.join(format!("got{i}"));
        let mut c = e.execute(
            &input,
            &[("fhsx-toolchain", &tc)],
            &["n"],
            &out,
            &["/bin/sh", "-c", &format!("sleep 0.3; echo {i} > n")],
        );
        c.stdout(Stdio::null()).stderr(Stdio::piped());
        clients.push((i, out, c.spawn().unwrap()));
    }
    for (i, out, c) in clients {
        let o = wait_for_child(c, CLIENT_LIMIT).expect("a bgd execute did not finish");
        ok(&o, "bgd execute");
        assert_eq!(fs::read_to_string(out.join("n")).unwrap(), format!("{i}\n"));
    }
    let n = [w[0].leases(), w[1].leases()];
    assert_eq!(n[0] + n[1], 20, "{}\n{}", w[0].log(), w[1].log());
    assert!(n[0] > 0 && n[1] > 0, "not spread over both workers: {n:?}");
    let done = |w: &Worker| w.log().matches("done: record").count();
    let finished = [done(&w[0]), done(&w[1])];

    // A long action; kill whichever worker takes it, mid-build.
    let out = t.join("long");
    let mut c = e.execute(
        &input,
        &[("fhsx-toolchain", &tc)],
        &["done"],
        &out,
        &["/bin/sh", "-c", "sleep 4; echo ok > done"],
    );
    let client = c
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(
        "a worker to take the long action",
        Duration::from_secs(30),
        || w[0].leases() + w[1].leases() > 20,
    );
    let k = if w[0].leases() > n[0] { 0 } else { 1 };
    wait_until(
        "its build to mount its view",
        Duration::from_secs(30),
        || !w[k].mounts().is_empty(),
    );
    w[k].kill9();
    assert!(
        !w[k].mounts().is_empty(),
        "the killed worker's build left nothing mounted?"
    );
    let o = wait_for_child(client, CLIENT_LIMIT).expect("the long action did not finish");
    ok(&o, "the long action after its worker was killed");
    assert_eq!(fs::read_to_string(out.join("done")).unwrap(), "ok\n");
    let other = 1 - k;
    assert_eq!(
        done(&w[other]),
        finished[other] + 1,
        "the other worker did not complete it: {}",
        w[other].log()
    );
    // The killed worker, restarted, cleans up what it left behind.
    w[k].start();
    assert!(
        w[k].mounts().is_empty(),
        "left mounted after restart: {:?}",
        w[k].mounts()
    );
}

/// What a hostile action leaves, sent through Bazel to `fhsx worker
/// --reapi`: a working tree nested deeper than the store takes is refused
/// naming the limit, and a chain 1,200 deep left in the
/// scratch is removed and the action succeeds; the worker serves on (a
/// good build after them), with nothing left mounted.
#[test]
fn what_hostile_actions_leave_through_bazel_is_refused_or_removed_and_the_worker_serves_on() {
    let t = tempfile::tempdir().unwrap();
    let e = Engine::start(t.path(), 10);
    let w = Worker::new(t.path(), &e, "w1", 2);
    let tc = toolchain_id(&seed().gxx);
    // (name, command before writing the declared output, what Bazel shows)
    let cases = [
        (
            "deep_tree",
            "(for i in $$(seq 1100); do mkdir d && cd d; done)",
            Some("more than 1024 deep"),
        ),
        (
            "deep_scratch",
            "(cd /build && mkdir junk && cd junk && for i in $$(seq 1200); do mkdir d && cd d; done)",
            None,
        ),
    ];
    let mut rules = String::new();
    for (name, script, _) in &cases {
        rules.push_str(&format!(
            "genrule(\n    name = \"{name}\",\n    outs = [\"{name}.out\"],\n    cmd = \"{script}; echo x > $@\",\n)\n"
        ));
    }
    let ws = t.path().join("ws");
    workspace(&ws, &rules);
    let root = t.path().join("bazel-root");
    for (name, _, want) in &cases {
        let o = run(
            bazel_cmd(&ws, &root, &e, &tc, &["build", &format!("//:{name}")]),
            "bazel",
        );
        let s = text(&o);
        match want {
            Some(want) => {
                assert!(!o.status.success(), "{name} built: {s}");
                assert!(s.contains(want), "{name}: Bazel did not show {want:?}: {s}");
            }
            None => ok(&o, name),
        }
    }
    let o = run(
        bazel_cmd(&ws, &root, &e, &tc, &["build", "//:hello"]),
        "bazel",
    );
    ok(&o, "a good build after the hostile ones");
    assert!(w.mounts().is_empty(), "{:?}", w.mounts());
}

/// A Debian root for BuildStream to import, made as fhsx makes a
/// toolchain's: `gcc` and `libc6-dev` with the essential set, pinned by
/// `fhsx toolchain apt` (in a copy of the seed's store, which holds their
/// atoms, so nothing is downloaded), composed and exported as a tarball,
/// unpacked at `dest`. Returns that store and the toolchain file, for
/// `fhsx build` to run on the same packages.
fn debian_root(dir: &Path, dest: &Path) -> (PathBuf, PathBuf) {
    let store = dir.join("root-store");
    seed_copy(&store);
    let tc = dir.join("gcc.toolchain");
    let o = fhsx(&store)
        .args(["toolchain", "apt", "--essential", "gcc", "libc6-dev", "-o"])
        .arg(&tc)
        .output()
        .unwrap();
    ok(&o, "fhsx toolchain apt (needs apt and `apt-get update`)");
    let atoms: Vec<String> = fs::read_to_string(&tc)
        .unwrap()
        .lines()
        .filter_map(|l| l.strip_prefix("atom = \""))
        .map(|a| a.trim_end_matches('"').to_owned())
        .collect();
    let o = fhsx(&store).arg("compose").args(&atoms).output().unwrap();
    ok(&o, "fhsx compose");
    let view = String::from_utf8_lossy(&o.stdout).trim().to_owned();
    let tar = dir.join("root.tar");
    let o = fhsx(&store)
        .args(["materialize", "--tier", "export", &view])
        .arg(&tar)
        .output()
        .unwrap();
    ok(&o, "fhsx materialize --tier export");
    fs::create_dir_all(dest).unwrap();
    let o = Command::new("tar")
        .arg("-xf")
        .arg(&tar)
        .arg("-C")
        .arg(dest)
        .output()
        .expect("tar is needed: `apt-get install tar`");
    ok(&o, "tar -x");
    fs::remove_file(&tar).unwrap();
    (store, tc)
}

/// What a hostile BuildStream element's build command tries (`/SECRET`: a
/// file of the host's), and the text fhsx's diagnostic follows: write to
/// the root's /etc and /usr and beside its working directory, read the
/// host's file directly and through /proc/1/root.
const BST_HOSTILE: [(&str, &str, &str); 5] = [
    (
        "etc",
        "echo pwned > /etc/fhsx-bst-pwned",
        "/etc/fhsx-bst-pwned: ",
    ),
    (
        "usr",
        "echo pwned > /usr/fhsx-bst-pwned",
        "/usr/fhsx-bst-pwned: ",
    ),
    ("beside", "echo pwned > ../pwned", "../pwned: "),
    ("host-file", "cat /SECRET", "/SECRET: "),
    (
        "proc-root",
        "cat /proc/1/root/SECRET",
        "/proc/1/root/SECRET: ",
    ),
];

/// A BuildStream 2 project in `dir/project`: `sysroot.bst` imports
/// `dir/project/sysroot`, `hello.bst` compiles a C program with its gcc and
/// installs it in /usr/bin, and `hostile-NAME.bst` runs one of
/// [`BST_HOSTILE`]'s commands on `secret`. Its user configuration sends every build to
/// the engine and keeps all BuildStream caches in `dir/cache`.
fn bst_project(dir: &Path, engine: &Engine, secret: &Path) {
    let p = dir.join("project");
    fs::create_dir_all(p.join("elements")).unwrap();
    fs::create_dir_all(p.join("files")).unwrap();
    fs::write(
        p.join("project.conf"),
        "name: fhsx-hello\nmin-version: 2.0\nelement-path: elements\n",
    )
    .unwrap();
    fs::write(
        p.join("elements/sysroot.bst"),
        // An integration command, which BuildStream runs with the whole
        // root writable before each element that depends on it builds.
        "kind: import\nsources:\n- kind: local\n  path: sysroot\npublic:\n  bst:\n    integration-commands:\n    - echo integrated > /etc/fhsx-integrated\n",
    )
    .unwrap();
    fs::write(
        p.join("files/hello.c"),
        "#include <stdio.h>\nint main(void) { puts(\"hello from BuildStream on fhsx\"); return 0; }\n",
    )
    .unwrap();
    fs::write(
        p.join("elements/hello.bst"),
        r#"kind: manual
build-depends:
- sysroot.bst
sources:
- kind: local
  path: files/hello.c
config:
  build-commands:
  - cat /etc/fhsx-integrated
  - gcc -O2 -o hello hello.c
  install-commands:
  - install -D -m 0755 hello %{install-root}%{bindir}/hello
"#,
    )
    .unwrap();
    for (name, script, _) in BST_HOSTILE {
        let script = with_secret(script, secret);
        fs::write(
            p.join(format!("elements/hostile-{name}.bst")),
            format!(
                "kind: manual\nbuild-depends:\n- sysroot.bst\nconfig:\n  build-commands:\n  - {script:?}\n"
            ),
        )
        .unwrap();
    }
    let cache = dir.join("cache");
    let url = engine.http();
    fs::write(
        dir.join("user.conf"),
        format!(
            r#"cachedir: {cache}
logdir: {cache}/logs
sourcedir: {cache}/sources
logging:
  error-lines: 80
remote-execution:
  execution-service:
    url: {url}
  storage-service:
    url: {url}
  action-cache-service:
    url: {url}
"#,
            cache = cache.display()
        ),
    )
    .unwrap();
}

/// `bst` on [`bst_project`]'s project. Its home, XDG directories and
/// temporary files are `dir`'s, so it reads no configuration of the host's
/// and leaves nothing outside `dir`.
fn bst(dir: &Path, args: &[&str]) -> Command {
    for d in ["home", "config", "data", "tmp"] {
        fs::create_dir_all(dir.join(d)).unwrap();
    }
    let mut c = Command::new(buildstream().join("bin/bst"));
    c.env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("LANG", "C.UTF-8")
        .env("HOME", dir.join("home"))
        .env("XDG_CONFIG_HOME", dir.join("config"))
        .env("XDG_DATA_HOME", dir.join("data"))
        .env("XDG_CACHE_HOME", dir.join("cache"))
        .env("TMPDIR", dir.join("tmp"))
        .args([
            "--no-interactive",
            "--no-colors",
            "--on-error",
            "quit",
            "-c",
        ])
        .arg(dir.join("user.conf"))
        .arg("-C")
        .arg(dir.join("project"))
        .args(args);
    c
}

/// A [`BST_HOSTILE`] string naming the file `secret`.
fn with_secret(s: &str, secret: &Path) -> String {
    let path = secret.to_str().unwrap();
    s.replace("SECRET", path.trim_start_matches('/'))
}

/// The rest of the first line of `s` holding `want`, after it: the
/// diagnostic, whichever program prefixed it.
fn after(s: &str, want: &str) -> Option<String> {
    s.lines()
        .find(|l| l.contains(want))
        .map(|l| l.rsplit(want).next().unwrap_or("").to_owned())
}

/// BuildStream 2.8.1 builds a C program remotely on two fhsx workers. Its
/// action names no toolchain: the input root is the build's `/` (a Debian
/// root fhsx composed and exported, which BuildStream imports), with the
/// working directory and the install root writable; the sysroot's
/// integration command runs first, with every top-level directory
/// writable, and the build sees what it wrote. The artifact holds
/// the binary, which runs on the host; with BuildStream's local cache
/// deleted, the rebuild is answered from the engine's action cache and no
/// worker runs anything. A hostile element fails as the same command fails
/// under `fhsx build` (the same diagnostic, nothing written on the host,
/// no secret of the host's read), and the workers leave nothing mounted.
#[test]
fn buildstream_builds_remotely_on_fhsx_workers_and_rebuilds_from_the_remote_cache() {
    buildstream();
    let t = tempfile::tempdir().unwrap();
    let dir = t.path().join("bst");
    let (root_store, tc) = debian_root(t.path(), &dir.join("project/sysroot"));
    let secret = t.path().join("host-secret");
    fs::write(&secret, "host secret 5f0c2e\n").unwrap();
    let e = Engine::start(t.path(), 10);
    bst_project(&dir, &e, &secret);
    let w = [
        Worker::new(t.path(), &e, "wa", 1),
        Worker::new(t.path(), &e, "wb", 1),
    ];
    let leases = || w.iter().map(Worker::leases).sum::<usize>();
    let logs = || {
        w.iter()
            .map(Worker::log)
            .collect::<Vec<_>>()
            .join("\n---\n")
    };

    let o = run(bst(&dir, &["build", "hello.bst"]), "bst build");
    let s = text(&o);
    assert!(o.status.success(), "bst build: {s}\n{}", logs());
    // The import runs nothing; the manual element is two actions: the
    // sysroot's integration command (the whole root writable) and its
    // build commands (the root read-only, on the integrated root).
    assert_eq!(leases(), 2, "{s}\n{}", logs());
    assert_eq!(logs().matches(" done: record ").count(), 2, "{}", logs());
    let out = t.path().join("checkout");
    let mut c = bst(
        &dir,
        &[
            "artifact",
            "checkout",
            "--no-integrate",
            "--deps",
            "none",
            "--directory",
        ],
    );
    c.arg(&out).arg("hello.bst");
    ok(&run(c, "bst artifact checkout"), "bst artifact checkout");
    let o = Command::new(out.join("usr/bin/hello")).output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        "hello from BuildStream on fhsx\n"
    );

    fs::remove_dir_all(dir.join("cache")).unwrap();
    let o = run(bst(&dir, &["build", "hello.bst"]), "bst build");
    let s = text(&o);
    assert!(o.status.success(), "bst rebuild: {s}\n{}", logs());
    assert!(s.contains("Action result found in action cache"), "{s}");
    assert_eq!(leases(), 2, "the rebuild ran something: {}", logs());

    for (name, script, want) in BST_HOSTILE {
        let (script, want) = (with_secret(script, &secret), with_secret(want, &secret));
        let before = leases();
        let o = run(
            bst(&dir, &["build", &format!("hostile-{name}.bst")]),
            "bst build",
        );
        let s = text(&o);
        assert!(!o.status.success(), "hostile-{name}.bst built: {s}");
        assert!(
            s.contains("FAILURE Build"),
            "{name}: bst reported no failure: {s}"
        );
        // Its integration (its own: its build directory is in the root)
        // and its build commands.
        assert_eq!(
            leases(),
            before + 2,
            "{name}: not two actions on the workers: {s}\n{}",
            logs()
        );
        assert!(
            !s.contains("host secret"),
            "{name}: the host's file was read: {s}"
        );

        // The same command through `fhsx build`, on the same packages.
        let local = t.path().join(format!("local-{name}"));
        fs::create_dir_all(&local).unwrap();
        fs::write(
            local.join("a.toml"),
            format!(
                "[inputs]\ntoolchain = [{:?}]\n[run]\ncommand = [\"/bin/sh\", \"-c\", {:?}]\n",
                tc.display().to_string(),
                format!("mkdir -p $out; {script}")
            ),
        )
        .unwrap();
        let o = fhsx(&root_store)
            .arg("build")
            .arg(local.join("a.toml"))
            .output()
            .unwrap();
        let l = text(&o);
        assert_eq!(o.status.code(), Some(1), "{name} with fhsx build: {l}");
        let diagnostic = after(&l, &want);
        assert!(
            diagnostic.is_some(),
            "{name}: fhsx build said no {want:?}: {l}"
        );
        assert_eq!(
            diagnostic,
            after(&s, &want),
            "{name}: not the same failure through BuildStream and fhsx build:\n{l}\n---\n{s}"
        );
    }
    for p in ["/etc/fhsx-bst-pwned", "/usr/fhsx-bst-pwned"] {
        assert!(!Path::new(p).exists(), "{p} was written on the host");
    }
    for w in &w {
        assert!(w.mounts().is_empty(), "{:?}", w.mounts());
    }
}
