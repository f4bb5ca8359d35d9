//! The RPC bridge: the host's socket bound at `/run/wf.sock`, and the
//! fetch proxy's socket at `/run/fhsx/proxy.sock` when the spec has one
//! (the supervisor forwards `127.0.0.1:<port>` to it), and the
//! jobserver's FIFO at `/run/fhsx/jobserver` when it has one. This layer
//! also seals the tree: it is the last to add a mount point, so it ends
//! with `--remount-ro` of `/dev` and `/`; afterwards the only writable
//! places are the work directory, `/tmp` and `/dev/shm` (private tmpfs).

use crate::spec::{Argv, SandboxSpec, JOBSERVER_PATH, PROXY_SOCKET_PATH, RPC_SOCKET_PATH};

pub(crate) fn emit(spec: &SandboxSpec, a: &mut Argv) {
    a.flag3("--ro-bind", &spec.runtime.rpc_socket, RPC_SOCKET_PATH);
    if let Some(p) = &spec.proxy {
        // A read-only bind of a socket still accepts connect().
        a.flag3("--ro-bind", &p.socket, PROXY_SOCKET_PATH);
    }
    if let Some((fifo, _)) = &spec.jobserver {
        // A FIFO on a read-only mount still opens for writing.
        a.flag3("--ro-bind", fifo, JOBSERVER_PATH);
    }
    a.flag2("--remount-ro", "/dev");
    a.flag2("--remount-ro", "/");
}
