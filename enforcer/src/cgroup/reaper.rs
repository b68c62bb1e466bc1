//! The reaper: `process_mrelease(2)` of a SIGKILLed pod's processes on threads of its own, as
//! Android's lmkd does, so the thread that sent the SIGKILL (the crossing thread) is free for
//! the next crossing at once instead of spending the victim's unmapping time (15-20 ms for a
//! few hundred MiB, ~60 ms per GiB) in the call.
//!
//! The pidfds are opened by the caller right after the SIGKILL (a pid reused later is not
//! touched: the kernel refuses a process that is not dying); the reaping threads each take a
//! process, so a pod of several processes is reaped on both cores, and the victims' own exits
//! run beside them.

use std::{
    os::fd::OwnedFd,
    path::Path,
    sync::{
        Arc, Mutex, OnceLock,
        atomic::{AtomicUsize, Ordering},
        mpsc,
    },
    thread::JoinHandle,
    time::{Duration, Instant},
};

use super::kill::{Outcome, Reaped, mrelease_one};

/// Told once when every process of a [`Reaper::reap`] was reaped: what was done, and when
/// the last call ended (CLOCK_MONOTONIC ns).
pub type Done = Box<dyn FnOnce(Reaped, u64) + Send>;

/// One pod's processes being reaped.
struct Batch {
    left: AtomicUsize,
    out: Mutex<Reaped>,
    done: Mutex<Option<Done>>,
    /// When the caller sent the SIGKILL (unset until it has).
    killed: OnceLock<Instant>,
}

impl Batch {
    /// Whether a process not dying yet is asked again: for [`DYING_WAIT`] after the SIGKILL
    /// was sent (spinning: it is about to be dying), and before it is sent, for at most
    /// [`KILL_WAIT`] after the hand-over (yielding: the caller, which sends it, may need this
    /// CPU on a loaded node).
    fn ask_again(&self, handed: Instant) -> bool {
        match self.killed.get() {
            Some(at) if at.elapsed() < DYING_WAIT => {
                std::hint::spin_loop();
                true
            }
            Some(_) => false,
            None if handed.elapsed() < KILL_WAIT => {
                std::thread::yield_now();
                true
            }
            None => false,
        }
    }

    /// Counts one process's outcome; the last one tells `done`.
    fn finish_one(&self, outcome: Outcome) {
        if let Ok(mut out) = self.out.lock() {
            out.count(outcome);
        }
        if self.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let end = monotonic_ns();
            let out = self.out.lock().map(|o| o.clone()).unwrap_or_default();
            if let Some(done) = self.done.lock().ok().and_then(|mut d| d.take()) {
                done(out, end);
            }
        }
    }
}

struct Job {
    fd: OwnedFd,
    /// Its pid (the process's while it exits: its parent cannot reap it before).
    pid: rustix::process::Pid,
    batch: Arc<Batch>,
    /// When it was handed to the reaping threads (just before the SIGKILL).
    handed: Instant,
}

/// Threads that reap SIGKILLed processes' memory ([`Self::reap`]); stopped and joined on drop.
pub struct Reaper {
    tx: Option<mpsc::Sender<Job>>,
    threads: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reaper")
            .field("threads", &self.threads.len())
            .finish()
    }
}

/// The reaping threads lmkd runs (and the cores this machine class has).
pub const THREADS: usize = 2;

impl Reaper {
    /// Starts `threads` reaping threads (at least one; a thread the system refuses is
    /// logged, and with none the reaping happens in [`Self::reap`]'s caller).
    #[must_use]
    pub fn start(threads: usize) -> Self {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for i in 0..threads.max(1) {
            let rx = Arc::clone(&rx);
            match std::thread::Builder::new()
                .name(format!("reaper-{i}"))
                .spawn(move || work(&rx))
            {
                Ok(h) => handles.push(h),
                Err(e) => tracing::warn!(error = %e, "a reaping thread did not start"),
            }
        }
        Self {
            tx: (!handles.is_empty()).then_some(tx),
            threads: handles,
        }
    }

    /// Opens a pidfd for every process in `dir` and below, hands them to the reaping threads,
    /// then calls `kill` (the SIGKILL) and returns what it returned: the reaping threads are
    /// awake and waiting for the processes to be dying when the SIGKILL lands, so they take
    /// the address spaces before the victims' own exits have (a victim's exit that comes first
    /// frees its memory itself). `done` is called (on a reaping thread, or here when there is
    /// nothing to reap) once each process was reaped.
    pub fn reap_around<R>(
        &self,
        dir: &Path,
        kill: impl FnOnce() -> R,
        done: impl FnOnce(Reaped, u64) + Send + 'static,
    ) -> R {
        let mut pre = Reaped::default();
        let mut fds = Vec::new();
        super::writer::for_each_process(dir, |pid| {
            match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
                Ok(fd) => fds.push((fd, pid)),
                // Exited since the listing: nothing to free.
                Err(rustix::io::Errno::SRCH) => {}
                Err(_) => pre.refused += 1,
            }
            true
        });
        let Some(tx) = self.tx.as_ref().filter(|_| !fds.is_empty()) else {
            let killed = kill();
            for (fd, _) in &fds {
                pre.count(mrelease_one(fd));
            }
            done(pre, monotonic_ns());
            return killed;
        };
        let batch = Arc::new(Batch {
            left: AtomicUsize::new(fds.len()),
            out: Mutex::new(pre),
            done: Mutex::new(Some(Box::new(done))),
            killed: OnceLock::new(),
        });
        let handed = Instant::now();
        for (fd, pid) in fds {
            let job = Job {
                fd,
                pid,
                batch: Arc::clone(&batch),
                handed,
            };
            if let Err(mpsc::SendError(job)) = tx.send(job) {
                // The threads are gone: counted as refused (the exit frees it).
                job.batch.finish_one(Outcome::Refused);
            }
        }
        let killed = kill();
        let _ = batch.killed.set(Instant::now());
        killed
    }
}

/// The nice value a victim exits at (the highest CFS weight: far ahead of ordinary work,
/// still below the real-time crossing and reaping threads).
pub const EXIT_NICE: i32 = -20;

/// How long a reaping thread waits, after the SIGKILL was sent, for a process handed to it to
/// be dying (a process the kill never reached is refused then).
const DYING_WAIT: Duration = Duration::from_millis(2);
/// How long a reaping thread waits for the caller to send the SIGKILL after the hand-over
/// (it is sent right after; a caller held off the CPU longer than this leaves the exit to
/// free the memory).
const KILL_WAIT: Duration = Duration::from_millis(100);

impl Drop for Reaper {
    fn drop(&mut self) {
        self.tx = None;
        for h in self.threads.drain(..) {
            let _ = h.join();
        }
    }
}

fn work(rx: &Mutex<mpsc::Receiver<Job>>) {
    loop {
        let job = match rx.lock() {
            Ok(rx) => rx.recv(),
            Err(_) => return,
        };
        let Ok(job) = job else {
            return;
        };
        // Its own exit runs ahead of the node's ordinary work (lmkd boosts its victims so):
        // boosted here, by a thread already running, so this thread is the first at its
        // address space and the exit unmaps beside it rather than alone.
        let _ = rustix::process::setpriority_process(Some(job.pid), EXIT_NICE);
        let outcome = loop {
            match mrelease_one(&job.fd) {
                Outcome::NotDying if job.batch.ask_again(job.handed) => {}
                other => break other,
            }
        };
        job.batch.finish_one(outcome);
    }
}

/// CLOCK_MONOTONIC in ns (the kill records' clock).
fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A killed process in a directory is reaped on a reaping thread and told once; an empty
    /// directory is told at once, from the caller.
    #[test]
    fn a_killed_process_is_reaped_off_the_callers_thread() {
        let dir = tempfile::tempdir().expect("tempdir");
        let reaper = Reaper::start(THREADS);
        let (tx, rx) = mpsc::channel();
        let caller = std::thread::current().id();
        let t = tx.clone();
        reaper.reap_around(
            dir.path(),
            || (),
            move |r, _| {
                let _ = t.send((r, std::thread::current().id()));
            },
        );
        let (r, on) = rx.recv().expect("told");
        assert_eq!((r.processes, r.refused), (0, 0));
        assert_eq!(on, caller, "nothing to reap: told here");

        // A child killed and not waited for: dying (reaped) or a zombie whose memory is gone
        // already (ESRCH); either way not refused.
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("sleep");
        std::fs::write(dir.path().join("cgroup.procs"), format!("{}\n", child.id()))
            .expect("procs");
        let killed = reaper.reap_around(
            dir.path(),
            || child.kill().is_ok(),
            move |r, _| {
                let _ = tx.send((r, std::thread::current().id()));
            },
        );
        assert!(killed, "the kill's result is returned");
        let (r, on) = rx
            .recv_timeout(std::time::Duration::from_secs(10))
            .expect("told");
        assert_ne!(on, caller, "reaped on a reaping thread");
        assert_eq!(r.refused, 0, "{r:?}");
        assert!(r.processes <= 1, "{r:?}");
        let _ = child.wait();
        drop(reaper);
    }
}
