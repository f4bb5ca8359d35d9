//! Actions that name each other's outputs (`closure = ["fetch.toml#out"]`):
//! the graph an action file roots, in dependency order, and the resolution
//! of references as the outputs they name become known.
//!
//! Everything that can be wrong with the graph is found before anything is
//! built: a cycle, a file that is missing or invalid, an output name the
//! referred action does not declare. Each error names the chain of
//! references that led to it, so the user sees *where* the bad reference
//! sits, not only what it is.
//!
//! Resolution replaces every reference by the digest of the output it names
//! before the action digest is computed, so two actions with equal resolved
//! inputs have equal digests wherever their files live and however they
//! were written.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};

use castore::Digest;

use crate::action::{Action, ActionError, ActionFile, InputList, InputRef, OutputName};

/// Why an action graph cannot be built. All of them are the user's to fix
/// (exit class [`crate::ExitClass::Usage`]).
#[derive(Debug, thiserror::Error)]
pub enum GraphError {
    #[error("the actions refer to each other in a cycle: {}; break it (an action cannot need its own output)", chain.join(" → "))]
    Cycle { chain: Vec<String> },
    #[error("{} refers to {}, which cannot be read (the path is relative to the referring file)", chain.join(" → "), file.display())]
    Missing {
        chain: Vec<String>,
        file: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} names output {output} of {}, which {}", chain.join(" → "), file.display(), declares(declared))]
    UnknownOutput {
        chain: Vec<String>,
        file: PathBuf,
        output: OutputName,
        declared: Vec<String>,
    },
    #[error("{}: [inputs] source {input} is {trees} trees; a source must be exactly one", chain.join(" → "))]
    Source {
        chain: Vec<String>,
        input: String,
        trees: usize,
    },
    /// The action file named on the command line (its error names it).
    #[error(transparent)]
    Root(ActionError),
    /// An action file another one refers to.
    #[error("{}: the action file this refers to cannot be used", chain.join(" → "))]
    Action {
        chain: Vec<String>,
        #[source]
        source: ActionError,
    },
}

/// What an action declares, for a reference to an output it lacks.
fn declares(declared: &[String]) -> String {
    if declared.is_empty() {
        "does not declare it".into()
    } else {
        format!("declares only {} in [outputs] names", declared.join(", "))
    }
}

/// One action of the graph.
#[derive(Debug, Clone)]
pub struct GraphNode {
    /// The file as first referred to (for messages).
    pub file: PathBuf,
    /// Its canonical path (the node's identity).
    canonical: PathBuf,
    pub action: ActionFile,
    /// BLAKE3 of the file's bytes: whether it changed since a run.
    pub file_digest: Digest,
    /// Each file it refers to, as written, and that file's node: found
    /// once at load, so resolving a reference touches no file.
    refers: HashMap<PathBuf, usize>,
    /// The nodes it refers to, each once, ascending.
    dependencies: Vec<usize>,
}

impl GraphNode {
    /// Its canonical path: the node's identity, the same however it is
    /// referred to.
    pub fn canonical(&self) -> &Path {
        &self.canonical
    }
}

/// An action file and every action it refers to, dependencies first.
#[derive(Debug, Clone)]
pub struct ActionGraph {
    /// Topological order: each node after every node it refers to; the
    /// root last.
    nodes: Vec<GraphNode>,
    /// Per node, the nodes that refer to it, each once, ascending.
    dependents: Vec<Vec<usize>>,
}

impl ActionGraph {
    /// Load `root` and, recursively, every action file it refers to.
    pub fn load(root: &Path) -> Result<ActionGraph, GraphError> {
        let mut loader = Loader {
            done: HashMap::new(),
            order: Vec::new(),
            path: HashSet::new(),
        };
        let chain = vec![root.display().to_string()];
        let canonical = std::fs::canonicalize(root).map_err(|source| {
            GraphError::Root(ActionError::Read {
                file: root.to_path_buf(),
                source,
            })
        })?;
        loader.visit(root, canonical, &chain)?;
        let nodes = loader.order;
        let mut dependents = vec![Vec::new(); nodes.len()];
        for (i, node) in nodes.iter().enumerate() {
            for &j in &node.dependencies {
                dependents[j].push(i);
            }
        }
        Ok(ActionGraph { nodes, dependents })
    }

    /// Dependencies first, the root last.
    pub fn nodes(&self) -> &[GraphNode] {
        &self.nodes
    }

    /// The nodes node `i` refers to (each once, ascending; every one
    /// before `i`).
    pub fn dependencies(&self, i: usize) -> &[usize] {
        &self.nodes[i].dependencies
    }

    /// The nodes that refer to node `i` (each once, ascending; every one
    /// after `i`).
    pub fn dependents(&self, i: usize) -> &[usize] {
        &self.dependents[i]
    }

    pub fn root(&self) -> &GraphNode {
        // `load` always pushes the root.
        &self.nodes[self.nodes.len() - 1]
    }

    /// Build every action in dependency order. `import` turns a path input
    /// (already resolved against its action file's directory) into atoms;
    /// `build` gets each node with its inputs resolved to digests and
    /// whether it is the root, and returns the node's output digests with
    /// whatever the caller wants back; the root's is returned.
    pub fn build_all<T, E: From<GraphError>>(
        &self,
        mut import: impl FnMut(&Path) -> Result<Vec<Digest>, E>,
        mut build: impl FnMut(&GraphNode, Action, bool) -> Result<(BTreeMap<OutputName, Digest>, T), E>,
    ) -> Result<T, E> {
        let mut built: Vec<BTreeMap<OutputName, Digest>> = Vec::with_capacity(self.nodes.len());
        let mut last = None;
        for (i, node) in self.nodes.iter().enumerate() {
            let action = self.resolve(i, |j| built.get(j), &mut import)?;
            let (outputs, t) = build(node, action, i + 1 == self.nodes.len())?;
            built.push(outputs);
            last = Some(t);
        }
        // `load` never makes an empty graph.
        last.ok_or_else(|| {
            E::from(GraphError::Cycle {
                chain: vec!["(empty graph)".into()],
            })
        })
    }
}

impl ActionGraph {
    /// Node `i`'s action with every input a digest: a reference is the
    /// output `outputs_of` gives for the node it names (which must be
    /// built), a path is what `import` makes of it.
    pub fn resolve<'b, E: From<GraphError>>(
        &self,
        i: usize,
        outputs_of: impl Fn(usize) -> Option<&'b BTreeMap<OutputName, Digest>>,
        import: &mut impl FnMut(&Path) -> Result<Vec<Digest>, E>,
    ) -> Result<Action, E> {
        let node = &self.nodes[i];
        let dir = node.canonical.parent().unwrap_or(Path::new("/"));
        let shown = node.file.display().to_string();
        node.action.clone().resolve(
            |_: InputList, r| match r {
                InputRef::Output { file, output } => {
                    let target = node.refers.get(file).copied();
                    let digest = target
                        .and_then(&outputs_of)
                        .and_then(|outs| outs.get(output));
                    Ok(vec![*digest.ok_or_else(|| GraphError::UnknownOutput {
                        chain: vec![format!("{shown}#{output}")],
                        file: file.clone(),
                        output: output.clone(),
                        declared: Vec::new(),
                    })?])
                }
                InputRef::Path(p) => import(&dir.join(p)),
                InputRef::Digest(d) => Ok(vec![*d]),
            },
            |i, n| {
                E::from(GraphError::Source {
                    chain: vec![shown.clone()],
                    input: i.to_string(),
                    trees: n,
                })
            },
        )
    }
}

struct Loader {
    /// Loaded nodes by canonical path → their output names and index.
    done: HashMap<PathBuf, (Vec<OutputName>, usize)>,
    order: Vec<GraphNode>,
    /// Canonical paths on the current path from the root, for cycles.
    path: HashSet<PathBuf>,
}

impl Loader {
    fn visit(
        &mut self,
        shown: &Path,
        canonical: PathBuf,
        chain: &[String],
    ) -> Result<(Vec<OutputName>, usize), GraphError> {
        if let Some(done) = self.done.get(&canonical) {
            return Ok(done.clone());
        }
        if self.path.contains(&canonical) {
            return Err(GraphError::Cycle {
                chain: chain.to_vec(),
            });
        }
        let unusable = |source| {
            if chain.len() < 2 {
                GraphError::Root(source)
            } else {
                GraphError::Action {
                    chain: chain.to_vec(),
                    source,
                }
            }
        };
        let text = std::fs::read_to_string(&canonical).map_err(|source| {
            unusable(ActionError::Read {
                file: canonical.clone(),
                source,
            })
        })?;
        let file_digest = Digest::of(text.as_bytes());
        let action = ActionFile::from_text(&text, &canonical).map_err(unusable)?;
        self.path.insert(canonical.clone());
        let dir = canonical.parent().unwrap_or(Path::new("/")).to_path_buf();
        let shown_dir = shown.parent().unwrap_or(Path::new("")).to_path_buf();
        for (_, p) in action.paths() {
            if let Err(source) = std::fs::metadata(dir.join(p)) {
                let mut link = chain.to_vec();
                link.push(shown_dir.join(p).display().to_string());
                return Err(GraphError::Missing {
                    chain: link,
                    file: p.to_path_buf(),
                    source,
                });
            }
        }
        let mut refers: HashMap<PathBuf, usize> = HashMap::new();
        for (_, file, output) in action.references() {
            let mut link = chain.to_vec();
            link.push(format!("{}#{output}", shown_dir.join(file).display()));
            let target =
                std::fs::canonicalize(dir.join(file)).map_err(|source| GraphError::Missing {
                    chain: link.clone(),
                    file: file.to_path_buf(),
                    source,
                })?;
            let (declared, index) = self.visit(&shown_dir.join(file), target, &link)?;
            refers.insert(file.to_path_buf(), index);
            if !declared.contains(output) {
                return Err(GraphError::UnknownOutput {
                    chain: link,
                    file: file.to_path_buf(),
                    output: output.clone(),
                    declared: declared.iter().map(|n| n.to_string()).collect(),
                });
            }
        }
        self.path.remove(&canonical);
        let names = action.outputs.names.clone();
        let index = self.order.len();
        let mut dependencies: Vec<usize> = refers.values().copied().collect();
        dependencies.sort_unstable();
        dependencies.dedup();
        self.done.insert(canonical.clone(), (names.clone(), index));
        self.order.push(GraphNode {
            file: shown.to_path_buf(),
            canonical,
            action,
            file_digest,
            refers,
            dependencies,
        });
        Ok((names, index))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "b3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262";

    fn action(inputs: &str, outputs: &str) -> String {
        format!("[inputs]\nclosure = [{inputs}]\n[run]\ncommand = [\"x\"]\n[outputs]\nnames = [{outputs}]\n")
    }

    #[test]
    fn dependencies_come_first_and_resolve_to_their_outputs() {
        let t = tempfile::tempdir().unwrap();
        std::fs::create_dir(t.path().join("sub")).unwrap();
        std::fs::write(
            t.path().join("sub/fetch.toml"),
            action(&format!("\"{D}\""), "\"out\""),
        )
        .unwrap();
        std::fs::write(
            t.path().join("lib.toml"),
            action(
                &format!("\"{D}\", \"sub/fetch.toml#out\""),
                "\"out\", \"dev\"",
            ),
        )
        .unwrap();
        std::fs::write(
            t.path().join("app.toml"),
            action(
                "\"lib.toml#dev\", \"sub/../lib.toml#out\", \"sub/fetch.toml#out\"",
                "\"out\"",
            ),
        )
        .unwrap();
        let g = ActionGraph::load(&t.path().join("app.toml")).unwrap();
        let names: Vec<_> = g
            .nodes()
            .iter()
            .map(|n| n.file.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(names, ["fetch.toml", "lib.toml", "app.toml"]);
        // lib is referred to twice, by two spellings: one edge.
        assert_eq!(g.dependencies(2), [0, 1]);
        assert_eq!(g.dependents(0), [1, 2]);
        assert_eq!(g.dependents(1), [2]);
        let mut seen = Vec::new();
        let root = g
            .build_all(
                |_| Ok(vec![]),
                |node, a, is_root| {
                    seen.push(a.inputs.closure.clone());
                    let outs = a
                        .outputs
                        .names
                        .iter()
                        .map(|n| {
                            (
                                n.clone(),
                                Digest::of(format!("{}#{n}", node.file.display()).as_bytes()),
                            )
                        })
                        .collect();
                    Ok::<_, GraphError>((outs, is_root))
                },
            )
            .unwrap();
        assert!(root);
        let fetch_out = Digest::of(
            format!(
                "{}#out",
                t.path()
                    .join("app.toml")
                    .parent()
                    .unwrap()
                    .join("sub/fetch.toml")
                    .display()
            )
            .as_bytes(),
        );
        assert_eq!(seen[1][1], fetch_out);
        assert_eq!(seen[2][2], fetch_out);
        assert_ne!(
            seen[2][0], seen[2][1],
            "dev and out of lib are different outputs"
        );
    }

    #[test]
    fn bad_graphs_name_the_chain() {
        let t = tempfile::tempdir().unwrap();
        let w = |n: &str, body: String| std::fs::write(t.path().join(n), body).unwrap();
        w("a.toml", action("\"b.toml#out\"", "\"out\""));
        w("b.toml", action("\"a.toml#out\"", "\"out\""));
        let e = ActionGraph::load(&t.path().join("a.toml")).unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e, GraphError::Cycle { .. })
                && m.contains("a.toml → ")
                && m.contains("b.toml#out → ")
                && m.ends_with("break it (an action cannot need its own output)"),
            "{m}"
        );

        w("c.toml", action("\"missing.toml#out\"", "\"out\""));
        let e = ActionGraph::load(&t.path().join("c.toml")).unwrap_err();
        assert!(
            matches!(e, GraphError::Missing { .. }) && e.to_string().contains("missing.toml"),
            "{e}"
        );

        w("d.toml", action(&format!("\"{D}\""), "\"out\""));
        w("e.toml", action("\"d.toml#dev\"", "\"out\""));
        let e = ActionGraph::load(&t.path().join("e.toml")).unwrap_err();
        let m = e.to_string();
        assert!(
            matches!(e, GraphError::UnknownOutput { .. })
                && m.contains("output dev of")
                && m.ends_with("declares only out in [outputs] names"),
            "{m}"
        );

        w("f.toml", "[inputs\n".into());
        w("g.toml", action("\"f.toml#out\"", "\"out\""));
        let e = ActionGraph::load(&t.path().join("g.toml")).unwrap_err();
        let cause = std::error::Error::source(&e).map(|c| c.to_string());
        assert!(
            e.to_string().contains("g.toml → ")
                && cause.as_ref().is_some_and(|c| c.contains("line 1")),
            "{e}: {cause:?}"
        );

        let e = ActionGraph::load(&t.path().join("nonexistent.toml")).unwrap_err();
        assert!(
            matches!(e, GraphError::Root(ActionError::Read { .. }))
                && e.to_string().starts_with("cannot read action file ")
                && e.to_string().ends_with("nonexistent.toml"),
            "{e}"
        );
    }
}
