//! Output paths: where each path an REAPI `Command` asks for lies in the
//! input root, and which directories must exist before the command runs.
//!
//! REAPI v2 (`Command.output_paths`, and the older `output_files` and
//! `output_directories`, which `output_paths` supersedes when set): each
//! path is relative to the working directory, `/`-separated, with no
//! leading or trailing `/`; `""` names the working directory itself (the
//! whole tree, inputs included); directories leading up to an output are
//! made by the worker before the command runs, the output itself is not.
//! A path may reach above the working directory with `..` — BuildStream
//! asks for `.` and `../../../buildstream-install` from
//! `buildstream/<project>/<element>` — but never out of the input root:
//! that is `INVALID_ARGUMENT`, naming the path.
//!
//! Where fhsx differs, and why:
//!
//! - **By name.** `.` and `..` are resolved on the path's text, before
//!   the input root is fetched: `a/..` is the directory holding `a` even
//!   if `a` is a symlink (POSIX would climb from its target). A path is
//!   then looked up in the tree without following symlinks on the way: an
//!   output below a symlink the command made is missing, and one whose
//!   leading directories would have to be made through a symlink or a file
//!   of the input root is refused (`cas::with_dirs`). So an output is
//!   always a node of the tree, never something a link points at.
//! - **Whole directories are the outputs.** fhsx's outputs are
//!   directories. On a toolchain, an action runs in place in its input
//!   root (`/build/out`), and that whole tree after the build is output
//!   `out`; with the input root as `/`, each place ([`places`]: the
//!   working directory, the outputs' directories) is an output. The
//!   requested paths are looked up in them (an output that overlaps an
//!   input is whatever the tree holds there after the build). What the
//!   command left beside the requested paths is in the record too, and
//!   fhsx's ingest rules apply to all of it: REAPI would discard it, fhsx
//!   proves it.
//! - **The input root as `/` stays read-only** but for its places, where
//!   Buildbarn's runner and buildbox-run make the whole root writable.
//!   An output that is the whole input root makes every top-level
//!   directory a place; a file directly in the root is refused.

use std::collections::BTreeSet;

use executor_core::action::SANDBOX_OWN;

use super::mapping::Refusal;
use super::proto::{re, Code};

/// How the client asked for an output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// `output_paths` (REAPI ≥ 2.1): whatever is there.
    Path,
    /// `output_files`: a file (or a symlink, reported as one).
    File,
    /// `output_directories`: a directory (or a symlink).
    Directory,
}

/// One requested output.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutputRequest {
    /// As the client wrote it: relative to the working directory. The
    /// result names the output by this.
    pub path: String,
    /// Relative to the input root, `""` for the root itself.
    pub in_root: String,
    pub kind: OutputKind,
}

/// The outputs of a command, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// The working directory, relative to the input root (`""`: the root).
    pub working_directory: String,
    /// In the order the client listed them.
    pub outputs: Vec<OutputRequest>,
    /// Directories (relative to the input root) that must exist before the
    /// command runs: the working directory and each output's parent, each
    /// once and never the root. Only these, not every prefix of each (a
    /// path's prefixes cost its length squared): `cas::with_dirs` makes
    /// the directories leading up to them as it walks down.
    pub dirs: Vec<String>,
}

fn invalid(message: String) -> Refusal {
    Refusal::new(Code::InvalidArgument, message)
}

/// `path`, relative to `base` (components of a path in the input root),
/// as components relative to the input root. `what` names the path in a
/// refusal.
fn resolve(what: &str, base: &[String], path: &str) -> Result<Vec<String>, Refusal> {
    if path.contains('\0') {
        return Err(invalid(format!("{what} {path:?} contains a NUL byte")));
    }
    if path.starts_with('/') {
        return Err(invalid(format!(
            "{what} {path:?} is absolute: REAPI paths are relative"
        )));
    }
    let mut out = base.to_vec();
    if path.is_empty() {
        return Ok(out);
    }
    for c in path.split('/') {
        match c {
            "" => {
                return Err(invalid(format!(
                    "{what} {path:?} has an empty component (a trailing or doubled `/`)"
                )))
            }
            "." => {}
            ".." => {
                if out.pop().is_none() {
                    return Err(invalid(format!(
                        "{what} {path:?} leads out of the input root"
                    )));
                }
            }
            name => out.push(name.to_owned()),
        }
    }
    Ok(out)
}

/// The working directory and the outputs of `command`, resolved.
pub fn resolve_command(command: &re::Command) -> Result<Resolved, Refusal> {
    let wd = resolve("working_directory", &[], &command.working_directory)?;
    let what = |kind| match kind {
        OutputKind::Path => "output path",
        OutputKind::File => "output file",
        OutputKind::Directory => "output directory",
    };
    #[allow(deprecated)]
    let requested: Vec<(&String, OutputKind)> = if !command.output_paths.is_empty() {
        command
            .output_paths
            .iter()
            .map(|p| (p, OutputKind::Path))
            .collect()
    } else {
        command
            .output_files
            .iter()
            .map(|p| (p, OutputKind::File))
            .chain(
                command
                    .output_directories
                    .iter()
                    .map(|p| (p, OutputKind::Directory)),
            )
            .collect()
    };
    let mut seen = BTreeSet::new();
    let mut dirs = BTreeSet::new();
    dirs.insert(wd.join("/"));
    let mut outputs = Vec::with_capacity(requested.len());
    for (p, kind) in requested {
        // REAPI: deduplicated, and no output both a file and a directory.
        if !seen.insert(p.as_str()) {
            return Err(invalid(format!("output path {p:?} is listed twice")));
        }
        let mut parts = resolve(what(kind), &wd, p)?;
        let in_root = parts.join("/");
        // Its parent, made before the run; the output itself is not.
        if parts.pop().is_some() {
            dirs.insert(parts.join("/"));
        }
        outputs.push(OutputRequest {
            path: p.clone(),
            in_root,
            kind,
        });
    }
    dirs.remove("");
    Ok(Resolved {
        working_directory: wd.join("/"),
        outputs,
        dirs: dirs.into_iter().collect(),
    })
}

/// Where the scratch is placed when the input root is the action's `/`
/// (relative to the input root, outermost only, in component order): the
/// working directory, and for each output outside every place so far its
/// parent directory — or the output itself, for an `output_directories`
/// entry or an `output_paths` entry directly below the root, whose parent
/// is the root. An output that is the whole input root is left to the
/// caller (every top-level directory then is a place, [`with_top_level`]). A
/// file directly in the root is refused (`INVALID_ARGUMENT`: the root's
/// own entries cannot be made), as is an output in what the sandbox
/// mounts itself (`/tmp`, `/proc`, …). Each place holds, at the start,
/// what the input root has there.
pub fn places(resolved: &Resolved) -> Result<Vec<String>, Refusal> {
    let mut places: Vec<String> = Vec::new();
    if !resolved.working_directory.is_empty() {
        places.push(resolved.working_directory.clone());
    }
    for o in &resolved.outputs {
        if o.in_root.is_empty() || places.iter().any(|p| within(&o.in_root, p)) {
            continue;
        }
        let place = match (o.kind, o.in_root.rsplit_once('/')) {
            (OutputKind::Directory, _) | (OutputKind::Path, None) => o.in_root.clone(),
            (_, Some((parent, _))) => parent.to_owned(),
            (OutputKind::File, None) => {
                return Err(invalid(format!(
                    "output file {:?} lies directly in the input root, whose own entries cannot be made when the input root is `/`: put it in a directory",
                    o.path
                )))
            }
        };
        places.push(place);
    }
    for p in &places {
        let top = p.split('/').next().unwrap_or_default();
        if SANDBOX_OWN.contains(&top) {
            return Err(invalid(format!(
                "/{p} would be written, but /{top} is the sandbox's own (not kept): write the outputs elsewhere"
            )));
        }
    }
    Ok(outermost(places))
}

/// `places` widened by the input root's top-level directories `top` (but
/// those the sandbox mounts itself), for an action that writes its whole
/// root: every directory of the root then is a writable copy.
pub fn with_top_level(places: Vec<String>, top: impl IntoIterator<Item = String>) -> Vec<String> {
    let top = top
        .into_iter()
        .filter(|t| !SANDBOX_OWN.contains(&t.as_str()));
    outermost(places.into_iter().chain(top).collect())
}

/// Whether `p` is `place` or lies within it.
fn within(p: &str, place: &str) -> bool {
    p == place || (p.starts_with(place) && p.as_bytes().get(place.len()) == Some(&b'/'))
}

/// The places not within another, in component order.
fn outermost(mut places: Vec<String>) -> Vec<String> {
    // By components, so a place within another comes right after it (or
    // after others within it): `a`, `a/b`, `a-b`.
    places.sort_by(|a, b| a.split('/').cmp(b.split('/')));
    let mut out: Vec<String> = Vec::with_capacity(places.len());
    for p in places {
        if !out.last().is_some_and(|o| within(&p, o)) {
            out.push(p);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn command(wd: &str, paths: &[&str], files: &[&str], dirs: &[&str]) -> re::Command {
        #[allow(deprecated)]
        re::Command {
            arguments: vec!["true".into()],
            working_directory: wd.into(),
            output_paths: paths.iter().map(|s| s.to_string()).collect(),
            output_files: files.iter().map(|s| s.to_string()).collect(),
            output_directories: dirs.iter().map(|s| s.to_string()).collect(),
            ..Default::default()
        }
    }

    /// Each case: working directory, output path (in `output_paths`), where
    /// it lies in the input root, the directories made before the run.
    #[test]
    fn output_paths_resolve_against_the_working_directory() {
        for (wd, path, in_root, dirs) in [
            // A plain path, and the leading directories it needs.
            ("", "a/b/c", "a/b/c", &["a/b"][..]),
            ("w", "out/x.o", "w/out/x.o", &["w", "w/out"][..]),
            // The working directory itself: `.` and `""`.
            ("", ".", "", &[][..]),
            ("", "", "", &[][..]),
            ("w/sub", ".", "w/sub", &["w", "w/sub"][..]),
            ("w/sub", "", "w/sub", &["w", "w/sub"][..]),
            // `.` and `..` within the input root.
            ("w", "./a/./b", "w/a/b", &["w", "w/a"][..]),
            ("w", "a/../b", "w/b", &["w"][..]),
            ("w/sub", "..", "w", &["w/sub"][..]),
            ("w/sub", "../..", "", &["w/sub"][..]),
            // BuildStream's install root, beside the working directory's top.
            (
                "buildstream/p/e",
                "../../../buildstream-install",
                "buildstream-install",
                &["buildstream/p/e"][..],
            ),
            // A `..` in the working directory itself.
            ("w/../v", "f", "v/f", &["v"][..]),
        ] {
            let r = resolve_command(&command(wd, &[path], &[], &[]))
                .unwrap_or_else(|e| panic!("{wd:?} {path:?}: {e}"));
            assert_eq!(r.outputs[0].in_root, in_root, "{wd:?} {path:?}");
            assert_eq!(r.outputs[0].path, path, "the result names it as asked");
            assert_eq!(r.outputs[0].kind, OutputKind::Path);
            // The working directory and the output's parent, made first
            // (with every directory above them).
            assert_eq!(r.dirs, dirs, "{wd:?} {path:?}");
        }
    }

    #[test]
    fn paths_that_escape_or_are_malformed_are_refused_naming_them() {
        for (wd, path, says) in [
            ("", "..", "leads out of the input root"),
            ("w", "../..", "leads out of the input root"),
            ("w", "a/../../../x", "leads out of the input root"),
            (
                "buildstream/p/e",
                "../../../../etc",
                "leads out of the input root",
            ),
            ("", "/etc/passwd", "absolute"),
            ("", "a/", "empty component"),
            ("", "a//b", "empty component"),
            ("", "a\0b", "NUL"),
        ] {
            let e = resolve_command(&command(wd, &[path], &[], &[])).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{wd:?} {path:?}");
            assert!(
                e.message.contains(&format!("{path:?}")) && e.message.contains(says),
                "{wd:?} {path:?}: {e}"
            );
        }
        for wd in ["..", "a/../..", "/abs", "a//b"] {
            let e = resolve_command(&command(wd, &["x"], &[], &[])).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument, "{wd:?}");
            assert!(e.message.contains("working_directory"), "{e}");
        }
    }

    #[test]
    fn the_older_fields_resolve_alike_and_output_paths_supersede_them() {
        // `output_directories [""]`: the whole working directory.
        let r = resolve_command(&command("w", &[], &["out/a.o"], &["", "gen"])).unwrap();
        let got: Vec<(&str, &str, OutputKind)> = r
            .outputs
            .iter()
            .map(|o| (o.path.as_str(), o.in_root.as_str(), o.kind))
            .collect();
        assert_eq!(
            got,
            [
                ("out/a.o", "w/out/a.o", OutputKind::File),
                ("", "w", OutputKind::Directory),
                ("gen", "w/gen", OutputKind::Directory),
            ]
        );
        assert_eq!(r.dirs, ["w", "w/out"]);
        assert_eq!(r.working_directory, "w");
        // Set, output_paths wins: the older fields are ignored.
        let r = resolve_command(&command("", &["x"], &["ignored"], &["also"])).unwrap();
        assert_eq!(r.outputs.len(), 1);
    }

    #[test]
    fn outputs_may_nest_and_alias_but_not_repeat() {
        // A directory output holding another, and two spellings of one
        // place: each is reported as asked.
        let r = resolve_command(&command("", &[".", "a", "a/b", "./a"], &[], &[])).unwrap();
        let in_root: Vec<&str> = r.outputs.iter().map(|o| o.in_root.as_str()).collect();
        assert_eq!(in_root, ["", "a", "a/b", "a"]);
        assert_eq!(
            r.dirs,
            ["a"],
            "an output holding another is made a directory"
        );
        let e = resolve_command(&command("", &["a", "a"], &[], &[])).unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
        // The same path as a file and as a directory.
        let e = resolve_command(&command("", &[], &["a"], &["a"])).unwrap_err();
        assert!(e.message.contains("twice"), "{e}");
    }

    /// Each case: working directory, output paths, output files, output
    /// directories, and where the scratch is placed when the input root
    /// is `/`.
    #[test]
    fn the_input_root_as_root_is_writable_only_where_outputs_are() {
        for (wd, paths, files, dirs, want) in [
            // BuildStream: the build directory and the install root.
            (
                "buildstream/p/e",
                &[".", "../../../buildstream-install"][..],
                &[][..],
                &[][..],
                &["buildstream/p/e", "buildstream-install"][..],
            ),
            // Outputs within the working directory need no place of their own.
            (
                "src",
                &["out/a.o", "bin"][..],
                &[][..],
                &[][..],
                &["src"][..],
            ),
            // A file's parent; a directory itself.
            (
                "",
                &[][..],
                &["obj/a.o"][..],
                &["gen", "x/y"][..],
                &["gen", "obj", "x/y"][..],
            ),
            // A path directly below the root: the path itself.
            ("", &["install"][..], &[][..], &[][..], &["install"][..]),
            // Nested places keep the outermost.
            (
                "a/b",
                &["../../a/x.o", "c/d"][..],
                &[][..],
                &[][..],
                &["a"][..],
            ),
            (
                "",
                &["a/b/c", "a/b", "a/b/d/e"][..],
                &[][..],
                &[][..],
                &["a/b"][..],
            ),
            // `ab` and `a-b` are not within `a`.
            (
                "a",
                &["../ab/f", "../a-b/g", "x"][..],
                &[][..],
                &[][..],
                &["a", "a-b", "ab"][..],
            ),
        ] {
            let r = resolve_command(&command(wd, paths, files, dirs)).unwrap();
            let got = places(&r).unwrap_or_else(|e| panic!("{wd:?} {paths:?}: {e}"));
            assert_eq!(got, want, "{wd:?} {paths:?} {files:?} {dirs:?}");
        }
        // The whole root: left to the caller, widened by the top level.
        let r = resolve_command(&command("b/p/e", &[".", "../../.."], &[], &[])).unwrap();
        let got = places(&r).unwrap();
        assert_eq!(got, ["b/p/e"]);
        let top = ["b", "usr", "tmp", "proc", "etc"].map(String::from);
        assert_eq!(with_top_level(got, top), ["b", "etc", "usr"]);
        for (wd, paths, files, says) in [
            ("", &[][..], &["a.o"][..], "directly in the input root"),
            ("", &["tmp/x"][..], &[][..], "/tmp is the sandbox's own"),
            (
                "proc/self",
                &["x"][..],
                &[][..],
                "/proc is the sandbox's own",
            ),
        ] {
            let r = resolve_command(&command(wd, paths, files, &[])).unwrap();
            let e = places(&r).unwrap_err();
            assert_eq!(e.code, Code::InvalidArgument);
            assert!(e.message.contains(says), "{wd:?} {paths:?}: {e}");
        }
    }

    #[test]
    fn a_deep_path_costs_its_length() {
        // 20,000 components: resolved in one pass, its parent one string.
        let deep = vec!["d"; 20_000].join("/");
        let r = resolve_command(&command("", &[&deep], &[], &[])).unwrap();
        assert_eq!(r.outputs[0].in_root, deep);
        assert_eq!(r.dirs.len(), 1);
        assert_eq!(r.dirs[0].len(), deep.len() - 2);
    }
}
