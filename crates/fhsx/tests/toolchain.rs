//! `fhsx toolchain apt`: real apt, real Debian packages.

mod support;

use std::fs;

use support::{fhsx, text};

/// One command makes a toolchain file that is the same bytes every time;
/// a second run imports nothing; an action names it and composes it; an
/// unknown package is a usage error naming it.
#[test]
fn one_command_makes_a_stable_toolchain_an_action_can_name() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let file = t.path().join("hello.toolchain");
    let o = fhsx(&store)
        .args(["toolchain", "apt", "hello", "busybox-static", "-o"])
        .arg(&file)
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "needs apt and `apt-get update`: {}",
        text(&o)
    );
    let first = fs::read_to_string(&file).unwrap();
    for pkg in ["hello", "libc6", "busybox-static"] {
        assert!(
            first.contains(&format!("name = \"{pkg}\"")),
            "{pkg} missing:\n{first}"
        );
    }
    let o = fhsx(&store)
        .args(["toolchain", "apt", "busybox-static", "hello"])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout),
        first,
        "not the same bytes twice"
    );
    assert!(
        !String::from_utf8_lossy(&o.stderr).contains("downloading"),
        "a second run downloaded again: {}",
        text(&o)
    );

    fs::write(
        t.path().join("a.toml"),
        "[inputs]\nclosure = [\"hello.toolchain\"]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", \"busybox mkdir $out && hello > $out/said\"]\n",
    )
    .unwrap();
    let o = fhsx(&store)
        .args(["--json", "build"])
        .arg(t.path().join("a.toml"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let said = fhsx(&store)
        .args([
            "store",
            "cat",
            v["outputs"]["out"].as_str().unwrap(),
            "said",
        ])
        .output()
        .unwrap();
    assert_eq!(said.stdout, b"Hello, world!\n");

    // A toolchain file is a gc root: gc with no argument keeps its atoms.
    let o = fhsx(&store)
        .arg("store")
        .arg("root")
        .arg("add")
        .arg(&file)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = fhsx(&store).args(["store", "gc"]).output().unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let o = fhsx(&store)
        .args(["--json", "build", "--rebuild"])
        .arg(t.path().join("a.toml"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "gc took a rooted toolchain's atoms: {}",
        text(&o)
    );

    // The file in another store: its atoms are missing, and the error says how to fix it.
    let o = fhsx(&t.path().join("other"))
        .arg("build")
        .arg(t.path().join("a.toml"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("fhsx toolchain apt"), "{}", text(&o));

    let o = fhsx(&store)
        .args(["toolchain", "apt", "hello", "no-such-package-fhsx"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(text(&o).contains("no-such-package-fhsx"), "{}", text(&o));
}

/// A toolchain is composed like an installed system: the alternatives its
/// packages register are linked as dpkg would (awk → gawk over mawk by
/// priority, cc → gcc, c++ → g++), falling back to mawk without gawk; an
/// `--essential` toolchain has `locale` and the C.utf8 locale; `cc`
/// compiles with no CC= and no hand-made link.
#[test]
fn alternatives_link_as_dpkg_would_and_essential_has_locales() {
    let t = tempfile::tempdir().unwrap();
    let store = t.path().join("store");
    let make = |file: &str, pkgs: &[&str]| {
        let o = fhsx(&store)
            .args(["toolchain", "apt", "--essential"])
            .args(pkgs)
            .arg("-o")
            .arg(t.path().join(file))
            .output()
            .unwrap();
        assert!(
            o.status.success(),
            "needs apt and `apt-get update`: {}",
            text(&o)
        );
    };
    make(
        "full.toolchain",
        &["gcc", "g++", "make", "libc6-dev", "gawk"],
    );
    make("mawk.toolchain", &["gcc", "make", "libc6-dev"]);
    let script = "set -e; mkdir -p $out; \
        for p in awk cc c++; do command -v $p >/dev/null && echo \"$p $(readlink $(command -v $p)) $(readlink $(readlink $(command -v $p)))\" >> $out/links || echo \"$p none\" >> $out/links; done; \
        locale -a > $out/locales; \
        printf 'int main(void){return 0;}' > t.c && cc t.c -o t && ./t && echo compiled > $out/cc";
    for (tc, awk, cxx) in [
        (
            "full.toolchain",
            "/usr/bin/gawk",
            "/etc/alternatives/c++ /usr/bin/g++",
        ),
        ("mawk.toolchain", "/usr/bin/mawk", "none"),
    ] {
        let a = t.path().join(format!("{tc}.toml"));
        fs::write(
            &a,
            format!("[inputs]\ntoolchain = [\"{tc}\"]\n[run]\ncommand = [\"/bin/sh\", \"-c\", {script:?}]\n"),
        )
        .unwrap();
        let o = fhsx(&store)
            .args(["--json", "build"])
            .arg(&a)
            .output()
            .unwrap();
        assert!(o.status.success(), "{tc}: {}", text(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        let out = v["outputs"]["out"].as_str().unwrap();
        let cat = |f: &str| {
            String::from_utf8_lossy(
                &fhsx(&store)
                    .args(["store", "cat", out, f])
                    .output()
                    .unwrap()
                    .stdout,
            )
            .into_owned()
        };
        let links = cat("links");
        // LINK → /etc/alternatives/NAME → PATH, as dpkg sets them.
        assert!(
            links.contains(&format!("awk /etc/alternatives/awk {awk}\n")),
            "{tc}: {links}"
        );
        assert!(
            links.contains("cc /etc/alternatives/cc /usr/bin/gcc\n"),
            "{tc}: {links}"
        );
        assert!(links.contains(&format!("c++ {cxx}\n")), "{tc}: {links}");
        assert!(
            cat("locales").lines().any(|l| l == "C.utf8"),
            "{tc}: {}",
            cat("locales")
        );
        assert_eq!(cat("cc"), "compiled\n");
        // The links are the synthetic layer's, charged to it, not to gawk.
        let rec = fhsx(&store)
            .args(["--json", "closure-bloat", v["record"].as_str().unwrap()])
            .output()
            .unwrap();
        assert!(rec.status.success(), "{}", text(&rec));
    }
}
