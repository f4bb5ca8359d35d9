//! Actions as a graph: outputs that are atoms, references by name, the
//! action cache, `--check` and `--record` — real builds, real bwrap and
//! FUSE, real Debian packages, a real loopback mirror.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{
    build_json as build, busybox, busybox_deb, fhsx, inputs, mirror, no_leftovers, text,
};

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

fn ok(store: &Path, action: &Path, flags: &[&str]) -> serde_json::Value {
    let (o, v) = build(store, action, flags);
    assert!(o.status.success(), "{}: {}", action.display(), text(&o));
    v
}

/// Every object file in the store (blobs and directories).
fn objects(store: &Path) -> usize {
    ["blobs", "dirs"]
        .iter()
        .flat_map(|k| fs::read_dir(store.join(k)).unwrap().flatten())
        .map(|shard| fs::read_dir(shard.path()).unwrap().count())
        .sum()
}

fn sh(closure: &str, script: &str, extra: &str) -> String {
    format!(
        "[inputs]\nclosure = [{closure}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {script:?}]\ntimeout = \"60s\"\n{extra}"
    )
}

fn quoted(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| format!("{:?}", p.display().to_string()))
        .collect::<Vec<_>>()
        .join(", ")
}

fn debs(names: &[&str]) -> Vec<PathBuf> {
    let dir = inputs().join("debs");
    names
        .iter()
        .map(|n| {
            fs::read_dir(&dir)
                .unwrap()
                .flatten()
                .map(|e| e.path())
                .find(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with(&format!("{n}_"))
                })
                .unwrap_or_else(|| panic!("{n}'s .deb (tests/support fetches it)"))
        })
        .collect()
}

/// The hello example as three actions chained by name — fetch (recorded,
/// then replayed), build, run-the-output — with no digest in any file:
/// inputs are paths (imported) and references. The built binary is found
/// at its FHS path by the third action, whose closure is hello's output,
/// its runtime libraries and busybox, no toolchain. A second build of each
/// is a cache hit that starts no sandbox.
#[test]
fn three_actions_chained_by_name_build_then_hit_the_cache() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let src = fs::read(inputs().join("src/hello_2.10.orig.tar.gz")).unwrap();
    let (port, stop) = mirror(Box::leak(src.into_boxed_slice()));
    let bb = busybox_deb();
    let toolchain: Vec<PathBuf> = fs::read_dir(inputs().join("debs"))
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .collect();
    let fetch = write(
        t.path(),
        "fetch.toml",
        &format!(
            "[inputs]\nclosure = [{:?}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out/usr/src && busybox wget -O $out/usr/src/hello-2.10.tar.gz http://127.0.0.1:{port}/gnu/hello/hello-2.10.tar.gz\"]\ntimeout = \"60s\"\n[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n",
            bb.display().to_string()
        ),
    );
    let build_toml = write(
        t.path(),
        "build.toml",
        &format!(
            "[inputs]\nclosure = [\"fetch.toml#out\"]\ntoolchain = [{}]\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"tar xzf /usr/src/hello-2.10.tar.gz && cd hello-2.10 && ./configure --prefix=/usr && make -j2 && make install DESTDIR=$out\"]\ntimeout = \"15m\"\n",
            quoted(&toolchain)
        ),
    );
    let mut runtime = debs(&["libc6", "libgcc-s1", "gcc-12-base"]);
    runtime.push(bb.clone());
    let run = write(
        t.path(),
        "run.toml",
        &format!(
            "[inputs]\nclosure = [\"build.toml#out\", {}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && hello > $out/greeting && busybox cat $out/greeting\"]\ntimeout = \"60s\"\n",
            quoted(&runtime)
        ),
    );
    for f in [&fetch, &build_toml, &run] {
        let body = fs::read_to_string(f).unwrap();
        assert!(!body.contains("b3:"), "{} names a digest", f.display());
    }

    // No lock yet: the replay action says how to record it.
    let (o, _) = build(&store, &run, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("--record"), "{}", text(&o));
    // Record the fetch (the one impure step), then stop the mirror.
    let recorded = ok(&store, &fetch, &["--record"]);
    assert!(fs::read_to_string(t.path().join("fetch.lock"))
        .unwrap()
        .contains("hello-2.10.tar.gz"));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);

    let first = ok(&store, &run, &[]);
    assert_eq!(first["cached"], false);
    no_leftovers(t.path());
    let greeting = fhsx(&store)
        .args([
            "store",
            "cat",
            first["outputs"]["out"].as_str().unwrap(),
            "greeting",
        ])
        .output()
        .unwrap();
    assert_eq!(greeting.stdout, b"Hello, world!\n", "{}", text(&greeting));
    // The replayed fetch made what the recording made.
    let replayed = ok(&store, &fetch, &[]);
    assert_eq!(replayed["outputs"], recorded["outputs"]);
    assert_eq!(
        replayed["cached"], true,
        "the replay was built by the chain already"
    );

    // Again: every action is a cache hit; no sandbox starts, so no object
    // (log, read set, output) is written and the command prints nothing.
    let before = objects(&store);
    for action in [&fetch, &build_toml, &run] {
        let (o, again) = build(&store, action, &[]);
        assert!(o.status.success(), "{}", text(&o));
        assert_eq!(again["cached"], true, "{}: {again}", action.display());
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("fhsx: cached:"), "{err}");
        assert!(
            !err.contains("Hello") && !err.contains("checking for"),
            "a command ran: {err}"
        );
    }
    let (_, again) = build(&store, &run, &[]);
    assert_eq!(again["record"], first["record"]);
    assert_eq!(objects(&store), before, "a cache hit wrote to the store");
    no_leftovers(t.path());

    // hello is reproducible: --check rebuilds and compares.
    let checked = ok(&store, &build_toml, &["--check"]);
    assert_eq!(checked["cached"], false);
    assert_eq!(checked["check"]["differences"], serde_json::json!([]));
    let o = fhsx(&store)
        .args(["record", "show", checked["record"].as_str().unwrap()])
        .output()
        .unwrap();
    assert!(text(&o).contains("check of"), "{}", text(&o));
}

/// A record is a hit only if it is trusted, succeeded and is complete;
/// `--rebuild` always runs.
#[test]
fn untrusted_failed_or_incomplete_records_are_not_hits() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox(&store));
    let marker = "COMMAND-RAN";
    let a = write(
        t.path(),
        "a.toml",
        &sh(
            &bb,
            &format!("echo {marker}; busybox mkdir -p $out; echo x > $out/x"),
            "",
        ),
    );
    let ran = |o: &Output| String::from_utf8_lossy(&o.stderr).contains(marker);
    let (o, first) = build(&store, &a, &[]);
    assert!(o.status.success() && ran(&o), "{}", text(&o));
    let (o, v) = build(&store, &a, &[]);
    assert!(!ran(&o) && v["cached"] == true, "{}", text(&o));
    let (o, v) = build(&store, &a, &["--rebuild"]);
    assert!(
        ran(&o) && v["cached"] == false,
        "--rebuild did not run: {}",
        text(&o)
    );

    // Another signing key: the old records are not trusted, unless --trust.
    let old_key = String::from_utf8(fhsx(&store).args(["key", "show"]).output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_owned();
    fs::remove_file(store.join("keys/executor.ed25519")).unwrap();
    let o = fhsx(&store).args(["key", "generate"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let (o, v) = build(&store, &a, &["--trust", &old_key]);
    assert!(
        !ran(&o) && v["cached"] == true,
        "a --trust'ed record was not a hit: {}",
        text(&o)
    );
    let (o, v) = build(&store, &a, &[]);
    assert!(
        ran(&o) && v["cached"] == false,
        "an untrusted record was a hit: {}",
        text(&o)
    );

    // Incomplete: a blob of the output is gone.
    let out = v["outputs"]["out"].as_str().unwrap();
    let ls = fhsx(&store)
        .args(["--json", "store", "ls", out])
        .output()
        .unwrap();
    let entries: serde_json::Value = serde_json::from_slice(&ls.stdout).unwrap();
    let blob = entries
        .as_array()
        .unwrap()
        .iter()
        .find_map(|e| e["digest"].as_str())
        .unwrap()
        .trim_start_matches("b3:")
        .to_owned();
    fs::remove_file(store.join("blobs").join(&blob[..2]).join(&blob)).unwrap();
    let (o, v) = build(&store, &a, &[]);
    assert!(
        ran(&o) && v["cached"] == false,
        "an incomplete record was a hit: {}",
        text(&o)
    );
    assert_ne!(v["record"], first["record"]);

    // Failed: never a hit, the build runs again.
    let f = write(
        t.path(),
        "f.toml",
        &sh(&bb, &format!("echo {marker}; exit 7"), ""),
    );
    for _ in 0..2 {
        let (o, _) = build(&store, &f, &[]);
        assert_eq!(o.status.code(), Some(1), "{}", text(&o));
        assert!(ran(&o), "a failed record was a hit: {}", text(&o));
    }
    // And a check of it is refused, saying why.
    let (o, _) = build(&store, &f, &["--check"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("failed"), "{}", text(&o));
    no_leftovers(t.path());
}

/// `--check`: a reproducible action exits 0; one that writes something
/// different each time (a fresh UUID from the kernel) exits 4, names the
/// path, and keeps the check's record.
#[test]
fn check_exits_4_and_names_what_differs() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox(&store));
    let never = write(t.path(), "never.toml", &sh(&bb, "busybox mkdir $out", ""));
    let (o, _) = build(&store, &never, &["--check"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("never built"), "{}", text(&o));

    let same = write(
        t.path(),
        "same.toml",
        &sh(&bb, "busybox mkdir -p $out/a && echo same > $out/a/f", ""),
    );
    ok(&store, &same, &[]);
    let v = ok(&store, &same, &["--check"]);
    assert_eq!(v["check"]["differences"], serde_json::json!([]), "{v}");

    let clock = write(
        t.path(),
        "clock.toml",
        &sh(
            &bb,
            "busybox mkdir -p $out/share && busybox cat /proc/sys/kernel/random/uuid > $out/share/stamp && echo fixed > $out/fixed",
            "",
        ),
    );
    let first = ok(&store, &clock, &[]);
    let (o, v) = build(&store, &clock, &["--check"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let diffs = v["check"]["differences"].as_array().unwrap();
    assert_eq!(diffs.len(), 1, "{v}");
    assert_eq!(diffs[0]["output"], "out");
    assert_eq!(diffs[0]["path"], "share/stamp");
    assert_eq!(diffs[0]["before"]["size"], 37);
    assert_ne!(diffs[0]["before"]["digest"], diffs[0]["after"]["digest"]);
    assert_eq!(v["check"]["against"], first["record"]);
    // The check's record is kept and says what it checked; the original
    // still answers the cache.
    let show = fhsx(&store)
        .args(["--json", "record", "show", v["record"].as_str().unwrap()])
        .output()
        .unwrap();
    let shown: serde_json::Value = serde_json::from_slice(&show.stdout).unwrap();
    assert_eq!(shown["record"]["check_of"], first["record"]);
    let (_, again) = build(&store, &clock, &[]);
    assert_eq!(again["record"], first["record"]);
    // The text form names the path and both sizes.
    let o = fhsx(&store)
        .args(["build", "--check"])
        .arg(&clock)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4));
    let out = text(&o);
    assert!(
        out.contains("$out/share/stamp") && out.contains("(37 bytes)"),
        "{out}"
    );
    no_leftovers(t.path());
}

/// A cycle, a missing file and an unknown output name are usage errors
/// naming the chain, found before anything runs.
#[test]
fn reference_errors_exit_2_naming_the_chain() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox_deb().display().to_string());
    fs::create_dir(t.path().join("sub")).unwrap();
    write(
        t.path(),
        "a.toml",
        &sh(&format!("{bb}, \"sub/b.toml#out\""), "true", ""),
    );
    write(
        t.path(),
        "sub/b.toml",
        &sh(&format!("{bb}, \"../a.toml#out\""), "true", ""),
    );
    write(
        t.path(),
        "c.toml",
        &sh(&format!("{bb}, \"gone.toml#out\""), "true", ""),
    );
    write(
        t.path(),
        "d.toml",
        &sh(&format!("{bb}, \"e.toml#dev\""), "true", ""),
    );
    write(t.path(), "e.toml", &sh(&bb, "busybox mkdir $out", ""));
    write(
        t.path(),
        "f.toml",
        &sh(&format!("{bb}, \"missing.deb\""), "true", ""),
    );
    for (file, want) in [
        (
            "a.toml",
            vec!["cycle", "a.toml → ", "sub/b.toml#out → ", "a.toml#out"],
        ),
        ("c.toml", vec!["c.toml → ", "gone.toml", "cannot be read"]),
        (
            "d.toml",
            vec![
                "d.toml → ",
                "e.toml#dev",
                "names output dev of",
                "declares only out in",
            ],
        ),
        ("f.toml", vec!["f.toml → ", "missing.deb"]),
    ] {
        let (o, _) = build(&store, &t.path().join(file), &[]);
        assert_eq!(o.status.code(), Some(2), "{file}: {}", text(&o));
        for w in want {
            assert!(text(&o).contains(w), "{file}: lacks {w:?}: {}", text(&o));
        }
    }
    assert!(!store.join("actions").exists(), "something was built");
}

/// `out` and `dev` are separate atoms; each composes on its own at FHS
/// paths; a link into an output is rewritten to where it will be, one
/// into the rest of the scratch refused with a JSON result.
#[test]
fn each_output_is_an_atom_that_composes_on_its_own() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox_deb().display().to_string());
    let lib = write(
        t.path(),
        "lib.toml",
        &sh(
            &bb,
            "busybox mkdir -p $out/usr/lib $dev/usr/include && echo lib > $out/usr/lib/libx.so.1 \
             && echo '#define X 1' > $dev/usr/include/x.h \
             && busybox ln -s /build/out/usr/lib/libx.so.1 $dev/usr/lib-link \
             && busybox ln -s libx.so.1 $out/usr/lib/libx.so",
            "[outputs]\nnames = [\"out\", \"dev\"]\n",
        ),
    );
    let v = ok(&store, &lib, &[]);
    let (out, dev) = (
        v["outputs"]["out"].as_str().unwrap(),
        v["outputs"]["dev"].as_str().unwrap(),
    );
    assert_ne!(out, dev);
    let ls = |d: &str| {
        let o = fhsx(&store)
            .args(["store", "ls", d, "usr"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    assert!(
        ls(out).contains("lib") && !ls(out).contains("include"),
        "{}",
        ls(out)
    );
    assert!(ls(dev).contains("include"), "{}", ls(dev));
    let o = fhsx(&store)
        .args(["--json", "store", "ls", dev, "usr"])
        .output()
        .unwrap();
    let dev_ls: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let link = dev_ls
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["name"] == "lib-link")
        .unwrap_or_else(|| panic!("{dev_ls}"));
    assert_eq!(link["target"], "/usr/lib/libx.so.1", "{link}");
    let log = fhsx(&store)
        .args(["store", "blob", v["log"].as_str().unwrap()])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&log.stdout);
    assert!(
        said.contains("rewritten to /usr/lib/libx.so.1") && !said.contains("dangles"),
        "a link to what an output holds is rewritten, with no warning: {said}"
    );

    let user = write(
        t.path(),
        "user.toml",
        &sh(
            &format!("{bb}, \"lib.toml#dev\""),
            "busybox mkdir $out; busybox cat /usr/include/x.h > $out/seen; busybox ls /usr/lib >> $out/seen 2>&1; true",
            "",
        ),
    );
    let u = ok(&store, &user, &[]);
    let seen = fhsx(&store)
        .args([
            "store",
            "cat",
            u["outputs"]["out"].as_str().unwrap(),
            "seen",
        ])
        .output()
        .unwrap();
    let seen = String::from_utf8_lossy(&seen.stdout);
    assert!(seen.contains("#define X 1"), "{seen}");
    assert!(
        seen.contains("No such file"),
        "dev brought out's files along: {seen}"
    );

    // A link into the scratch outside the outputs: refused, with a result.
    let bad = write(
        t.path(),
        "bad.toml",
        &sh(
            &bb,
            "busybox mkdir $out; busybox ln -s /build/src/x $out/x",
            "",
        ),
    );
    let (o, v) = build(&store, &bad, &["--keep-failed"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(v["error"].as_str().unwrap().contains("scratch"), "{v}");
    assert!(v["record"].is_string() && v["log"].is_string(), "{v}");
    let said = text(&o);
    let kept = said
        .lines()
        .find_map(|l| l.strip_prefix("fhsx: kept the failed build's scratch at "))
        .unwrap_or_else(|| panic!("no kept scratch named: {said}"))
        .to_owned();
    // Kept on purpose, and so left to whoever asked: here, this test.
    let _ = Command::new("umount").arg(&kept).status();
    // A declared output the build did not make is named.
    let none = write(
        t.path(),
        "none.toml",
        &sh(&bb, "true", "[outputs]\nnames = [\"out\", \"doc\"]\n"),
    );
    let (o, v) = build(&store, &none, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(v["error"].as_str().unwrap().contains("$out"), "{v}");
}

/// `--record` on a replay action re-records its lock (from nothing, as
/// `cargo update` re-resolves); a recording that fails leaves the old lock
/// untouched; the new lock makes a new action.
#[test]
fn record_rewrites_a_replay_actions_lock_only_on_success() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = format!("{:?}", busybox_deb().display().to_string());
    let (port, stop) = mirror(b"v1\n");
    let fetch = |url_path: &str, then: &str| {
        sh(
            &bb,
            &format!("busybox mkdir $out && busybox wget -O $out/f http://127.0.0.1:{port}/{url_path} {then}"),
            "[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n",
        )
    };
    let a = write(t.path(), "a.toml", &fetch("one", ""));
    let v1 = ok(&store, &a, &["--record"]);
    let lock1 = fs::read_to_string(t.path().join("fetch.lock")).unwrap();
    assert!(lock1.contains("/one"), "{lock1}");
    let replay = ok(&store, &a, &[]);
    assert_eq!(replay["outputs"], v1["outputs"]);
    assert_ne!(
        replay["action"], v1["action"],
        "a recording answered the replay"
    );

    // Re-recorded with another URL: the old entry is gone (not appended to).
    let a = write(t.path(), "a.toml", &fetch("two", ""));
    ok(&store, &a, &["--record"]);
    let lock2 = fs::read_to_string(t.path().join("fetch.lock")).unwrap();
    assert!(lock2.contains("/two") && !lock2.contains("/one"), "{lock2}");
    let r2 = ok(&store, &a, &[]);
    assert_ne!(
        r2["action"], replay["action"],
        "a new lock must be a new action"
    );

    // A recording whose build fails leaves the lock as it was.
    let a = write(t.path(), "a.toml", &fetch("three", "&& exit 9"));
    let (o, _) = build(&store, &a, &["--record"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(
        fs::read_to_string(t.path().join("fetch.lock")).unwrap(),
        lock2
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    // --record on an action without network is a usage error.
    let none = write(t.path(), "n.toml", &sh(&bb, "busybox mkdir $out", ""));
    let (o, _) = build(&store, &none, &["--record"]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    no_leftovers(t.path());
}
