//! Masks: the tool's state directories and home shadowed inside — an empty
//! read-only tmpfs over a directory, `/dev/null` over a file. A path is
//! masked where it actually appears inside (host paths are translated
//! through the binds), so the host value of `$DSH_HOME` is never named.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use super::mounts::Binds;
use crate::probe::FileKind;
use crate::spec::{Argv, HostEnv, SandboxSpec, DEFAULT_MASK_NAMES, DSH_HOME_ENV};

pub(crate) fn emit(spec: &SandboxSpec, host_env: &HostEnv, binds: &Binds, a: &mut Argv) {
    let mut wanted: BTreeSet<PathBuf> = spec.masks.iter().cloned().collect();
    for n in DEFAULT_MASK_NAMES {
        wanted.insert(Path::new(spec.work_dir()).join(n));
    }
    if let Some(home) = host_env.get(std::ffi::OsStr::new(DSH_HOME_ENV)) {
        if !home.is_empty() {
            if let Some(inside) = spec
                .fs
                .canonicalize(Path::new(home))
                .and_then(|c| binds.to_sandbox(spec, &c))
            {
                wanted.insert(inside);
            }
        }
    }
    let mut done = BTreeSet::new();
    for inside in wanted {
        // Resolve where it really lands: a symlink is followed on the host
        // and translated back; what is not reachable needs no mask.
        let Some(host) = binds.to_host(&inside) else {
            continue;
        };
        let (inside, kind) = match spec.fs.kind(&host) {
            Some(FileKind::Symlink(_)) => {
                let Some(c) = spec.fs.canonicalize(&host) else {
                    continue;
                };
                let Some(ins) = binds.to_sandbox(spec, &c) else {
                    continue;
                };
                match spec.fs.kind(&c) {
                    Some(k) => (ins, k),
                    None => continue,
                }
            }
            Some(k) => (inside, k),
            None => continue,
        };
        if !done.insert(inside.clone()) {
            continue;
        }
        match kind {
            FileKind::Dir => {
                a.flag2("--tmpfs", &inside);
                a.flag2("--remount-ro", &inside);
            }
            _ => a.flag3("--ro-bind", "/dev/null", &inside),
        }
    }
}
