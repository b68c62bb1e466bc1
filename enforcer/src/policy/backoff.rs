//! kubelet's crash-loop and image-pull backoff (`flowcontrol.Backoff`): the first failure
//! restarts at once, then 10 s, doubling to 300 s; an entry untouched for twice the maximum
//! (10 minutes) starts over. Time is a parameter.

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

/// kubelet's initial container restart backoff.
pub const INITIAL: Duration = Duration::from_secs(10);
/// kubelet's maximum container restart backoff.
pub const MAX: Duration = Duration::from_secs(300);

#[derive(Clone, Copy, Debug)]
struct Entry {
    backoff: Duration,
    last_update: Instant,
}

/// Backoff entries by key (pod uid / container name / container hash, or image).
#[derive(Clone, Debug)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    entries: HashMap<String, Entry>,
}

impl Default for Backoff {
    fn default() -> Self {
        Self::new(INITIAL, MAX)
    }
}

impl Backoff {
    #[must_use]
    pub fn new(initial: Duration, max: Duration) -> Self {
        Self {
            initial,
            max,
            entries: HashMap::new(),
        }
    }

    fn expired(&self, e: &Entry, now: Instant) -> bool {
        now.saturating_duration_since(e.last_update) > self.max * 2
    }

    /// `IsInBackOffSince`: when the failure seen at `event` may be retried, if not yet.
    #[must_use]
    pub fn retry_at(&self, key: &str, event: Instant, now: Instant) -> Option<Instant> {
        let e = self.entries.get(key)?;
        if self.expired(e, now) {
            return None;
        }
        let at = event + e.backoff;
        (now < at).then_some(at)
    }

    /// `Next`: records a retry now; the next failure waits twice as long (up to the max).
    pub fn next(&mut self, key: &str, now: Instant) {
        let initial = self.initial;
        let max = self.max;
        match self.entries.get(key).copied() {
            Some(e) if !self.expired(&e, now) => {
                self.entries.insert(
                    key.to_owned(),
                    Entry {
                        backoff: (e.backoff * 2).min(max),
                        last_update: now,
                    },
                );
            }
            _ => {
                self.entries.insert(
                    key.to_owned(),
                    Entry {
                        backoff: initial,
                        last_update: now,
                    },
                );
            }
        }
    }

    /// The current delay for a key (for status messages).
    #[must_use]
    pub fn current(&self, key: &str) -> Option<Duration> {
        self.entries.get(key).map(|e| e.backoff)
    }

    /// Forgets keys that start with `prefix`.
    pub fn forget_prefix(&mut self, prefix: &str) {
        self.entries.retain(|k, _| !k.starts_with(prefix));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn crash_loop_schedule() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        // First crash: no entry, restart at once.
        assert_eq!(b.retry_at("k", t0, t0), None);
        b.next("k", t0);
        // Second crash right away: wait 10 s from the exit.
        let exit = t0 + Duration::from_secs(1);
        assert_eq!(b.retry_at("k", exit, exit), Some(exit + INITIAL));
        let t = exit + INITIAL;
        assert_eq!(b.retry_at("k", exit, t), None);
        b.next("k", t);
        assert_eq!(b.current("k"), Some(Duration::from_secs(20)));
        let mut now = t;
        for want in [40, 80, 160, 300, 300] {
            now += Duration::from_secs(1);
            b.next("k", now);
            assert_eq!(b.current("k"), Some(Duration::from_secs(want)));
        }
        // Ten quiet minutes (twice the max) reset it.
        let later = now + Duration::from_secs(601);
        assert_eq!(b.retry_at("k", later, later), None);
        b.next("k", later);
        assert_eq!(b.current("k"), Some(INITIAL));
    }
}
