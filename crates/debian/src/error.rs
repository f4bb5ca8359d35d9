//! The crate's error type.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("apt does not know package {0:?}: check the name (`apt-cache search`), or run `apt-get update` if it is new")]
    UnknownPackage(String),
    #[error("apt could not resolve the packages: {0}")]
    Unresolvable(String),
    #[error("running `{command}` failed (is apt installed? fhsx toolchain apt needs Debian or a derivative)")]
    Spawn {
        command: String,
        #[source]
        source: std::io::Error,
    },
    #[error("`apt-get download {package}` failed: {message}; run `apt-get update` and retry")]
    Download { package: String, message: String },
    #[error("the downloaded {file} has SHA-256 {got}, not the archive's {want}: refusing it")]
    Checksum {
        file: PathBuf,
        want: String,
        got: String,
    },
    #[error("toolchain file {file}: {message}")]
    BadToolchain { file: PathBuf, message: String },
    #[error("{op} {path}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Store(#[from] castore::Error),
}

impl Error {
    pub(crate) fn io(op: &'static str, path: &std::path::Path, source: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// Whether the user can fix it by changing what they asked for.
    pub fn is_usage(&self) -> bool {
        matches!(
            self,
            Error::UnknownPackage(_) | Error::Unresolvable(_) | Error::BadToolchain { .. }
        )
    }
}
