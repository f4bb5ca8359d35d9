//! A graph as fast as the machine: ready actions at once (`-j`), one token
//! pool every sandbox sees as its GNU make jobserver, the critical path
//! first, `--keep-going`, signals, and what a person or a script sees
//! (`--events`, `--trace`, the summary) — real bwrap, FUSE, Debian's make
//! 4.3 and busybox.
//!
//! The token probes are make itself: each job of a Makefile writes when it
//! starts and ends (`/proc/uptime`, the one clock every sandbox shares,
//! to the hundredth of a second) into its action's output, and the test
//! counts, across every action of the graph, how many jobs ran at once.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use support::{busybox, fhsx, inputs, no_leftovers, text};

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

/// Debian's make (4.3), dash as `/bin/sh` and coreutils, from the debs
/// the test support fetched: `make.toolchain` in `dir`.
fn make_toolchain(store: &Path, dir: &Path) -> PathBuf {
    let out = dir.join("make.toolchain");
    let o = fhsx(store)
        .args([
            "toolchain",
            "apt",
            "make",
            "dash",
            "coreutils",
            "--deb-cache",
        ])
        .arg(inputs().join("debs"))
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "fhsx toolchain apt make: {}", text(&o));
    out
}

/// A Makefile of `jobs` jobs of `secs` seconds each, every one writing
/// when it starts and ends into `$(LOG)`.
fn probe_makefile(dir: &Path, jobs: usize, secs: f64) -> PathBuf {
    let src = dir.join("probe");
    fs::create_dir_all(&src).unwrap();
    let names: Vec<String> = (1..=jobs).map(|j| format!("job{j}")).collect();
    fs::write(
        src.join("Makefile"),
        format!(
            "all: {names}\njob%:\n\t@read up idle < /proc/uptime; echo \"$$up start $@\" >> $(LOG); echo started $@; sleep {secs}; read up idle < /proc/uptime; echo \"$$up end $@\" >> $(LOG)\n",
            names = names.join(" ")
        ),
    )
    .unwrap();
    src
}

/// An action running `make` (no `-j`) over the probe in `/build/src`.
fn make_action(dir: &Path, name: &str, closure: &str, before: &str, extra: &str) -> PathBuf {
    write(
        dir,
        &format!("{name}.toml"),
        &format!(
            "[inputs]\nclosure = [{closure}]\ntoolchain = [\"make.toolchain\"]\nsource = \"probe\"\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"{before}mkdir -p $out && make LOG=$out/{name}.times\"]\nworkdir = \"/build/src\"\ntimeout = \"120s\"\n{extra}"
        ),
    )
}

/// `fhsx --json build -jN --events FILE FLAGS… ACTION`: the output, the
/// events as read back.
fn build_watched(store: &Path, action: &Path, jobs: usize, flags: &[&str]) -> (Output, Vec<Value>) {
    let events = store.with_extension(format!("events-{}", std::process::id()));
    let _ = fs::remove_file(&events);
    let o = fhsx(store)
        .args(["--json", "build", &format!("-j{jobs}"), "--events"])
        .arg(&events)
        .args(flags)
        .arg(action)
        .output()
        .unwrap();
    let read = fs::read_to_string(&events).unwrap_or_default();
    let v = read
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    (o, v)
}

fn named<'e>(events: &'e [Value], kind: &str) -> impl Iterator<Item = &'e Value> {
    let kind = kind.to_owned();
    events.iter().filter(move |e| e["event"] == kind)
}

/// Every output of every action built or taken from the cache, by action.
fn outputs(events: &[Value]) -> Vec<(String, Value)> {
    let mut v: Vec<(String, Value)> = events
        .iter()
        .filter(|e| e["event"] == "finished" || e["event"] == "cached")
        .map(|e| {
            let name = Path::new(e["action"].as_str().unwrap())
                .file_name()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            (name, e["outputs"].clone())
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

/// The most jobs that ran at once across the `.times` files of the given
/// outputs (an end sorts before a start of the same hundredth: a token
/// passes from one job to the next only after the first wrote its end).
fn most_at_once(store: &Path, outs: &[String]) -> usize {
    let mut marks: Vec<(u64, i32)> = Vec::new();
    for out in outs {
        let o = fhsx(store).args(["store", "ls", out]).output().unwrap();
        assert!(o.status.success(), "{}", text(&o));
        for name in String::from_utf8_lossy(&o.stdout).lines() {
            let name = name
                .split_whitespace()
                .last()
                .unwrap_or_default()
                .to_owned();
            if !name.ends_with(".times") {
                continue;
            }
            let o = fhsx(store)
                .args(["store", "cat", out, &name])
                .output()
                .unwrap();
            assert!(o.status.success(), "{}", text(&o));
            for line in String::from_utf8_lossy(&o.stdout).lines() {
                let mut w = line.split_whitespace();
                let t: f64 = w.next().unwrap().parse().unwrap();
                let delta = if w.next() == Some("start") { 1 } else { -1 };
                marks.push(((t * 100.0).round() as u64, delta));
            }
        }
    }
    assert!(!marks.is_empty(), "no job wrote its times");
    marks.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, d) in marks {
        now += d;
        most = most.max(now);
    }
    most as usize
}

/// A graph of three make actions, each `jobs` jobs, and a root joining
/// them.
fn three_makes(dir: &Path, store: &Path, jobs: usize, secs: f64) -> PathBuf {
    make_toolchain(store, dir);
    probe_makefile(dir, jobs, secs);
    let bb = busybox(store);
    for n in ["a", "b", "c"] {
        make_action(dir, n, &format!("\"{bb}\""), "", "");
    }
    write(
        dir,
        "root.toml",
        &format!(
            "[inputs]\nclosure = [\"{bb}\", \"a.toml#out\", \"b.toml#out\", \"c.toml#out\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"mkdir -p $out && cat /*.times > $out/all\"]\n"
        ),
    )
}

#[test]
fn one_token_pool_bounds_every_sandboxs_make_jobs_and_a_lone_make_takes_them_all() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let root = three_makes(t.path(), &store, 6, 0.3);
    let (o, events) = build_watched(&store, &root, 3, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let leaves: Vec<String> = outputs(&events)
        .into_iter()
        .filter(|(n, _)| n != "root.toml")
        .map(|(_, o)| o["out"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(leaves.len(), 3);
    // Three makes of six jobs, three tokens: never more than three jobs
    // at once across the sandboxes, and the pool was used whole.
    assert_eq!(most_at_once(&store, &leaves), 3);
    // The jobserver is in every build, the same in each.
    let log = String::from_utf8_lossy(&o.stderr);
    assert!(!log.contains("jobserver unavailable"), "{log}");

    // One make alone takes every token: its jobs run three at once.
    let (o, events) = build_watched(&store, &t.path().join("a.toml"), 3, &["--rebuild"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = outputs(&events)[0].1["out"].as_str().unwrap().to_owned();
    assert_eq!(most_at_once(&store, &[out]), 3);
    no_leftovers(t.path());
}

#[test]
fn the_same_graph_makes_the_same_outputs_at_one_job_and_at_four() {
    let t = tempfile::tempdir().unwrap();
    let bb_store = t.path().join("s1");
    // Fan-out and fan-in: four leaves, two joins over overlapping leaves,
    // a root over both; each output is a function of its inputs, made by
    // make's jobs (in whatever order they run).
    let mk = |store: &Path| {
        make_toolchain(store, t.path());
        busybox(store)
    };
    let bb = mk(&bb_store);
    let src = t.path().join("probe");
    fs::create_dir_all(&src).unwrap();
    fs::write(
        src.join("Makefile"),
        "all: p1 p2 p3 p4\np%:\n\t@mkdir -p $(OUT) && { echo $@; cat /in/*/* 2>/dev/null | md5sum; } > $(OUT)/$@\n",
    )
    .unwrap();
    let action = |name: &str, deps: &[&str]| {
        let refs: Vec<String> = deps.iter().map(|d| format!(", \"{d}.toml#out\"")).collect();
        write(
            t.path(),
            &format!("{name}.toml"),
            &format!(
                "[inputs]\nclosure = [\"{bb}\"{}]\ntoolchain = [\"make.toolchain\"]\nsource = \"probe\"\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"make OUT=$out/in/{name} && echo {name} > $out/in/{name}/name\"]\nworkdir = \"/build/src\"\n",
                refs.concat()
            ),
        );
    };
    for leaf in ["l1", "l2", "l3", "l4"] {
        action(leaf, &[]);
    }
    action("m1", &["l1", "l2"]);
    action("m2", &["l2", "l3", "l4"]);
    action("root", &["m1", "m2"]);
    let root = t.path().join("root.toml");
    let (o, one) = build_watched(&bb_store, &root, 1, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let s2 = t.path().join("s2");
    assert_eq!(mk(&s2), bb);
    // With scratch file systems reused between the graph's actions.
    let (o, four) = build_watched(&s2, &root, 4, &["--scratch-pool", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    let (a, b) = (outputs(&one), outputs(&four));
    assert_eq!(a.len(), 7);
    assert_eq!(a, b, "every action's outputs at -j1 and -j4");
    // At -j4 the leaves ran side by side.
    let started: Vec<&Value> = named(&four, "started").collect();
    assert!(
        started.iter().any(|e| e["slot"] != 0),
        "more than one slot was used: {started:?}"
    );
}

#[test]
fn a_build_killed_holding_tokens_gives_them_all_back() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    make_toolchain(&store, t.path());
    probe_makefile(t.path(), 6, 0.3);
    let bb = busybox(&store);
    let bbq = format!("\"{bb}\"");
    // hog's make takes every token it can and never gives them back: it is
    // killed at its timeout, two seconds in.
    let hog_src = t.path().join("hog");
    fs::create_dir_all(&hog_src).unwrap();
    fs::write(
        hog_src.join("Makefile"),
        "all: h1 h2 h3\nh%:\n\t@echo holding $@; sleep 100\n",
    )
    .unwrap();
    write(
        t.path(),
        "hog.toml",
        &format!("[inputs]\nclosure = [{bbq}]\ntoolchain = [\"make.toolchain\"]\nsource = \"hog\"\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"make\"]\nworkdir = \"/build/src\"\ntimeout = \"2s\"\n"),
    );
    // gate ends at once, so late starts after hog's make has its tokens;
    // late's make then runs long after hog is gone.
    write(
        t.path(),
        "gate.toml",
        &format!("[inputs]\nclosure = [{bbq}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"sleep 0.3; mkdir $out\"]\n"),
    );
    make_action(
        t.path(),
        "late",
        &format!("{bbq}, \"gate.toml#out\""),
        "sleep 3; ",
        "",
    );
    let root = write(
        t.path(),
        "root.toml",
        &format!("[inputs]\nclosure = [{bbq}, \"hog.toml#out\", \"late.toml#out\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"mkdir $out\"]\n"),
    );
    let (o, events) = build_watched(&store, &root, 3, &["--keep-going"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let failed: Vec<&Value> = named(&events, "failed").collect();
    assert_eq!(failed.len(), 1, "{events:?}");
    // hog held more than its own token when it was killed: its make
    // started more than one job.
    let log = fs::read_to_string(failed[0]["log"].as_str().unwrap()).unwrap();
    assert!(log.matches("holding h").count() >= 2, "{log}");
    // All three tokens came back: late's make ran three jobs at once.
    let late = outputs(&events)
        .into_iter()
        .find(|(n, _)| n == "late.toml")
        .unwrap();
    assert_eq!(
        most_at_once(&store, &[late.1["out"].as_str().unwrap().to_owned()]),
        3
    );
    let unbuilt: Vec<&Value> = named(&events, "unbuilt").collect();
    assert_eq!(unbuilt.len(), 1);
    assert!(unbuilt[0]["because"]
        .as_str()
        .unwrap()
        .ends_with("hog.toml"));
    no_leftovers(t.path());
}

/// busybox actions: `name` runs `script`, referring to `deps`.
fn sh_action(dir: &Path, bb: &str, name: &str, deps: &[&str], script: &str) -> PathBuf {
    let refs: Vec<String> = deps.iter().map(|d| format!(", \"{d}.toml#out\"")).collect();
    write(
        dir,
        &format!("{name}.toml"),
        &format!(
            "[inputs]\nclosure = [\"{bb}\"{}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {script:?}]\ntimeout = \"120s\"\n",
            refs.concat()
        ),
    )
}

#[test]
fn keep_going_builds_all_it_can_and_the_summary_names_each_failure_its_log_and_what_it_left() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    // bad has the longest remaining path (two above it), so it starts
    // first at -j1.
    sh_action(t.path(), &bb, "bad", &[], "echo the compiler broke; exit 3");
    sh_action(t.path(), &bb, "above", &["bad"], "mkdir $out");
    sh_action(t.path(), &bb, "fine", &[], "mkdir $out; echo ok > $out/ok");
    sh_action(t.path(), &bb, "also", &[], "mkdir $out");
    let root = sh_action(
        t.path(),
        &bb,
        "root",
        &["above", "fine", "also"],
        "mkdir $out",
    );

    // Without --keep-going: the first failure starts nothing new.
    let (o, events) = build_watched(&store, &root, 1, &[]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert_eq!(named(&events, "started").count(), 1, "{events:?}");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.toml failed (exit code 3), so what refers to it cannot be built"),
        "{err}"
    );

    // With it: everything that can be built is.
    let (o, events) = build_watched(&store, &root, 2, &["--keep-going"]);
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let built: Vec<String> = outputs(&events).into_iter().map(|(n, _)| n).collect();
    assert_eq!(built, ["also.toml", "fine.toml"]);
    let err = String::from_utf8_lossy(&o.stderr);
    let log = named(&events, "failed").next().unwrap()["log"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(fs::read_to_string(&log)
        .unwrap()
        .contains("the compiler broke"));
    assert!(
        err.contains(&format!(
            "FAILED   {}/bad.toml (exit code 3); its log: {log}",
            t.path().display()
        )),
        "{err}"
    );
    assert!(err.contains("bad.toml left unbuilt: "), "{err}");
    assert!(
        err.contains("above.toml") && err.contains("root.toml"),
        "{err}"
    );
    assert!(
        err.contains("2 built, 0 cached, 1 failed, 2 unbuilt"),
        "{err}"
    );
    no_leftovers(t.path());
}

#[test]
fn the_longest_remaining_path_in_recorded_seconds_starts_first() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let graph = |round: u32| {
        sh_action(
            t.path(),
            &bb,
            "short",
            &[],
            &format!("sleep 0.05; mkdir $out; echo {round} > $out/r"),
        );
        sh_action(
            t.path(),
            &bb,
            "long",
            &[],
            &format!("sleep 1; mkdir $out; echo {round} > $out/r"),
        );
        sh_action(t.path(), &bb, "root", &["short", "long"], "mkdir $out")
    };
    let first_started = |events: &[Value]| {
        let e = named(events, "started").next().unwrap();
        Path::new(e["action"].as_str().unwrap())
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    };
    // Nothing known: equals, in the order the root names them.
    let (o, events) = build_watched(&store, &graph(1), 1, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(first_started(&events), "short.toml");
    // Changed, so both run again: now long's recorded second goes first.
    let (o, events) = build_watched(&store, &graph(2), 1, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(first_started(&events), "long.toml");
    // Side by side, the root waits for long: the summary's critical path
    // runs through it, with its times.
    let (o, _) = build_watched(&store, &graph(3), 2, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    let path = err.split("critical path").nth(1).unwrap_or_default();
    assert!(
        path.contains("long.toml") && !path.contains("short.toml"),
        "{err}"
    );
}

#[test]
fn sigterm_stops_every_running_action_and_leaves_nothing_running_mounted_or_stored() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    sh_action(
        t.path(),
        &bb,
        "one",
        &[],
        "mkdir $out; echo partial > $out/p; sleep 61.5",
    );
    sh_action(
        t.path(),
        &bb,
        "two",
        &[],
        "mkdir $out; echo partial > $out/p; sleep 61.5",
    );
    let root = sh_action(t.path(), &bb, "root", &["one", "two"], "mkdir $out");
    let events = t.path().join("events");
    let child = fhsx(&store)
        .args(["build", "-j2", "--events"])
        .arg(&events)
        .arg(&root)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Both sandboxes running (their shells have written), then SIGTERM.
    let deadline = Instant::now() + Duration::from_secs(60);
    while fs::read_to_string(&events)
        .unwrap_or_default()
        .matches("\"started\"")
        .count()
        < 2
    {
        assert!(Instant::now() < deadline, "the actions never started");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(800));
    let stopped = Instant::now();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().unwrap();
    assert!(
        stopped.elapsed() < Duration::from_secs(20),
        "it took {:?}",
        stopped.elapsed()
    );
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    let ev = fs::read_to_string(&events).unwrap();
    assert_eq!(ev.matches("\"failed\"").count(), 2, "{ev}");
    assert!(!ev.contains("\"finished\""), "{ev}");
    no_leftovers(t.path());
    // No process of theirs is left, and no output of theirs was stored.
    let ps = Command::new("ps").args(["-eo", "args"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&ps.stdout).contains("sleep 61.5"));
    let index = store.join("actions");
    let records = fs::read_dir(&index).map(|d| d.count()).unwrap_or(0);
    assert_eq!(records, 0, "no record of a stopped action is indexed");
}

#[test]
fn events_and_trace_say_what_ran_where_and_json_still_prints_one_result() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    sh_action(t.path(), &bb, "a", &[], "sleep 0.3; mkdir $out");
    sh_action(t.path(), &bb, "b", &[], "sleep 0.3; mkdir $out");
    let root = sh_action(t.path(), &bb, "root", &["a", "b"], "mkdir $out");
    let trace = t.path().join("trace.json");
    let (o, events) = build_watched(&store, &root, 2, &["--trace", trace.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    // stdout is the one final object, as before.
    let result: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(result["cached"], false);
    for kind in ["queued", "started", "finished"] {
        assert_eq!(named(&events, kind).count(), 3, "{kind}: {events:?}");
    }
    // Off a terminal, a line per finished action.
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.matches("] built ").count(), 3, "{err}");
    // The trace: a track per slot, an event per action on its slot's
    // track, a counter of tokens in use.
    let doc: Value = serde_json::from_slice(&fs::read(&trace).unwrap()).unwrap();
    let ev = doc["traceEvents"].as_array().unwrap();
    let tracks: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "M").collect();
    assert_eq!(tracks.len(), 2);
    let spans: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "X").collect();
    assert_eq!(spans.len(), 3);
    assert!(spans.iter().all(|e| e["tid"] == 1 || e["tid"] == 2));
    let counters: Vec<&Value> = ev.iter().filter(|e| e["ph"] == "C").collect();
    assert!(!counters.is_empty());
    assert!(counters
        .iter()
        .all(|c| c["args"]["tokens"].as_u64().unwrap() <= 2));
    assert!(
        counters.iter().any(|c| c["args"]["tokens"] == 2),
        "{counters:?}"
    );

    // A second run: every action cached, none started in a sandbox.
    let (o, events) = build_watched(&store, &root, 2, &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(named(&events, "cached").count(), 3);
}

#[test]
fn a_workers_jobs_share_one_token_pool() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("client");
    let root = three_makes(t.path(), &store, 6, 0.3);
    drop(root);
    let wtmp = t.path().join("wtmp");
    fs::create_dir_all(&wtmp).unwrap();
    // Three jobs at once, four tokens: the makes share one more.
    let (mut worker, addr) = support::spawn_worker(
        &t.path().join("wstore"),
        &wtmp,
        &["--jobs", "3", "--tokens", "4", "--scratch-pool", "0"],
        Stdio::inherit(),
    );
    let clients: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|n| {
            fhsx(&store)
                .args(["--json", "build", "--remote", &addr])
                .arg(t.path().join(format!("{n}.toml")))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<String> = clients
        .into_iter()
        .map(|c| {
            let o = c.wait_with_output().unwrap();
            assert!(o.status.success(), "{}", text(&o));
            let v: Value = serde_json::from_slice(&o.stdout).unwrap();
            v["outputs"]["out"].as_str().unwrap().to_owned()
        })
        .collect();
    let _ = worker.kill();
    let _ = worker.wait();
    assert_eq!(most_at_once(&store, &outs), 4);
}

#[test]
fn a_build_flooding_its_jobserver_neither_grows_the_pool_nor_stalls_the_others() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    make_toolchain(&store, t.path());
    probe_makefile(t.path(), 6, 0.3);
    let bb = busybox(&store);
    // flood writes tokens it never took into both ends of its jobserver,
    // and reads what it can (waiting a second at most: the pool drains
    // what it wrote), for four seconds.
    write(
        t.path(),
        "flood.toml",
        &format!(
            "[inputs]\nclosure = [\"{bb}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"end=$(( $(date +%s) + 4 )); while [ $(date +%s) -lt $end ]; do head -c 65536 /dev/zero >&8; head -c 65536 /dev/zero > /run/fhsx/jobserver; timeout 1 head -c 4096 <&7 >/dev/null; done; mkdir $out\"]\ntimeout = \"60s\"\n"
        ),
    );
    make_action(t.path(), "probe", &format!("\"{bb}\""), "", "");
    let root = write(
        t.path(),
        "root.toml",
        &format!("[inputs]\nclosure = [\"{bb}\", \"flood.toml#out\", \"probe.toml#out\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"mkdir $out\"]\n"),
    );
    let (o, events) = build_watched(&store, &root, 2, &[]);
    assert!(o.status.success(), "{}", text(&o));
    let probe = outputs(&events)
        .into_iter()
        .find(|(n, _)| n == "probe.toml")
        .unwrap();
    // Two tokens, one each: whatever flood writes, probe's make (done
    // well within flood's four seconds) never gets a second.
    assert_eq!(
        most_at_once(&store, &[probe.1["out"].as_str().unwrap().to_owned()]),
        1
    );
    no_leftovers(t.path());
}

/// What a build inherits is its standard descriptors and its jobserver's
/// two (7 and 8, FIFOs) and nothing else: the supervisor closes every
/// other descriptor but those it is told to keep (`--keep-fd`).
#[test]
fn a_build_holds_only_its_standard_descriptors_and_its_jobservers_two() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let bb = busybox(&store);
    let action = sh_action(
        t.path(),
        &bb,
        "fds",
        &[],
        "ls -l /proc/self/fd; for f in 7 8; do [ -p /proc/self/fd/$f ] && echo fifo $f; done; mkdir $out",
    );
    let o = fhsx(&store)
        .args(["build", "-j2"])
        .arg(&action)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let log = String::from_utf8_lossy(&o.stderr);
    // `ls -l`'s lines: `lr-x------ 1 build users 64 Jan 1 00:00 N -> TARGET`.
    // One is ls's own, on the directory it lists: closed (its link
    // unreadable) or a `/proc/…/fd` by the time it is read.
    let (mut fds, mut listing) = (Vec::new(), 0);
    for line in log.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.len() < 9 || f[0].len() != 10 || !f[0].starts_with('l') {
            continue;
        }
        let fd: u32 = f[8].parse().unwrap_or_else(|_| panic!("{line}"));
        match f.get(10) {
            None => listing += 1,
            Some(t) if t.starts_with("/proc/") && t.ends_with("/fd") => listing += 1,
            Some(_) => fds.push(fd),
        }
    }
    assert!(listing <= 1, "{log}");
    fds.sort_unstable();
    assert_eq!(fds, [0, 1, 2, 7, 8], "{log}");
    assert!(
        log.lines().any(|l| l == "fifo 7") && log.lines().any(|l| l == "fifo 8"),
        "7 and 8 are the jobserver's FIFOs: {log}"
    );
    no_leftovers(t.path());
}
