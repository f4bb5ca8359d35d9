//! `fhsx doctor` tries each mechanism for real and says what holds: as
//! root on the test machine every guarantee does; as an unprivileged user
//! the contract still does, and each limit that does not is named with
//! its fix.

mod support;

use std::fs;
use std::os::unix::fs::PermissionsExt;
use std::process::Command;

use serde_json::Value;
use support::text;

const DOCTOR_USER: &str = "fhsx-doctor";

fn findings(v: &Value) -> Vec<(String, bool, Option<String>)> {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            (
                f["guarantee"].as_str().unwrap().to_owned(),
                f["holds"].as_bool().unwrap(),
                f["fix"].as_str().map(str::to_owned),
            )
        })
        .collect()
}

/// What the sandbox's probe tried, as the contract findings say: it
/// wrote, and it connected, and every try failed.
fn assert_tried(v: &Value) {
    let how = |name: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["guarantee"] == name)
            .and_then(|f| f["how"].as_str())
            .unwrap_or_else(|| panic!("{name}: {v}"))
            .to_owned()
    };
    let writes = how("no write outside the scratch");
    assert!(
        writes.starts_with("tried: writing to /, /usr/, /etc/ failed")
            && writes.contains("only the scratch took a file"),
        "{writes}"
    );
    let network = how("no network");
    assert!(
        network.starts_with("tried: a TCP connect to this host at 127.0.0.1:")
            && network.contains(", where fhsx listened, failed"),
        "{network}"
    );
}

#[test]
fn as_root_every_guarantee_holds_and_as_a_user_what_is_missing_is_named_with_its_fix() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(
        unsafe { libc::geteuid() },
        0,
        "this test compares root with a user: run the suite as root, as CI does"
    );
    let t = tempfile::tempdir().unwrap();
    support::passable(t.path());
    let o = support::fhsx(&t.path().join("store"))
        .args(["--json", "doctor"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["root"], true);
    for (what, holds, _) in findings(&v) {
        assert!(holds, "{what} does not hold as root: {v}");
    }
    assert_tried(&v);
    // Nothing of the probes is left behind.
    support::no_leftovers(t.path());

    // The same binary as an unprivileged user.
    support::system_user(DOCTOR_USER);
    let exe = t.path().join("fhsx");
    fs::copy(support::fhsx_exe(), &exe).unwrap();
    fs::set_permissions(&exe, fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(t.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let o = Command::new("runuser")
        .args([
            "-u",
            DOCTOR_USER,
            "--",
            "env",
            "-i",
            "PATH=/usr/bin:/bin",
            "TMPDIR=/tmp",
        ])
        .arg(&exe)
        .args(["--store", "/tmp/fhsx-doctor-store", "--json", "doctor"])
        .output()
        .expect(
            "runuser (util-linux) is needed to run as the test user: `apt-get install util-linux`",
        );
    let _ = fs::remove_dir_all("/tmp/fhsx-doctor-store");
    assert_eq!(o.status.code(), Some(0), "{}", text(&o));
    let v: Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(
        (v["root"].clone(), v["contract_holds"].clone()),
        (Value::Bool(false), Value::Bool(true))
    );
    let f = findings(&v);
    let get = |name: &str| {
        f.iter()
            .find(|(w, _, _)| w == name)
            .unwrap_or_else(|| panic!("{name}: {v}"))
    };
    for contract in [
        "no write outside the scratch",
        "no network",
        "a read-only view of the declared closure",
    ] {
        assert!(get(contract).1, "{contract}: {v}");
    }
    assert_tried(&v);
    // No root: no size-capped scratch and no uid of its own, each with its
    // fix; never a guarantee said to hold that does not.
    for missing in ["disk", "a uid of its own"] {
        let (_, holds, fix) = get(missing);
        assert!(!holds && fix.is_some(), "{missing}: {v}");
    }
    for (what, holds, fix) in &f {
        assert!(
            *holds || fix.as_ref().is_some_and(|x| !x.is_empty()),
            "{what} is missing with no fix: {v}"
        );
    }
}
