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
//!
//! What the archive's maintainer scripts would have done, since fhsx never
//! runs them (arbitrary code as root at import, with effects not
//! content-addressed):
//! - **Alternatives** (`update-alternatives --install LINK NAME PATH
//!   PRIORITY [--slave …]`): the importer reads `preinst` and `postinst` as
//!   data (`castore::alternatives`: fully literal commands only) and keeps
//!   the list *in the atom*, `/var/lib/fhsx/alternatives/PACKAGE` (JSON), so
//!   it travels with the atom. Composing (`fhs_executor::view`) links each
//!   alternative with a present provider to its highest-priority one (the
//!   smaller path on a tie), with its present slaves, as dpkg's automatic
//!   mode: `LINK → /etc/alternatives/NAME → PATH`. So `awk` is gawk (10)
//!   over mawk (5), `cc` gcc and `c++` g++ (20).
//! - **Locales**: bookworm's `libc-bin` ships `C.utf8`, fhsx's `LANG`;
//!   `locale-gen` is not run (bring other locales compiled, as an atom).
//! - **`ldconfig`**: not run; the dynamic linker's built-in search covers
//!   Debian's directories (custom paths need `RUNPATH` or
//!   `LD_LIBRARY_PATH`).
//! - **Diversions** (`dpkg-divert --rename`): not applied; two atoms
//!   shipping one path differently clash, named.
//! - **Ignored on purpose**: users and groups (the view's `/etc/passwd` is
//!   fhsx's), services, triggers (man-db, mime, icon caches),
//!   byte-compilation (Python runs without `.pyc`),
//!   `update-ca-certificates` (a build's only CA is the proxy's).
//!
//! Each archive's SHA-256 is looked up with `apt-cache show`; `apt-get
//! download` checks it against the signed index, and the import checks the
//! SHA-256 again. `--essential` adds every `Essential: yes` or `required`
//! package (debootstrap's minbase: `/bin/sh`, coreutils, `awk`, `sed`,
//! `grep`, `locale`, …); Recommends are never followed, so a C toolchain is
//! `gcc make libc6-dev`.

pub mod apt;
mod error;
pub mod toolchain;

pub use apt::{atom_name, import_packages, resolve, Package, Request};
pub use error::Error;
pub use toolchain::{Entry, Toolchain};
