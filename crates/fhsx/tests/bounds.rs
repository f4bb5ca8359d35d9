//! The executor is bounded too: what a build prints, probes or records is
//! capped, and gc never pulls the floor from under a build — real builds,
//! real FUSE, a real loopback mirror.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use support::{build_json as build, busybox, fhsx, no_leftovers, text};

fn action(dir: &Path, name: &str, closure: &str, script: &str, extra: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(
        &p,
        format!(
            "[inputs]\nclosure = [{closure}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {script:?}]\ntimeout = \"120s\"\n{extra}"
        ),
    )
    .unwrap();
    p
}

fn blobs(store: &Path) -> std::collections::BTreeSet<PathBuf> {
    fs::read_dir(store.join("blobs"))
        .unwrap()
        .flatten()
        .flat_map(|s| fs::read_dir(s.path()).unwrap().flatten().map(|b| b.path()))
        .collect()
}

fn record(store: &Path, digest: &serde_json::Value) -> serde_json::Value {
    let o = fhsx(store)
        .args(["--json", "record", "show", digest.as_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A build that prints past `[limits] log` is stopped as a limit failure
/// naming the limit; the stored log holds at most the cap (plus fhsx's own
/// lines); nothing is cached.
#[test]
fn a_log_flood_is_stopped_at_limits_log() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox(&store));
    let a = action(
        t.path(),
        "flood.toml",
        &bb,
        "busybox mkdir $out; while :; do echo 0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef; done",
        "[limits]\nlog = 1048576\n",
    );
    let (o, v) = build(&store, &a, &[]);
    assert_eq!(
        o.status.code(),
        Some(1),
        "{}",
        text(&o).chars().take(2000).collect::<String>()
    );
    assert!(v["error"].as_str().unwrap().contains("[limits] log"), "{v}");
    assert_eq!(v["exit"]["kind"], "limit_exceeded", "{v}");
    let log = fhsx(&store)
        .args(["store", "blob", v["log"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        log.stdout.len() <= (1 << 20) + 4096,
        "{} bytes kept",
        log.stdout.len()
    );
    assert!(
        log.stdout.len() >= 1 << 20,
        "{} bytes kept",
        log.stdout.len()
    );
    let rec = record(&store, &v["record"]);
    assert_eq!(rec["record"]["exit"]["limit"], "[limits] log");
    no_leftovers(t.path());
    let (o, _) = build(&store, &a, &[]);
    assert!(
        text(&o).contains("0123456789abcdef"),
        "a failed flood was cached"
    );
}

/// A build that probes past `[limits] reads` distinct paths fails as a
/// limit failure; its record says the read set is incomplete, and it is
/// never a cache hit.
#[test]
fn a_read_set_flood_is_stopped_at_limits_reads() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox(&store));
    let a = action(
        t.path(),
        "probe.toml",
        &bb,
        "busybox mkdir $out; i=0; while [ $i -lt 3000 ]; do busybox test -e /usr/absent-$i; i=$((i+1)); done; echo probed",
        "[limits]\nreads = 1000\n",
    );
    let (o, v) = build(&store, &a, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        v["error"].as_str().unwrap().contains("[limits] reads"),
        "{v}"
    );
    let rec = record(&store, &v["record"]);
    assert_eq!(rec["record"]["read_set_complete"], false, "{rec}");
    assert!(rec["record"]["read_set_size"].as_u64().unwrap() <= 1000);
    assert!(v["outputs"].as_object().unwrap().is_empty());
    let (_, again) = build(&store, &a, &[]);
    assert_eq!(
        again["cached"], false,
        "an incomplete read set answered the cache"
    );
    // Inside the cap the same probe passes.
    let ok = action(
        t.path(),
        "ok.toml",
        &bb,
        "busybox mkdir $out; i=0; while [ $i -lt 300 ]; do busybox test -e /usr/absent-$i; i=$((i+1)); done",
        "[limits]\nreads = 1000\n",
    );
    let (o, _) = build(&store, &ok, &[]);
    assert!(o.status.success(), "{}", text(&o));
    no_leftovers(t.path());
}

/// `fhsx store gc --keep X`, run again and again while a build reads an
/// atom not under X, deletes nothing the build uses: the build succeeds
/// (no false integrity alarm). Afterwards the kept output's record stays
/// (and still answers the cache); a record whose output was collected goes
/// with it.
#[test]
fn gc_never_pulls_the_floor_and_keeps_the_records_of_kept_outputs() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    // Inputs as paths: what gc collects between builds is imported again.
    let bb = support::busybox_deb().display().to_string();
    let data = t.path().join("data");
    fs::create_dir_all(data.join("usr/share/data")).unwrap();
    for i in 0..200 {
        fs::write(
            data.join(format!("usr/share/data/f{i}")),
            format!("payload {i}\n").repeat(100),
        )
        .unwrap();
    }
    let a = action(
        t.path(),
        "reader.toml",
        &format!("{bb:?}, \"data\""),
        "busybox mkdir $out; echo started; busybox sleep 2; busybox cat /usr/share/data/* | busybox md5sum > $out/sum",
        "",
    );
    let other = action(
        t.path(),
        "other.toml",
        &format!("{bb:?}"),
        "busybox mkdir $out; echo other > $out/o",
        "",
    );
    let (o, kept) = build(&store, &other, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let keep = kept["outputs"]["out"].as_str().unwrap().to_owned();

    let mut child = fhsx(&store)
        .args(["--json", "build"])
        .arg(&a)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // gc from the moment the build runs (before it, nothing holds the
    // atoms: a gc then may rightly collect them).
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
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(4);
    let mut collected = 0;
    while std::time::Instant::now() < deadline {
        let g = fhsx(&store)
            .args(["--json", "store", "gc", "--keep", &keep])
            .output()
            .unwrap();
        assert!(g.status.success(), "{}", text(&g));
        let r: serde_json::Value = serde_json::from_slice(&g.stdout).unwrap();
        collected += r["deleted_blobs"].as_u64().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let o = child.wait_with_output().unwrap();
    let mut rest = String::new();
    let _ = std::io::Read::read_to_string(&mut err, &mut rest);
    assert!(
        o.status.success(),
        "gc pulled the floor from under the build: {}{rest}",
        text(&o)
    );
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let _ = collected;

    // Kept: other's output, hence its record, which still answers.
    let g = fhsx(&store)
        .args(["store", "gc", "--keep", &keep])
        .output()
        .unwrap();
    assert!(g.status.success(), "{}", text(&g));
    let (o, again) = build(&store, &other, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        again["cached"], true,
        "the kept output's record was collected: {again}"
    );
    assert_eq!(again["record"], kept["record"]);
    let o = fhsx(&store)
        .args(["record", "show", kept["record"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    // Not kept: the reader's output went, and its record with it.
    let o = fhsx(&store)
        .args(["record", "show", v["record"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        !o.status.success(),
        "the record of a collected output stayed: {}",
        text(&o)
    );
    let (o, rebuilt) = build(&store, &a, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(rebuilt["cached"], false);
    // Persistent roots: gc with no argument keeps exactly them.
    // By reference: the action's output, taken from the cache.
    let o = fhsx(&store)
        .args([
            "store",
            "root",
            "add",
            &format!("{}#out", a.display()),
            "--name",
            "reader",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let g = fhsx(&store).args(["store", "gc"]).output().unwrap();
    assert!(g.status.success(), "{}", text(&g));
    let (_, hit) = build(&store, &a, &[]);
    assert_eq!(
        hit["cached"], true,
        "a persistent root's record was collected"
    );
    let v = fhsx(&store).args(["store", "verify"]).output().unwrap();
    assert!(v.status.success(), "{}", text(&v));
    no_leftovers(t.path());
}

/// A recording past `[limits] fetch` aborts as a violation naming the
/// limit; no blob of the partial body is kept, and the lock is untouched.
#[test]
fn a_recording_past_limits_fetch_aborts_and_keeps_nothing() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox(&store));
    static BODY: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    let body = BODY.get_or_init(|| (0..3 << 20).map(|i| (i * 7 % 251) as u8).collect());
    let (port, stop) = support::mirror(body);
    let a = action(
        t.path(),
        "fetch.toml",
        &bb,
        &format!("busybox mkdir $out && busybox wget -O $out/f http://127.0.0.1:{port}/big"),
        "[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n[limits]\nfetch = 1048576\n",
    );
    let before = blobs(&store);
    let (o, _) = build(&store, &a, &["--record"]);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains("[limits] fetch"), "{}", text(&o));
    assert!(
        !t.path().join("fetch.lock").exists(),
        "a failed recording wrote the lock"
    );
    let big = castore::Digest::of(body);
    assert!(
        !store
            .join("blobs")
            .join(&big.hex()[..2])
            .join(big.hex())
            .exists(),
        "the body was stored"
    );
    // Nothing of the partial body either: what the build added (log, read
    // set, record, …) is small.
    for blob in blobs(&store).difference(&before) {
        let len = fs::metadata(blob).unwrap().len();
        assert!(
            len < 512 << 10,
            "a {len}-byte blob was kept: {}",
            blob.display()
        );
    }
    no_leftovers(t.path());
}
