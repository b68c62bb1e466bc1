//! `evictionMessage`: the pod status and event text of an eviction, and its annotations.

use std::{collections::BTreeMap, fmt::Write as _};

use super::ActivePod;
use crate::{
    policy::{
        eviction::{Observations, Resource, Threshold},
        resources,
    },
    quantity::Quantity,
};

/// `evictionMessage`: `The node was low on resource: memory. Threshold quantity: 2Gi,
/// available: 1500Mi. Container app was using 700Mi, request is 100Mi, has larger consumption
/// of memory. ` and the event annotations.
#[must_use]
pub fn eviction_message(
    resource: Resource,
    pod: &ActivePod<'_>,
    thresholds: &[&Threshold],
    observations: &Observations,
) -> (String, BTreeMap<String, String>) {
    let mut message = format!("The node was low on resource: {resource}. ");
    if let Some((t, obs)) = thresholds
        .iter()
        .filter(|t| t.signal.resource() == resource)
        .find_map(|t| observations.get(&t.signal).map(|o| (t, o)))
    {
        let quantity = t.value.resolve(obs.capacity);
        let available = Quantity::from_int(obs.available, t.signal.format());
        let _ = write!(
            message,
            "Threshold quantity: {quantity}, available: {available}. "
        );
    }
    let mut annotations = BTreeMap::new();
    let Some(stats) = pod.stats else {
        return (message, annotations);
    };
    let mut offending = Vec::new();
    let mut usages = Vec::new();
    for cs in stats.containers.iter() {
        for c in resources::containers(pod.pod)
            .iter()
            .filter(|c| c.name == cs.name)
        {
            let request = resources::container_requests(c)
                .get(resource.as_str())
                .copied()
                .unwrap_or_default();
            let usage = match resource {
                Resource::Memory => cs.memory,
                Resource::EphemeralStorage => cs.ephemeral_storage,
                Resource::Inodes | Resource::Pids => None,
            };
            if let Some(u) = usage {
                let u = Quantity::from_int(u, crate::quantity::Format::BinarySI);
                if u > request {
                    let _ = write!(
                        message,
                        "Container {} was using {u}, request is {request}, has larger consumption of {resource}. ",
                        c.name
                    );
                    offending.push(c.name.clone());
                    usages.push(u.to_string());
                }
            }
        }
    }
    annotations.insert("offending_containers".to_owned(), offending.join(","));
    annotations.insert("offending_containers_usage".to_owned(), usages.join(","));
    annotations.insert("starved_resource".to_owned(), resource.as_str().to_owned());
    (message, annotations)
}
