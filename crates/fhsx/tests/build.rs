//! `fhsx build` end to end: real bwrap, real FUSE, real Debian packages.
//!
//! The toolchain is a C toolchain of Debian packages made by `fhsx toolchain apt` (tests/support), its
//! .debs fetched once with `apt-get download` into the target directory.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use support::{busybox, fhsx, import, inputs, mirror, no_leftovers, text};

/// Import every toolchain .deb; returns (package name, atom digest).
fn toolchain(store: &Path) -> Vec<(String, String)> {
    let debs = inputs().join("debs");
    let mut files: Vec<_> = fs::read_dir(&debs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    files.sort();
    let o = fhsx(store)
        .args(["--json", "store", "import"])
        .args(&files)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v.as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let path = e["path"].as_str().unwrap();
            let name = Path::new(path).file_name().unwrap().to_string_lossy();
            (
                name.split('_').next().unwrap().to_owned(),
                e["root"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

fn quoted(list: &[String]) -> String {
    list.iter()
        .map(|d| format!("\"{d}\""))
        .collect::<Vec<_>>()
        .join(", ")
}

fn write_action(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

fn build(store: &Path, action: &Path) -> (Output, Option<serde_json::Value>) {
    let o = fhsx(store)
        .args(["--json", "build"])
        .arg(action)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).ok();
    (o, v)
}

/// The log of the build `fhsx --json build` described as `v`.
fn log_of(store: &Path, v: &serde_json::Value) -> String {
    let o = fhsx(store)
        .args(["store", "blob", v["log"].as_str().unwrap()])
        .output()
        .unwrap();
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn hello_action(tc: &[String], src: &str) -> String {
    format!(
        r#"[inputs]
toolchain = [{}]
source = "{src}"
[run]
command = ["/bin/sh", "-c", "cd hello-2.10 && ./configure --prefix=/usr && make -j2 && make install DESTDIR=$out"]
workdir = "/build/src"
timeout = "15m"
"#,
        quoted(tc)
    )
}

#[test]
fn hello_builds_reproducibly_with_a_proven_read_set() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let atoms = toolchain(&store);
    // One atom the build never touches: it must show up as bloat and not in the read set.
    let unused_dir = t.path().join("unused");
    fs::create_dir_all(unused_dir.join("opt/unused")).unwrap();
    fs::write(
        unused_dir.join("opt/unused/never-read.txt"),
        b"nobody reads me",
    )
    .unwrap();
    let unused = import(&store, &unused_dir);
    let mut tc: Vec<String> = atoms.iter().map(|a| a.1.clone()).collect();
    tc.push(unused.clone());
    let src = import(&store, &inputs().join("src/hello_2.10.orig.tar.gz"));
    let action = write_action(t.path(), "hello.toml", &hello_action(&tc, &src));

    let (o1, v1) = build(&store, &action);
    assert!(o1.status.success(), "hello build failed: {}", text(&o1));
    no_leftovers(t.path());
    let v1 = v1.unwrap();
    // A second build is a cache hit; --check really rebuilds and compares.
    let o2 = fhsx(&store)
        .args(["--json", "build", "--check"])
        .arg(&action)
        .output()
        .unwrap();
    assert!(
        o2.status.success(),
        "hello is not reproducible: {}",
        text(&o2)
    );
    let v2: serde_json::Value = serde_json::from_slice(&o2.stdout).unwrap();
    assert_eq!(v2["cached"], false);
    assert_eq!(v2["check"]["against"], v1["record"]);
    assert_eq!(v2["check"]["differences"], serde_json::json!([]));
    assert_eq!(
        v1["outputs"], v2["outputs"],
        "output differs between two builds"
    );
    assert_eq!(
        v1["read_set"], v2["read_set"],
        "read set differs between two builds"
    );

    // The output has a working hello.
    let out = t.path().join("out");
    let o = fhsx(&store)
        .args(["store", "export", v1["outputs"]["out"].as_str().unwrap()])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let hello = Command::new(out.join("usr/bin/hello")).output().unwrap();
    assert_eq!(hello.stdout, b"Hello, world!\n");

    // The record verifies, against the store's own key.
    let record = v1["record"].as_str().unwrap();
    let key = fhsx(&store).args(["key", "show"]).output().unwrap();
    let key = String::from_utf8_lossy(&key.stdout).trim().to_owned();
    let o = fhsx(&store)
        .args(["record", "verify", record, "--trust", &key])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let other = format!("ed25519:{}", "11".repeat(32));
    let o = fhsx(&store)
        .args(["record", "verify", record, "--trust", &other])
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(3),
        "an untrusted signer was accepted: {}",
        text(&o)
    );

    // The read set names the compiler and the headers it used, not the unused atom.
    let rs = fhsx(&store)
        .args(["store", "blob", v1["read_set"].as_str().unwrap()])
        .output()
        .unwrap();
    let rs = String::from_utf8_lossy(&rs.stdout);
    for needle in [
        "/usr/bin/gcc-12",
        "/usr/include/stdio.h",
        "/usr/lib/gcc/x86_64-linux-gnu/12/cc1",
    ] {
        assert!(rs.contains(needle), "read set lacks {needle}");
    }
    assert!(
        !rs.contains("/opt/unused"),
        "read set names a path never touched"
    );

    let o = fhsx(&store)
        .args(["--json", "closure-bloat", record])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let report: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let unread: Vec<String> = report["atoms"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["observed_entries"].as_u64() == Some(0))
        .map(|a| a["atom"].as_str().unwrap().to_owned())
        .collect();
    assert!(
        unread.contains(&unused),
        "closure-bloat does not name the unused atom: {report}"
    );
}

#[test]
fn reading_an_undeclared_toolchain_file_fails_and_names_the_path() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let atoms = toolchain(&store);
    // Compose without make: the build's `make` is not in the declared closure.
    let tc: Vec<String> = atoms
        .iter()
        .filter(|a| a.0 != "make")
        .map(|a| a.1.clone())
        .collect();
    let src = import(&store, &inputs().join("src/hello_2.10.orig.tar.gz"));
    let action = write_action(
        t.path(),
        "a.toml",
        &format!(
            "[inputs]\ntoolchain = [{}]\nsource = \"{src}\"\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"cat /usr/bin/make > /dev/null\"]\n",
            quoted(&tc)
        ),
    );
    let (o, v) = build(&store, &action);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    no_leftovers(t.path());
    let log = fhsx(&store)
        .args(["store", "blob", v.unwrap()["log"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&log.stdout).contains("/usr/bin/make"));
}

fn sh_action(closure: &str, script: &str, extra: &str) -> String {
    format!(
        "[inputs]\nclosure = [\"{closure}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {:?}]\ntimeout = \"60s\"\n{extra}",
        format!("busybox mkdir -p $out; {script}")
    )
}

#[test]
fn writes_outside_scratch_fail_and_change_nothing() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let before = fs::read_dir(store.join("blobs/00")).unwrap().count();
    // Each attempt must fail inside; the script records which succeeded.
    let script = r#"
        for p in /etc/evil /bin/evil /usr/evil /evil /proc/evil /run/evil /build/../evil; do
          if echo x > "$p" 2>/dev/null; then echo "WROTE $p"; fi
        done
        if busybox mkdir /newdir 2>/dev/null; then echo "WROTE /newdir"; fi
        if busybox mount -t tmpfs none /etc 2>/dev/null; then echo "MOUNTED"; fi
        echo ok > /tmp/fine && echo ok > $out/fine
    "#;
    let action = write_action(t.path(), "w.toml", &sh_action(&bb, script, ""));
    let (o, v) = build(&store, &action);
    assert!(o.status.success(), "{}", text(&o));
    let v = v.unwrap();
    let log = log_of(&store, &v);
    assert!(
        !log.contains("WROTE") && !log.contains("MOUNTED"),
        "a write escaped scratch:\n{log}"
    );
    // The store's own objects were not touched from inside (only new ones added).
    assert!(fs::read_dir(store.join("blobs/00")).unwrap().count() >= before);
    let o = fhsx(&store).args(["store", "verify"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    no_leftovers(t.path());
}

#[test]
fn corrupt_blob_in_the_closure_is_an_integrity_error_naming_the_path() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let extra = t.path().join("extra");
    fs::create_dir_all(extra.join("usr/share/data")).unwrap();
    fs::write(extra.join("usr/share/data/payload.txt"), b"payload bytes").unwrap();
    let extra = import(&store, &extra);
    let blob = fhsx(&store)
        .args([
            "--json",
            "store",
            "ls",
            &extra,
            "usr/share/data/payload.txt",
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&blob.stdout).unwrap();
    let hex = v[0]["digest"]
        .as_str()
        .unwrap()
        .trim_start_matches("b3:")
        .to_owned();
    let p = store.join("blobs").join(&hex[..2]).join(&hex);
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&p, b"PAYLOAD BYTES").unwrap();
    let action = write_action(
        t.path(),
        "c.toml",
        &format!(
            "[inputs]\nclosure = [\"{bb}\", \"{extra}\"]\n[run]\ncommand = [\"/bin/busybox\", \"cat\", \"/usr/share/data/payload.txt\"]\n"
        ),
    );
    let (o, _) = build(&store, &action);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(
        text(&o).contains("usr/share/data/payload.txt"),
        "the error does not name the path: {}",
        text(&o)
    );
    assert!(
        !String::from_utf8_lossy(&o.stdout).contains("PAYLOAD"),
        "corrupt bytes reached the build"
    );
    no_leftovers(t.path());
}

#[test]
fn failing_and_timed_out_builds_leave_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let fail = write_action(
        t.path(),
        "f.toml",
        &sh_action(&bb, "echo partial > $out/x; exit 7", ""),
    );
    let (o, v) = build(&store, &fail);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let v = v.unwrap();
    assert!(
        v["outputs"].as_object().unwrap().is_empty(),
        "a failed build produced an output: {v}"
    );
    assert_eq!(v["exit"]["code"], 7);
    no_leftovers(t.path());

    let slow = write_action(
        t.path(),
        "s.toml",
        &sh_action(
            &bb,
            "trap '' TERM; busybox sleep 600 & busybox sleep 600",
            "",
        )
        .replace("\"60s\"", "\"2s\""),
    );
    let started = std::time::Instant::now();
    let (o, v) = build(&store, &slow);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(v.unwrap()["exit"]["kind"], "timed_out");
    assert!(started.elapsed() < std::time::Duration::from_secs(60));
    no_leftovers(t.path());
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("busybox sleep 600"),
        "a build process survived"
    );
}

#[test]
fn bad_action_files_exit_2_with_a_clear_error() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let good = format!("b3:{}", "ab".repeat(32));
    let cases = [
        ("syntax", "[inputs\n".to_owned(), "line 1"),
        ("unknown key", format!("[inputs]\nclosure = [\"{good}\"]\n[run]\ncommand = [\"x\"]\nfrobnicate = 1\n"), "frobnicate"),
        ("bad digest", "[inputs]\nclosure = [\"sha256:abc\"]\n[run]\ncommand = [\"x\"]\n".to_owned(), "invalid digest"),
        ("missing object", format!("[inputs]\nclosure = [\"{good}\"]\n[run]\ncommand = [\"x\"]\n"), "not in the store"),
        ("empty command", format!("[inputs]\nclosure = [\"{good}\"]\n[run]\ncommand = []\n"), "command is empty"),
        ("bad timeout", format!("[inputs]\nclosure = [\"{good}\"]\n[run]\ncommand = [\"x\"]\ntimeout = \"soon\"\n"), "bad duration"),
        ("escaping output", format!("[inputs]\nclosure = [\"{good}\"]\n[run]\ncommand = [\"x\"]\n[outputs]\nnames = [\"../etc\"]\n"), "output name"),
        ("record without flag", format!("[inputs]\nclosure = [\"{good}\"]\n[run]\ncommand = [\"x\"]\n[network]\nmode = \"record\"\nlock = \"f.lock\"\n"), "--record"),
    ];
    for (name, body, needle) in cases {
        let p = write_action(t.path(), &format!("{}.toml", name.replace(' ', "-")), &body);
        let o = fhsx(&store).arg("build").arg(&p).output().unwrap();
        assert_eq!(o.status.code(), Some(2), "{name}: {}", text(&o));
        assert!(
            text(&o).contains(needle),
            "{name}: error lacks {needle:?}: {}",
            text(&o)
        );
    }
    let o = fhsx(&store)
        .arg("build")
        .arg(t.path().join("absent.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
}

fn fetch_action(bb: &str, url: &str, mode: &str) -> String {
    format!(
        "[inputs]\nclosure = [\"{bb}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox wget -O $out/file {url}\"]\ntimeout = \"60s\"\n[network]\nmode = \"{mode}\"\nlock = \"fetch.lock\"\n"
    )
}

#[test]
fn fetch_records_then_replays_without_upstream_and_refuses_the_unrecorded() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let (port, stop) = mirror(b"upstream payload v1\n");
    let url = format!("http://127.0.0.1:{port}/pub/file-1.0.tar.gz");

    // Record needs --record; with it, the lock is written.
    let rec = write_action(t.path(), "record.toml", &fetch_action(&bb, &url, "record"));
    let o = fhsx(&store)
        .arg("--json")
        .arg("build")
        .arg(&rec)
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(2),
        "record without --record ran: {}",
        text(&o)
    );
    let o = fhsx(&store)
        .args(["--json", "build", "--record"])
        .arg(&rec)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let recorded: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let lock = fs::read_to_string(t.path().join("fetch.lock")).unwrap();
    assert!(lock.contains(&url), "lock lacks the URL:\n{lock}");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);

    // Replay with the upstream gone: the same output.
    let rep = write_action(t.path(), "replay.toml", &fetch_action(&bb, &url, "replay"));
    let (o, v) = build(&store, &rep);
    assert!(o.status.success(), "{}", text(&o));
    let v = v.unwrap();
    assert_eq!(
        v["outputs"], recorded["outputs"],
        "replay gave another output"
    );
    let out = t.path().join("fetched");
    assert!(fhsx(&store)
        .args(["store", "export", v["outputs"]["out"].as_str().unwrap()])
        .arg(&out)
        .status()
        .unwrap()
        .success());
    assert_eq!(
        fs::read(out.join("file")).unwrap(),
        b"upstream payload v1\n"
    );

    // Another URL: refused at the boundary, exit 3, the refusal in the log and the record.
    let other = write_action(
        t.path(),
        "other.toml",
        &fetch_action(&bb, &url.replace("file-1.0", "file-2.0"), "replay"),
    );
    let o = fhsx(&store).arg("build").arg(&other).output().unwrap();
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    let err = text(&o);
    assert!(
        err.contains("fetch refused") && err.contains("file-2.0"),
        "{err}"
    );
    let record = err
        .split_whitespace()
        .find(|w| w.starts_with("b3:") && err.contains(&format!("record {w}")))
        .map(str::to_owned)
        .expect("the error names the record");
    let shown = fhsx(&store)
        .args(["--json", "record", "show", &record])
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&shown.stdout).unwrap();
    let violations = shown["record"]["violations"].as_array().unwrap();
    assert!(
        violations
            .iter()
            .any(|v| v.as_str().unwrap().contains("file-2.0")),
        "{shown}"
    );
    let log = fhsx(&store)
        .args([
            "store",
            "blob",
            shown["record"]["log_digest"].as_str().unwrap(),
        ])
        .output()
        .unwrap();
    assert!(String::from_utf8_lossy(&log.stdout).contains("fetch refused"));
    no_leftovers(t.path());
}

#[test]
fn sigint_stops_a_build_and_leaves_nothing_behind() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = write_action(
        t.path(),
        "long.toml",
        &sh_action(
            &bb,
            "echo started; busybox sleep 300 & busybox sleep 300",
            "",
        )
        .replace("\"60s\"", "\"10m\""),
    );
    let child = fhsx(&store)
        .arg("build")
        .arg(&action)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until the build is running (its scratch exists), then SIGINT it.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .any(|e| e.file_name().to_string_lossy().starts_with("fhsx-build-"))
    {
        assert!(
            std::time::Instant::now() < deadline,
            "the build never started"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: sending a signal to our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    no_leftovers(t.path());
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(
        !String::from_utf8_lossy(&ps.stdout).contains("busybox sleep 300"),
        "a build process survived SIGINT"
    );
}

#[test]
fn keep_failed_keeps_the_scratch_and_says_where() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = write_action(
        t.path(),
        "k.toml",
        &sh_action(&bb, "echo clue > /build/clue.txt; exit 3", ""),
    );
    let o = fhsx(&store)
        .args(["build", "--keep-failed"])
        .arg(&action)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let line = err
        .lines()
        .find(|l| l.contains("kept the failed build's scratch at"))
        .expect(&err);
    let dir = line.rsplit(' ').next().unwrap();
    assert_eq!(
        fs::read_to_string(Path::new(dir).join("clue.txt")).unwrap(),
        "clue\n"
    );
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let t_s = t.path().to_string_lossy().to_string();
    assert!(
        !mounts
            .lines()
            .any(|l| l.contains(&t_s) && l.contains("fhsx-view")),
        "the view stayed mounted"
    );
    // As root the scratch is its own file system, kept mounted for
    // inspection; the message says how to let it go.
    if mounts.lines().any(|l| l.contains(dir)) {
        assert!(err.contains(&format!("`umount {dir}` when done")), "{err}");
        let u = Command::new("umount").arg(dir).output().unwrap();
        assert!(u.status.success(), "{}", text(&u));
    }
}

/// A build killed outright (SIGKILL: no cleanup at all) leaves its working
/// area — scratch file system and view mounted — behind; the next build
/// finds its lock free and removes it all.
#[test]
fn a_killed_build_is_swept_by_the_next_one() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = write_action(
        t.path(),
        "long.toml",
        &sh_action(&bb, "echo started; busybox sleep 300", "").replace("\"60s\"", "\"10m\""),
    );
    let mut child = fhsx(&store)
        .arg("build")
        .arg(&action)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut err = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut line = String::new();
    while !line.contains("started") {
        line.clear();
        use std::io::BufRead;
        assert!(
            err.read_line(&mut line).unwrap() > 0,
            "the build never started"
        );
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGKILL) };
    child.wait().unwrap();
    let areas = || -> Vec<PathBuf> {
        fs::read_dir(t.path())
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("fhsx-build-"))
            .map(|e| e.path())
            .collect()
    };
    let left = areas();
    assert_eq!(left.len(), 1, "SIGKILL should leave the area: {left:?}");
    // Any build elsewhere (another $TMPDIR) already detaches what the dead
    // one left mounted: its registry records name it.
    let elsewhere = tempfile::tempdir().unwrap();
    support::passable(elsewhere.path());
    let quick = write_action(t.path(), "quick.toml", &sh_action(&bb, "echo hi", ""));
    let o = fhsx(&store)
        .env("TMPDIR", elsewhere.path())
        .arg("build")
        .arg(&quick)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mounts = fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(
        !mounts.contains(left[0].to_str().unwrap()),
        "the killed build's mounts outlived the next build elsewhere:\n{mounts}"
    );
    // The orphaned sandbox dies with its bwrap parent (--die-with-parent);
    // a build in the same $TMPDIR removes the area itself (a build that
    // runs: a cache hit makes no working area).
    let o = fhsx(&store)
        .args(["build", "--rebuild"])
        .arg(&quick)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        areas().is_empty(),
        "the killed build's area is still there: {:?}",
        areas()
    );
    no_leftovers(t.path());
}

#[test]
fn names_with_percent_and_non_utf8_bytes_are_not_false_violations() {
    use std::os::unix::ffi::OsStrExt;
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let odd = t.path().join("odd");
    fs::create_dir_all(odd.join("data")).unwrap();
    fs::write(odd.join("data/100%.txt"), b"percent").unwrap();
    fs::write(
        odd.join("data")
            .join(std::ffi::OsStr::from_bytes(b"caf\xe9")),
        b"latin1",
    )
    .unwrap();
    let odd = import(&store, &odd);
    let action = write_action(
        t.path(),
        "odd.toml",
        &format!(
            "[inputs]\nclosure = [\"{bb}\", \"{odd}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir $out; cat /data/100%.txt /data/caf*\"]\n"
        ),
    );
    let (o, _) = build(&store, &action);
    assert!(o.status.success(), "{}", text(&o));
}

/// As root the scratch is a file system of `[limits] disk` bytes of its
/// own: the build sees its size, it never zeroes inode tables behind
/// the build's back (`noinit_itable`), and it sends no cache flush to the
/// host's disk (`nobarrier`).
/// Without root there is no such file system, and the log says so.
#[test]
fn scratch_is_a_file_system_of_the_declared_disk_size() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = write_action(
        t.path(),
        "df.toml",
        &sh_action(
            &bb,
            "busybox df -k /build | busybox tail -1; busybox grep ' /build ' /proc/self/mounts",
            "[limits]\ndisk = 67108864\n",
        ),
    );
    let o = fhsx(&store).arg("build").arg(&action).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let log = String::from_utf8_lossy(&o.stderr).into_owned();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        assert!(log.contains("[limits] disk is not enforced here"), "{log}");
        no_leftovers(t.path());
        return;
    }
    let size_k: u64 = log
        .lines()
        .find(|l| l.trim_end().ends_with("/build"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no df line for /build:\n{log}"));
    // ext4 keeps a little for itself: between 56 and 64 MiB usable.
    assert!(
        (56 << 10..=64 << 10).contains(&size_k),
        "{size_k} KiB:\n{log}"
    );
    let mount = log
        .lines()
        .find(|l| l.contains(" /build ext4 "))
        .unwrap_or_else(|| panic!("/build is not its own ext4:\n{log}"));
    for opt in ["nosuid", "nodev", "noinit_itable", "nobarrier"] {
        assert!(mount.contains(opt), "{opt} missing: {mount}");
    }
    no_leftovers(t.path());
}

/// `--opens`: by default (`kernel`, no message per open) a file the build
/// opens but never reads is only looked up in the read set, one it reads
/// is read, and the build's output is the same as with `--opens daemon`
/// (each open a message to the view's daemon, which hands the kernel the
/// store file), where the open alone counts as a read.
#[test]
fn opens_without_a_message_record_what_was_read_and_with_one_what_was_opened() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let doc = "/usr/share/doc/busybox-static";
    let action = write_action(
        t.path(),
        "opens.toml",
        &sh_action(
            &bb,
            &format!(
                ": < {doc}/copyright && busybox cat {doc}/examples/mdev.conf > $out/mdev.conf"
            ),
            "",
        ),
    );
    let access = |opens: &str| {
        let o = fhsx(&store)
            .args(["--json", "build", "--rebuild", "--opens", opens])
            .arg(&action)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let rs = fhsx(&store)
            .args(["store", "blob", v["read_set"].as_str().unwrap()])
            .output()
            .unwrap();
        let rs: serde_json::Value = serde_json::from_slice(&rs.stdout).unwrap();
        let of = |path: &str| {
            rs["entries"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["path"] == path)
                .map(|e| e["access"].as_str().unwrap().to_owned())
        };
        (
            of(&format!("{doc}/copyright")),
            of(&format!("{doc}/examples/mdev.conf")),
            v["outputs"]["out"].clone(),
        )
    };
    let (opened, read, out_kernel) = access("kernel");
    assert_eq!(opened.as_deref(), Some("lookup"), "opened, never read");
    assert_eq!(read.as_deref(), Some("read"));
    let (opened, read, out_daemon) = access("daemon");
    assert_eq!(opened.as_deref(), Some("read"), "an open is a read here");
    assert_eq!(read.as_deref(), Some("read"));
    assert_eq!(out_kernel, out_daemon);
    no_leftovers(t.path());
}

/// Outputs placed in the root (`[outputs] at`): each is a directory of the
/// scratch bound at its path, holding at first what the closure has there;
/// there is no `/build`, and nothing else is writable.
#[test]
fn outputs_placed_in_the_root_are_the_only_writable_places() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let src = t.path().join("src");
    fs::create_dir_all(src.join("srv/work")).unwrap();
    fs::write(src.join("srv/work/in.txt"), "in\n").unwrap();
    std::os::unix::fs::symlink("work", src.join("srv/link")).unwrap();
    let src = import(&store, &src);
    let script = r#"
        cat in.txt > copy
        busybox ln -s ../../etc/up up && busybox ln -s /build/out/x abs
        busybox mkdir -p /install/bin && echo made > /install/bin/x
        for p in /srv/evil /etc/evil /build/evil /evil /usr/evil; do
          if echo x > "$p" 2>/dev/null; then echo "WROTE $p"; fi
        done
        echo "work=$work install=$install home=$HOME pwd=$(pwd)"
    "#;
    let placed = |name: &str, script: &str, work: &str| {
        write_action(
            t.path(),
            name,
            &format!(
                "[inputs]\nclosure = [\"{bb}\", \"{src}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {script:?}]\nworkdir = \"/srv/work\"\ntimeout = \"60s\"\n[outputs]\nnames = [\"work\", \"install\"]\nat = {{ work = {work:?}, install = \"/install\" }}\n"
            ),
        )
    };
    let (o, v) = build(&store, &placed("placed.toml", script, "/srv/work"));
    assert!(o.status.success(), "{}", text(&o));
    let v = v.unwrap();
    let log = log_of(&store, &v);
    assert!(!log.contains("WROTE"), "a write escaped the places:\n{log}");
    assert!(
        log.contains("work=/srv/work install=/install home=/tmp pwd=/srv/work"),
        "{log}"
    );
    let cat = |output: &str, path: &str| {
        let o = fhsx(&store)
            .args(["store", "cat", v["outputs"][output].as_str().unwrap(), path])
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    // The working directory's output holds the input it started with.
    assert_eq!(cat("work", "in.txt"), "in\n");
    assert_eq!(cat("work", "copy"), "in\n");
    assert_eq!(cat("install", "bin/x"), "made\n");
    // A placed output lives at its path: a link may climb to `/` from
    // there, and one into /build (which the sandbox does not have) is
    // kept as written, not rewritten as if it named an output.
    assert!(!log.contains("rewritten"), "{log}");
    let links = fhsx(&store)
        .args(["store", "ls", v["outputs"]["work"].as_str().unwrap()])
        .output()
        .unwrap();
    let links = text(&links);
    assert!(
        links.contains("../../etc/up") && links.contains("/build/out/x"),
        "{links}"
    );

    // One step above `/` leaves the root: refused, nothing kept.
    let (o, _) = build(
        &store,
        &placed(
            "climb.toml",
            "busybox ln -s ../../../etc climb",
            "/srv/work",
        ),
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(text(&o).contains("leaves the output"), "{}", text(&o));
    // A place through a symlink of the view would mount where the link
    // points: refused before anything runs.
    let (o, _) = build(&store, &placed("through.toml", "true", "/srv/link/x"));
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("/srv/link is a symlink in the view"),
        "{}",
        text(&o)
    );
    no_leftovers(t.path());
}
