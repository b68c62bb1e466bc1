//! How many pod-creating runtime operations (`RunPodSandbox`, `CreateContainer`,
//! `StartContainer`) run at once: an adaptive limit (additive increase while the runtime
//! answers fast, halved when it is slow or times out), so a burst of pods queues in the pod
//! workers instead of collapsing the runtime. Stopping and removing are never held back (an
//! eviction must not wait behind a burst of starts).

use std::{
    sync::{
        Arc,
        atomic::{AtomicUsize, Ordering},
    },
    time::Duration,
};

use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// Fewest operations in flight.
pub const MIN_IN_FLIGHT: usize = 2;
/// Most operations in flight.
pub const MAX_IN_FLIGHT: usize = 32;
/// Where the limit starts.
pub const INITIAL_IN_FLIGHT: usize = 8;
/// An answer faster than this may raise the limit by one.
pub const FAST: Duration = Duration::from_millis(500);
/// An answer slower than this (or a timeout) halves the limit.
pub const SLOW: Duration = Duration::from_secs(3);

/// The next limit after an operation that took `took` (`timed_out`: it did not answer).
#[must_use]
pub fn next_limit(limit: usize, took: Duration, timed_out: bool) -> usize {
    if timed_out || took >= SLOW {
        (limit / 2).max(MIN_IN_FLIGHT)
    } else if took <= FAST {
        (limit + 1).min(MAX_IN_FLIGHT)
    } else {
        limit
    }
}

/// The limiter: a semaphore whose size follows [`next_limit`].
#[derive(Debug)]
pub struct AdaptiveLimit {
    sem: Arc<Semaphore>,
    limit: AtomicUsize,
}

impl Default for AdaptiveLimit {
    fn default() -> Self {
        Self {
            sem: Arc::new(Semaphore::new(INITIAL_IN_FLIGHT)),
            limit: AtomicUsize::new(INITIAL_IN_FLIGHT),
        }
    }
}

impl AdaptiveLimit {
    /// The current limit.
    #[must_use]
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Waits for a slot.
    pub async fn acquire(&self) -> Option<OwnedSemaphorePermit> {
        self.sem.clone().acquire_owned().await.ok()
    }

    /// Records how an operation went and resizes the limit.
    pub fn record(&self, took: Duration, timed_out: bool) {
        let mut cur = self.limit.load(Ordering::Relaxed);
        loop {
            let next = next_limit(cur, took, timed_out);
            if next == cur {
                return;
            }
            match self
                .limit
                .compare_exchange(cur, next, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    if next > cur {
                        self.sem.add_permits(next - cur);
                    } else {
                        // Permits in use come back later; forget what is free now and the
                        // rest as it is returned (forget_permits never blocks).
                        let mut owed = cur - next;
                        owed -= self.sem.forget_permits(owed);
                        if owed > 0 {
                            let sem = self.sem.clone();
                            tokio::spawn(async move {
                                if let Ok(p) = sem
                                    .acquire_many_owned(u32::try_from(owed).unwrap_or(u32::MAX))
                                    .await
                                {
                                    p.forget();
                                }
                            });
                        }
                        tracing::info!(
                            limit = next,
                            took_ms = took.as_millis(),
                            timed_out,
                            "the runtime is slow; fewer pod starts at once"
                        );
                    }
                    return;
                }
                Err(actual) => cur = actual,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn additive_increase_multiplicative_decrease() {
        let ms = Duration::from_millis;
        for (limit, took, timed_out, want) in [
            (8, ms(100), false, 9),
            (MAX_IN_FLIGHT, ms(100), false, MAX_IN_FLIGHT),
            (8, ms(1000), false, 8),
            (8, ms(3000), false, 4),
            (8, ms(10), true, 4),
            (3, ms(5000), false, MIN_IN_FLIGHT),
            (MIN_IN_FLIGHT, ms(100), true, MIN_IN_FLIGHT),
        ] {
            assert_eq!(
                next_limit(limit, took, timed_out),
                want,
                "{limit} {took:?} {timed_out}"
            );
        }
    }

    #[tokio::test]
    async fn the_semaphore_follows_the_limit() {
        let l = AdaptiveLimit::default();
        assert_eq!(l.limit(), INITIAL_IN_FLIGHT);
        let held = l.acquire().await.expect("permit");
        l.record(Duration::ZERO, true);
        assert_eq!(l.limit(), INITIAL_IN_FLIGHT / 2);
        drop(held);
        tokio::task::yield_now().await;
        let mut permits = Vec::new();
        for _ in 0..INITIAL_IN_FLIGHT / 2 {
            permits.push(l.acquire().await.expect("permit"));
        }
        let more = tokio::time::timeout(Duration::from_millis(50), l.acquire()).await;
        assert!(more.is_err(), "no more than the limit at once");
        l.record(Duration::from_millis(1), false);
        let one = tokio::time::timeout(Duration::from_millis(50), l.acquire()).await;
        assert!(one.is_ok(), "the raised limit lets one more in");
    }
}
