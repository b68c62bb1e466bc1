//! What a sandbox and a container start with (DNS, volumes, API objects, image, environment,
//! mounts) and kubelet's `startContainer`: image, create, start, postStart.

use std::path::PathBuf;

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};
use tokio::time::Instant;

use super::{PodWorker, WorkerError};
use crate::{
    cri::{
        ContainerRuntime,
        images::PullSecret,
        spec::{self, ContainerKind},
    },
    pods::{lifecycle, volumes},
    policy::{
        images::{self, keyring::Credential},
        objects::{ObjectRefs, PodObjects},
        pod_actions::PullPolicy,
        security::{self, ImageUser},
        volumes as volume_plan,
    },
    recorder::EventType,
    sources::apiserver::API_SOURCE,
    status_manager::now_nanos,
};

/// Why a pod's volumes, a container's config or an image's credentials cannot be made, in
/// kubelet's words (the pod's `FailedMount`, the container's `CreateContainerConfigError`,
/// the pull's failure).
#[derive(Debug, thiserror::Error)]
pub(super) enum StartError {
    #[error("invalid pod uid {0:?}")]
    PodDir(String),
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Plan(#[from] volume_plan::VolumePlanError),
    #[error("{0}")]
    Volume(#[from] volumes::VolumeError),
    #[error("{0}")]
    Env(#[from] crate::policy::env::EnvError),
    #[error("{0}")]
    Mounts(#[from] volume_plan::MountError),
    /// A pull secret that does not parse (`MakeDockerKeyring`'s error).
    #[error("{0}")]
    PullSecret(String),
}

/// What a container is created with beyond its spec's literal values.
struct EnvAndMounts {
    env: Vec<cri::KeyValue>,
    command: Vec<String>,
    args: Vec<String>,
    mounts: Vec<cri::Mount>,
}

impl<R: ContainerRuntime> PodWorker<R> {
    /// The sandbox's DNS configuration (kubelet's `GetPodDNS`), its warnings recorded on the
    /// pod (`MissingClusterDNS`, `DNSConfigForming`).
    pub(super) fn pod_dns(&self, pod: &Pod) -> Result<cri::DnsConfig, WorkerError> {
        let settings = &self.ctx.dns;
        let host = if settings.resolv_conf.is_empty() {
            None
        } else {
            let text = std::fs::read_to_string(&settings.resolv_conf).map_err(|source| {
                WorkerError::Io {
                    uid: self.uid.clone(),
                    path: PathBuf::from(&settings.resolv_conf),
                    source,
                }
            })?;
            Some(crate::policy::dns::parse_resolv_conf(&text))
        };
        let (r, warnings) =
            crate::policy::dns::pod_dns(pod, settings, host.as_ref()).map_err(|source| {
                WorkerError::Dns {
                    uid: self.uid.clone(),
                    source,
                }
            })?;
        for (reason, message) in warnings {
            self.event(None, EventType::Warning, reason, message);
        }
        Ok(r.to_cri())
    }

    /// The managed `/etc/hosts` of the pod (`<pod dir>/etc-hosts`, rewritten at each
    /// container creation as kubelet's `makeHostsMount`) as a CRI mount, when the container
    /// gets one.
    fn hosts_mount(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ips: &[String],
    ) -> Result<Option<cri::Mount>, StartError> {
        if !crate::policy::dns::mounts_hosts_file(c, pod_ips) {
            return Ok(None);
        }
        let io = |path: &std::path::Path| {
            let path = path.to_path_buf();
            move |source| StartError::Io { path, source }
        };
        let dir = self
            .pod_dir()
            .ok_or_else(|| StartError::PodDir(self.uid.clone()))?;
        let node_hosts = if pod
            .spec
            .as_ref()
            .and_then(|s| s.host_network)
            .unwrap_or(false)
        {
            let etc_hosts = std::path::Path::new("/etc/hosts");
            std::fs::read_to_string(etc_hosts).map_err(io(etc_hosts))?
        } else {
            String::new()
        };
        let text =
            crate::policy::dns::hosts_file(pod, pod_ips, &self.ctx.dns.cluster_domain, &node_hosts);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let path = dir.join("etc-hosts");
        std::fs::write(&path, text).map_err(io(&path))?;
        {
            use std::os::unix::fs::PermissionsExt as _;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644))
                .map_err(io(&path))?;
        }
        Ok(Some(cri::Mount {
            container_path: "/etc/hosts".to_owned(),
            host_path: path.display().to_string(),
            readonly: false,
            ..Default::default()
        }))
    }

    /// Whether the pod reads API objects: it came from the API server, in cluster mode.
    fn reads_api(&self) -> bool {
        self.ctx.objects.is_some() && self.source == API_SOURCE
    }

    /// The ConfigMaps, Secrets and tokens the pod names, read now (nothing, and kubelet's
    /// standalone messages, when the pod reads no API objects).
    pub(super) async fn read_objects(&self, pod: &Pod) -> PodObjects {
        let namespace = pod.metadata.namespace.as_deref().unwrap_or("default");
        let refs = ObjectRefs::of(pod);
        match &self.ctx.objects {
            // Every API pod reads services (its containers' service variables).
            Some(o) if self.reads_api() => o.snapshot(pod, &refs).await,
            _ => PodObjects::none(namespace),
        }
    }

    /// Sets up the pod's volumes (idempotent); the error is kubelet's mount failure message.
    /// Volumes from API objects are rewritten at every sync where their objects changed; a
    /// failure to refresh them once the pod runs is reported (`FailedMount`) and leaves
    /// their last content, the pod running on.
    pub(super) fn setup_volumes(
        &mut self,
        pod: &Pod,
        pod_memory_limit: Option<i64>,
    ) -> Result<(), StartError> {
        let planned = volume_plan::plan_with(pod, self.reads_api())?;
        let from_api = planned.iter().any(|v| v.kind.from_api());
        let set_up = self
            .volumes_set_up
            .as_ref()
            .is_some_and(|(p, limit)| p == pod && *limit == pod_memory_limit);
        if set_up && !from_api {
            return Ok(());
        }
        if !planned.is_empty() {
            let dir = self
                .pod_dir()
                .ok_or_else(|| StartError::PodDir(self.uid.clone()))?;
            let none = PodObjects::none(pod.metadata.namespace.as_deref().unwrap_or("default"));
            let objects = self.objects.as_deref().unwrap_or(&none);
            let result = volumes::setup(
                &dir,
                pod,
                &planned,
                &self.ctx.downward.allocatable,
                pod_memory_limit,
                objects,
            );
            if let Err(e) = result {
                self.event(None, EventType::Warning, "FailedMount", e.to_string());
                if set_up {
                    tracing::warn!(uid = %self.uid, error = %e, "volume refresh failed; the pod keeps their last content");
                    return Ok(());
                }
                return Err(e.into());
            }
        }
        self.volumes_set_up = Some((pod.clone(), pod_memory_limit));
        Ok(())
    }

    /// The container's environment, command and args expanded, and its CRI mounts (kubelet's
    /// `makeEnvironmentVariables`, `ExpandContainerCommandAndArgs`, `makeMounts`).
    fn env_and_mounts(
        &self,
        pod: &Pod,
        c: &Container,
        pod_ips: Vec<String>,
    ) -> Result<EnvAndMounts, StartError> {
        let hosts = self.hosts_mount(pod, c, &pod_ips)?;
        let ctx = crate::policy::env::EnvContext {
            pod_ips,
            objects: self.objects.clone(),
            ..self.ctx.downward.clone()
        };
        let env = crate::policy::env::container_env(pod, c, &ctx)?;
        let (command, args) = crate::policy::env::expand_command_and_args(c, &env);
        let planned = volume_plan::plan_with(pod, self.reads_api())?;
        let mut mounts = Vec::new();
        if c.volume_mounts.as_ref().is_some_and(|m| !m.is_empty()) {
            let dir = self
                .pod_dir()
                .ok_or_else(|| StartError::PodDir(self.uid.clone()))?;
            for m in volume_plan::container_mounts(c, &planned, &dir, &env)? {
                let host = volumes::mount_host_path(&m, &c.name)?;
                mounts.push(m.to_cri(&host));
            }
        }
        mounts.extend(hosts);
        Ok(EnvAndMounts {
            env: env
                .into_iter()
                .map(|(key, value)| cri::KeyValue { key, value })
                .collect(),
            command,
            args,
            mounts,
        })
    }

    /// Makes sure the image is there (pull policy), creates and starts a container.
    #[expect(
        clippy::too_many_arguments,
        reason = "the pieces of one CreateContainer"
    )]
    pub(super) async fn start(
        &mut self,
        pod: &Pod,
        c: &Container,
        kind: ContainerKind,
        restart_count: u32,
        sandbox_id: &str,
        sandbox_config: &cri::PodSandboxConfig,
        now: Instant,
    ) -> Result<(), WorkerError> {
        let Some((image_ref, image)) = self.ensure_image(c, sandbox_config, now).await? else {
            return Ok(());
        };
        let rt = self.ctx.runtime.clone();
        // kubelet's getImageUser: the user the image runs as, from ImageStatus.
        let image = match image {
            Some(i) => Some(i),
            None => rt
                .image_status(c.image.as_deref().unwrap_or_default())
                .await
                .map_err(self.cri())?,
        };
        // Decided before anything is created: runAsNonRoot against the image's user, then
        // the CRI security context; a refusal leaves the container uncreated and waiting.
        let security_context = match security::decide_container_security(
            pod,
            c,
            &ImageUser::of(image.as_ref()),
            &self.ctx.security,
        ) {
            Ok(sc) => sc,
            Err(e) => {
                tracing::warn!(uid = %self.uid, container = %c.name, error = %e, "container config refused");
                self.waiting.insert(
                    c.name.clone(),
                    ("CreateContainerConfigError".to_owned(), e.to_string()),
                );
                return Ok(());
            }
        };
        // A host-network pod has the node's IPs (kubelet's `podIPs = hostIPs`); another the
        // sandbox's (`status.podIP(s)` and the managed /etc/hosts), asked once per sandbox
        // (shared with the status record).
        let host_network = pod.spec.as_ref().and_then(|s| s.host_network) == Some(true);
        let pod_ips = if host_network {
            self.ctx.downward.host_ips.clone()
        } else {
            self.pod_ips(pod, sandbox_id).await
        };
        let made = match self.env_and_mounts(pod, c, pod_ips) {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(uid = %self.uid, container = %c.name, error = %e, "container config refused");
                self.waiting.insert(
                    c.name.clone(),
                    ("CreateContainerConfigError".to_owned(), e.to_string()),
                );
                return Ok(());
            }
        };
        let dir = self.ctx.log_root.join(&self.uid).join(&c.name);
        std::fs::create_dir_all(&dir).map_err(|source| WorkerError::Io {
            uid: self.uid.clone(),
            path: dir.clone(),
            source,
        })?;
        let resources = spec::ResourceOptions {
            cgroup: *self.ctx.cgroups.options(),
            cpuset: self.ctx.enforce.cpuset(&self.uid, &c.name),
            cpuset_mems: self.ctx.enforce.cpuset_mems(&self.uid, &c.name),
        };
        let mut config = spec::container_config_with(
            pod,
            c,
            kind,
            restart_count,
            &image_ref,
            self.ctx.node,
            &resources,
            security_context,
        );
        config.envs = made.env;
        config.command = made.command;
        config.args = made.args;
        config.mounts = made.mounts;
        if let Some(m) = self.termination_message_mount(c)? {
            config.mounts.push(m);
        }
        crate::metrics::global().container_started(kind);
        let id = rt
            .create_container(sandbox_id, config, sandbox_config.clone())
            .await
            .map_err(self.cri())?;
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Created",
            format!("Created container: {}", c.name),
        );
        if let Some(cpus) = &resources.cpuset {
            self.ctx.enforce.created_with(&id, cpus);
        }
        if let Err(e) = rt.start_container(&id).await {
            // The container is left exited; the next sync restarts it with backoff.
            self.start_failed(c, &e);
            return Ok(());
        }
        tracing::info!(uid = %self.uid, container = %c.name, id = %id, restart_count, "container started");
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Started",
            format!("Started container {}", c.name),
        );
        self.post_start(pod, c, &id, sandbox_id).await
    }

    /// A StartContainer that failed: logged, a `Failed` event, the container waiting with
    /// `RunContainerError`.
    fn start_failed(&mut self, c: &Container, e: &impl std::fmt::Display) {
        tracing::warn!(uid = %self.uid, container = %c.name, error = %e, "starting container failed");
        self.event(
            Some(&c.name),
            EventType::Warning,
            "Failed",
            format!("Error: {e}"),
        );
        self.waiting.insert(
            c.name.clone(),
            ("RunContainerError".to_owned(), e.to_string()),
        );
    }

    /// kubelet's `makeMounts` for `terminationMessagePath`: a new empty file (mode 0666) under
    /// `<pod dir>/containers/<name>/` for this instance, bind-mounted at the path.
    fn termination_message_mount(&self, c: &Container) -> Result<Option<cri::Mount>, WorkerError> {
        let path = c
            .termination_message_path
            .clone()
            .unwrap_or_else(|| lifecycle::DEFAULT_MESSAGE_PATH.to_owned());
        let Some(pod_dir) = self.pod_dir() else {
            return Ok(None);
        };
        if path.is_empty() || !path.starts_with('/') {
            return Ok(None);
        }
        let io = |path: &std::path::Path| {
            let uid = self.uid.clone();
            let path = path.to_path_buf();
            move |source| WorkerError::Io { uid, path, source }
        };
        let dir = pod_dir.join("containers").join(&c.name);
        std::fs::create_dir_all(&dir).map_err(io(&dir))?;
        let file = dir.join(format!("{:016x}", now_nanos()));
        std::fs::File::create(&file).map_err(io(&file))?;
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666))
                .map_err(io(&file))?;
        }
        Ok(Some(cri::Mount {
            container_path: path,
            host_path: file.display().to_string(),
            ..Default::default()
        }))
    }

    /// The image reference to create from and, when it was already there, its status; `None`
    /// (with a waiting reason) when it is not there and cannot be pulled now. kubelet's
    /// `EnsureImageExists`: the default tag, the pull policy against presence, the backoff,
    /// then a pull through the shared image manager (its slots and limiter) with the pod's
    /// pull secrets, with kubelet's events and waiting reasons at each step.
    async fn ensure_image(
        &mut self,
        c: &Container,
        sandbox_config: &cri::PodSandboxConfig,
        now: Instant,
    ) -> Result<Option<(String, Option<cri::Image>)>, WorkerError> {
        let requested = c.image.clone().unwrap_or_default();
        let image = match images::reference::with_default_tag(&requested) {
            Ok(i) => i,
            Err(e) => {
                let msg = images::reference::invalid_name_message(&requested, &e);
                self.event(
                    Some(&c.name),
                    EventType::Warning,
                    "InspectFailed",
                    msg.clone(),
                );
                self.image_error(c, images::ERR_INVALID_IMAGE_NAME, msg);
                return Ok(None);
            }
        };
        let policy = PullPolicy::of(c);
        let rt = self.ctx.runtime.clone();
        // `Always` does not look: it pulls.
        let present = if policy == PullPolicy::Always {
            None
        } else {
            rt.image_status(&image).await.map_err(self.cri())?
        };
        if let Some(img) = present {
            self.event(
                Some(&c.name),
                EventType::Normal,
                "Pulled",
                format!("Container image \"{requested}\" already present on machine"),
            );
            return Ok(Some((img.id.clone(), Some(img))));
        }
        if policy == PullPolicy::Never {
            let msg =
                format!("Container image \"{requested}\" is not present with pull policy of Never");
            self.event(
                Some(&c.name),
                EventType::Warning,
                images::ERR_IMAGE_NEVER_PULL,
                msg.clone(),
            );
            self.image_error(c, images::ERR_IMAGE_NEVER_PULL, msg);
            return Ok(None);
        }
        // kubelet's messages and backoff key name the image as the pod wrote it; CRI pulls the
        // tagged reference.
        let key = format!("{}_{requested}", self.uid);
        if self
            .image_backoff
            .backoff
            .in_backoff_since_update(&key, now)
        {
            let mut msg = format!("Back-off pulling image \"{requested}\"");
            self.event(Some(&c.name), EventType::Normal, "BackOff", msg.clone());
            if let Some(prev) = self.image_backoff.last_error.get(&key) {
                msg = format!("{msg}: {prev}");
            }
            self.image_error(c, images::ERR_IMAGE_PULL_BACKOFF, msg);
            return Ok(None);
        }
        let began = Instant::now();
        let creds = match self.pull_credentials(&image).await {
            Ok(c) => c,
            Err(e) => {
                // A secret that does not parse fails the pull (MakeDockerKeyring's error).
                self.pull_failed(c, &requested, &key, &e.to_string(), now);
                return Ok(None);
            }
        };
        self.event(
            Some(&c.name),
            EventType::Normal,
            "Pulling",
            format!("Pulling image \"{requested}\""),
        );
        let manager = self.ctx.images.clone();
        match manager
            .pull(rt.as_ref(), &image, &creds, sandbox_config)
            .await
        {
            Ok(p) => {
                let total = began.elapsed();
                self.event(
                    Some(&c.name),
                    EventType::Normal,
                    "Pulled",
                    images::pulled_message(&requested, p.pull, total, p.size),
                );
                crate::metrics::global().image_pulled(p.size, total);
                self.image_backoff.last_error.remove(&key);
                Ok(Some((p.image_ref, None)))
            }
            Err(e) if e.unavailable => Err(WorkerError::Image {
                uid: self.uid.clone(),
                message: e.message,
            }),
            Err(e) => {
                self.pull_failed(c, &requested, &key, &e.message, now);
                Ok(None)
            }
        }
    }

    /// A failed pull: kubelet's `Failed` event, the next backoff step, the waiting reason
    /// and message (`evalCRIPullErr`), and the `Error: <reason>` event.
    fn pull_failed(&mut self, c: &Container, image: &str, key: &str, error: &str, now: Instant) {
        tracing::warn!(uid = %self.uid, container = %c.name, image = %image, error = %error, "image pull failed");
        self.event(
            Some(&c.name),
            EventType::Warning,
            "Failed",
            format!("Failed to pull image \"{image}\": {error}"),
        );
        self.image_backoff.backoff.next(key, now);
        let (reason, msg) = images::pull_error(image, error);
        self.image_backoff
            .last_error
            .insert(key.to_owned(), format!("{reason}: {msg}"));
        self.image_error(c, reason, msg);
    }

    /// The container waits for its image: the waiting reason and message, and kubelet's
    /// `Error: <reason>` event of `startContainer`.
    fn image_error(&mut self, c: &Container, reason: &str, message: String) {
        if reason != images::ERR_IMAGE_NEVER_PULL {
            self.event(
                Some(&c.name),
                EventType::Warning,
                "Failed",
                format!("Error: {reason}"),
            );
        }
        self.waiting
            .insert(c.name.clone(), (reason.to_owned(), message));
    }

    /// The credentials for `image`: the pod's `imagePullSecrets` (from the API server for an
    /// API pod, else `<secret dir>/<name>.json`), then the node's `config.json`. A secret
    /// that cannot be read is skipped with kubelet's `FailedToRetrieveImagePullSecret`
    /// warning; one that does not parse fails the pull.
    async fn pull_credentials(&mut self, image: &str) -> Result<Vec<Credential>, StartError> {
        let Some(pod) = self.pod.clone() else {
            return Ok(Vec::new());
        };
        let names: Vec<String> = pod
            .spec
            .as_ref()
            .and_then(|s| s.image_pull_secrets.as_ref())
            .map(|v| {
                v.iter()
                    .map(|r| r.name.clone())
                    .filter(|n| !n.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let namespace = pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned());
        let mut keyrings = Vec::new();
        let mut missing = Vec::new();
        for name in &names {
            let found = match (&self.ctx.objects, self.source == API_SOURCE) {
                (Some(objects), true) => objects.pull_secret(&namespace, name).await,
                _ => self.ctx.images.file_secret(name),
            };
            match found {
                PullSecret::Found(k) => keyrings.push(k),
                PullSecret::Invalid(e) => return Err(StartError::PullSecret(e)),
                PullSecret::Unavailable(e) => {
                    tracing::warn!(uid = %self.uid, secret = %name, error = %e, "image pull secret not read");
                    missing.push(format!("{namespace}/{name}"));
                }
            }
        }
        if !missing.is_empty() {
            self.event(
                None,
                EventType::Warning,
                "FailedToRetrieveImagePullSecret",
                format!(
                    "Unable to retrieve some image pull secrets ({}); attempting to pull the image may not succeed.",
                    missing.join(", ")
                ),
            );
        }
        keyrings.push(self.ctx.images.node_keyring());
        let refs: Vec<&images::keyring::Keyring> = keyrings.iter().collect();
        Ok(images::keyring::lookup_all(&refs, image))
    }
}
