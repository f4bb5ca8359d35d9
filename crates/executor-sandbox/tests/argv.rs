//! The argv is the perimeter in visible form: these tests pin it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use executor_sandbox::{
    BwrapFeatures, HostEnv, MemFs, RealFs, RuntimePaths, SandboxError, SandboxSpec,
};

fn env(pairs: &[(&str, &str)]) -> HostEnv {
    pairs
        .iter()
        .map(|(k, v)| (OsString::from(k), OsString::from(v)))
        .collect()
}

fn golden_host() -> MemFs {
    MemFs::new()
        .dir("/usr/bin")
        .dir("/usr/lib")
        .symlink("/bin", "usr/bin")
        .symlink("/sbin", "usr/sbin")
        .symlink("/lib", "usr/lib")
        .symlink("/lib64", "usr/lib64")
        .dir("/etc/ssl/certs")
        .dir("/etc/alternatives")
        .file("/etc/ld.so.cache")
        .file("/etc/shadow")
        .dir("/root")
        .dir("/home/u/proj/.dsh-run")
        .dir("/home/u/.dsh")
        .mount("/")
        .mount("/proc")
}

fn golden_spec() -> SandboxSpec {
    let rt = RuntimePaths::under(Path::new("/run/user/0/fhsx"));
    let mut spec =
        SandboxSpec::host(Path::new("/home/u/proj"), rt, Arc::new(golden_host())).unwrap();
    spec.features(BwrapFeatures::ALL);
    spec.allow_env("WF_RUN_ID").unwrap();
    spec.allow_env("TERM").unwrap();
    spec.set_env("PATH", "/usr/bin:/bin").unwrap();
    spec
}

fn golden_env() -> HostEnv {
    env(&[
        ("WF_RUN_ID", "run-42"),
        ("DSH_HOME", "/home/u/.dsh"),
        ("SECRET_TOKEN", "hunter2"),
        ("PATH", "/root/.cargo/bin:/usr/bin"),
    ])
}

#[rustfmt::skip]
const GOLDEN: &[&str] = &[
    // namespaces
    "--unshare-all", "--unshare-user", "--unshare-net", "--uid", "1000", "--gid", "100",
    "--disable-userns", "--hostname", "fhsx",
    // isolation
    "--cap-drop", "ALL", "--seccomp", "5", "--new-session", "--die-with-parent", "--as-pid-1", "--chdir", "/workspace",
    // mounts
    "--ro-bind", "/usr", "/usr",
    "--symlink", "usr/bin", "/bin",
    "--symlink", "usr/sbin", "/sbin",
    "--symlink", "usr/lib", "/lib",
    "--symlink", "usr/lib64", "/lib64",
    "--ro-bind", "/etc/alternatives", "/etc/alternatives",
    "--ro-bind", "/etc/ld.so.cache", "/etc/ld.so.cache",
    "--ro-bind", "/etc/ssl/certs", "/etc/ssl/certs",
    "--ro-bind", "/run/user/0/fhsx/passwd", "/etc/passwd",
    "--ro-bind", "/run/user/0/fhsx/group", "/etc/group",
    "--proc", "/proc",
    "--ro-bind", "/proc/sys", "/proc/sys",
    "--dev", "/dev",
    "--tmpfs", "/dev/shm",
    "--tmpfs", "/tmp",
    "--bind", "/home/u/proj", "/workspace",
    // masks
    "--tmpfs", "/workspace/.dsh-run", "--remount-ro", "/workspace/.dsh-run",
    // RPC bridge, then the seal
    "--ro-bind", "/run/user/0/fhsx/wf.sock", "/run/wf.sock",
    "--remount-ro", "/dev",
    "--remount-ro", "/",
    // environment
    "--clearenv",
    "--setenv", "WF_RUN_ID", "run-42",
    "--setenv", "PATH", "/usr/bin:/bin",
    "--setenv", "WF_RPC_SOCK", "/run/wf.sock",
    // the command, under the supervisor
    "--", "/proc/self/fd/6", "--control-fd", "3",
    // Landlock restates the writable places, and nothing else
    "--landlock-rw", "/workspace", "--landlock-rw", "/tmp", "--landlock-rw", "/dev/shm",
    "--landlock-files", "/dev", "--landlock-files", "/proc",
    "--", "make", "-j2",
];

#[test]
fn argv_golden_is_exact_and_stable() {
    let spec = golden_spec();
    let cmd = vec![OsString::from("make"), OsString::from("-j2")];
    let first = spec.bwrap_argv(&golden_env(), &cmd);
    let expected: Vec<OsString> = GOLDEN.iter().map(OsString::from).collect();
    assert_eq!(first, expected, "got {first:#?}");
    // Same inputs, byte-identical argv; a fresh spec built the same way too.
    assert_eq!(spec.bwrap_argv(&golden_env(), &cmd), first);
    assert_eq!(golden_spec().bwrap_argv(&golden_env(), &cmd), first);
}

fn assert_never_mentions(argv: &[OsString], needles: &[&str]) {
    for a in argv {
        let s = a.to_string_lossy();
        for n in needles {
            assert!(
                !s.contains(n),
                "argv element {s:?} mentions {n:?}: {argv:#?}"
            );
        }
    }
}

fn has_seq(argv: &[OsString], seq: &[&str]) -> bool {
    argv.windows(seq.len())
        .any(|w| w.iter().zip(seq).all(|(a, b)| a == std::ffi::OsStr::new(b)))
}

#[test]
fn argv_boundary_example_on_the_real_host() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join(".dsh-run")).unwrap();
    let home = tempfile::tempdir().unwrap();
    let home_s = home.path().to_str().unwrap().to_string();
    let rt = RuntimePaths::under(Path::new("/nonexistent/rt"));
    let mut spec = SandboxSpec::host(ws.path(), rt, Arc::new(RealFs)).unwrap();
    spec.allow_env("WF_RUN_ID").unwrap();
    // Even if a caller lets HOME through, a value holding DSH_HOME does not pass.
    spec.allow_env("HOME").unwrap();
    let host = env(&[
        ("WF_RUN_ID", "run-7"),
        ("DSH_HOME", &home_s),
        ("HOME", &home_s),
        ("OTHER", "x"),
    ]);
    let argv = spec.bwrap_argv(&host, &[OsString::from("true")]);
    let ws_c = std::fs::canonicalize(ws.path()).unwrap();
    assert!(has_seq(
        &argv,
        &["--bind", ws_c.to_str().unwrap(), "/workspace"]
    ));
    assert!(has_seq(
        &argv,
        &[
            "--tmpfs",
            "/workspace/.dsh-run",
            "--remount-ro",
            "/workspace/.dsh-run"
        ]
    ));
    assert!(has_seq(&argv, &["--setenv", "WF_RUN_ID", "run-7"]));
    assert!(has_seq(
        &argv,
        &["--unshare-all", "--unshare-user", "--unshare-net"]
    ));
    assert!(has_seq(&argv, &["--", "/proc/self/fd/6"]));
    assert_never_mentions(&argv, &["DSH_HOME", &home_s, "OTHER"]);
    assert!(!argv.iter().any(|a| a == "HOME"));
}

#[test]
fn dsh_home_inside_the_workspace_is_masked_where_it_appears() {
    let ws = tempfile::tempdir().unwrap();
    let home = ws.path().join("state/dsh");
    std::fs::create_dir_all(&home).unwrap();
    std::fs::write(ws.path().join("state/file"), b"x").unwrap();
    let home_s = home.to_str().unwrap().to_string();
    let rt = RuntimePaths::under(Path::new("/nonexistent/rt"));
    let mut spec = SandboxSpec::host(ws.path(), rt, Arc::new(RealFs)).unwrap();
    spec.mask("/workspace/state/file");
    let argv = spec.bwrap_argv(&env(&[("DSH_HOME", &home_s)]), &[OsString::from("true")]);
    assert!(has_seq(
        &argv,
        &[
            "--tmpfs",
            "/workspace/state/dsh",
            "--remount-ro",
            "/workspace/state/dsh"
        ]
    ));
    assert!(has_seq(
        &argv,
        &["--ro-bind", "/dev/null", "/workspace/state/file"]
    ));
    assert_never_mentions(&argv, &["DSH_HOME", &home_s]);
    // No .dsh-run in this workspace: nothing to mask, no mount point created.
    assert_never_mentions(&argv, &[".dsh-run"]);
}

#[test]
fn view_root_binds_top_level_entries_and_recreates_symlinks() {
    let fs = MemFs::new()
        .dir("/mnt/view/usr/bin")
        .dir("/mnt/view/etc")
        .symlink("/mnt/view/bin", "usr/bin")
        .dir("/mnt/view/tmp")
        .dir("/mnt/view/run")
        .dir("/scratch/b1");
    let rt = RuntimePaths::under(Path::new("/rt"));
    let spec = SandboxSpec::view(
        Path::new("/mnt/view"),
        Path::new("/scratch/b1"),
        rt,
        Arc::new(fs),
    )
    .unwrap();
    let argv = spec.bwrap_argv(&HostEnv::new(), &[OsString::from("sh")]);
    assert!(has_seq(&argv, &["--symlink", "usr/bin", "/bin"]));
    assert!(has_seq(&argv, &["--ro-bind", "/mnt/view/etc", "/etc"]));
    assert!(has_seq(&argv, &["--ro-bind", "/mnt/view/usr", "/usr"]));
    assert!(has_seq(&argv, &["--bind", "/scratch/b1", "/build"]));
    assert!(has_seq(&argv, &["--chdir", "/build"]));
    // The sandbox provides /tmp and /run itself.
    assert!(!has_seq(&argv, &["--ro-bind", "/mnt/view/tmp", "/tmp"]));
    assert!(!has_seq(&argv, &["--ro-bind", "/mnt/view/run", "/run"]));
}

/// A placed scratch: each place bound read-write where it goes (after the
/// view's entries it lies in), restated to Landlock, and neither the
/// scratch at `/build` nor a Landlock rule for it: the view's own `/build`
/// is bound read-only like any entry.
#[test]
fn a_placed_scratch_is_bound_and_landlocked_only_at_its_places() {
    let fs = MemFs::new()
        .dir("/mnt/view/work/p")
        .dir("/mnt/view/build")
        .dir("/scratch/b1/w")
        .dir("/scratch/b1/i");
    let rt = RuntimePaths::under(Path::new("/rt"));
    let mut spec = SandboxSpec::view(
        Path::new("/mnt/view"),
        Path::new("/scratch/b1"),
        rt,
        Arc::new(fs),
    )
    .unwrap();
    spec.place_scratch(vec![
        ("/scratch/b1/w".into(), "/work/p".into()),
        ("/scratch/b1/i".into(), "/install".into()),
    ])
    .unwrap();
    let argv = spec.bwrap_argv(&HostEnv::new(), &[OsString::from("sh")]);
    let at = |seq: &[&str]| argv.windows(seq.len()).position(|w| w == seq);
    let work = at(&["--ro-bind", "/mnt/view/work", "/work"]).expect("the view's /work");
    let place = at(&["--bind", "/scratch/b1/w", "/work/p"]).expect("the place");
    assert!(
        work < place,
        "a place is bound over the view's entry, after it"
    );
    assert!(has_seq(&argv, &["--bind", "/scratch/b1/i", "/install"]));
    assert!(has_seq(&argv, &["--ro-bind", "/mnt/view/build", "/build"]));
    assert!(!has_seq(&argv, &["--bind", "/scratch/b1", "/build"]));
    let landlocked: Vec<&OsString> = argv
        .windows(2)
        .filter(|w| w[0] == "--landlock-rw")
        .map(|w| &w[1])
        .collect();
    // Shallowest first, as they are mounted.
    assert_eq!(landlocked, ["/install", "/work/p", "/tmp", "/dev/shm"]);
}

#[test]
fn denied_and_malformed_env_names_are_refused() {
    let rt = RuntimePaths::under(Path::new("/rt"));
    let mut spec =
        SandboxSpec::host(Path::new("/home/u/proj"), rt, Arc::new(golden_host())).unwrap();
    assert!(matches!(
        spec.allow_env("DSH_HOME"),
        Err(SandboxError::BadEnv { .. })
    ));
    assert!(matches!(
        spec.set_env("DSH_HOME", "/x"),
        Err(SandboxError::BadEnv { .. })
    ));
    assert!(matches!(
        spec.set_env("A=B", "x"),
        Err(SandboxError::BadEnv { .. })
    ));
    assert!(matches!(
        spec.set_env("X", "a\0--bind\0/\0/host"),
        Err(SandboxError::BadEnv { .. })
    ));
    assert!(matches!(
        spec.set_env("WF_RPC_SOCK", "/x"),
        Err(SandboxError::BadEnv { .. })
    ));
}

#[test]
fn a_missing_or_root_workspace_is_a_usage_error() {
    let rt = RuntimePaths::under(Path::new("/rt"));
    let e = SandboxSpec::host(Path::new("/nope"), rt.clone(), Arc::new(golden_host())).unwrap_err();
    assert!(matches!(e, SandboxError::BadPath { .. }), "{e}");
    let e = SandboxSpec::host(Path::new("/"), rt, Arc::new(golden_host())).unwrap_err();
    assert!(matches!(e, SandboxError::BadPath { .. }), "{e}");
    let _ = PathBuf::new();
}
