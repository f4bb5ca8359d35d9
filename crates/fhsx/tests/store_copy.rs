//! `fhsx store copy`: a record built in one store answers the same action
//! in another, reached through a bundle file or directly; a bundle altered,
//! missing an object, miscounted, cut short, carrying a record of another
//! format or signed by a key the receiver does not trust is refused and
//! leaves the receiving store as it was. Real stores, real builds (bwrap
//! and FUSE), the real binary.

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

use support::{fhsx, text};

/// A store that built one action: where it is, the action file, the
/// record, the output and the store's public key.
struct Built {
    store: PathBuf,
    action: PathBuf,
    record: String,
    output: String,
    key: String,
}

/// In `dir`: store `A` builds an action whose output has a file, an empty
/// file, an executable, a nested directory and a symlink.
fn built(dir: &Path) -> Built {
    let store = dir.join("A");
    let bb = support::busybox(&store);
    let script = "busybox mkdir -p $out/sub/deeper && echo hello > $out/greeting \
                  && : > $out/empty && echo deep > $out/sub/deeper/f \
                  && printf '#!/bin/sh\\n' > $out/run && busybox chmod +x $out/run \
                  && busybox ln -s greeting $out/link";
    let action = dir.join("a.toml");
    fs::write(
        &action,
        format!(
            "[inputs]\nclosure = [\"{bb}\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {script:?}]\ntimeout = \"60s\"\n"
        ),
    )
    .unwrap();
    let (o, v) = support::build_json(&store, &action, &[]);
    assert!(o.status.success(), "the build failed: {}", text(&o));
    assert_eq!(v["cached"], false);
    let o = fhsx(&store).args(["key", "show"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    Built {
        record: v["record"].as_str().unwrap().to_owned(),
        output: v["outputs"]["out"].as_str().unwrap().to_owned(),
        key: String::from_utf8(o.stdout).unwrap().trim().to_owned(),
        store,
        action,
    }
}

/// `fhsx --store STORE --json store copy ARGS…`: the process and its JSON.
fn copy(store: &Path, args: &[&str]) -> (Output, serde_json::Value) {
    let o = fhsx(store)
        .args(["--json", "store", "copy"])
        .args(args)
        .output()
        .unwrap();
    let v = serde_json::from_slice(&o.stdout).unwrap_or(serde_json::Value::Null);
    (o, v)
}

fn file_arg(p: &Path) -> String {
    format!("file:{}", p.display())
}

/// Every entry below `dir`: path, kind, and a file's bytes and executable
/// bit or a symlink's target.
fn listing(dir: &Path) -> Vec<(String, String, Vec<u8>)> {
    use std::os::unix::fs::PermissionsExt;
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in fs::read_dir(&d).unwrap().flatten() {
            let p = e.path();
            let rel = p.strip_prefix(dir).unwrap().display().to_string();
            let m = fs::symlink_metadata(&p).unwrap();
            if m.file_type().is_symlink() {
                let t = fs::read_link(&p).unwrap();
                out.push((
                    rel,
                    "symlink".into(),
                    t.as_os_str().as_encoded_bytes().to_vec(),
                ));
            } else if m.is_dir() {
                out.push((rel, "dir".into(), Vec::new()));
                stack.push(p);
            } else {
                let x = m.permissions().mode() & 0o111 != 0;
                out.push((rel, format!("file x={x}"), fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

/// Export `output` from `store` to `dest`.
fn export(store: &Path, output: &str, dest: &Path) {
    let o = fhsx(store)
        .args(["store", "export", output])
        .arg(dest)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
}

/// A build of `b.action` in `store`, trusting `b.key`: a cache hit
/// answered by `b.record`, with no sandbox started.
fn assert_cache_hit(store: &Path, b: &Built) {
    let (o, v) = support::build_json(store, &b.action, &["--trust", &b.key]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(v["cached"], true, "not a cache hit: {}", text(&o));
    assert_eq!(v["record"], b.record.as_str());
    assert_eq!(v["outputs"]["out"], b.output.as_str());
}

/// Every entry of `store`'s index `name` (`actions`, `commands`), as
/// `KEY/RECORD` paths.
fn index(store: &Path, name: &str) -> Vec<String> {
    let mut out = Vec::new();
    for shard in fs::read_dir(store.join(name))
        .into_iter()
        .flatten()
        .flatten()
    {
        for key in fs::read_dir(shard.path()).unwrap().flatten() {
            for rec in fs::read_dir(key.path()).unwrap().flatten() {
                out.push(format!(
                    "{}/{}",
                    key.file_name().to_string_lossy(),
                    rec.file_name().to_string_lossy()
                ));
            }
        }
    }
    out.sort();
    out
}

/// Whether `store` indexes any record in its action cache.
fn indexes_anything(store: &Path) -> bool {
    fs::read_dir(store.join("actions"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|_| true)
}

/// Nothing staged is left in `store`'s tmp, and no record is indexed.
fn untouched(store: &Path) {
    assert!(!indexes_anything(store), "a refused copy indexed a record");
    let left: Vec<_> = fs::read_dir(store.join("tmp"))
        .map(|rd| rd.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "a refused copy left {left:?}");
}

/// A bundle's frames: (kind, digest, body) each, the end frame last.
fn frames(bundle: &[u8]) -> Vec<(u8, [u8; 32], Vec<u8>)> {
    const MAGIC: &[u8] = b"fhsx-bundle 1\n";
    assert!(bundle.starts_with(MAGIC));
    let mut at = MAGIC.len();
    let mut out = Vec::new();
    loop {
        let kind = bundle[at];
        let digest: [u8; 32] = bundle[at + 1..at + 33].try_into().unwrap();
        let len = u64::from_be_bytes(bundle[at + 33..at + 41].try_into().unwrap()) as usize;
        at += 41;
        if kind == b'E' {
            out.push((kind, digest, len.to_be_bytes().to_vec()));
            assert_eq!(at, bundle.len());
            return out;
        }
        out.push((kind, digest, bundle[at..at + len].to_vec()));
        at += len;
    }
}

/// A bundle of `frames` (the end frame's count recomputed).
fn unframes(frames: &[(u8, [u8; 32], Vec<u8>)]) -> Vec<u8> {
    let mut out = b"fhsx-bundle 1\n".to_vec();
    let mut n = 0u64;
    for (kind, digest, body) in frames {
        out.push(*kind);
        out.extend_from_slice(digest);
        if *kind == b'E' {
            out.extend_from_slice(&n.to_be_bytes());
        } else {
            out.extend_from_slice(&(body.len() as u64).to_be_bytes());
            out.extend_from_slice(body);
            n += 1;
        }
    }
    out
}

#[test]
fn a_record_carried_in_a_bundle_is_a_cache_hit_in_a_fresh_store() {
    let t = tempfile::tempdir().unwrap();
    let a = built(t.path());
    let bundle = t.path().join("hello.bundle");
    let (o, v) = copy(&a.store, &["--to", &file_arg(&bundle), &a.record]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(v["records"], serde_json::json!([a.record]));
    // The record, 2 directories, 4 distinct file blobs (the empty one once),
    // log, read set, manifest, action: every object of the closure.
    assert!(v["objects"].as_u64().unwrap() >= 9, "{v}");
    assert_eq!(
        v["bytes"].as_u64().unwrap() + 14 + 41 * (v["objects"].as_u64().unwrap() + 1),
        fs::metadata(&bundle).unwrap().len(),
        "the bundle is its header, its frames and their bytes"
    );
    let leftovers: Vec<_> = fs::read_dir(t.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".fhsx-bundle"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");

    // A fresh store receives it, trusting A's key.
    let b = t.path().join("B");
    let (o, v) = copy(
        &b,
        &["--from", &file_arg(&bundle), "--trust", &a.key, &a.record],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(v["records"], serde_json::json!([a.record]));
    assert!(v["objects"].as_u64().unwrap() >= 9, "{v}");
    assert_cache_hit(&b, &a);
    // Indexed as the build indexed it in A: by action and by command.
    for name in ["actions", "commands"] {
        assert_eq!(index(&b, name), index(&a.store, name), "{name}");
        assert_eq!(index(&b, name).len(), 1, "{name}");
    }
    let o = fhsx(&b).args(["store", "verify"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));

    // What B serves is byte for byte what A built.
    export(&a.store, &a.output, &t.path().join("from-a"));
    export(&b, &a.output, &t.path().join("from-b"));
    let (la, lb) = (
        listing(&t.path().join("from-a")),
        listing(&t.path().join("from-b")),
    );
    assert_eq!(la, lb);
    assert!(
        la.iter().any(|(p, k, _)| p == "link" && k == "symlink"),
        "{la:?}"
    );
    assert!(
        la.iter().any(|(p, k, _)| p == "run" && k == "file x=true"),
        "{la:?}"
    );
    let cat = |store: &Path| {
        fhsx(store)
            .args(["store", "cat", &a.output, "sub/deeper/f"])
            .output()
            .unwrap()
            .stdout
    };
    assert_eq!(cat(&a.store), b"deep\n");
    assert_eq!(cat(&a.store), cat(&b));
    // The log came too.
    let o = fhsx(&b)
        .args(["record", "show", &a.record])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));

    // Received again, nothing moves.
    let (o, v) = copy(&b, &["--from", &file_arg(&bundle), "--trust", &a.key]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(v["objects"], 0, "{v}");
    assert_eq!(v["bytes"], 0, "{v}");
    // A bundle without the record named: refused, naming what it holds.
    let (o, _) = copy(
        &b,
        &["--from", &file_arg(&bundle), "--trust", &a.key, &a.output],
    );
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("does not hold record"), "{}", text(&o));
}

#[test]
fn a_record_copied_store_to_store_moves_each_object_once() {
    let t = tempfile::tempdir().unwrap();
    let a = built(t.path());
    // To another store, made as it is copied into.
    let c = t.path().join("C");
    let (o, v) = copy(
        &a.store,
        &["--to", c.to_str().unwrap(), "--trust", &a.key, &a.record],
    );
    assert!(o.status.success(), "{}", text(&o));
    let first = v["objects"].as_u64().unwrap();
    assert!(first >= 9, "{v}");
    assert!(v["bytes"].as_u64().unwrap() > 0, "{v}");
    assert_cache_hit(&c, &a);
    // A second copy moves nothing: what C has is not sent.
    let (o, v) = copy(
        &a.store,
        &["--to", c.to_str().unwrap(), "--trust", &a.key, &a.record],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        (v["objects"].as_u64(), v["bytes"].as_u64()),
        (Some(0), Some(0)),
        "{v}"
    );
    assert!(v["present"].as_u64().unwrap() >= 1, "{v}");
    let o = fhsx(&a.store)
        .args([
            "store",
            "copy",
            "--to",
            c.to_str().unwrap(),
            "--trust",
            &a.key,
            &a.record,
        ])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&o.stdout).starts_with("copied 1 record to "),
        "{}",
        text(&o)
    );

    // Received from a store into this one (--from DIR).
    let d = t.path().join("D");
    let (o, v) = copy(
        &d,
        &[
            "--from",
            a.store.to_str().unwrap(),
            "--trust",
            &a.key,
            &a.record,
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(v["objects"].as_u64(), Some(first), "{v}");
    assert_cache_hit(&d, &a);

    // Not over a directory that is something else, nor a tree for a record.
    let other = t.path().join("not-a-store");
    fs::create_dir_all(&other).unwrap();
    fs::write(other.join("precious"), b"mine").unwrap();
    let (o, _) = copy(&a.store, &["--to", other.to_str().unwrap(), &a.record]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(
        text(&o).contains("neither an fhsx store nor empty"),
        "{}",
        text(&o)
    );
    assert_eq!(fs::read_dir(&other).unwrap().count(), 1);
    let (o, _) = copy(&a.store, &["--to", c.to_str().unwrap(), &a.output]);
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("is a tree, not a record"), "{}", text(&o));
}

#[test]
fn an_untrusted_signer_is_refused_naming_the_key() {
    let t = tempfile::tempdir().unwrap();
    let a = built(t.path());
    let bundle = t.path().join("a.bundle");
    let (o, _) = copy(&a.store, &["--to", &file_arg(&bundle), &a.record]);
    assert!(o.status.success(), "{}", text(&o));
    let b = t.path().join("B");
    // B has a key of its own, which is not A's.
    let o = fhsx(&b).args(["key", "generate"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let other = "ed25519:d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
    for args in [vec![], vec!["--trust", other]] {
        let mut all = vec!["--from".to_owned(), file_arg(&bundle)];
        all.extend(args.iter().map(|s| s.to_string()));
        let all: Vec<&str> = all.iter().map(String::as_str).collect();
        let (o, _) = copy(&b, &all);
        assert_eq!(o.status.code(), Some(3), "{}", text(&o));
        let said = text(&o);
        assert!(said.contains(&a.key), "the key is not named: {said}");
        assert!(said.contains("--trust"), "the fix is not named: {said}");
        untouched(&b);
    }
    // Nor store to store.
    let c = t.path().join("C");
    let (o, _) = copy(&a.store, &["--to", c.to_str().unwrap(), &a.record]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert!(text(&o).contains(&a.key), "{}", text(&o));
    untouched(&c);
}

#[test]
fn a_tampered_bundle_is_refused_and_leaves_nothing_indexed() {
    let t = tempfile::tempdir().unwrap();
    let a = built(t.path());
    let bundle = t.path().join("a.bundle");
    let (o, _) = copy(&a.store, &["--to", &file_arg(&bundle), &a.record]);
    assert!(o.status.success(), "{}", text(&o));
    let good = fs::read(&bundle).unwrap();
    let fr = frames(&good);
    assert_eq!(fr[0].0, b'R');
    let blob = fr
        .iter()
        .position(|f| f.0 == b'B' && !f.2.is_empty())
        .unwrap();
    let dir = fr.iter().rposition(|f| f.0 == b'D').unwrap();

    let mut cases: Vec<(&str, Vec<u8>, &str)> = Vec::new();
    // A byte flipped in a blob, in a directory, in the record.
    for (what, i) in [("a blob", blob), ("a directory", dir), ("the record", 0)] {
        let mut f = fr.clone();
        let mid = f[i].2.len() / 2;
        f[i].2[mid] ^= 0x20;
        cases.push((what, unframes(&f), "was altered or damaged"));
    }
    // One object's bytes swapped for another's, under the first's name.
    let other = fr
        .iter()
        .rposition(|f| f.0 == b'B' && f.2 != fr[blob].2)
        .unwrap();
    let mut f = fr.clone();
    f[blob].2 = fr[other].2.clone();
    cases.push(("a swapped body", unframes(&f), "altered"));
    // Objects reordered: a child before the directory naming it.
    let mut f = fr.clone();
    let (first_dir, _) = f.iter().enumerate().find(|(_, x)| x.0 == b'D').unwrap();
    let moved = f.remove(first_dir);
    let end = f.len() - 1;
    f.insert(end, moved);
    cases.push((
        "reordered objects",
        unframes(&f),
        "no record or directory before it names",
    ));
    // A well-formed object no one named, swapped in.
    let foreign = b"not part of this record".to_vec();
    let mut f = fr.clone();
    let d = *castore::Digest::of(&foreign).as_bytes();
    f.insert(1, (b'B', d, foreign));
    cases.push((
        "a foreign object",
        unframes(&f),
        "no record or directory before it names",
    ));
    // The record changed and renamed after its new bytes: its signature
    // no longer holds.
    let mut f = fr.clone();
    let rec = String::from_utf8(f[0].2.clone()).unwrap();
    let forged = rec.replacen("\"max_rss_kib\": ", "\"max_rss_kib\": 1", 1);
    assert_ne!(forged, rec);
    f[0].1 = *castore::Digest::of(forged.as_bytes()).as_bytes();
    f[0].2 = forged.into_bytes();
    cases.push((
        "a forged record",
        unframes(&f),
        "not signed by the key it names",
    ));

    // A record of another format, renamed after its new bytes: never a
    // hit, so never copied.
    let mut f = fr.clone();
    let older = rec.replacen("\"format\": 2,", "\"format\": 1,", 1);
    assert_ne!(older, rec);
    f[0].1 = *castore::Digest::of(older.as_bytes()).as_bytes();
    f[0].2 = older.into_bytes();
    cases.push(("another format", unframes(&f), "is a format-1 record"));
    // One object of the output left out: the copy is incomplete.
    let deep = fr
        .iter()
        .position(|f| f.0 == b'B' && f.2 == b"deep\n")
        .unwrap();
    let mut f = fr.clone();
    f.remove(deep);
    cases.push(("an object left out", unframes(&f), "is incomplete"));
    // A file's blob of another size under its name: refused for its size,
    // before it is hashed.
    let hello = fr
        .iter()
        .position(|f| f.0 == b'B' && f.2 == b"hello\n")
        .unwrap();
    let mut f = fr.clone();
    f[hello].2 = b"hello, world\n".to_vec();
    cases.push((
        "a blob of another size",
        unframes(&f),
        "is 13 bytes where its directory says 6",
    ));

    // A record with a field named to move a terminal's cursor: refused,
    // the name shown escaped.
    let mut f = fr.clone();
    let hostile = format!("{{\"\\u001b[2J\\u001b]52;c;aGk=\\u0007\": 1, {}", &rec[1..]);
    f[0].1 = *castore::Digest::of(hostile.as_bytes()).as_bytes();
    f[0].2 = hostile.into_bytes();
    cases.push(("a hostile field", unframes(&f), "unknown field"));

    for (what, bytes, says) in cases {
        let b = t.path().join(format!("B-{}", what.replace(' ', "-")));
        let p = t.path().join("tampered.bundle");
        fs::write(&p, &bytes).unwrap();
        let (o, _) = copy(&b, &["--from", &file_arg(&p), "--trust", &a.key]);
        assert_eq!(o.status.code(), Some(3), "{what}: {}", text(&o));
        assert!(text(&o).contains(says), "{what}: {}", text(&o));
        assert!(
            text(&o).starts_with("fhsx: error: "),
            "{what}: {}",
            text(&o)
        );
        assert!(
            !text(&o).contains(['\x1b', '\x07']),
            "{what}: raw bytes shown"
        );
        untouched(&b);
        // No output object went in either: the store is as it was.
        let o = fhsx(&b).args(["store", "ls", &a.output]).output().unwrap();
        assert!(!o.status.success(), "{what}: the output is in the store");
        // And the build there is no cache hit.
        let (o, v) = support::build_json(&b, &a.action, &["--trust", &a.key]);
        assert_ne!(v["cached"], true, "{what}: {}", text(&o));
    }
}

#[test]
fn a_truncated_bundle_is_refused_cleanly() {
    let t = tempfile::tempdir().unwrap();
    let a = built(t.path());
    let bundle = t.path().join("a.bundle");
    let (o, _) = copy(&a.store, &["--to", &file_arg(&bundle), &a.record]);
    assert!(o.status.success(), "{}", text(&o));
    let good = fs::read(&bundle).unwrap();
    let b = t.path().join("B");
    let p = t.path().join("cut.bundle");
    for cut in [
        0,
        5,
        14,
        20,
        good.len() / 2,
        good.len() - 60,
        good.len() - 41,
        good.len() - 1,
    ] {
        fs::write(&p, &good[..cut]).unwrap();
        let (o, _) = copy(&b, &["--from", &file_arg(&p), "--trust", &a.key]);
        assert_eq!(o.status.code(), Some(2), "cut at {cut}: {}", text(&o));
        let said = text(&o);
        assert!(said.contains("cut short"), "cut at {cut}: {said}");
        assert_eq!(said.lines().count(), 1, "cut at {cut}: {said}");
        untouched(&b);
    }
    // Bytes after the end, an unknown kind, an absurd length, not a bundle.
    let mut longer = good.clone();
    longer.push(b'\n');
    let mut kind = good.clone();
    kind[14] = 0x1b;
    let mut absurd = good.clone();
    absurd[14 + 33..14 + 41].copy_from_slice(&u64::MAX.to_be_bytes());
    // The end frame counting one object more than came before it.
    let mut miscounted = good.clone();
    let at = good.len() - 8;
    let count = u64::from_be_bytes(good[at..].try_into().unwrap());
    miscounted[at..].copy_from_slice(&(count + 1).to_be_bytes());
    for (what, bytes, says) in [
        ("trailing bytes", longer, "follow its end frame"),
        ("an unknown kind", kind, "\\x1b"),
        ("an absurd length", absurd, "more than the"),
        ("a miscounted end", miscounted, "its end frame counts"),
        (
            "another file",
            b"\x1b]52;c;aGk=\x07 hello".to_vec(),
            "not a bundle",
        ),
    ] {
        fs::write(&p, &bytes).unwrap();
        let (o, _) = copy(&b, &["--from", &file_arg(&p), "--trust", &a.key]);
        assert_eq!(o.status.code(), Some(2), "{what}: {}", text(&o));
        let said = text(&o);
        assert!(said.contains(says), "{what}: {said}");
        assert!(!said.contains('\x1b'), "{what}: raw bytes shown: {said}");
        untouched(&b);
    }
    // The whole bundle is still good.
    let (o, _) = copy(&b, &["--from", &file_arg(&bundle), "--trust", &a.key]);
    assert!(o.status.success(), "{}", text(&o));
    assert_cache_hit(&b, &a);
}
