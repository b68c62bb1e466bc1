//! The relister, kubelet's PLEG relist in the small: the managed pod sandboxes and containers
//! listed through CRI, reduced per pod uid to a fingerprint of their ids and states, so the
//! pod loop can wake the workers whose pods changed.

use std::collections::{HashMap, HashSet};

use k8s_cri::v1 as cri_api;

use crate::cri::{ContainerRuntime, CriError, spec};

/// Lists the managed sandboxes and containers: per pod uid, a fingerprint of their states.
pub(crate) async fn relist_runtime<R: ContainerRuntime>(
    runtime: &R,
) -> Result<HashMap<String, String>, CriError> {
    let _timer = crate::metrics::global().pleg_relist();
    let managed = HashMap::from([(spec::MANAGED_LABEL.to_owned(), "true".to_owned())]);
    let sandboxes = runtime
        .list_pod_sandboxes(cri_api::PodSandboxFilter {
            label_selector: managed.clone(),
            ..Default::default()
        })
        .await?;
    let containers = runtime
        .list_containers(cri_api::ContainerFilter {
            label_selector: managed,
            ..Default::default()
        })
        .await?;
    crate::metrics::global().relisted(&sandboxes, &containers);
    let mut out: HashMap<String, Vec<String>> = HashMap::new();
    let mut seen = HashSet::new();
    for s in &sandboxes {
        if let Some(uid) = s.labels.get(spec::POD_UID_LABEL) {
            seen.insert(uid.clone());
            out.entry(uid.clone())
                .or_default()
                .push(format!("s{}:{}", s.id, s.state));
        }
    }
    for c in &containers {
        if let Some(uid) = c.labels.get(spec::POD_UID_LABEL) {
            out.entry(uid.clone())
                .or_default()
                .push(format!("c{}:{}", c.id, c.state));
        }
    }
    Ok(out
        .into_iter()
        .map(|(uid, mut v)| {
            v.sort();
            (uid, v.join(","))
        })
        .collect())
}
