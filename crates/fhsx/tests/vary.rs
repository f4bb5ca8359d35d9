//! `fhsx build --check --vary`: each variation, applied from fhsx's side,
//! catches a build that depends on exactly it, and bisection names it —
//! real builds in real sandboxes.

mod support;

use std::fs;
use std::path::{Path, PathBuf};

use support::{build_json as build, busybox, fhsx, import, text};

fn action(dir: &Path, name: &str, closure: &str, script: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(
        &p,
        format!("[inputs]\nclosure = [{closure}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {:?}]\n", format!("busybox mkdir -p $out; {script}")),
    )
    .unwrap();
    p
}

/// For each variation, an action non-reproducible in exactly that way:
/// a plain `--check` passes (the pinned world is reproducible), `--check
/// --vary all` exits 4 and bisection names exactly that variation, and the
/// check record says what was varied.
#[test]
fn each_variation_is_caught_and_named_by_bisection() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let list = t.path().join("list");
    for i in 0..32 {
        fs::create_dir_all(list.join("usr/share/vary-list")).unwrap();
        fs::write(
            list.join(format!("usr/share/vary-list/entry-{i:02}")),
            format!("{i}\n"),
        )
        .unwrap();
    }
    let list = import(&store, &list);
    let closure = format!("\"{bb}\", \"{list}\"");
    let cases = [
        ("readdir", "busybox find /usr/share/vary-list > $out/order"),
        ("env", "echo \"$TZ $LANG $HOME\" > $out/env"),
        (
            "user",
            "busybox id -u > $out/uid; busybox id -un >> $out/uid",
        ),
        ("hostname", "busybox hostname > $out/host"),
        ("umask", "umask > $out/umask"),
        ("cpus", "busybox nproc > $out/cpus"),
        ("aslr", "busybox grep stack /proc/self/maps > $out/stack"),
        (
            "mtime",
            "busybox stat -c %Y /usr/share/vary-list/entry-00 > $out/mtime",
        ),
    ];
    for (variation, script) in cases {
        let a = action(t.path(), &format!("{variation}.toml"), &closure, script);
        let (o, _) = build(&store, &a, &[]);
        assert!(o.status.success(), "{variation}: {}", text(&o));
        let (o, _) = build(&store, &a, &["--check"]);
        assert!(
            o.status.success(),
            "{variation}: not reproducible even pinned: {}",
            text(&o)
        );
        let (o, v) = build(&store, &a, &["--check", "--vary", "all", "--seed", "7"]);
        assert_eq!(
            o.status.code(),
            Some(4),
            "{variation}: not caught: {}",
            text(&o)
        );
        assert_eq!(
            v["check"]["culprits"],
            serde_json::json!([variation]),
            "{variation}: {v}"
        );
        assert!(!v["check"]["differences"].as_array().unwrap().is_empty());
        let rec = fhsx(&store)
            .args(["--json", "record", "show", v["record"].as_str().unwrap()])
            .output()
            .unwrap();
        let rec: serde_json::Value = serde_json::from_slice(&rec.stdout).unwrap();
        assert_eq!(
            rec["record"]["variations"].as_object().unwrap().len(),
            8,
            "{rec}"
        );
        assert!(rec["record"]["check_of"].is_string());
    }
    // A differing text file is said to be text, with where it first differs.
    let a = t.path().join("env.toml");
    let o = fhsx(&store)
        .args(["build", "--check", "--vary", "env"])
        .arg(&a)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(4));
    let out = text(&o);
    assert!(
        out.contains("text file, first difference at byte 0") && out.contains("caused by: env"),
        "{out}"
    );
}

/// The same seed shuffles a listing the same way twice; another seed
/// another way; reversed is a fixed third.
#[test]
fn shuffled_listings_replay_from_their_seed() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let list = t.path().join("list");
    fs::create_dir_all(list.join("usr/share/l")).unwrap();
    for i in 0..24 {
        fs::write(list.join(format!("usr/share/l/{i:02}")), b"x").unwrap();
    }
    let list = import(&store, &list);
    let a = action(
        t.path(),
        "order.toml",
        &format!("\"{bb}\", \"{list}\""),
        "busybox find /usr/share/l > $out/order",
    );
    let (o, pinned) = build(&store, &a, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let order = |flags: &[&str]| {
        let (o, v) = build(&store, &a, flags);
        assert_eq!(o.status.code(), Some(4), "{}", text(&o));
        v["outputs"]["out"].as_str().unwrap().to_owned()
    };
    let s42 = order(&["--check", "--vary", "readdir", "--seed", "42"]);
    assert_eq!(
        order(&["--check", "--vary", "readdir", "--seed", "42"]),
        s42
    );
    let s43 = order(&["--check", "--vary", "readdir", "--seed", "43"]);
    assert_ne!(s43, s42);
    let rev = order(&["--check", "--vary", "readdir-reverse"]);
    assert_ne!(rev, s42);
    assert_ne!(rev, pinned["outputs"]["out"].as_str().unwrap());
    let listed = fhsx(&store)
        .args(["store", "cat", &rev, "order"])
        .output()
        .unwrap();
    let lines: Vec<String> = String::from_utf8_lossy(&listed.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!(lines[1], "/usr/share/l/23", "{lines:?}");
}

/// GNU hello, built by its own `./configure && make` on real Debian
/// packages, is reproducible under every variation.
#[test]
fn hello_passes_check_vary_all() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let debs: Vec<String> = fs::read_dir(support::inputs().join("debs"))
        .unwrap()
        .flatten()
        .map(|e| format!("{:?}", e.path().display().to_string()))
        .collect();
    let a = t.path().join("hello.toml");
    fs::write(
        &a,
        format!(
            "[inputs]\ntoolchain = [{}]\nsource = {:?}\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"cd hello-2.10 && ./configure --prefix=/usr && make -j2 && make install DESTDIR=$out\"]\nworkdir = \"/build/src\"\ntimeout = \"15m\"\n",
            debs.join(", "),
            support::inputs().join("src/hello_2.10.orig.tar.gz").display().to_string()
        ),
    )
    .unwrap();
    let (o, _) = build(&store, &a, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let (o, v) = build(&store, &a, &["--check", "--vary", "all"]);
    assert!(
        o.status.success(),
        "hello is not reproducible under variation: {}",
        text(&o)
    );
    assert_eq!(v["check"]["differences"], serde_json::json!([]), "{v}");
    assert_eq!(v["check"]["variations"].as_object().unwrap().len(), 8);
}

/// `--diffoscope` keeps diffoscope's report on the differing outputs as a
/// blob the check record names.
#[test]
fn diffoscope_reports_what_differs() {
    assert!(
        std::process::Command::new("diffoscope")
            .arg("--version")
            .output()
            .is_ok(),
        "diffoscope is needed: apt-get install diffoscope-minimal"
    );
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let a = action(
        t.path(),
        "tz.toml",
        &format!("\"{bb}\""),
        "echo $TZ > $out/tz",
    );
    let (o, _) = build(&store, &a, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let (o, v) = build(&store, &a, &["--check", "--vary", "env", "--diffoscope"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    let report = v["check"]["diffoscope"]
        .as_str()
        .expect("a diffoscope report");
    let rec = fhsx(&store)
        .args(["--json", "record", "show", v["record"].as_str().unwrap()])
        .output()
        .unwrap();
    let rec: serde_json::Value = serde_json::from_slice(&rec.stdout).unwrap();
    assert_eq!(rec["record"]["diffoscope"], report);
    let blob = fhsx(&store)
        .args(["store", "blob", report])
        .output()
        .unwrap();
    let blob = String::from_utf8_lossy(&blob.stdout);
    assert!(blob.contains("-UTC") && blob.contains("+FHSX-14"), "{blob}");
}
