//! The container runtime behind a small trait: the real one speaks CRI v1 (crate `k8s-cri`) to
//! containerd over its unix socket, with a timeout on every call and reconnection with backoff
//! when the runtime goes away and comes back; [`crate::cri::fake::FakeRuntime`] records calls for
//! the pod worker tests.

use std::{
    future::Future,
    path::{Path, PathBuf},
    time::Duration,
};

use k8s_cri::v1 as cri;
use tokio::{sync::Mutex, time::Instant};

use crate::policy::cgroup_name::CgroupDriver;

mod connection;
#[cfg(test)]
pub mod fake;
pub mod gc;
pub mod images;
use connection::Conn;
pub mod limit;
pub(crate) mod relist;
pub mod sandbox_resources;
pub mod spec;
mod stream;

/// Errors of CRI calls; each names the call and the object it was about.
#[derive(Debug, thiserror::Error)]
pub enum CriError {
    #[error("CRI socket {socket}: cannot connect: {message}")]
    Connect { socket: PathBuf, message: String },
    #[error("CRI socket {socket}: runtime unavailable, next connection attempt in {retry_in:?}")]
    Backoff { socket: PathBuf, retry_in: Duration },
    #[error("CRI {op} {id}: timed out after {after:?}")]
    Timeout {
        op: &'static str,
        id: String,
        after: Duration,
    },
    #[error("CRI {op} {id}: {code:?}: {message}")]
    Status {
        op: &'static str,
        id: String,
        code: tonic::Code,
        message: String,
    },
    #[error("CRI {op} {id}: the runtime answered without {what}")]
    Missing {
        op: &'static str,
        id: String,
        what: &'static str,
    },
}

impl CriError {
    /// The object was not there (already removed, never created).
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(
            self,
            Self::Status {
                code: tonic::Code::NotFound,
                ..
            }
        ) || matches!(self, Self::Status { message, .. } if message.contains("not found"))
    }

    /// The runtime could not be reached (it may come back).
    #[must_use]
    pub fn is_unavailable(&self) -> bool {
        matches!(
            self,
            Self::Connect { .. }
                | Self::Backoff { .. }
                | Self::Timeout { .. }
                | Self::Status {
                    code: tonic::Code::Unavailable | tonic::Code::Cancelled,
                    ..
                }
        )
    }
}

/// What an `ExecSync` answered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExecOutput {
    pub exit_code: i32,
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
}

/// What the pod workers need from a container runtime (the CRI calls kubelet makes).
pub trait ContainerRuntime: Send + Sync + 'static {
    /// Runtime name and version.
    fn version(&self) -> impl Future<Output = Result<cri::VersionResponse, CriError>> + Send;
    fn run_pod_sandbox(
        &self,
        config: cri::PodSandboxConfig,
    ) -> impl Future<Output = Result<String, CriError>> + Send;
    fn stop_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<(), CriError>> + Send;
    /// The sandbox's IP addresses (`PodSandboxStatus`: the network's ip, then the others).
    fn pod_sandbox_ips(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<Vec<String>, CriError>> + Send;
    fn remove_pod_sandbox(&self, id: &str) -> impl Future<Output = Result<(), CriError>> + Send;
    fn list_pod_sandboxes(
        &self,
        filter: cri::PodSandboxFilter,
    ) -> impl Future<Output = Result<Vec<cri::PodSandbox>, CriError>> + Send;
    fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> impl Future<Output = Result<String, CriError>> + Send;
    fn start_container(&self, id: &str) -> impl Future<Output = Result<(), CriError>> + Send;
    /// SIGTERM (or the image's stop signal), then SIGKILL after `timeout_s`.
    fn stop_container(
        &self,
        id: &str,
        timeout_s: i64,
    ) -> impl Future<Output = Result<(), CriError>> + Send;
    fn remove_container(&self, id: &str) -> impl Future<Output = Result<(), CriError>> + Send;
    fn list_containers(
        &self,
        filter: cri::ContainerFilter,
    ) -> impl Future<Output = Result<Vec<cri::Container>, CriError>> + Send;
    fn container_status(
        &self,
        id: &str,
    ) -> impl Future<Output = Result<cri::ContainerStatus, CriError>> + Send;
    /// The image, when present on the node.
    fn image_status(
        &self,
        image: &str,
    ) -> impl Future<Output = Result<Option<cri::Image>, CriError>> + Send;
    /// Pulls an image with the credentials in `auth` (none: anonymous); returns its
    /// reference.
    fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> impl Future<Output = Result<String, CriError>> + Send;
    /// The images on the node (node-level reclaim). A runtime without images lists none.
    fn list_images(&self) -> impl Future<Output = Result<Vec<cri::Image>, CriError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// The runtime's image filesystems (CRI `ImageFsInfo`); a runtime without images has none.
    fn image_filesystems(
        &self,
    ) -> impl Future<Output = Result<Vec<cri::FilesystemUsage>, CriError>> + Send {
        async { Ok(Vec::new()) }
    }
    /// Removes an image by id (node-level reclaim).
    fn remove_image(&self, id: &str) -> impl Future<Output = Result<(), CriError>> + Send {
        let _ = id;
        async { Ok(()) }
    }
    /// The runtime's sandbox (pause) image, when it says (containerd: `sandboxImage` in the
    /// verbose CRI status); image reclaim never removes it.
    fn sandbox_image(&self) -> impl Future<Output = Result<Option<String>, CriError>> + Send {
        async { Ok(None) }
    }
    /// The cgroup driver the runtime runs containers with: CRI `RuntimeConfig` (kubelet's
    /// `KubeletCgroupDriverFromCRI`), else containerd's `SystemdCgroup` runc option in the
    /// verbose CRI status; `None` when the runtime does not say.
    fn cgroup_driver(&self) -> impl Future<Output = Result<Option<CgroupDriver>, CriError>> + Send {
        async { Ok(None) }
    }
    /// `ExecSync`: runs `cmd` in the container, killed after `timeout` (exec probes). A
    /// runtime without it answers an error (the probe errors; never a silent success).
    fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> impl Future<Output = Result<ExecOutput, CriError>> + Send {
        let _ = (cmd, timeout);
        let id = id.to_owned();
        async move {
            Err(CriError::Status {
                op: "ExecSync",
                id,
                code: tonic::Code::Unimplemented,
                message: "this runtime cannot exec in containers".to_owned(),
            })
        }
    }
    /// `UpdatePodSandboxResources` (an in-place resize's pod cgroup change). A runtime without
    /// it accepts and ignores the update.
    fn update_pod_sandbox_resources(
        &self,
        request: sandbox_resources::UpdatePodSandboxResourcesRequest,
    ) -> impl Future<Output = Result<(), CriError>> + Send {
        let _ = request;
        async { Ok(()) }
    }
    /// `UpdateContainerResources` (the CPU manager's cpusets). A runtime without it accepts
    /// and ignores the update.
    fn update_container_resources(
        &self,
        id: &str,
        resources: cri::LinuxContainerResources,
    ) -> impl Future<Output = Result<(), CriError>> + Send {
        let _ = (id, resources);
        async { Ok(()) }
    }
}

/// CRI over a unix socket.
#[derive(Debug)]
pub struct CriRuntime {
    socket: PathBuf,
    timeout: Duration,
    conn: Mutex<Conn>,
    /// Pod-creating calls in flight ([`crate::cri::limit`]).
    starts: crate::cri::limit::AdaptiveLimit,
}

/// First reconnection delay; doubles per failure up to [`RECONNECT_MAX`].
pub const RECONNECT_INITIAL: Duration = Duration::from_millis(100);
/// Longest delay between connection attempts.
pub const RECONNECT_MAX: Duration = Duration::from_secs(5);

/// Delay before the next connection attempt after `failures` consecutive failures.
#[must_use]
pub fn reconnect_delay(failures: u32) -> Duration {
    crate::policy::backoff::exponential(RECONNECT_INITIAL, RECONNECT_MAX, failures)
}

impl CriRuntime {
    /// A client for the runtime at `socket`; connects lazily (and again after failures).
    #[must_use]
    pub fn new(socket: impl Into<PathBuf>, timeout: Duration) -> Self {
        Self {
            socket: socket.into(),
            timeout,
            conn: Mutex::new(Conn {
                channel: None,
                failures: 0,
                next_attempt: None,
            }),
            starts: crate::cri::limit::AdaptiveLimit::default(),
        }
    }

    /// How many pod-creating calls may run at once now.
    #[must_use]
    pub fn start_limit(&self) -> usize {
        self.starts.limit()
    }

    /// Runs a pod-creating call within the adaptive limit, and feeds its latency back.
    async fn limited<T>(
        &self,
        call: impl Future<Output = Result<T, CriError>>,
    ) -> Result<T, CriError> {
        let _slot = self.starts.acquire().await;
        let t0 = Instant::now();
        let r = call.await;
        match &r {
            Ok(_) => self.starts.record(t0.elapsed(), false),
            Err(CriError::Timeout { .. }) => self.starts.record(t0.elapsed(), true),
            Err(_) => {}
        }
        r
    }

    /// The socket this client talks to.
    #[must_use]
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// `ImageFsInfo`: the filesystems holding the runtime's images (kubelet's imagefs).
    pub async fn image_fs_info(&self) -> Result<Vec<cri::FilesystemUsage>, CriError> {
        Ok(self.fs_info().await?.image_filesystems)
    }

    /// `ImageFsInfo`, whole: the image filesystems and, when the runtime keeps containers'
    /// writable layers elsewhere, the container filesystems.
    pub async fn fs_info(&self) -> Result<cri::ImageFsInfoResponse, CriError> {
        self.call("ImageFsInfo", "", Duration::ZERO, |_, mut i| async move {
            i.image_fs_info(cri::ImageFsInfoRequest {}).await
        })
        .await
    }

    /// The runtime's own configuration, from the verbose CRI status (`info["config"]`, JSON;
    /// containerd's CRI plugin config); `None` when it gives none.
    async fn status_config(&self) -> Result<Option<serde_json::Value>, CriError> {
        let resp = self
            .call("Status", "", Duration::ZERO, |mut r, _| async move {
                r.status(cri::StatusRequest { verbose: true }).await
            })
            .await?;
        Ok(resp
            .info
            .get("config")
            .and_then(|c| serde_json::from_str::<serde_json::Value>(c).ok()))
    }
}

impl ContainerRuntime for CriRuntime {
    async fn version(&self) -> Result<cri::VersionResponse, CriError> {
        self.call("Version", "", Duration::ZERO, |mut r, _| async move {
            r.version(cri::VersionRequest {
                version: "v1".to_owned(),
            })
            .await
        })
        .await
    }

    async fn run_pod_sandbox(&self, config: cri::PodSandboxConfig) -> Result<String, CriError> {
        let id = config
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        let resp = self
            .limited(self.call(
                "RunPodSandbox",
                &id,
                Duration::from_secs(60),
                |mut r, _| async move {
                    r.run_pod_sandbox(cri::RunPodSandboxRequest {
                        config: Some(config),
                        runtime_handler: String::new(),
                    })
                    .await
                },
            ))
            .await?;
        Ok(resp.pod_sandbox_id)
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let pod_sandbox_id = id.to_owned();
        self.call(
            "StopPodSandbox",
            id,
            Duration::from_secs(30),
            |mut r, _| async move {
                r.stop_pod_sandbox(cri::StopPodSandboxRequest { pod_sandbox_id })
                    .await
            },
        )
        .await
        .map(drop)
    }

    async fn pod_sandbox_ips(&self, id: &str) -> Result<Vec<String>, CriError> {
        let pod_sandbox_id = id.to_owned();
        let resp = self
            .call(
                "PodSandboxStatus",
                id,
                Duration::ZERO,
                |mut r, _| async move {
                    r.pod_sandbox_status(cri::PodSandboxStatusRequest {
                        pod_sandbox_id,
                        verbose: false,
                    })
                    .await
                },
            )
            .await?;
        Ok(resp
            .status
            .and_then(|s| s.network)
            .map(|n| {
                std::iter::once(n.ip)
                    .chain(n.additional_ips.into_iter().map(|i| i.ip))
                    .filter(|ip| !ip.is_empty())
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        let pod_sandbox_id = id.to_owned();
        self.call(
            "RemovePodSandbox",
            id,
            Duration::from_secs(30),
            |mut r, _| async move {
                r.remove_pod_sandbox(cri::RemovePodSandboxRequest { pod_sandbox_id })
                    .await
            },
        )
        .await
        .map(drop)
    }

    async fn list_pod_sandboxes(
        &self,
        filter: cri::PodSandboxFilter,
    ) -> Result<Vec<cri::PodSandbox>, CriError> {
        let resp = self
            .call(
                "ListPodSandbox",
                "",
                Duration::ZERO,
                |mut r, _| async move {
                    r.list_pod_sandbox(cri::ListPodSandboxRequest {
                        filter: Some(filter),
                    })
                    .await
                },
            )
            .await?;
        Ok(resp.items)
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let pod_sandbox_id = sandbox_id.to_owned();
        let name = config
            .metadata
            .as_ref()
            .map(|m| format!("{sandbox_id}/{}", m.name))
            .unwrap_or_default();
        let resp = self
            .limited(self.call(
                "CreateContainer",
                &name,
                Duration::from_secs(30),
                |mut r, _| async move {
                    r.create_container(cri::CreateContainerRequest {
                        pod_sandbox_id,
                        config: Some(config),
                        // containerd 1.6.20 panics without it; it also carries the cgroup parent.
                        sandbox_config: Some(sandbox_config),
                    })
                    .await
                },
            ))
            .await?;
        Ok(resp.container_id)
    }

    async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let container_id = id.to_owned();
        self.limited(self.call(
            "StartContainer",
            id,
            Duration::from_secs(30),
            |mut r, _| async move {
                r.start_container(cri::StartContainerRequest { container_id })
                    .await
            },
        ))
        .await
        .map(drop)
    }

    async fn stop_container(&self, id: &str, timeout_s: i64) -> Result<(), CriError> {
        let container_id = id.to_owned();
        let wait = Duration::from_secs(u64::try_from(timeout_s.max(0)).unwrap_or(0));
        self.call(
            "StopContainer",
            id,
            wait + Duration::from_secs(10),
            |mut r, _| async move {
                r.stop_container(cri::StopContainerRequest {
                    container_id,
                    timeout: timeout_s,
                })
                .await
            },
        )
        .await
        .map(drop)
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: Duration,
    ) -> Result<ExecOutput, CriError> {
        let container_id = id.to_owned();
        let secs = i64::try_from(timeout.as_secs().max(1)).unwrap_or(i64::MAX);
        let resp = self
            .call("ExecSync", id, timeout, |mut r, _| async move {
                r.exec_sync(cri::ExecSyncRequest {
                    container_id,
                    cmd,
                    timeout: secs,
                })
                .await
            })
            .await?;
        Ok(ExecOutput {
            exit_code: resp.exit_code,
            stdout: resp.stdout,
            stderr: resp.stderr,
        })
    }

    async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        let container_id = id.to_owned();
        self.call(
            "RemoveContainer",
            id,
            Duration::from_secs(30),
            |mut r, _| async move {
                r.remove_container(cri::RemoveContainerRequest { container_id })
                    .await
            },
        )
        .await
        .map(drop)
    }

    async fn list_containers(
        &self,
        filter: cri::ContainerFilter,
    ) -> Result<Vec<cri::Container>, CriError> {
        let resp = self
            .call(
                "ListContainers",
                "",
                Duration::ZERO,
                |mut r, _| async move {
                    r.list_containers(cri::ListContainersRequest {
                        filter: Some(filter),
                    })
                    .await
                },
            )
            .await?;
        Ok(resp.containers)
    }

    async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, CriError> {
        let container_id = id.to_owned();
        let resp = self
            .call(
                "ContainerStatus",
                id,
                Duration::ZERO,
                |mut r, _| async move {
                    r.container_status(cri::ContainerStatusRequest {
                        container_id,
                        verbose: false,
                    })
                    .await
                },
            )
            .await?;
        resp.status.ok_or_else(|| CriError::Missing {
            op: "ContainerStatus",
            id: id.to_owned(),
            what: "a status",
        })
    }

    async fn image_status(&self, image: &str) -> Result<Option<cri::Image>, CriError> {
        let spec = cri::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        };
        let resp = self
            .call(
                "ImageStatus",
                image,
                Duration::ZERO,
                |_, mut i| async move {
                    i.image_status(cri::ImageStatusRequest {
                        image: Some(spec),
                        verbose: false,
                    })
                    .await
                },
            )
            .await?;
        Ok(resp.image)
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
        sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let spec = cri::ImageSpec {
            image: image.to_owned(),
            ..Default::default()
        };
        let resp = self
            .call(
                "PullImage",
                image,
                Duration::from_secs(120),
                |_, mut i| async move {
                    i.pull_image(cri::PullImageRequest {
                        image: Some(spec),
                        auth,
                        sandbox_config,
                    })
                    .await
                },
            )
            .await?;
        Ok(resp.image_ref)
    }

    async fn image_filesystems(&self) -> Result<Vec<cri::FilesystemUsage>, CriError> {
        CriRuntime::image_fs_info(self).await
    }

    async fn list_images(&self) -> Result<Vec<cri::Image>, CriError> {
        let resp = self
            .call("ListImages", "", Duration::ZERO, |_, mut i| async move {
                i.list_images(cri::ListImagesRequest { filter: None }).await
            })
            .await?;
        Ok(resp.images)
    }

    async fn sandbox_image(&self) -> Result<Option<String>, CriError> {
        Ok(self
            .status_config()
            .await?
            .and_then(|v| v.get("sandboxImage")?.as_str().map(str::to_owned)))
    }

    async fn cgroup_driver(&self) -> Result<Option<CgroupDriver>, CriError> {
        let answer = self
            .call("RuntimeConfig", "", Duration::ZERO, |mut r, _| async move {
                r.runtime_config(cri::RuntimeConfigRequest {}).await
            })
            .await;
        match answer {
            Ok(resp) => {
                return Ok(resp.linux.map(|l| {
                    if l.cgroup_driver == cri::CgroupDriver::Systemd as i32 {
                        CgroupDriver::Systemd
                    } else {
                        CgroupDriver::Cgroupfs
                    }
                }));
            }
            Err(CriError::Status {
                code: tonic::Code::Unimplemented,
                ..
            }) => {}
            Err(e) => return Err(e),
        }
        Ok(self
            .status_config()
            .await?
            .and_then(|v| containerd_cgroup_driver(&v)))
    }

    async fn update_pod_sandbox_resources(
        &self,
        request: sandbox_resources::UpdatePodSandboxResourcesRequest,
    ) -> Result<(), CriError> {
        self.send_pod_sandbox_resources(request).await
    }

    async fn update_container_resources(
        &self,
        id: &str,
        resources: cri::LinuxContainerResources,
    ) -> Result<(), CriError> {
        let container_id = id.to_owned();
        self.call(
            "UpdateContainerResources",
            id,
            Duration::from_secs(10),
            |mut r, _| async move {
                r.update_container_resources(cri::UpdateContainerResourcesRequest {
                    container_id,
                    linux: Some(resources),
                    windows: None,
                    annotations: std::collections::HashMap::new(),
                })
                .await
            },
        )
        .await
        .map(drop)
    }

    async fn remove_image(&self, id: &str) -> Result<(), CriError> {
        let spec = cri::ImageSpec {
            image: id.to_owned(),
            ..Default::default()
        };
        self.call(
            "RemoveImage",
            id,
            Duration::from_secs(30),
            |_, mut i| async move {
                i.remove_image(cri::RemoveImageRequest { image: Some(spec) })
                    .await
            },
        )
        .await
        .map(drop)
    }
}

/// containerd's driver from its CRI config (verbose status `config`): the default runtime's
/// runc option `SystemdCgroup` (containerd 1.x: `containerd.runtimes.<default>.options`).
#[must_use]
pub fn containerd_cgroup_driver(config: &serde_json::Value) -> Option<CgroupDriver> {
    let containerd = config.get("containerd")?;
    let default = containerd
        .get("defaultRuntimeName")
        .and_then(|d| d.as_str())
        .unwrap_or("runc");
    let options = containerd.get("runtimes")?.get(default)?.get("options");
    let systemd = options
        .and_then(|o| o.get("SystemdCgroup"))
        .and_then(serde_json::Value::as_bool)
        .unwrap_or(false);
    Some(if systemd {
        CgroupDriver::Systemd
    } else {
        CgroupDriver::Cgroupfs
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn containerd_driver_from_its_cri_config() {
        let v = |s: &str| serde_json::from_str::<serde_json::Value>(s).expect("json");
        let systemd = v(
            r#"{"containerd":{"defaultRuntimeName":"runc","runtimes":{"runc":{"options":{"SystemdCgroup":true}}}}}"#,
        );
        assert_eq!(
            containerd_cgroup_driver(&systemd),
            Some(CgroupDriver::Systemd)
        );
        let fs = v(r#"{"containerd":{"runtimes":{"runc":{"options":{"SystemdCgroup":false}}}}}"#);
        assert_eq!(containerd_cgroup_driver(&fs), Some(CgroupDriver::Cgroupfs));
        let no_options = v(r#"{"containerd":{"runtimes":{"runc":{}}}}"#);
        assert_eq!(
            containerd_cgroup_driver(&no_options),
            Some(CgroupDriver::Cgroupfs)
        );
        assert_eq!(containerd_cgroup_driver(&v("{}")), None);
    }

    #[test]
    fn reconnect_backoff_doubles_to_the_cap() {
        let got: Vec<u64> = (1..=8)
            .map(|f| u64::try_from(reconnect_delay(f).as_millis()).unwrap_or(u64::MAX))
            .collect();
        assert_eq!(got, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(reconnect_delay(1000), RECONNECT_MAX);
    }

    #[tokio::test]
    async fn missing_socket_is_a_clear_error_then_backoff() {
        let dir = tempfile::tempdir().expect("tempdir");
        let rt = CriRuntime::new(dir.path().join("nope.sock"), Duration::from_millis(500));
        let first = rt.version().await.expect_err("no runtime there");
        assert!(matches!(first, CriError::Connect { .. }), "{first}");
        assert!(first.is_unavailable());
        assert!(first.to_string().contains("nope.sock"), "{first}");
        let second = rt.version().await.expect_err("still none");
        assert!(matches!(second, CriError::Backoff { .. }), "{second}");
    }
}
