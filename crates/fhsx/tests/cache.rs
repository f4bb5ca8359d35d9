//! `fhsx build --cache`: a remote cache on a real REAPI server (BuildGrid
//! 0.4.4's ActionCache, CAS and ByteStream on loopback, its storage in
//! memory or in moto's S3), trusted by signature only. Store A builds and
//! pushes; store B, fresh, gets every action as a hit and fetches only
//! what it needs; a tampered entry is refused and built locally; a dead
//! or silent server costs a bounded wait.

mod support;

use std::fs;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use support::{
    buildgrid, buildgrid_storage, busybox_deb, fhsx, free_port, inputs, linked_store, mirror,
    no_leftovers, text, wait_port, S3,
};

/// BuildGrid serving only the cache services (no scheduler, no database).
struct Cache {
    port: u16,
    server: Child,
    dir: PathBuf,
}

/// What a cache behind TLS and a bearer token needs: a CA, the server's
/// certificate (for 127.0.0.1) and key, the JWT secret, and a token.
struct Secured {
    dir: PathBuf,
}

impl Secured {
    fn make(dir: &Path) -> Secured {
        let dir = dir.join("secured");
        fs::create_dir_all(&dir).unwrap();
        let openssl = |args: &[&str]| {
            let o = Command::new("openssl")
                .current_dir(&dir)
                .args(args)
                .output()
                .expect("openssl (Debian's openssl package, in .ci/apt-packages)");
            ok(&o, "openssl");
        };
        openssl(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
            "-days",
            "2",
            "-subj",
            "/CN=fhsx test CA",
        ]);
        openssl(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]);
        fs::write(
            dir.join("ext"),
            "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
        )
        .unwrap();
        openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.pem",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.pem",
            "-days",
            "2",
            "-extfile",
            "ext",
        ]);
        fs::write(
            dir.join("secret"),
            "a secret only the test and the server know",
        )
        .unwrap();
        // BuildGrid's venv has PyJWT.
        let o = Command::new(buildgrid().join("bin/python"))
            .current_dir(&dir)
            .arg("-c")
            .arg("import jwt, time; print(jwt.encode({'sub': 'fhsx', 'exp': int(time.time()) + 3600}, open('secret').read(), algorithm='HS256'))")
            .output()
            .unwrap();
        ok(&o, "a JWT");
        fs::write(dir.join("token"), &o.stdout).unwrap();
        Secured { dir }
    }

    fn server_config(&self) -> String {
        let p = |f: &str| self.dir.join(f).display().to_string();
        format!(
            "    insecure-mode: false\n    credentials:\n      tls-server-key: {}\n      tls-server-cert: {}\nauthorization:\n  method: jwt\n  secret: {}\n  algorithm: hs256\n",
            p("server.key"),
            p("server.pem"),
            p("secret")
        )
    }
}

impl Cache {
    fn start(dir: &Path, s3: Option<&S3>) -> Cache {
        Self::start_with(dir, s3, None)
    }

    /// With `secured`, TLS and a JWT bearer token are required.
    fn start_with(dir: &Path, s3: Option<&S3>, secured: Option<&Secured>) -> Cache {
        let dir = dir.join("cache");
        fs::create_dir_all(&dir).unwrap();
        let port = free_port();
        let storage = buildgrid_storage(s3);
        let access = match secured {
            None => "    insecure-mode: true\nauthorization:\n  method: none\n".to_owned(),
            Some(s) => s.server_config(),
        };
        let config = dir.join("bgd.yml");
        fs::write(
            &config,
            format!(
                "server:\n  - !channel\n    address: \"127.0.0.1:{port}\"\n{access}storages:\n{storage}caches:\n  - !lru-action-cache &ac\n    storage: *cas\n    max-cached-refs: 10000\n    allow-updates: true\n    cache-failed-actions: true\ninstances:\n  - name: ''\n    services:\n      - !action-cache\n        cache: *ac\n      - !cas\n        storage: *cas\n      - !bytestream\n        storage: *cas\nthread-pool-size: 16\n"
            ),
        )
        .unwrap();
        let log = dir.join("bgd.log");
        let server = Command::new(buildgrid().join("bin/bgd"))
            .args(["server", "start"])
            .arg(&config)
            .stdout(fs::File::create(&log).unwrap())
            .stderr(Stdio::from(fs::File::create(&log).unwrap()))
            .spawn()
            .unwrap();
        wait_port(port, "BuildGrid", &log);
        Cache { port, server, dir }
    }

    fn url(&self) -> String {
        format!("grpc://127.0.0.1:{}", self.port)
    }

    fn tls_url(&self) -> String {
        format!("grpcs://127.0.0.1:{}", self.port)
    }

    /// Run one of [`TAMPER`]'s operations against this server.
    fn tamper(&self, args: &[&str]) {
        let script = self.dir.join("tamper.py");
        fs::write(&script, TAMPER).unwrap();
        let o = Command::new(buildgrid().join("bin/python"))
            .arg(&script)
            .arg(format!("127.0.0.1:{}", self.port))
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "tamper {args:?}: {}", text(&o));
    }
}

impl Drop for Cache {
    fn drop(&mut self) {
        let _ = self.server.kill();
        let _ = self.server.wait();
    }
}

/// What a hostile server could do to an entry, with REAPI's own messages
/// (BuildGrid's generated modules): `resign ACTION` keeps the record's
/// signature over a changed record; `move FROM TO` files action FROM's
/// entry under action TO's key; `swap ACTION` points the first file of
/// the entry's first output at other bytes, with a tree and file map that
/// still add up to the record's digest.
const TAMPER: &str = r#"
import hashlib, json, sys, grpc
from buildgrid._protos.build.bazel.remote.execution.v2 import remote_execution_pb2 as re, remote_execution_pb2_grpc as rg
ch = grpc.insecure_channel(sys.argv[1])
ac, cas = rg.ActionCacheStub(ch), rg.ContentAddressableStorageStub(ch)
def key(kind, d):
    b = ("fhsx-action-cache/v1 %s %s" % (kind, d)).encode()
    return re.Digest(hash=hashlib.sha256(b).hexdigest(), size_bytes=len(b))
def get(k): return ac.GetActionResult(re.GetActionResultRequest(action_digest=k))
def put(k, r): ac.UpdateActionResult(re.UpdateActionResultRequest(action_digest=k, action_result=r))
def up(b):
    d = re.Digest(hash=hashlib.sha256(b).hexdigest(), size_bytes=len(b))
    cas.BatchUpdateBlobs(re.BatchUpdateBlobsRequest(requests=[re.BatchUpdateBlobsRequest.Request(digest=d, data=b)]))
    return d
def down(d): return cas.BatchReadBlobs(re.BatchReadBlobsRequest(digests=[d])).responses[0].data
op = sys.argv[2]
if op == "resign":
    k = key("action", sys.argv[3]); r = get(k)
    f = [f for f in r.output_files if f.path.endswith("record.json")][0]
    rec = json.loads(down(f.digest)); rec["record"]["resources"]["wall_ms"] += 1
    f.digest.CopyFrom(up(json.dumps(rec).encode())); f.ClearField("node_properties")
    put(k, r)
elif op == "garbage":
    k = key("action", sys.argv[3]); r = get(k)
    f = [f for f in r.output_files if f.path.endswith("record.json")][0]
    f.digest.CopyFrom(up(b"\x1b]52;c;Z2FyYmFnZQ==\x07 not a record"))
    f.ClearField("node_properties")
    put(k, r)
elif op == "badkey":
    k = key("action", sys.argv[3]); r = get(k)
    f = [f for f in r.output_files if f.path.endswith("record.json")][0]
    rec = json.loads(down(f.digest)); rec["public_key"] = "\x1b[2J\x1b]0;owned\x07"
    f.digest.CopyFrom(up(json.dumps(rec).encode())); f.ClearField("node_properties")
    put(k, r)
elif op == "move":
    put(key("action", sys.argv[4]), get(key("action", sys.argv[3])))
elif op == "swap":
    k = key("action", sys.argv[3]); r = get(k)
    od = r.output_directories[0]
    mf = [f for f in r.output_files if f.path == od.path + ".files"][0]
    tree = re.Tree(); tree.ParseFromString(down(od.tree_digest))
    dirs = [tree.root] + list(tree.children)
    fn = [f for d in dirs for f in d.files][0]
    old = fn.digest.hash
    evil = up(b"X" * fn.digest.size_bytes)
    for d in dirs:
        for f in d.files:
            if f.digest.hash == old: f.digest.CopyFrom(evil)
    # (The output is one directory: its root is the Tree's root, named by
    # no parent, so nothing else needs re-hashing.)
    m = down(mf.digest).decode().splitlines()
    m = [l.replace(old, evil.hash).rsplit(" ", 1)[0] + " " + str(evil.size_bytes) if old in l else l for l in m]
    mf.digest.CopyFrom(up(("\n".join(m) + "\n").encode()))
    od.tree_digest.CopyFrom(up(tree.SerializeToString()))
    put(k, r)
"#;

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

/// Two small actions: `leaf.toml` writes a file (its root file, so the
/// output is one directory), `root.toml` copies it. Both on busybox, by
/// its `.deb`'s path (imported by whichever store builds).
fn small_graph(dir: &Path, word: &str) -> PathBuf {
    fs::create_dir_all(dir).unwrap();
    let bb = busybox_deb().display().to_string();
    write(
        dir,
        "leaf.toml",
        &format!(
            "[inputs]\nclosure = [{bb:?}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox echo {word} > $out/leaf\"]\ntimeout = \"60s\"\n"
        ),
    );
    write(
        dir,
        "root.toml",
        &format!(
            "[inputs]\nclosure = [\"leaf.toml#out\", {bb:?}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox cat /leaf /leaf > $out/root\"]\ntimeout = \"60s\"\n"
        ),
    )
}

fn build(
    store: &Path,
    action: &Path,
    flags: &[&str],
) -> (Output, serde_json::Value, Vec<serde_json::Value>) {
    let events = store.with_extension("events");
    let o = fhsx(store)
        .arg("--json")
        .arg("build")
        .arg(action)
        .arg("--events")
        .arg(&events)
        .args(flags)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    let ev = fs::read_to_string(&events)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    (o, v, ev)
}

fn ok(o: &Output, what: &str) {
    assert!(o.status.success(), "{what}: {}", text(o));
}

fn key_of(store: &Path) -> String {
    let o = fhsx(store).args(["key", "show"]).output().unwrap();
    ok(&o, "fhsx key show");
    String::from_utf8_lossy(&o.stdout).trim().to_owned()
}

/// How many actions of the graph ran (a cached one has no `finished`).
fn ran(events: &[serde_json::Value]) -> usize {
    events.iter().filter(|e| e["event"] == "finished").count()
}

/// The file `path` of the stored tree `tree` (with `flags`, `--cache URL`).
fn cat(store: &Path, tree: &serde_json::Value, path: &str, flags: &[&str]) -> Vec<u8> {
    let tree = tree.as_str().unwrap();
    let o = fhsx(store)
        .args(["store", "cat", tree, path])
        .args(flags)
        .output()
        .unwrap();
    ok(&o, "fhsx store cat");
    o.stdout
}

/// The action digest of the graph's action whose file name holds `name`,
/// built by `store` (from its `finished` event's record).
fn action_of(store: &Path, events: &[serde_json::Value], name: &str) -> String {
    let record = events
        .iter()
        .find(|e| e["event"] == "finished" && e["action"].as_str().unwrap().contains(name))
        .unwrap()["record"]
        .as_str()
        .unwrap()
        .to_owned();
    let o = fhsx(store)
        .args(["--json", "record", "show", &record])
        .output()
        .unwrap();
    ok(&o, "fhsx record show");
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    v["record"]["action_digest"].as_str().unwrap().to_owned()
}

fn sources(events: &[serde_json::Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| e["event"] == "cached")
        .map(|e| e["source"].as_str().unwrap_or_default().to_owned())
        .collect()
}

fn has_tree(store: &Path, digest: &str) -> bool {
    fhsx(store)
        .args(["store", "ls", digest])
        .output()
        .unwrap()
        .status
        .success()
}

/// The hello example's three actions (fetch recorded, then replayed;
/// build with gcc; run the output), on toolchain files, so the actions
/// name their atoms by digest. Store A builds and pushes. A fresh store B
/// holding only the action files gets every action from the cache
/// without a sandbox and without a byte of any output; `store export`
/// then fetches the root's output, byte-identical to A's. A store C with
/// the toolchains but none of the outputs runs a changed root: it fetches
/// hello's output from the cache, and only that.
#[test]
fn a_graph_pushed_by_one_store_is_a_hit_in_a_fresh_one_fetching_only_what_is_needed() {
    let t = tempfile::tempdir().unwrap();
    let cache = Cache::start(t.path(), None);
    let url = cache.url();
    let a = t.path().join("a");
    let b = t.path().join("b");
    let (gcc, bb_tc) = (
        inputs().join("gcc.toolchain"),
        inputs().join("busybox.toolchain"),
    );
    linked_store(&inputs().join("store"), &a);
    let src = fs::read(inputs().join("src/hello_2.10.orig.tar.gz")).unwrap();
    let (port, stop) = mirror(Box::leak(src.into_boxed_slice()));
    let files = t.path().join("files");
    fs::create_dir_all(&files).unwrap();
    fs::copy(&gcc, files.join("gcc.toolchain")).unwrap();
    fs::copy(&bb_tc, files.join("busybox.toolchain")).unwrap();
    write(&files, "fetch.toml", &format!(
        "[inputs]\nclosure = [\"busybox.toolchain\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out/usr/src && busybox wget -O $out/usr/src/hello-2.10.tar.gz http://127.0.0.1:{port}/gnu/hello/hello-2.10.tar.gz\"]\ntimeout = \"60s\"\n[network]\nmode = \"replay\"\nlock = \"fetch.lock\"\n"));
    write(&files, "build.toml", "[inputs]\nclosure = [\"fetch.toml#out\"]\ntoolchain = [\"gcc.toolchain\"]\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"tar xzf /usr/src/hello-2.10.tar.gz && cd hello-2.10 && ./configure --prefix=/usr && make && make install DESTDIR=$out\"]\ntimeout = \"15m\"\n");
    let run = write(&files, "run.toml", "[inputs]\nclosure = [\"build.toml#out\"]\ntoolchain = [\"gcc.toolchain\"]\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"mkdir -p $out && hello > $out/greeting\"]\ntimeout = \"60s\"\n");
    let (o, _, _) = build(&a, &files.join("fetch.toml"), &["--record"]);
    ok(&o, "recording the fetch");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (o, pushed, _) = build(&a, &run, &["--cache", &url, "--cache-push"]);
    ok(&o, "store A builds and pushes");
    assert!(text(&o).contains("pushed record"), "{}", text(&o));
    let greeting = pushed["outputs"]["out"].as_str().unwrap().to_owned();

    // B: the action files only, A's key trusted.
    let trust = key_of(&a);
    let began = Instant::now();
    let (o, v, events) = build(&b, &run, &["--cache", &url, "--trust", &trust]);
    ok(&o, "store B from the cache");
    let took = began.elapsed();
    assert_eq!(v["cached"], true, "{v}");
    assert_eq!(v["source"], "remote", "{v}");
    assert_eq!(v["record"], pushed["record"]);
    assert_eq!(ran(&events), 0, "no sandbox in B: {events:?}");
    assert_eq!(
        sources(&events),
        ["remote", "remote", "remote"],
        "{events:?}"
    );
    // Build without the Bytes: no output, not even the root's, came.
    assert!(!has_tree(&b, &greeting), "the root's output was fetched");
    let blobs: usize = fs::read_dir(b.join("blobs")).map_or(0, |d| {
        d.flatten()
            .map(|s| fs::read_dir(s.path()).unwrap().count())
            .sum()
    });
    assert!(blobs <= 6, "B fetched {blobs} blobs for three records");
    eprintln!("B's graph from the cache: {took:?}");
    // A second pass is local: the records are B's now, the outputs held.
    let (o, v, _) = build(&b, &run, &["--cache", &url, "--trust", &trust]);
    ok(&o, "store B again");
    assert_eq!(v["source"], "local", "{v}");
    // Asked for, the output comes, byte-identical.
    let out = t.path().join("greeting");
    let o = fhsx(&b)
        .args(["store", "export", &greeting])
        .arg(&out)
        .args(["--cache", &url])
        .output()
        .unwrap();
    ok(&o, "store export from the cache");
    let from_a = cat(&a, &pushed["outputs"]["out"], "greeting", &[]);
    assert_eq!(fs::read(out.join("greeting")).unwrap(), from_a);
    assert_eq!(from_a, b"Hello, world!\n");

    // C: the toolchains, none of the outputs; a changed root must run and
    // fetches hello's output (and nothing of the fetch's).
    let c = t.path().join("c");
    linked_store(&inputs().join("store"), &c);
    let run2 = write(&files, "run2.toml", "[inputs]\nclosure = [\"build.toml#out\"]\ntoolchain = [\"gcc.toolchain\"]\n[run]\ncommand = [\"/bin/sh\", \"-c\", \"mkdir -p $out && hello -g changed > $out/greeting\"]\ntimeout = \"60s\"\n");
    let (o, v, events) = build(&c, &run2, &["--cache", &url, "--trust", &trust]);
    ok(
        &o,
        "store C runs a changed root on hello's output from the cache",
    );
    assert_eq!(v["source"], "built", "{v}");
    assert_eq!(ran(&events), 1, "only the root ran: {events:?}");
    let fetch_out = events
        .iter()
        .find(|e| {
            e["event"] == "cached" && e["action"].as_str().is_some_and(|a| a.contains("fetch"))
        })
        .unwrap()["outputs"]["out"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(
        !has_tree(&c, &fetch_out),
        "the fetch's output was downloaded though nothing needed it"
    );
    assert_eq!(cat(&c, &v["outputs"]["out"], "greeting", &[]), b"changed\n");
    no_leftovers(t.path());
}

/// The same on BuildGrid whose CAS and action cache live in S3 (moto):
/// A pushes a small graph, B gets both actions from the cache, and C,
/// which never saw a record, materializes the output by its digest.
#[test]
fn a_cache_on_s3_storage_serves_a_fresh_store() {
    let t = tempfile::tempdir().unwrap();
    let s3 = S3::start(t.path());
    let cache = Cache::start(t.path(), Some(&s3));
    let url = cache.url();
    let root = small_graph(&t.path().join("g"), "on-s3");
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    let (o, pushed, _) = build(&a, &root, &["--cache", &url, "--cache-push"]);
    ok(&o, "A builds and pushes");
    let stored = s3.objects();
    assert!(stored > 0, "nothing reached S3");
    let (o, v, events) = build(&b, &root, &["--cache", &url, "--trust", &key_of(&a)]);
    ok(&o, "B from the cache");
    // B's configuration reads only: it uploaded nothing.
    assert_eq!(
        s3.objects(),
        stored,
        "a read-only cache configuration uploaded"
    );
    assert_eq!(v["record"], pushed["record"]);
    assert_eq!(ran(&events), 0, "{events:?}");
    let got = cat(&b, &v["outputs"]["out"], "root", &["--cache", &url]);
    assert_eq!(got, b"on-s3\non-s3\n");
    // A store that never saw the record materializes the output by digest.
    let dest = t.path().join("materialized");
    let o = fhsx(&t.path().join("c"))
        .arg("materialize")
        .arg(v["outputs"]["out"].as_str().unwrap())
        .arg(&dest)
        .args(["--cache", &url])
        .output()
        .unwrap();
    ok(&o, "materialize --cache");
    assert_eq!(fs::read(dest.join("root")).unwrap(), b"on-s3\non-s3\n");
}

/// What the server says is never trusted: a record whose signature does
/// not verify, one signed by a key B does not trust, one filed under
/// another action's key, garbage, and a record whose words are escape
/// sequences are each refused, saying what was wrong (escaped), and what
/// answers instead is honest: A's record of the same command where its
/// read set holds, else a local build.
#[test]
fn a_tampered_entry_is_refused_and_built_locally() {
    let t = tempfile::tempdir().unwrap();
    let cache = Cache::start(t.path(), None);
    let url = cache.url();
    let a = t.path().join("a");
    let root = small_graph(&t.path().join("g"), "honest");
    let (o, pushed, events) = build(&a, &root, &["--cache", &url, "--cache-push"]);
    ok(&o, "A builds and pushes");
    let trust = key_of(&a);
    let (leaf_action, root_action) = (
        action_of(&a, &events, "leaf"),
        action_of(&a, &events, "root"),
    );
    let fresh = |name: &str| t.path().join(name);

    // An untrusted signer.
    let (o, v, _) = build(&fresh("b1"), &root, &["--cache", &url]);
    ok(&o, "B without --trust");
    assert_eq!(v["source"], "built", "{v}");
    assert!(text(&o).contains("which is not trusted"), "{}", text(&o));

    // Each tampering in turn: a record for another action under the root's
    // key; a signature over a changed record; a record whose key is a
    // terminal's escape sequences; garbage where the record should be.
    // Each is refused saying why, nothing the server chose reaches the
    // terminal raw, and what answers instead is honest: the same outputs
    // (A's record of the same command where its read set holds, else a
    // local build), never the tampered record.
    let cases: [(&[&str], &str); 4] = [
        (
            &["move", &leaf_action, &root_action],
            "it is a record of action",
        ),
        (&["resign", &leaf_action], "signature does not verify"),
        (&["badkey", &leaf_action], "which is not trusted"),
        (&["garbage", &leaf_action], "refused:"),
    ];
    for (tampering, says) in cases {
        cache.tamper(tampering);
        let op = tampering[0];
        let (o, v, _) = build(&fresh(op), &root, &["--cache", &url, "--trust", &trust]);
        ok(&o, op);
        assert!(text(&o).contains(says), "{op}: {}", text(&o));
        assert!(
            !o.stderr.contains(&0x1b),
            "{op}: an escape reached the terminal"
        );
        assert_eq!(v["outputs"], pushed["outputs"], "{op}: {v}");
        assert_ne!(
            v["record"], pushed["record"],
            "{op}: the tampered entry answered"
        );
    }
    no_leftovers(t.path());
}

/// An output whose bytes are not what the record's tree names: the hit
/// stands (its record is honest), but when a changed root needs the
/// output, the fetch is refused before the blob enters the store, and the
/// dependency is built locally.
#[test]
fn a_swapped_output_blob_is_refused_and_its_action_built_locally() {
    let t = tempfile::tempdir().unwrap();
    let cache = Cache::start(t.path(), None);
    let url = cache.url();
    let a = t.path().join("a");
    let g = t.path().join("g");
    let root = small_graph(&g, "honest");
    let (o, _, events) = build(&a, &root, &["--cache", &url, "--cache-push"]);
    ok(&o, "A builds and pushes");
    let leaf_action = action_of(&a, &events, "leaf");
    cache.tamper(&["swap", &leaf_action]);
    // A changed root (its own command): it must run, and needs the leaf's output.
    let changed = write(
        &g,
        "changed.toml",
        &fs::read_to_string(&root)
            .unwrap()
            .replace("/leaf /leaf", "/leaf"),
    );
    let b = t.path().join("b");
    let (o, v, ev) = build(&b, &changed, &["--cache", &url, "--trust", &key_of(&a)]);
    ok(&o, "B with a swapped blob");
    assert!(
        text(&o).contains("as the record's tree names it: refused"),
        "{}",
        text(&o)
    );
    // The leaf is rebuilt inside the root's slot (rewound), then the root runs.
    assert!(
        text(&o).contains("which the remote cache did not give: building"),
        "{}",
        text(&o)
    );
    assert_eq!(ran(&ev), 1, "{ev:?}");
    assert_eq!(cat(&b, &v["outputs"]["out"], "root", &[]), b"honest\n");
    // Nothing the server swapped in entered B's store.
    let o = fhsx(&b).args(["store", "verify"]).output().unwrap();
    ok(&o, "B's store verifies");
}

/// A server that is gone, and one that accepts and never answers: each
/// costs at most its deadline and a warning, once per run, and the graph
/// is built locally.
#[test]
fn a_dead_or_silent_cache_costs_a_bounded_wait_then_builds_locally() {
    let t = tempfile::tempdir().unwrap();
    let root = small_graph(&t.path().join("g"), "local");
    let dead = format!("grpc://127.0.0.1:{}", free_port());
    let began = Instant::now();
    let (o, v, _) = build(
        &t.path().join("a"),
        &root,
        &["--cache", &dead, "--cache-push", "--cache-timeout", "2"],
    );
    ok(&o, "a dead cache");
    assert_eq!(v["source"], "built");
    assert!(text(&o).contains("unreachable"), "{}", text(&o));
    assert!(
        text(&o).contains("pushing record") && text(&o).contains("the build stands"),
        "{}",
        text(&o)
    );
    assert!(
        began.elapsed() < Duration::from_secs(60),
        "{:?}",
        began.elapsed()
    );
    // Accepts, never speaks.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("grpc://{}", silent.local_addr().unwrap());
    let began = Instant::now();
    let (o, v, _) = build(
        &t.path().join("b"),
        &root,
        &["--cache", &url, "--cache-timeout", "2"],
    );
    ok(&o, "a silent cache");
    assert_eq!(v["source"], "built");
    let warned = text(&o).matches("unreachable").count();
    assert!(warned >= 1, "{}", text(&o));
    // One deadline for the run, not one per action.
    assert!(
        began.elapsed() < Duration::from_secs(30),
        "{:?}",
        began.elapsed()
    );
    assert!(text(&o).contains("not asked again"), "{}", text(&o));
}

/// Read-set-validated reuse through the cache: B's action differs from
/// A's only in an atom the build never read, so B's is answered by A's
/// record (a new record naming it in `reused`) without running.
#[test]
fn a_remote_record_whose_read_set_holds_answers_another_action() {
    let t = tempfile::tempdir().unwrap();
    let cache = Cache::start(t.path(), None);
    let url = cache.url();
    let bb = busybox_deb().display().to_string();
    let g = t.path().join("g");
    for (name, note) in [("one", "first"), ("two", "second")] {
        let d = g.join(name).join("usr/share/unread");
        fs::create_dir_all(&d).unwrap();
        fs::write(d.join("note"), note).unwrap();
    }
    let action = |name: &str| {
        write(&g, &format!("{name}.toml"), &format!(
            "[inputs]\nclosure = [{bb:?}, {:?}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox echo same > $out/f\"]\ntimeout = \"60s\"\n",
            g.join(name).display().to_string()
        ))
    };
    let (one, two) = (action("one"), action("two"));
    let a = t.path().join("a");
    let (o, first, _) = build(&a, &one, &["--cache", &url, "--cache-push"]);
    ok(&o, "A builds and pushes");
    let b = t.path().join("b");
    let (o, v, ev) = build(&b, &two, &["--cache", &url, "--trust", &key_of(&a)]);
    ok(&o, "B reuses A's record");
    assert_eq!(ran(&ev), 0, "{}", text(&o));
    assert_eq!(v["cached"], true, "{v}");
    assert_eq!(v["outputs"], first["outputs"]);
    assert!(text(&o).contains("reusing record"), "{}", text(&o));
}

/// A cache behind TLS and a bearer token (BuildGrid's JWT): with the CA
/// and the token, A pushes and a fresh B gets the result; without the
/// token the cache refuses, which is said once and the build is local; a
/// CA that did not sign the server's certificate is refused the same way.
#[test]
fn a_cache_behind_tls_and_a_token_is_reached_with_them_and_only_with_them() {
    let t = tempfile::tempdir().unwrap();
    let secured = Secured::make(t.path());
    let cache = Cache::start_with(t.path(), None, Some(&secured));
    let url = cache.tls_url();
    let ca = secured.dir.join("ca.pem").display().to_string();
    let token = secured.dir.join("token").display().to_string();
    let root = small_graph(&t.path().join("g"), "secured");
    let a = t.path().join("a");

    let (o, v, _) = build(
        &a,
        &root,
        &["--cache", &url, "--cache-ca", &ca, "--cache-push"],
    );
    ok(&o, "no token");
    assert_eq!(v["source"], "built");
    assert_eq!(
        text(&o).matches("refused our credentials").count(),
        1,
        "{}",
        text(&o)
    );

    let (o, pushed, _) = build(
        &a,
        &root,
        &[
            "--cache",
            &url,
            "--cache-ca",
            &ca,
            "--cache-token-file",
            &token,
            "--cache-push",
            "--rebuild",
        ],
    );
    ok(&o, "A pushes with the token");
    assert!(text(&o).contains("pushed record"), "{}", text(&o));
    let flags = [
        "--cache",
        &url,
        "--cache-ca",
        &ca,
        "--cache-token-file",
        &token,
    ];
    let trust = key_of(&a);
    let (o, v, ev) = build(
        &t.path().join("b"),
        &root,
        &[&flags[..], &["--trust", &trust]].concat(),
    );
    ok(&o, "B with the token");
    assert_eq!(v["source"], "remote", "{}", text(&o));
    assert_eq!(v["record"], pushed["record"]);
    assert_eq!(ran(&ev), 0, "{ev:?}");

    // The host's roots alone do not know the test CA.
    let (o, v, _) = build(
        &t.path().join("c"),
        &root,
        &[
            "--cache",
            &url,
            "--cache-token-file",
            &token,
            "--trust",
            &trust,
        ],
    );
    ok(&o, "C without the CA");
    assert_eq!(v["source"], "built");
    assert!(text(&o).contains("certificate"), "{}", text(&o));
}

/// A loopback TCP forwarder to `to` that cuts its first connection once
/// `cut_after` bytes went from the server to the client; later ones pass
/// whole. Counts connections and the server's bytes forwarded.
struct Flaky {
    port: u16,
    connections: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    forwarded: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Flaky {
    fn start(to: u16, cut_after: usize) -> Flaky {
        use std::io::{Read, Write};
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let connections = Arc::new(AtomicUsize::new(0));
        let forwarded = Arc::new(AtomicUsize::new(0));
        let (conns, fwd) = (connections.clone(), forwarded.clone());
        std::thread::spawn(move || {
            for client in listener.incoming() {
                let Ok(client) = client else { return };
                let first = conns.fetch_add(1, Ordering::SeqCst) == 0;
                let Ok(server) = std::net::TcpStream::connect(("127.0.0.1", to)) else {
                    return;
                };
                let (mut c_in, mut s_out) =
                    (client.try_clone().unwrap(), server.try_clone().unwrap());
                std::thread::spawn(move || {
                    let _ = std::io::copy(&mut c_in, &mut s_out);
                    let _ = s_out.shutdown(std::net::Shutdown::Both);
                });
                let (mut s_in, mut c_out, fwd) = (server, client, fwd.clone());
                std::thread::spawn(move || {
                    let mut buf = vec![0u8; 64 << 10];
                    let mut sent = 0;
                    loop {
                        let n = match s_in.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        if c_out.write_all(&buf[..n]).is_err() {
                            break;
                        }
                        sent += n;
                        fwd.fetch_add(n, Ordering::SeqCst);
                        if first && sent >= cut_after {
                            break;
                        }
                    }
                    let _ = c_out.shutdown(std::net::Shutdown::Both);
                    let _ = s_in.shutdown(std::net::Shutdown::Both);
                });
            }
        });
        Flaky {
            port,
            connections,
            forwarded,
        }
    }
}

/// A large output whose download breaks part-way resumes from where it
/// stopped (ByteStream's read offset) on a new connection: the output
/// comes whole and right, and the server sends little more than it once.
#[test]
fn a_download_cut_part_way_resumes_where_it_stopped() {
    use std::sync::atomic::Ordering;
    let t = tempfile::tempdir().unwrap();
    let cache = Cache::start(t.path(), None);
    let bb = busybox_deb().display().to_string();
    let g = t.path().join("g");
    fs::create_dir_all(&g).unwrap();
    const MIB: usize = 1 << 20;
    write(
        &g,
        "big.toml",
        &format!(
            "[inputs]\nclosure = [{bb:?}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox dd if=/dev/urandom of=$out/big bs=1048576 count=16\"]\ntimeout = \"60s\"\n"
        ),
    );
    let root = write(
        &g,
        "sum.toml",
        &format!(
            "[inputs]\nclosure = [\"big.toml#out\", {bb:?}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir -p $out && busybox sha256sum /big > $out/sum\"]\ntimeout = \"60s\"\n"
        ),
    );
    let a = t.path().join("a");
    let (o, _, events) = build(
        &a,
        &g.join("big.toml"),
        &["--cache", &cache.url(), "--cache-push"],
    );
    ok(&o, "A pushes a 16 MiB output");
    let big = events
        .iter()
        .find(|e| e["event"] == "finished")
        .map(|e| e["outputs"]["out"].clone());
    let big = big.unwrap_or_else(|| {
        let (_, v, _) = build(&a, &g.join("big.toml"), &[]);
        v["outputs"]["out"].clone()
    });
    let flaky = Flaky::start(cache.port, 6 * MIB);
    let url = format!("grpc://127.0.0.1:{}", flaky.port);
    let b = t.path().join("b");
    let (o, v, ev) = build(&b, &root, &["--cache", &url, "--trust", &key_of(&a)]);
    ok(&o, "B through a connection cut part-way");
    assert_eq!(ran(&ev), 1, "only the root ran: {}", text(&o));
    assert!(
        flaky.connections.load(Ordering::SeqCst) >= 2,
        "the cut did not happen"
    );
    let sent = flaky.forwarded.load(Ordering::SeqCst);
    assert!(
        sent < 16 * MIB + 2 * MIB,
        "the download started over: {sent} bytes"
    );
    let want = cat(&a, &big, "big", &[]);
    let sum = cat(&b, &v["outputs"]["out"], "sum", &[]);
    let o = Command::new("sha256sum")
        .arg("-")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut o = o;
    use std::io::Write;
    o.stdin.take().unwrap().write_all(&want).unwrap();
    let expected = o.wait_with_output().unwrap().stdout;
    assert_eq!(
        String::from_utf8_lossy(&sum).split_whitespace().next(),
        String::from_utf8_lossy(&expected).split_whitespace().next()
    );
}
