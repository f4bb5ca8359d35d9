//! Helpers shared by fhsx's integration tests: the binary, real Debian
//! packages fetched once per target directory, imports.
#![allow(dead_code)]

use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

pub fn fhsx(store: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_fhsx"));
    c.arg("--store").arg(store);
    // Builds keep their scratch next to the store, so leftovers are visible per test.
    if let Some(parent) = store.parent() {
        c.env("TMPDIR", parent);
    }
    c
}

pub fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The example's inputs (.debs and hello's tarball), fetched once per target dir.
pub fn inputs() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("hello-inputs");
        let o = Command::new(repo().join("examples/hello/fetch-inputs.sh"))
            .arg(&dir)
            .output()
            .expect("run examples/hello/fetch-inputs.sh");
        assert!(
            o.status.success(),
            "fetching the example's Debian packages failed (needs apt-get and `apt-get update`): {}",
            text(&o)
        );
        dir
    })
}

pub fn import(store: &Path, p: &Path) -> String {
    let o = fhsx(store)
        .args(["store", "import"])
        .arg(p)
        .output()
        .unwrap();
    assert!(o.status.success(), "import {}: {}", p.display(), text(&o));
    String::from_utf8_lossy(&o.stdout)
        .split('\t')
        .next()
        .unwrap()
        .to_owned()
}

/// A closure of one real Debian package: busybox-static.
pub fn busybox(store: &Path) -> String {
    let debs = inputs().join("fetch-debs");
    let deb = fs::read_dir(&debs)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.to_string_lossy().contains("busybox-static"))
        .expect("busybox-static .deb (examples/hello/fetch-inputs.sh fetches it)");
    import(store, &deb)
}
