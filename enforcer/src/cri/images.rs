//! kubelet's image manager, the I/O half (`pkg/kubelet/images`): pulls through CRI one at a
//! time (`serializeImagePulls`) or up to `maxParallelImagePulls` at once, each CRI pull
//! asking the registry limiter first (`registryPullQPS` / `registryBurst`, `TryAccept`:
//! past the limit the pull fails with `pull QPS exceeded`), each credential of the pod's
//! `imagePullSecrets` (then the node's `config.json`) tried in turn; and the image garbage
//! collector (`image_gc_manager.go`) on the runtime's image filesystem, every
//! `enforcer.imageGCPeriod` (kubelet's 5m), which the eviction manager's node-level reclaim
//! also calls (`DeleteUnusedImages`). The decisions are [`crate::policy::images`]'s.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
    time::Duration,
};

use k8s_cri::v1 as cri;
use tokio::{sync::Semaphore, time::Instant};

use crate::{
    cri::{ContainerRuntime, CriError},
    policy::images::{
        self, TokenBucket,
        gc::{self, Candidate, GcPolicy, ImageInfo, Records},
        keyring::{Credential, Keyring},
    },
    recorder::{EventType, Involved, Recorder},
};

/// The image settings of the pod workers and the collector.
#[derive(Clone, Debug)]
pub struct ImageOptions {
    /// `serializeImagePulls`.
    pub serialize: bool,
    /// `maxParallelImagePulls` (with `serialize` false; `None`: no limit).
    pub max_parallel: Option<u32>,
    /// `registryPullQPS` (0: no limit) and `registryBurst`.
    pub qps: u32,
    pub burst: u32,
    pub gc: GcPolicy,
    /// How often the collector runs.
    pub gc_period: Duration,
    /// Standalone `imagePullSecrets`: `<dir>/<name>.json`.
    pub secret_dir: PathBuf,
    /// The node's own docker config (kubelet's `<root dir>/config.json`), read at each pull
    /// when it exists.
    pub node_config: PathBuf,
}

impl Default for ImageOptions {
    fn default() -> Self {
        Self {
            serialize: true,
            max_parallel: None,
            qps: 5,
            burst: 10,
            gc: GcPolicy::default(),
            gc_period: gc::GC_PERIOD,
            secret_dir: PathBuf::from("/etc/enforcer/pull-secrets"),
            node_config: PathBuf::from("/var/lib/enforcer/config.json"),
        }
    }
}

/// A pod worker's image pull backoff (kubelet's key `<pod uid>_<image>`) and the last pull
/// error of each key (the `ImagePullBackOff` message carries it).
#[derive(Clone, Debug, Default)]
pub struct ImageBackoff {
    pub backoff: crate::policy::backoff::Backoff,
    pub last_error: std::collections::HashMap<String, String>,
}

/// A successful pull.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Pulled {
    pub image_ref: String,
    /// The image's size as the runtime reports it (0 when it does not say).
    pub size: u64,
    /// The CRI pull itself.
    pub pull: Duration,
}

/// A failed pull: the runtime's (or the limiter's) words, each credential's in turn.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PullFailed {
    pub message: String,
    /// The runtime could not be reached at all (the worker retries the sync, not the image).
    pub unavailable: bool,
}

/// A CRI error as kubelet prints a gRPC error (`rpc error: code = X desc = Y`).
fn go_error(e: &CriError) -> String {
    match e {
        CriError::Status { code, message, .. } => {
            let code = match code {
                tonic::Code::Cancelled => "Canceled".to_owned(),
                other => format!("{other:?}"),
            };
            format!("rpc error: code = {code} desc = {message}")
        }
        other => other.to_string(),
    }
}

/// The pullers, the limiter and the collector every pod worker shares.
#[derive(Debug)]
pub struct ImageManager {
    /// One permit per pull under way: 1 when serialized, `maxParallelImagePulls` else, none
    /// when unlimited.
    slots: Option<Semaphore>,
    limiter: Option<Mutex<TokenBucket>>,
    epoch: Instant,
    secret_dir: PathBuf,
    node_config: PathBuf,
    /// The image garbage collector (its records also mark what was pulled).
    pub gc: Arc<ImageGc>,
}

impl ImageManager {
    #[must_use]
    pub fn new(opts: &ImageOptions) -> Self {
        let slots = if opts.serialize {
            Some(1)
        } else {
            opts.max_parallel
        };
        Self {
            slots: slots.map(|n| Semaphore::new(usize::try_from(n).unwrap_or(usize::MAX))),
            limiter: TokenBucket::new(opts.qps, opts.burst).map(Mutex::new),
            epoch: Instant::now(),
            secret_dir: opts.secret_dir.clone(),
            node_config: opts.node_config.clone(),
            gc: Arc::new(ImageGc::new(opts.gc, opts.gc_period)),
        }
    }

    fn try_accept(&self) -> bool {
        let Some(l) = &self.limiter else { return true };
        let now = self.epoch.elapsed();
        crate::locks::lock(l).try_accept(now)
    }

    /// Pulls `image` (waiting for a slot first), trying each credential in turn (none:
    /// anonymously); its size from the runtime afterwards.
    pub async fn pull<R: ContainerRuntime>(
        &self,
        rt: &R,
        image: &str,
        creds: &[Credential],
        sandbox_config: &cri::PodSandboxConfig,
    ) -> Result<Pulled, PullFailed> {
        let _slot = match &self.slots {
            Some(s) => Some(s.acquire().await.map_err(|e| PullFailed {
                message: e.to_string(),
                unavailable: false,
            })?),
            None => None,
        };
        let start = Instant::now();
        let auths: Vec<Option<cri::AuthConfig>> = if creds.is_empty() {
            vec![None]
        } else {
            creds
                .iter()
                .map(|c| {
                    // kubelet sends the user and password alone (containerd parses a
                    // server address as a URL and refuses `host:port`).
                    Some(cri::AuthConfig {
                        username: c.username.clone(),
                        password: c.password.clone(),
                        ..Default::default()
                    })
                })
                .collect()
        };
        let mut errors = Vec::new();
        for auth in auths {
            if !self.try_accept() {
                errors.push(images::PULL_QPS_EXCEEDED.to_owned());
                continue;
            }
            match rt
                .pull_image(image, auth, Some(sandbox_config.clone()))
                .await
            {
                Ok(image_ref) => {
                    let pull = start.elapsed();
                    let size = match rt.image_status(&image_ref).await {
                        Ok(Some(i)) => i.size,
                        _ => 0,
                    };
                    return Ok(Pulled {
                        image_ref,
                        size,
                        pull,
                    });
                }
                Err(e) if e.is_unavailable() => {
                    return Err(PullFailed {
                        message: e.to_string(),
                        unavailable: true,
                    });
                }
                Err(e) => errors.push(go_error(&e)),
            }
        }
        Err(PullFailed {
            message: images::aggregate(&errors),
            unavailable: false,
        })
    }

    /// The node's keyring (`config.json` in the state directory), when there is one.
    #[must_use]
    pub fn node_keyring(&self) -> Keyring {
        let mut k = Keyring::default();
        match std::fs::read(&self.node_config) {
            Ok(text) => {
                if let Err(e) = k.add_document(&self.node_config.display().to_string(), &text) {
                    tracing::warn!(error = %e, "the node's docker config is not used");
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %self.node_config.display(), error = %e, "the node's docker config is not readable");
            }
        }
        k
    }

    /// A standalone pod's pull secret `name`: the docker config `<secret dir>/<name>.json`.
    #[must_use]
    pub fn file_secret(&self, name: &str) -> PullSecret {
        if !is_secret_name(name) {
            return PullSecret::Unavailable(format!("{name:?} is not a valid secret name"));
        }
        let path = self.secret_dir.join(format!("{name}.json"));
        match std::fs::read(&path) {
            Ok(text) => PullSecret::parse(&path.display().to_string(), &text),
            Err(e) => PullSecret::Unavailable(format!("{}: {e}", path.display())),
        }
    }
}

/// One of a pod's `imagePullSecrets`, looked up.
#[derive(Clone, Debug)]
pub enum PullSecret {
    Found(Keyring),
    /// Not there or not readable: skipped, with kubelet's warning.
    Unavailable(String),
    /// There but not a docker config: the pull fails with this.
    Invalid(String),
}

impl PullSecret {
    /// A docker config document named `source_name`.
    #[must_use]
    pub fn parse(source_name: &str, text: &[u8]) -> Self {
        let mut k = Keyring::default();
        match k.add_document(source_name, text) {
            Ok(()) => Self::Found(k),
            Err(e) => Self::Invalid(e.to_string()),
        }
    }
}

/// A DNS subdomain (a Secret's name): nothing that could leave the secret directory.
fn is_secret_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name.split('.').all(|l| {
            let b = l.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        })
}

/// The imagefs mountpoint from a CRI `ImageFsInfo` answer: the first absolute path that exists.
#[must_use]
pub fn imagefs_mountpoint(filesystems: &[cri::FilesystemUsage]) -> Option<PathBuf> {
    filesystems
        .iter()
        .filter_map(|f| f.fs_id.as_ref())
        .map(|id| PathBuf::from(&id.mountpoint))
        .find(|p| p.is_absolute() && p.exists())
}

/// What one collection removed.
#[must_use]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Collected {
    /// Images removed for their age, then for space.
    pub by_age: Vec<String>,
    pub by_space: Vec<String>,
    /// Bytes freed for space (the images' sizes).
    pub freed: u64,
    /// The bytes the space rule wanted (0: under the high threshold).
    pub wanted: u64,
}

/// Why a collection failed (kubelet's events: `InvalidDiskCapacity`, `FreeDiskSpaceFailed`,
/// `ImageGCFailed`).
#[derive(Debug, thiserror::Error)]
pub enum GcFailed {
    #[error("listing images or containers: {0}")]
    Cri(#[from] CriError),
    #[error("the image filesystem is unknown: {0}")]
    NoImagefs(String),
    #[error("{0}")]
    InvalidCapacity(gc::GcError),
    #[error("{message}")]
    NotEnough {
        message: String,
        collected: Collected,
    },
}

/// The image garbage collector: the records of every image, shared by its periodic run and
/// the eviction manager's node-level reclaim.
#[derive(Debug)]
pub struct ImageGc {
    pub policy: GcPolicy,
    pub period: Duration,
    records: Mutex<Records>,
    epoch: Instant,
}

impl ImageGc {
    #[must_use]
    pub fn new(policy: GcPolicy, period: Duration) -> Self {
        Self {
            policy,
            period,
            records: Mutex::new(Records::default()),
            epoch: Instant::now(),
        }
    }

    fn now(&self) -> Duration {
        self.epoch.elapsed()
    }

    /// `detectImages` then `imagesInEvictionOrder`: lists images and every container (an
    /// exited one still uses its image), updates the records, returns the unused, unpinned
    /// images in eviction order. The runtime's sandbox image counts as pinned.
    async fn candidates<R: ContainerRuntime>(
        &self,
        rt: &R,
        now: Duration,
    ) -> Result<Vec<Candidate>, CriError> {
        let containers = rt.list_containers(cri::ContainerFilter::default()).await?;
        let images = rt.list_images().await?;
        let sandbox = rt.sandbox_image().await.ok().flatten();
        let mut names_in_use: BTreeSet<String> = BTreeSet::new();
        for c in &containers {
            names_in_use.insert(c.image_ref.clone());
            if let Some(i) = &c.image {
                names_in_use.insert(i.image.clone());
            }
        }
        let short = |n: &str| -> String {
            n.strip_prefix("docker.io/library/")
                .or_else(|| n.strip_prefix("docker.io/"))
                .unwrap_or(n)
                .to_owned()
        };
        let mut in_use = BTreeSet::new();
        let infos: Vec<ImageInfo> = images
            .iter()
            .map(|i| {
                let names = || {
                    std::iter::once(&i.id)
                        .chain(&i.repo_tags)
                        .chain(&i.repo_digests)
                };
                if names().any(|n| names_in_use.contains(n)) {
                    in_use.insert(i.id.clone());
                }
                let is_sandbox = sandbox
                    .as_deref()
                    .is_some_and(|s| names().any(|n| n == s || short(n) == s));
                ImageInfo {
                    id: i.id.clone(),
                    size: i.size,
                    pinned: i.pinned || is_sandbox,
                }
            })
            .collect();
        let mut records = crate::locks::lock(&self.records);
        records.detect(&infos, &in_use, now);
        Ok(records.eviction_order(&in_use))
    }

    /// `detectImages` alone: the records brought up to date (new images first detected now,
    /// images in use last used now).
    pub async fn detect<R: ContainerRuntime>(&self, rt: &R) -> Result<(), CriError> {
        self.candidates(rt, self.now()).await.map(|_| ())
    }

    /// The unused, unpinned images in the collector's eviction order (least recently used,
    /// then first detected), after a detection.
    pub async fn eviction_order<R: ContainerRuntime>(
        &self,
        rt: &R,
    ) -> Result<Vec<String>, CriError> {
        Ok(self
            .candidates(rt, self.now())
            .await?
            .into_iter()
            .map(|c| c.id)
            .collect())
    }

    async fn remove<R: ContainerRuntime>(&self, rt: &R, c: &Candidate, reason: &str) -> bool {
        match rt.remove_image(&c.id).await {
            Ok(()) => {
                tracing::info!(image = %c.id, size = c.record.size, reason, "image garbage collected");
                crate::metrics::global().image_garbage_collected(reason);
                crate::locks::lock(&self.records).by_id.remove(&c.id);
                true
            }
            Err(e) if e.is_not_found() => true,
            Err(e) => {
                tracing::warn!(image = %c.id, error = %e, "removing an image");
                false
            }
        }
    }

    /// `GarbageCollect`: the age rule, then, when the image filesystem's usage is at or
    /// above the high threshold, unused images in eviction order until the low threshold's
    /// worth of bytes is freed. `began`: when the collector started (the age rule waits
    /// `imageMaximumGCAge` after it).
    pub async fn garbage_collect<R: ContainerRuntime>(
        &self,
        rt: &R,
        began: Duration,
    ) -> Result<Collected, GcFailed> {
        let now = self.now();
        let mut out = Collected::default();
        let mut candidates = Vec::new();
        for c in self.candidates(rt, now).await? {
            if gc::too_old(&c, &self.policy, now, began) && self.remove(rt, &c, "age").await {
                out.by_age.push(c.id);
            } else {
                candidates.push(c);
            }
        }
        let fs = rt.image_filesystems().await?;
        let mount = imagefs_mountpoint(&fs)
            .ok_or_else(|| GcFailed::NoImagefs(format!("ImageFsInfo answered {fs:?}")))?;
        let (capacity, available) = fs_bytes(&mount)
            .ok_or_else(|| GcFailed::NoImagefs(format!("{}: statvfs failed", mount.display())))?;
        let Some(wanted) = gc::amount_to_free(capacity, available, &self.policy)
            .map_err(GcFailed::InvalidCapacity)?
        else {
            return Ok(out);
        };
        out.wanted = wanted;
        tracing::info!(
            capacity,
            available,
            wanted,
            high = self.policy.high_percent,
            low = self.policy.low_percent,
            "disk usage on the image filesystem is over the high threshold, freeing down to the low threshold"
        );
        self.free_space(rt, &candidates, wanted, now, &mut out)
            .await;
        if out.freed < wanted {
            let message = gc::free_failed_message(wanted, out.freed);
            return Err(GcFailed::NotEnough {
                message,
                collected: out,
            });
        }
        Ok(out)
    }

    async fn free_space<R: ContainerRuntime>(
        &self,
        rt: &R,
        candidates: &[Candidate],
        wanted: u64,
        now: Duration,
        out: &mut Collected,
    ) {
        for c in candidates {
            if !gc::may_free_for_space(c, &self.policy, now) {
                continue;
            }
            if self.remove(rt, c, "space").await {
                out.by_space.push(c.id.clone());
                out.freed += c.record.size;
                if out.freed >= wanted {
                    break;
                }
            }
        }
    }

    /// `DeleteUnusedImages` (the eviction manager's node-level reclaim): every unused image
    /// the space rule may take, whatever the usage. Returns the number removed.
    pub async fn delete_unused<R: ContainerRuntime>(&self, rt: &R) -> Result<usize, CriError> {
        let now = self.now();
        let candidates = self.candidates(rt, now).await?;
        let mut out = Collected::default();
        self.free_space(rt, &candidates, u64::MAX, now, &mut out)
            .await;
        Ok(out.by_space.len())
    }

    /// The collector's loop: at once, then every period, until `shutdown`; failures as
    /// kubelet reports them (a second failure in a row is the node's `ImageGCFailed` event,
    /// not enough eligible the `FreeDiskSpaceFailed` one, a zero capacity
    /// `InvalidDiskCapacity`).
    pub async fn run<R: ContainerRuntime>(
        self: Arc<Self>,
        rt: Arc<R>,
        events: Recorder,
        node_name: String,
        shutdown: impl Future<Output = ()> + Send,
    ) {
        if self.policy.high_percent == 100 && self.policy.max_age.is_zero() {
            tracing::info!(
                "image garbage collection is off (imageGCHighThresholdPercent 100, no imageMaximumGCAge)"
            );
            return;
        }
        let began = self.now();
        let mut failed_before = false;
        let node = || Involved::node(&node_name);
        let work = async {
            loop {
                match self.garbage_collect(rt.as_ref(), began).await {
                    Ok(c) => {
                        failed_before = false;
                        if !c.by_age.is_empty() || !c.by_space.is_empty() {
                            tracing::info!(
                                by_age = c.by_age.len(),
                                by_space = c.by_space.len(),
                                freed = c.freed,
                                "image garbage collection"
                            );
                        }
                    }
                    Err(e) => {
                        match &e {
                            GcFailed::NotEnough { message, .. } => events.event(
                                node(),
                                EventType::Warning,
                                "FreeDiskSpaceFailed",
                                message.clone(),
                            ),
                            GcFailed::InvalidCapacity(g) => events.event(
                                node(),
                                EventType::Warning,
                                "InvalidDiskCapacity",
                                g.to_string(),
                            ),
                            _ => {}
                        }
                        if failed_before {
                            tracing::error!(error = %e, "image garbage collection failed multiple times in a row");
                            events.event(
                                node(),
                                EventType::Warning,
                                "ImageGCFailed",
                                e.to_string(),
                            );
                        } else {
                            tracing::warn!(error = %e, "image garbage collection failed once");
                        }
                        failed_before = true;
                    }
                }
                tokio::time::sleep(self.period).await;
            }
        };
        tokio::select! {
            () = work => {}
            () = shutdown => {}
        }
    }
}

/// The mountpoint's capacity and available bytes (statvfs).
#[must_use]
pub fn fs_bytes(path: &Path) -> Option<(u64, u64)> {
    let (available, capacity, _, _) = crate::node::statvfs(path).ok()?;
    Some((
        u64::try_from(capacity).ok()?,
        u64::try_from(available).ok()?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_names_stay_in_their_directory() {
        for bad in ["", "..", "../x", "a/b", "A", "a..b", "-a", "a\0"] {
            assert!(!is_secret_name(bad), "{bad:?}");
        }
        for good in ["regcred", "reg-cred.v1", "a"] {
            assert!(is_secret_name(good), "{good:?}");
        }
    }

    #[test]
    fn grpc_errors_print_as_go_prints_them() {
        let e = CriError::Status {
            op: "PullImage",
            id: "x".into(),
            code: tonic::Code::NotFound,
            message: "failed to pull".into(),
        };
        assert_eq!(
            go_error(&e),
            "rpc error: code = NotFound desc = failed to pull"
        );
    }
}
