//! A recording container runtime: sandboxes and containers in memory, every call logged, and
//! container exits driven by the test. Used for pod worker tests with tokio's paused clock.

use std::{
    collections::HashMap,
    sync::{Arc, Mutex},
};

use k8s_cri::v1 as cri;

use crate::cri::{ContainerRuntime, CriError};

#[derive(Debug, Default)]
struct State {
    next: u64,
    sandboxes: Vec<cri::PodSandbox>,
    containers: Vec<(cri::Container, cri::ContainerStatus)>,
    calls: Vec<String>,
    images: Vec<String>,
    down: bool,
    /// StartContainer calls still to fail (as a runtime timing out would).
    failing_starts: u32,
    /// `PodSandboxStatus` asks for the sandbox IPs.
    ip_asks: usize,
    /// Each created container's env, by container name (the last creation's).
    envs: HashMap<String, Vec<(String, String)>>,
    /// What `ExecSync` answers, by `"<container name> <command>"` or by container name:
    /// exit code and output (`None`: the exec timed out).
    execs: HashMap<String, Option<(i32, String)>>,
    /// The exit code StopContainer leaves (143 unless set: SIGTERM unhandled).
    stop_exit_code: Option<i32>,
    /// `ExecSync` calls, by container name and by `"<container name> <command>"`.
    exec_counts: HashMap<String, usize>,
}

/// The IP every fake sandbox has on its pod network.
pub const SANDBOX_IP: &str = "10.88.0.7";

/// The recording runtime. Clone shares the state.
#[derive(Clone, Debug, Default)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
}

fn matches(labels: &HashMap<String, String>, selector: &HashMap<String, String>) -> bool {
    selector.iter().all(|(k, v)| labels.get(k) == Some(v))
}

fn not_found(op: &'static str, id: &str) -> CriError {
    CriError::Status {
        op,
        id: id.to_owned(),
        code: tonic::Code::NotFound,
        message: "not found".to_owned(),
    }
}

impl FakeRuntime {
    /// A runtime holding these images.
    #[must_use]
    pub fn with_images(images: &[&str]) -> Self {
        let f = Self::default();
        f.with(|s| s.images = images.iter().map(|i| (*i).to_owned()).collect());
        f
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        let mut g = crate::locks::lock(&self.state);
        f(&mut g)
    }

    fn log(&self, call: String) -> Result<(), CriError> {
        self.with(|s| {
            if s.down {
                return Err(CriError::Connect {
                    socket: "fake".into(),
                    message: "down".to_owned(),
                });
            }
            s.calls.push(call);
            Ok(())
        })
    }

    /// The calls made so far (`Op arg`), oldest first.
    #[must_use]
    pub fn calls(&self) -> Vec<String> {
        self.with(|s| s.calls.clone())
    }

    /// Makes the next `n` StartContainer calls fail, leaving the containers created.
    pub fn fail_starts(&self, n: u32) {
        self.with(|s| s.failing_starts = n);
    }

    /// Makes every call fail as if the runtime were gone (or brings it back).
    pub fn set_down(&self, down: bool) {
        self.with(|s| s.down = down);
    }

    /// Lets the running container `name` exit with `code` (and a reason such as `OOMKilled`).
    pub fn exit(&self, name: &str, code: i32, reason: &str) -> bool {
        self.with(|s| {
            for (c, st) in s.containers.iter_mut().rev() {
                let is = c.metadata.as_ref().is_some_and(|m| m.name == name);
                if is && c.state == cri::ContainerState::ContainerRunning as i32 {
                    c.state = cri::ContainerState::ContainerExited as i32;
                    st.state = c.state;
                    st.exit_code = code;
                    st.reason = reason.to_owned();
                    st.finished_at = 2;
                    return true;
                }
            }
            false
        })
    }

    /// The mounts the newest container named `name` was created with.
    #[must_use]
    pub fn mounts_of(&self, name: &str) -> Vec<cri::Mount> {
        self.with(|s| {
            s.containers
                .iter()
                .rev()
                .find(|(c, _)| c.metadata.as_ref().is_some_and(|m| m.name == name))
                .map(|(_, st)| st.mounts.clone())
                .unwrap_or_default()
        })
    }

    /// Names of running containers.
    #[must_use]
    pub fn running(&self) -> Vec<String> {
        self.with(|s| {
            s.containers
                .iter()
                .filter(|(c, _)| c.state == cri::ContainerState::ContainerRunning as i32)
                .filter_map(|(c, _)| c.metadata.as_ref().map(|m| m.name.clone()))
                .collect()
        })
    }

    /// Number of sandboxes and containers held.
    #[must_use]
    pub fn counts(&self) -> (usize, usize) {
        self.with(|s| (s.sandboxes.len(), s.containers.len()))
    }

    /// How many times the sandbox IPs were asked.
    #[must_use]
    pub fn ip_asks(&self) -> usize {
        self.with(|s| s.ip_asks)
    }

    /// Makes every later `ExecSync` in the container named `key` (or, with a key such as
    /// `"app cat /ready"`, of that command in it) exit with `code` and print `output`
    /// (`None`: time out). Unset, an exec succeeds silently.
    pub fn set_exec(&self, key: &str, answer: Option<(i32, &str)>) {
        self.with(|s| {
            s.execs.insert(
                key.to_owned(),
                answer.map(|(code, out)| (code, out.to_owned())),
            )
        });
    }

    /// Containers stopped from now on exit with `code` (as a process handling SIGTERM).
    pub fn set_stop_exit_code(&self, code: i32) {
        self.with(|s| s.stop_exit_code = Some(code));
    }

    /// How many `ExecSync` calls reached the container named `key` (or ran that command
    /// in it, with a `"<name> <command>"` key).
    #[must_use]
    pub fn exec_count(&self, name: &str) -> usize {
        self.with(|s| s.exec_counts.get(name).copied().unwrap_or(0))
    }

    /// The env the container named `name` was last created with.
    #[must_use]
    pub fn env_of(&self, name: &str) -> Vec<(String, String)> {
        self.with(|s| s.envs.get(name).cloned().unwrap_or_default())
    }
}

impl ContainerRuntime for FakeRuntime {
    async fn version(&self) -> Result<cri::VersionResponse, CriError> {
        self.log("Version".to_owned())?;
        Ok(cri::VersionResponse {
            runtime_name: "fake".to_owned(),
            ..Default::default()
        })
    }

    async fn run_pod_sandbox(&self, config: cri::PodSandboxConfig) -> Result<String, CriError> {
        let uid = config
            .metadata
            .as_ref()
            .map(|m| m.uid.clone())
            .unwrap_or_default();
        self.log(format!("RunPodSandbox {uid}"))?;
        Ok(self.with(|s| {
            s.next += 1;
            let id = format!("sb{}", s.next);
            s.sandboxes.push(cri::PodSandbox {
                id: id.clone(),
                metadata: config.metadata.clone(),
                state: cri::PodSandboxState::SandboxReady as i32,
                created_at: i64::try_from(s.next).unwrap_or(0),
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
                runtime_handler: String::new(),
            });
            id
        }))
    }

    async fn pod_sandbox_ips(&self, _id: &str) -> Result<Vec<String>, CriError> {
        // Not logged: the recorded call sequences are the pod lifecycle's; counted instead.
        self.with(|s| s.ip_asks += 1);
        Ok(vec![SANDBOX_IP.to_owned()])
    }

    async fn stop_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.log(format!("StopPodSandbox {id}"))?;
        self.with(|s| {
            for (c, st) in &mut s.containers {
                if c.pod_sandbox_id == id && c.state == cri::ContainerState::ContainerRunning as i32
                {
                    c.state = cri::ContainerState::ContainerExited as i32;
                    st.state = c.state;
                    st.exit_code = 137;
                }
            }
            match s.sandboxes.iter_mut().find(|x| x.id == id) {
                Some(sb) => {
                    sb.state = cri::PodSandboxState::SandboxNotready as i32;
                    Ok(())
                }
                None => Err(not_found("StopPodSandbox", id)),
            }
        })
    }

    async fn remove_pod_sandbox(&self, id: &str) -> Result<(), CriError> {
        self.log(format!("RemovePodSandbox {id}"))?;
        self.with(|s| {
            s.containers.retain(|(c, _)| c.pod_sandbox_id != id);
            s.sandboxes.retain(|x| x.id != id);
        });
        Ok(())
    }

    async fn list_pod_sandboxes(
        &self,
        filter: cri::PodSandboxFilter,
    ) -> Result<Vec<cri::PodSandbox>, CriError> {
        self.log("ListPodSandbox".to_owned())?;
        Ok(self.with(|s| {
            s.sandboxes
                .iter()
                .filter(|x| matches(&x.labels, &filter.label_selector))
                .cloned()
                .collect()
        }))
    }

    async fn create_container(
        &self,
        sandbox_id: &str,
        config: cri::ContainerConfig,
        _sandbox_config: cri::PodSandboxConfig,
    ) -> Result<String, CriError> {
        let name = config
            .metadata
            .as_ref()
            .map(|m| m.name.clone())
            .unwrap_or_default();
        self.log(format!("CreateContainer {name}"))?;
        let env = config
            .envs
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone()))
            .collect();
        Ok(self.with(|s| {
            s.envs.insert(name.clone(), env);
            s.next += 1;
            let id = format!("c{}", s.next);
            let c = cri::Container {
                id: id.clone(),
                pod_sandbox_id: sandbox_id.to_owned(),
                metadata: config.metadata.clone(),
                image: config.image.clone(),
                image_ref: String::new(),
                state: cri::ContainerState::ContainerCreated as i32,
                created_at: i64::try_from(s.next).unwrap_or(0),
                labels: config.labels.clone(),
                annotations: config.annotations.clone(),
                image_id: String::new(),
            };
            let st = cri::ContainerStatus {
                id: id.clone(),
                metadata: config.metadata,
                state: c.state,
                created_at: c.created_at,
                labels: config.labels,
                annotations: config.annotations,
                mounts: config.mounts,
                log_path: config.log_path,
                ..Default::default()
            };
            s.containers.push((c, st));
            id
        }))
    }

    async fn start_container(&self, id: &str) -> Result<(), CriError> {
        let name = self.with(|s| {
            s.containers
                .iter()
                .find(|(c, _)| c.id == id)
                .and_then(|(c, _)| c.metadata.as_ref().map(|m| m.name.clone()))
        });
        self.log(format!("StartContainer {}", name.unwrap_or_default()))?;
        let fail = self.with(|s| {
            let fail = s.failing_starts > 0;
            s.failing_starts = s.failing_starts.saturating_sub(1);
            fail
        });
        if fail {
            return Err(CriError::Timeout {
                op: "StartContainer",
                id: id.to_owned(),
                after: std::time::Duration::from_secs(30),
            });
        }
        self.with(
            |s| match s.containers.iter_mut().find(|(c, _)| c.id == id) {
                Some((c, st)) => {
                    c.state = cri::ContainerState::ContainerRunning as i32;
                    st.state = c.state;
                    st.started_at = crate::status_manager::now_nanos();
                    Ok(())
                }
                None => Err(not_found("StartContainer", id)),
            },
        )
    }

    async fn stop_container(&self, id: &str, timeout_s: i64) -> Result<(), CriError> {
        let name = self.with(|s| {
            s.containers
                .iter()
                .find(|(c, _)| c.id == id)
                .and_then(|(c, _)| c.metadata.as_ref().map(|m| m.name.clone()))
        });
        self.log(format!(
            "StopContainer {} {timeout_s}",
            name.unwrap_or_default()
        ))?;
        self.with(|s| {
            let code = s.stop_exit_code.unwrap_or(143);
            if let Some((c, st)) = s.containers.iter_mut().find(|(c, _)| c.id == id)
                && c.state == cri::ContainerState::ContainerRunning as i32
            {
                c.state = cri::ContainerState::ContainerExited as i32;
                st.state = c.state;
                st.exit_code = code;
            }
        });
        Ok(())
    }

    async fn exec_sync(
        &self,
        id: &str,
        cmd: Vec<String>,
        timeout: std::time::Duration,
    ) -> Result<crate::cri::ExecOutput, CriError> {
        // Not logged (probes run every period); counted by container name.
        let answer = self.with(|s| {
            let running = s
                .containers
                .iter()
                .find(|(c, _)| {
                    c.id == id && c.state == cri::ContainerState::ContainerRunning as i32
                })
                .and_then(|(c, _)| c.metadata.as_ref().map(|m| m.name.clone()));
            running.map(|name| {
                let full = format!("{name} {}", cmd.join(" "));
                *s.exec_counts.entry(name.clone()).or_default() += 1;
                *s.exec_counts.entry(full.clone()).or_default() += 1;
                s.execs
                    .get(&full)
                    .or_else(|| s.execs.get(&name))
                    .cloned()
                    .unwrap_or(Some((0, String::new())))
            })
        });
        match answer {
            None => Err(not_found("ExecSync", id)),
            Some(Some((exit_code, out))) => Ok(crate::cri::ExecOutput {
                exit_code,
                stdout: out.into_bytes(),
                stderr: Vec::new(),
            }),
            Some(None) => {
                tokio::time::sleep(timeout).await;
                Err(CriError::Status {
                    op: "ExecSync",
                    id: id.to_owned(),
                    code: tonic::Code::DeadlineExceeded,
                    message: "context deadline exceeded".to_owned(),
                })
            }
        }
    }

    async fn remove_container(&self, id: &str) -> Result<(), CriError> {
        self.log(format!("RemoveContainer {id}"))?;
        self.with(|s| s.containers.retain(|(c, _)| c.id != id));
        Ok(())
    }

    async fn list_containers(
        &self,
        filter: cri::ContainerFilter,
    ) -> Result<Vec<cri::Container>, CriError> {
        self.log("ListContainers".to_owned())?;
        Ok(self.with(|s| {
            s.containers
                .iter()
                .map(|(c, _)| c)
                .filter(|c| matches(&c.labels, &filter.label_selector))
                .filter(|c| {
                    filter.pod_sandbox_id.is_empty() || c.pod_sandbox_id == filter.pod_sandbox_id
                })
                .cloned()
                .collect()
        }))
    }

    async fn container_status(&self, id: &str) -> Result<cri::ContainerStatus, CriError> {
        self.log(format!("ContainerStatus {id}"))?;
        self.with(|s| {
            s.containers
                .iter()
                .find(|(c, _)| c.id == id)
                .map(|(_, st)| st.clone())
                .ok_or_else(|| not_found("ContainerStatus", id))
        })
    }

    async fn image_status(&self, image: &str) -> Result<Option<cri::Image>, CriError> {
        self.log(format!("ImageStatus {image}"))?;
        Ok(self.with(|s| {
            s.images.iter().any(|i| i == image).then(|| cri::Image {
                id: format!("sha256:{image}"),
                ..Default::default()
            })
        }))
    }

    async fn pull_image(
        &self,
        image: &str,
        auth: Option<cri::AuthConfig>,
        _sandbox_config: Option<cri::PodSandboxConfig>,
    ) -> Result<String, CriError> {
        let who = auth.map_or_else(String::new, |a| format!(" as {}", a.username));
        self.log(format!("PullImage {image}{who}"))?;
        Err(CriError::Status {
            op: "PullImage",
            id: image.to_owned(),
            code: tonic::Code::Unknown,
            message: format!("failed to resolve reference \"{image}\": no registry reachable"),
        })
    }
}
