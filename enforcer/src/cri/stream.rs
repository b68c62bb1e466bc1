//! The streaming requests (kubelet's `getExec`, `getAttach`, `getPortForward`): the URL of
//! the runtime's streaming server that the secure port relays a client to.

use std::time::Duration;

use k8s_cri::v1 as cri;

use super::{CriError, CriRuntime};

impl CriRuntime {
    /// CRI `Exec`: the runtime's streaming URL for the exec (kubelet proxies it).
    pub async fn exec_url(&self, req: cri::ExecRequest) -> Result<String, CriError> {
        let id = req.container_id.clone();
        let resp = self
            .call("Exec", &id, Duration::ZERO, |mut r, _| async move {
                r.exec(req).await
            })
            .await?;
        Ok(resp.url)
    }

    /// CRI `Attach`: the runtime's streaming URL.
    pub async fn attach_url(&self, req: cri::AttachRequest) -> Result<String, CriError> {
        let id = req.container_id.clone();
        let resp = self
            .call("Attach", &id, Duration::ZERO, |mut r, _| async move {
                r.attach(req).await
            })
            .await?;
        Ok(resp.url)
    }

    /// CRI `PortForward`: the runtime's streaming URL for the sandbox.
    pub async fn port_forward_url(&self, req: cri::PortForwardRequest) -> Result<String, CriError> {
        let id = req.pod_sandbox_id.clone();
        let resp = self
            .call("PortForward", &id, Duration::ZERO, |mut r, _| async move {
                r.port_forward(req).await
            })
            .await?;
        Ok(resp.url)
    }
}
