//! What `/healthz` reports: not only that the process answers, but that the parts the node
//! relies on work. Each part sets its own flag; the page lists every failing check.

use std::{
    sync::{
        Mutex,
        atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering},
    },
    time::{Duration, Instant},
};

const RUNTIME_UNUSED: u8 = 0;
const RUNTIME_OK: u8 = 1;
const RUNTIME_DOWN: u8 = 2;

/// The daemon's health, shared by the parts that report it and the HTTP page.
#[derive(Debug)]
pub struct Health {
    start: Instant,
    /// Milliseconds since `start` when the eviction manager last completed a step.
    last_step_ms: AtomicU64,
    /// A step is due at least this often (twice the housekeeping interval); 0: not checked.
    step_budget_ms: AtomicU64,
    pipeline_ok: AtomicBool,
    runtime: AtomicU8,
    state_error: Mutex<Option<String>>,
}

impl Default for Health {
    fn default() -> Self {
        Self {
            start: Instant::now(),
            last_step_ms: AtomicU64::new(0),
            step_budget_ms: AtomicU64::new(0),
            pipeline_ok: AtomicBool::new(true),
            runtime: AtomicU8::new(RUNTIME_UNUSED),
            state_error: Mutex::new(None),
        }
    }
}

impl Health {
    fn now_ms(&self) -> u64 {
        u64::try_from(self.start.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    /// The eviction manager must complete a step at least every `budget` (from now on).
    pub fn expect_steps_within(&self, budget: Duration) {
        self.last_step_ms.store(self.now_ms(), Ordering::Relaxed);
        self.step_budget_ms.store(
            u64::try_from(budget.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The eviction manager completed a step.
    pub fn step_done(&self) {
        self.last_step_ms.store(self.now_ms(), Ordering::Relaxed);
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
        match self.state_error.lock() {
            Ok(mut g) => *g = error,
            Err(p) => *p.into_inner() = error,
        }
    }

    /// Every failing check, named (empty: healthy).
    #[must_use]
    pub fn failures(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.pipeline_ok.load(Ordering::Relaxed) {
            out.push("signals: the signal pipeline stopped".to_owned());
        }
        let budget = self.step_budget_ms.load(Ordering::Relaxed);
        let since = self
            .now_ms()
            .saturating_sub(self.last_step_ms.load(Ordering::Relaxed));
        if budget > 0 && since > budget {
            out.push(format!(
                "eviction: no eviction-manager step for {since} ms (expected within {budget} ms)"
            ));
        }
        if self.runtime.load(Ordering::Relaxed) == RUNTIME_DOWN {
            out.push("runtime: the container runtime is unreachable".to_owned());
        }
        let state = match self.state_error.lock() {
            Ok(g) => g.clone(),
            Err(p) => p.into_inner().clone(),
        };
        if let Some(e) = state {
            out.push(format!("state: {e}"));
        }
        out
    }
}

/// Whether `dir` can be written: creates it if missing and writes, syncs and removes a probe
/// file. The error names the directory.
pub fn probe_writable(dir: &std::path::Path) -> Result<(), String> {
    let probe = dir.join(".enforcer-write-probe");
    std::fs::create_dir_all(dir)
        .and_then(|()| std::fs::write(&probe, b"probe"))
        .and_then(|()| std::fs::remove_file(&probe))
        .map_err(|e| format!("state directory {} is not writable: {e}", dir.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_check_is_named() {
        let h = Health::default();
        assert!(h.failures().is_empty());
        h.set_pipeline(false);
        assert!(h.set_runtime(false));
        assert!(!h.set_runtime(false), "no change the second time");
        h.set_state(Some("state directory /x is not writable".to_owned()));
        h.expect_steps_within(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        h.step_budget_ms.store(1, Ordering::Relaxed);
        let f = h.failures();
        assert_eq!(f.len(), 4, "{f:?}");
        assert!(f[0].starts_with("signals:") && f[1].starts_with("eviction:"));
        assert!(f[2].starts_with("runtime:") && f[3].starts_with("state:"));
        h.set_pipeline(true);
        assert!(h.set_runtime(true));
        h.set_state(None);
        h.step_done();
        h.step_budget_ms.store(60_000, Ordering::Relaxed);
        assert!(h.failures().is_empty());
        let dir = tempfile::tempdir().expect("tempdir");
        assert!(probe_writable(dir.path()).is_ok());
        let err = probe_writable(std::path::Path::new("/proc/enforcer-no")).expect_err("ro");
        assert!(err.contains("/proc/enforcer-no"), "{err}");
    }
}
