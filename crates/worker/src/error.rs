//! The worker crate's error type.

use executor_core::ExitClass;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] castore::Error),
    #[error(transparent)]
    Executor(#[from] fhs_executor::Error),
    #[error(transparent)]
    Action(#[from] executor_core::ActionError),
    #[error("talking to the worker at {endpoint}")]
    Rpc {
        endpoint: String,
        #[source]
        source: capnp::Error,
    },
    #[error("{what} {endpoint}")]
    Io {
        what: &'static str,
        endpoint: String,
        #[source]
        source: std::io::Error,
    },
    #[error("the worker at {endpoint} speaks protocol {worker}, this client speaks {client}: upgrade the older of the two")]
    Version {
        endpoint: String,
        worker: u32,
        client: u32,
    },
    #[error("the worker at {endpoint} refused the access token: pass the worker's token with --token-file")]
    Denied { endpoint: String },
    /// The worker ran (or refused) the build and reported why.
    #[error("the remote build failed on {endpoint}: {message}")]
    Remote {
        endpoint: String,
        class: ExitClass,
        message: String,
    },
    #[error("the record from {endpoint} does not verify: {reason}")]
    BadRecord { endpoint: String, reason: String },
    /// The peer is not the worker it claims to be, or not one we trust.
    #[error("the worker at {endpoint} is not trusted: {reason}")]
    Untrusted { endpoint: String, reason: String },
    #[error("{0}")]
    Usage(String),
}

impl Error {
    /// Which of DESIGN.md's exit codes this error maps to.
    pub fn exit_class(&self) -> ExitClass {
        match self {
            Error::Store(e) => match e.kind() {
                castore::ErrorKind::Integrity => ExitClass::Integrity,
                castore::ErrorKind::Input => ExitClass::Usage,
                castore::ErrorKind::Io => ExitClass::BuildFailed,
            },
            Error::Executor(e) => e.exit_class(),
            Error::Action(_) | Error::Usage(_) | Error::Version { .. } | Error::Denied { .. } => {
                ExitClass::Usage
            }
            Error::Remote { class, .. } => *class,
            Error::BadRecord { .. } | Error::Untrusted { .. } => ExitClass::Integrity,
            Error::Rpc { .. } | Error::Io { .. } => ExitClass::BuildFailed,
        }
    }
}
