//! `fhsx doctor`: which of fhsx's guarantees hold on this machine, for
//! this user, and the fix for each that does not.
//!
//! Each mechanism is tried for real, through the same pieces a build uses,
//! never guessed from versions: a sandbox runs `/bin/true` under a memory
//! and pids limit (user and network namespaces, the mount layout, seccomp,
//! Landlock, the run's cgroups); the FUSE view mounts an empty tree; a
//! scratch of 64 MiB is made; a build user is taken. What each reports
//! (`RunReport`, `DiskLimit`, …) is what a build would get. The AppArmor
//! restriction on user namespaces (Ubuntu 24.04 and later) is read from
//! its sysctl, to name the fix when the sandbox cannot start.
//!
//! Exit 0 when every invariant of the contract holds (a read-only view, no
//! network, no write outside the scratch), 1 otherwise; a limit or a wall
//! that does not hold is reported with its fix and does not change it.

use std::fmt::Write as _;
use std::path::Path;

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

/// A real sandbox: `/bin/true` over an empty workspace, with a memory and
/// a pids limit; what its report says holds.
fn sandbox(root: bool) -> Vec<Finding> {
    let tried = (|| -> anyhow::Result<executor_sandbox::RunReport> {
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
            ..RunOptions::default()
        };
        Ok(rt.run(&spec, &current_host_env(), &["/bin/true".into()], opts)?)
    })();
    let report = match tried {
        Ok(r) if matches!(r.outcome, executor_sandbox::Outcome::Exited(0)) => r,
        Ok(r) => {
            return sandbox_failed(
                root,
                format!("the sandbox ran but `/bin/true` ended {:?}", r.outcome),
            )
        }
        Err(e) => return sandbox_failed(root, format!("{e:#}")),
    };
    let mut out = vec![
        finding(Kind::Contract, "no write outside the scratch", true, "a mount namespace: a read-only root, only the scratch, /tmp and /dev/shm writable", None),
        finding(Kind::Contract, "no network", true, "a network namespace with only loopback, brought up", None),
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
