//! Helpers shared by fhsx's integration tests: the binary, real Debian
//! packages fetched once per target directory, imports.
#![allow(dead_code)]

use std::fs;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// The fhsx binary; `FHSX_HOSTILE_EXE` names a copy an unprivileged user
/// can run (the hostile suite's non-root pass).
pub fn fhsx_exe() -> PathBuf {
    std::env::var_os("FHSX_HOSTILE_EXE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_fhsx")))
}

pub fn fhsx(store: &Path) -> Command {
    let mut c = Command::new(fhsx_exe());
    c.arg("--store").arg(store);
    // Builds keep their scratch next to the store, so leftovers are visible per test.
    if let Some(parent) = store.parent() {
        passable(parent);
        c.env("TMPDIR", parent);
    }
    // No scratch file system parked in a test's directory, which goes
    // (with its mounts, were any left) when the test ends; the pool has
    // its own tests (tests/scratch_pool.rs), which set it.
    c.env("FHSX_SCRATCH_POOL", "0");
    c
}

/// As root, builds run as build users, which must pass through `$TMPDIR`
/// to their working area: give a test's own (0700) directory `o+x`, as
/// /tmp has it.
pub fn passable(dir: &Path) {
    use std::os::unix::fs::PermissionsExt;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return;
    }
    if let Ok(m) = fs::metadata(dir) {
        let mode = m.permissions().mode() & 0o7777;
        if mode & 0o001 == 0 {
            let _ = fs::set_permissions(dir, fs::Permissions::from_mode(mode | 0o011));
        }
    }
}

/// `fhsx --json build FLAGS… ACTION`: the process's output and the JSON
/// result (null when there is none).
pub fn build_json(store: &Path, action: &Path, flags: &[&str]) -> (Output, serde_json::Value) {
    let o = fhsx(store)
        .args(["--json", "build"])
        .args(flags)
        .arg(action)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o, v)
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Real inputs, fetched once per target dir: `debs/`, the `.deb`s of a C
/// toolchain (`fhsx toolchain apt --essential gcc make libc6-dev`, kept by
/// its `--deb-cache`), `fetch-debs/` busybox-static's, and `src/` GNU
/// hello's upstream tarball (examples/hello/fetch-source.sh).
pub fn inputs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hello-inputs");
        let store = dir.join("store");
        for (cache, file, pkgs) in [
            (
                "debs",
                "gcc.toolchain",
                &["--essential", "gcc", "make", "libc6-dev"][..],
            ),
            ("fetch-debs", "busybox.toolchain", &["busybox-static"][..]),
        ] {
            let o = fhsx(&store)
                .args(["toolchain", "apt"])
                .args(pkgs)
                .arg("--deb-cache")
                .arg(dir.join(cache))
                .arg("-o")
                .arg(dir.join(file))
                .output()
                .expect("run fhsx toolchain apt");
            assert!(
                o.status.success(),
                "fetching Debian packages failed (needs apt-get and `apt-get update`): {}",
                text(&o)
            );
        }
        let o = Command::new(repo().join("examples/hello/fetch-source.sh"))
            .arg(&dir)
            .output()
            .expect("run examples/hello/fetch-source.sh");
        assert!(
            o.status.success(),
            "fetching hello's source failed (needs apt-get's deb-src access): {}",
            text(&o)
        );
        dir
    })
}

/// `gcc -static` of the test program `src` into `out` (the probes run
/// inside the sandbox, whose root has no libc of the host's).
pub fn gcc_static(src: &Path, out: &Path) {
    let o = Command::new("gcc")
        .args(["-static", "-O1", "-Wall", "-o"])
        .arg(out)
        .arg(src)
        .output()
        .expect("gcc is needed to build the test probes: `apt-get install gcc libc6-dev`");
    assert!(
        o.status.success(),
        "gcc -static failed (needs `apt-get install gcc libc6-dev`): {}",
        text(&o)
    );
}

pub fn import(store: &Path, p: &Path) -> String {
    let o = fhsx(store)
        .args(["store", "import"])
        .arg(p)
        .output()
        .unwrap();
    assert!(o.status.success(), "import {}: {}", p.display(), text(&o));
    String::from_utf8_lossy(&o.stdout)
        .split('\t')
        .next()
        .unwrap()
        .to_owned()
}

/// busybox-static's .deb: fetched once per target dir, or the copy
/// `FHSX_HOSTILE_BUSYBOX` hands in (the hostile suite's non-root pass, which
/// cannot run the fetch).
pub fn busybox_deb() -> PathBuf {
    if let Some(p) = std::env::var_os("FHSX_HOSTILE_BUSYBOX") {
        return PathBuf::from(p);
    }
    fs::read_dir(inputs().join("fetch-debs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("busybox-static"))
        .expect("busybox-static .deb (support::inputs fetches it)")
}

/// A closure of one real Debian package: busybox-static.
pub fn busybox(store: &Path) -> String {
    import(store, &busybox_deb())
}

/// A loopback HTTP server answering every GET with `body`; returns its port
/// and a stop flag. Stands in for an upstream mirror.
pub fn mirror(body: &'static [u8]) -> (u16, std::sync::Arc<std::sync::atomic::AtomicBool>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    listener.set_nonblocking(true).unwrap();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    std::thread::spawn(move || {
        while !flag.load(Ordering::SeqCst) {
            match listener.accept() {
                Ok((mut s, _)) => {
                    s.set_nonblocking(false).unwrap();
                    let mut buf = [0u8; 4096];
                    let _ = s.read(&mut buf);
                    let head = format!(
                        "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nContent-Type: application/octet-stream\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = s.write_all(head.as_bytes());
                    let _ = s.write_all(body);
                }
                Err(_) => std::thread::sleep(std::time::Duration::from_millis(5)),
            }
        }
    });
    (port, stop)
}

/// No mount and no build directory left behind in `dir`, where this test's
/// builds keep their scratch (`TMPDIR`). Tests run in parallel, so other
/// tests' live mounts elsewhere are not ours to judge.
pub fn no_leftovers(dir: &Path) {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let d = dir.to_string_lossy();
    assert!(
        !mounts.contains(d.as_ref()),
        "a mount is left under {d}:\n{mounts}"
    );
    let left: Vec<_> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("fhsx-build-"))
        .map(|e| e.path())
        .collect();
    assert!(left.is_empty(), "build directories left behind: {left:?}");
}

/// `tests/probes/scratch_probe.c`, built static, as an atom at
/// `/usr/bin/scratch-probe`.
pub fn scratch_probe(store: &Path, dir: &Path) -> String {
    let tree = dir.join("probe-tree");
    fs::create_dir_all(tree.join("usr/bin")).unwrap();
    gcc_static(
        Path::new(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/probes/scratch_probe.c"
        )),
        &tree.join("usr/bin/scratch-probe"),
    );
    import(store, &tree)
}

/// `fhsx --store STORE worker --listen 127.0.0.1:0 ARGS…` with `TMPDIR`
/// at `tmp` (made passable), its stderr to `stderr`: the process and the
/// address it says it listens on.
pub fn spawn_worker(
    store: &Path,
    tmp: &Path,
    args: &[&str],
    stderr: std::process::Stdio,
) -> (std::process::Child, String) {
    use std::io::BufRead;
    passable(tmp);
    let mut child = Command::new(fhsx_exe())
        .arg("--store")
        .arg(store)
        .args(["worker", "--listen", "127.0.0.1:0"])
        .args(args)
        .env("TMPDIR", tmp)
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line
        .split_whitespace()
        .nth(4)
        .unwrap_or_else(|| panic!("the worker did not say where it listens: {line:?}"))
        .to_owned();
    (child, addr)
}

// ---- REAPI servers on loopback: BuildGrid, moto's S3, Bazel ----

pub fn buildgrid() -> PathBuf {
    let dir = std::env::var_os("FHSX_BUILDGRID")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/fhsx-ci/buildgrid"));
    let bgd = dir.join("bin/bgd");
    assert!(
        bgd.exists(),
        "BuildGrid is not installed at {}: run .ci/setup (it makes that venv with Debian's python3: `python3 -m venv {} && {}/bin/pip install buildgrid==0.4.4 psycopg2-binary`), or set FHSX_BUILDGRID",
        dir.display(),
        dir.display(),
        dir.display()
    );
    dir
}

pub fn bazel() -> PathBuf {
    let p = std::env::var_os("FHSX_BAZEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(
                "/opt/fhsx-ci/bazel/node_modules/@bazel/bazel-linux_x64/bazel-2.1.0-linux-x86_64",
            )
        });
    assert!(
        p.exists(),
        "Bazel 2.1.0 is not installed at {}: run .ci/setup (it runs `npm install @bazel/bazel-linux_x64@2.1.0` in /opt/fhsx-ci/bazel), or set FHSX_BAZEL",
        p.display()
    );
    p
}

pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

pub fn wait_port(port: u16, what: &str, log: &Path) {
    let end = Instant::now() + Duration::from_secs(90);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            Instant::now() < end,
            "{what} did not listen on {port}: {}",
            fs::read_to_string(log).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// moto's S3-compatible server on loopback, with the engine's bucket.
pub struct S3 {
    port: u16,
    server: Child,
}

impl S3 {
    pub const BUCKET: &'static str = "fhsx-cas";
    pub const KEY: &'static str = "testing";

    pub fn start(dir: &Path) -> S3 {
        let moto = std::env::var_os("FHSX_MOTO")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from("/opt/fhsx-ci/moto"));
        let bin = moto.join("bin/moto_server");
        assert!(
            bin.exists(),
            "moto is not installed at {}: run .ci/setup (it makes that venv: `python3 -m venv {} && {}/bin/pip install 'moto[server]'`), or set FHSX_MOTO",
            moto.display(),
            moto.display(),
            moto.display()
        );
        let port = free_port();
        let log = dir.join("moto.log");
        let server = Command::new(bin)
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdout(fs::File::create(&log).unwrap())
            .stderr(Stdio::from(fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        wait_port(port, "moto", &log);
        let s3 = S3 { port, server };
        s3.python(&format!("s3.create_bucket(Bucket={:?})", Self::BUCKET));
        s3
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Run `code` with `s3`, a boto3 client of this server (BuildGrid's venv has boto3).
    pub fn python(&self, code: &str) -> String {
        let o = Command::new(buildgrid().join("bin/python"))
            .arg("-c")
            .arg(format!(
                "import boto3\ns3 = boto3.client('s3', endpoint_url={:?}, aws_access_key_id={:?}, aws_secret_access_key={:?}, region_name='us-east-1')\n{code}",
                self.endpoint(),
                Self::KEY,
                Self::KEY
            ))
            .output()
            .unwrap();
        ok(&o, "boto3");
        String::from_utf8_lossy(&o.stdout).trim().to_owned()
    }

    pub fn objects(&self) -> usize {
        self.python(&format!(
            "print(sum(p.get('KeyCount', 0) for p in s3.get_paginator('list_objects_v2').paginate(Bucket={:?})))",
            Self::BUCKET
        ))
        .parse()
        .unwrap()
    }
}

/// BuildGrid's `storages:` entry `&cas`: in memory, or in `s3`.
pub fn buildgrid_storage(s3: Option<&S3>) -> String {
    match s3 {
        None => "  - !lru-storage &cas\n    size: 2048MB\n".to_owned(),
        Some(s3) => format!(
            "  - !s3-storage &cas\n    bucket: {}\n    endpoint: {}\n    access-key: {}\n    secret-key: {}\n",
            S3::BUCKET,
            s3.endpoint(),
            S3::KEY,
            S3::KEY
        ),
    }
}

/// A store of its own at `to` holding `from`'s objects, hard-linked (a
/// store never rewrites an object), without its key, index or state.
pub fn linked_store(from: &Path, to: &Path) {
    let o = Command::new("cp")
        .arg("-al")
        .arg(from)
        .arg(to)
        .output()
        .unwrap();
    ok(&o, "cp -al");
    for x in [
        "keys", "lock", "tmp", "actions", "commands", "history", "memo", "reapi",
    ] {
        let _ = fs::remove_dir_all(to.join(x));
        let _ = fs::remove_file(to.join(x));
    }
}

impl Drop for S3 {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}", text(o));
}

/// The system user `name` (no home, no login shell), to run something
/// as an unprivileged user: made, or there already (useradd's exit 9).
pub fn system_user(name: &str) {
    let add = Command::new("useradd")
        .args([
            "--system",
            "--no-create-home",
            "--shell",
            "/usr/sbin/nologin",
            name,
        ])
        .output()
        .expect("useradd is needed to create the unprivileged test user: `apt-get install passwd`");
    assert!(
        add.status.success() || add.status.code() == Some(9),
        "useradd {name} failed: {}",
        text(&add)
    );
}
