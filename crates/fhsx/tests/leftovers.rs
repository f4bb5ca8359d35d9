//! What a build leaves behind is an attacker's input to the host side,
//! which handles it as root: trees deeper than any path, more entries than
//! any honest output, sparse files far past the disk limit, messages over
//! the RPC bridge. Each test leaves one from inside a real build (real
//! bwrap, the real FUSE view, the real scratch file system) and asserts
//! that fhsx took it or refused it cleanly: it exits with the error that
//! names the cause, signs the failed record, leaves no mount, area or
//! process, keeps its store consistent, and prints nothing raw.
//!
//! The probe is tests/leftovers/leave.c, compiled static on the host.

mod support;

use std::fs;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

use support::{busybox, fhsx, gcc_static, import, no_leftovers, text};

fn leave_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/leftovers/leave.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("leftovers-leave-{}", std::process::id()));
        gcc_static(&src, &out);
        out
    })
    .clone()
}

/// One test's store, holding busybox and the probe (`/usr/bin/leave`).
struct World {
    dir: tempfile::TempDir,
    store: PathBuf,
    closure: String,
}

impl World {
    fn new() -> World {
        let dir = tempfile::Builder::new()
            .prefix("leftovers-")
            .tempdir()
            .unwrap();
        let store = dir.path().join("store");
        let bb = busybox(&store);
        let atom = dir.path().join("leave-atom");
        fs::create_dir_all(atom.join("usr/bin")).unwrap();
        fs::copy(leave_bin(), atom.join("usr/bin/leave")).unwrap();
        let leave = import(&store, &atom);
        World {
            closure: format!("{bb:?}, {leave:?}"),
            dir,
            store,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    fn action(&self, name: &str, script: &str, limits: &str) -> PathBuf {
        let p = self.path().join(name);
        fs::write(
            &p,
            format!(
                "[inputs]\nclosure = [{}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {:?}]\ntimeout = \"300s\"\n[limits]\n{limits}",
                self.closure,
                format!("busybox mkdir -p $out; {script}")
            ),
        )
        .unwrap();
        p
    }

    /// `fhsx --json build --rebuild ACTION`, with at most `nofile` open
    /// descriptors if given (else the caller's limit).
    fn build(&self, action: &Path, nofile: Option<u64>) -> (Output, serde_json::Value) {
        let mut c: Command = fhsx(&self.store);
        c.args(["--json", "build", "--rebuild"]).arg(action);
        if let Some(n) = nofile {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs
            // between fork and exec.
            unsafe {
                c.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let o = c.output().unwrap();
        let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
        (o, v)
    }

    fn blob(&self, digest: &serde_json::Value) -> Vec<u8> {
        let o = fhsx(&self.store)
            .args(["store", "blob", digest.as_str().unwrap()])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        o.stdout
    }

    /// The store is consistent, and nothing of the build is left behind.
    fn clean(&self) {
        let o = fhsx(&self.store)
            .args(["store", "verify"])
            .output()
            .unwrap();
        assert!(o.status.success(), "store damaged: {}", text(&o));
        no_leftovers(self.path());
        assert_no_process_of(self.path());
    }

    /// Build `action`, which fhsx must refuse for what it left: exit 1,
    /// an error naming each of `why`, a signed record, the store grown by
    /// the record and the log alone, nothing left behind. The result.
    fn refused(&self, action: &Path, nofile: Option<u64>, why: &[&str]) -> serde_json::Value {
        let before = self.store_bytes();
        let (o, v) = self.build(action, nofile);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        let err = v["error"].as_str().unwrap_or_default();
        for w in why {
            assert!(err.contains(w), "{w:?} not in {v}");
        }
        assert!(v["record"].is_string(), "no signed record: {v}");
        assert!(self.store_bytes() - before < 1 << 20, "the store grew");
        self.clean();
        v
    }

    /// Bytes the store's objects take, at their apparent size.
    fn store_bytes(&self) -> u64 {
        let mut total = 0;
        let mut stack = vec![self.store.clone()];
        while let Some(d) = stack.pop() {
            for e in fs::read_dir(&d).unwrap().flatten() {
                let m = e.metadata().unwrap();
                if m.is_dir() {
                    stack.push(e.path());
                } else {
                    total += m.len();
                }
            }
        }
        total
    }
}

/// No process is left running with this test's directory in its command
/// line (a view daemon, a build).
fn assert_no_process_of(dir: &Path) {
    let needle = dir.to_string_lossy().into_owned();
    for p in fs::read_dir("/proc").unwrap().flatten() {
        let Ok(cmd) = fs::read(p.path().join("cmdline")) else {
            continue;
        };
        let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
        assert!(!cmd.contains(&needle), "a process is left: {cmd}");
    }
}

fn stderr_has_no_control_bytes(o: &Output) {
    let bad: Vec<_> = o
        .stderr
        .iter()
        .filter(|b| b.is_ascii_control() && **b != b'\n' && **b != b'\t')
        .collect();
    assert!(
        bad.is_empty(),
        "raw control bytes on fhsx's stderr: {}",
        text(o)
    );
}

/// A build that succeeds after leaving a chain of 30,000 directories in
/// its scratch (far past `PATH_MAX`, one descriptor a level would pass
/// `ulimit -n 1024`): fhsx removes it and exits 0, on a low and a high
/// descriptor limit alike.
#[test]
fn a_30000_deep_chain_left_in_the_scratch_is_removed() {
    let w = World::new();
    let a = w.action(
        "deep-scratch.toml",
        "busybox mkdir /build/junk && leave chain /build/junk 30000 && echo ok > $out/f",
        "",
    );
    for nofile in [Some(1024), None] {
        let (o, v) = w.build(&a, nofile);
        assert!(o.status.success(), "ulimit -n {nofile:?}: {}", text(&o));
        let log = String::from_utf8_lossy(&w.blob(&v["log"])).into_owned();
        assert!(log.contains("CHAIN 30000"), "{log}");
        w.clean();
    }
}

/// A chain in `$out` far deeper than the store takes and than any path
/// can name (20,000 levels: the kernel sets no limit but the disk) is
/// refused at ingest, naming where and the limit, as a failed build with
/// a signed record; nothing of it reaches the store.
#[test]
fn the_deepest_chain_in_an_output_is_refused_naming_the_limit() {
    let w = World::new();
    let a = w.action("deep-out.toml", "leave chain $out 20000", "");
    for nofile in [Some(1024), None] {
        let v = w.refused(&a, nofile, &["more than 1024 deep", "$out/d/d/d"]);
        let log = String::from_utf8_lossy(&w.blob(&v["log"])).into_owned();
        assert!(log.contains("CHAIN 20000"), "{log}");
    }
}

/// A 1 GiB sparse file under `disk = 64 MiB` counts at its apparent size
/// against `[limits] output` (unset: the disk limit), so it is refused and
/// the store does not grow by it.
#[test]
fn a_sparse_gibibyte_cannot_grow_the_store_past_the_output_limit() {
    let w = World::new();
    let a = w.action(
        "sparse.toml",
        "leave sparse $out/big 1073741824",
        "disk = 67108864\n",
    );
    w.refused(&a, None, &["$out/big", "67108864 bytes ([limits] output"]);
    // Set explicitly, the limit is the output's own.
    let a = w.action(
        "sparse-ok.toml",
        "leave sparse $out/big 1048576",
        "disk = 67108864\noutput = 1000000\n",
    );
    w.refused(&a, None, &["1000000 bytes"]);
}

/// Past `[limits] output_entries` the outputs are refused; hard links
/// make them cheap for the build, not for ingest.
#[test]
fn outputs_past_their_entry_limit_are_refused() {
    let w = World::new();
    let a = w.action(
        "wide.toml",
        "leave links $out 1500",
        "output_entries = 1000\n",
    );
    w.refused(
        &a,
        None,
        &["limit of 1000 entries ([limits] output_entries)"],
    );
    let a = w.action(
        "wide-ok.toml",
        "leave links $out 900",
        "output_entries = 1000\n",
    );
    let (o, _) = w.build(&a, None);
    assert!(o.status.success(), "{}", text(&o));
    w.clean();
}

/// A log line sent over the bridge cannot drive the operator's terminal
/// (OSC 52 clipboard write, a carriage return over a forged `fhsx:` line),
/// nor pick a level outside the set; nor can the build's own output.
#[test]
fn bridge_messages_and_output_reach_the_terminal_escaped() {
    let w = World::new();
    let a = w.action(
        "inject.toml",
        r"leave bridge 1 info 'ok\x1b]52;c;cHduZWQ=\x07\x0d\x0afhsx: error: forged' && leave bridge 1 'info\x1b[2J' m && printf '\033]0;title\007\rfhsx: error: forged too\n'",
        "",
    );
    let (o, v) = w.build(&a, None);
    assert!(o.status.success(), "{}", text(&o));
    stderr_has_no_control_bytes(&o);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.lines().any(|l| l.starts_with("fhsx: error: forged")),
        "{err}"
    );
    let log = String::from_utf8_lossy(&w.blob(&v["log"])).into_owned();
    assert!(
        log.contains(r"[sandbox info] ok\x1b]52;c;cHduZWQ=\x07\x0d\x0afhsx: error: forged"),
        "{log}"
    );
    // The refusal as the probe printed it (JSON-quoted): the level escaped.
    assert!(
        log.contains(r#"unknown log level \"info\\x1b[2J\": use one of"#),
        "{log}"
    );
    w.clean();
}

/// Log lines over the bridge count against `[limits] log` like the
/// build's own output: a flood of them stops the build as a limit failure.
#[test]
fn a_bridge_log_flood_is_stopped_at_limits_log() {
    let w = World::new();
    let line = "x".repeat(1000);
    let a = w.action(
        "bridge-flood.toml",
        &format!("leave bridge 5000 info {line}"),
        "log = 1048576\n",
    );
    let (o, v) = w.build(&a, None);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        v["error"]
            .as_str()
            .unwrap_or_default()
            .contains("[limits] log"),
        "{v}"
    );
    assert!(w.blob(&v["log"]).len() <= (1 << 20) + 4096);
    w.clean();
}

/// `fhsx worker` on loopback (TCP with its own TLS), killed when dropped.
struct Worker {
    child: std::process::Child,
    addr: String,
}

impl Worker {
    fn start(store: &Path, tmp: &Path, jobs: usize) -> Worker {
        let jobs = jobs.to_string();
        let (child, addr) = support::spawn_worker(
            store,
            tmp,
            &["--scratch-pool", "1", "--jobs", &jobs],
            std::process::Stdio::null(),
        );
        Worker { child, addr }
    }
}

impl Worker {
    /// Stop it as an operator would (SIGTERM), and wait for it to go.
    fn stop(mut self) -> std::process::ExitStatus {
        // SAFETY: signalling our own child by its pid.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A chain of `n` directories in `store`, made object by object as a
/// client could upload it (no disk tree this deep is importable).
fn stored_chain(store: &Path, n: usize) -> String {
    use castore::store::DirectoryStore;
    let s = castore::LocalStore::open(store).unwrap();
    let mut top = s.put_directory(&castore::Directory::new()).unwrap();
    let mut size = 0;
    for _ in 0..n {
        let mut d = castore::Directory::new();
        d.insert(
            castore::Name::new(b"d").unwrap(),
            castore::Node::Directory { digest: top, size },
        )
        .unwrap();
        size = d.size();
        top = s.put_directory(&d).unwrap();
    }
    top.to_string()
}

/// Each thing a hostile build leaves, and a client's input tree deeper
/// than the store takes, sent through `fhsx worker` while an honest
/// client builds beside it: each is refused or taken as by `fhsx build`,
/// the honest builds all succeed, and the worker serves on with nothing
/// left mounted.
#[test]
fn a_worker_outlives_what_hostile_builds_leave() {
    let w = World::new();
    let honest_store = w.path().join("honest-store");
    let honest_bb = busybox(&honest_store);
    let honest = w.path().join("honest.toml");
    fs::write(
        &honest,
        format!("[inputs]\nclosure = [\"{honest_bb}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir $out; busybox sleep 1; echo fine > $out/f\"]\n"),
    )
    .unwrap();
    let deep_input = stored_chain(&w.store, 3000);
    let uploaded = w.path().join("deep-input.toml");
    fs::write(
        &uploaded,
        format!("[inputs]\nclosure = [{}, \"{deep_input}\"]\n[run]\ncommand = [\"/bin/busybox\", \"true\"]\n", w.closure),
    )
    .unwrap();
    let cases = [
        (
            w.action("w-deep-scratch.toml", "busybox mkdir /build/junk && leave chain /build/junk 30000", ""),
            0,
            "",
        ),
        (
            w.action("w-deep-out.toml", "leave chain $out 5000", ""),
            1,
            "more than 1024 deep",
        ),
        (
            w.action("w-sparse.toml", "leave sparse $out/big 1073741824", "disk = 67108864\n"),
            1,
            "([limits] output",
        ),
        (
            w.action("w-bridge.toml", "leave bridge 5000 info xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", "log = 65536\n"),
            1,
            "[limits] log",
        ),
        (uploaded, 2, "more than 1024 deep"),
    ];
    let tmp = w.path().join("worker-tmp");
    fs::create_dir(&tmp).unwrap();
    let worker = Worker::start(&w.path().join("worker-store"), &tmp, 2);
    for (action, code, why) in &cases {
        let hostile = fhsx(&w.store)
            .args(["--json", "build", "--rebuild", "--remote", &worker.addr])
            .arg(action)
            .output();
        let fine = fhsx(&honest_store)
            .args(["--json", "build", "--rebuild", "--remote", &worker.addr])
            .arg(&honest)
            .output()
            .unwrap();
        let hostile = hostile.unwrap();
        assert!(
            fine.status.success(),
            "{}: the honest build failed: {}",
            action.display(),
            text(&fine)
        );
        assert_eq!(
            hostile.status.code(),
            Some(*code),
            "{}: {}",
            action.display(),
            text(&hostile)
        );
        assert!(
            text(&hostile).contains(why),
            "{}: {}",
            action.display(),
            text(&hostile)
        );
        stderr_has_no_control_bytes(&hostile);
    }
    // Still serving, and nothing of the builds left mounted.
    let again = fhsx(&honest_store)
        .args(["build", "--rebuild", "--remote", &worker.addr])
        .arg(&honest)
        .output()
        .unwrap();
    assert!(
        again.status.success(),
        "the worker stopped serving: {}",
        text(&again)
    );
    // Its pool goes with it.
    assert!(worker.stop().success());
    no_leftovers(&tmp);
}

/// A stored tree deeper than the store takes (as a client could upload
/// one to a worker's store) is refused by the commands whose walks
/// recurse, naming the limit, and verified by `store verify`, whose walk
/// does not: none of them crashes.
#[test]
fn store_commands_refuse_or_walk_a_stored_tree_of_any_depth() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let deep = stored_chain(&store, 3000);
    for args in [
        vec!["store", "export", &deep, "exported"],
        vec!["materialize", &deep, "fast"],
        vec!["materialize", "--tier", "export", &deep, "view.tar"],
    ] {
        let o = fhsx(&store)
            .current_dir(t.path())
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", text(&o));
        assert!(
            text(&o).contains("more than 1024 deep"),
            "{args:?}: {}",
            text(&o)
        );
    }
    let o = fhsx(&store).args(["store", "verify"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
}
