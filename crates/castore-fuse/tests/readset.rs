//! Read-set capture: exactly what was touched, deterministic, mmap included.

mod common;

use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

use castore::Digest;
use castore_fuse::{Access, EntryKind, MountOptions, ReadSet};
use common::*;

fn run_script(fx: &Fixture, name: &str, script: impl Fn(&str) -> String) -> (ReadSet, Digest) {
    let g = fx.mount(name);
    sh_ok(&script(&g.mountpoint().display().to_string()));
    let out = g.finish(&fx.store).unwrap();
    assert!(out.integrity_failures.is_empty());
    // What finish stored is what it returned.
    assert_eq!(
        ReadSet::load(&fx.store, &out.read_set_digest).unwrap(),
        out.read_set
    );
    assert_eq!(out.read_set.digest(), out.read_set_digest);
    (out.read_set, out.read_set_digest)
}

fn reads_a_b_stats_c(m: &str) -> String {
    format!(
        "cat {m}/share/doc/a.txt > /dev/null && cat {m}/share/doc/b.txt > /dev/null && \
         stat {m}/share/doc/c.txt > /dev/null && ! test -e {m}/share/doc/missing.h"
    )
}

/// Reads A and B, stats C, probes a missing header: the read set is exactly
/// those (with their digests), the directories walked to reach them, and the
/// absence — nothing of the files never touched.
#[test]
fn read_set_is_exactly_what_was_touched() {
    let fx = Fixture::new(sample_tree);
    let (rs, _) = run_script(&fx, "view", reads_a_b_stats_c);
    assert_eq!(rs.root, fx.root);
    let got: BTreeSet<(String, EntryKind, Access)> = rs
        .entries
        .iter()
        .map(|e| (e.path.clone(), e.kind, e.access))
        .collect();
    let want: BTreeSet<(String, EntryKind, Access)> = [
        ("/share", EntryKind::Dir, Access::Lookup),
        ("/share/doc", EntryKind::Dir, Access::Lookup),
        ("/share/doc/a.txt", EntryKind::File, Access::Read),
        ("/share/doc/b.txt", EntryKind::File, Access::Read),
        ("/share/doc/c.txt", EntryKind::File, Access::Lookup),
        ("/share/doc/missing.h", EntryKind::Absent, Access::Lookup),
    ]
    .into_iter()
    .map(|(p, k, a)| (p.to_owned(), k, a))
    .collect();
    assert_eq!(got, want);
    for (p, content) in [("a", "a\n"), ("b", "b\n"), ("c", "c\n")] {
        let e = rs.get(&format!("/share/doc/{p}.txt")).unwrap();
        assert_eq!(e.digest, Some(Digest::of(content.as_bytes())));
    }
    assert_eq!(rs.get("/share/doc/missing.h").unwrap().digest, None);
    assert!(rs.get("/share/doc/d.txt").is_none());
}

/// Two identical runs on fresh mounts give the identical read-set digest; a
/// different run gives a different one.
#[test]
fn identical_runs_give_identical_digests() {
    let fx = Fixture::new(sample_tree);
    let script = |m: &str| {
        format!(
            "{} && ls -l {m}/many > /dev/null && readlink {m}/bin/tool > /dev/null && {m}/bin/tool > /dev/null",
            reads_a_b_stats_c(m)
        )
    };
    let (a, da) = run_script(&fx, "v1", script);
    let (b, db) = run_script(&fx, "v2", script);
    assert_eq!(a, b);
    assert_eq!(da, db);
    assert_eq!(
        a.get("/many").unwrap().access,
        Access::Read,
        "listing recorded"
    );
    assert_eq!(a.get("/bin/tool").unwrap().kind, EntryKind::Symlink);
    assert_eq!(
        a.get("/bin/tool.sh").unwrap().access,
        Access::Read,
        "exec recorded"
    );
    let (_, dc) = run_script(&fx, "v3", |m| format!("cat {m}/README > /dev/null"));
    assert_ne!(da, dc);
}

/// A dynamically linked binary and its libraries, at the paths `ldd` names.
fn dynamic_root(root: &Path) {
    let o = sh_ok("ldd /usr/bin/cat");
    let mut paths = vec!["/usr/bin/cat".to_owned()];
    for line in o.lines() {
        if let Some(p) = line.split_whitespace().find(|w| w.starts_with('/')) {
            paths.push(p.to_owned());
        }
    }
    assert!(paths.len() >= 3, "cat is not dynamically linked? {o}");
    for p in &paths {
        let bytes = fs::read(p).unwrap();
        write(&root.join(p.trim_start_matches('/')), &bytes, true);
    }
    write(&root.join("etc/motd"), b"from the view\n", false);
}

fn kernel_at_least(major: u32, minor: u32) -> bool {
    let r = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mut it = r
        .trim()
        .split(['.', '-'])
        .map(|x| x.parse::<u32>().unwrap_or(0));
    (it.next().unwrap_or(0), it.next().unwrap_or(0)) >= (major, minor)
}

fn mmap_captured(passthrough: bool) {
    let fx = Fixture::new(dynamic_root);
    let mp = fx.mountpoint(if passthrough { "pt" } else { "daemon" });
    let opts = MountOptions {
        passthrough,
        ..fx.opts()
    };
    let g = castore_fuse::mount(&fx.store, &fx.root, &mp, &opts).unwrap();
    let out = sh_ok(&format!("chroot {} /usr/bin/cat /etc/motd", mp.display()));
    assert_eq!(out, "from the view\n");
    if passthrough && kernel_at_least(6, 9) {
        assert!(
            g.passthrough_active(),
            "the kernel should have taken passthrough"
        );
    }
    if !passthrough {
        assert!(!g.passthrough_active());
    }
    let outcome = g.finish(&fx.store).unwrap();
    let rs = &outcome.read_set;
    let libc = rs
        .entries
        .iter()
        .find(|e| e.path.ends_with("/libc.so.6"))
        .unwrap_or_else(|| panic!("libc not in the read set: {rs:?}"));
    assert_eq!(libc.access, Access::Read);
    assert_eq!(libc.kind, EntryKind::Exe);
    let ld = rs
        .entries
        .iter()
        .find(|e| e.path.contains("/ld-linux"))
        .unwrap_or_else(|| panic!("the loader is not in the read set: {rs:?}"));
    assert_eq!(ld.access, Access::Read);
    assert_eq!(rs.get("/usr/bin/cat").unwrap().access, Access::Read);
    assert_eq!(rs.get("/etc/motd").unwrap().access, Access::Read);
    // The loader probed for its cache, which the view does not have.
    assert_eq!(
        rs.get("/etc/ld.so.cache").map(|e| e.kind),
        Some(EntryKind::Absent)
    );
}

/// Running a dynamically linked binary from the view (chroot): the loader,
/// libc (mapped, not read) and the binary are all in the read set, whether
/// the kernel serves reads by passthrough or the daemon serves them.
#[test]
fn mmapped_libraries_are_captured_with_passthrough() {
    mmap_captured(true);
}

#[test]
fn mmapped_libraries_are_captured_without_passthrough() {
    mmap_captured(false);
}
