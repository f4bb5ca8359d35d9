//! What the worker advertises to the engine: the platform properties of
//! its primary device, which the engine matches actions against.
//!
//! Beside one `fhsx-toolchain` per registered toolchain and both values of
//! `fhsx-root` (every worker runs an action in its input root as `/` or
//! on a toolchain), a worker advertises `OSFamily=linux` and the `ISA` it
//! runs on by default.
//! BuildGrid (0.4.4, `!dynamic-property-set`) always matches on those two
//! keys, whether or not its configuration lists them, and some clients
//! always send them (BuildStream: `OSFamily=linux`, `ISA=x86-64`): a worker
//! without them is never handed such an action, which then waits in the
//! queue with no error. An operator's `--property KEY=VALUE` for either key
//! replaces the default (repeat it to advertise several values).

use std::collections::BTreeMap;

use castore::Digest;

use super::mapping::{ROOT_PROPERTY, TOOLCHAIN_PROPERTY};

/// The operating-system family key (REAPI's platform lexicon).
pub const OS_FAMILY: &str = "OSFamily";
/// The instruction-set key.
pub const ISA: &str = "ISA";

/// The `ISA` value for a Rust target architecture
/// (`std::env::consts::ARCH`): the lexicon's `x86-64` and `x86-32`, and
/// `aarch64` as BuildStream and buildbox name it; any other architecture
/// under Rust's own name, which an operator may override with `--property
/// ISA=…`.
pub fn isa_of(arch: &str) -> &str {
    match arch {
        "x86_64" => "x86-64",
        "x86" => "x86-32",
        other => other,
    }
}

/// The properties of the primary device, in the order they are
/// registered: one `fhsx-toolchain` per toolchain, the defaults
/// (`OSFamily`, `ISA`) unless `extra` names their key, then `extra`.
pub fn advertised(
    toolchains: &BTreeMap<Digest, Vec<Digest>>,
    extra: &[(String, String)],
    arch: &str,
) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = toolchains
        .keys()
        .map(|d| (TOOLCHAIN_PROPERTY.to_owned(), d.to_string()))
        .collect();
    // Every worker runs both kinds of action: one naming the key is
    // matched by any worker.
    for root in ["input", "toolchain"] {
        out.push((ROOT_PROPERTY.to_owned(), root.to_owned()));
    }
    for (k, v) in [(OS_FAMILY, "linux"), (ISA, isa_of(arch))] {
        if !extra.iter().any(|(e, _)| e == k) {
            out.push((k.to_owned(), v.to_owned()));
        }
    }
    out.extend(extra.iter().cloned());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(v: &[(String, String)]) -> Vec<String> {
        v.iter().map(|(k, v)| format!("{k}={v}")).collect()
    }

    #[test]
    fn architectures_map_to_the_names_clients_send() {
        for (arch, isa) in [
            ("x86_64", "x86-64"),
            ("aarch64", "aarch64"),
            ("x86", "x86-32"),
            ("riscv64", "riscv64"),
        ] {
            assert_eq!(isa_of(arch), isa, "{arch}");
        }
    }

    #[test]
    fn a_worker_advertises_its_toolchains_os_family_and_isa() {
        let tc = Digest::of(b"toolchain");
        let toolchains: BTreeMap<_, _> = [(tc, vec![])].into();
        for (extra, arch, want) in [
            (
                vec![],
                "x86_64",
                vec![
                    format!("fhsx-toolchain={tc}"),
                    "fhsx-root=input".into(),
                    "fhsx-root=toolchain".into(),
                    "OSFamily=linux".into(),
                    "ISA=x86-64".into(),
                ],
            ),
            (
                vec![("pool".to_owned(), "big".to_owned())],
                "aarch64",
                vec![
                    format!("fhsx-toolchain={tc}"),
                    "fhsx-root=input".into(),
                    "fhsx-root=toolchain".into(),
                    "OSFamily=linux".into(),
                    "ISA=aarch64".into(),
                    "pool=big".into(),
                ],
            ),
            // An operator's value replaces the default; several may be given.
            (
                vec![
                    ("ISA".to_owned(), "x86-64".to_owned()),
                    ("ISA".to_owned(), "x86-32".to_owned()),
                ],
                "x86_64",
                vec![
                    format!("fhsx-toolchain={tc}"),
                    "fhsx-root=input".into(),
                    "fhsx-root=toolchain".into(),
                    "OSFamily=linux".into(),
                    "ISA=x86-64".into(),
                    "ISA=x86-32".into(),
                ],
            ),
        ] {
            assert_eq!(pairs(&advertised(&toolchains, &extra, arch)), want);
        }
    }
}
