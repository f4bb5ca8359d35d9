//! Mounts: the root provider's read-only tree, `/proc`, `/dev`, private
//! `/dev/shm` and `/tmp`, the one writable host directory. (Not the
//! supervisor: bwrap execs it from a descriptor, see `SUPERVISOR_EXEC`.)

use std::path::{Path, PathBuf};

use crate::probe::FileKind;
use crate::spec::{
    Argv, RootProvider, SandboxSpec, SystemEntry, SCRATCH_DIR, VIEW_RESERVED, WORKSPACE_DIR,
};

/// Host source → sandbox destination of every bind, for translating host
/// paths (like `$DSH_HOME`) to where they appear inside.
#[derive(Debug, Default)]
pub(crate) struct Binds(Vec<(PathBuf, PathBuf)>);

impl Binds {
    fn add(&mut self, src: &Path, dest: &Path) {
        self.0.push((src.to_path_buf(), dest.to_path_buf()));
    }

    /// Where a (canonical) host path appears inside, if it does. Sources
    /// are canonicalized here, only when a translation is asked for.
    pub(crate) fn to_sandbox(&self, spec: &SandboxSpec, host: &Path) -> Option<PathBuf> {
        self.0
            .iter()
            .filter_map(|(src, dest)| {
                let src = spec.fs.canonicalize(src).unwrap_or_else(|| src.clone());
                host.strip_prefix(&src)
                    .ok()
                    .map(|rel| (src.as_os_str().len(), dest.join(rel)))
            })
            .max_by_key(|(len, _)| *len)
            .map(|(_, p)| p)
    }

    /// Which host path an in-sandbox path shows, if any bind covers it.
    pub(crate) fn to_host(&self, inside: &Path) -> Option<PathBuf> {
        self.0
            .iter()
            .filter_map(|(src, dest)| {
                inside
                    .strip_prefix(dest)
                    .ok()
                    .map(|rel| (dest, src.join(rel)))
            })
            .max_by_key(|(dest, _)| dest.as_os_str().len())
            .map(|(_, p)| p)
    }
}

pub(crate) fn emit(spec: &SandboxSpec, a: &mut Argv) -> Binds {
    let mut binds = Binds::default();
    let rt = &spec.runtime;
    match &spec.root {
        RootProvider::Host { workspace, system } => {
            for e in system {
                match e {
                    SystemEntry::RoBind { src, dest } => {
                        a.flag3("--ro-bind", src, dest);
                        binds.add(src, dest);
                    }
                    SystemEntry::Symlink { target, dest } => a.flag3("--symlink", target, dest),
                }
            }
            a.flag3("--ro-bind", &rt.passwd, "/etc/passwd");
            a.flag3("--ro-bind", &rt.group, "/etc/group");
            private_fs(spec, a);
            a.flag3("--bind", workspace, WORKSPACE_DIR);
            binds.add(workspace, Path::new(WORKSPACE_DIR));
        }
        RootProvider::View {
            tree,
            scratch,
            entries,
            places,
        } => {
            for (name, kind) in entries {
                let reserved = name.to_str().is_some_and(|n| {
                    VIEW_RESERVED.contains(&n) && (places.is_none() || n != "build")
                });
                if reserved {
                    continue;
                }
                let dest = Path::new("/").join(name);
                match kind {
                    FileKind::Dir | FileKind::File => {
                        let src = tree.join(name);
                        a.flag3("--ro-bind", &src, &dest);
                        binds.add(&src, &dest);
                    }
                    FileKind::Symlink(t) => a.flag3("--symlink", t, &dest),
                    FileKind::Other => {}
                }
            }
            private_fs(spec, a);
            match places {
                None => {
                    a.flag3("--bind", scratch, SCRATCH_DIR);
                    binds.add(scratch, Path::new(SCRATCH_DIR));
                }
                Some(places) => {
                    for (dir, inside) in places {
                        a.flag3("--bind", dir, inside);
                        binds.add(dir, inside);
                    }
                }
            }
        }
    }
    // Extra read-only files below /run/fhsx (validated by ro_bind_file).
    // Not recorded in `binds`: a file named explicitly is never masked.
    for (src, dest) in &spec.files {
        a.flag3("--ro-bind", src, dest);
    }
    binds
}

/// The places inside the sandbox this layer makes writable, which the
/// supervisor's Landlock ruleset restates (every other path refuses
/// writes twice: read-only mounts, then Landlock).
pub(crate) fn writable_inside(spec: &SandboxSpec) -> Vec<PathBuf> {
    let mut own: Vec<PathBuf> = match &spec.root {
        RootProvider::Host { .. } => vec![WORKSPACE_DIR.into()],
        RootProvider::View { places: None, .. } => vec![SCRATCH_DIR.into()],
        RootProvider::View {
            places: Some(places),
            ..
        } => places.iter().map(|(_, i)| i.clone()).collect(),
    };
    own.extend(["/tmp".into(), "/dev/shm".into()]);
    own
}

/// Where existing files may be written but nothing created or removed:
/// device nodes (`/dev/null`, ttys, …) and a process's own `/proc` knobs
/// (`oom_score_adj`, `comm`; `/proc/sys` is a read-only mount).
pub(crate) const WRITE_EXISTING_INSIDE: [&str; 2] = ["/dev", "/proc"];

/// `/proc` (hardened), `/dev`, and the private tmpfs mounts.
///
/// bwrap covers `/proc/sys` only when its directory is writable, which it
/// never is; yet when the caller is root and gives no build user (`fhsx
/// run`) the sandbox uid maps to host uid 0, the owner of every sysctl
/// file (with a build user it is kept as a second wall). So `/proc/sys` is bound read-only
/// explicitly (network sysctls still show the sandbox's own namespace:
/// they resolve by the reader's namespace, not the mount's) and
/// `/proc/sysrq-trigger`, when the host has one, is covered with /dev/null.
fn private_fs(spec: &SandboxSpec, a: &mut Argv) {
    a.flag2("--proc", "/proc");
    a.flag3("--ro-bind", "/proc/sys", "/proc/sys");
    if spec.fs.kind(Path::new("/proc/sysrq-trigger")).is_some() {
        a.flag3("--ro-bind", "/dev/null", "/proc/sysrq-trigger");
    }
    a.flag2("--dev", "/dev");
    a.flag2("--tmpfs", "/dev/shm");
    a.flag2("--tmpfs", "/tmp");
}
