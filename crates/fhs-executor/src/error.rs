//! The executor's error type.

use std::path::{Path, PathBuf};

use executor_core::ExitClass;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error(transparent)]
    Store(#[from] castore::Error),
    #[error(transparent)]
    Action(#[from] executor_core::ActionError),
    #[error(transparent)]
    Sandbox(#[from] executor_core::SandboxError),
    /// Boxed: the largest variant sizes every `Result` of the crate.
    #[error(transparent)]
    Copy(Box<crate::copy::CopyError>),
    #[error("the action's {what} names {digest}, which is not in the store; import it first (`fhsx store import`)")]
    MissingInput {
        what: &'static str,
        digest: castore::Digest,
    },
    /// The request is well-formed but not allowed as given.
    #[error("{0}")]
    Usage(String),
    #[error("bad key: {0}")]
    BadKey(String),
    #[error("bad record: {0}")]
    BadRecord(String),
    #[error("output {path}: {reason}")]
    BadOutput { path: String, reason: String },
    #[error("containment violation: {0}")]
    Containment(String),
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Other(String),
}

impl From<crate::copy::CopyError> for Error {
    fn from(e: crate::copy::CopyError) -> Self {
        Error::Copy(Box::new(e))
    }
}

impl Error {
    pub(crate) fn io(op: &'static str, path: &Path, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    pub fn exit_class(&self) -> ExitClass {
        match self {
            Error::Store(e) => match e.kind() {
                castore::ErrorKind::Integrity => ExitClass::Integrity,
                castore::ErrorKind::Input => ExitClass::Usage,
                castore::ErrorKind::Io => ExitClass::BuildFailed,
            },
            Error::Action(_) | Error::BadKey(_) | Error::MissingInput { .. } | Error::Usage(_) => {
                ExitClass::Usage
            }
            Error::Sandbox(e) => e.exit_class(),
            Error::Copy(e) => e.exit_class(),
            Error::BadRecord(_) | Error::Containment(_) => ExitClass::Integrity,
            Error::BadOutput { .. } | Error::Io { .. } | Error::Other(_) => ExitClass::BuildFailed,
        }
    }
}
