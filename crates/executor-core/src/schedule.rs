//! Running a graph's actions at once.
//!
//! An action is *ready* once every action it refers to is made. Up to
//! `jobs` ready actions run at a time, each on a slot of its own (a
//! thread); a slot that frees takes the ready action with the highest
//! [`Priority`]: the longest remaining path to the end of the graph, in
//! the milliseconds earlier runs took (BuildXL's rule; Bazel and Nix take
//! the oldest). The order is the only thing a schedule changes: each
//! action is resolved from its dependencies' outputs exactly as a serial
//! build resolves it, so the same graph makes the same digests at any
//! `jobs`.
//!
//! A failure — a build that ran and failed, one that could not be built,
//! or one whose closure panicked (a bug, caught: the other slots end as
//! they would after a failure, instead of waiting for it) — leaves every
//! action that depends on it, directly or not, unbuilt. With `keep_going` everything else is still built (make's
//! `-k`); without it nothing new starts, and the actions already running
//! finish, as cargo's do: their results are kept, since each was asked
//! for. A cancel flag (Ctrl-C) stops the starting too; stopping what runs
//! is the build's own business (the executor watches the same flag).
//!
//! This module decides what runs when; what running means (the build,
//! the cache) is the caller's closure, and what a person sees is the
//! caller's [`Watch`].

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::panic::AssertUnwindSafe;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use castore::Digest;

use crate::action::{Action, OutputName};
use crate::graph::{ActionGraph, GraphError, GraphNode};

/// Which ready action starts first: the longer remaining path, then the
/// more dependents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Priority {
    /// This action's expected time plus the longest chain of expected
    /// times through what depends on it, in milliseconds.
    pub remaining_ms: u64,
    /// How many actions refer to this one directly.
    pub dependents: u32,
}

/// Each node's [`Priority`] given each node's expected milliseconds:
/// one pass from the root down (nodes are in dependency order), so
/// O(actions + references).
pub fn priorities(graph: &ActionGraph, expected_ms: &[u64]) -> Vec<Priority> {
    let n = graph.nodes().len();
    let mut out = vec![Priority::default(); n];
    for i in (0..n).rev() {
        let below = (graph.dependents(i).iter())
            .map(|&d| out[d].remaining_ms)
            .max()
            .unwrap_or(0);
        out[i] = Priority {
            remaining_ms: expected_ms
                .get(i)
                .copied()
                .unwrap_or(0)
                .saturating_add(below),
            dependents: u32::try_from(graph.dependents(i).len()).unwrap_or(u32::MAX),
        };
    }
    out
}

/// How a graph runs.
#[derive(Debug, Clone, Default)]
pub struct Options {
    /// Actions at once (at least 1).
    pub jobs: usize,
    /// Build everything whose inputs can be made, past a failure.
    pub keep_going: bool,
    /// Set (by a signal handler) to start nothing more.
    pub cancel: Option<Arc<AtomicBool>>,
}

/// What the caller's build closure says of one action that it built.
#[derive(Debug)]
pub struct Step<T> {
    /// The outputs, for the actions that refer to it; `None`: it failed
    /// (it ran, and its record says so), so they cannot be built.
    pub outputs: Option<BTreeMap<OutputName, Digest>>,
    /// Whatever the caller keeps of it (its record, say).
    pub value: T,
}

/// How one action of the graph ended.
#[derive(Debug)]
pub enum End<T, E> {
    /// Built, or taken from the cache: its outputs are known.
    Made(T),
    /// It ran and failed.
    Failed(T),
    /// It could not be built (its inputs, the store, the sandbox).
    Error(E),
    /// Building it panicked (a bug): the panic's message.
    Panicked(String),
    /// An action it depends on did not succeed: the first one found.
    Unbuilt { because: usize },
    /// Never started: the graph stopped (an earlier failure without
    /// `keep_going`, or a cancel).
    NotStarted,
}

impl<T, E> End<T, E> {
    pub fn made(&self) -> bool {
        matches!(self, End::Made(_))
    }
}

/// What a person watching the graph is told, in the order it happens
/// (calls are serialised).
pub trait Watch<T, E>: Sync {
    /// `node`'s inputs are all made: it waits for a slot.
    fn ready(&self, _node: usize) {}
    /// `node` starts on `slot` (0-based, below `jobs`).
    fn started(&self, _node: usize, _slot: usize) {}
    /// `node` ended; `slot` is `None` for one that never ran.
    fn ended(&self, _node: usize, _slot: Option<usize>, _end: &End<T, E>) {}
}

/// A watcher that is told nothing.
pub struct Unwatched;
impl<T, E> Watch<T, E> for Unwatched {}

/// Everything the slots share.
struct State<T, E> {
    ready: BinaryHeap<(Priority, Reverse<usize>)>,
    /// Per node: how many of its dependencies are not made yet.
    waiting_for: Vec<usize>,
    outputs: Vec<Option<BTreeMap<OutputName, Digest>>>,
    ends: Vec<Option<End<T, E>>>,
    /// Per slot, the node it runs.
    busy: Vec<Option<usize>>,
    /// A failure without `keep_going`: start nothing more.
    stopped: bool,
}

impl<T, E> State<T, E> {
    fn running(&self) -> bool {
        self.busy.iter().any(Option::is_some)
    }
}

/// One graph being run.
struct Run<'a, T, E, W> {
    graph: &'a ActionGraph,
    priority: &'a [Priority],
    options: &'a Options,
    watch: &'a W,
    state: Mutex<State<T, E>>,
    changed: Condvar,
}

/// Run every action of `graph`, ready ones at once up to `options.jobs`,
/// the highest `priority` first. `import` turns a path input into atoms
/// (as in [`ActionGraph::build_all`]); `build` gets the node's index, the
/// node, its resolved action and the slot it runs on. Returns how each
/// node ended, in the graph's order.
pub fn run_graph<T, E, W>(
    graph: &ActionGraph,
    priority: &[Priority],
    options: &Options,
    watch: &W,
    import: impl Fn(&Path) -> Result<Vec<Digest>, E> + Sync,
    build: impl Fn(usize, &GraphNode, Action, usize) -> Result<Step<T>, E> + Sync,
) -> Vec<End<T, E>>
where
    T: Send,
    E: From<GraphError> + Send,
    W: Watch<T, E>,
{
    let n = graph.nodes().len();
    let waiting_for: Vec<usize> = (0..n).map(|i| graph.dependencies(i).len()).collect();
    let slots = options.jobs.clamp(1, n.max(1));
    let run = Run {
        graph,
        priority,
        options,
        watch,
        state: Mutex::new(State {
            ready: BinaryHeap::new(),
            waiting_for,
            outputs: (0..n).map(|_| None).collect(),
            ends: (0..n).map(|_| None).collect(),
            busy: vec![None; slots],
            stopped: false,
        }),
        changed: Condvar::new(),
    };
    {
        let mut s = run.lock();
        for i in 0..n {
            if s.waiting_for[i] == 0 {
                run.make_ready(&mut s, i);
            }
        }
    }
    std::thread::scope(|scope| {
        for slot in 1..slots {
            let (run, import, build) = (&run, &import, &build);
            std::thread::Builder::new()
                .name(format!("fhsx-slot-{slot}"))
                .spawn_scoped(scope, move || run.slot(slot, import, build))
                // Without a thread of its own a slot is one fewer; the
                // first always runs, on this thread.
                .ok();
        }
        run.slot(0, &import, &build);
    });
    let state = run
        .state
        .into_inner()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    state
        .ends
        .into_iter()
        .map(|e| e.unwrap_or(End::NotStarted))
        .collect()
}

impl<T, E, W> Run<'_, T, E, W>
where
    E: From<GraphError>,
    W: Watch<T, E>,
{
    fn lock(&self) -> MutexGuard<'_, State<T, E>> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn cancelled(&self) -> bool {
        self.options
            .cancel
            .as_ref()
            .is_some_and(|c| c.load(Ordering::SeqCst))
    }

    fn make_ready(&self, s: &mut State<T, E>, i: usize) {
        let p = self.priority.get(i).copied().unwrap_or_default();
        s.ready.push((p, Reverse(i)));
        self.watch.ready(i);
    }

    /// One slot: take the best ready action, build it, let what it
    /// unblocks become ready; until nothing is ready or running. A panic
    /// ends the action it was running as [`End::Panicked`], and the slot
    /// goes on.
    fn slot(
        &self,
        slot: usize,
        import: &(impl Fn(&Path) -> Result<Vec<Digest>, E> + Sync),
        build: &(impl Fn(usize, &GraphNode, Action, usize) -> Result<Step<T>, E> + Sync),
    ) {
        while let Err(panic) =
            std::panic::catch_unwind(AssertUnwindSafe(|| self.run_slot(slot, import, build)))
        {
            let message = (panic.downcast_ref::<&str>().copied())
                .or(panic.downcast_ref::<String>().map(String::as_str))
                .unwrap_or("(no message)")
                .to_owned();
            let mut s = self.lock();
            // Freed before the watch is told, so that the other slots never
            // wait for this one, whatever telling it does.
            let running = s.busy[slot].take();
            self.changed.notify_all();
            if let Some(i) = running {
                self.finish(&mut s, i, slot, (None, End::Panicked(message)));
            }
        }
    }

    fn run_slot(
        &self,
        slot: usize,
        import: &(impl Fn(&Path) -> Result<Vec<Digest>, E> + Sync),
        build: &(impl Fn(usize, &GraphNode, Action, usize) -> Result<Step<T>, E> + Sync),
    ) {
        loop {
            let (i, inputs) = {
                let mut s = self.lock();
                let i = loop {
                    if s.stopped || self.cancelled() {
                        self.changed.notify_all();
                        return;
                    }
                    if let Some((_, Reverse(i))) = s.ready.pop() {
                        break i;
                    }
                    if !s.running() {
                        // Nothing ready, nothing that could make anything
                        // ready: the graph is done.
                        self.changed.notify_all();
                        return;
                    }
                    s = self
                        .changed
                        .wait(s)
                        .unwrap_or_else(|poisoned| poisoned.into_inner());
                };
                s.busy[slot] = Some(i);
                self.watch.started(i, slot);
                let inputs: Vec<(usize, BTreeMap<OutputName, Digest>)> = self
                    .graph
                    .dependencies(i)
                    .iter()
                    .filter_map(|&j| s.outputs[j].clone().map(|o| (j, o)))
                    .collect();
                (i, inputs)
            };
            // Resolved (imports hashed) outside the lock, from the
            // dependencies' outputs, which never change once made.
            let of = |j: usize| inputs.iter().find(|(k, _)| *k == j).map(|(_, o)| o);
            let action = self.graph.resolve(i, of, &mut |p| import(p));
            let end = match action.and_then(|a| build(i, &self.graph.nodes()[i], a, slot)) {
                Ok(Step {
                    outputs: Some(outputs),
                    value,
                }) => (Some(outputs), End::Made(value)),
                Ok(Step {
                    outputs: None,
                    value,
                }) => (None, End::Failed(value)),
                Err(e) => (None, End::Error(e)),
            };
            let mut s = self.lock();
            s.busy[slot] = None;
            self.finish(&mut s, i, slot, end);
            self.changed.notify_all();
        }
    }

    fn finish(
        &self,
        s: &mut State<T, E>,
        i: usize,
        slot: usize,
        (outputs, end): (Option<BTreeMap<OutputName, Digest>>, End<T, E>),
    ) {
        self.watch.ended(i, Some(slot), &end);
        let made = outputs.is_some();
        s.outputs[i] = outputs;
        s.ends[i] = Some(end);
        if made {
            for &d in self.graph.dependents(i) {
                s.waiting_for[d] -= 1;
                if s.waiting_for[d] == 0 && s.ends[d].is_none() {
                    self.make_ready(s, d);
                }
            }
            return;
        }
        if !self.options.keep_going {
            s.stopped = true;
        }
        // Everything above it can never be built: say so now, each once.
        let mut stack = self.graph.dependents(i).to_vec();
        while let Some(d) = stack.pop() {
            if s.ends[d].is_some() {
                continue;
            }
            let end = End::Unbuilt { because: i };
            self.watch.ended(d, None, &end);
            s.ends[d] = Some(end);
            stack.extend_from_slice(self.graph.dependents(d));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;

    const D: &str = "b3:af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262";

    /// A graph written as `name: deps…` lines; the first line is the root.
    fn graph(dir: &Path, lines: &[&str]) -> ActionGraph {
        for line in lines {
            let (name, deps) = line.split_once(':').unwrap();
            let mut closure = vec![format!("\"{D}\"")];
            closure.extend(deps.split_whitespace().map(|d| format!("\"{d}.toml#out\"")));
            std::fs::write(
                dir.join(format!("{name}.toml")),
                format!(
                    "[inputs]\nclosure = [{}]\n[run]\ncommand = [\"x\"]\n",
                    closure.join(", ")
                ),
            )
            .unwrap();
        }
        let root = lines[0].split_once(':').unwrap().0;
        ActionGraph::load(&dir.join(format!("{root}.toml"))).unwrap()
    }

    fn name(g: &ActionGraph, i: usize) -> String {
        g.nodes()[i]
            .file
            .file_stem()
            .unwrap()
            .to_string_lossy()
            .into_owned()
    }

    fn out(g: &ActionGraph, i: usize, a: &Action) -> BTreeMap<OutputName, Digest> {
        // An output that depends on the resolved inputs, as a build's does.
        let mut seed = name(g, i).into_bytes();
        for d in &a.inputs.closure {
            seed.extend_from_slice(d.to_string().as_bytes());
        }
        [("out".parse::<OutputName>().unwrap(), Digest::of(&seed))].into()
    }

    /// Records the order things happen in.
    #[derive(Default)]
    struct Log(Mutex<Vec<String>>);
    impl Watch<String, GraphError> for Log {
        fn started(&self, node: usize, _: usize) {
            self.0.lock().unwrap().push(format!("start {node}"));
        }
        fn ended(&self, node: usize, _: Option<usize>, end: &End<String, GraphError>) {
            let what = match end {
                End::Made(_) => "made",
                End::Failed(_) => "failed",
                End::Error(_) => "error",
                End::Panicked(_) => "panicked",
                End::Unbuilt { .. } => "unbuilt",
                End::NotStarted => "not started",
            };
            self.0.lock().unwrap().push(format!("{what} {node}"));
        }
    }

    fn options(jobs: usize, keep_going: bool) -> Options {
        Options {
            jobs,
            keep_going,
            cancel: None,
        }
    }

    #[test]
    fn every_job_count_resolves_the_same_inputs_and_never_runs_more_than_jobs() {
        let t = tempfile::tempdir().unwrap();
        let g = graph(
            t.path(),
            &[
                "root: j1 j2",
                "j1: a b c",
                "j2: c d e",
                "a:",
                "b:",
                "c:",
                "d:",
                "e: a",
            ],
        );
        let prio = priorities(&g, &vec![1; g.nodes().len()]);
        let mut seen = Vec::new();
        for jobs in [1, 2, 3, 8] {
            let (now, most) = (AtomicUsize::new(0), AtomicUsize::new(0));
            let ends = run_graph(
                &g,
                &prio,
                &options(jobs, false),
                &Unwatched,
                |_| Ok::<_, GraphError>(vec![]),
                |i, _, a, slot| {
                    assert!(slot < jobs);
                    let k = now.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(k, Ordering::SeqCst);
                    std::thread::sleep(Duration::from_millis(5));
                    now.fetch_sub(1, Ordering::SeqCst);
                    Ok(Step {
                        outputs: Some(out(&g, i, &a)),
                        value: format!("{:?}", a.inputs.closure),
                    })
                },
            );
            assert!(most.load(Ordering::SeqCst) <= jobs);
            if jobs > 1 {
                assert!(most.load(Ordering::SeqCst) > 1, "ready actions ran at once");
            }
            let values: Vec<String> = ends
                .into_iter()
                .map(|e| match e {
                    End::Made(v) => v,
                    _ => panic!("every action is made"),
                })
                .collect();
            seen.push(values);
        }
        assert!(seen.windows(2).all(|w| w[0] == w[1]), "{seen:?}");
    }

    #[test]
    fn the_longest_remaining_path_starts_first() {
        let t = tempfile::tempdir().unwrap();
        // short and long are both ready; long's chain is longer, in ms.
        let g = graph(
            t.path(),
            &["root: short top", "top: long", "short:", "long:"],
        );
        let ms: Vec<u64> = (0..g.nodes().len())
            .map(|i| match name(&g, i).as_str() {
                "short" => 500,
                "long" => 100,
                "top" => 1000,
                _ => 1,
            })
            .collect();
        let prio = priorities(&g, &ms);
        let log = Log::default();
        run_graph(
            &g,
            &prio,
            &options(1, false),
            &log,
            |_| Ok::<_, GraphError>(vec![]),
            |i, _, a, _| {
                Ok(Step {
                    outputs: Some(out(&g, i, &a)),
                    value: String::new(),
                })
            },
        );
        let first = log.0.lock().unwrap()[0].clone();
        let long = (0..g.nodes().len())
            .find(|&i| name(&g, i) == "long")
            .unwrap();
        assert_eq!(first, format!("start {long}"));
        // With no durations known, the dependents decide between equals.
        let prio = priorities(&g, &vec![0; g.nodes().len()]);
        let (a, b) = (
            (0..4).find(|&i| name(&g, i) == "short").unwrap(),
            (0..4).find(|&i| name(&g, i) == "top").unwrap(),
        );
        assert_eq!(prio[a].dependents, 1);
        assert!(prio[b] > prio[(0..4).find(|&i| name(&g, i) == "root").unwrap()]);
    }

    fn failing(
        g: &ActionGraph,
        keep_going: bool,
        jobs: usize,
    ) -> (Vec<End<String, GraphError>>, Vec<String>) {
        let log = Log::default();
        let ends = run_graph(
            g,
            &priorities(g, &vec![1; g.nodes().len()]),
            &options(jobs, keep_going),
            &log,
            |_| Ok::<_, GraphError>(vec![]),
            |i, _, a, _| {
                let n = name(g, i);
                Ok(Step {
                    outputs: (!n.starts_with("bad")).then(|| out(g, i, &a)),
                    value: n,
                })
            },
        );
        let events = log.0.into_inner().unwrap();
        (ends, events)
    }

    #[test]
    fn keep_going_builds_all_it_can_and_names_what_a_failure_left_unbuilt() {
        let t = tempfile::tempdir().unwrap();
        let g = graph(
            t.path(),
            &["root: mid ok2", "mid: bad ok1", "bad:", "ok1:", "ok2:"],
        );
        let (ends, _) = failing(&g, true, 2);
        let by = |n: &str| (0..g.nodes().len()).find(|&i| name(&g, i) == n).unwrap();
        assert!(ends[by("ok1")].made() && ends[by("ok2")].made());
        assert!(matches!(ends[by("bad")], End::Failed(_)));
        for above in ["mid", "root"] {
            assert!(
                matches!(ends[by(above)], End::Unbuilt { because } if because == by("bad")),
                "{above}: {:?}",
                ends[by(above)]
            );
        }
    }

    #[test]
    fn without_keep_going_a_failure_starts_nothing_new() {
        let t = tempfile::tempdir().unwrap();
        // bad has the longest path, so it runs first on one slot.
        let g = graph(
            t.path(),
            &["root: top ok1 ok2", "top: bad", "bad:", "ok1:", "ok2:"],
        );
        let (ends, events) = failing(&g, false, 1);
        let started = events.iter().filter(|e| e.starts_with("start")).count();
        assert_eq!(started, 1, "{events:?}");
        let not_started = ends.iter().filter(|e| matches!(e, End::NotStarted)).count();
        assert_eq!(not_started, 2, "ok1 and ok2: {ends:?}");
    }

    #[test]
    fn a_build_that_panics_ends_as_panicked_and_the_graph_ends() {
        let t = tempfile::tempdir().unwrap();
        let g = graph(t.path(), &["root: top ok", "top: boom", "boom:", "ok:"]);
        let by = |n: &str| (0..g.nodes().len()).find(|&i| name(&g, i) == n).unwrap();
        for keep_going in [false, true] {
            // On a thread of its own, so that a graph that hangs fails the
            // test instead of hanging it.
            let (tx, rx) = std::sync::mpsc::channel();
            let g2 = g.clone();
            std::thread::spawn(move || {
                let log = Log::default();
                let ends = run_graph(
                    &g2,
                    &priorities(&g2, &vec![1; g2.nodes().len()]),
                    &options(2, keep_going),
                    &log,
                    |_| Ok::<_, GraphError>(vec![]),
                    |i, _, a, _| {
                        if name(&g2, i) == "boom" {
                            panic!("boom went off");
                        }
                        std::thread::sleep(Duration::from_millis(20));
                        Ok(Step {
                            outputs: Some(out(&g2, i, &a)),
                            value: String::new(),
                        })
                    },
                );
                let _ = tx.send((ends, log.0.into_inner().unwrap()));
            });
            let (ends, events) = rx
                .recv_timeout(Duration::from_secs(60))
                .expect("the graph ended after a build panicked");
            assert!(
                matches!(&ends[by("boom")], End::Panicked(m) if m == "boom went off"),
                "{ends:?}"
            );
            assert!(
                events.contains(&format!("panicked {}", by("boom"))),
                "{events:?}"
            );
            for above in ["top", "root"] {
                assert!(
                    matches!(ends[by(above)], End::Unbuilt { because } if because == by("boom")),
                    "{above}: {ends:?}"
                );
            }
            if keep_going {
                assert!(ends[by("ok")].made(), "{ends:?}");
            }
        }
    }

    #[test]
    fn a_cancel_starts_nothing() {
        let t = tempfile::tempdir().unwrap();
        let g = graph(t.path(), &["root: a b", "a:", "b:"]);
        let mut o = options(2, true);
        o.cancel = Some(Arc::new(AtomicBool::new(true)));
        let ends = run_graph(
            &g,
            &priorities(&g, &[1, 1, 1]),
            &o,
            &Unwatched,
            |_| Ok::<_, GraphError>(vec![]),
            |_, _, _, _| -> Result<Step<()>, GraphError> { panic!("nothing starts") },
        );
        assert!(ends.iter().all(|e| matches!(e, End::NotStarted)));
    }
}
