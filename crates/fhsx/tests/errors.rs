//! What the CLI says when it is given something bad, golden: for each bad
//! input, the exact stderr and exit code `fhsx` answers with, kept in
//! `tests/errors/NAME.txt`. Each message must name the file or object it
//! is about, say each thing once, show no Rust `Debug` output, and say
//! what to do. Temporary paths are shown as `$TMP`.
//!
//! `FHSX_BLESS=1 cargo test -p fhsx --test errors` rewrites the golden
//! files from what fhsx says now; review the diff before committing it.
//!
//! The read-only and the full store are tmpfs mounts, so those two cases
//! run as root only (as CI does); the builds use busybox-static's `.deb`
//! (tests/support fetches it).

mod support;

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use support::{busybox, fhsx, text};

const ABSENT: &str = "b3:0000000000000000000000000000000000000000000000000000000000000000";

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

fn write(dir: &Path, name: &str, body: &str) -> PathBuf {
    let p = dir.join(name);
    fs::write(&p, body).unwrap();
    p
}

/// An action running `script` in busybox's `sh`.
fn sh(closure: &str, script: &str, extra: &str) -> String {
    format!(
        "[inputs]\nclosure = [{closure}]\n[run]\ncommand = [\"/bin/busybox\", \"sh\", \"-c\", {script:?}]\ntimeout = \"60s\"\n{extra}"
    )
}

/// A tmpfs of `size` mounted on `dir` until dropped.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Tmpfs {
        fs::create_dir_all(dir).unwrap();
        run_ok(
            Command::new("mount")
                .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755")])
                .arg("tmpfs")
                .arg(dir),
        );
        Tmpfs(dir.to_path_buf())
    }

    fn read_only(&self) {
        run_ok(
            Command::new("mount")
                .args(["-o", "remount,ro"])
                .arg(&self.0),
        );
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn run_ok(c: &mut Command) {
    let o = c.output().unwrap();
    assert!(o.status.success(), "{c:?}: {}", text(&o));
}

/// What a case's golden file holds: the exit code, then stderr, with the
/// test's temporary directory shown as `$TMP`.
fn shown(o: &Output, tmp: &Path) -> String {
    let code = o
        .status
        .code()
        .map_or_else(|| "killed".to_owned(), |c| c.to_string());
    let stderr = String::from_utf8_lossy(&o.stderr);
    let tmp = tmp.display().to_string();
    let stderr = txn_names(&stderr.replace(&tmp, "$TMP"));
    format!("exit {code}\n{stderr}")
}

/// `txn-PID-RANDOM-N`, a store transaction's directory, as `txn-…`.
fn txn_names(s: &str) -> String {
    let mut out = String::new();
    let mut rest = s;
    while let Some(i) = rest.find("txn-") {
        out.push_str(&rest[..i + 4]);
        rest = rest[i + 4..].trim_start_matches(|c: char| c.is_ascii_digit() || c == '-');
        out.push('…');
    }
    out.push_str(rest);
    out
}

struct Golden {
    dir: PathBuf,
    bless: bool,
    tmp: PathBuf,
    failures: Vec<String>,
}

impl Golden {
    fn check(&mut self, name: &str, o: &Output) {
        let got = shown(o, &self.tmp);
        let file = self.dir.join(format!("{name}.txt"));
        if self.bless {
            fs::write(&file, &got).unwrap();
            return;
        }
        let want = fs::read_to_string(&file).unwrap_or_default();
        if got != want {
            self.failures.push(format!(
                "{name}: {} says\n{got}\nwhere the golden file has\n{want}",
                file.display()
            ));
        }
    }
}

#[test]
fn bad_inputs_get_one_clear_message_and_their_exit_code() {
    let t = tempfile::tempdir().unwrap();
    let tmp = t.path().canonicalize().unwrap();
    let store = tmp.join("store");
    let mut g = Golden {
        dir: Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/errors"),
        bless: std::env::var_os("FHSX_BLESS").is_some(),
        tmp: tmp.clone(),
        failures: Vec::new(),
    };
    let fx = || {
        let mut c = fhsx(&store);
        c.current_dir(&tmp);
        c
    };
    let run = |args: &[&str]| fx().args(args).output().unwrap();
    write(&tmp, "ok.toml", &sh(&format!("{ABSENT:?}"), "true", ""));

    // Action files: absent, not a file, not TOML, not an action.
    g.check("action_file_missing", &run(&["build", "/nonexistent.toml"]));
    fs::create_dir(tmp.join("dir.toml")).unwrap();
    g.check("action_file_unreadable", &run(&["build", "dir.toml"]));
    write(&tmp, "garbage.toml", "garbage = = 1\n");
    g.check("action_toml_syntax", &run(&["build", "garbage.toml"]));
    write(
        &tmp,
        "unknown.toml",
        "[inputs]\nclosure = []\n[run]\ncommand = [\"true\"]\nflavour = \"x\"\n",
    );
    g.check("action_unknown_key", &run(&["build", "unknown.toml"]));
    write(&tmp, "digest.toml", &sh("\"b3:0123\"", "true", ""));
    g.check("action_bad_digest", &run(&["build", "digest.toml"]));
    g.check("action_absent_object", &run(&["build", "ok.toml"]));

    // Graphs: a cycle, a reference to nothing, an output not declared.
    write(&tmp, "a.toml", &sh("\"b.toml#out\"", "true", ""));
    write(&tmp, "b.toml", &sh("\"a.toml#out\"", "true", ""));
    g.check("graph_cycle", &run(&["build", "a.toml"]));
    write(&tmp, "dangling.toml", &sh("\"gone.toml#out\"", "true", ""));
    g.check("graph_missing_file", &run(&["build", "dangling.toml"]));
    write(&tmp, "dev.toml", &sh("\"ok.toml#dev\"", "true", ""));
    g.check("graph_unknown_output", &run(&["build", "dev.toml"]));
    write(&tmp, "refers.toml", &sh("\"garbage.toml#out\"", "true", ""));
    g.check(
        "graph_invalid_referred_file",
        &run(&["build", "refers.toml"]),
    );

    // The store: an archive it cannot take, an absent object, a bad digest.
    fs::write(tmp.join("x.zip"), b"PK\x03\x04").unwrap();
    g.check(
        "import_unsupported_archive",
        &run(&["store", "import", "x.zip"]),
    );
    g.check(
        "import_missing_path",
        &run(&["store", "import", "nothing-here.tar"]),
    );
    g.check("store_absent_object", &run(&["store", "ls", ABSENT]));
    g.check("store_bad_digest", &run(&["store", "cat", "b3:zzz", "x"]));
    g.check(
        "store_bad_root_name",
        &run(&["store", "root", "add", ABSENT, "--name", ".hidden"]),
    );
    g.check("record_not_a_record", &run(&["record", "show", ABSENT]));

    // Toolchains: a file that is not one, a package apt does not know.
    write(&tmp, "bad.toolchain", "packages = 3\n");
    write(
        &tmp,
        "tc.toml",
        &sh("", "true", "").replace(
            "closure = []",
            "closure = []\ntoolchain = [\"bad.toolchain\"]",
        ),
    );
    g.check("toolchain_file_invalid", &run(&["build", "tc.toml"]));
    g.check(
        "toolchain_unknown_package",
        &fx()
            .args(["toolchain", "apt", "no-such-package-fhsx", "-o"])
            .arg(tmp.join("none.toolchain"))
            .output()
            .unwrap(),
    );

    // Workers: an address that is none, one where no worker listens.
    g.check(
        "remote_bad_address",
        &run(&["build", "--remote", "nonsense", "ok.toml"]),
    );
    g.check(
        "remote_nobody_listens",
        &run(&["build", "--remote", "127.0.0.1:1", "ok.toml"]),
    );

    // Builds: one that fails, --check of it, one that makes no output.
    let bb = busybox(&store);
    let failing = write(&tmp, "fails.toml", &sh(&format!("{bb:?}"), "exit 2", ""));
    let failed = fx().args(["build"]).arg(&failing).output().unwrap();
    g.check("build_fails", &failed);
    // The failed build's record (its times make it differ from run to run).
    let record = String::from_utf8_lossy(&failed.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("record  ").map(str::to_owned))
        .unwrap_or_else(|| panic!("no record line: {}", text(&failed)));
    let mut check = fx()
        .args(["build", "--check", "fails.toml"])
        .output()
        .unwrap();
    check.stderr = String::from_utf8_lossy(&check.stderr)
        .replace(&record, "$RECORD")
        .into_bytes();
    g.check("build_check_after_failure", &check);
    write(&tmp, "nothing.toml", &sh(&format!("{bb:?}"), "true", ""));
    g.check("build_output_missing", &run(&["build", "nothing.toml"]));

    // A link into the output to where no output has anything: it dangles.
    write(
        &tmp,
        "dangles.toml",
        &sh(
            &format!("{bb:?}"),
            "mkdir -p $out/usr/bin && ln -s /build/out/usr/bin/nothing $out/usr/bin/x",
            "",
        ),
    );
    g.check("build_link_dangles", &run(&["build", "dangles.toml"]));

    // A store that cannot be written: read-only, or full.
    if is_root() {
        let ro = Tmpfs::mount(&tmp.join("ro"), "4m");
        let ro_store = tmp.join("ro/store");
        fs::create_dir_all(tmp.join("tree/a")).unwrap();
        write(&tmp, "tree/a/file", "one\n");
        let o = fhsx(&ro_store)
            .args(["store", "import"])
            .arg(tmp.join("tree"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", text(&o));
        ro.read_only();
        write(&tmp, "tree/a/file", "two\n");
        g.check(
            "store_read_only",
            &fhsx(&ro_store)
                .current_dir(&tmp)
                .args(["store", "import", "tree"])
                .output()
                .unwrap(),
        );
        drop(ro);

        let _full = Tmpfs::mount(&tmp.join("full"), "256k");
        fs::create_dir(tmp.join("big")).unwrap();
        fs::write(tmp.join("big/file"), vec![7u8; 1 << 20]).unwrap();
        g.check(
            "store_full",
            &fhsx(&tmp.join("full/store"))
                .current_dir(&tmp)
                .args(["store", "import", "big"])
                .output()
                .unwrap(),
        );
    } else {
        eprintln!("not root: the read-only and the full store (tmpfs mounts) are not tried");
    }

    assert!(
        g.failures.is_empty(),
        "{} message(s) differ from tests/errors/ (FHSX_BLESS=1 rewrites them):\n\n{}",
        g.failures.len(),
        g.failures.join("\n")
    );
}
