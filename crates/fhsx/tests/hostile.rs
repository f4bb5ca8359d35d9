//! Hostile builds: each action below tries one kind of escape through the
//! whole stack — `fhsx build`, real bwrap, the real FUSE view, the real
//! fetch proxy — and the test asserts it failed, and that the record or the
//! error says so where that applies.
//!
//! Most probes are a small static C program (tests/hostile/attack.c),
//! compiled on the host with `gcc -static` and imported as an atom next to
//! busybox-static (fetched by `fhsx toolchain apt` in tests/support, as in
//! tests/build.rs). A probe prints `BLOCKED …` or `ESCAPED …` per attempt;
//! any `ESCAPED` in the build's log fails the test.
//!
//! Test names start with the contract invariant they prove
//! (spec/executor-sandbox-contract.txt): `no_read_outside_declared_closure`,
//! `no_write_outside_build_scratch`, `no_fetch_outside_recorded_set`,
//! `network_containment` (`[eos-build-sandbox-network-containment]`) and
//! `host_isolation` (`[eos-build-sandbox-host-isolation]`).
//!
//! Run as root (CI) these prove the root path (each build a build user of
//! its own, caps dropped, seccomp, cgroup limits); the build-user tests
//! check, in the unprivileged pass, only that a build runs as its caller. `zz_every_hostile_action_also_
//! fails_as_an_unprivileged_user` then re-runs every other test as a
//! created system user (`FHSX_HOSTILE_EXE`, `FHSX_HOSTILE_ATTACK` and
//! `FHSX_HOSTILE_BUSYBOX` hand in copies it can read): bwrap over user
//! namespaces, pidfd reaper, `RLIMIT_NPROC`, the view mounted and unmounted
//! through the setuid `fusermount3` (which needs `/dev/fuse` mode 0666, as
//! udev sets it on a stock host; `.ci/run` makes it so in containers).

mod support;

use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;
use support::{busybox_deb, fhsx, import, no_leftovers, text};

/// tests/hostile/attack.c, compiled static on the host once per run.
fn attack_bin() -> PathBuf {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        if let Some(p) = std::env::var_os("FHSX_HOSTILE_ATTACK") {
            return PathBuf::from(p);
        }
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/hostile/attack.c");
        let out = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("hostile-attack-{}", std::process::id()));
        support::gcc_static(&src, &out);
        out
    })
    .clone()
}

/// One test's world: a store holding busybox and the probe.
struct World {
    dir: tempfile::TempDir,
    store: PathBuf,
    busybox: String,
    attack: String,
}

impl World {
    fn new() -> World {
        let dir = tempfile::Builder::new()
            .prefix("hostile-")
            .tempdir()
            .unwrap();
        let store = dir.path().join("store");
        let busybox = import(&store, &busybox_deb());
        let atom = dir.path().join("attack-atom");
        fs::create_dir_all(atom.join("opt/hostile")).unwrap();
        fs::copy(attack_bin(), atom.join("opt/hostile/attack")).unwrap();
        let attack = import(&store, &atom);
        World {
            dir,
            store,
            busybox,
            attack,
        }
    }

    fn path(&self) -> &Path {
        self.dir.path()
    }

    /// An action running `script` under busybox sh, the probe at `$A`.
    fn action(&self, name: &str, script: &str, extra: &str) -> PathBuf {
        let body = format!(
            "[inputs]\nclosure = [\"{}\", \"{}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {:?}]\nenv = {{ A = \"/opt/hostile/attack\" }}\ntimeout = \"120s\"\n{extra}",
            self.busybox,
            self.attack,
            format!("busybox mkdir -p $out; {script}")
        );
        let p = self.path().join(name);
        fs::write(&p, body).unwrap();
        p
    }

    fn build(&self, action: &Path) -> (Output, Option<serde_json::Value>) {
        let (o, v, _) = self.build_pid(action);
        (o, v)
    }

    /// [`build`](Self::build), and the PID the `fhsx` process had (its
    /// per-run cgroups are named after it).
    fn build_pid(&self, action: &Path) -> (Output, Option<serde_json::Value>, u32) {
        self.build_pid_with(action, &[])
    }

    /// [`build_pid`](Self::build_pid) with more `fhsx build` flags.
    fn build_pid_with(
        &self,
        action: &Path,
        flags: &[&str],
    ) -> (Output, Option<serde_json::Value>, u32) {
        // --rebuild: a hostile action must really run every time, never be
        // answered from the cache.
        let child = fhsx(&self.store)
            .args(["--json", "build", "--rebuild"])
            .args(flags)
            .arg(action)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let o = child.wait_with_output().unwrap();
        let v = serde_json::from_slice(&o.stdout).ok();
        (o, v, pid)
    }

    fn blob(&self, digest: &str) -> String {
        let o = fhsx(&self.store)
            .args(["store", "blob", digest])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }

    /// The build's log, from the JSON result or (on a containment error)
    /// from the record the error names.
    fn log(&self, o: &Output, v: &Option<serde_json::Value>) -> String {
        if let Some(d) = v.as_ref().and_then(|v| v["log"].as_str()) {
            return self.blob(d);
        }
        let rec = self.record_of(o);
        let shown = self.show(&rec);
        self.blob(shown["record"]["log_digest"].as_str().unwrap())
    }

    /// The record digest an error message names (`the record b3:… says so`).
    fn record_of(&self, o: &Output) -> String {
        let err = text(o);
        err.split_whitespace()
            .find(|w| w.starts_with("b3:") && err.contains(&format!("record {w}")))
            .map(|w| w.trim_end_matches([',', ';', '.']).to_owned())
            .unwrap_or_else(|| panic!("the error names no record: {err}"))
    }

    fn show(&self, record: &str) -> serde_json::Value {
        let o = fhsx(&self.store)
            .args(["--json", "record", "show", record])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    }

    fn export(&self, digest: &str, name: &str) -> PathBuf {
        let out = self.path().join(name);
        let o = fhsx(&self.store)
            .args(["store", "export", digest])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        out
    }

    fn verify_store(&self) {
        let o = fhsx(&self.store)
            .args(["store", "verify"])
            .output()
            .unwrap();
        assert!(o.status.success(), "store damaged: {}", text(&o));
    }
}

/// Every probe reported, none escaped.
fn assert_blocked(log: &str, probes: &[&str]) {
    assert!(!log.contains("ESCAPED"), "an escape worked:\n{log}");
    assert!(!log.contains("SETUP"), "a probe could not set up:\n{log}");
    for p in probes {
        assert!(
            log.contains(&format!("BLOCKED {p}:")),
            "probe {p} did not run:\n{log}"
        );
    }
}

/// A host secret next to the store, at a path the build is told.
fn secret(w: &World) -> (PathBuf, String) {
    let token = format!(
        "HOSTSECRET-{}-{}",
        std::process::id(),
        w.path().display().to_string().len()
    );
    let p = w.path().join("secret.txt");
    fs::write(&p, &token).unwrap();
    (p, token)
}

#[test]
fn no_read_outside_declared_closure_by_path_proc_root_cwd_symlinks_and_dotdot() {
    let w = World::new();
    let (secret, token) = secret(&w);
    let s = secret.display();
    let store = w.store.display();
    let script = format!(
        r#"
        ln -s {s} /build/link-to-secret
        ln -s / /build/link-to-root
        ln -s /proc/1/root /build/link-to-pid1-root
        mkdir -p /build/src/a/b && cd /build/src/a/b
        $A read={s} read=/proc/self/root{s} read=/proc/1/root{s} \
           read=/build/link-to-secret read=/build/link-to-root{s} read=/build/link-to-pid1-root{s} \
           read=../../../../../../..{s} read=/build/../../..{s} read=/proc/self/cwd/../../../../..{s} \
           read=/etc/shadow read=/proc/1/root/etc/shadow read=/root/.bash_history \
           read={store}/keys/executor.ed25519 read=/proc/1/root{store}/keys/executor.ed25519 \
           read=/proc/1/environ read=/proc/1/mem
        for p in /proc/[0-9]*; do $A read=$p/cwd{s} read=$p/root{s} read=$p/cwd/../..{s}; done
        busybox cat /build/link-to-secret 2>/dev/null && echo "ESCAPED cat via planted symlink"
        cp /build/link-to-secret $out/copied 2>/dev/null
        echo BLOCKED shell: done; exit 0
        "#
    );
    let a = w.action("read.toml", &script, "");
    let (o, v) = w.build(&a);
    assert!(o.status.success(), "{}", text(&o));
    let log = w.log(&o, &v);
    assert_blocked(&log, &["read", "shell"]);
    assert!(
        !log.contains(&token),
        "the secret reached the build:\n{log}"
    );
    // Nothing in the output carries it either.
    let out = w.export(
        v.as_ref().unwrap()["outputs"]["out"].as_str().unwrap(),
        "exported",
    );
    for e in walk(&out) {
        if e.is_file() {
            let b = fs::read(&e).unwrap();
            assert!(
                !String::from_utf8_lossy(&b).contains(&token),
                "{} carries the host secret",
                e.display()
            );
        }
    }
    no_leftovers(w.path());
}

/// Ingest happens on the host, after the build: an output path whose
/// parent the build replaced with a symlink must not be followed there.
#[test]
fn no_read_outside_declared_closure_via_an_output_parent_replaced_by_a_symlink() {
    let w = World::new();
    let (_secret, token) = secret(&w);
    let host_dir = w.path().display().to_string();
    let script = format!(
        "busybox rm -rf /build/out /build/res; busybox ln -s {host_dir} /build/out; busybox ln -s / /build/res; echo planted"
    );
    let a = w.action(
        "ingest.toml",
        &script,
        "[outputs]\nnames = [\"out\", \"res\"]\n",
    );
    let (o, v) = w.build(&a);
    if let Some(d) = v.as_ref().and_then(|v| v["outputs"]["out"].as_str()) {
        let out = w.export(d, "exported");
        let leaked = walk(&out).into_iter().any(|p| {
            p.is_file()
                && String::from_utf8_lossy(&fs::read(&p).unwrap_or_default()).contains(&token)
        });
        assert!(
            !leaked,
            "ingest followed a symlinked parent to the host secret"
        );
        assert!(
            !out.join("res/etc").is_dir(),
            "ingest imported the host's /etc through a symlinked parent"
        );
    }
    assert_eq!(
        o.status.code(),
        Some(1),
        "an output under a symlink was accepted: {}",
        text(&o)
    );
    assert!(text(&o).contains("symlink"), "{}", text(&o));
    no_leftovers(w.path());
}

#[test]
fn no_write_outside_build_scratch_view_root_and_store_by_any_path() {
    let w = World::new();
    let (secret, token) = secret(&w);
    let host = w.path().display().to_string();
    let store = w.store.display().to_string();
    let some_blob = walk(&w.store.join("blobs"))
        .into_iter()
        .find(|p| p.is_file())
        .expect("a blob in the store")
        .display()
        .to_string();
    fs::create_dir(w.path().join("precious")).unwrap();
    fs::write(w.path().join("precious/keep.txt"), "keep").unwrap();
    let before_host: Vec<_> = list(w.path());
    let script = format!(
        r#"
        for p in /evil /etc/evil /etc/passwd /usr/evil /bin/busybox /opt/hostile/attack /proc/evil \
                 /proc/sys/kernel/hostname /proc/sysrq-trigger /sys/evil /run/evil /dev/evil \
                 {host}/evil {host}/secret.txt /proc/1/root{host}/evil /proc/self/root{host}/evil \
                 /build/../evil /build/../../{host}/evil {store}/evil {store}/blobs/evil {some_blob} \
                 /proc/1/root{store}/evil /proc/1/root{some_blob} /proc/1/cwd/../evil; do
          $A write=$p
        done
        for d in /newdir /usr/newdir {host}/newdir {store}/newdir /proc/1/root{store}/newdir; do $A mkdir=$d; done
        busybox touch /build/ok && echo ok > $out/fine
        # Traps for the host-side cleanup of the scratch: it must delete
        # the links, not what they point at.
        busybox ln -s {host}/precious /build/trap-dir
        busybox ln -s {host}/precious/keep.txt /build/trap-file
        busybox mkdir -p /build/deep/er && busybox ln -s {host} /build/deep/er/up
        "#
    );
    let a = w.action("write.toml", &script, "");
    let (o, v) = w.build(&a);
    assert!(o.status.success(), "{}", text(&o));
    let log = w.log(&o, &v);
    assert_blocked(&log, &["write", "mkdir"]);
    // The host directory, the secret and the store are as they were.
    assert_eq!(fs::read_to_string(&secret).unwrap(), token);
    let after: Vec<_> = list(w.path());
    // (fhsx's own runtime directory, `$TMPDIR/fhsx-UID`, is the executor's.)
    let runtime = |p: &&PathBuf| {
        p.strip_prefix(w.path())
            .ok()
            .and_then(|r| r.components().next())
            .is_some_and(|c| {
                let c = c.as_os_str().to_string_lossy();
                c.starts_with("fhsx-") && !c.starts_with("fhsx-build-")
            })
    };
    let new: Vec<_> = after
        .iter()
        .filter(|p| !before_host.contains(p) && !runtime(p))
        .collect();
    assert!(
        new.iter().all(|p| p.ends_with("write.toml")),
        "new host files: {new:?}"
    );
    assert!(!Path::new(&format!("{store}/evil")).exists());
    assert_eq!(
        fs::read_to_string(w.path().join("precious/keep.txt")).unwrap(),
        "keep",
        "removing the scratch followed a planted symlink"
    );
    w.verify_store();
    no_leftovers(w.path());
}

#[test]
fn network_containment_host_loopback_abstract_socket_external_raw_and_dns() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let w = World::new();
    let accepted = Arc::new(AtomicUsize::new(0));
    // A host TCP listener on loopback and one on an abstract UNIX socket.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    tcp.set_nonblocking(true).unwrap();
    let name = format!("fhsx-hostile-{}", std::process::id());
    let abs = {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        std::os::unix::net::UnixListener::bind_addr(&addr).unwrap()
    };
    abs.set_nonblocking(true).unwrap();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (acc, st) = (accepted.clone(), stop.clone());
    let watcher = std::thread::spawn(move || {
        while !st.load(Ordering::SeqCst) {
            if tcp.accept().is_ok() || abs.accept().is_ok() {
                acc.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    });
    // A non-loopback host address, if there is one.
    let host_ip = Command::new("hostname")
        .arg("-I")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .find(|a| a.contains('.'))
                .map(str::to_owned)
        })
        .unwrap_or_else(|| "10.0.0.1".into());
    let script = format!(
        r#"
        $A tcp=127.0.0.1:{port} tcp={host_ip}:{port} tcp=1.1.1.1:80 tcp=8.8.8.8:53 tcp=127.0.0.1:22 \
           abstract={name} abstract=/tmp/.X11-unix/X0 dns=8.8.8.8 dns=127.0.0.53 dns=1.1.1.1 raw
        busybox nslookup example.com 2>&1 | busybox grep -q 'Address.*[0-9]' && echo "ESCAPED dns: nslookup resolved"
        busybox wget -q -T 3 -O - http://example.com/ >/dev/null 2>&1 && echo "ESCAPED http: wget without a proxy"
        busybox ip addr 2>/dev/null | busybox grep -v ' lo' | busybox grep -q 'inet ' && echo "ESCAPED net: an interface besides lo"
        echo BLOCKED shell: done
        "#
    );
    let a = w.action("net.toml", &script, "");
    let (o, v) = w.build(&a);
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let log = w.log(&o, &v);
    assert_blocked(&log, &["tcp", "abstract", "dns", "raw", "shell"]);
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "a host listener got a connection from the build"
    );
    no_leftovers(w.path());
}

#[test]
fn no_fetch_outside_recorded_set_proxy_port_used_for_non_http() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let w = World::new();
    fs::write(w.path().join("fetch.lock"), "version = 1\n").unwrap();
    // A host service the build would like to reach through the proxy.
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = tcp.local_addr().unwrap().port();
    tcp.set_nonblocking(true).unwrap();
    let accepted = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let (acc, st) = (accepted.clone(), stop.clone());
    let watcher = std::thread::spawn(move || {
        while !st.load(Ordering::SeqCst) {
            if tcp.accept().is_ok() {
                acc.fetch_add(1, Ordering::SeqCst);
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
    });
    let script = format!("$A proxy=127.0.0.1:{port}; echo BLOCKED shell: done");
    let a = w.action(
        "proxy.toml",
        &script,
        "[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n",
    );
    let (o, v) = w.build(&a);
    stop.store(true, Ordering::SeqCst);
    watcher.join().unwrap();
    assert_eq!(
        accepted.load(Ordering::SeqCst),
        0,
        "the proxy opened a connection to a host service: {}",
        text(&o)
    );
    // The refused requests are a containment violation, in the record.
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let rec = w.record_of(&o);
    let shown = w.show(&rec);
    let violations = shown["record"]["violations"].as_array().unwrap();
    assert!(
        violations
            .iter()
            .any(|v| v.as_str().unwrap().contains(&port.to_string())),
        "the record does not name the refused target: {shown}"
    );
    let log = w.log(&o, &v);
    assert!(!log.contains("ESCAPED"), "{log}");
    assert!(log.contains("PROXY 0 answered"), "{log}");
    no_leftovers(w.path());
}

#[test]
fn host_isolation_signals_and_ptrace_reach_no_outside_process() {
    let w = World::new();
    let mut victim = Command::new("sleep").arg("300").spawn().unwrap();
    let pid = victim.id();
    let script = format!("$A ptrace kill={pid}; echo after");
    let a = w.action("signal.toml", &script, "");
    let (o, v) = w.build(&a);
    let alive = victim.try_wait().unwrap().is_none();
    let _ = victim.kill();
    let _ = victim.wait();
    assert!(alive, "the build killed a host process: {}", text(&o));
    let log = w.log(&o, &v);
    assert_blocked(&log, &["ptrace", "kill"]);
    // Our own test process and its fhsx child were never signalled either.
    no_leftovers(w.path());
}

/// The probes the seccomp filter answers (EPERM), where namespaces and a
/// zero capability set alone would leave a kernel surface.
#[test]
fn host_isolation_seccomp_refuses_tiocsti_tioclinux_keyrings_perf_namespaces_mounts_personality() {
    let w = World::new();
    let a = w.action(
        "seccomp.toml",
        "$A tty keys perf namespaces mount personality kernel-surface",
        "",
    );
    let (o, v) = w.build(&a);
    assert!(o.status.success(), "{}", text(&o));
    let log = w.log(&o, &v);
    assert_blocked(
        &log,
        &[
            "tiocsti",
            "tioclinux",
            "keyctl",
            "perf",
            "unshare",
            "mount",
            "pivot_root",
            "newmount",
            "personality",
            "io_uring",
            "userfaultfd",
            "bpf",
            "syslog",
        ],
    );
    // Without the filter, TIOCSTI on a pipe is ENOTTY and add_key works in
    // the fresh session keyring: EPERM is the filter answering.
    for needle in [
        "ioctl(1, TIOCSTI): Operation not permitted",
        "ioctl(1, TIOCSTI|1<<32): Operation not permitted",
        "ioctl(1, TIOCLINUX): Operation not permitted",
        "add_key(user, session): Operation not permitted",
        "perf_event_open(self, sw clock): Operation not permitted",
        "fsopen(tmpfs): Operation not permitted",
        "personality(ADDR_NO_RANDOMIZE): Operation not permitted",
        "io_uring_setup(8): Function not implemented",
        "bpf(BPF_MAP_CREATE): Operation not permitted",
        "syslog(SIZE_BUFFER): Operation not permitted",
    ] {
        assert!(log.contains(needle), "missing {needle:?}:\n{log}");
    }
    no_leftovers(w.path());
}

/// Outputs keep no setuid/setgid bits (the filter refuses setting them,
/// castore keeps only the exec bit) and no device nodes.
#[test]
fn host_isolation_no_setuid_setgid_or_device_node_in_outputs() {
    let w = World::new();
    let a = w.action(
        "modes.toml",
        "$A setuid=/build/out mknod=/build/out && busybox chmod u+s,g+s /build/out/suid 2>/dev/null; \
         busybox install -m 4755 /build/out/suid /build/out/suid2 2>/dev/null; busybox ls -l /build/out; true",
        "",
    );
    let (o, v) = w.build(&a);
    assert!(o.status.success(), "{}", text(&o));
    let log = w.log(&o, &v);
    assert_blocked(&log, &["setuid", "mknod"]);
    // Host-side: the scratch is gone, so check the ingested tree.
    let out = w.export(
        v.as_ref().unwrap()["outputs"]["out"].as_str().unwrap(),
        "exported",
    );
    let mut seen = 0;
    for p in walk(&out) {
        let m = fs::symlink_metadata(&p).unwrap();
        assert_eq!(
            m.permissions().mode() & 0o6000,
            0,
            "{} keeps a setuid/setgid bit",
            p.display()
        );
        assert!(m.is_file() || m.is_dir() || m.file_type().is_symlink());
        seen += 1;
    }
    assert!(seen > 1, "the output is empty");
    no_leftovers(w.path());

    // A FIFO among the outputs: refused, named.
    let a = w.action("fifo.toml", "busybox mkfifo /build/out/fifo", "");
    let (o, _) = w.build(&a);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("FIFO"), "{}", text(&o));
    no_leftovers(w.path());
}

/// CVE-2024-27297 class: two builds at once must not share an abstract
/// UNIX socket namespace (each has its own network namespace), so one
/// cannot hand the other a file descriptor.
#[test]
fn host_isolation_no_fd_passing_between_concurrent_builds_via_abstract_socket() {
    let w = World::new();
    let name = format!("fhsx-leak-{}", std::process::id());
    let listen = w.action("listen.toml", &format!("$A fdleak-listen={name},110"), "");
    let mut a = Cancel(
        fhsx(&w.store)
            .arg("build")
            .arg(&listen)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    // The build's log is teed live to stderr: wait until it listens.
    let mut lines = BufReader::new(a.0.stderr.take().unwrap()).lines();
    let mut seen = Vec::new();
    loop {
        match lines.next() {
            Some(Ok(l)) => {
                let done = l.contains("LISTENING");
                seen.push(l);
                if done {
                    break;
                }
            }
            _ => panic!("the listening build ended early:\n{}", seen.join("\n")),
        }
    }
    let rest = std::thread::spawn(move || lines.map_while(Result::ok).collect::<Vec<_>>());
    let connect = w.action("connect.toml", &format!("$A abstract={name}"), "");
    let (o, v) = w.build(&connect);
    assert!(o.status.success(), "{}", text(&o));
    let log = w.log(&o, &v);
    // Stop the listener (SIGINT: a clean cancel) and read what it said.
    drop(a);
    let listener_log = rest.join().unwrap().join("\n");
    assert_blocked(&log, &["abstract"]);
    assert!(
        !listener_log.contains("ESCAPED"),
        "the other build connected:\n{listener_log}"
    );
    no_leftovers(w.path());
}

/// A resource exhaustion attempt ends as a clean build failure (exit 1, no
/// leftovers, no process left) and the host can still start processes.
fn exhaust(probe: &str, limits: &str, what: &str) -> String {
    exhaust_with(probe, limits, what, &[])
}

/// [`exhaust`] with more `fhsx build` flags.
fn exhaust_with(probe: &str, limits: &str, what: &str, flags: &[&str]) -> String {
    let w = World::new();
    let a = w.action(
        "exhaust.toml",
        &format!("exec $A {probe}"),
        &format!("[limits]\n{limits}\n"),
    );
    let (o, v, _) = w.build_pid_with(&a, flags);
    assert_eq!(o.status.code(), Some(1), "{what}: {}", text(&o));
    let v = v.expect("a JSON result");
    assert!(
        v["outputs"].as_object().is_none_or(|o| o.is_empty()),
        "{what}: an output was ingested"
    );
    let log = w.log(&o, &Some(v.clone()));
    assert!(
        !log.contains("ALLOCATED") && !log.contains("WROTE") && !log.contains("ESCAPED"),
        "{what} was not limited:\n{log}"
    );
    no_leftovers(w.path());
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains(&format!("/opt/hostile/attack {probe}")),
        "{what}: a build process survived"
    );
    assert!(
        Command::new("true").status().unwrap().success(),
        "the host cannot start a process after {what}"
    );
    log
}

#[test]
fn host_isolation_fork_bomb_is_stopped_by_limits_pids() {
    exhaust("forkbomb", "pids = 64", "a fork bomb");
}

/// The per-run cgroup directories (`fhsx-run-PID-N`) an `fhsx` of that
/// PID made in our cgroup of every hierarchy that is mounted (v2, and the
/// v1 pids and memory ones).
fn run_cgroups_of(pid: u32) -> Vec<PathBuf> {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let mut bases = Vec::new();
    for l in mounts.lines() {
        let f: Vec<&str> = l.split(' ').collect();
        let Some(sep) = f.iter().position(|x| *x == "-") else {
            continue;
        };
        let (fs_type, opts) = (f[sep + 1], f.get(sep + 3).copied().unwrap_or(""));
        let ctl = match fs_type {
            "cgroup2" => "",
            "cgroup" => match opts.split(',').find(|o| *o == "pids" || *o == "memory") {
                Some(c) => c,
                None => continue,
            },
            _ => continue,
        };
        let Some(path) = own.lines().find_map(|c| {
            let mut it = c.splitn(3, ':');
            let (_, ctls, path) = (it.next()?, it.next()?, it.next()?);
            let hit = if ctl.is_empty() {
                ctls.is_empty()
            } else {
                ctls.split(',').any(|x| x == ctl)
            };
            hit.then(|| path.to_owned())
        }) else {
            continue;
        };
        let rel = path.strip_prefix(f[3]).unwrap_or(&path);
        bases.push(Path::new(f[4]).join(rel.trim_start_matches('/')));
    }
    let prefix = format!("fhsx-run-{pid}-");
    bases
        .iter()
        .filter_map(|b| fs::read_dir(b).ok())
        .flat_map(|rd| rd.flatten())
        .filter(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
        .collect()
}

/// Whether this build's memory limit was a memory cgroup's, by its log:
/// only a run without a memory controller says it fell back to
/// `RLIMIT_AS`. Run as root on a host that mounts the cgroup v1 memory
/// hierarchy (or a cgroup v2 with the memory controller at its root), it
/// must have had one.
fn memory_was_a_cgroup(log: &str) -> bool {
    let fallback = log.contains(ADDRESS_SPACE_NOTE);
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let v1 = mounts.lines().any(|l| {
        l.contains(" - cgroup ")
            && l.rsplit(' ')
                .next()
                .is_some_and(|o| o.split(',').any(|x| x == "memory"))
    });
    let own = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    let v2_root = own.lines().any(|l| l == "0::/")
        && fs::read_to_string("/sys/fs/cgroup/cgroup.controllers")
            .is_ok_and(|c| c.split_whitespace().any(|x| x == "memory"));
    if root && (v1 || v2_root) {
        assert!(
            !fallback,
            "root with a memory controller fell back to RLIMIT_AS:\n{log}"
        );
    }
    // Without root there is one only where a cgroup v2 is delegated to the
    // caller; either way the log says which.
    !fallback
}

const ADDRESS_SPACE_NOTE: &str = "is enforced as an address-space limit (RLIMIT_AS) here";

/// Touching more memory than `[limits] memory` ends the build as a clean
/// limit failure: killed by the OOM killer inside the run's memory cgroup
/// and said so in the log (without root: the allocation fails under
/// `RLIMIT_AS`, and the log says the limit is only that). The per-run
/// memory cgroup is gone afterwards.
#[test]
fn host_isolation_memory_hog_is_stopped_by_limits_memory() {
    exhaust("memory=768", "memory = 67108864", "a memory hog");
    let w = World::new();
    let a = w.action(
        "hog.toml",
        "exec $A memory=200",
        "[limits]\nmemory = 67108864\n",
    );
    let (o, v, pid) = w.build_pid(&a);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let log = w.log(&o, &v);
    assert!(!log.contains("ALLOCATED"), "200 MiB fit in 64 MiB:\n{log}");
    if memory_was_a_cgroup(&log) {
        assert!(
            log.contains(
                "fhsx: the run reached its [limits] memory (64 MiB): the kernel's OOM killer ended"
            ),
            "the OOM kill is not reported:\n{log}"
        );
    }
    assert_eq!(
        run_cgroups_of(pid),
        Vec::<PathBuf>::new(),
        "per-run cgroups left"
    );
    assert!(Command::new("true").status().unwrap().success());
    no_leftovers(w.path());
}

/// `[limits] memory` limits memory, not address space: under the default
/// 8 GiB a program that reserves 16 GiB (`PROT_NONE`, `MAP_NORESERVE`, as
/// JITs, sanitizers, Go, the JVM and WebAssembly engines do) runs. Where no
/// memory cgroup can be had (without root) the limit falls back to
/// `RLIMIT_AS`, the reservation fails, and the log says why.
#[test]
fn host_isolation_limits_memory_is_memory_not_address_space_a_16_gib_reservation_runs() {
    let w = World::new();
    let a = w.action("reserve.toml", "exec $A reserve=16384", "");
    let (o, v, pid) = w.build_pid(&a);
    let log = w.log(&o, &v);
    if memory_was_a_cgroup(&log) {
        assert!(o.status.success(), "{}\n{log}", text(&o));
        assert!(log.contains("RESERVED 16384 MiB"), "{log}");
    } else {
        assert!(
            log.contains(&format!(
                "fhsx: [limits] memory (8 GiB) {ADDRESS_SPACE_NOTE}"
            )),
            "the address-space fallback is not said:\n{log}"
        );
        assert!(log.contains("RESERVE refused 16384 MiB"), "{log}");
    }
    assert_eq!(
        run_cgroups_of(pid),
        Vec::<PathBuf>::new(),
        "per-run cgroups left"
    );
    no_leftovers(w.path());
}

#[test]
fn host_isolation_disk_filler_is_stopped_by_limits_file_size() {
    exhaust("disk=64", "file_size = 1048576", "a disk filler");
}

/// Files of 512 KiB each, 256 MiB in all: `file_size` cannot stop this,
/// only the scratch's own size-capped file system can. Without root there
/// is none, and the build must say so rather than pretend.
#[test]
fn host_isolation_many_file_disk_filler_is_stopped_by_limits_disk() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let log = exhaust(
            "diskfiles=256",
            "disk = 33554432\nfile_size = 1048576",
            "a many-file disk filler",
        );
        assert!(log.contains("No space left on device"), "{log}");
        return;
    }
    let w = World::new();
    let a = w.action(
        "fill.toml",
        "exec $A diskfiles=16",
        "[limits]\ndisk = 33554432\n",
    );
    let (o, v) = w.build(&a);
    let log = w.log(&o, &v);
    assert!(
        log.contains("[limits] disk is not enforced here: only root"),
        "an unenforced disk limit went unmentioned:\n{log}"
    );
    no_leftovers(w.path());
}

/// In memory (`--scratch memory`, a tmpfs) the scratch holds no more than
/// `[limits] disk` either: the many-file filler gets `ENOSPC` at 32 MiB,
/// the scratch is the tmpfs fhsx mounted (`nosuid`, `nodev`, of that size),
/// and nothing is left mounted.
#[test]
fn host_isolation_many_file_disk_filler_is_stopped_by_a_memory_scratch() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Without root the scratch is a plain directory, whatever the medium.
        return host_isolation_many_file_disk_filler_is_stopped_by_limits_disk();
    }
    let log = exhaust_with(
        "diskfiles=256",
        "disk = 33554432\nfile_size = 1048576",
        "a many-file filler of a memory scratch",
        &["--scratch", "memory"],
    );
    assert!(log.contains("No space left on device"), "{log}");
    let w = World::new();
    let a = w.action(
        "mounts.toml",
        "busybox grep ' /build ' /proc/self/mounts",
        "[limits]\ndisk = 33554432\n",
    );
    let (o, v, _) = w.build_pid_with(&a, &["--scratch", "memory"]);
    let log = w.log(&o, &v);
    assert!(o.status.success(), "{log}");
    let mount = log
        .lines()
        .find(|l| l.contains(" /build tmpfs "))
        .unwrap_or_else(|| panic!("/build is not a tmpfs:\n{log}"));
    for opt in ["nosuid", "nodev", "size=32768k"] {
        assert!(mount.contains(opt), "{opt} missing: {mount}");
    }
    no_leftovers(w.path());
}

/// What a memory scratch holds is the build's memory: 96 MiB written to
/// `/build` and then 64 MiB allocated exceed `[limits] memory` (128 MiB),
/// and the run is OOM-killed, where with the disk scratch the same build
/// allocates (its written pages are page cache, reclaimable). A build can
/// therefore not take the host's memory through its scratch.
#[test]
fn host_isolation_a_memory_scratch_counts_against_limits_memory() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return host_isolation_memory_hog_is_stopped_by_limits_memory();
    }
    let w = World::new();
    let a = w.action(
        "fill-then-hog.toml",
        "busybox dd if=/dev/zero of=/build/fill bs=1M count=96 2>&1 && busybox sync && exec $A memory=64",
        "[limits]\nmemory = 134217728\n",
    );
    let (o, v, _) = w.build_pid_with(&a, &["--scratch", "memory"]);
    let log = w.log(&o, &v);
    assert_eq!(o.status.code(), Some(1), "{log}");
    assert!(
        log.contains("96+0 records out"),
        "the fill did not fit:\n{log}"
    );
    assert!(
        !log.contains("ALLOCATED"),
        "64 MiB fit beside 96 MiB of scratch in 128 MiB:\n{log}"
    );
    if memory_was_a_cgroup(&log) {
        assert!(
            log.contains("fhsx: the run reached its [limits] memory (128 MiB)"),
            "the OOM kill is not reported:\n{log}"
        );
    }
    let (o, v, _) = w.build_pid(&a);
    let log = w.log(&o, &v);
    assert!(
        o.status.success() && log.contains("ALLOCATED"),
        "with the disk scratch the same build should allocate:\n{log}"
    );
    no_leftovers(w.path());
}

#[test]
fn host_isolation_fd_hog_is_stopped_by_limits_open_files() {
    exhaust("files=5000", "open_files = 64", "an fd hog");
}

fn walk(root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(p) = stack.pop() {
        if let Ok(m) = fs::symlink_metadata(&p) {
            if m.is_dir() {
                for e in fs::read_dir(&p).unwrap().flatten() {
                    stack.push(e.path());
                }
            }
        }
        out.push(p);
    }
    out
}

/// Files directly in `dir` and below, except the store's internals.
fn list(dir: &Path) -> Vec<PathBuf> {
    walk(dir)
        .into_iter()
        .filter(|p| !p.starts_with(dir.join("store")))
        .collect()
}

/// A running `fhsx build`, cancelled (SIGINT, a clean stop) and waited for
/// when dropped — also when the test panics.
struct Cancel(std::process::Child);

impl Drop for Cancel {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            // SAFETY: signalling our own child.
            unsafe { libc::kill(self.0.id() as i32, libc::SIGINT) };
        }
        let _ = self.0.wait();
    }
}

const HOSTILE_USER: &str = "fhsx-hostile";

/// The whole suite again as an unprivileged user: without root, bwrap
/// builds on user namespaces, the reaper falls back to pidfds and
/// `RLIMIT_NPROC`, and the FUSE view is mounted and unmounted through the
/// setuid `fusermount3` — each a different path to the same promises. As
/// root this creates a system user and re-runs this test binary as that
/// user (every test but this one), handing in copies of the fhsx binary,
/// the probe and busybox it can read.
#[test]
fn zz_every_hostile_action_also_fails_as_an_unprivileged_user() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        // Already unprivileged: the other tests in this run are the proof.
        return;
    }
    support::system_user(HOSTILE_USER);
    assert!(
        Path::new("/usr/bin/fusermount3").exists(),
        "an unprivileged user mounts the view through fusermount3: `apt-get install fuse3`"
    );
    let mode = fs::metadata("/dev/fuse").map(|m| m.permissions().mode() & 0o777);
    assert_eq!(
        mode.ok(),
        Some(0o666),
        "an unprivileged user needs /dev/fuse mode 0666 (udev's default on a stock host): `chmod 0666 /dev/fuse`"
    );
    // Copies the user can surely read and run: the checkout and the target
    // directory may sit below a directory only root can enter.
    let dir = tempfile::Builder::new()
        .prefix("hostile-unpriv-")
        .tempdir()
        .unwrap();
    let copy = |src: &Path, name: &str, mode: u32| {
        let dst = dir.path().join(name);
        fs::copy(src, &dst).unwrap();
        fs::set_permissions(&dst, fs::Permissions::from_mode(mode)).unwrap();
        dst
    };
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let suite = copy(&std::env::current_exe().unwrap(), "hostile-suite", 0o755);
    let exe = copy(&support::fhsx_exe(), "fhsx", 0o755);
    let attack = copy(&attack_bin(), "attack", 0o755);
    let busybox = copy(&busybox_deb(), "busybox-static.deb", 0o644);
    let run = Command::new("runuser")
        .args(["-u", HOSTILE_USER, "--", "env", "-i"])
        .arg(format!(
            "PATH={}",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/bin:/bin".into())
        ))
        .arg("TMPDIR=/tmp")
        .arg(format!("FHSX_HOSTILE_EXE={}", exe.display()))
        .arg(format!("FHSX_HOSTILE_ATTACK={}", attack.display()))
        .arg(format!("FHSX_HOSTILE_BUSYBOX={}", busybox.display()))
        .arg(&suite)
        .args(["--skip", "zz_every_hostile_action", "--test-threads=2"])
        .output()
        .expect(
            "runuser (util-linux) is needed to run as the test user: `apt-get install util-linux`",
        );
    let so = String::from_utf8_lossy(&run.stdout);
    let se = String::from_utf8_lossy(&run.stderr);
    assert!(
        run.status.success() && so.contains("test result: ok") && !so.contains(" 0 passed"),
        "the hostile suite failed as user {HOSTILE_USER}:\n{so}\n{se}"
    );
    println!("as {HOSTILE_USER}:\n{so}");
}

/// What a build sees of its own process state: signal dispositions and
/// mask, CPU affinity, umask, nice and scheduling policy, personality,
/// `oom_score_adj`, every resource limit. Written to `$out/state` too, so
/// the output digest covers it.
const PROCESS_STATE: &str = r#"
busybox mkdir -p $out
{
  busybox grep -E '^(SigIgn|SigBlk|SigCgt|Cpus_allowed_list):' /proc/self/status
  echo "umask $(umask)"
  echo "nice $(busybox cut -d' ' -f19 /proc/self/stat)"
  echo "policy $(busybox cut -d' ' -f41 /proc/self/stat)"
  echo "personality $(busybox cat /proc/self/personality)"
  echo "oom_score_adj $(busybox cat /proc/self/oom_score_adj)"
  ulimit -a
} > $out/state
busybox sed 's/^/STATE /' $out/state
"#;

/// The `STATE` lines of a build's log.
fn state_lines(log: &str) -> Vec<&str> {
    log.lines().filter(|l| l.starts_with("STATE ")).collect()
}

/// Nothing of the caller's process state crosses into the build: the same
/// action run plainly, backgrounded from a script (SIGINT and SIGQUIT
/// ignored), under `nohup` (SIGHUP ignored), and from a caller with umask
/// 077, nice 7, one CPU, a 1 MiB stack, no address randomisation,
/// `SCHED_BATCH` and another `oom_score_adj` sees the same state and makes
/// the same output. A caller's higher nice value and lowered hard limits
/// can only be undone with CAP_SYS_NICE and CAP_SYS_RESOURCE (which the
/// unprivileged pass, and root in some containers, lack): without them
/// the caller keeps nice and lowers only soft limits.
#[test]
fn host_isolation_nothing_of_the_callers_process_state_crosses() {
    let w = World::new();
    let a = w.action("state.toml", PROCESS_STATE, "");
    // Raising a hard limit takes CAP_SYS_RESOURCE, lowering nice
    // CAP_SYS_NICE (root in a container may lack either).
    let (raise, renice) = (has_cap(24), has_cap(23));
    let exe = support::fhsx_exe();
    let build = |shell: &str| {
        let o = Command::new("bash")
            .arg("-c")
            .arg(shell)
            .arg(&exe)
            .arg(&w.store)
            .arg(&a)
            .env("TMPDIR", w.path())
            .env("FHSX_SCRATCH_POOL", "0")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        let v: Option<serde_json::Value> = serde_json::from_slice(&o.stdout).ok();
        assert!(o.status.success(), "{shell}: {}", text(&o));
        let log = w.log(&o, &v);
        let out = v.as_ref().unwrap()["outputs"]["out"]
            .as_str()
            .unwrap()
            .to_owned();
        (log, out)
    };
    // --rebuild: each way must really run, not be answered from the cache.
    let fhsx = r#""$0" --store "$1" --json build --rebuild "$2""#;
    // `ulimit -s` sets the soft and the hard limit, `-S` only the soft.
    let hard = if raise { "" } else { "-S" };
    let nice = if renice { "nice -n 7" } else { "" };
    let hostile = format!(
        "umask 077; ulimit {hard} -s 1024; ulimit {hard} -n 512; ulimit {hard} -c 0; exec choom -n 300 -- {nice} taskset -c 0 setarch \"$(uname -m)\" -R chrt -b 0 {fhsx}"
    );
    let runs = [
        ("plain", format!("exec {fhsx}")),
        ("backgrounded", format!("{fhsx} & wait")),
        ("nohup", format!("exec nohup {fhsx}")),
        ("hostile caller", hostile),
    ];
    let results: Vec<_> = runs.iter().map(|(name, sh)| (name, build(sh))).collect();
    let (_, (log0, out0)) = &results[0];
    let state0 = state_lines(log0);
    let field = |k: &str| {
        state0
            .iter()
            .find_map(|l| l.strip_prefix("STATE ")?.strip_prefix(k))
            .map(str::trim)
            .unwrap_or_else(|| panic!("no {k} in the state:\n{log0}"))
    };
    assert_eq!(field("SigIgn:"), "0000000000000000", "{log0}");
    assert_eq!(field("SigBlk:"), "0000000000000000", "{log0}");
    assert_eq!(field("umask"), "0022", "{log0}");
    assert_eq!(field("nice"), "0", "{log0}");
    assert_eq!(field("policy"), "0", "SCHED_OTHER: {log0}");
    // PER_LINUX with ADDR_NO_RANDOMIZE: builds pin ASLR off (docs/DESIGN.md,
    // reproducibility), whatever the caller's `setarch -R` said.
    assert_eq!(field("personality"), "00040000", "{log0}");
    assert_eq!(field("oom_score_adj"), "500", "{log0}");
    assert!(
        state0
            .iter()
            .any(|l| l.contains("stack") && l.ends_with(" 8192")),
        "the stack limit is not 8 MiB:\n{log0}"
    );
    assert!(
        state0
            .iter()
            .any(|l| l.contains("core") && l.ends_with(" 0")),
        "core dumps are not off:\n{log0}"
    );
    for (name, (log, out)) in &results[1..] {
        assert_eq!(
            state_lines(log),
            state0,
            "run {name} saw another process state than a plain run"
        );
        assert_eq!(out, out0, "run {name} made another output");
    }
    no_leftovers(w.path());
}

/// No byte from outside the view: the supervisor (PID 1, a host file bwrap
/// execs from a descriptor, no path to it inside) can be neither read nor
/// run — not by the path an older fhsx bound it at, not by
/// `/proc/1/exe`, `/proc/1/mem`, `/proc/1/map_files`, `process_vm_readv`,
/// nor through a copy of it the build execs itself — while the command's
/// own `/proc/self/exe` is the command. Every other file bound from the
/// host is unreadable too, or public: the fetch proxy's CA certificate,
/// which the build must trust, and which is exactly the store's
/// `ca/ca.crt`, no key; and the build's own jobserver, a FIFO.
#[test]
fn no_read_outside_declared_closure_the_supervisor_and_every_bound_host_file() {
    let w = World::new();
    fs::write(w.path().join("fetch.lock"), "version = 1\n").unwrap();
    let script = r#"
        $A supervisor=/run/fhsx/supervisor
        busybox md5sum /run/fhsx/supervisor 2>/dev/null && echo "ESCAPED md5sum of the supervisor"
        busybox cat /proc/1/exe >/dev/null 2>&1 && echo "ESCAPED cat /proc/1/exe"
        s=$(busybox md5sum < /proc/self/exe); b=$(busybox md5sum < /bin/busybox)
        [ "$s" = "$b" ] && echo "SELF-EXE of the shell is busybox"
        # Every mount that is not the view (FUSE) or a kernel file system:
        # what the host bound in.
        busybox awk '{ for (i = 7; $i != "-"; i++); print $5, $(i + 1) }' /proc/self/mountinfo |
        while read mp fstype; do
          case "$fstype" in fuse*|proc|sysfs|tmpfs|devtmpfs|devpts|mqueue|cgroup*) continue;; esac
          if [ -S "$mp" ]; then echo "BOUND socket $mp"
          elif [ -p "$mp" ]; then echo "BOUND fifo $mp"
          elif [ -d "$mp" ]; then echo "BOUND dir $mp"
          elif [ -f "$mp" ]; then
            if busybox head -c 1 "$mp" >/dev/null 2>&1; then echo "BOUND readable $mp $(busybox md5sum < "$mp")"
            else echo "BOUND unreadable $mp"; fi
          else echo "BOUND other $mp"; fi
        done
        busybox cat /run/fhsx/ca.pem 2>/dev/null | busybox sed 's/^/CA /'
        echo BLOCKED shell: done
    "#;
    for mode in ["none", "replay"] {
        let net = if mode == "none" {
            String::new()
        } else {
            "[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n".to_owned()
        };
        let a = w.action(&format!("bound-{mode}.toml"), script, &net);
        let (o, v) = w.build(&a);
        assert!(o.status.success(), "{mode}: {}", text(&o));
        let log = w.log(&o, &v);
        assert_blocked(&log, &["supervisor", "shell"]);
        assert!(log.contains("SELF-EXE is the command"), "{log}");
        assert!(log.contains("SELF-EXE of the shell is busybox"), "{log}");
        let bound: Vec<&str> = log.lines().filter(|l| l.starts_with("BOUND ")).collect();
        assert!(
            !bound.iter().any(|b| b.contains("supervisor")),
            "{mode}: the supervisor is bound into the sandbox (bwrap execs it from a descriptor):\n{log}"
        );
        for b in &bound {
            let mut f = b.split_whitespace().skip(1);
            let (kind, mp) = (f.next().unwrap_or(""), f.next().unwrap_or(""));
            match kind {
                "unreadable" | "socket" => {}
                // The build's own jobserver: a pipe, no file of the host's.
                "fifo" => assert_eq!(mp, "/run/fhsx/jobserver", "{mode}: a FIFO is bound: {b}"),
                "dir" => assert_eq!(mp, "/build", "{mode}: a host directory is bound: {b}"),
                "readable" => assert_eq!(
                    (mode, mp),
                    ("replay", "/run/fhsx/ca.pem"),
                    "a host file is readable: {b}\n{log}"
                ),
                _ => panic!("{mode}: something else is bound from the host: {b}"),
            }
        }
        let ca: Vec<&str> = log.lines().filter_map(|l| l.strip_prefix("CA ")).collect();
        if mode == "replay" {
            let public = fs::read_to_string(w.store.join("ca/ca.crt")).unwrap();
            assert_eq!(
                ca,
                public.lines().collect::<Vec<_>>(),
                "the bound CA is not the store's public certificate"
            );
            assert!(!ca.iter().any(|l| l.contains("PRIVATE KEY")));
        } else {
            assert!(ca.is_empty(), "{log}");
        }
        no_leftovers(w.path());
    }
}

/// Whether this process has capability `bit` in its effective set.
fn has_cap(bit: u32) -> bool {
    fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("CapEff:"))
                .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        })
        .is_some_and(|caps| caps & (1 << bit) != 0)
}

/// Whether this test runs as root (then builds run as build users).
fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The documented default range of build users.
fn default_build_users() -> std::ops::Range<u32> {
    use executor_sandbox::users::{DEFAULT_BUILD_UID_COUNT, DEFAULT_BUILD_UID_START};
    DEFAULT_BUILD_UID_START..DEFAULT_BUILD_UID_START + DEFAULT_BUILD_UID_COUNT
}

/// `fhsx build --rebuild --keep-failed` of a failing action: the kept
/// scratch (from the log's line) and the whole output.
fn build_keep_failed(w: &World, action: &Path, env: &[(&str, &str)]) -> (PathBuf, String) {
    let o = fhsx(&w.store)
        .args(["build", "--rebuild", "--keep-failed"])
        .arg(action)
        .envs(env.iter().copied())
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = text(&o);
    let dir = err
        .lines()
        .find(|l| l.contains("kept the failed build's scratch at"))
        .and_then(|l| l.rsplit(' ').next())
        .unwrap_or_else(|| panic!("no kept scratch named:\n{err}"))
        .to_owned();
    (PathBuf::from(dir), err)
}

/// Let a kept scratch go: unmount its file system (as root), remove its
/// working area.
fn discard_kept(scratch: &Path) {
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    if mounts.contains(&format!(" {} ", scratch.display())) {
        let u = Command::new("umount").arg(scratch).output().unwrap();
        assert!(u.status.success(), "{}", text(&u));
    }
    fs::remove_dir_all(scratch.parent().unwrap()).unwrap();
}

/// As root every build runs as a build user of its own, never host uid 0:
/// seen from the host, every file a failed build left in its kept scratch
/// (and the scratch itself) is owned by one uid of the documented range,
/// with the gid of the same number, while inside it is the sandbox user
/// 1000; no directory is writable by others; the working area around it
/// is root's, passable by the build user's group alone. `FHSX_BUILD_UIDS`
/// moves the range, and a bad one is a usage error naming it. Without
/// root the build runs as the caller, who owns what it left.
#[test]
fn host_isolation_a_build_runs_as_a_build_user_of_its_own_who_owns_its_kept_scratch() {
    use std::os::unix::fs::MetadataExt;
    let w = World::new();
    let a = w.action(
        "owner.toml",
        "echo left > /build/left; busybox mkdir -p /build/dir/sub; echo in > /build/dir/sub/f; \
         echo \"INSIDE $(busybox id -u):$(busybox id -g)\"; exit 7",
        "",
    );
    // SAFETY: getuid has no preconditions.
    let me = unsafe { libc::getuid() };
    let custom = 1_900_000_000u32..1_900_000_008;
    let range_env = format!("{}:{}", custom.start, custom.end - custom.start);
    let runs = [
        (vec![], default_build_users()),
        (vec![("FHSX_BUILD_UIDS", range_env.as_str())], custom),
    ];
    for (env, range) in runs {
        let (scratch, err) = build_keep_failed(&w, &a, &env);
        assert!(err.contains("INSIDE 1000:100"), "{err}");
        let owner = fs::symlink_metadata(&scratch).unwrap().uid();
        for p in walk(&scratch) {
            let m = fs::symlink_metadata(&p).unwrap();
            if is_root() {
                assert!(
                    range.contains(&m.uid()) && m.gid() == m.uid(),
                    "{} is {}:{}, not a build user of {range:?}:\n{err}",
                    p.display(),
                    m.uid(),
                    m.gid()
                );
                assert_eq!(m.uid(), owner, "{} has another owner", p.display());
            } else {
                assert_eq!(m.uid(), me, "{}", p.display());
            }
            if m.is_dir() {
                assert_eq!(m.mode() & 0o002, 0, "{} is world-writable", p.display());
            }
        }
        assert!(
            walk(&scratch).len() >= 5,
            "the build left less than it made"
        );
        if is_root() {
            assert_ne!(owner, 0);
            assert!(
                err.contains(&format!("its files are build user {owner}'s")),
                "{err}"
            );
            let area = fs::symlink_metadata(scratch.parent().unwrap()).unwrap();
            assert_eq!(
                (area.uid(), area.gid(), area.mode() & 0o7777),
                (0, owner, 0o710),
                "the working area is not root's, passable by the build user only"
            );
        }
        discard_kept(&scratch);
    }
    if is_root() {
        let o = fhsx(&w.store)
            .args(["build", "--rebuild"])
            .arg(&a)
            .env("FHSX_BUILD_UIDS", "0:10")
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{}", text(&o));
        assert!(
            text(&o).contains("FHSX_BUILD_UIDS=0:10") && text(&o).contains("uid 0"),
            "{}",
            text(&o)
        );
    }
    no_leftovers(w.path());
}

/// As root, a `$TMPDIR` the build user may not pass through is refused
/// before anything runs, naming the directory and the fix (exit 2).
#[test]
fn host_isolation_as_root_a_tmpdir_the_build_user_cannot_pass_is_a_clear_error() {
    if !is_root() {
        return;
    }
    let w = World::new();
    let a = w.action("tmpdir.toml", "true", "");
    let closed = w.path().join("closed");
    fs::create_dir(&closed).unwrap();
    fs::set_permissions(&closed, fs::Permissions::from_mode(0o700)).unwrap();
    let o = Command::new(support::fhsx_exe())
        .arg("--store")
        .arg(&w.store)
        .args(["build", "--rebuild"])
        .arg(&a)
        .env("TMPDIR", &closed)
        .env("FHSX_SCRATCH_POOL", "0")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    let err = text(&o);
    assert!(
        err.contains(&closed.display().to_string()) && err.contains("o+x"),
        "{err}"
    );
    no_leftovers(&closed);
    no_leftovers(w.path());
}

/// The PIDs (host view) of processes whose command line is exactly `argv`.
fn pids_running(argv: &[&str]) -> Vec<i32> {
    let want: Vec<u8> = argv
        .iter()
        .flat_map(|a| [a.as_bytes(), b"\0"].concat())
        .collect();
    fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == want))
        .collect()
}

/// A process's real uid and gid, from `/proc/PID/status`.
fn ids_of(pid: i32) -> (u32, u32) {
    let s = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let first = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap()
    };
    (first("Uid:"), first("Gid:"))
}

/// From a forked child that has become `uid`/`gid` (no capabilities, no
/// groups, in the host's namespaces: nothing of the sandbox helps):
/// `kill(target, 0)`, `ptrace(PTRACE_ATTACH, target)` and, as a control,
/// `kill(own, 0)`, each 0 or the errno.
fn as_user_try(uid: u32, gid: u32, target: i32, own: i32) -> [i32; 3] {
    let mut fds = [0; 2];
    // SAFETY: a valid array for pipe(2).
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: the child makes only raw system calls, then _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: raw calls in the forked child.
        unsafe {
            let errno = || *libc::__errno_location();
            let mut r = [-1i32; 3];
            if libc::syscall(libc::SYS_setgroups, 0usize, std::ptr::null::<libc::gid_t>()) == 0
                && libc::syscall(libc::SYS_setresgid, gid, gid, gid) == 0
                && libc::syscall(libc::SYS_setresuid, uid, uid, uid) == 0
            {
                r[0] = if libc::kill(target, 0) == 0 {
                    0
                } else {
                    errno()
                };
                r[1] = if libc::ptrace(libc::PTRACE_ATTACH, target, 0, 0) == 0 {
                    0
                } else {
                    errno()
                };
                r[2] = if libc::kill(own, 0) == 0 { 0 } else { errno() };
            }
            libc::write(fds[1], r.as_ptr().cast(), 12);
            libc::_exit(0);
        }
    }
    // SAFETY: our end of the pipe; the child's pid.
    unsafe {
        libc::close(fds[1]);
        let mut r = [0i32; 3];
        let n = libc::read(fds[0], r.as_mut_ptr().cast(), 12);
        libc::close(fds[0]);
        libc::waitpid(pid, std::ptr::null_mut(), 0);
        assert_eq!(n, 12, "the child could not become {uid}");
        r
    }
}

/// Two builds at once run as two different build users, and with every
/// namespace's help taken away — a process of the host's PID namespace
/// that has become build A's uid, without seccomp, Landlock or the
/// sandbox's mount table — A's user still can neither signal nor ptrace
/// a process of build B (EPERM), though it can signal its own (the
/// control). Without root both run as the caller (no build users: the
/// unprivileged pass shows only that).
#[test]
fn host_isolation_concurrent_builds_are_different_build_users_that_cannot_signal_or_ptrace_each_other(
) {
    let w = World::new();
    let base = 700_000 + (std::process::id() % 100_000) * 2;
    let secs = [base.to_string(), (base + 1).to_string()];
    let mut builds = Vec::new();
    for (i, s) in secs.iter().enumerate() {
        let a = w.action(
            &format!("user{i}.toml"),
            &format!("exec busybox sleep {s}"),
            "",
        );
        builds.push(Cancel(
            fhsx(&w.store)
                .args(["build", "--rebuild"])
                .arg(&a)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap(),
        ));
    }
    let until = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let pids = loop {
        let found: Vec<Vec<i32>> = secs
            .iter()
            .map(|s| pids_running(&["busybox", "sleep", s]))
            .collect();
        if found.iter().all(|p| p.len() == 1) {
            break [found[0][0], found[1][0]];
        }
        assert!(
            std::time::Instant::now() < until,
            "the two builds did not both start: {found:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    let [(ua, ga), (ub, gb)] = pids.map(ids_of);
    if !is_root() {
        // SAFETY: getuid has no preconditions.
        let me = unsafe { libc::getuid() };
        assert_eq!(
            (ua, ub),
            (me, me),
            "without root a build runs as its caller"
        );
        drop(builds);
        no_leftovers(w.path());
        return;
    }
    let range = default_build_users();
    assert!(
        range.contains(&ua) && range.contains(&ub),
        "not build users: {ua}, {ub}"
    );
    assert_ne!(ua, ub, "two builds running at once share a uid");
    assert_eq!((ga, gb), (ua, ub), "a build user's gid is its uid");
    let [kill_b, ptrace_b, kill_own_a] = as_user_try(ua, ga, pids[1], pids[0]);
    let [kill_a, ptrace_a, kill_own_b] = as_user_try(ub, gb, pids[0], pids[1]);
    assert_eq!(
        (kill_b, ptrace_b, kill_a, ptrace_a),
        (libc::EPERM, libc::EPERM, libc::EPERM, libc::EPERM),
        "one build user reached the other's process"
    );
    assert_eq!(
        (kill_own_a, kill_own_b),
        (0, 0),
        "the control failed: a build user could not signal its own process"
    );
    // Both still run: nothing above reached them.
    assert!(pids
        .iter()
        .all(|p| Path::new(&format!("/proc/{p}")).exists()));
    drop(builds);
    no_leftovers(w.path());
}

/// Nothing the build user leaves in its outputs or scratch stops ingest
/// (run by root, or by the unprivileged caller who owns it all) or the
/// removal of the scratch: files and directories of mode 000, the
/// output's own directory 000, a directory of mode 000 elsewhere in the
/// scratch; and a symlink to a host secret is kept as a symlink, never
/// followed.
#[test]
fn host_isolation_modes_a_build_leaves_never_stop_ingest_nor_make_it_follow_a_link() {
    let w = World::new();
    let a = w.action(
        "modes000.toml",
        "busybox mkdir -p $out/d/e /build/junk/deep; echo secret > $out/f; echo deep > $out/d/e/g; \
         echo j > /build/junk/deep/x; busybox ln -s /etc/shadow $out/shadow; \
         busybox chmod 000 $out/f $out/d/e $out/d /build/junk/deep /build/junk $out",
        "",
    );
    let (o, v) = w.build(&a);
    assert!(o.status.success(), "{}", text(&o));
    let out = w.export(
        v.as_ref().unwrap()["outputs"]["out"].as_str().unwrap(),
        "exported-000",
    );
    assert_eq!(fs::read_to_string(out.join("f")).unwrap(), "secret\n");
    assert_eq!(fs::read_to_string(out.join("d/e/g")).unwrap(), "deep\n");
    assert_eq!(
        fs::read_link(out.join("shadow")).unwrap(),
        Path::new("/etc/shadow")
    );
    assert!(fs::symlink_metadata(out.join("shadow"))
        .unwrap()
        .file_type()
        .is_symlink());
    no_leftovers(w.path());
}
