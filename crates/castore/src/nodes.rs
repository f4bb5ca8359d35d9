//! The three node kinds a tree is made of, and the validated names and
//! symlink targets they carry. A value of these types is always valid: the
//! constructors check, so nothing downstream has to.

use std::fmt;

use crate::{Digest, Error};

/// One path component: non-empty, not `.` or `..`, no `/` or NUL, ≤ 255 bytes.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Name(Vec<u8>);

impl Name {
    pub const MAX_LEN: usize = 255;

    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, Error> {
        let b = bytes.into();
        let why = if b.is_empty() {
            Some("empty name")
        } else if b == b"." || b == b".." {
            Some("name is `.` or `..`")
        } else if b.contains(&b'/') {
            Some("name contains `/`")
        } else if b.contains(&0) {
            Some("name contains NUL")
        } else if b.len() > Self::MAX_LEN {
            Some("name longer than 255 bytes")
        } else {
            None
        };
        match why {
            Some(w) => Err(Error::InvalidDirectory(format!(
                "{w}: {:?}",
                String::from_utf8_lossy(&b)
            ))),
            None => Ok(Name(b)),
        }
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// As an OS string, for creating files.
    pub fn as_os_str(&self) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(&self.0)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// A symlink target: non-empty, no NUL, ≤ 4095 bytes. Stored verbatim; castore
/// never follows one, so a target pointing anywhere is harmless content.
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SymlinkTarget(Vec<u8>);

impl SymlinkTarget {
    pub const MAX_LEN: usize = 4095;

    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, Error> {
        let b = bytes.into();
        if b.is_empty() || b.contains(&0) || b.len() > Self::MAX_LEN {
            return Err(Error::InvalidDirectory(format!(
                "symlink target must be 1..=4095 bytes without NUL: {:?}",
                String::from_utf8_lossy(&b)
            )));
        }
        Ok(SymlinkTarget(b))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn as_os_str(&self) -> &std::ffi::OsStr {
        use std::os::unix::ffi::OsStrExt;
        std::ffi::OsStr::from_bytes(&self.0)
    }
}

impl fmt::Display for SymlinkTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl fmt::Debug for SymlinkTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", String::from_utf8_lossy(&self.0))
    }
}

/// A tree entry. No mtimes, owners or other mode bits: they are not content.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub enum Node {
    /// `size` is the number of entries below the directory, recursively.
    Directory {
        digest: Digest,
        size: u64,
    },
    /// `size` is the byte length of the blob.
    File {
        digest: Digest,
        size: u64,
        executable: bool,
    },
    Symlink {
        target: SymlinkTarget,
    },
}

impl Node {
    /// A short human word for the kind, used in error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Node::Directory { .. } => "a directory",
            Node::File {
                executable: true, ..
            } => "an executable file",
            Node::File { .. } => "a file",
            Node::Symlink { .. } => "a symlink",
        }
    }

    /// The digest of the object this node points at (none for symlinks).
    pub fn digest(&self) -> Option<&Digest> {
        match self {
            Node::Directory { digest, .. } | Node::File { digest, .. } => Some(digest),
            Node::Symlink { .. } => None,
        }
    }

    /// A description naming the content, for messages: kind plus digest or target.
    pub fn describe(&self) -> String {
        match self {
            Node::Symlink { target } => format!("a symlink to {target}"),
            n => format!(
                "{} {}",
                n.kind(),
                n.digest().map(|d| d.to_string()).unwrap_or_default()
            ),
        }
    }
}
