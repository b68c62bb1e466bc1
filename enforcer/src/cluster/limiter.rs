//! One client-side rate limiter for every API-server request the node makes: client-go's
//! token bucket (`flowcontrol.NewTokenBucketRateLimiter(kubeAPIQPS, kubeAPIBurst)`: starts
//! full with `burst` tokens, refills `qps` per second, a request waits for a token), with one
//! addition: [`Priority::Lease`] requests go before every waiting [`Priority::Normal`] one, so
//! a burst of pod-status writes never delays the node lease (kubelet gives its lease client a
//! client of its own for the same reason).
//!
//! Time is tokio's clock (paused in tests).

use std::{
    sync::{Arc, Mutex, MutexGuard},
    time::Duration,
};

use k8s_openapi::api::{
    coordination::v1::Lease,
    core::v1::{Event, Node, Pod},
};
use tokio::time::Instant;

use super::{ClusterApi, ClusterError};

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
        crate::locks::lock(&self.bucket)
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
            return Err(until_one());
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

/// A [`ClusterApi`] behind the limiter: node and lease requests with [`Priority::Lease`],
/// pod requests with [`Priority::Normal`]; events pass (their writer applies
/// `eventRecordQPS`, as kubelet gives events a client of their own).
#[derive(Debug)]
pub struct Limited<A> {
    inner: A,
    limiter: Arc<Limiter>,
}

impl<A> Limited<A> {
    #[must_use]
    pub fn new(inner: A, limiter: Arc<Limiter>) -> Self {
        Self { inner, limiter }
    }
}

impl<A: ClusterApi> ClusterApi for Limited<A> {
    async fn get_node(&self, name: &str) -> Result<Option<Node>, ClusterError> {
        self.limiter.acquire(Priority::Lease).await;
        self.inner.get_node(name).await
    }

    async fn create_node(&self, node: &Node) -> Result<Node, ClusterError> {
        self.limiter.acquire(Priority::Lease).await;
        self.inner.create_node(node).await
    }

    async fn patch_node(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Node, ClusterError> {
        self.limiter.acquire(Priority::Lease).await;
        self.inner.patch_node(name, patch).await
    }

    async fn patch_node_status(
        &self,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Node, ClusterError> {
        self.limiter.acquire(Priority::Lease).await;
        self.inner.patch_node_status(name, patch).await
    }

    async fn get_lease(&self, namespace: &str, name: &str) -> Result<Option<Lease>, ClusterError> {
        self.limiter.acquire(Priority::Lease).await;
        self.inner.get_lease(namespace, name).await
    }

    async fn create_lease(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        self.limiter.acquire(Priority::Lease).await;
        self.inner.create_lease(lease).await
    }

    async fn replace_lease(&self, lease: &Lease) -> Result<Lease, ClusterError> {
        self.limiter.acquire(Priority::Lease).await;
        self.inner.replace_lease(lease).await
    }

    async fn get_pod(&self, namespace: &str, name: &str) -> Result<Option<Pod>, ClusterError> {
        self.limiter.acquire(Priority::Normal).await;
        self.inner.get_pod(namespace, name).await
    }

    async fn create_pod(&self, pod: &Pod) -> Result<Pod, ClusterError> {
        self.limiter.acquire(Priority::Normal).await;
        self.inner.create_pod(pod).await
    }

    async fn patch_pod_status(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Pod, ClusterError> {
        self.limiter.acquire(Priority::Normal).await;
        self.inner.patch_pod_status(namespace, name, patch).await
    }

    async fn delete_pod(&self, namespace: &str, name: &str, uid: &str) -> Result<(), ClusterError> {
        self.limiter.acquire(Priority::Normal).await;
        self.inner.delete_pod(namespace, name, uid).await
    }

    async fn create_event(&self, event: &Event) -> Result<Event, ClusterError> {
        self.inner.create_event(event).await
    }

    async fn patch_event(
        &self,
        namespace: &str,
        name: &str,
        patch: &serde_json::Value,
    ) -> Result<Event, ClusterError> {
        self.inner.patch_event(namespace, name, patch).await
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

    /// Through the API: with `kubeAPIQPS: 1, kubeAPIBurst: 1` the pod status writer's
    /// requests (a GET and a PUT per pod) go out 1 s apart.
    #[tokio::test(start_paused = true)]
    async fn pod_status_writes_are_spaced_by_the_limit() {
        use crate::cluster::fake::FakeApi;
        let fake = Arc::new(FakeApi::default());
        for uid in ["u1", "u2"] {
            fake.add_pod(
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": uid, "namespace": "default", "uid": uid, "resourceVersion": "1"},
                    "spec": {"containers": [{"name": "app"}]}
                }))
                .expect("pod"),
            );
        }
        let api = Arc::new(Limited::new(
            FakeApi::clone_of(&fake),
            Arc::new(Limiter::new(1, 1)),
        ));
        let status = crate::status_manager::StatusManager::default();
        let task = tokio::spawn(crate::cluster::pod_status::run(
            api,
            status.clone(),
            None,
            None,
            None,
        ));
        let start = Instant::now();
        for uid in ["u1", "u2"] {
            status.set(crate::status_manager::PodRecord {
                uid: uid.to_owned(),
                name: uid.to_owned(),
                namespace: "default".to_owned(),
                source: crate::sources::apiserver::API_SOURCE.to_owned(),
                phase: crate::status_manager::PodPhase::Running,
                reason: String::new(),
                message: String::new(),
                qos_class: "BestEffort".to_owned(),
                start_time: String::new(),
                pod_ips: vec![],
                sandbox_id: String::new(),
                cgroup: String::new(),
                conditions: vec![],
                init_container_statuses: vec![],
                container_statuses: vec![],
                resources: Default::default(),
            });
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
        let at: Vec<u128> = fake
            .timed_calls()
            .into_iter()
            .map(|(t, _)| t.duration_since(start).as_millis())
            .collect();
        assert_eq!(at, [0, 1000, 2000, 3000], "GET, PUT, GET, PUT");
        task.abort();
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
