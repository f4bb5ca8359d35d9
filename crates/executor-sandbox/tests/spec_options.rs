//! The argv the new spec options produce, and what they refuse (no bwrap
//! needed: an in-memory host).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use executor_sandbox::{
    HostEnv, Limits, MemFs, RuntimePaths, SandboxError, SandboxSpec, DEFAULT_PROXY_PORT,
    PROXY_CA_PATH, PROXY_SOCKET_PATH, SUPERVISOR_EXEC,
};

fn host() -> MemFs {
    MemFs::new()
        .dir("/usr/bin")
        .dir("/view/usr")
        .dir("/scratch")
        .other("/srv/proxy/proxy.sock")
        .file("/srv/proxy/ca.pem")
        .dir("/srv/proxy/dir")
        .mount("/")
}

fn spec() -> SandboxSpec {
    let rt = RuntimePaths::under(Path::new("/run/user/0/fhsx"));
    SandboxSpec::view(
        Path::new("/view"),
        Path::new("/scratch"),
        rt,
        Arc::new(host()),
    )
    .unwrap()
}

fn argv(s: &SandboxSpec) -> Vec<String> {
    s.bwrap_argv(&HostEnv::new(), &[OsString::from("/bin/true")])
        .into_iter()
        .map(|a| a.into_string().unwrap())
        .collect()
}

/// The index of `needle` as a contiguous run in `hay`.
fn find(hay: &[String], needle: &[&str]) -> Option<usize> {
    hay.windows(needle.len())
        .position(|w| w.iter().zip(needle).all(|(a, b)| a == b))
}

#[test]
fn proxy_binds_the_socket_and_tells_the_supervisor_by_argv() {
    let mut s = spec();
    s.proxy(Path::new("/srv/proxy/proxy.sock"), DEFAULT_PROXY_PORT)
        .unwrap();
    let a = argv(&s);
    let bind = find(
        &a,
        &["--ro-bind", "/srv/proxy/proxy.sock", PROXY_SOCKET_PATH],
    )
    .expect("the proxy socket is bound");
    let sealed = find(&a, &["--remount-ro", "/"]).unwrap();
    assert!(bind < sealed, "bound before the root is sealed: {a:?}");
    let sup = a.iter().position(|x| x == SUPERVISOR_EXEC).unwrap();
    let tail = &a[sup..];
    assert!(
        find(
            tail,
            &[
                "--proxy-port",
                "3128",
                "--proxy-socket",
                PROXY_SOCKET_PATH,
                "--",
                "/bin/true"
            ]
        )
        .is_some(),
        "{tail:?}"
    );
    // Not through the build's environment.
    assert!(
        !a.iter().any(|x| x.contains("3128") && x.contains('=')),
        "{a:?}"
    );
}

#[test]
fn without_proxy_there_is_no_socket_and_no_listener() {
    let a = argv(&spec());
    assert!(!a
        .iter()
        .any(|x| x == PROXY_SOCKET_PATH || x == "--proxy-port"));
}

#[test]
fn proxy_refuses_a_missing_or_non_socket_path_and_privileged_ports() {
    let mut s = spec();
    for bad in [
        "/srv/proxy/nope.sock",
        "/srv/proxy/ca.pem",
        "/srv/proxy/dir",
    ] {
        assert!(
            matches!(
                s.proxy(Path::new(bad), 3128),
                Err(SandboxError::BadPath { .. })
            ),
            "{bad}"
        );
    }
    assert!(s.proxy(Path::new("/srv/proxy/proxy.sock"), 80).is_err());
    assert!(s.proxy_forward().is_none());
}

#[test]
fn ro_bind_file_binds_below_run_fhsx_only() {
    let mut s = spec();
    s.ro_bind_file(Path::new("/srv/proxy/ca.pem"), PROXY_CA_PATH)
        .unwrap();
    let a = argv(&s);
    let bind = find(&a, &["--ro-bind", "/srv/proxy/ca.pem", PROXY_CA_PATH]).unwrap();
    let sealed = find(&a, &["--remount-ro", "/"]).unwrap();
    assert!(bind < sealed);

    for dest in [
        "/etc/ssl/ca.pem",         // part of the view
        "/run/fhsx",               // the directory itself
        "/run/fhsx/../etc/passwd", // not plain
        "/run/fhsx/./ca.pem",      // not plain
        "run/fhsx/ca.pem",         // relative
        "/run/fhsxx/ca.pem",       // a sibling, not below
        PROXY_SOCKET_PATH,         // taken
        "/run/fhsx/proxy.sock/x",  // below a file that is taken
        PROXY_CA_PATH,             // taken by the first call
    ] {
        assert!(
            matches!(
                s.ro_bind_file(Path::new("/srv/proxy/ca.pem"), dest),
                Err(SandboxError::BadPath { .. })
            ),
            "{dest} must be refused"
        );
    }
    // The source must be an existing regular file.
    for src in [
        "/srv/proxy/missing",
        "/srv/proxy/dir",
        "/srv/proxy/proxy.sock",
    ] {
        assert!(
            s.ro_bind_file(Path::new(src), "/run/fhsx/x.pem").is_err(),
            "{src}"
        );
    }
    s.ro_bind_file(Path::new("/srv/proxy/ca.pem"), "/run/fhsx/certs/other.pem")
        .unwrap();
    // Both are readable inside and listed as such (the supervisor, bound
    // execute-only, is not).
    assert_eq!(
        s.readable_host_files(),
        vec![
            (
                PathBuf::from("/srv/proxy/ca.pem"),
                PathBuf::from(PROXY_CA_PATH)
            ),
            (
                PathBuf::from("/srv/proxy/ca.pem"),
                PathBuf::from("/run/fhsx/certs/other.pem")
            ),
        ]
    );
}

#[test]
fn limits_go_to_the_supervisor_as_rlimits() {
    let mut s = spec();
    s.limits(Limits {
        memory: Some(1 << 30),
        file_size: Some(4096),
        open_files: Some(256),
    });
    let a = argv(&s);
    let sup = a.iter().position(|x| x == SUPERVISOR_EXEC).unwrap();
    let tail = &a[sup..];
    for pair in [
        ["--rlimit-fsize", "4096"],
        ["--rlimit-nofile", "256"],
        ["--rlimit-as", "1073741824"],
    ] {
        assert!(find(tail, &pair).is_some(), "{pair:?} in {tail:?}");
    }
    assert!(argv(&spec()).iter().all(|x| !x.starts_with("--rlimit")));
}
