//! Closure bloat acted on: the read-set-validated cache and pruning, with
//! real builds (busybox and GNU hello on real Debian packages).

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use support::{build_json as build, busybox, fhsx, import, inputs, mirror, text};

fn atom(store: &Path, dir: &Path, files: &[(&str, &str)]) -> String {
    for (p, content) in files {
        let f = dir.join(p);
        fs::create_dir_all(f.parent().unwrap()).unwrap();
        fs::write(f, content).unwrap();
    }
    import(store, dir)
}

fn show(store: &Path, record: &serde_json::Value) -> serde_json::Value {
    let o = fhsx(store)
        .args(["--json", "record", "show", record.as_str().unwrap()])
        .output()
        .unwrap();
    serde_json::from_slice(&o.stdout).unwrap()
}

/// An atom the build never opens added to the closure: the earlier record
/// of the same command answers by validation (no sandbox runs), and a new
/// signed record names it and verifies. A changed file the build read, an
/// atom filling a path it found absent, or a listed directory with a new
/// entry: a real build.
#[test]
fn a_validated_hit_needs_the_read_set_to_hold() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let data = atom(
        &store,
        &t.path().join("d1"),
        &[
            ("data/a", "alpha\n"),
            ("data/unread", "u\n"),
            ("list/x", "x\n"),
        ],
    );
    // Under /usr, which exists anyway: a new top-level directory would
    // change the listing of / that the sandbox makes (and a build sees).
    let unused = atom(
        &store,
        &t.path().join("u"),
        &[("usr/share/debug-tool/tool", "#!/bin/sh\n")],
    );
    let changed = atom(
        &store,
        &t.path().join("d2"),
        &[
            ("data/a", "beta\n"),
            ("data/unread", "u\n"),
            ("list/x", "x\n"),
        ],
    );
    let filler = atom(
        &store,
        &t.path().join("p"),
        &[("data/absent", "now here\n")],
    );
    let lister = atom(&store, &t.path().join("l"), &[("list/y", "y\n")]);
    let marker = "COMMAND-RAN";
    let action = |name: &str, closure: &[&str]| -> PathBuf {
        let p = t.path().join(name);
        let list = closure
            .iter()
            .map(|d| format!("\"{d}\""))
            .collect::<Vec<_>>()
            .join(", ");
        fs::write(
            &p,
            format!("[inputs]\nclosure = [{list}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"echo {marker}; busybox mkdir $out; busybox cat /data/a > $out/a; busybox test -e /data/absent || echo no > $out/absent; busybox ls /list > $out/list\"]\n"),
        )
        .unwrap();
        p
    };
    let ran = |o: &Output| String::from_utf8_lossy(&o.stderr).contains(marker);
    let (o, first) = build(&store, &action("a.toml", &[&bb, &data]), &[]);
    assert!(o.status.success() && ran(&o), "{}", text(&o));

    let plus = action("plus.toml", &[&bb, &data, &unused]);
    let (o, hit) = build(&store, &plus, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(!ran(&o), "an unused atom made it rebuild: {}", text(&o));
    assert_eq!(hit["cached"], true);
    assert_eq!(hit["outputs"], first["outputs"]);
    assert_ne!(
        hit["record"], first["record"],
        "a new record for the new action"
    );
    assert_ne!(hit["action"], first["action"]);
    let rec = show(&store, &hit["record"]);
    assert_eq!(rec["record"]["reused"], first["record"], "{rec}");
    let key =
        String::from_utf8(fhsx(&store).args(["key", "show"]).output().unwrap().stdout).unwrap();
    let v = fhsx(&store)
        .args([
            "record",
            "verify",
            hit["record"].as_str().unwrap(),
            "--trust",
            key.trim(),
        ])
        .output()
        .unwrap();
    assert!(v.status.success(), "{}", text(&v));
    // --check works on such a hit; --rebuild bypasses it.
    let (o, c) = build(&store, &plus, &["--check"]);
    assert!(o.status.success() && ran(&o), "{}", text(&o));
    assert_eq!(c["check"]["differences"], serde_json::json!([]));
    let (o, _) = build(
        &store,
        &action("plus2.toml", &[&unused, &bb, &data]),
        &["--rebuild"],
    );
    assert!(ran(&o), "--rebuild did not run");

    for (name, closure, why) in [
        (
            "changed.toml",
            vec![bb.as_str(), changed.as_str()],
            "a file it read changed",
        ),
        (
            "filled.toml",
            vec![bb.as_str(), data.as_str(), filler.as_str()],
            "a path it found absent is now there",
        ),
        (
            "listed.toml",
            vec![bb.as_str(), data.as_str(), lister.as_str()],
            "a directory it listed gained an entry",
        ),
    ] {
        let (o, v) = build(&store, &action(name, &closure), &[]);
        assert!(o.status.success(), "{}", text(&o));
        assert!(
            ran(&o) && v["cached"] == false,
            "{why}, yet no build ran: {}",
            text(&o)
        );
    }
}

fn hello(store: &Path, dir: &Path) -> (PathBuf, serde_json::Value) {
    let debs: Vec<String> = fs::read_dir(inputs().join("debs"))
        .unwrap()
        .flatten()
        .map(|e| format!("{:?}", e.path().display().to_string()))
        .collect();
    // One package the build never opens.
    let mut tc = debs.join(", ");
    tc.push_str(&format!(
        ", {:?}",
        support::busybox_deb().display().to_string()
    ));
    let a = dir.join("hello.toml");
    fs::write(
        &a,
        format!(
            "[inputs]\ntoolchain = [{tc}]\nsource = {:?}\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"cd hello-2.10 && ./configure --prefix=/usr && make -j2 && make install DESTDIR=$out\"]\nworkdir = \"/build/src\"\ntimeout = \"15m\"\n",
            inputs().join("src/hello_2.10.orig.tar.gz").display().to_string()
        ),
    )
    .unwrap();
    let (o, v) = build(store, &a, &[]);
    assert!(o.status.success(), "hello: {}", text(&o));
    (a, v)
}

/// hello pruned to the atoms it read, and to exactly the paths it read:
/// fewer atoms, bit-identical outputs (`--prove`), and the proved record
/// names the record it was pruned from. The report names what could go.
#[test]
fn hello_prunes_to_its_read_set_with_proof() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let (_, v) = hello(&store, t.path());
    let record = v["record"].as_str().unwrap();

    let report = fhsx(&store)
        .args(["closure-bloat", record])
        .output()
        .unwrap();
    assert!(report.status.success(), "{}", text(&report));
    let r = String::from_utf8_lossy(&report.stdout);
    assert!(
        r.lines().filter(|l| l.starts_with("could go")).count() >= 1,
        "{r}"
    );
    let json = fhsx(&store)
        .args(["--json", "closure-bloat", record])
        .output()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
    let unused = j["atoms"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["observed_entries"] == 0)
        .count();
    assert!(unused >= 1, "{j}");

    for (how, one_atom) in [("atoms", false), ("paths", true)] {
        let out = t.path().join(format!("pruned-{how}.toml"));
        let o = fhsx(&store)
            .args([
                "--json",
                "closure-bloat",
                &format!("--prune={how}"),
                "--prove",
                "-o",
            ])
            .arg(&out)
            .arg(record)
            .output()
            .unwrap();
        assert!(o.status.success(), "--prune={how} --prove: {}", text(&o));
        let p: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(p["check"]["differences"], serde_json::json!([]), "{p}");
        let (before, after) = (
            p["atoms_before"].as_u64().unwrap(),
            p["atoms_after"].as_u64().unwrap(),
        );
        assert!(after < before, "{how}: {after} of {before} atoms");
        if one_atom {
            assert_eq!(after, 1);
        }
        let shown = show(&store, &p["record"]);
        assert_eq!(shown["record"]["pruned_from"], record, "{shown}");
        let text_show = fhsx(&store)
            .args(["record", "show", p["record"].as_str().unwrap()])
            .output()
            .unwrap();
        assert!(
            text(&text_show).contains("pruned from"),
            "{}",
            text(&text_show)
        );
        assert!(fs::read_to_string(&out).unwrap().contains("Pruned"));
    }
}

/// A replay action pruned keeps its fetch lock: `--prune -o FILE` writes
/// the lock beside the pruned action, which names it, and `--prove`
/// replays it to the same output.
#[test]
fn a_pruned_replay_action_keeps_its_lock_and_proves() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let unused = atom(
        &store,
        &t.path().join("u"),
        &[("usr/share/debug-tool/tool", "#!/bin/sh\n")],
    );
    let (port, stop) = mirror(b"fetched bytes\n");
    let action = t.path().join("fetch.toml");
    fs::write(
        &action,
        format!("[inputs]\nclosure = [\"{bb}\", \"{unused}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir $out && busybox wget -O $out/got http://127.0.0.1:{port}/file\"]\n[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n"),
    )
    .unwrap();
    let (o, _) = build(&store, &action, &["--record"]);
    assert!(o.status.success(), "{}", text(&o));
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (o, replayed) = build(&store, &action, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let pruned = t.path().join("pruned.toml");
    let o = fhsx(&store)
        .args([
            "closure-bloat",
            replayed["record"].as_str().unwrap(),
            "--prune=atoms",
            "--prove",
            "-o",
        ])
        .arg(&pruned)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let body = fs::read_to_string(&pruned).unwrap();
    assert!(!body.contains(&unused), "{body}");
    assert!(body.contains("lock = \"pruned.lock\""), "{body}");
    assert_eq!(
        fs::read(t.path().join("pruned.lock")).unwrap(),
        fs::read(t.path().join("fetch.lock")).unwrap()
    );
}
