//! Namespace flags: a fresh namespace of every kind (network included), an
//! unprivileged uid/gid inside, no further user namespaces, a fixed hostname.

use crate::spec::{Argv, SandboxSpec};

pub(crate) fn emit(spec: &SandboxSpec, a: &mut Argv) {
    a.push("--unshare-all");
    // Explicit even though --unshare-all implies them: --unshare-all only
    // *tries* a user namespace, and as root we need one for the uid map.
    a.push("--unshare-user");
    a.push("--unshare-net");
    a.flag2("--uid", spec.uid.to_string());
    a.flag2("--gid", spec.gid.to_string());
    if spec.features.disable_userns {
        a.push("--disable-userns");
    }
    a.flag2("--hostname", &spec.hostname);
}
