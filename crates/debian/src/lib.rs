//! debian: Debian packages as fhsx atoms.
//!
//! It owns what makes a set of `.deb`s a toolchain an action can name:
//! resolving a request (`gcc make`, plus Debian's Essential set on demand)
//! to an exact package list with the host's own apt and configured
//! sources ([`apt`]), downloading and importing each package once — a
//! `.deb` whose SHA-256 the store already knows is neither downloaded nor
//! imported again ([`import_packages`]) — and the toolchain file, a
//! reviewable lock of name, version, architecture, `.deb` SHA-256 and atom
//! digest per package ([`Toolchain`]).
//!
//! apt is used, not reimplemented: its solver picks among alternatives and
//! versions exactly as `apt-get install` on a fresh system would (an empty
//! dpkg status), and its download verifies every `.deb` against the signed
//! archive index. What fhsx adds is content addressing: each package
//! becomes an atom, and the toolchain file pins the atoms.
//!
//! It does not own the store or `.deb` import itself (`castore`), nor how
//! atoms are composed into a view (`fhs-executor`).

pub mod apt;
mod error;
pub mod toolchain;

pub use apt::{atom_name, import_packages, resolve, Package, Request};
pub use error::Error;
pub use toolchain::{Entry, Toolchain};
