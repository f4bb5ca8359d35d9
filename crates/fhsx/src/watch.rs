//! What a person sees of a graph build, as nix-output-monitor and cargo
//! show it: on a terminal, a live view (actions done of the total, cache
//! hits, failures, each running action with its time, the tokens in use,
//! an estimated finish) below a line per finished action; off a terminal,
//! the lines alone. With `--events FILE` one JSON object a line per event,
//! with `--trace FILE` a Chrome trace (Perfetto opens it: a track per
//! slot, a counter of tokens in use), and at the end a summary: what
//! failed, where its log is, what it left unbuilt, and the critical path
//! with each action's queued and running time.
//!
//! A graph of one action shows none of this: `fhsx build` of one action
//! prints what it always printed.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use executor_core::schedule::{End, Priority, Watch};
use executor_core::ActionGraph;
use fhs_executor::jobserver::TokenPool;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::{json, Value};

use crate::cmd::build::Built;

/// How a graph is shown.
pub struct Shown {
    /// A live view on stderr (a terminal).
    pub live: bool,
    /// A line per finished action and the summary (graphs of more than
    /// one action).
    pub lines: bool,
    /// `--events`: where the JSON lines go.
    pub events: Option<Box<dyn Write + Send>>,
    /// `--trace`: where the trace is written at the end.
    pub trace: bool,
}

/// One action's times.
#[derive(Default, Clone, Copy)]
struct Times {
    ready: Option<Instant>,
    start: Option<Instant>,
    end: Option<Instant>,
    slot: Option<usize>,
}

#[derive(Default)]
struct Tally {
    times: Vec<Times>,
    done: usize,
    built: usize,
    cached: usize,
    failed: Vec<usize>,
    unbuilt: Vec<(usize, usize)>,
    /// Running: node → slot.
    running: BTreeMap<usize, usize>,
    /// Tokens in use at the last sample, for the trace.
    tokens: Option<usize>,
    trace: Vec<Value>,
    /// Said that running actions finish after a failure.
    said_waiting: bool,
}

/// The graph's watcher: told everything by the scheduler (serially) and
/// by the ticker.
pub struct GraphWatch {
    names: Vec<String>,
    /// Each node's dependencies (for the critical path).
    deps: Vec<Vec<usize>>,
    expected_ms: Vec<u64>,
    priority: Vec<Priority>,
    known: bool,
    jobs: usize,
    keep_going: bool,
    started: Instant,
    pool: Option<Arc<TokenPool>>,
    shown: Outputs,
    tally: Mutex<Tally>,
}

/// [`Shown`] once set up.
struct Outputs {
    lines: bool,
    trace: bool,
    events: Option<Mutex<Box<dyn Write + Send>>>,
    live: Option<Live>,
}

/// The live view: a header and one line per slot.
struct Live {
    multi: MultiProgress,
    header: ProgressBar,
    slots: Vec<ProgressBar>,
}

impl GraphWatch {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        graph: &ActionGraph,
        expected_ms: Vec<u64>,
        known: bool,
        priority: Vec<Priority>,
        jobs: usize,
        keep_going: bool,
        pool: Option<Arc<TokenPool>>,
        shown: Shown,
    ) -> GraphWatch {
        let names = graph
            .nodes()
            .iter()
            .map(|n| castore::shown::escaped(n.file.as_os_str().as_encoded_bytes()))
            .collect();
        let live = shown.live.then(|| {
            let multi = MultiProgress::with_draw_target(ProgressDrawTarget::stderr_with_hz(10));
            let style = ProgressStyle::with_template("{wide_msg}")
                .unwrap_or_else(|_| ProgressStyle::default_spinner());
            let bar = |m: &MultiProgress| {
                let b = m.add(ProgressBar::new_spinner());
                b.set_style(style.clone());
                b
            };
            let header = bar(&multi);
            let slots = (0..jobs).map(|_| bar(&multi)).collect();
            Live {
                multi,
                header,
                slots,
            }
        });
        let n = graph.nodes().len();
        GraphWatch {
            names,
            deps: (0..n).map(|i| graph.dependencies(i).to_vec()).collect(),
            expected_ms,
            priority,
            known,
            jobs,
            keep_going,
            started: Instant::now(),
            pool,
            shown: Outputs {
                lines: shown.lines,
                trace: shown.trace,
                events: shown.events.map(Mutex::new),
                live,
            },
            tally: Mutex::new(Tally {
                times: vec![Times::default(); n],
                ..Tally::default()
            }),
        }
    }

    fn tally(&self) -> MutexGuard<'_, Tally> {
        self.tally.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn secs(&self, at: Instant) -> f64 {
        at.duration_since(self.started).as_secs_f64()
    }

    fn micros(&self, at: Instant) -> u64 {
        at.duration_since(self.started).as_micros() as u64
    }

    /// Action `i`'s name, escaped for a terminal.
    pub fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    /// A line for a person: above the live view, or on stderr.
    pub fn say(&self, line: &str) {
        match &self.shown.live {
            Some(live) => live.multi.suspend(|| eprintln!("{line}")),
            None => eprintln!("{line}"),
        }
    }

    fn event(&self, v: Value) {
        if let Some(w) = &self.shown.events {
            let mut w = w.lock().unwrap_or_else(|p| p.into_inner());
            // A reader that went away costs its events, not the build.
            let _ = writeln!(w, "{v}").and_then(|_| w.flush());
        }
    }

    /// Look at the pool and redraw: every tick of the live view or trace.
    pub fn tick(&self) {
        let now = Instant::now();
        let usage = self.pool.as_ref().map(|p| p.usage());
        let mut t = self.tally();
        if let Some(u) = usage {
            self.sample_tokens(&mut t, u.in_use, now);
        }
        let Some(live) = &self.shown.live else {
            return;
        };
        let total = self.names.len();
        let mut head = format!(
            "[{}/{total}] {} built, {} cached, {} failed",
            t.done,
            t.built,
            t.cached,
            t.failed.len()
        );
        if let Some(u) = usage {
            let _ = write!(head, " · tokens {}/{}", u.in_use, u.size);
        }
        if let Some(eta) = self.eta(&t, now) {
            let _ = write!(head, " · eta {}", clock(eta));
        }
        let _ = write!(head, " · {}", clock(now - self.started));
        live.header.set_message(head);
        let mut by_slot: Vec<Option<usize>> = vec![None; live.slots.len()];
        for (&node, &slot) in &t.running {
            if let Some(s) = by_slot.get_mut(slot) {
                *s = Some(node);
            }
        }
        for (bar, node) in live.slots.iter().zip(by_slot) {
            bar.set_message(match node {
                Some(i) => {
                    let ran = t.times[i].start.map_or(Duration::ZERO, |s| now - s);
                    format!("  {:>7}  {}", clock(ran), self.names[i])
                }
                None => String::new(),
            });
        }
    }

    fn sample_tokens(&self, t: &mut Tally, in_use: usize, now: Instant) {
        if self.shown.trace && t.tokens != Some(in_use) {
            t.tokens = Some(in_use);
            t.trace.push(json!({
                "name": "tokens in use", "ph": "C", "pid": 1,
                "ts": self.micros(now), "args": {"tokens": in_use},
            }));
        }
    }

    /// The later of the longest remaining path and the remaining work
    /// spread over the slots, where any duration is known.
    fn eta(&self, t: &Tally, now: Instant) -> Option<Duration> {
        if !self.known {
            return None;
        }
        let (mut path, mut work) = (0u64, 0u64);
        for (i, times) in t.times.iter().enumerate() {
            if times.end.is_some() {
                continue;
            }
            let ran = times.start.map_or(0, |s| (now - s).as_millis() as u64);
            path = path.max(self.priority[i].remaining_ms.saturating_sub(ran));
            work += self.expected_ms[i].saturating_sub(ran);
        }
        Some(Duration::from_millis(
            path.max(work / self.jobs.max(1) as u64),
        ))
    }

    /// Clear the live view and print the summary; write the trace.
    pub fn finish(&self, trace: Option<&Path>) -> anyhow::Result<()> {
        if let Some(live) = &self.shown.live {
            for bar in std::iter::once(&live.header).chain(&live.slots) {
                bar.finish_and_clear();
            }
            let _ = live.multi.clear();
        }
        let t = self.tally();
        if self.shown.lines {
            for line in self.summary(&t) {
                eprintln!("{line}");
            }
        }
        if let Some(path) = trace {
            let mut events = Vec::with_capacity(t.trace.len() + self.jobs);
            for slot in 0..self.jobs {
                events.push(json!({
                    "name": "thread_name", "ph": "M", "pid": 1, "tid": slot + 1,
                    "args": {"name": format!("slot {}", slot + 1)},
                }));
            }
            events.extend(t.trace.iter().cloned());
            let doc = json!({
                "traceEvents": events,
                "displayTimeUnit": "ms",
                "otherData": {"jobs": self.jobs, "tokens": self.pool.as_ref().map(|p| p.size())},
            });
            std::fs::write(path, serde_json::to_vec(&doc)?)
                .map_err(|e| anyhow::anyhow!("writing the trace {}: {e}", path.display()))?;
        }
        Ok(())
    }

    fn summary(&self, t: &Tally) -> Vec<String> {
        let mut out = vec![format!(
            "fhsx: {} actions in {}: {} built, {} cached, {} failed, {} unbuilt, {} not started (-j{})",
            self.names.len(),
            clock(self.started.elapsed()),
            t.built,
            t.cached,
            t.failed.len(),
            t.unbuilt.len(),
            self.names.len() - t.done - t.unbuilt.len(),
            self.jobs
        )];
        for &f in &t.failed {
            let left: Vec<&str> = t
                .unbuilt
                .iter()
                .filter(|(_, because)| *because == f)
                .map(|(n, _)| self.names[*n].as_str())
                .collect();
            if !left.is_empty() {
                out.push(format!(
                    "fhsx:   {} left unbuilt: {}",
                    self.names[f],
                    left.join(", ")
                ));
            }
        }
        let path = self.critical_path(t);
        if path.len() > 1 {
            out.push("fhsx: critical path (queued, then running):".into());
            for i in path {
                let ti = t.times[i];
                let (Some(ready), Some(start), Some(end)) = (ti.ready, ti.start, ti.end) else {
                    continue;
                };
                out.push(format!(
                    "fhsx:   {:>8} {:>8}  {}",
                    clock(start - ready),
                    clock(end - start),
                    self.names[i]
                ));
            }
        }
        out
    }

    /// From the action that ended last (the root, when it ran) back to a
    /// leaf, each step the dependency that ended last: the one it waited
    /// for.
    fn critical_path(&self, t: &Tally) -> Vec<usize> {
        let ended = |i: usize| t.times[i].start.and(t.times[i].end);
        let Some(mut at) = (0..t.times.len())
            .filter(|&i| ended(i).is_some())
            .max_by_key(|&i| ended(i))
        else {
            return Vec::new();
        };
        let mut path = vec![at];
        while let Some(prev) = self.deps[at]
            .iter()
            .copied()
            .filter(|&j| ended(j).is_some())
            .max_by_key(|&j| ended(j))
        {
            path.push(prev);
            at = prev;
        }
        path.reverse();
        path
    }

    /// What a failure's line says: how it failed and where its log is.
    fn failure_text(&self, end: &End<Built, anyhow::Error>) -> (String, Option<String>) {
        match end {
            End::Failed(b) => {
                let rec = &b.outcome.record.record;
                (
                    crate::cmd::build::how_it_failed(rec),
                    Some(b.log_path.display().to_string()),
                )
            }
            End::Error(e) => (format!("{:#}", e), None),
            End::Panicked(m) => (format!("fhsx panicked building it: {m}"), None),
            _ => (String::new(), None),
        }
    }
}

/// `1.2s`, `3m04s`, `1h02m`.
pub fn clock(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1}s")
    } else if s < 3600.0 {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    } else {
        format!(
            "{}h{:02}m",
            (s / 3600.0) as u64,
            ((s % 3600.0) / 60.0) as u64
        )
    }
}

impl Watch<Built, anyhow::Error> for GraphWatch {
    fn ready(&self, node: usize) {
        let now = Instant::now();
        self.tally().times[node].ready = Some(now);
        self.event(json!({"event": "queued", "action": self.names[node], "time": self.secs(now)}));
    }

    fn started(&self, node: usize, slot: usize) {
        let now = Instant::now();
        {
            let mut t = self.tally();
            t.times[node].start = Some(now);
            t.times[node].slot = Some(slot);
            t.running.insert(node, slot);
        }
        self.event(json!({
            "event": "started", "action": self.names[node], "slot": slot, "time": self.secs(now),
        }));
    }

    fn ended(&self, node: usize, slot: Option<usize>, end: &End<Built, anyhow::Error>) {
        let now = Instant::now();
        let mut t = self.tally();
        t.running.remove(&node);
        t.times[node].end = Some(now);
        let ran = t.times[node].start.map_or(Duration::ZERO, |s| now - s);
        let name = &self.names[node];
        let (event, line) = match end {
            End::Made(b) if b.outcome.cached => {
                t.cached += 1;
                let v = json!({"event": "cached", "action": name, "time": self.secs(now),
                    "record": b.outcome.record_digest, "outputs": b.outcome.record.record.outputs,
                    "source": crate::cmd::build::source(&b.outcome), "remote_cache": b.outcome.remote});
                let from = match &b.outcome.remote {
                    Some(cache) => format!(" (from {cache})"),
                    None => String::new(),
                };
                (v, format!("cached   {name}{from}"))
            }
            End::Made(b) => {
                t.built += 1;
                let reused = b.outcome.record.record.reused.is_some();
                let v = json!({"event": "finished", "action": name, "time": self.secs(now),
                    "slot": slot, "seconds": ran.as_secs_f64(), "record": b.outcome.record_digest,
                    "outputs": b.outcome.record.record.outputs, "validated": reused});
                let how = if reused { "validated" } else { "built   " };
                (v, format!("{how} {name} in {}", clock(ran)))
            }
            End::Failed(_) | End::Error(_) | End::Panicked(_) => {
                t.failed.push(node);
                let (how, log) = self.failure_text(end);
                let record = match end {
                    End::Failed(b) => Some(b.outcome.record_digest.to_string()),
                    _ => None,
                };
                let v = json!({"event": "failed", "action": name, "time": self.secs(now),
                    "slot": slot, "seconds": ran.as_secs_f64(), "record": record, "log": log,
                    "error": how});
                let mut line = format!("FAILED   {name} ({how})");
                if let Some(l) = log {
                    let _ = write!(line, "; its log: {l}");
                }
                (v, line)
            }
            End::Unbuilt { because } => {
                t.unbuilt.push((node, *because));
                let v = json!({"event": "unbuilt", "action": name, "time": self.secs(now),
                    "because": self.names[*because]});
                (v, String::new())
            }
            End::NotStarted => (Value::Null, String::new()),
        };
        if !matches!(end, End::Unbuilt { .. } | End::NotStarted) {
            t.done += 1;
        }
        let first_failure = !t.failed.is_empty() && !t.said_waiting && !self.keep_going;
        if first_failure {
            t.said_waiting = true;
        }
        if self.shown.trace {
            if let (Some(start), Some(slot)) = (t.times[node].start, slot) {
                let cat = match end {
                    End::Made(b) if b.outcome.cached => "cached",
                    End::Made(_) => "built",
                    _ => "failed",
                };
                let queued = t.times[node]
                    .ready
                    .map_or(0.0, |r| (start - r).as_secs_f64() * 1e3);
                let v = json!({
                    "name": name, "cat": cat, "ph": "X", "pid": 1, "tid": slot + 1,
                    "ts": self.micros(start), "dur": ran.as_micros() as u64,
                    "args": {"queued_ms": queued},
                });
                t.trace.push(v);
            }
        }
        let running = t.running.len();
        drop(t);
        if !event.is_null() {
            self.event(event);
        }
        if self.shown.lines && !line.is_empty() {
            let done = self.tally().done;
            self.say(&format!("fhsx: [{done}/{}] {line}", self.names.len()));
        }
        if first_failure && running > 0 {
            self.say(&format!(
                "fhsx: a build failed: nothing new starts; waiting for the {running} running action(s) to finish (their results are kept; --keep-going builds all that can be)"
            ));
        }
    }
}
