//! The allocated resources checkpoint (kubelet 1.35 `allocation/state`, file
//! [`super::ALLOCATED_PODS_STATE_FILE`]): `{"data":"<json>","checksum":N}` where `<json>` is
//! `{"entries":{"<pod uid>":{"ContainerResources":{"<name>":{"limits":{..},"requests":{..}}},
//! "PodLevelResources":null}}}` and the checksum is FNV-32a of spew's `%#v` of the data
//! string, `(string)<json>` ([`crate::policy::checksum`]). Pure: the caller reads and writes
//! the file.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};
use serde::{Deserialize, Serialize};

use super::PodAllocation;
use crate::{policy::checksum, quantity::Quantity};

/// What is wrong with a checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckpointError {
    /// Not the checkpoint's JSON.
    #[error("allocated pods checkpoint: {0}")]
    Format(String),
    /// The checksum does not match the data.
    #[error("allocated pods checkpoint is corrupted: checksum {stored} does not match {computed}")]
    Checksum { stored: u64, computed: u64 },
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    data: String,
    checksum: u64,
}

/// Go's `v1.ResourceRequirements` as encoding/json writes it (empty maps left out).
#[derive(Debug, Default, Serialize, Deserialize)]
struct Requirements {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    limits: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    requests: BTreeMap<String, String>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Info {
    #[serde(rename = "ContainerResources", default)]
    containers: BTreeMap<String, Requirements>,
    /// Pod-level resources (`InPlacePodLevelResourcesVerticalScaling`, beta in 1.36): the
    /// pod's, `null` for a pod without them.
    #[serde(rename = "PodLevelResources", default)]
    pod_level: Option<Requirements>,
}

#[derive(Debug, Default, Serialize, Deserialize)]
struct Data {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    entries: BTreeMap<String, Info>,
}

/// The checksum kubelet stores for `data`.
#[must_use]
pub fn checksum_of(data: &str) -> u64 {
    checksum::of_spew(&format!("(string){data}"))
}

fn canonical(q: &K8sQuantity) -> String {
    Quantity::from_k8s(q).map_or_else(|_| q.0.clone(), |v| v.canonical())
}

fn to_requirements(r: &ResourceRequirements) -> Requirements {
    let m = |l: Option<&BTreeMap<String, K8sQuantity>>| {
        l.map(|l| l.iter().map(|(k, v)| (k.clone(), canonical(v))).collect())
            .unwrap_or_default()
    };
    Requirements {
        limits: m(r.limits.as_ref()),
        requests: m(r.requests.as_ref()),
    }
}

fn from_requirements(r: Requirements) -> ResourceRequirements {
    let m = |l: BTreeMap<String, String>| {
        (!l.is_empty()).then(|| l.into_iter().map(|(k, v)| (k, K8sQuantity(v))).collect())
    };
    ResourceRequirements {
        limits: m(r.limits),
        requests: m(r.requests),
        ..ResourceRequirements::default()
    }
}

/// The JSON to write for the allocations by pod uid.
#[must_use]
pub fn to_json(allocations: &BTreeMap<String, PodAllocation>) -> String {
    let data = Data {
        entries: allocations
            .iter()
            .map(|(uid, a)| {
                let info = Info {
                    containers: a
                        .containers
                        .iter()
                        .map(|(n, r)| (n.clone(), to_requirements(r)))
                        .collect(),
                    pod_level: a.pod.as_ref().map(to_requirements),
                };
                (uid.clone(), info)
            })
            .collect(),
    };
    let data = serde_json::to_string(&data).unwrap_or_else(|_| "{}".to_owned());
    let checksum = checksum_of(&data);
    serde_json::to_string(&File { data, checksum }).unwrap_or_default()
}

/// Reads and verifies a checkpoint file's text (a quantity that does not parse is kept as
/// written; the allocation only compares them by value later).
pub fn from_json(text: &str) -> Result<BTreeMap<String, PodAllocation>, CheckpointError> {
    let file: File =
        serde_json::from_str(text).map_err(|e| CheckpointError::Format(e.to_string()))?;
    let computed = checksum_of(&file.data);
    if computed != file.checksum {
        return Err(CheckpointError::Checksum {
            stored: file.checksum,
            computed,
        });
    }
    let data: Data =
        serde_json::from_str(&file.data).map_err(|e| CheckpointError::Format(e.to_string()))?;
    Ok(data
        .entries
        .into_iter()
        .map(|(uid, info)| {
            let containers = info
                .containers
                .into_iter()
                .map(|(n, r)| (n, from_requirements(r)))
                .collect();
            let pod = info.pod_level.map(from_requirements);
            (uid, PodAllocation { containers, pod })
        })
        .collect())
}
