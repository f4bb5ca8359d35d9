//! Closure bloat over a composed view: the atom nothing was read from is named.

mod common;

use std::fs;

use castore::compose::compose;
use castore::import::import_path;
use castore_fuse::closure_bloat;
use common::*;

#[test]
fn the_unread_atom_is_named() {
    require_fuse();
    let fx = Fixture::new(|_| {});
    let mut atoms = Vec::new();
    for (name, files) in [
        ("a", vec![("usr/bin/a-tool", 100usize, true)]),
        (
            "b",
            vec![
                ("usr/lib/libb.so", 2000, false),
                ("usr/lib/libb.a", 3000, false),
            ],
        ),
        (
            "c",
            vec![
                ("usr/share/c/big.dat", 50_000, false),
                ("usr/share/c/small", 10, false),
            ],
        ),
    ] {
        let dir = fx.tmp.path().join(format!("atom-{name}"));
        for (p, size, exec) in files {
            write(&dir.join(p), &vec![name.as_bytes()[0]; size], exec);
        }
        atoms.push(import_path(&fx.store, &dir, &()).unwrap().root);
    }
    let comp = compose(&fx.store, &atoms).unwrap();
    let mp = fx.mountpoint("view");
    let g = castore_fuse::mount(&fx.store, &comp.root, &mp, &fx.opts()).unwrap();
    let m = mp.display();
    sh_ok(&format!(
        "cat {m}/usr/bin/a-tool {m}/usr/lib/libb.so > /dev/null"
    ));
    let out = g.finish(&fx.store).unwrap();

    let report = closure_bloat(&fx.store, &out.read_set, 5).unwrap();
    let unused: Vec<_> = report.unused_atoms().map(|a| a.atom).collect();
    assert_eq!(unused, vec![atoms[2]], "{report:#?}");
    let a = &report.atoms[0];
    assert_eq!((a.read_files, a.unread_files), (1, 0));
    let b = &report.atoms[1];
    assert_eq!(
        (b.read_files, b.read_bytes, b.unread_bytes),
        (1, 2000, 3000)
    );
    assert_eq!(b.largest_unread, vec![("/usr/lib/libb.a".to_owned(), 3000)]);
    let c = &report.atoms[2];
    assert_eq!(c.declared_bytes, 50_010);
    assert_eq!(
        c.largest_unread[0],
        ("/usr/share/c/big.dat".to_owned(), 50_000)
    );

    // A view that was not composed has no map to charge against.
    let plain = fx.tmp.path().join("plain");
    fs::create_dir(&plain).unwrap();
    write(&plain.join("x"), b"x", false);
    let root = import_path(&fx.store, &plain, &()).unwrap().root;
    let mut rs = out.read_set.clone();
    rs.root = root;
    let e = closure_bloat(&fx.store, &rs, 5).unwrap_err();
    assert_eq!(e.kind(), castore::ErrorKind::Input, "{e}");
}
