//! `fhsx doctor`: which of fhsx's guarantees hold on this machine, for
//! this user, and the fix for each that does not.
//!
//! Each mechanism is tried for real, through the same pieces a build uses,
//! never guessed from versions: a sandbox runs a shell under a memory and
//! pids limit (user and network namespaces, the mount layout, seccomp,
//! Landlock, the run's cgroups) that tries to write outside its scratch
//! and to connect to a port fhsx listens on; the FUSE view mounts an
//! empty tree; a scratch of 64 MiB is made; a build user is taken. What
//! each reports (`RunReport`, `DiskLimit`, …) is what a build would get. The AppArmor
//! restriction on user namespaces (Ubuntu 24.04 and later) is read from
//! its sysctl, to name the fix when the sandbox cannot start.
//!
//! Exit 0 when every invariant of the contract holds (a read-only view, no
//! network, no write outside the scratch), 1 otherwise; a limit or a wall
//! that does not hold is reported with its fix and does not change it.

use std::fmt::Write as _;
use std::net::{IpAddr, TcpListener, UdpSocket};
use std::path::Path;
use std::time::Duration;

use clap::Args;
use executor_sandbox::{
    current_host_env, Limits, MemoryEnforcement, ReaperMode, RunOptions, Runtime,
};
use serde_json::json;

use super::Globals;

#[derive(Args, Debug)]
pub struct DoctorArgs {}

/// What kind of promise a finding is about.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An invariant of the contract: a build must not run without it.
    Contract,
    /// A `[limits]` bound.
    Limit,
    /// A second wall behind the contract's, or who the build runs as.
    Wall,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Contract => "contract",
            Kind::Limit => "limit",
            Kind::Wall => "wall",
        }
    }
}

struct Finding {
    kind: Kind,
    what: &'static str,
    holds: bool,
    /// How it holds, or what failed.
    how: String,
    /// The fix, where it does not hold.
    fix: Option<String>,
}

fn finding(
    kind: Kind,
    what: &'static str,
    holds: bool,
    how: impl Into<String>,
    fix: Option<String>,
) -> Finding {
    Finding {
        kind,
        what,
        holds,
        how: how.into(),
        fix: if holds { None } else { fix },
    }
}

pub fn run(g: &Globals, _a: DoctorArgs) -> anyhow::Result<i32> {
    let root = is_root();
    let mut found = sandbox(root);
    found.push(fuse_view());
    found.push(disk(root));
    found.push(build_user(root));
    let contract_holds = found
        .iter()
        .filter(|f| f.kind == Kind::Contract)
        .all(|f| f.holds);
    if g.json {
        let v: Vec<_> = found
            .iter()
            .map(|f| json!({"kind": f.kind.name(), "guarantee": f.what, "holds": f.holds, "how": f.how, "fix": f.fix}))
            .collect();
        println!(
            "{}",
            json!({"root": root, "contract_holds": contract_holds, "findings": v})
        );
    } else {
        println!(
            "fhsx doctor: as {}",
            if root { "root" } else { "an unprivileged user" }
        );
        for f in &found {
            let mark = if f.holds { "holds  " } else { "MISSING" };
            println!("{mark}  {:<8} {}: {}", f.kind.name(), f.what, f.how);
            if let Some(fix) = &f.fix {
                println!("         fix: {fix}");
            }
        }
        println!(
            "{}",
            if contract_holds {
                "the contract holds here: builds run"
            } else {
                "the contract does not hold here: builds are refused until it does"
            }
        );
    }
    Ok(if contract_holds { 0 } else { 1 })
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Where the probe tries to write: none may take a file.
const FORBIDDEN: [&str; 3] = ["/", "/usr/", "/etc/"];

/// The probe: a shell that says what it managed, a line each. `name` is
/// the file it writes, `port` the one fhsx listens on at `addrs`. Without
/// bash (its `/dev/tcp` is the connect), it looks for fhsx's listener
/// among the sockets it can see instead.
fn probe_script(name: &str, port: u16, addrs: &[IpAddr]) -> String {
    let addrs: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
    let addrs = addrs.join(" ");
    let dirs = FORBIDDEN.join(" ");
    [
        "echo ran".to_owned(),
        format!(": > /workspace/{name} && echo scratch"),
        format!(": > /tmp/{name} 2>/dev/null"),
        format!(r#"for d in {dirs}; do ( : > "${{d}}{name}" ) 2>/dev/null && echo "wrote ${{d}}{name}"; done"#),
        "if [ -x /bin/bash ]; then".to_owned(),
        format!(r#"  for a in {addrs}; do /bin/bash -c "exec 3<>/dev/tcp/$a/{port}" 2>/dev/null && echo "reached $a"; done"#),
        "else".to_owned(),
        "  echo listing".to_owned(),
        format!(r#"  grep -qi ':{port:04X} ' /proc/net/tcp /proc/net/tcp6 2>/dev/null && echo "reached {addrs}""#),
        "fi".to_owned(),
        "exit 0".to_owned(),
    ]
    .join("\n")
}

/// This host's address on its way out, if it has one (a route lookup: a
/// UDP socket sends nothing on connect).
fn outbound_address() -> Option<IpAddr> {
    let s = UdpSocket::bind("0.0.0.0:0").ok()?;
    s.connect("192.0.2.1:9").ok()?;
    let ip = s.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// A real sandbox over an empty workspace, with a memory and a pids limit,
/// running [`probe_script`]: each contract finding holds only if every
/// try it makes failed, and the host saw none of them (nothing written in
/// its `/`, `/usr`, `/etc` or `/tmp`, no connection on its listener); and
/// the probe did write its scratch, so the tries were made.
fn sandbox(root: bool) -> Vec<Finding> {
    let name = format!("fhsx-doctor-probe-{}", std::process::id());
    let tried = (|| -> anyhow::Result<_> {
        let listener = TcpListener::bind("0.0.0.0:0")?;
        listener.set_nonblocking(true)?;
        let port = listener.local_addr()?.port();
        let mut addrs: Vec<IpAddr> = vec![[127, 0, 0, 1].into()];
        addrs.extend(outbound_address());
        let ws = tempfile::Builder::new().prefix("fhsx-doctor-").tempdir()?;
        let rt = Runtime::new()?;
        let mut spec = rt.host_spec(ws.path())?;
        spec.nproc(Some(64));
        spec.limits(Limits {
            memory: Some(256 << 20),
            file_size: None,
            open_files: None,
        });
        let opts = RunOptions {
            capture_output: true,
            timeout: Some(Duration::from_secs(60)),
            ..RunOptions::default()
        };
        let argv: [std::ffi::OsString; 3] = [
            "/bin/sh".into(),
            "-c".into(),
            probe_script(&name, port, &addrs).into(),
        ];
        let report = rt.run(&spec, &current_host_env(), &argv, opts)?;
        let scratch = ws.path().join(&name).exists();
        let accepted = listener.accept().is_ok();
        Ok((report, scratch, accepted, port, addrs))
    })();
    let (report, scratch, accepted, port, addrs) = match tried {
        Ok((r, ..)) if !matches!(r.outcome, executor_sandbox::Outcome::Exited(0)) => {
            return sandbox_failed(
                root,
                format!(
                    "the sandbox ran but its probe (`/bin/sh`) ended {:?}: {}",
                    r.outcome,
                    String::from_utf8_lossy(&r.stderr).trim()
                ),
            )
        }
        Ok(t) => t,
        Err(e) => return sandbox_failed(root, format!("{e:#}")),
    };
    let said = String::from_utf8_lossy(&report.stdout).into_owned();
    let lines: Vec<&str> = said.lines().collect();
    if !lines.contains(&"ran") || !lines.contains(&"scratch") || !scratch {
        return sandbox_failed(
            root,
            format!("the probe could not write its own scratch, so it tried nothing: {said:?}"),
        );
    }
    // What the sandbox wrote where the host sees it: gone again.
    let mut wrote: Vec<String> = (lines.iter())
        .filter_map(|l| l.strip_prefix("wrote "))
        .map(str::to_owned)
        .collect();
    for dir in FORBIDDEN.iter().chain(["/tmp/"].iter()) {
        let host = format!("{dir}{name}");
        if std::fs::remove_file(&host).is_ok() {
            wrote.push(format!("{host} (on the host)"));
        }
    }
    let writes = if wrote.is_empty() {
        finding(
            Kind::Contract,
            "no write outside the scratch",
            true,
            format!("tried: writing to {} failed and its /tmp was its own; only the scratch took a file (a mount namespace: a read-only root, only the scratch, /tmp and /dev/shm writable)", FORBIDDEN.join(", ")),
            None,
        )
    } else {
        finding(
            Kind::Contract,
            "no write outside the scratch",
            false,
            format!("tried: the sandbox wrote {}", wrote.join(", ")),
            Some(BREACH.into()),
        )
    };
    let targets: Vec<String> = addrs.iter().map(|a| format!("{a}:{port}")).collect();
    let mut reached: Vec<&str> = (lines.iter())
        .filter_map(|l| l.strip_prefix("reached "))
        .collect();
    if accepted {
        reached.push("fhsx's listener (it accepted a connection)");
    }
    let how = if lines.contains(&"listing") {
        format!("tried (no bash to connect with): fhsx's listener on {} is not among the sockets the sandbox sees", targets.join(" and "))
    } else {
        format!(
            "tried: a TCP connect to this host at {}, where fhsx listened, failed",
            targets.join(" and ")
        )
    };
    let network = if reached.is_empty() {
        finding(
            Kind::Contract,
            "no network",
            true,
            format!("{how} (a network namespace with only loopback, brought up)"),
            None,
        )
    } else {
        finding(
            Kind::Contract,
            "no network",
            false,
            format!("tried: the sandbox reached {}", reached.join(", ")),
            Some(BREACH.into()),
        )
    };
    let mut out = vec![
        writes,
        network,
        finding(Kind::Wall, "seccomp", executor_sandbox::seccomp::filter_bytes().is_some(), "the filter installed by bwrap", Some("this architecture has no filter in fhsx: builds still run, without that wall".into())),
        finding(
            Kind::Wall,
            "Landlock",
            report.landlock_abi > 0,
            format!("ABI {}", report.landlock_abi),
            Some("a kernel with Landlock (5.13 or later, `landlock` in the boot's `lsm=` list): without it, the mount layout alone keeps writes in the scratch".into()),
        ),
    ];
    let delegate = "run fhsx inside a cgroup delegated to you: `systemd-run --user --scope -p Delegate=yes fhsx build …` (or as root)";
    out.push(match report.memory {
        MemoryEnforcement::CgroupV2 => finding(Kind::Limit, "memory", true, "the run's cgroup v2 memory.max (memory, not address space)", None),
        MemoryEnforcement::CgroupV1 => finding(Kind::Limit, "memory", true, "a cgroup v1 memory cgroup of the run (memory, not address space)", None),
        MemoryEnforcement::AddressSpace | MemoryEnforcement::None => finding(
            Kind::Limit,
            "memory",
            false,
            "no memory cgroup could be made: only RLIMIT_AS, which also refuses address space merely reserved (Go, the JVM, sanitizers)",
            Some(delegate.into()),
        ),
    });
    out.push(match report.reaper {
        ReaperMode::Cgroup(dir) => finding(
            Kind::Limit,
            "pids",
            true,
            format!("a cgroup v2 of the run ({}): pids.max, every process killed at its end", dir.display()),
            None,
        ),
        ReaperMode::Pidfd => finding(
            Kind::Limit,
            "pids",
            root,
            if root {
                "RLIMIT_NPROC of the build user and a cgroup v1 pids cgroup; processes found by pidfd"
            } else {
                "RLIMIT_NPROC only, which counts every process of your uid; no cgroup of the run"
            },
            Some(delegate.into()),
        ),
    });
    out
}

/// The fix for a sandbox that started yet let its probe through.
const BREACH: &str = "the sandbox does not contain its build here (a bwrap that ignores its flags, or a kernel without the namespaces): run no build here, and report it with `bwrap --version` and `uname -a`";

/// The sandbox did not start: every contract finding fails, with the fix
/// for the likely cause.
fn sandbox_failed(root: bool, error: String) -> Vec<Finding> {
    let fix = userns_fix(
        read_sysctl("kernel/apparmor_restrict_unprivileged_userns").as_deref(),
        read_sysctl("user/max_user_namespaces").as_deref(),
        read_sysctl("kernel/unprivileged_userns_clone").as_deref(),
        root,
    )
    .unwrap_or_else(|| {
        "install bubblewrap (`apt-get install bubblewrap`) and read the error above".into()
    });
    ["no write outside the scratch", "no network"]
        .into_iter()
        .map(|what| {
            finding(
                Kind::Contract,
                what,
                false,
                format!("the sandbox did not start: {error}"),
                Some(fix.clone()),
            )
        })
        .collect()
}

fn read_sysctl(name: &str) -> Option<String> {
    std::fs::read_to_string(Path::new("/proc/sys").join(name))
        .ok()
        .map(|s| s.trim().to_owned())
}

/// Why an unprivileged user namespace cannot be made, and the fix, from
/// the sysctls that can forbid it: Ubuntu's AppArmor restriction (24.04
/// and later), a zero namespace count, Debian's older switch.
fn userns_fix(
    apparmor: Option<&str>,
    max_user_namespaces: Option<&str>,
    unprivileged_clone: Option<&str>,
    root: bool,
) -> Option<String> {
    let mut why = String::new();
    if max_user_namespaces == Some("0") {
        let _ = write!(why, "user namespaces are off (user.max_user_namespaces = 0): `sysctl -w user.max_user_namespaces=15000` as root");
        return Some(why);
    }
    if root {
        return None;
    }
    if apparmor == Some("1") {
        return Some("AppArmor forbids unprivileged user namespaces to unconfined programs (kernel.apparmor_restrict_unprivileged_userns = 1, Ubuntu 24.04 and later): give bwrap a profile allowing `userns,` as Ubuntu does for Flatpak's, or `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` as root".into());
    }
    if unprivileged_clone == Some("0") {
        return Some("unprivileged user namespaces are off (kernel.unprivileged_userns_clone = 0): `sysctl -w kernel.unprivileged_userns_clone=1` as root".into());
    }
    None
}

/// The view: an empty tree mounted for real from a store of its own.
fn fuse_view() -> Finding {
    let tried = (|| -> anyhow::Result<()> {
        let t = tempfile::Builder::new().prefix("fhsx-doctor-").tempdir()?;
        let store = castore::LocalStore::open(t.path().join("store"))?;
        let root = castore::DirectoryStore::put_directory(&store, &castore::Directory::default())?;
        let mnt = t.path().join("view");
        std::fs::create_dir(&mnt)?;
        let guard =
            castore_fuse::mount(&store, &root, &mnt, &castore_fuse::MountOptions::default())?;
        drop(guard);
        Ok(())
    })();
    match tried {
        Ok(()) => finding(Kind::Contract, "a read-only view of the declared closure", true, "fhsx's FUSE view mounts (reads recorded, every blob verified)", None),
        Err(e) => finding(
            Kind::Contract,
            "a read-only view of the declared closure",
            false,
            format!("the view does not mount: {e:#}"),
            Some("`apt-get install fuse3` (fusermount3), and /dev/fuse mode 0666 for users (`chmod 0666 /dev/fuse` as root)".into()),
        ),
    }
}

/// A 64 MiB scratch, as a build would get it.
fn disk(root: bool) -> Finding {
    use fhs_executor::scratch::{DiskLimit, ScratchMedium, WorkArea};
    let tried = WorkArea::create(64 << 20, ScratchMedium::Disk, Box::new(|_: &Path| Ok(())))
        .and_then(|mut a| {
            a.ready()?;
            Ok(a.disk.clone())
        });
    match tried {
        Ok(DiskLimit::Enforced(bytes)) => finding(
            Kind::Limit,
            "disk",
            true,
            format!(
                "the scratch is a file system of its own, {} MiB here",
                bytes >> 20
            ),
            None,
        ),
        Ok(DiskLimit::NotEnforced(why)) => finding(
            Kind::Limit,
            "disk",
            false,
            format!("not enforced: {why}"),
            Some(if root {
                "loop devices and `mkfs.ext4` (`apt-get install e2fsprogs`)".into()
            } else {
                "run as root: without root the scratch is not size-capped yet".into()
            }),
        ),
        Err(e) => finding(
            Kind::Limit,
            "disk",
            false,
            format!("no scratch could be made: {}", castore::Chain(&e)),
            Some("a writable $TMPDIR that other users may pass (o+x)".into()),
        ),
    }
}

/// A uid of the build's own.
fn build_user(root: bool) -> Finding {
    if !root {
        return finding(
            Kind::Wall,
            "a uid of its own",
            false,
            "without root a build runs as your uid, kept from your files and processes by its namespaces alone",
            Some("run as root (each build then runs as a build user of its own)".into()),
        );
    }
    match executor_sandbox::BuildUsers::from_env().and_then(|u| u.allocate()) {
        Ok(u) => finding(
            Kind::Wall,
            "a uid of its own",
            true,
            format!("build users from FHSX_BUILD_UIDS (one taken: {})", u.uid()),
            None,
        ),
        Err(e) => finding(
            Kind::Wall,
            "a uid of its own",
            false,
            e.to_string(),
            Some("FHSX_BUILD_UIDS=START:COUNT naming unused uids".into()),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::userns_fix;

    #[test]
    fn the_userns_fix_names_what_forbids_it() {
        let apparmor = userns_fix(Some("1"), Some("15000"), None, false).unwrap();
        assert!(
            apparmor.contains("kernel.apparmor_restrict_unprivileged_userns = 1"),
            "{apparmor}"
        );
        // Root makes its user namespaces whatever AppArmor says.
        assert_eq!(userns_fix(Some("1"), Some("15000"), None, true), None);
        assert_eq!(userns_fix(Some("0"), Some("15000"), Some("1"), false), None);
        assert_eq!(userns_fix(None, None, None, false), None);
        let off = userns_fix(Some("0"), Some("0"), None, true).unwrap();
        assert!(off.contains("user.max_user_namespaces"), "{off}");
        let debian = userns_fix(None, Some("15000"), Some("0"), false).unwrap();
        assert!(
            debian.contains("kernel.unprivileged_userns_clone"),
            "{debian}"
        );
    }
}
