//! What a status says of resources: kubelet's `allocatedResources` and `resources`, of a
//! container (`convertToAPIContainerStatuses`) and, with
//! `InPlacePodLevelResourcesVerticalScaling` (KEP-5419), of the pod. Kept in the records as
//! plain strings (the status file's form), served as the API's types.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::ResourceRequirements, apimachinery::pkg::api::resource::Quantity as K8sQuantity,
};
use serde::{Deserialize, Serialize};

/// Requests and limits by resource name.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Requirements {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub requests: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub limits: BTreeMap<String, String>,
}

/// A container's or the pod's `allocatedResources` and `resources`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ResourcesStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allocated_resources: Option<BTreeMap<String, String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resources: Option<Requirements>,
}

fn strings(list: Option<&BTreeMap<String, K8sQuantity>>) -> BTreeMap<String, String> {
    list.into_iter()
        .flatten()
        .map(|(k, q)| (k.clone(), q.0.clone()))
        .collect()
}

fn quantities(list: &BTreeMap<String, String>) -> Option<BTreeMap<String, K8sQuantity>> {
    (!list.is_empty()).then(|| {
        list.iter()
            .map(|(k, v)| (k.clone(), K8sQuantity(v.clone())))
            .collect()
    })
}

impl ResourcesStatus {
    /// From the API's types (`allocated`: `None` where kubelet reports none).
    #[must_use]
    pub fn new(
        allocated: Option<BTreeMap<String, K8sQuantity>>,
        resources: &ResourceRequirements,
    ) -> Self {
        Self {
            allocated_resources: allocated.map(|a| strings(Some(&a))),
            resources: Some(Requirements {
                requests: strings(resources.requests.as_ref()),
                limits: strings(resources.limits.as_ref()),
            }),
        }
    }

    /// The API's `allocatedResources`.
    #[must_use]
    pub fn api_allocated(&self) -> Option<BTreeMap<String, K8sQuantity>> {
        self.allocated_resources.as_ref().and_then(quantities)
    }

    /// The API's `resources` (`None` where nothing is reported).
    #[must_use]
    pub fn api_resources(&self) -> Option<ResourceRequirements> {
        let r = self.resources.as_ref()?;
        Some(ResourceRequirements {
            requests: quantities(&r.requests),
            limits: quantities(&r.limits),
            ..ResourceRequirements::default()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kept_as_strings_and_served_as_the_apis_types() {
        let q = |v: &str| K8sQuantity(v.to_owned());
        let st = ResourcesStatus::new(
            Some(BTreeMap::from([("cpu".to_owned(), q("250m"))])),
            &ResourceRequirements {
                requests: Some(BTreeMap::from([("cpu".to_owned(), q("250m"))])),
                limits: None,
                ..ResourceRequirements::default()
            },
        );
        let json = serde_json::to_string(&st).expect("json");
        assert_eq!(
            json,
            r#"{"allocatedResources":{"cpu":"250m"},"resources":{"requests":{"cpu":"250m"}}}"#
        );
        let back: ResourcesStatus = serde_json::from_str(&json).expect("parse");
        assert_eq!(back, st);
        let api = back.api_resources().expect("resources");
        assert_eq!(api.limits, None, "no limits: none reported");
        assert_eq!(back.api_allocated().expect("allocated")["cpu"], q("250m"));
        assert_eq!(ResourcesStatus::default().api_resources(), None);
    }
}
