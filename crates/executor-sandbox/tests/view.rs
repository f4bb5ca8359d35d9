//! The view root provider with the real bwrap: a small composed FHS tree
//! (dash and its libraries, copied from the host, with merged-usr symlinks)
//! stands in for the FUSE view; the build runs on it with no host libc.

mod common;

use std::ffi::OsString;
use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use executor_sandbox::{HostEnv, Outcome, Runtime};

/// Copy `/usr/bin/dash` and the libraries `ldd` names into `tree`, at their
/// canonical (merged-usr) paths, and recreate the host's top-level symlinks.
fn make_view(tree: &Path) {
    let ldd = Command::new("ldd")
        .arg("/usr/bin/dash")
        .output()
        .expect("ldd (libc-bin) is needed to build the test view");
    let mut files: Vec<PathBuf> = vec!["/usr/bin/dash".into()];
    for line in String::from_utf8_lossy(&ldd.stdout).lines() {
        if let Some(p) = line.split_whitespace().find(|w| w.starts_with('/')) {
            files.push(p.into());
        }
    }
    for f in files {
        let real = std::fs::canonicalize(&f).unwrap();
        let dest = tree.join(real.strip_prefix("/").unwrap());
        std::fs::create_dir_all(dest.parent().unwrap()).unwrap();
        std::fs::copy(&real, &dest).unwrap();
        // Keep a symlinked last component (e.g. /usr/lib64/ld-linux-x86-64.so.2).
        let via = std::fs::canonicalize(f.parent().unwrap())
            .unwrap()
            .join(f.file_name().unwrap());
        if let Ok(t) = std::fs::read_link(&via) {
            let at = tree.join(via.strip_prefix("/").unwrap());
            std::fs::create_dir_all(at.parent().unwrap()).unwrap();
            let _ = symlink(t, at);
        }
    }
    std::os::unix::fs::symlink("dash", tree.join("usr/bin/sh")).unwrap();
    for top in ["bin", "lib", "lib64", "sbin"] {
        if let Ok(t) = std::fs::read_link(Path::new("/").join(top)) {
            symlink(t, tree.join(top)).unwrap();
        }
    }
    std::fs::create_dir_all(tree.join("etc")).unwrap();
    std::fs::write(tree.join("etc/os-release"), "NAME=view\n").unwrap();
    // Entries the sandbox provides itself are not taken from the view.
    std::fs::create_dir_all(tree.join("tmp/from-view")).unwrap();
}

/// Run `script` under `/bin/sh` in `spec`, which must exit 0 with no
/// line saying `ESCAPED`; its stdout.
fn contained(rt: &Runtime, spec: &executor_sandbox::SandboxSpec, script: &str) -> String {
    let cmd: Vec<OsString> = os(&["/bin/sh", "-c", script]);
    let r = rt.run(spec, &HostEnv::new(), &cmd, opts()).unwrap();
    assert_eq!(r.outcome, Outcome::Exited(0), "{}\n{}", out(&r), err(&r));
    let o = out(&r);
    assert!(!o.contains("ESCAPED"), "{o}");
    o
}

#[test]
fn fhs_materialization_view_root_read_only_scratch_at_build() {
    require_bwrap();
    let tree = tempfile::tempdir().unwrap();
    make_view(tree.path());
    let scratch = tempfile::tempdir().unwrap();
    let rt = Runtime::new().unwrap();
    let spec = rt.view_spec(tree.path(), scratch.path()).unwrap();
    let script = "read l < /etc/os-release; echo \"$l\"; echo \"pwd=$(pwd)\"
        [ -e /tmp/from-view ] && echo ESCAPED view-tmp
        [ -e /etc/shadow ] && echo ESCAPED host-etc
        [ -e /usr/bin/python3 ] && echo ESCAPED host-usr
        for d in / /usr /usr/bin /etc /lib; do ( : > $d/probe ) 2>/dev/null && echo ESCAPED write $d; done
        echo out > /build/result && echo t > /tmp/t && echo DONE";
    let o = contained(&rt, &spec, script);
    assert!(
        o.contains("NAME=view") && o.contains("pwd=/build") && o.contains("DONE"),
        "{o}"
    );
    assert_eq!(
        std::fs::read_to_string(scratch.path().join("result")).unwrap(),
        "out\n"
    );
    // Nothing was written into the view.
    assert!(!tree.path().join("probe").exists() && !tree.path().join("usr/probe").exists());
}

/// The scratch placed in the root instead of at `/build` (how an action
/// whose input root is its `/` runs): only the places are writable — one
/// nested in a directory of the view, one at the top level where the view
/// has nothing — and `/build` is the view's own, read-only.
#[test]
fn a_placed_scratch_is_writable_only_at_its_places() {
    require_bwrap();
    let tree = tempfile::tempdir().unwrap();
    make_view(tree.path());
    std::fs::create_dir_all(tree.path().join("work/p")).unwrap();
    std::fs::create_dir_all(tree.path().join("build")).unwrap();
    std::fs::write(tree.path().join("build/from-view"), "view\n").unwrap();
    let scratch = tempfile::tempdir().unwrap();
    for d in ["w", "i"] {
        std::fs::create_dir(scratch.path().join(d)).unwrap();
    }
    std::fs::write(scratch.path().join("w/held"), "held\n").unwrap();
    let rt = Runtime::new().unwrap();
    let mut spec = rt.view_spec(tree.path(), scratch.path()).unwrap();
    spec.place_scratch(vec![
        (scratch.path().join("w"), "/work/p".into()),
        (scratch.path().join("i"), "/install".into()),
    ])
    .unwrap();
    spec.chdir("/work/p");
    let script = "read l < held; echo \"$l\"; read v < /build/from-view; echo \"build=$v\"
        for d in / /work /build /etc /usr/bin; do ( : > $d/probe ) 2>/dev/null && echo ESCAPED write $d; done
        echo made > made && echo prog > /install/prog && echo DONE";
    let o = contained(&rt, &spec, script);
    assert!(
        o.contains("held\n") && o.contains("build=view") && o.contains("DONE"),
        "{o}"
    );
    let read = |p: &str| std::fs::read_to_string(scratch.path().join(p)).unwrap();
    assert_eq!(read("w/made"), "made\n");
    assert_eq!(read("i/prog"), "prog\n");
    // Nothing landed in the view, nor at the scratch's top.
    assert!(!tree.path().join("work/probe").exists() && !tree.path().join("build/probe").exists());
    assert!(!scratch.path().join("probe").exists());

    // A place outside the scratch, or not a normal path, is refused.
    let mut spec = rt.view_spec(tree.path(), scratch.path()).unwrap();
    let outside = tempfile::tempdir().unwrap();
    assert!(spec
        .place_scratch(vec![(outside.path().to_path_buf(), "/x".into())])
        .is_err());
    for inside in ["/", "x", "/a/../b"] {
        assert!(
            spec.place_scratch(vec![(scratch.path().join("w"), inside.into())])
                .is_err(),
            "{inside}"
        );
    }
}
