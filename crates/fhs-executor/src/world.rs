//! What a build sees of its world beyond its inputs — who it is, the
//! machine, the time of its files, the order of its listings, its locale —
//! pinned to fixed values, or varied by `--check --vary`.
//!
//! The pinned world (what every build gets, and what reproducibility is
//! checked against): uid 1000 `build` in gid 100 `users`, hostname `fhsx`,
//! umask 0022, every CPU, ASLR off (so a build that prints an address, or
//! hashes a pointer, still builds the same; varying it turns it on), the
//! view's files all at
//! 1970-01-01T00:00:01Z and listed in name-byte order, and the base
//! environment (`TZ=UTC`, `LANG=C.UTF-8`, `HOME=/build/home`, fhsx's
//! `PATH`, `SOURCE_DATE_EPOCH=0`, `USER=build`). The caller's process
//! state never reaches a build (executor-sandbox's `pristine`).
//!
//! What `--check --vary` varies, each from fhsx's side, never by asking
//! the build:
//!
//! | variation | applied by | value |
//! |---|---|---|
//! | `readdir` | castore-fuse: each listing shuffled from the seed and the directory's digest, replayable | seeded shuffle |
//! | `readdir-reverse` | castore-fuse | reversed |
//! | `env` | the environment | `TZ=FHSX-14` (POSIX, needs no zoneinfo), `LANG=LC_ALL=C`, a suffix on `PATH`, `HOME=/build/.fhsx-vary-home` |
//! | `user` | bwrap's uid/gid, the synthetic passwd/group, `USER` | uid 2000 gid 200 `fhsxvary` |
//! | `hostname` | the UTS namespace | `fhsx-vary` |
//! | `umask` | the runner and the supervisor | 0002 |
//! | `cpus` | affinity before bwrap (so `nproc`) | 1 CPU, where the host has several |
//! | `aslr` | `personality` before bwrap, inherited | on |
//! | `mtime` | castore-fuse | 1 000 000 000 |
//!
//! Not varied, on purpose: wall-clock time (a time namespace cannot shift
//! `CLOCK_REALTIME`, and faketime means `LD_PRELOAD` into the build; builds
//! get `SOURCE_DATE_EPOCH`); the build path (`/build` is part of fhsx's
//! interface: outputs and links are rewritten from it); the kernel
//! personality (seccomp refuses all but `PER_LINUX`, and 32-bit would be
//! another platform); the locale's existence (a varied `LANG` names `C`,
//! which every view has).

use castore_fuse::ReaddirOrder;
use executor_core::vary::{values, Variation, Variations};
use executor_sandbox::Persona;

/// One build's world.
#[derive(Debug, Clone)]
pub struct World {
    pub persona: Persona,
    pub user: &'static str,
    pub group: &'static str,
    pub readdir: ReaddirOrder,
    pub mtime_secs: u64,
    /// Environment on top of the base, under the action's own.
    pub env: Vec<(&'static str, String)>,
    /// A directory to make in the scratch (a varied `HOME`).
    pub home: &'static str,
}

impl Default for World {
    fn default() -> Self {
        World {
            persona: Persona {
                aslr: false,
                ..Persona::default()
            },
            user: "build",
            group: "users",
            readdir: ReaddirOrder::Sorted,
            mtime_secs: 1,
            env: Vec::new(),
            home: "/build/home",
        }
    }
}

/// How many CPUs a `cpus` variation gives: one, where there are several.
pub fn varied_cpus() -> Option<usize> {
    std::thread::available_parallelism()
        .ok()
        .filter(|n| n.get() > 1)
        .map(|_| 1)
}

impl World {
    /// The pinned world with `v` applied.
    pub fn varied(v: &Variations) -> World {
        let mut w = World::default();
        if v.has(Variation::Readdir) {
            w.readdir = ReaddirOrder::Shuffle(v.seed);
        } else if v.has(Variation::ReaddirReverse) {
            w.readdir = ReaddirOrder::Reverse;
        }
        if v.has(Variation::Env) {
            w.home = values::HOME;
            w.env = vec![
                ("TZ", values::TZ.into()),
                ("LANG", values::LANG.into()),
                ("LC_ALL", values::LANG.into()),
                ("HOME", values::HOME.into()),
                // Appended to the base PATH (the action's own PATH, if it
                // sets one, wins as always).
                (
                    "PATH",
                    format!(
                        "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin{}",
                        values::PATH_SUFFIX
                    ),
                ),
            ];
        }
        if v.has(Variation::User) {
            w.persona.uid = values::UID;
            w.persona.gid = values::GID;
            w.user = values::USER;
            w.group = values::USER;
            w.env.push(("USER", values::USER.into()));
        }
        if v.has(Variation::Hostname) {
            w.persona.hostname = values::HOSTNAME.into();
        }
        if v.has(Variation::Umask) {
            w.persona.umask = values::UMASK;
        }
        if v.has(Variation::Cpus) {
            w.persona.cpus = varied_cpus();
        }
        if v.has(Variation::Aslr) {
            w.persona.aslr = true;
        }
        if v.has(Variation::Mtime) {
            w.mtime_secs = values::MTIME;
        }
        w
    }

    /// The view's synthetic `/etc/passwd` and `/etc/group` for this world.
    pub fn passwd(&self) -> String {
        let p = &self.persona;
        format!(
            "root:x:0:0:root:/build:/noshell\n{u}:x:{uid}:{gid}:{u}:{home}:/noshell\nnobody:x:65534:65534:nobody:/nonexistent:/noshell\n",
            u = self.user,
            uid = p.uid,
            gid = p.gid,
            home = self.home
        )
    }

    pub fn group(&self) -> String {
        format!(
            "root:x:0:\n{}:x:{}:\nnogroup:x:65534:\n",
            self.group, self.persona.gid
        )
    }
}
