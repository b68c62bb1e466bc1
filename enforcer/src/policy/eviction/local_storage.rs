//! kubelet's local storage capacity isolation (`localStorageEviction` in
//! `pkg/kubelet/eviction/eviction_manager.go`): before any threshold, every pod whose emptyDir
//! is over its `sizeLimit`, whose local ephemeral storage is over the sum of its containers'
//! `ephemeral-storage` limits, or with a container over its own limit, is evicted at once
//! (grace period 0), with kubelet's messages.

use super::ActivePod;
use crate::{policy::resources, quantity::Quantity};

/// A pod evicted for its local storage.
#[must_use]
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LocalStorageEviction {
    /// Index of the pod in the slice given to [`evictions`].
    pub index: usize,
    pub uid: String,
    /// kubelet's status and event message.
    pub message: String,
}

/// Whether `used` bytes are more than `limit` (compared exactly, in the quantity's nanos).
fn exceeds(used: i64, limit: &Quantity) -> bool {
    i128::from(used) * 1_000_000_000 > limit.nanos()
}

/// `emptyDirLimitEviction`: the first emptyDir (in spec order) used beyond its sizeLimit.
fn empty_dir_over(p: &ActivePod<'_>) -> Option<String> {
    let stats = p.stats?;
    p.pod
        .spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .find_map(|v| {
            let size = resources::lenient(v.empty_dir.as_ref()?.size_limit.as_ref()?);
            let used = *stats.volumes.get(&v.name)?;
            (size.signum() == 1 && exceeds(used, &size)).then(|| {
                format!(
                    "Usage of EmptyDir volume {:?} exceeds the limit {:?}. ",
                    v.name,
                    size.canonical()
                )
            })
        })
}

/// `podEphemeralStorageLimitEviction`: the pod's usage beyond its containers' total limit.
fn pod_over(p: &ActivePod<'_>) -> Option<String> {
    let limit = *resources::pod_limits(p.pod).get("ephemeral-storage")?;
    let used = p.stats?.ephemeral_storage.unwrap_or(0);
    exceeds(used, &limit).then(|| {
        format!(
            "Pod ephemeral local storage usage exceeds the total limit of containers {}. ",
            limit.canonical()
        )
    })
}

/// `containerEphemeralStorageLimitEviction`: a container's logs and writable layer beyond its
/// own limit.
fn container_over(p: &ActivePod<'_>) -> Option<String> {
    let stats = p.stats?;
    let spec = p.pod.spec.as_ref()?;
    stats.containers.iter().find_map(|cs| {
        let c = spec.containers.iter().find(|c| c.name == cs.name)?;
        let limit = *resources::container_limits(c).get("ephemeral-storage")?;
        let used = cs.ephemeral_storage.unwrap_or(0);
        (limit.value() != 0 && exceeds(used, &limit)).then(|| {
            format!(
                "Container {} exceeded its local ephemeral storage limit {:?}. ",
                cs.name,
                limit.canonical()
            )
        })
    })
}

/// `localStorageEviction`: the pods to evict now for their local storage, each with the first
/// reason in kubelet's order (emptyDir, pod, container). Critical pods are never evicted.
pub fn evictions(pods: &[ActivePod<'_>]) -> Vec<LocalStorageEviction> {
    pods.iter()
        .enumerate()
        .filter(|(_, p)| p.stats.is_some() && !p.is_critical())
        .filter_map(|(index, p)| {
            let message = empty_dir_over(p)
                .or_else(|| pod_over(p))
                .or_else(|| container_over(p))?;
            Some(LocalStorageEviction {
                index,
                uid: resources::pod_uid(p.pod).to_owned(),
                message,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::core::v1::Pod;

    use super::*;
    use crate::policy::eviction::{ContainerStats, PodStats};

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("pod yaml: {e}"))
    }

    fn stats(total: i64, container: i64, volume: Option<i64>) -> PodStats {
        PodStats {
            ephemeral_storage: Some(total),
            containers: vec![ContainerStats {
                name: "c".into(),
                memory: None,
                ephemeral_storage: Some(container),
            }]
            .into(),
            volumes: volume
                .map(|v| BTreeMap::from([("v".to_owned(), v)]))
                .unwrap_or_default(),
            ..PodStats::default()
        }
    }

    #[test]
    fn messages_and_order_as_kubelet() {
        let mi = 1i64 << 20;
        let empty_dir = pod(
            "metadata: {name: a, uid: a}\nspec: {volumes: [{name: v, emptyDir: {sizeLimit: 100Mi}}], containers: [{name: c}]}",
        );
        let limited = pod(
            "metadata: {name: b, uid: b}\nspec: {volumes: [{name: v, emptyDir: {}}], containers: [{name: c, resources: {limits: {ephemeral-storage: 100Mi}}}]}",
        );
        let cases: &[(&Pod, PodStats, Option<&str>)] = &[
            (
                &empty_dir,
                stats(101 * mi, 0, Some(101 * mi)),
                Some(r#"Usage of EmptyDir volume "v" exceeds the limit "100Mi". "#),
            ),
            // At the limit is not over it (a memory emptyDir full at its size stays).
            (&empty_dir, stats(100 * mi, 0, Some(100 * mi)), None),
            (
                &limited,
                stats(101 * mi, mi, Some(100 * mi)),
                Some(
                    "Pod ephemeral local storage usage exceeds the total limit of containers 100Mi. ",
                ),
            ),
            (&limited, stats(99 * mi, 99 * mi, None), None),
        ];
        for (p, s, want) in cases {
            let got = evictions(&[ActivePod::new(p, Some(s))]);
            assert_eq!(got.first().map(|e| e.message.as_str()), *want, "{s:?}");
        }
        // The container check, when the pod's total is not over (its usage not summed yet).
        let s = stats(50 * mi, 101 * mi, None);
        let got = evictions(&[ActivePod::new(&limited, Some(&s))]);
        assert_eq!(
            got[0].message,
            r#"Container c exceeded its local ephemeral storage limit "100Mi". "#
        );
        assert_eq!(got[0].uid, "b");
        // No stats, no eviction.
        assert!(evictions(&[ActivePod::new(&limited, None)]).is_empty());
    }
}
