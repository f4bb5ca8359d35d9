//! Environment: cleared, then the whitelist — `allow` names copied from the
//! host if set there, `set` pairs — then `WF_RPC_SOCK`, and `MAKEFLAGS`
//! naming the jobserver where there is one and the caller set none. A denied name (the
//! tool's home) never passes, nor does any value containing its host value.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use crate::spec::{
    Argv, HostEnv, SandboxSpec, DENIED_ENV, DSH_HOME_ENV, JOBSERVER_MAKEFLAGS, RPC_SOCKET_ENV,
    RPC_SOCKET_PATH,
};

fn contains(hay: &OsStr, needle: &OsStr) -> bool {
    let (h, n) = (hay.as_bytes(), needle.as_bytes());
    !n.is_empty() && h.windows(n.len()).any(|w| w == n)
}

pub(crate) fn emit(spec: &SandboxSpec, host_env: &HostEnv, a: &mut Argv) {
    a.push("--clearenv");
    let secret = host_env.get(OsStr::new(DSH_HOME_ENV));
    let passes = |name: &str, value: &OsStr| {
        !DENIED_ENV.contains(&name)
            && name != RPC_SOCKET_ENV
            && !secret.is_some_and(|s| contains(value, s))
    };
    for name in &spec.env.allow {
        if spec.env.set.contains_key(name) {
            continue;
        }
        if let Some(v) = host_env.get(OsStr::new(name)) {
            if passes(name, v) {
                a.flag3("--setenv", name, v);
            }
        }
    }
    for (name, v) in &spec.env.set {
        if passes(name, v) {
            a.flag3("--setenv", name, v);
        }
    }
    a.flag3("--setenv", RPC_SOCKET_ENV, RPC_SOCKET_PATH);
    if spec.jobserver.is_some() && !spec.env.set.contains_key("MAKEFLAGS") {
        a.flag3("--setenv", "MAKEFLAGS", JOBSERVER_MAKEFLAGS);
    }
}
