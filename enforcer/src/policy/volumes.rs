//! The volumes a pod asks for, as kubelet's volume plugins set them up, and the CRI mounts of
//! each container (`makeMounts` in `pkg/kubelet/kubelet_pods.go`). Pure: paths are computed,
//! nothing is created or mounted here (`runtime::volumes` does that).
//!
//! Supported, as kubelet runs them: `emptyDir` (on disk, or `medium: Memory` as a tmpfs sized
//! as `calculateEmptyDirMemorySize` does), `hostPath` with its type checks (admission refuses
//! it unless the node allows host paths), `downwardAPI`, and `projected` with `downwardAPI`
//! sources. Pods from the API server also get `configMap`, `secret` and `projected` with
//! configMap, secret and service-account token sources (their objects read through
//! `runtime::objects`); a static or standalone pod asking for them is refused, as everything
//! else that needs objects or drivers this node does not have (PVCs, CSI, network file
//! systems): the pod is refused at admission with reason [`UNSUPPORTED_VOLUME_REASON`], never
//! run without a volume it asked for. kubelet has no such reason (it would wait for the mount
//! forever).

use std::path::{Component, Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{
    Container, DownwardAPIVolumeFile, Pod, ResourceFieldSelector, Volume,
};

use super::{
    env::{self, EnvError},
    eviction::manager::AdmitResult,
    objects::{self, KeyToPath, ObjectProjection, PodObjects, TokenRef},
    resources::{self, ResourceList},
};

/// Admission reason of a pod with a volume this node cannot set up.
pub const UNSUPPORTED_VOLUME_REASON: &str = "UnsupportedVolume";
/// kubelet's plugin directory names under `<pod dir>/volumes`.
pub const EMPTY_DIR_PLUGIN: &str = "kubernetes.io~empty-dir";
pub const DOWNWARD_API_PLUGIN: &str = "kubernetes.io~downward-api";
pub const PROJECTED_PLUGIN: &str = "kubernetes.io~projected";
pub const CONFIG_MAP_PLUGIN: &str = "kubernetes.io~configmap";
pub const SECRET_PLUGIN: &str = "kubernetes.io~secret";
/// The mode of downward API files when the volume names none (`DownwardAPIVolumeSourceDefaultMode`).
pub const DEFAULT_FILE_MODE: u32 = 0o644;

/// Why a container's mounts cannot be made (kubelet's `makeMounts` errors; the container is
/// not created, waiting with `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    NoVolume { volume: String, container: String },
    #[error("error SubPath `{0}` must not be an absolute path")]
    AbsoluteSubPath(String),
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    SubPathBacksteps(String),
    #[error("missing value for {0}")]
    SubPathExpr(String),
    #[error("invalid MountPropagation mode: {0:?}")]
    Propagation(String),
    #[error(
        "container {0:?}: Bidirectional mount propagation is available only to privileged containers"
    )]
    BidirectionalUnprivileged(String),
}

/// `spec.volumes[].hostPath.type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostPathType {
    /// `""`: no check.
    Unset,
    DirectoryOrCreate,
    Directory,
    FileOrCreate,
    File,
    Socket,
    CharDevice,
    BlockDevice,
}

impl HostPathType {
    /// The type from the spec; `None` for a name kubelet does not know.
    #[must_use]
    pub fn parse(s: Option<&str>) -> Option<Self> {
        Some(match s.unwrap_or("") {
            "" => Self::Unset,
            "DirectoryOrCreate" => Self::DirectoryOrCreate,
            "Directory" => Self::Directory,
            "FileOrCreate" => Self::FileOrCreate,
            "File" => Self::File,
            "Socket" => Self::Socket,
            "CharDevice" => Self::CharDevice,
            "BlockDevice" => Self::BlockDevice,
            _ => return None,
        })
    }
}

/// Where a downward API file's content comes from.
#[derive(Debug, Clone, PartialEq)]
pub enum DownwardSource {
    /// `fieldRef.fieldPath` (metadata only).
    Field(String),
    /// `resourceFieldRef` (with its container name).
    Resource(ResourceFieldSelector),
}

/// One file of a downward API (or projected) volume.
#[derive(Debug, Clone, PartialEq)]
pub struct DownwardItem {
    /// Relative path inside the volume.
    pub path: String,
    pub source: DownwardSource,
    /// The file's mode (the item's, else the volume's default).
    pub mode: u32,
}

/// A projected service-account token file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenProjection {
    pub token: TokenRef,
    pub path: String,
    pub mode: u32,
}

/// One source of an object-backed volume's files.
#[derive(Debug, Clone, PartialEq)]
pub enum FileSource {
    Downward(Vec<DownwardItem>),
    ConfigMap(ObjectProjection),
    Secret(ObjectProjection),
    Token(TokenProjection),
}

/// What a volume is.
#[derive(Debug, Clone, PartialEq)]
pub enum VolumeKind {
    /// A directory in the pod's directory; `memory` mounts a tmpfs there.
    EmptyDir {
        memory: bool,
        size_limit: Option<i64>,
    },
    /// A path on the host, checked before use.
    HostPath { path: PathBuf, kind: HostPathType },
    /// Files written atomically (downwardAPI, or projected with downwardAPI sources).
    Downward {
        plugin: &'static str,
        items: Vec<DownwardItem>,
    },
    /// Files from API objects, written atomically (configMap, secret, projected with
    /// configMap, secret or token sources); on a tmpfs (`memory`) for secrets and projected
    /// volumes, as kubelet's wrapped `emptyDir{medium: Memory}`, so they never reach a disk.
    Objects {
        plugin: &'static str,
        sources: Vec<FileSource>,
        memory: bool,
    },
}

impl VolumeKind {
    /// kubelet's `GetAttributes().ReadOnly`: downward API and projected volumes are mounted
    /// read-only whatever the volumeMount says.
    #[must_use]
    pub fn read_only(&self) -> bool {
        matches!(self, Self::Downward { .. } | Self::Objects { .. })
    }

    /// Whether its content comes from the API server (and is re-read at every sync).
    #[must_use]
    pub fn from_api(&self) -> bool {
        matches!(self, Self::Objects { .. })
    }
}

/// One volume of the pod, to set up before its containers start.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedVolume {
    pub name: String,
    pub kind: VolumeKind,
}

impl PlannedVolume {
    /// The volume's host path: under `<pod dir>/volumes/<plugin>/<name>`, or the hostPath.
    /// `None` for a name that is not one path component (never escapes the pod dir).
    #[must_use]
    pub fn path(&self, pod_dir: &Path) -> Option<PathBuf> {
        let plugin = match &self.kind {
            VolumeKind::HostPath { path, .. } => return Some(path.clone()),
            VolumeKind::EmptyDir { .. } => EMPTY_DIR_PLUGIN,
            VolumeKind::Downward { plugin, .. } | VolumeKind::Objects { plugin, .. } => plugin,
        };
        is_component(&self.name).then(|| pod_dir.join("volumes").join(plugin).join(&self.name))
    }
}

/// A single normal path component (no `/`, `.`, `..`, NUL).
#[must_use]
pub fn is_component(s: &str) -> bool {
    !s.is_empty()
        && !s.contains('\0')
        && !s.contains('/')
        && matches!(Path::new(s).components().next(), Some(Component::Normal(_)))
        && Path::new(s).components().count() == 1
}

/// A relative path with no `..` element (AtomicWriter's `validatePath`).
fn relative_no_backsteps(p: &str) -> Result<(), String> {
    if p.is_empty() {
        return Err("must not be empty".into());
    }
    if p.starts_with('/') {
        return Err("must not be an absolute path".into());
    }
    if p.contains('\0') {
        return Err("must not contain NUL".into());
    }
    if p.split('/').any(|part| part == "..") {
        return Err("must not contain '..'".into());
    }
    if p.starts_with("..") {
        return Err("must not start with '..'".into());
    }
    Ok(())
}

/// The fieldRef paths a downward API volume may read.
fn volume_field_ok(path: &str) -> bool {
    matches!(
        path,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "metadata.labels"
            | "metadata.annotations"
    ) || path.starts_with("metadata.labels['") && path.ends_with("']")
        || path.starts_with("metadata.annotations['") && path.ends_with("']")
}

fn file_mode(mode: Option<i32>, default: Option<i32>) -> u32 {
    mode.or(default)
        .and_then(|m| u32::try_from(m).ok())
        .map_or(DEFAULT_FILE_MODE, |m| m & 0o7777)
}

fn downward_items(
    volume: &str,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<Vec<DownwardItem>, String> {
    items
        .iter()
        .map(|i| {
            relative_no_backsteps(&i.path)
                .map_err(|e| format!("volume {volume:?}: item path {:?} {e}", i.path))?;
            let source = match (&i.field_ref, &i.resource_field_ref) {
                (Some(f), None) if volume_field_ok(&f.field_path) => {
                    DownwardSource::Field(f.field_path.clone())
                }
                (Some(f), None) => {
                    return Err(format!(
                        "volume {volume:?}: item {:?}: unsupported fieldPath {:?}",
                        i.path, f.field_path
                    ));
                }
                (None, Some(r)) if r.container_name.as_deref().is_some_and(|n| !n.is_empty()) => {
                    DownwardSource::Resource(r.clone())
                }
                (None, Some(_)) => {
                    return Err(format!(
                        "volume {volume:?}: item {:?}: resourceFieldRef needs a containerName",
                        i.path
                    ));
                }
                _ => {
                    return Err(format!(
                        "volume {volume:?}: item {:?} needs exactly one of fieldRef and resourceFieldRef",
                        i.path
                    ));
                }
            };
            Ok(DownwardItem {
                path: i.path.clone(),
                source,
                mode: file_mode(i.mode, default_mode),
            })
        })
        .collect()
}

/// The source kinds a volume (or projected source) names: its JSON keys besides `name`.
/// Asked only of what is refused, to name it.
fn source_kinds(v: &impl serde::Serialize) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m.keys().filter(|k| *k != "name").cloned().collect(),
        _ => Vec::new(),
    }
}

/// A configMap's or secret's `items` and modes, validated (relative paths, no `..`).
fn object_projection(
    volume: &str,
    name: &str,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: Option<i32>,
    optional: Option<bool>,
) -> Result<ObjectProjection, String> {
    if !objects::valid_name(name) {
        return Err(format!(
            "volume {volume:?}: {name:?} is not a valid object name"
        ));
    }
    let items = items
        .unwrap_or(&[])
        .iter()
        .map(|i| {
            relative_no_backsteps(&i.path)
                .map_err(|e| format!("volume {volume:?}: item path {:?} {e}", i.path))?;
            Ok(KeyToPath {
                key: i.key.clone(),
                path: i.path.clone(),
                mode: i
                    .mode
                    .and_then(|m| u32::try_from(m).ok())
                    .map(|m| m & 0o7777),
            })
        })
        .collect::<Result<Vec<_>, String>>()?;
    Ok(ObjectProjection {
        name: name.to_owned(),
        items,
        default_mode: file_mode(None, default_mode),
        optional: optional.unwrap_or(false),
    })
}

/// Why a volume that needs API objects cannot be set up for this pod.
fn no_api(name: &str, what: &str) -> String {
    format!(
        "volume {name:?}: {what} needs API server objects; only pods from the API server read them (not static pods, not a standalone node)"
    )
}

/// The pod's `securityContext.fsGroup` (the group its volumes are given).
#[must_use]
pub fn fs_group(pod: &Pod) -> Option<u32> {
    pod.spec
        .as_ref()
        .and_then(|s| s.security_context.as_ref())
        .and_then(|c| c.fs_group)
        .and_then(|g| u32::try_from(g).ok())
}

/// One volume as this node sets it up, or why it cannot. `api`: the pod came from the API
/// server and the node reads objects there.
fn plan_volume(pod: &Pod, v: &Volume, api: bool) -> Result<PlannedVolume, String> {
    let name = v.name.clone();
    if !is_component(&name) {
        return Err(format!("volume name {name:?} is not a valid name"));
    }
    let kind = if let Some(e) = &v.empty_dir {
        let memory = match e.medium.as_deref().unwrap_or("") {
            "" => false,
            "Memory" => true,
            other => {
                return Err(format!(
                    "volume {name:?}: emptyDir medium {other:?} is not supported by this node"
                ));
            }
        };
        VolumeKind::EmptyDir {
            memory,
            size_limit: e
                .size_limit
                .as_ref()
                .map(|q| resources::lenient(q).value())
                .filter(|s| *s > 0),
        }
    } else if let Some(h) = &v.host_path {
        let kind = HostPathType::parse(h.type_.as_deref()).ok_or_else(|| {
            format!(
                "volume {name:?}: {} is an invalid volume type",
                h.type_.as_deref().unwrap_or("")
            )
        })?;
        if !h.path.starts_with('/') {
            return Err(format!(
                "volume {name:?}: hostPath {:?} must be an absolute path",
                h.path
            ));
        }
        VolumeKind::HostPath {
            path: PathBuf::from(&h.path),
            kind,
        }
    } else if let Some(d) = &v.downward_api {
        VolumeKind::Downward {
            plugin: DOWNWARD_API_PLUGIN,
            items: downward_items(&name, d.items.as_deref().unwrap_or(&[]), d.default_mode)?,
        }
    } else if let Some(c) = &v.config_map {
        if !api {
            return Err(no_api(&name, "a configMap volume"));
        }
        VolumeKind::Objects {
            plugin: CONFIG_MAP_PLUGIN,
            sources: vec![FileSource::ConfigMap(object_projection(
                &name,
                &c.name,
                c.items.as_deref(),
                c.default_mode,
                c.optional,
            )?)],
            memory: false,
        }
    } else if let Some(sv) = &v.secret {
        if !api {
            return Err(no_api(&name, "a secret volume"));
        }
        VolumeKind::Objects {
            plugin: SECRET_PLUGIN,
            sources: vec![FileSource::Secret(object_projection(
                &name,
                sv.secret_name.as_deref().unwrap_or(""),
                sv.items.as_deref(),
                sv.default_mode,
                sv.optional,
            )?)],
            memory: true,
        }
    } else if let Some(p) = &v.projected {
        let mut items = Vec::new();
        let mut sources = Vec::new();
        for s in p.sources.iter().flatten() {
            if let Some(d) = s.downward_api.as_ref() {
                let d = downward_items(&name, d.items.as_deref().unwrap_or(&[]), p.default_mode)?;
                items.extend(d.iter().cloned());
                sources.push(FileSource::Downward(d));
                continue;
            }
            if !api {
                let what = source_kinds(s).join(", ");
                return Err(no_api(&name, &format!("projected source {what}")));
            }
            if let Some(c) = &s.config_map {
                sources.push(FileSource::ConfigMap(object_projection(
                    &name,
                    &c.name,
                    c.items.as_deref(),
                    p.default_mode,
                    c.optional,
                )?));
            } else if let Some(c) = &s.secret {
                sources.push(FileSource::Secret(object_projection(
                    &name,
                    &c.name,
                    c.items.as_deref(),
                    p.default_mode,
                    c.optional,
                )?));
            } else if let Some(t) = &s.service_account_token {
                relative_no_backsteps(&t.path)
                    .map_err(|e| format!("volume {name:?}: token path {:?} {e}", t.path))?;
                let service_account = objects::service_account(pod);
                if !objects::valid_name(&service_account) {
                    return Err(format!(
                        "volume {name:?}: service account {service_account:?} is not a valid name"
                    ));
                }
                sources.push(FileSource::Token(TokenProjection {
                    token: TokenRef {
                        service_account,
                        audience: t.audience.clone().filter(|a| !a.is_empty()),
                        expiration_seconds: t
                            .expiration_seconds
                            .unwrap_or(objects::DEFAULT_TOKEN_EXPIRATION_SECONDS),
                    },
                    path: t.path.clone(),
                    // kubelet: 0600 when an fsGroup will widen it to 0640, else the
                    // volume's default mode.
                    mode: if fs_group(pod).is_some() {
                        0o600
                    } else {
                        file_mode(None, p.default_mode)
                    },
                }));
            } else {
                let what = source_kinds(s).join(", ");
                return Err(format!(
                    "volume {name:?}: projected source {what} is not supported by this node"
                ));
            }
        }
        if sources.iter().all(|s| matches!(s, FileSource::Downward(_))) {
            VolumeKind::Downward {
                plugin: PROJECTED_PLUGIN,
                items,
            }
        } else {
            VolumeKind::Objects {
                plugin: PROJECTED_PLUGIN,
                sources,
                memory: true,
            }
        }
    } else {
        let kinds = source_kinds(v);
        if kinds.is_empty() {
            // The API defaults a volume with no source to an emptyDir.
            VolumeKind::EmptyDir {
                memory: false,
                size_limit: None,
            }
        } else {
            let what = kinds.join(", ");
            let why = match what.as_str() {
                "persistentVolumeClaim" | "ephemeral" => " (it needs a volume controller)",
                _ => "",
            };
            return Err(format!(
                "volume {name:?}: {what} volumes are not supported by this node{why}"
            ));
        }
    };
    Ok(PlannedVolume { name, kind })
}

/// The pod's volumes, in spec order, or the first one this node cannot set up (a pod that
/// reads no API objects: standalone, or static).
pub fn plan(pod: &Pod) -> Result<Vec<PlannedVolume>, String> {
    plan_with(pod, false)
}

/// [`plan`], for a pod from the API server when `api` (configMap, secret, token volumes).
pub fn plan_with(pod: &Pod, api: bool) -> Result<Vec<PlannedVolume>, String> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| plan_volume(pod, v, api))
        .collect()
}

/// Admission: refuses a pod with a volume this node cannot set up ([`UNSUPPORTED_VOLUME_REASON`]).
pub fn admit(pod: &Pod) -> AdmitResult {
    admit_with(pod, false)
}

/// [`admit`] for a pod from the API server when `api`.
pub fn admit_with(pod: &Pod, api: bool) -> AdmitResult {
    match plan_with(pod, api) {
        Ok(_) => AdmitResult::admit(),
        Err(message) => AdmitResult::reject(UNSUPPORTED_VOLUME_REASON, message),
    }
}

/// The size of a memory emptyDir's tmpfs (`calculateEmptyDirMemorySize`): the node's
/// allocatable memory, lowered to the pod's memory limit and then to the volume's sizeLimit
/// when each is positive and smaller. `None` (the kernel's default) when nothing is known.
#[must_use]
pub fn tmpfs_size(
    allocatable_memory: Option<i64>,
    pod_memory_limit: Option<i64>,
    size_limit: Option<i64>,
) -> Option<i64> {
    let mut size = allocatable_memory.filter(|v| *v > 0);
    for lower in [pod_memory_limit, size_limit].into_iter().flatten() {
        if lower > 0 && size.is_none_or(|s| lower <= s) {
            size = Some(lower);
        }
    }
    size
}

/// One mount of a container, before its subPath (if any) is made safe on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMount {
    pub volume: String,
    pub container_path: String,
    /// The volume's host path.
    pub volume_path: PathBuf,
    /// The relative subPath inside the volume (validated: relative, no `..`).
    pub sub_path: Option<String>,
    pub readonly: bool,
    pub propagation: cri::MountPropagation,
}

impl PlannedMount {
    /// The CRI mount with `host_path` (the volume's, or the checked subPath's).
    #[must_use]
    pub fn to_cri(&self, host_path: &Path) -> cri::Mount {
        cri::Mount {
            container_path: self.container_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: self.readonly,
            selinux_relabel: false,
            propagation: self.propagation as i32,
            ..Default::default()
        }
    }
}

/// `translateMountPropagation`.
pub fn propagation(mode: Option<&str>) -> Result<cri::MountPropagation, MountError> {
    match mode {
        None | Some("None") => Ok(cri::MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(cri::MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") => Ok(cri::MountPropagation::PropagationBidirectional),
        Some(other) => Err(MountError::Propagation(other.to_owned())),
    }
}

/// `ExpandContainerVolumeMounts`: `subPathExpr` with the container's env; a variable that is
/// missing or empty is an error.
pub fn expand_sub_path_expr(expr: &str, env: &[(String, String)]) -> Result<String, MountError> {
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let out = env::expand(expr, &|name| {
        let v = env::lookup(env, name).unwrap_or_default();
        if v.is_empty() {
            missing.borrow_mut().insert(name.to_owned());
        }
        Some(v)
    });
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(MountError::SubPathExpr(
            missing.into_iter().collect::<Vec<_>>().join(", "),
        ))
    }
}

/// kubelet's `makeMounts` for one container: each volumeMount's volume path (plus subPath),
/// read-only when the mount or the volume says so, and its propagation. `env` is the
/// container's environment (for `subPathExpr`).
pub fn container_mounts(
    c: &Container,
    volumes: &[PlannedVolume],
    pod_dir: &Path,
    env: &[(String, String)],
) -> Result<Vec<PlannedMount>, MountError> {
    let privileged = c.security_context.as_ref().and_then(|s| s.privileged) == Some(true);
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let no_volume = || MountError::NoVolume {
            volume: m.name.clone(),
            container: c.name.clone(),
        };
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .ok_or_else(no_volume)?;
        let volume_path = v.path(pod_dir).ok_or_else(no_volume)?;
        let sub_path = match m.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            Some(expr) => expand_sub_path_expr(expr, env)?,
            None => m.sub_path.clone().unwrap_or_default(),
        };
        let sub_path = if sub_path.is_empty() {
            None
        } else {
            if sub_path.starts_with('/') {
                return Err(MountError::AbsoluteSubPath(sub_path));
            }
            if sub_path.split('/').any(|p| p == "..") {
                return Err(MountError::SubPathBacksteps(sub_path));
            }
            Some(sub_path)
        };
        let propagation = propagation(m.mount_propagation.as_deref())?;
        if propagation == cri::MountPropagation::PropagationBidirectional && !privileged {
            return Err(MountError::BidirectionalUnprivileged(c.name.clone()));
        }
        out.push(PlannedMount {
            volume: m.name.clone(),
            container_path: m.mount_path.clone(),
            volume_path,
            sub_path,
            readonly: m.read_only == Some(true) || v.kind.read_only(),
            propagation,
        });
    }
    Ok(out)
}

/// The files of a downward API volume: (relative path, content, mode), from the pod (with its
/// limits merged from the node's allocatable for `resourceFieldRef`).
pub fn downward_files(
    pod: &Pod,
    items: &[DownwardItem],
    allocatable: &ResourceList,
) -> Result<Vec<(String, Vec<u8>, u32)>, EnvError> {
    let merged = env::pod_for_downward_api(pod, allocatable);
    items
        .iter()
        .map(|i| {
            let content = match &i.source {
                DownwardSource::Field(path) => env::metadata_field(pod, path)?,
                DownwardSource::Resource(fs) => env::resource_by_container(
                    &merged,
                    fs,
                    fs.container_name.as_deref().unwrap_or(""),
                )?,
            };
            Ok((i.path.clone(), content.into_bytes(), i.mode))
        })
        .collect()
}

/// The files of an object-backed volume (kubelet's projected `collectData`, and the
/// configMap and secret plugins' payloads): every source's files, later ones replacing
/// earlier ones at the same path; the errors of all failing sources together (kubelet's
/// aggregate: one error as is, several as `[a, b]`). Every path is checked as the
/// AtomicWriter checks it (relative, no `..`), a key included.
pub fn object_files(
    pod: &Pod,
    sources: &[FileSource],
    objects: &PodObjects,
    allocatable: &ResourceList,
) -> Result<Vec<objects::File>, String> {
    let mut files: Vec<objects::File> = Vec::new();
    let mut errors: Vec<String> = Vec::new();
    for s in sources {
        let got = match s {
            FileSource::Downward(items) => {
                downward_files(pod, items, allocatable).map_err(|e| e.to_string())
            }
            FileSource::ConfigMap(p) => objects::config_map_payload(objects, p),
            FileSource::Secret(p) => objects::secret_payload(objects, p),
            FileSource::Token(t) => objects
                .token(&t.token)
                .map(|tok| vec![(t.path.clone(), tok.as_bytes().to_vec(), t.mode)]),
        };
        match got {
            Ok(fs) => {
                for f in fs {
                    if let Err(e) = relative_no_backsteps(&f.0) {
                        errors.push(format!("invalid path {:?}: {e}", f.0));
                        continue;
                    }
                    files.retain(|g| g.0 != f.0);
                    files.push(f);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(files),
        1 => Err(errors.remove(0)),
        _ => Err(format!("[{}]", errors.join(", "))),
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::quantity::Quantity;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("pod yaml: {e}"))
    }

    const POD: &str = r#"
metadata: {name: web, namespace: ns, uid: u1, labels: {app: x, tier: "1"}}
spec:
  volumes:
  - {name: scratch, emptyDir: {}}
  - {name: mem, emptyDir: {medium: Memory, sizeLimit: 64Mi}}
  - {name: host, hostPath: {path: /var/log, type: Directory}}
  - name: info
    downwardAPI:
      defaultMode: 384
      items:
      - {path: labels, fieldRef: {fieldPath: metadata.labels}}
      - {path: sub/name, fieldRef: {fieldPath: metadata.name}, mode: 256}
      - {path: mem_limit, resourceFieldRef: {containerName: c, resource: limits.memory, divisor: 1Mi}}
  - name: proj
    projected:
      sources:
      - downwardAPI: {items: [{path: uid, fieldRef: {fieldPath: metadata.uid}}]}
  - {name: bare}
  containers:
  - name: c
    resources: {limits: {memory: 128Mi}}
    env: [{name: DIR, value: logs}]
    volumeMounts:
    - {name: scratch, mountPath: /scratch}
    - {name: scratch, mountPath: /sub, subPath: a/b}
    - {name: scratch, mountPath: /expr, subPathExpr: "$(DIR)/x"}
    - {name: host, mountPath: /host, readOnly: true, mountPropagation: HostToContainer}
    - {name: info, mountPath: /etc/info}
    - {name: proj, mountPath: /etc/proj, readOnly: false}
    - {name: mem, mountPath: /mem, mountPropagation: None}
"#;

    #[test]
    fn plans_the_supported_volumes() {
        let p = pod(POD);
        let vs = plan(&p).expect("supported");
        let names: Vec<&str> = vs.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["scratch", "mem", "host", "info", "proj", "bare"]);
        assert_eq!(
            vs[1].kind,
            VolumeKind::EmptyDir {
                memory: true,
                size_limit: Some(64 << 20)
            }
        );
        assert_eq!(
            vs[5].kind,
            VolumeKind::EmptyDir {
                memory: false,
                size_limit: None
            }
        );
        let dir = Path::new("/state/pods/u1");
        assert_eq!(
            vs[0].path(dir),
            Some(PathBuf::from(
                "/state/pods/u1/volumes/kubernetes.io~empty-dir/scratch"
            ))
        );
        assert_eq!(
            vs[3].path(dir),
            Some(PathBuf::from(
                "/state/pods/u1/volumes/kubernetes.io~downward-api/info"
            ))
        );
        assert_eq!(
            vs[4].path(dir),
            Some(PathBuf::from(
                "/state/pods/u1/volumes/kubernetes.io~projected/proj"
            ))
        );
        assert_eq!(vs[2].path(dir), Some(PathBuf::from("/var/log")));
        let VolumeKind::Downward { items, .. } = &vs[3].kind else {
            panic!("downward");
        };
        let modes: Vec<u32> = items.iter().map(|i| i.mode).collect();
        assert_eq!(modes, [0o600, 0o400, 0o600]);
        let allocatable =
            BTreeMap::from([("memory".to_owned(), Quantity::parse("8Gi").expect("q"))]);
        let files = downward_files(&p, items, &allocatable).expect("files");
        let text: Vec<(&str, String)> = files
            .iter()
            .map(|(p, c, _)| (p.as_str(), String::from_utf8_lossy(c).into_owned()))
            .collect();
        assert_eq!(
            text,
            [
                ("labels", "app=\"x\"\ntier=\"1\"".to_owned()),
                ("sub/name", "web".to_owned()),
                ("mem_limit", "128".to_owned()),
            ]
        );
    }

    #[test]
    fn mounts_as_make_mounts() {
        let p = pod(POD);
        let vs = plan(&p).expect("supported");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let env = vec![("DIR".to_owned(), "logs".to_owned())];
        let ms = container_mounts(c, &vs, Path::new("/s/pods/u1"), &env).expect("mounts");
        let got: Vec<(&str, Option<&str>, bool, cri::MountPropagation)> = ms
            .iter()
            .map(|m| {
                (
                    m.container_path.as_str(),
                    m.sub_path.as_deref(),
                    m.readonly,
                    m.propagation,
                )
            })
            .collect();
        use cri::MountPropagation::*;
        assert_eq!(
            got,
            [
                ("/scratch", None, false, PropagationPrivate),
                ("/sub", Some("a/b"), false, PropagationPrivate),
                ("/expr", Some("logs/x"), false, PropagationPrivate),
                ("/host", None, true, PropagationHostToContainer),
                // Downward API and projected volumes are always read-only.
                ("/etc/info", None, true, PropagationPrivate),
                ("/etc/proj", None, true, PropagationPrivate),
                ("/mem", None, false, PropagationPrivate),
            ]
        );
        let cm = ms[3].to_cri(Path::new("/var/log"));
        assert_eq!(
            (
                cm.host_path.as_str(),
                cm.readonly,
                cm.selinux_relabel,
                cm.propagation
            ),
            ("/var/log", true, false, PropagationHostToContainer as i32)
        );
    }

    #[test]
    fn sub_path_and_propagation_refusals() {
        let vs = vec![PlannedVolume {
            name: "v".into(),
            kind: VolumeKind::EmptyDir {
                memory: false,
                size_limit: None,
            },
        }];
        let c = |mount: &str| -> Container {
            serde_yaml_ng::from_str(&format!("name: c\nvolumeMounts: [{mount}]")).expect("c")
        };
        let cases: &[(&str, Result<(), MountError>)] = &[
            ("{name: v, mountPath: /a, subPath: x/y}", Ok(())),
            (
                "{name: v, mountPath: /a, subPath: /etc}",
                Err(MountError::AbsoluteSubPath("/etc".into())),
            ),
            (
                "{name: v, mountPath: /a, subPath: ../x}",
                Err(MountError::SubPathBacksteps("../x".into())),
            ),
            (
                "{name: v, mountPath: /a, subPath: x/../../y}",
                Err(MountError::SubPathBacksteps("x/../../y".into())),
            ),
            // `..` inside a name is not a backstep.
            ("{name: v, mountPath: /a, subPath: x..y}", Ok(())),
            (
                "{name: v, mountPath: /a, subPathExpr: '$(NOPE)/x'}",
                Err(MountError::SubPathExpr("NOPE".into())),
            ),
            (
                "{name: v, mountPath: /a, subPathExpr: '$(UP)'}",
                Err(MountError::SubPathBacksteps("..".into())),
            ),
            (
                "{name: w, mountPath: /a}",
                Err(MountError::NoVolume {
                    volume: "w".into(),
                    container: "c".into(),
                }),
            ),
            (
                "{name: v, mountPath: /a, mountPropagation: Bidirectional}",
                Err(MountError::BidirectionalUnprivileged("c".into())),
            ),
            (
                "{name: v, mountPath: /a, mountPropagation: Sideways}",
                Err(MountError::Propagation("Sideways".into())),
            ),
        ];
        let env = vec![("UP".to_owned(), "..".to_owned())];
        for (mount, want) in cases {
            let got = container_mounts(&c(mount), &vs, Path::new("/p"), &env).map(|_| ());
            assert_eq!(&got, want, "{mount}");
        }
        // Bidirectional is for privileged containers.
        let mut priv_c = c("{name: v, mountPath: /a, mountPropagation: Bidirectional}");
        priv_c.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let ms = container_mounts(&priv_c, &vs, Path::new("/p"), &env).expect("privileged");
        assert_eq!(
            ms[0].propagation,
            cri::MountPropagation::PropagationBidirectional
        );
    }

    #[test]
    fn unsupported_volumes_are_refused() {
        let refused = |vol: &str| {
            let p = pod(&format!(
                "metadata: {{name: a}}\nspec: {{volumes: [{vol}], containers: [{{name: c}}]}}"
            ));
            let r = admit(&p);
            assert!(!r.admitted, "{vol}");
            assert_eq!(r.reason, UNSUPPORTED_VOLUME_REASON);
            r.message
        };
        let m = refused("{name: cfg, configMap: {name: x}}");
        assert!(
            m.contains("configMap volume needs API server objects") && m.contains("static"),
            "{m}"
        );
        let m = refused("{name: s, secret: {secretName: x}}");
        assert!(m.contains("secret volume"), "{m}");
        let m = refused("{name: d, persistentVolumeClaim: {claimName: x}}");
        assert!(m.contains("persistentVolumeClaim"), "{m}");
        let m = refused("{name: n, nfs: {server: s, path: /x}}");
        assert!(m.contains("nfs"), "{m}");
        let m = refused("{name: p, projected: {sources: [{serviceAccountToken: {path: token}}]}}");
        assert!(m.contains("serviceAccountToken"), "{m}");
        let m = refused("{name: h, emptyDir: {medium: HugePages}}");
        assert!(m.contains("HugePages"), "{m}");
        let m = refused("{name: h, hostPath: {path: /x, type: Weird}}");
        assert!(m.contains("Weird is an invalid volume type"), "{m}");
        let m = refused("{name: '..', emptyDir: {}}");
        assert!(m.contains("not a valid name"), "{m}");
        let m = refused(
            "{name: d, downwardAPI: {items: [{path: ../x, fieldRef: {fieldPath: metadata.name}}]}}",
        );
        assert!(m.contains("must not contain '..'"), "{m}");
        let m = refused(
            "{name: d, downwardAPI: {items: [{path: x, fieldRef: {fieldPath: spec.nodeName}}]}}",
        );
        assert!(m.contains("unsupported fieldPath"), "{m}");
        let ok = pod(POD);
        assert!(admit(&ok).admitted);
    }

    /// An API pod's configMap, secret and kube-api-access volumes: planned with kubelet's
    /// plugins, modes and media, and their files from a snapshot of the objects.
    #[test]
    fn api_pods_get_object_volumes() {
        use std::sync::Arc;

        use k8s_openapi::api::core::v1::ConfigMap;

        use crate::policy::objects::Fetched;
        let p = pod(r#"
metadata: {name: web, namespace: ns, uid: u1}
spec:
  securityContext: {fsGroup: 2000}
  volumes:
  - {name: cfg, configMap: {name: app, defaultMode: 288, items: [{key: a, path: conf/a}]}}
  - {name: sec, secret: {secretName: creds, optional: true}}
  - name: kube-api-access
    projected:
      defaultMode: 272
      sources:
      - serviceAccountToken: {expirationSeconds: 3607, path: token}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
  containers: [{name: c}]
"#);
        assert!(!admit(&p).admitted, "not from the API server");
        assert!(admit_with(&p, true).admitted);
        let vs = plan_with(&p, true).expect("planned");
        let dir = Path::new("/s/pods/u1");
        assert_eq!(
            vs[0].path(dir),
            Some(PathBuf::from(
                "/s/pods/u1/volumes/kubernetes.io~configmap/cfg"
            ))
        );
        assert_eq!(
            vs[1].path(dir),
            Some(PathBuf::from("/s/pods/u1/volumes/kubernetes.io~secret/sec"))
        );
        let media: Vec<bool> = vs
            .iter()
            .map(|v| matches!(v.kind, VolumeKind::Objects { memory: true, .. }))
            .collect();
        assert_eq!(media, [false, true, true], "secrets and projected on tmpfs");
        assert!(vs.iter().all(|v| v.kind.read_only() && v.kind.from_api()));
        let VolumeKind::Objects { sources, .. } = &vs[2].kind else {
            panic!("projected");
        };
        let FileSource::Token(t) = &sources[0] else {
            panic!("token first");
        };
        assert_eq!(
            t.mode, 0o600,
            "fsGroup: 0600, widened by the ownership change"
        );
        assert_eq!(t.token.expiration_seconds, 3607);
        assert_eq!(t.token.service_account, "default");
        let objects = PodObjects {
            api: true,
            namespace: "ns".into(),
            config_maps: BTreeMap::from([
                (
                    "app".to_owned(),
                    Fetched::Found(Arc::new(ConfigMap {
                        data: Some(BTreeMap::from([("a".into(), "1".into())])),
                        ..Default::default()
                    })),
                ),
                (
                    "kube-root-ca.crt".to_owned(),
                    Fetched::Found(Arc::new(ConfigMap {
                        data: Some(BTreeMap::from([("ca.crt".into(), "PEM".into())])),
                        ..Default::default()
                    })),
                ),
            ]),
            secrets: BTreeMap::from([("creds".to_owned(), Fetched::NotFound)]),
            tokens: BTreeMap::from([(t.token.clone(), Ok("jwt".to_owned()))]),
            services: None,
        };
        let files = |i: usize| {
            let VolumeKind::Objects { sources, .. } = &vs[i].kind else {
                panic!("objects");
            };
            object_files(&p, sources, &objects, &BTreeMap::new())
        };
        assert_eq!(files(0), Ok(vec![("conf/a".into(), b"1".to_vec(), 0o440)]));
        assert_eq!(
            files(1),
            Ok(Vec::new()),
            "an optional secret that is missing"
        );
        assert_eq!(
            files(2),
            Ok(vec![
                ("token".into(), b"jwt".to_vec(), 0o600),
                ("ca.crt".into(), b"PEM".to_vec(), 0o420),
                ("namespace".into(), b"ns".to_vec(), 0o420),
            ])
        );
        // A failing token and a missing configMap: both named.
        let mut broken = objects.clone();
        broken
            .tokens
            .insert(t.token.clone(), Err("failed to fetch token: 403".into()));
        broken
            .config_maps
            .insert("kube-root-ca.crt".into(), Fetched::NotFound);
        let VolumeKind::Objects { sources, .. } = &vs[2].kind else {
            panic!("objects");
        };
        assert_eq!(
            object_files(&p, sources, &broken, &BTreeMap::new()),
            Err("[failed to fetch token: 403, configmaps \"kube-root-ca.crt\" not found]".into())
        );
        // A key that would leave the volume.
        broken.config_maps.insert(
            "app".into(),
            Fetched::Found(Arc::new(ConfigMap {
                data: Some(BTreeMap::from([("..evil".into(), "x".into())])),
                ..Default::default()
            })),
        );
        let all = pod(
            "metadata: {name: w, namespace: ns}\nspec: {volumes: [{name: c, configMap: {name: app}}], containers: [{name: c}]}",
        );
        let vs = plan_with(&all, true).expect("planned");
        let VolumeKind::Objects { sources, .. } = &vs[0].kind else {
            panic!("objects");
        };
        let e = object_files(&all, sources, &broken, &BTreeMap::new()).expect_err("refused");
        assert!(e.contains("..evil"), "{e}");
        // Hostile object names never reach a URL.
        let hostile = pod(
            "metadata: {name: w}\nspec: {volumes: [{name: c, secret: {secretName: ../../nodes/x}}], containers: [{name: c}]}",
        );
        assert!(!admit_with(&hostile, true).admitted);
    }

    #[test]
    fn tmpfs_size_as_calculate_empty_dir_memory_size() {
        let gi = 1i64 << 30;
        let cases = [
            (Some(8 * gi), None, None, Some(8 * gi)),
            (Some(8 * gi), Some(gi), None, Some(gi)),
            (Some(8 * gi), Some(gi), Some(64 << 20), Some(64 << 20)),
            // A sizeLimit above what the pod may use is ignored.
            (Some(8 * gi), Some(gi), Some(2 * gi), Some(gi)),
            (Some(8 * gi), None, Some(16 * gi), Some(8 * gi)),
            (None, None, Some(gi), Some(gi)),
            (None, None, None, None),
        ];
        for (alloc, pod_limit, size_limit, want) in cases {
            assert_eq!(tmpfs_size(alloc, pod_limit, size_limit), want);
        }
    }
}
