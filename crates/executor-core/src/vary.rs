//! Variations: what fhsx pins about a build's world, varied on purpose by
//! `fhsx build --check --vary` to show a build does not depend on it.
//!
//! Each variation is applied from fhsx's side — the FUSE view, the sandbox,
//! the environment — never by asking the build. The values used are fixed
//! here (and recorded), except the readdir shuffle's seed, which is the
//! check's and recorded with it, so any run can be replayed exactly.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

/// One thing to vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variation {
    /// Directory listings in a seeded shuffled order (pinned: by name bytes).
    Readdir,
    /// Directory listings reversed.
    ReaddirReverse,
    /// TZ, LANG/LC_ALL, a suffix on PATH, HOME elsewhere.
    Env,
    /// Another uid, gid and user name inside (passwd and group follow).
    User,
    Hostname,
    Umask,
    /// One CPU instead of all (affinity, so `nproc`), where there are several.
    Cpus,
    /// Address-space randomisation on (pinned: off).
    Aslr,
    /// Every file of the view served with another constant mtime.
    Mtime,
}

impl Variation {
    /// Everything `--vary all` varies (readdir-reverse is the cheap
    /// alternative to readdir, not an addition).
    pub const ALL: [Variation; 8] = [
        Variation::Readdir,
        Variation::Env,
        Variation::User,
        Variation::Hostname,
        Variation::Umask,
        Variation::Cpus,
        Variation::Aslr,
        Variation::Mtime,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Variation::Readdir => "readdir",
            Variation::ReaddirReverse => "readdir-reverse",
            Variation::Env => "env",
            Variation::User => "user",
            Variation::Hostname => "hostname",
            Variation::Umask => "umask",
            Variation::Cpus => "cpus",
            Variation::Aslr => "aslr",
            Variation::Mtime => "mtime",
        }
    }

    fn parse(s: &str) -> Option<Variation> {
        [Variation::ReaddirReverse]
            .into_iter()
            .chain(Variation::ALL)
            .find(|v| v.name() == s)
    }
}

/// The variations of one check, and the seed of its shuffles.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Variations {
    pub set: BTreeSet<Variation>,
    pub seed: u64,
}

/// The pinned values and what each variation sets instead.
pub mod values {
    /// TZ varied: a POSIX zone string (no zoneinfo file needed), UTC+14.
    pub const TZ: &str = "FHSX-14";
    pub const LANG: &str = "C";
    pub const PATH_SUFFIX: &str = ":/usr/local/fhsx-vary/bin";
    pub const HOME: &str = "/build/.fhsx-vary-home";
    pub const UID: u32 = 2000;
    pub const GID: u32 = 200;
    pub const USER: &str = "fhsxvary";
    pub const HOSTNAME: &str = "fhsx-vary";
    pub const UMASK: u32 = 0o002;
    /// 2001-09-09T01:46:40Z.
    pub const MTIME: u64 = 1_000_000_000;
}

impl Variations {
    /// `all`, or a comma-separated list of names.
    pub fn parse(list: &str, seed: u64) -> Result<Variations, String> {
        let mut set = BTreeSet::new();
        for name in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            if name == "all" {
                set.extend(Variation::ALL);
                continue;
            }
            set.insert(Variation::parse(name).ok_or_else(|| {
                format!(
                    "unknown variation {name:?}: use `all` or some of readdir, readdir-reverse, env, user, hostname, umask, cpus, aslr, mtime"
                )
            })?);
        }
        if set.is_empty() {
            return Err("--vary names no variation".into());
        }
        Ok(Variations { set, seed })
    }

    pub fn has(&self, v: Variation) -> bool {
        self.set.contains(&v)
    }

    /// Just `v`, with the same seed.
    pub fn only(&self, v: Variation) -> Variations {
        Variations {
            set: [v].into(),
            seed: self.seed,
        }
    }

    /// What each variation was set to, as the check record says it.
    pub fn describe(&self, cpus: Option<usize>) -> BTreeMap<String, String> {
        use values::*;
        self.set
            .iter()
            .map(|v| {
                let what = match v {
                    Variation::Readdir => format!("shuffled, seed {}", self.seed),
                    Variation::ReaddirReverse => "reversed".into(),
                    Variation::Env => {
                        format!("TZ={TZ} LANG={LANG} LC_ALL={LANG} PATH+={PATH_SUFFIX} HOME={HOME}")
                    }
                    Variation::User => format!("uid {UID} gid {GID} user {USER}"),
                    Variation::Hostname => HOSTNAME.into(),
                    Variation::Umask => format!("{UMASK:04o}"),
                    Variation::Cpus => match cpus {
                        Some(n) => format!("{n} CPU(s)"),
                        None => "not varied: this host has one CPU".into(),
                    },
                    Variation::Aslr => "on".into(),
                    Variation::Mtime => format!("{MTIME}"),
                };
                (v.name().to_owned(), what)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lists_parse_and_unknown_names_say_what_is_known() {
        let v = Variations::parse("all", 7).unwrap();
        assert_eq!(v.set.len(), 8);
        let v = Variations::parse("readdir-reverse, umask", 7).unwrap();
        assert!(v.has(Variation::ReaddirReverse) && v.has(Variation::Umask) && v.set.len() == 2);
        let e = Variations::parse("time", 0).unwrap_err();
        assert!(
            e.contains("unknown variation \"time\"") && e.contains("hostname"),
            "{e}"
        );
        assert!(Variations::parse("", 0).is_err());
    }
}
