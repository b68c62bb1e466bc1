//! What `/healthz` reports: not only that the process answers, but that the parts the node
//! relies on work. Each part sets its own flag; the page lists every failing check.
//!
//! The loops that must keep running (the signal readers and the eviction manager) carry a
//! [`Heartbeat`]: a "last alive" stamp each bumps on every iteration, so a loop that hangs
//! (a read that never returns, a step that never ends) is reported, not only one that ended.

use std::{
    sync::{
        Arc, LazyLock, Mutex,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

const RUNTIME_UNUSED: u8 = 0;
const RUNTIME_OK: u8 = 1;
const RUNTIME_DOWN: u8 = 2;

/// A heartbeat older than this many of its periods is a stall...
pub const STALL_PERIODS: u32 = 3;
/// ...and never one younger than this (a loaded node delays a loop by seconds, not half a
/// minute).
pub const STALL_FLOOR: Duration = Duration::from_secs(30);

/// The process-wide origin of the heartbeat stamps.
static EPOCH: LazyLock<Instant> = LazyLock::new(Instant::now);

/// Milliseconds since [`EPOCH`] (the heartbeats' clock).
fn now_ms() -> u64 {
    u64::try_from(EPOCH.elapsed().as_millis()).unwrap_or(u64::MAX)
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A loop's "last alive" stamp: one relaxed atomic store per iteration. The loop must
/// iterate at least every `period`, also when it has nothing to do (a reader waiting for
/// events waits with a timeout); it is reported stalled once its stamp is older than
/// [`Heartbeat::stall_after`].
#[derive(Debug)]
pub struct Heartbeat {
    /// The `/healthz` check it belongs to (`signals`, `eviction`).
    check: &'static str,
    /// What the loop is, as the failure names it.
    component: String,
    period: Duration,
    /// [`now_ms`] at the last beat.
    last_ms: AtomicU64,
}

impl Heartbeat {
    /// A heartbeat stamped now.
    #[must_use]
    pub fn new(check: &'static str, component: impl Into<String>, period: Duration) -> Arc<Self> {
        Arc::new(Self {
            check,
            component: component.into(),
            period,
            last_ms: AtomicU64::new(now_ms()),
        })
    }

    /// The loop is alive.
    pub fn beat(&self) {
        self.beat_at(now_ms());
    }

    fn beat_at(&self, ms: u64) {
        self.last_ms.store(ms, Ordering::Relaxed);
    }

    /// When it last beat (ms on the heartbeat clock).
    #[cfg(test)]
    #[must_use]
    pub(crate) fn last_ms(&self) -> u64 {
        self.last_ms.load(Ordering::Relaxed)
    }

    /// The component's name.
    #[must_use]
    pub fn component(&self) -> &str {
        &self.component
    }

    /// How old the stamp may get: [`STALL_PERIODS`] periods, at least [`STALL_FLOOR`].
    #[must_use]
    pub fn stall_after(&self) -> Duration {
        self.period.saturating_mul(STALL_PERIODS).max(STALL_FLOOR)
    }

    /// The failure line when the stamp is older than [`Self::stall_after`] at `now` (ms on
    /// the heartbeat clock).
    fn stalled_at(&self, now: u64) -> Option<String> {
        let since = now.saturating_sub(self.last_ms.load(Ordering::Relaxed));
        let limit = millis(self.stall_after());
        (since > limit).then(|| {
            format!(
                "{}: the {} has stalled: no sign of life for {:.1} s (it runs every {} ms; unhealthy after {} s)",
                self.check,
                self.component,
                Duration::from_millis(since).as_secs_f64(),
                self.period.as_millis(),
                limit / 1000,
            )
        })
    }
}

/// The daemon's health, shared by the parts that report it and the HTTP page.
#[derive(Debug)]
pub struct Health {
    /// The eviction manager's heartbeat, once the daemon expects steps.
    eviction: Mutex<Option<Arc<Heartbeat>>>,
    /// The signal readers' heartbeats.
    readers: Mutex<Vec<Arc<Heartbeat>>>,
    pipeline_ok: AtomicBool,
    runtime: AtomicU8,
    state_error: Mutex<Option<String>>,
    /// The daemon finished starting (its servers, signals and pod sources are up).
    started: AtomicBool,
    /// Why the daemon is not ready, by check (`apiserver`, ...): it runs, but something it
    /// needs is missing (`/readyz` lists them; `/healthz` is about being alive).
    not_ready: Mutex<std::collections::BTreeMap<&'static str, String>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            eviction: Mutex::new(None),
            readers: Mutex::new(Vec::new()),
            pipeline_ok: AtomicBool::new(true),
            runtime: AtomicU8::new(RUNTIME_UNUSED),
            state_error: Mutex::new(None),
            started: AtomicBool::new(false),
            not_ready: Mutex::new(std::collections::BTreeMap::new()),
        }
    }
}

fn locked<T, R>(m: &Mutex<T>, f: impl FnOnce(&mut T) -> R) -> R {
    f(&mut crate::locks::lock(m))
}

impl Health {
    /// The eviction manager completes a step at least every `period` (its housekeeping
    /// interval) from now on; a step not completed within [`Heartbeat::stall_after`] is a
    /// stall.
    pub fn expect_steps_every(&self, period: Duration) {
        locked(&self.eviction, |e| {
            *e = Some(Heartbeat::new("eviction", "eviction manager", period));
        });
    }

    /// The eviction manager is alive (it beats on every wakeup of its loop).
    pub fn step_done(&self) {
        locked(&self.eviction, |e| {
            if let Some(h) = e {
                h.beat();
            }
        });
    }

    /// Watches the signal readers' heartbeats (those of a [`crate::kernel::Pipeline`]).
    pub fn watch_readers(&self, beats: &[Arc<Heartbeat>]) {
        locked(&self.readers, |r| r.extend(beats.iter().cloned()));
    }

    /// The signal pipeline ended (or runs again).
    pub fn set_pipeline(&self, ok: bool) {
        self.pipeline_ok.store(ok, Ordering::Relaxed);
    }

    /// Whether the container runtime answered the last relist; returns whether that changed.
    pub fn set_runtime(&self, ok: bool) -> bool {
        let new = if ok { RUNTIME_OK } else { RUNTIME_DOWN };
        self.runtime.swap(new, Ordering::Relaxed) != new
    }

    /// Whether the container runtime did not answer the last relist.
    #[must_use]
    pub fn runtime_down(&self) -> bool {
        self.runtime.load(Ordering::Relaxed) == RUNTIME_DOWN
    }

    /// The last attempt to write the state directory: `None` when it worked.
    pub fn set_state(&self, error: Option<String>) {
        locked(&self.state_error, |s| *s = error);
    }

    /// The daemon finished starting.
    pub fn set_started(&self) {
        self.started.store(true, Ordering::Relaxed);
    }

    /// `check` is not ready for `why` (`None`: it is again).
    pub fn set_not_ready(&self, check: &'static str, why: Option<String>) {
        locked(&self.not_ready, |m| match why {
            Some(w) => {
                m.insert(check, w);
            }
            None => {
                m.remove(check);
            }
        });
    }

    /// Why the daemon is not ready (empty: ready): every failing health check, `starting`
    /// until it finished starting, and each named missing dependency (an unreachable API
    /// server, ...).
    #[must_use]
    pub fn not_ready(&self) -> Vec<String> {
        let mut out = self.failures();
        if !self.started.load(Ordering::Relaxed) {
            out.push("starting: the daemon has not finished starting".to_owned());
        }
        locked(&self.not_ready, |m| {
            out.extend(m.iter().map(|(check, why)| format!("{check}: {why}")));
        });
        out
    }

    /// Every failing check, named (empty: healthy).
    #[must_use]
    pub fn failures(&self) -> Vec<String> {
        self.failures_at(now_ms())
    }

    /// [`Self::failures`] at `now` (ms on the heartbeat clock).
    fn failures_at(&self, now: u64) -> Vec<String> {
        let mut out = Vec::new();
        if !self.pipeline_ok.load(Ordering::Relaxed) {
            out.push("signals: the signal pipeline stopped".to_owned());
        }
        locked(&self.readers, |r| {
            out.extend(r.iter().filter_map(|h| h.stalled_at(now)));
        });
        locked(&self.eviction, |e| {
            out.extend(e.as_ref().and_then(|h| h.stalled_at(now)));
        });
        if self.runtime.load(Ordering::Relaxed) == RUNTIME_DOWN {
            out.push("runtime: the container runtime is unreachable".to_owned());
        }
        if let Some(e) = locked(&self.state_error, |s| s.clone()) {
            out.push(format!("state: {e}"));
        }
        out
    }
}

/// Whether `dir` can be written: creates it if missing and writes, syncs and removes a probe
/// file. The error names the directory.
pub fn probe_writable(dir: &std::path::Path) -> Result<(), HealthError> {
    let probe = dir.join(".enforcer-write-probe");
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&probe, b"probe"))
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|source| HealthError::NotWritable {
            dir: dir.to_path_buf(),
            source,
        })
}

/// Errors of the health module.
#[derive(Debug, thiserror::Error)]
pub enum HealthError {
    /// The state directory cannot be written.
    #[error("state directory {} is not writable: {source}", .dir.display())]
    NotWritable {
        dir: std::path::PathBuf,
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {

    #[test]
    fn readiness_waits_for_the_start_and_names_what_is_missing() {
        let h = Health::default();
        assert!(h.failures().is_empty(), "alive from the start");
        assert_eq!(
            h.not_ready(),
            ["starting: the daemon has not finished starting"]
        );
        h.set_started();
        assert!(h.not_ready().is_empty());
        h.set_not_ready(
            "apiserver",
            Some("https://10.0.0.1:6443: connection refused".into()),
        );
        assert_eq!(
            h.not_ready(),
            ["apiserver: https://10.0.0.1:6443: connection refused"]
        );
        assert!(h.failures().is_empty(), "not ready is not unhealthy");
        h.set_not_ready("apiserver", None);
        assert!(h.not_ready().is_empty());
    }

    use super::*;

    #[test]
    fn each_check_is_named() {
        let h = Health::default();
        assert!(h.failures().is_empty());
        h.set_pipeline(false);
        assert!(h.set_runtime(false));
        assert!(!h.set_runtime(false), "no change the second time");
        h.set_state(Some("state directory /x is not writable".to_owned()));
        h.expect_steps_every(Duration::from_secs(10));
        let reader = Heartbeat::new("signals", "eBPF ring-buffer reader", Duration::from_secs(1));
        h.watch_readers(std::slice::from_ref(&reader));
        let now = now_ms();
        let f = h.failures_at(now + 31_000);
        assert_eq!(f.len(), 5, "{f:?}");
        assert!(f[0].starts_with("signals: the signal pipeline"), "{f:?}");
        assert!(f[1].starts_with("signals: the eBPF ring-buffer reader"));
        assert!(f[2].starts_with("eviction:") && f[3].starts_with("runtime:"));
        assert!(f[4].starts_with("state:"));
        h.set_pipeline(true);
        assert!(h.set_runtime(true));
        h.set_state(None);
        h.step_done();
        reader.beat();
        assert!(h.failures().is_empty(), "{:?}", h.failures());
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(probe_writable(dir.path()).is_ok());
        let err = probe_writable(std::path::Path::new("/proc/enforcer-no"))
            .expect_err("ro")
            .to_string();
        assert!(err.contains("/proc/enforcer-no"), "{err}");
    }

    /// A heartbeat is stale after 3 periods, never before 30 s; the failure names the
    /// component and how long it has been silent.
    #[test]
    fn a_stale_heartbeat_is_a_stall_named_with_its_age() {
        let h = Health::default();
        let fast = Heartbeat::new("signals", "PSI notifier", Duration::from_millis(200));
        let slow = Heartbeat::new("eviction", "eviction manager", Duration::from_secs(20));
        assert_eq!(fast.stall_after(), STALL_FLOOR);
        assert_eq!(slow.stall_after(), Duration::from_secs(60));
        fast.beat_at(1_000);
        slow.beat_at(1_000);
        h.watch_readers(&[fast.clone(), slow.clone()]);
        assert!(h.failures_at(1_000).is_empty());
        assert!(h.failures_at(31_000).is_empty(), "exactly at the limit");
        assert_eq!(
            h.failures_at(46_500),
            [
                "signals: the PSI notifier has stalled: no sign of life for 45.5 s \
                 (it runs every 200 ms; unhealthy after 30 s)"
            ]
        );
        let both = h.failures_at(62_000);
        assert_eq!(both.len(), 2, "{both:?}");
        assert!(
            both[1].starts_with(
                "eviction: the eviction manager has stalled: no sign of life for 61.0 s"
            ),
            "{both:?}"
        );
        // A beat clears it.
        fast.beat_at(61_000);
        slow.beat_at(61_000);
        assert!(h.failures_at(62_000).is_empty());
        // A clock that went backwards is no stall.
        assert!(h.failures_at(0).is_empty());
    }

    /// The eviction manager is checked only once the daemon expects steps; each step (or
    /// wakeup) renews it.
    #[test]
    fn eviction_steps_are_expected_once_asked() {
        let h = Health::default();
        h.step_done();
        assert!(h.failures_at(u64::MAX).is_empty(), "not expected yet");
        h.expect_steps_every(Duration::from_secs(10));
        let now = now_ms();
        assert!(h.failures_at(now + 29_000).is_empty());
        assert_eq!(h.failures_at(now + 40_000).len(), 1);
        std::thread::sleep(Duration::from_millis(5));
        h.step_done();
        assert!(
            h.failures_at(now + 30_004).is_empty(),
            "renewed by the step"
        );
    }
}
