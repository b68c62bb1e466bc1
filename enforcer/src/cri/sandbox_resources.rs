//! CRI `UpdatePodSandboxResources` (cri-api 1.32+; kubelet calls it on every change of the pod
//! cgroup in an in-place resize, and since 1.36 lets the runtime refuse one): the request and
//! answer as the CRI proto declares them, sent over the runtime's channel (the `k8s-cri`
//! crate's generated client predates the call).

use std::collections::HashMap;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;
use tonic::codegen::http::uri::PathAndQuery;

use super::{CriError, CriRuntime};
use crate::policy::resources::cgroup::{PodCgroupValues, milli_cpu_to_quota, milli_cpu_to_shares};

/// `runtime.v1.UpdatePodSandboxResourcesRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdatePodSandboxResourcesRequest {
    #[prost(string, tag = "1")]
    pub pod_sandbox_id: String,
    #[prost(message, optional, tag = "2")]
    pub overhead: Option<cri::LinuxContainerResources>,
    #[prost(message, optional, tag = "3")]
    pub resources: Option<cri::LinuxContainerResources>,
    #[prost(map = "string, string", tag = "4")]
    pub annotations: HashMap<String, String>,
}

/// `runtime.v1.UpdatePodSandboxResourcesResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub struct UpdatePodSandboxResourcesResponse {}

/// kubelet's `generateUpdatePodSandboxResourcesRequest`: the pod cgroup's values less the
/// pod's overhead (`subtractOverheadFromResourceConfig`), and the overhead as linux resources
/// (`convertOverheadToLinuxResources`: shares and quota of its cpu, its memory).
#[must_use]
pub fn request(
    sandbox_id: &str,
    pod: &Pod,
    values: &PodCgroupValues,
    cpu_period_us: u64,
) -> UpdatePodSandboxResourcesRequest {
    let overhead = pod.spec.as_ref().and_then(|s| s.overhead.as_ref());
    let get = |name: &str| {
        overhead
            .and_then(|o| o.get(name))
            .map(crate::policy::resources::lenient)
    };
    let (cpu, memory) = (
        get("cpu").map_or(0, |q| q.milli_value()),
        get("memory").map_or(0, |q| q.value()),
    );
    let period = i64::try_from(cpu_period_us).unwrap_or(100_000);
    let shares = |milli| i64::try_from(milli_cpu_to_shares(milli)).unwrap_or(2);
    let overhead_quota = milli_cpu_to_quota(cpu, cpu_period_us).unwrap_or(0);
    let resources = cri::LinuxContainerResources {
        cpu_period: values
            .cpu_period_micros
            .and_then(|p| i64::try_from(p).ok())
            .unwrap_or(period),
        cpu_quota: values
            .cpu_quota_micros
            .map_or(-1, |q| q.saturating_sub(overhead_quota)),
        cpu_shares: i64::try_from(values.cpu_shares)
            .unwrap_or(i64::MAX)
            .saturating_sub(if cpu > 0 { shares(cpu) } else { 0 }),
        memory_limit_in_bytes: values
            .memory_limit_bytes
            .map_or(0, |m| m.saturating_sub(memory)),
        ..Default::default()
    };
    UpdatePodSandboxResourcesRequest {
        pod_sandbox_id: sandbox_id.to_owned(),
        overhead: overhead.map(|_| cri::LinuxContainerResources {
            cpu_period: if overhead_quota > 0 { period } else { 0 },
            cpu_quota: overhead_quota,
            cpu_shares: shares(cpu),
            memory_limit_in_bytes: memory,
            ..Default::default()
        }),
        resources: Some(resources),
        annotations: HashMap::new(),
    }
}

const PATH: &str = "/runtime.v1.RuntimeService/UpdatePodSandboxResources";

impl CriRuntime {
    /// Sends one `UpdatePodSandboxResources` with the client's timeout.
    pub(super) async fn send_pod_sandbox_resources(
        &self,
        request: UpdatePodSandboxResourcesRequest,
    ) -> Result<(), CriError> {
        let id = request.pod_sandbox_id.clone();
        let op = "UpdatePodSandboxResources";
        self.call_on(op, &id, std::time::Duration::ZERO, |ch| async move {
            let mut grpc = tonic::client::Grpc::new(ch);
            grpc.ready().await.map_err(|e| {
                tonic::Status::unavailable(format!("transport: service not ready: {e}"))
            })?;
            grpc.unary::<_, UpdatePodSandboxResourcesResponse, _>(
                tonic::Request::new(request),
                PathAndQuery::from_static(PATH),
                tonic_prost::ProstCodec::default(),
            )
            .await
        })
        .await
        .map(drop)
    }
}

#[cfg(test)]
mod tests {
    use prost::Message as _;

    use super::*;

    /// The wire form: the fields at the proto's tags (what a runtime of cri-api 1.32+ reads).
    #[test]
    fn the_request_is_encoded_at_the_protos_tags() {
        let req = UpdatePodSandboxResourcesRequest {
            pod_sandbox_id: "sb".to_owned(),
            overhead: None,
            resources: Some(cri::LinuxContainerResources {
                memory_limit_in_bytes: 1 << 20,
                ..Default::default()
            }),
            annotations: HashMap::new(),
        };
        let bytes = req.encode_to_vec();
        // Field 1 (string "sb"), then field 3 (a message) holding field 4 of
        // LinuxContainerResources (memory_limit_in_bytes, varint 1048576).
        assert_eq!(&bytes[..4], &[0x0a, 2, b's', b'b']);
        assert_eq!(bytes[4], 0x1a, "field 3, length-delimited");
        let inner = cri::LinuxContainerResources::decode(&bytes[6..]).expect("inner");
        assert_eq!(inner.memory_limit_in_bytes, 1 << 20);
        assert_eq!(
            UpdatePodSandboxResourcesRequest::decode(bytes.as_slice()).expect("decode"),
            req
        );
    }

    /// The pod cgroup's values less the overhead; the overhead on its own.
    #[test]
    fn the_pod_cgroups_values_less_the_overhead() {
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "spec": {"containers": [], "overhead": {"cpu": "100m", "memory": "16Mi"}}
        }))
        .expect("pod");
        let values = PodCgroupValues {
            cpu_shares: 614,
            cpu_weight: None,
            cpu_quota_micros: Some(60_000),
            cpu_period_micros: Some(100_000),
            memory_limit_bytes: Some(272 << 20),
            memory_min_bytes: None,
            memory_low_bytes: None,
            pids_limit: None,
        };
        let r = request("sb1", &pod, &values, 100_000);
        assert_eq!(r.pod_sandbox_id, "sb1");
        let res = r.resources.expect("resources");
        assert_eq!(
            (
                res.cpu_shares,
                res.cpu_quota,
                res.cpu_period,
                res.memory_limit_in_bytes
            ),
            (512, 50_000, 100_000, 256 << 20)
        );
        let o = r.overhead.expect("overhead");
        assert_eq!(
            (o.cpu_shares, o.cpu_quota, o.memory_limit_in_bytes),
            (102, 10_000, 16 << 20)
        );
        // No overhead, no CPU limit: none said, the quota unlimited.
        let plain: Pod =
            serde_json::from_value(serde_json::json!({"spec": {"containers": []}})).expect("pod");
        let values = PodCgroupValues {
            cpu_quota_micros: None,
            ..values
        };
        let r = request("sb1", &plain, &values, 100_000);
        assert!(r.overhead.is_none());
        assert_eq!(r.resources.expect("resources").cpu_quota, -1);
    }
}
