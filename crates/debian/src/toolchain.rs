//! The toolchain file: a set of Debian packages pinned as atoms, written
//! by `fhsx toolchain apt` and named by actions (`toolchain =
//! ["gcc.toolchain"]`), which compose its atoms.
//!
//! It reads like a lock, to be reviewed in a diff: what was asked for,
//! then one `[[package]]` per package, sorted by name and architecture,
//! with its version, the `.deb`'s SHA-256 (as the archive index names it)
//! and the atom digest it imported as. The encoding is a function of the
//! content alone, so writing it twice from the same apt state gives the
//! same bytes.

use std::path::Path;

use castore::Digest;
use serde::{Deserialize, Serialize};

use crate::Error;

/// One package of a toolchain.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Entry {
    pub name: String,
    pub architecture: String,
    pub version: String,
    /// The `.deb`'s SHA-256, hex.
    pub sha256: String,
    /// The atom the `.deb` imported as.
    pub atom: Digest,
}

/// A toolchain file's content.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Toolchain {
    /// The packages asked for, as given (sorted).
    pub requested: Vec<String>,
    /// Whether Debian's Essential and required packages were added.
    pub essential: bool,
    #[serde(rename = "package", default)]
    pub packages: Vec<Entry>,
}

const HEADER: &str = "# An fhsx toolchain: Debian packages pinned as atoms. Written by\n# `fhsx toolchain apt`; regenerate it rather than edit it.\n";

impl Toolchain {
    /// A toolchain of `packages` (any order) for `requested`.
    pub fn new(mut requested: Vec<String>, essential: bool, mut packages: Vec<Entry>) -> Self {
        requested.sort();
        requested.dedup();
        packages.sort();
        packages.dedup();
        Toolchain {
            requested,
            essential,
            packages,
        }
    }

    /// The canonical text.
    pub fn encode(&self) -> String {
        format!("{HEADER}{}", toml::to_string(self).unwrap_or_default())
    }

    pub fn parse(text: &str, file: &Path) -> Result<Toolchain, Error> {
        let bad = |message: String| Error::BadToolchain {
            file: file.to_path_buf(),
            message,
        };
        let t: Toolchain =
            toml::from_str(text).map_err(|e| bad(e.to_string().trim_end().to_owned()))?;
        for w in t.packages.windows(2) {
            if (&w[0].name, &w[0].architecture) >= (&w[1].name, &w[1].architecture) {
                return Err(bad(format!(
                    "packages are not sorted and unique at {} / {}: regenerate it with `fhsx toolchain apt`",
                    w[0].name, w[1].name
                )));
            }
        }
        Ok(t)
    }

    pub fn read(file: &Path) -> Result<Toolchain, Error> {
        let text = std::fs::read_to_string(file).map_err(|e| Error::io("read", file, e))?;
        Toolchain::parse(&text, file)
    }

    /// Write atomically: a reader sees the old file or the new one.
    pub fn write(&self, file: &Path) -> Result<(), Error> {
        let dir = match file.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        let tmp = tempfile::NamedTempFile::new_in(dir)
            .map_err(|e| Error::io("create a file in", dir, e))?;
        std::fs::write(tmp.path(), self.encode()).map_err(|e| Error::io("write", tmp.path(), e))?;
        tmp.persist(file)
            .map_err(|e| Error::io("replace", file, e.error))?;
        Ok(())
    }

    /// The atoms, in the file's order.
    pub fn atoms(&self) -> Vec<Digest> {
        self.packages.iter().map(|p| p.atom).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(name: &str) -> Entry {
        Entry {
            name: name.into(),
            architecture: "amd64".into(),
            version: "1.0-1".into(),
            sha256: "00".repeat(32),
            atom: Digest::of(name.as_bytes()),
        }
    }

    #[test]
    fn encoding_is_canonical_and_round_trips() {
        let a = Toolchain::new(
            vec!["b".into(), "a".into()],
            true,
            vec![entry("zlib1g"), entry("gcc")],
        );
        let b = Toolchain::new(
            vec!["a".into(), "b".into()],
            true,
            vec![entry("gcc"), entry("zlib1g")],
        );
        assert_eq!(a.encode(), b.encode());
        let back = Toolchain::parse(&a.encode(), Path::new("t.toolchain")).unwrap();
        assert_eq!(back, a);
        assert_eq!(
            back.atoms(),
            vec![Digest::of(b"gcc"), Digest::of(b"zlib1g")]
        );
        let text = a.encode();
        assert!(
            text.find("name = \"gcc\"").unwrap() < text.find("name = \"zlib1g\"").unwrap(),
            "{text}"
        );
        // Hand-edited out of order: refused with the fix.
        let swapped = text.replace("\"gcc\"", "\"zz\"");
        let e = Toolchain::parse(&swapped, Path::new("t.toolchain")).unwrap_err();
        assert!(e.to_string().contains("regenerate"), "{e}");
    }
}
