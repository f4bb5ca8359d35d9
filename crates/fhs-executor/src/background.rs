//! Work a build no longer waits for, done on a thread of its own while the
//! build goes on, and always finished before the build returns: the view's
//! superblock freed, the scratch emptied and parked. A build's result never
//! depends on it, and nothing of it outlives the build.

use std::thread::JoinHandle;

/// A job on its own thread, joined when this is dropped (or run right
/// away, should no thread start).
#[derive(Debug)]
pub(crate) struct Background(Option<JoinHandle<()>>);

impl Background {
    pub(crate) fn start(name: &str, job: impl FnOnce() + Send + 'static) -> Background {
        // The job moves into the thread; if the thread cannot start, it
        // comes back in the error's closure, so run it here instead.
        let job = std::sync::Arc::new(std::sync::Mutex::new(Some(job)));
        let theirs = job.clone();
        let spawned = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || run_once(&theirs));
        match spawned {
            Ok(t) => Background(Some(t)),
            Err(_) => {
                run_once(&job);
                Background(None)
            }
        }
    }
}

fn run_once<F: FnOnce()>(job: &std::sync::Mutex<Option<F>>) {
    let job = job.lock().unwrap_or_else(|p| p.into_inner()).take();
    if let Some(job) = job {
        job();
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        if let Some(t) = self.0.take() {
            let _ = t.join();
        }
    }
}
