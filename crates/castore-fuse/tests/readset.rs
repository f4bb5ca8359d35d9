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

/// A read set as (path, kind, access) triples.
fn observed(rs: &ReadSet) -> BTreeSet<(String, EntryKind, Access)> {
    rs.entries
        .iter()
        .map(|e| (e.path.clone(), e.kind, e.access))
        .collect()
}

fn expected(entries: &[(&str, EntryKind, Access)]) -> BTreeSet<(String, EntryKind, Access)> {
    entries
        .iter()
        .map(|(p, k, a)| (p.to_string(), *k, *a))
        .collect()
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
    let want = expected(&[
        ("/share", EntryKind::Dir, Access::Lookup),
        ("/share/doc", EntryKind::Dir, Access::Lookup),
        ("/share/doc/a.txt", EntryKind::File, Access::Read),
        ("/share/doc/b.txt", EntryKind::File, Access::Read),
        ("/share/doc/c.txt", EntryKind::File, Access::Lookup),
        ("/share/doc/missing.h", EntryKind::Absent, Access::Lookup),
    ]);
    assert_eq!(observed(&rs), want);
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

fn mmap_captured(passthrough: bool, zero_message_open: bool) {
    let fx = Fixture::new(dynamic_root);
    let mp = fx.mountpoint(if passthrough { "pt" } else { "daemon" });
    let opts = MountOptions {
        passthrough,
        zero_message_open,
        ..fx.opts()
    };
    let g = castore_fuse::mount(&fx.store, &fx.root, &mp, &opts).unwrap();
    let out = sh_ok(&format!("chroot {} /usr/bin/cat /etc/motd", mp.display()));
    assert_eq!(out, "from the view\n");
    if passthrough && !zero_message_open && kernel_at_least(6, 9) {
        assert!(
            g.passthrough_active(),
            "the kernel should have taken passthrough"
        );
    }
    if !passthrough || zero_message_open {
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
    mmap_captured(true, false);
}

#[test]
fn mmapped_libraries_are_captured_without_passthrough() {
    mmap_captured(false, false);
}

/// The same with opens that send no message (the kernel's `no_open`, as
/// builds mount their view): a mapping's first page fault is what records
/// the library as read.
#[test]
fn mmapped_libraries_are_captured_with_zero_message_opens() {
    mmap_captured(true, true);
}

/// With opens that send no message, a file is read when its bytes are
/// first wanted: A and B (read twice, through two opens) are read, C only
/// stat'ed and D opened but never read are looked up, and the empty file,
/// opened and read, is read — no `READ` ever comes for it, so its lookup
/// counts (its attributes show all of it). The store's wrong bytes still
/// fail: a rewritten blob reads as `EIO` and is an integrity failure.
#[test]
fn zero_message_opens_record_reads_at_the_first_byte_wanted() {
    let fx = Fixture::new(sample_tree);
    let opts = MountOptions {
        zero_message_open: true,
        ..fx.opts()
    };
    let g = castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint("zmo"), &opts).unwrap();
    let m = g.mountpoint().display().to_string();
    sh_ok(&format!(
        "{} && cat {m}/share/doc/a.txt > /dev/null && : < {m}/share/doc/d.txt && cat {m}/empty",
        reads_a_b_stats_c(&m)
    ));
    let out = g.finish(&fx.store).unwrap();
    assert!(out.integrity_failures.is_empty());
    let want = expected(&[
        ("/empty", EntryKind::File, Access::Read),
        ("/share", EntryKind::Dir, Access::Lookup),
        ("/share/doc", EntryKind::Dir, Access::Lookup),
        ("/share/doc/a.txt", EntryKind::File, Access::Read),
        ("/share/doc/b.txt", EntryKind::File, Access::Read),
        ("/share/doc/c.txt", EntryKind::File, Access::Lookup),
        ("/share/doc/d.txt", EntryKind::File, Access::Lookup),
        ("/share/doc/missing.h", EntryKind::Absent, Access::Lookup),
    ]);
    assert_eq!(observed(&out.read_set), want);

    let blob = fx
        .store
        .object_path(castore::store::ObjectKind::Blob, &Digest::of(b"unicode\n"));
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(&blob, fs::Permissions::from_mode(0o644)).unwrap();
    fs::write(&blob, b"UNICODE\n").unwrap();
    let opts = MountOptions {
        verified: std::sync::Arc::default(),
        ..opts
    };
    let g = castore_fuse::mount(&fx.store, &fx.root, &fx.mountpoint("zmo2"), &opts).unwrap();
    let e = fs::read(g.mountpoint().join("share/data/name with spaces ü")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::EIO), "{e}");
    let out = g.finish(&fx.store).unwrap();
    assert_eq!(out.integrity_failures.len(), 1);
}

/// Past `max_read_set_entries`, a stat of a new path (absent or present)
/// fails with ENOMEM, is asked again next time (the kernel cached nothing),
/// paths already in the set keep working, and the outcome says the read set
/// is incomplete with the cap it hit.
#[test]
fn read_set_cap_refuses_new_paths_and_marks_the_set_incomplete() {
    use std::io::ErrorKind;
    let fx = Fixture::new(sample_tree);
    let mp = fx.mountpoint("capped");
    let opts = MountOptions {
        max_read_set_entries: 20,
        ..fx.opts()
    };
    let g = castore_fuse::mount(&fx.store, &fx.root, &mp, &opts).unwrap();
    // /share, /share/doc, a.txt: three entries; then absences up to the cap.
    fs::read(mp.join("share/doc/a.txt")).unwrap();
    for i in 0..17 {
        let e = fs::symlink_metadata(mp.join(format!("share/doc/nope{i}"))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    }
    assert_eq!(g.read_set_refused(), 0);
    // Full: a new absence and a new existing path are refused with ENOMEM.
    for _ in 0..2 {
        let e = fs::symlink_metadata(mp.join("share/doc/nope-new")).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ENOMEM), "{e}");
    }
    let e = fs::symlink_metadata(mp.join("share/doc/b.txt")).unwrap_err();
    assert_eq!(e.raw_os_error(), Some(libc::ENOMEM), "{e}");
    // Asked again each time: nothing was cached for the refused paths.
    assert_eq!(g.read_set_refused(), 3);
    // What is already in the set still answers.
    assert_eq!(fs::read(mp.join("share/doc/a.txt")).unwrap(), b"a\n");
    assert_eq!(
        fs::symlink_metadata(mp.join("share/doc/nope3"))
            .unwrap_err()
            .kind(),
        ErrorKind::NotFound
    );
    let out = g.finish_compact(&fx.store).unwrap();
    assert_eq!(out.read_set.len(), 20);
    let o = out.read_set_overflow.expect("the read set is incomplete");
    assert_eq!((o.max_entries, o.refused), (20, 3));
    let err = out.check().unwrap_err();
    assert!(
        matches!(err, castore_fuse::Error::ReadSetIncomplete(_)),
        "{err}"
    );
    assert!(
        err.to_string().contains("max_read_set_entries = 20"),
        "{err}"
    );
    // The stored encoding is still the canonical one of what was recorded.
    let rs = ReadSet::load(&fx.store, &out.read_set_digest).unwrap();
    assert_eq!(rs, out.read_set.to_read_set());
    assert!(rs.get("/share/doc/nope-new").is_none());
    assert!(rs.get("/share/doc/b.txt").is_none());
}

/// Under the default cap nothing is refused, and `finish_compact` stores
/// the same bytes `finish` returns.
#[test]
fn compact_and_full_finish_agree() {
    let fx = Fixture::new(sample_tree);
    let script = |m: &str| {
        format!(
            "{} && ls {m}/many > /dev/null && ls {m}/ > /dev/null && cat {m}/bin/docs/a.txt > /dev/null; \
             test -e {m}/many/nope; test -e '{m}/share/data/name with spaces ü'",
            reads_a_b_stats_c(m)
        )
    };
    let g = fx.mount("c1");
    sh(&script(&g.mountpoint().display().to_string()));
    let c = g.finish_compact(&fx.store).unwrap();
    c.check().unwrap();
    let g = fx.mount("c2");
    sh(&script(&g.mountpoint().display().to_string()));
    let full = g.finish(&fx.store).unwrap();
    full.check().unwrap();
    assert_eq!(c.read_set_digest, full.read_set_digest);
    assert_eq!(c.read_set.to_read_set(), full.read_set);
    assert_eq!(c.read_set.len(), full.read_set.entries.len() as u64);
    assert_eq!(full.read_set.get("/").map(|e| e.access), Some(Access::Read));
    assert!(full.read_set_overflow.is_none());
    // Everything observed is in the view, checked in one walk.
    c.read_set.check_within(&fx.store, &fx.root).unwrap();
}
