//! Shared helpers for the tests that run the real bwrap.
#![allow(dead_code)]

use std::ffi::OsString;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use executor_sandbox::{HostEnv, RealFs, RunOptions, RunReport, Runtime, SandboxSpec, Stdin};

/// bwrap must be installed: a missing prerequisite fails, never skips.
pub fn require_bwrap() {
    if executor_sandbox::probe::find_bwrap().is_err() {
        panic!("bubblewrap is not installed: `apt-get install bubblewrap` (these tests run the real bwrap)");
    }
}

pub fn os(v: &[&str]) -> Vec<OsString> {
    v.iter().map(OsString::from).collect()
}

/// A host-root spec over `ws` for this runtime.
pub fn host_spec(rt: &Runtime, ws: &Path) -> SandboxSpec {
    let mut spec = SandboxSpec::host(ws, rt.paths().clone(), Arc::new(RealFs)).expect("host spec");
    spec.features(rt.features());
    spec
}

pub fn opts() -> RunOptions {
    RunOptions {
        capture_output: true,
        stdin: Stdin::Null,
        timeout: Some(Duration::from_secs(60)),
        ..RunOptions::default()
    }
}

/// Run `sh -c script` in a host-root sandbox over `ws`; output captured.
pub fn sh_in(ws: &Path, script: &str) -> RunReport {
    sh_with(ws, script, &HostEnv::new(), opts())
}

pub fn sh_with(ws: &Path, script: &str, env: &HostEnv, o: RunOptions) -> RunReport {
    require_bwrap();
    let rt = Runtime::new().expect("runtime");
    let spec = host_spec(&rt, ws);
    rt.run(&spec, env, &os(&["/bin/sh", "-c", script]), o)
        .expect("sandbox run")
}

pub fn out(r: &RunReport) -> String {
    String::from_utf8_lossy(&r.stdout).into_owned()
}

pub fn err(r: &RunReport) -> String {
    String::from_utf8_lossy(&r.stderr).into_owned()
}

pub fn workspace() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("fhsx-ws-")
        .tempdir()
        .expect("tempdir")
}
