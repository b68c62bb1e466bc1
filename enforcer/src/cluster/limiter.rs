//! One client-side rate limiter for every API-server request the node makes: client-go's
//! token bucket (`flowcontrol.NewTokenBucketRateLimiter(kubeAPIQPS, kubeAPIBurst)`: starts
//! full with `burst` tokens, refills `qps` per second, a request waits for a token), with one
//! addition: [`Priority::Lease`] requests go before every waiting [`Priority::Normal`] one, so
//! a burst of pod-status writes never delays the node lease (kubelet gives its lease client a
//! client of its own for the same reason).
//!
//! Time is tokio's clock (paused in tests).

use std::{
    sync::{Mutex, MutexGuard},
    time::Duration,
};

use tokio::time::Instant;

/// Who is asking.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Priority {
    /// The node lease (and node status): never waits behind normal writes.
    Lease,
    /// Everything else.
    Normal,
}

#[derive(Debug)]
struct Bucket {
    tokens: f64,
    last: Instant,
    /// Lease requests waiting for a token.
    lease_waiting: usize,
}

/// The token bucket; `qps == 0` disables limiting.
#[derive(Debug)]
pub struct Limiter {
    qps: f64,
    burst: f64,
    bucket: Mutex<Bucket>,
}

impl Limiter {
    /// `qps` tokens per second, at most `burst` stored (at least 1).
    #[must_use]
    pub fn new(qps: u32, burst: u32) -> Self {
        let burst = f64::from(burst.max(1));
        Self {
            qps: f64::from(qps),
            burst,
            bucket: Mutex::new(Bucket {
                tokens: burst,
                last: Instant::now(),
                lease_waiting: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Bucket> {
        match self.bucket.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        }
    }

    /// Takes a token, or says how long until one is there.
    fn try_take(&self, priority: Priority) -> Result<(), Duration> {
        let mut b = self.lock();
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(b.last).as_secs_f64();
        b.tokens = (b.tokens + elapsed * self.qps).min(self.burst);
        b.last = now;
        let until_one = || Duration::from_secs_f64(((1.0 - b.tokens) / self.qps).max(0.001));
        if priority == Priority::Normal && b.lease_waiting > 0 {
            return Err(until_one().max(Duration::from_millis(1)));
        }
        if b.tokens >= 1.0 {
            b.tokens -= 1.0;
            return Ok(());
        }
        Err(until_one())
    }

    /// Waits for a token.
    pub async fn acquire(&self, priority: Priority) {
        if self.qps <= 0.0 {
            return;
        }
        if priority == Priority::Lease {
            self.lock().lease_waiting += 1;
        }
        // Un-counts a lease waiter even if the caller is cancelled.
        struct Waiting<'a>(&'a Limiter, Priority);
        impl Drop for Waiting<'_> {
            fn drop(&mut self) {
                if self.1 == Priority::Lease {
                    let mut b = self.0.lock();
                    b.lease_waiting = b.lease_waiting.saturating_sub(1);
                }
            }
        }
        let _waiting = Waiting(self, priority);
        loop {
            match self.try_take(priority) {
                Ok(()) => return,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    /// `kubeAPIQPS: 1, kubeAPIBurst: 1`: writes go out 1 s apart.
    #[tokio::test(start_paused = true)]
    async fn qps_one_burst_one_spaces_requests_a_second_apart() {
        let limiter = Arc::new(Limiter::new(1, 1));
        let start = Instant::now();
        let mut at = Vec::new();
        for _ in 0..4 {
            limiter.acquire(Priority::Normal).await;
            at.push(start.elapsed().as_millis());
        }
        assert_eq!(at, [0, 1000, 2000, 3000]);
    }

    /// A burst goes out at once, then the rate applies.
    #[tokio::test(start_paused = true)]
    async fn burst_then_rate() {
        let limiter = Limiter::new(10, 5);
        let start = Instant::now();
        for _ in 0..5 {
            limiter.acquire(Priority::Normal).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        limiter.acquire(Priority::Normal).await;
        let ms = start.elapsed().as_millis();
        assert!((99..=101).contains(&ms), "{ms}");
    }

    /// Many pod-status writers waiting: the lease gets the next token.
    #[tokio::test(start_paused = true)]
    async fn the_lease_is_never_starved() {
        let limiter = Arc::new(Limiter::new(1, 1));
        limiter.acquire(Priority::Normal).await;
        let start = Instant::now();
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 0..20 {
            let (l, tx) = (limiter.clone(), tx.clone());
            tokio::spawn(async move {
                l.acquire(Priority::Normal).await;
                let _ = tx.send((format!("pod{i}"), start.elapsed()));
            });
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let (l, tx2) = (limiter.clone(), tx.clone());
        tokio::spawn(async move {
            l.acquire(Priority::Lease).await;
            let _ = tx2.send(("lease".to_owned(), start.elapsed()));
        });
        let (first, at) = rx.recv().await.expect("one");
        assert_eq!(first, "lease", "the lease goes first");
        assert_eq!(at, Duration::from_secs(1));
        let (_, at) = rx.recv().await.expect("two");
        assert_eq!(at, Duration::from_secs(2), "then the rate holds");
    }

    #[tokio::test(start_paused = true)]
    async fn zero_qps_is_unlimited() {
        let limiter = Limiter::new(0, 0);
        let start = Instant::now();
        for _ in 0..100 {
            limiter.acquire(Priority::Normal).await;
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
    }
}
