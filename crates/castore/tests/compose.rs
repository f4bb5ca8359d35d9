//! Composition: clash detection, identical-entry merge, deep merge,
//! determinism, and the path → atom map.

mod common;

use castore::compose::{compose, load_composition};
use castore::import::import_path;
use castore::{Error, Node};
use common::*;

fn atom(env: &Env, name: &str, files: &[(&str, &[u8], u32)]) -> castore::Digest {
    let root = env.path(name);
    std::fs::create_dir_all(&root).unwrap();
    for (p, c, m) in files {
        write(&root.join(p), c, *m);
    }
    import_path(&env.store, &root, &()).unwrap().root
}

#[test]
fn deep_merge_identical_entries_and_map() {
    let env = Env::new();
    let libc = atom(
        &env,
        "libc",
        &[
            ("usr/lib/libc.so.6", b"libc", 0o755),
            ("usr/include/stdio.h", b"stdio", 0o644),
        ],
    );
    let zlib = atom(
        &env,
        "zlib",
        &[
            ("usr/lib/libz.so.1", b"zlib", 0o755),
            ("usr/include/zlib.h", b"zlib.h", 0o644),
        ],
    );
    // Shares an identical file with libc: merges.
    let gcc = atom(
        &env,
        "gcc",
        &[
            ("usr/bin/gcc", b"gcc", 0o755),
            ("usr/include/stdio.h", b"stdio", 0o644),
        ],
    );
    let c = compose(&env.store, &[libc, zlib, gcc]).unwrap();

    let out = env.path("out");
    castore::export::export(&env.store, &c.root, &out, &()).unwrap();
    for (p, want) in [
        ("usr/lib/libc.so.6", &b"libc"[..]),
        ("usr/lib/libz.so.1", b"zlib"),
        ("usr/include/stdio.h", b"stdio"),
        ("usr/include/zlib.h", b"zlib.h"),
        ("usr/bin/gcc", b"gcc"),
    ] {
        assert_eq!(std::fs::read(out.join(p)).unwrap(), want, "{p}");
    }

    let (rec, map) = load_composition(&env.store, &c.root)
        .unwrap()
        .expect("composition stored");
    assert_eq!(rec.atoms, vec![libc, zlib, gcc]);
    assert_eq!(map.owners("usr/lib/libc.so.6"), &[0]);
    assert_eq!(map.owners("usr/lib/libz.so.1"), &[1]);
    assert_eq!(map.owners("usr/include/stdio.h"), &[0, 2]);
    assert_eq!(map.owners("usr/bin/gcc"), &[2]);
    assert_eq!(map.owners("usr/bin"), &[2]);
    assert_eq!(map.owners("usr/lib"), &[0, 1]);
    assert_eq!(map.owners(""), &[0, 1, 2]);

    // Determinism: same atoms, same order → same digest and map.
    let again = compose(&env.store, &[libc, zlib, gcc]).unwrap();
    assert_eq!(again, c);
    assert!(castore::verify::verify(&env.store, Some(&c.root), &())
        .unwrap()
        .is_clean());
}

#[test]
fn clashes_name_the_path_and_both_atoms() {
    let env = Env::new();
    let a = atom(&env, "a", &[("usr/bin/tool", b"one", 0o755)]);
    let b = atom(&env, "b", &[("usr/bin/tool", b"two", 0o755)]);
    let err = compose(&env.store, &[a, b]).unwrap_err();
    let Error::ComposeClash(clash) = &err else {
        panic!("wrong error: {err}");
    };
    assert_eq!(clash.path, "usr/bin/tool");
    assert_eq!((clash.first, clash.second), (a, b));
    let msg = err.to_string();
    assert!(
        msg.contains(&a.to_string())
            && msg.contains(&b.to_string())
            && msg.contains("/usr/bin/tool")
    );

    // Same bytes, different exec bit: also a clash.
    let c = atom(&env, "c", &[("usr/bin/tool", b"one", 0o644)]);
    assert!(matches!(
        compose(&env.store, &[a, c]),
        Err(Error::ComposeClash(_))
    ));
    // File against directory.
    let d = atom(&env, "d", &[("usr/bin/tool/inner", b"x", 0o644)]);
    assert!(matches!(
        compose(&env.store, &[a, d]),
        Err(Error::ComposeClash(_))
    ));
    // Symlink against symlink with another target.
    let s1 = env.path("s1");
    let s2 = env.path("s2");
    std::fs::create_dir_all(&s1).unwrap();
    std::fs::create_dir_all(&s2).unwrap();
    std::os::unix::fs::symlink("usr/bin", s1.join("bin")).unwrap();
    std::os::unix::fs::symlink("usr/sbin", s2.join("bin")).unwrap();
    let s1 = import_path(&env.store, &s1, &()).unwrap().root;
    let s2 = import_path(&env.store, &s2, &()).unwrap().root;
    assert!(matches!(
        compose(&env.store, &[s1, s2]),
        Err(Error::ComposeClash(_))
    ));
    // The same symlink twice merges.
    let c = compose(&env.store, &[s1, s1]).unwrap();
    assert!(matches!(
        castore::walk::lookup(&env.store, &c.root, "bin").unwrap(),
        Node::Symlink { .. }
    ));
}

#[test]
fn order_matters_for_the_map_not_for_content() {
    let env = Env::new();
    let a = atom(&env, "a", &[("a/x", b"x", 0o644)]);
    let b = atom(&env, "b", &[("b/y", b"y", 0o644)]);
    let ab = compose(&env.store, &[a, b]).unwrap();
    let ba = compose(&env.store, &[b, a]).unwrap();
    assert_eq!(ab.root, ba.root, "the merged tree does not depend on order");
    let (_, m) = load_composition(&env.store, &ba.root).unwrap().unwrap();
    // The record kept is the last composition of that root.
    assert_eq!(m.owners("a/x"), &[1]);
}

#[test]
fn missing_atom_is_a_clear_error() {
    let env = Env::new();
    let bogus = castore::Digest::of(b"no such atom");
    let err = compose(&env.store, &[bogus]).unwrap_err();
    assert!(err.to_string().contains("not in the store"), "{err}");
}

/// A composition is remembered (`ROOT/memo`), and a remembered one is used
/// only while it is the one the root's record names: composing the same
/// atoms in another order in between gives the record that order's map,
/// and composing the first order again gives its map back. gc forgets
/// every memo.
#[test]
fn a_remembered_composition_is_the_recorded_one() {
    let env = Env::new();
    let a = atom(&env, "a", &[("a/x", b"x", 0o644)]);
    let b = atom(&env, "b", &[("b/y", b"y", 0o644)]);
    let ab = compose(&env.store, &[a, b]).unwrap();
    assert_eq!(compose(&env.store, &[a, b]).unwrap(), ab);
    let memos = || std::fs::read_dir(env.store.root().join("memo")).map_or(0, |d| d.count());
    assert_eq!(memos(), 1, "nothing remembered");
    compose(&env.store, &[b, a]).unwrap();
    assert_eq!(compose(&env.store, &[a, b]).unwrap(), ab);
    let (c, m) = load_composition(&env.store, &ab.root).unwrap().unwrap();
    assert_eq!(c, ab);
    assert_eq!(
        m.owners("a/x"),
        &[0],
        "the record is not the composition returned"
    );
    castore::gc::gc(&env.store, &[ab.root]).unwrap();
    assert_eq!(memos(), 0, "gc kept a memo");
    assert_eq!(compose(&env.store, &[a, b]).unwrap(), ab);
}

/// An input root over a toolchain: the toolchain shadowed by it composes
/// with it without a clash, every path resolving as in the input root
/// where it has one; what it does not touch is shared by digest.
#[test]
fn a_shadowed_tree_composes_under_the_tree_that_shadows_it() {
    let env = Env::new();
    let toolchain = atom(
        &env,
        "toolchain",
        &[
            ("usr/bin/gcc", b"gcc", 0o755),
            ("usr/bin/cc", b"cc", 0o755),
            ("etc/os-release", b"debian", 0o644),
            ("etc/skel/a", b"skel", 0o644),
            ("opt/x/y", b"deep", 0o644),
        ],
    );
    let tc_bin = env.path("toolchain");
    std::os::unix::fs::symlink("usr/bin", tc_bin.join("bin")).unwrap();
    let toolchain_with_link = import_path(&env.store, &tc_bin, &()).unwrap().root;
    let root = env.path("root");
    for (p, c) in [
        ("usr/bin/cc", &b"mine"[..]),
        ("etc/os-release", b"sysroot"),
        ("bin/sh", b"sh"),
    ] {
        write(&root.join(p), c, 0o755);
    }
    // A directory where the toolchain has a file, a file where it has a directory.
    write(&root.join("usr/bin/gcc/inside"), b"dir", 0o644);
    write(&root.join("opt/x"), b"file", 0o644);
    let input = import_path(&env.store, &root, &()).unwrap().root;

    let lower = castore::compose::shadowed(&env.store, &[toolchain_with_link], &input).unwrap();
    let c = compose(&env.store, &[input, lower[0]]).unwrap();
    let out = env.path("out");
    castore::export::export(&env.store, &c.root, &out, &()).unwrap();
    for (p, want) in [
        ("usr/bin/cc", &b"mine"[..]),
        ("etc/os-release", b"sysroot"),
        ("bin/sh", b"sh"),
        ("usr/bin/gcc/inside", b"dir"),
        ("opt/x", b"file"),
        // What the input root does not have, the toolchain gives.
        ("etc/skel/a", b"skel"),
    ] {
        assert_eq!(std::fs::read(out.join(p)).unwrap(), want, "{p}");
    }
    // The toolchain's `bin` link is shadowed by the input root's directory.
    assert!(out.join("bin").symlink_metadata().unwrap().is_dir());

    // Untouched: the same tree back, no new object.
    let other = env.path("other");
    write(&other.join("srv/data"), b"d", 0o644);
    let other = import_path(&env.store, &other, &()).unwrap().root;
    assert_eq!(
        castore::compose::shadowed(&env.store, &[toolchain], &other).unwrap(),
        [toolchain]
    );
    // Shadowed by itself, only its directories are left: composed under
    // it, the tree is itself.
    let dirs = castore::compose::shadowed(&env.store, &[toolchain], &toolchain).unwrap();
    assert_ne!(dirs, [toolchain]);
    assert_eq!(
        compose(&env.store, &[toolchain, dirs[0]]).unwrap().root,
        toolchain
    );
    // A list of atoms at once, each shadowed alone; asked again, the same
    // answer (remembered for the list).
    let both = [toolchain, toolchain_with_link];
    let first = castore::compose::shadowed(&env.store, &both, &input).unwrap();
    assert_eq!(first.len(), 2);
    assert_eq!(first[1], lower[0]);
    assert_eq!(
        castore::compose::shadowed(&env.store, &both, &input).unwrap(),
        first
    );
}
