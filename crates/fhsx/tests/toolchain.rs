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
