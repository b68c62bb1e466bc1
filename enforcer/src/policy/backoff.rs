//! kubelet's crash-loop and image-pull backoff (`flowcontrol.Backoff`): the first failure
//! restarts at once, then 10 s, doubling to 300 s; an entry untouched for twice the maximum
//! (10 minutes) starts over. Time is a parameter.
//!
//! [`exponential`]: the retry delay curve of the API-server writers and the CRI reconnection.

use std::{collections::HashMap, time::Duration};

use tokio::time::Instant;

/// kubelet's initial container restart backoff.
pub const INITIAL: Duration = Duration::from_secs(10);
/// kubelet's maximum container restart backoff.
pub const MAX: Duration = Duration::from_secs(300);

/// The delay after the `failures`-th failure in a row: `initial`, doubling per failure, at
/// most `max` (the first failure, and `failures == 0`, wait `initial`).
#[must_use]
pub fn exponential(initial: Duration, max: Duration, failures: u32) -> Duration {
    // 2^31 is past any cap worth having; the clamp keeps the shift in range.
    let doublings = failures.saturating_sub(1).min(31);
    initial.saturating_mul(1 << doublings).min(max)
}

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

    /// `IsInBackOffSinceUpdate`: whether the last recorded failure's delay has not passed at
    /// `now` (image pulls: the pull is not retried before then).
    #[must_use]
    pub fn in_backoff_since_update(&self, key: &str, now: Instant) -> bool {
        self.entries.get(key).is_some_and(|e| {
            !self.expired(e, now) && now.saturating_duration_since(e.last_update) < e.backoff
        })
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

    #[test]
    fn exponential_doubles_to_the_cap() {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        let curve = |initial: u64, max: u64, failures: std::ops::RangeInclusive<u32>| {
            failures
                .map(|f| {
                    ms(exponential(
                        Duration::from_millis(initial),
                        Duration::from_millis(max),
                        f,
                    ))
                })
                .collect::<Vec<_>>()
        };
        assert_eq!(
            curve(200, 7000, 0..=8),
            [200, 200, 400, 800, 1600, 3200, 6400, 7000, 7000]
        );
        assert_eq!(
            curve(100, 5000, 1..=8),
            [100, 200, 400, 800, 1600, 3200, 5000, 5000]
        );
        // No overflow however long the outage.
        let huge = exponential(Duration::from_secs(1), Duration::from_secs(60), u32::MAX);
        assert_eq!(huge, Duration::from_secs(60));
        let uncapped = exponential(Duration::from_secs(1), Duration::MAX, u32::MAX);
        assert_eq!(uncapped, Duration::from_secs(1 << 31));
    }

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

    /// Image pulls: ErrImagePull, then ImagePullBackOff for 10 s, then a retry; each failure
    /// doubles the wait up to 300 s (image_manager_test.go's backoff case).
    #[tokio::test(start_paused = true)]
    async fn image_pull_schedule() {
        let mut b = Backoff::default();
        let t0 = Instant::now();
        assert!(!b.in_backoff_since_update("p_img", t0));
        b.next("p_img", t0);
        assert!(b.in_backoff_since_update("p_img", t0 + Duration::from_secs(9)));
        assert!(!b.in_backoff_since_update("p_img", t0 + INITIAL));
        let t1 = t0 + INITIAL;
        b.next("p_img", t1);
        assert!(b.in_backoff_since_update("p_img", t1 + Duration::from_secs(19)));
        assert!(!b.in_backoff_since_update("p_img", t1 + Duration::from_secs(20)));
        assert!(!b.in_backoff_since_update("other", t1));
    }
}
