//! Debian alternatives, as data: what a `.deb`'s maintainer scripts would
//! register with `update-alternatives --install`, kept with its atom so a
//! composition can set the links dpkg would set.
//!
//! The scripts are never executed. The importer reads `preinst` and
//! `postinst` from the package's control archive and takes every
//! `update-alternatives … --install LINK NAME PATH PRIORITY [--slave LINK
//! NAME PATH]…` whose words are all literal (after joining `\` line
//! continuations and dropping `--quiet`-style options); a line that uses a
//! shell variable or command substitution for one of them is skipped, since
//! its value cannot be known without running the script.
//!
//! Kept in the atom itself, at [`IN_ATOM`]`/PACKAGE` (JSON), for a package
//! that registers any.

use serde::{Deserialize, Serialize};

/// One `--slave LINK NAME PATH`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Slave {
    pub link: String,
    pub name: String,
    pub path: String,
}

/// One `--install LINK NAME PATH PRIORITY`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Alternative {
    /// The generic name's link, e.g. `/usr/bin/awk`.
    pub link: String,
    /// The alternative's name, e.g. `awk`.
    pub name: String,
    /// This provider, e.g. `/usr/bin/gawk`.
    pub path: String,
    pub priority: i64,
    pub slaves: Vec<Slave>,
}

/// The alternatives a maintainer script registers (see the module doc).
pub fn parse_script(text: &str) -> Vec<Alternative> {
    let joined = text.replace("\\\n", " ");
    let mut out = Vec::new();
    for line in joined.lines() {
        // A command may follow `;`, `&&`, `||` or `then` on one line.
        for cmd in line.split([';', '&', '|']) {
            let words: Vec<&str> = cmd.split_whitespace().collect();
            let Some(start) = words
                .iter()
                .position(|w| *w == "update-alternatives" || w.ends_with("/update-alternatives"))
            else {
                continue;
            };
            if let Some(a) = parse_install(&words[start + 1..]) {
                out.push(a);
            }
        }
    }
    out
}

fn literal(w: &str) -> Option<String> {
    if w.contains(['$', '`', '*', '?']) {
        return None;
    }
    Some(w.trim_matches(|c| c == '"' || c == '\'').to_owned())
}

fn parse_install(words: &[&str]) -> Option<Alternative> {
    let i = words.iter().position(|w| *w == "--install")?;
    let rest = &words[i + 1..];
    if rest.len() < 4 {
        return None;
    }
    let mut alt = Alternative {
        link: literal(rest[0])?,
        name: literal(rest[1])?,
        path: literal(rest[2])?,
        priority: literal(rest[3])?.parse().ok()?,
        slaves: Vec::new(),
    };
    let mut k = 4;
    while k < rest.len() {
        if rest[k] == "--slave" && k + 3 < rest.len() {
            alt.slaves.push(Slave {
                link: literal(rest[k + 1])?,
                name: literal(rest[k + 2])?,
                path: literal(rest[k + 3])?,
            });
            k += 4;
        } else {
            k += 1;
        }
    }
    let absolute = |p: &str| p.starts_with('/') && !p.split('/').any(|c| c == "..");
    let sane = absolute(&alt.link)
        && absolute(&alt.path)
        && !alt.name.is_empty()
        && !alt.name.contains('/')
        && alt.slaves.iter().all(|s| {
            absolute(&s.link) && absolute(&s.path) && !s.name.contains('/') && !s.name.is_empty()
        });
    sane.then_some(alt)
}

/// Where in a `.deb`'s atom its alternatives are kept, one file per
/// package (JSON): content like any other, so they travel with the atom
/// and a composition depends on its atoms' digests alone.
pub const IN_ATOM: &str = "var/lib/fhsx/alternatives";

/// The alternatives a file under [`IN_ATOM`] holds (none if it does not
/// parse).
pub fn parse_kept(bytes: &[u8]) -> Vec<Alternative> {
    serde_json::from_slice(bytes).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_lines_are_read_as_data() {
        // As gawk's and gcc's postinst write them.
        let script = r#"#!/bin/sh
set -e
if [ "$1" = configure ]; then
  update-alternatives --install /usr/bin/awk awk /usr/bin/gawk 10 \
    --slave /usr/share/man/man1/awk.1.gz awk.1.gz /usr/share/man/man1/gawk.1.gz \
    --slave /usr/bin/nawk nawk /usr/bin/gawk
fi
update-alternatives --quiet --install /usr/bin/cc cc /usr/bin/gcc 20 --slave /usr/share/man/man1/cc.1.gz cc.1.gz /usr/share/man/man1/gcc.1.gz; true
update-alternatives --install /usr/bin/x x "$BIN" 10
update-alternatives --remove awk /usr/bin/gawk
"#;
        let a = parse_script(script);
        assert_eq!(a.len(), 2, "{a:?}");
        assert_eq!(a[0].link, "/usr/bin/awk");
        assert_eq!(a[0].path, "/usr/bin/gawk");
        assert_eq!(a[0].priority, 10);
        assert_eq!(a[0].slaves.len(), 2);
        assert_eq!(a[0].slaves[1].link, "/usr/bin/nawk");
        assert_eq!(a[1].name, "cc");
        assert_eq!(a[1].priority, 20);
        // Relative or climbing paths are not taken.
        assert!(parse_script("update-alternatives --install usr/bin/a a /usr/bin/b 1").is_empty());
        assert!(
            parse_script("update-alternatives --install /usr/bin/a a /usr/../etc/x 1").is_empty()
        );
    }
}
