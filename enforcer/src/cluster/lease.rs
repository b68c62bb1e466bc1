//! The node lease (component-helpers' `lease/controller.go` as kubelet's `nodelease` runs it):
//! a `coordination.k8s.io/v1` Lease named after the node in `kube-node-lease`, holder the
//! node, `leaseDurationSeconds` `nodeLeaseDurationSeconds` (40), owned by the Node object,
//! `renewTime` renewed every quarter of the duration (10 s). A failed renewal is retried with
//! backoff (200 ms doubling to 7 s); a renewal that conflicts reads the lease again.

use std::{sync::Arc, time::Duration};

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, OwnerReference},
};

use super::{ClusterApi, LEASE_NAMESPACE, backoff};

/// The lease as it should be now: `base` (the API's copy, when there is one) with the holder,
/// duration, owner and `renew_time` set.
#[must_use]
pub fn renewed(
    base: Option<Lease>,
    node: &str,
    node_uid: Option<&str>,
    duration_seconds: i32,
    now: MicroTime,
) -> Lease {
    let mut lease = base.unwrap_or_else(|| Lease {
        metadata: ObjectMeta {
            name: Some(node.to_owned()),
            namespace: Some(LEASE_NAMESPACE.to_owned()),
            ..ObjectMeta::default()
        },
        spec: None,
    });
    if let Some(uid) = node_uid
        && lease
            .metadata
            .owner_references
            .as_ref()
            .is_none_or(Vec::is_empty)
    {
        lease.metadata.owner_references = Some(vec![OwnerReference {
            api_version: "v1".to_owned(),
            kind: "Node".to_owned(),
            name: node.to_owned(),
            uid: uid.to_owned(),
            ..OwnerReference::default()
        }]);
    }
    let spec = lease.spec.get_or_insert_with(LeaseSpec::default);
    spec.holder_identity = Some(node.to_owned());
    spec.lease_duration_seconds = Some(duration_seconds);
    spec.renew_time = Some(now);
    lease
}

/// The renewal period: a quarter of the lease duration (kubelet: 0.25 x 40 s = 10 s).
#[must_use]
pub fn renew_interval(duration_seconds: i32) -> Duration {
    Duration::from_millis(u64::try_from(duration_seconds.max(1)).unwrap_or(40) * 250)
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

/// One renewal: update the known lease, else read (or create) it.
async fn renew<A: ClusterApi>(
    api: &A,
    node: &str,
    duration_seconds: i32,
    known: &mut Option<Lease>,
) -> Result<(), super::ClusterError> {
    if let Some(lease) = known.take() {
        let uid = node_uid(api, node, &lease).await;
        let next = renewed(Some(lease), node, uid.as_deref(), duration_seconds, now());
        match api.replace_lease(&next).await {
            Ok(l) => {
                *known = Some(l);
                return Ok(());
            }
            Err(e) if e.is_conflict() => {}
            Err(e) => return Err(e),
        }
    }
    match api.get_lease(LEASE_NAMESPACE, node).await? {
        Some(lease) => {
            let uid = node_uid(api, node, &lease).await;
            let next = renewed(Some(lease), node, uid.as_deref(), duration_seconds, now());
            *known = Some(api.replace_lease(&next).await?);
        }
        None => {
            let uid = api
                .get_node(node)
                .await
                .ok()
                .flatten()
                .and_then(|n| n.metadata.uid);
            let next = renewed(None, node, uid.as_deref(), duration_seconds, now());
            *known = Some(api.create_lease(&next).await?);
        }
    }
    Ok(())
}

/// The node's uid for the owner reference, read only while the lease has none.
async fn node_uid<A: ClusterApi>(api: &A, node: &str, lease: &Lease) -> Option<String> {
    if lease
        .metadata
        .owner_references
        .as_ref()
        .is_some_and(|o| !o.is_empty())
    {
        return None;
    }
    api.get_node(node)
        .await
        .ok()
        .flatten()
        .and_then(|n| n.metadata.uid)
}

/// Renews the lease forever.
pub async fn run<A: ClusterApi>(api: Arc<A>, node: String, duration_seconds: i32) {
    let interval = renew_interval(duration_seconds);
    let mut known = None;
    let mut failures = 0u32;
    loop {
        match renew(api.as_ref(), &node, duration_seconds, &mut known).await {
            Ok(()) => {
                if failures > 0 {
                    tracing::info!(node = %node, "node lease renewed again");
                }
                failures = 0;
                tokio::time::sleep(interval).await;
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                if failures == 1 {
                    tracing::warn!(node = %node, error = %e, "renewing the node lease failed; retrying");
                }
                tokio::time::sleep(backoff(failures)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::fake::{Call, FakeApi};

    #[test]
    fn the_lease_object() {
        let t = MicroTime(k8s_openapi::jiff::Timestamp::from_second(5).expect("t"));
        let l = renewed(None, "n1", Some("uid-1"), 40, t.clone());
        assert_eq!(l.metadata.namespace.as_deref(), Some("kube-node-lease"));
        assert_eq!(l.metadata.name.as_deref(), Some("n1"));
        let owner = &l.metadata.owner_references.as_ref().expect("owner")[0];
        assert_eq!(
            (owner.kind.as_str(), owner.name.as_str(), owner.uid.as_str()),
            ("Node", "n1", "uid-1")
        );
        let spec = l.spec.expect("spec");
        assert_eq!(spec.holder_identity.as_deref(), Some("n1"));
        assert_eq!(spec.lease_duration_seconds, Some(40));
        assert_eq!(spec.renew_time, Some(t));
        assert_eq!(renew_interval(40), Duration::from_secs(10));
    }

    /// Created once, then updated every 10 s; an API that fails is retried with backoff.
    #[tokio::test(start_paused = true)]
    async fn renewed_every_ten_seconds_and_retried() {
        let api = Arc::new(FakeApi::default());
        let task = tokio::spawn(run(api.clone(), "n1".to_owned(), 40));
        tokio::time::sleep(Duration::from_secs(35)).await;
        assert_eq!(api.count(|c| matches!(c, Call::CreateLease)), 1);
        assert_eq!(api.count(|c| matches!(c, Call::ReplaceLease)), 3);
        api.set_down(true);
        tokio::time::sleep(Duration::from_secs(10)).await;
        let failed = api.count(|c| matches!(c, Call::Failed(_)));
        assert!(failed >= 3, "retried with backoff while down: {failed}");
        api.set_down(false);
        tokio::time::sleep(Duration::from_secs(8)).await;
        assert_eq!(api.count(|c| matches!(c, Call::ReplaceLease)), 4);
        task.abort();
    }
}
