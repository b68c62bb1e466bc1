//! The volumes a pod asks for, as kubelet's volume plugins set them up, and the CRI mounts of
//! each container (`makeMounts` in `pkg/kubelet/kubelet_pods.go`). Pure: paths are computed,
//! nothing is created or mounted here (`crate::pods::volumes` does that).
//!
//! Supported, as kubelet runs them: `emptyDir` (on disk, or `medium: Memory` as a tmpfs sized
//! as `calculateEmptyDirMemorySize` does), `hostPath` with its type checks (admission refuses
//! it unless the node allows host paths), `downwardAPI`, and `projected` with `downwardAPI`
//! sources. Pods from the API server also get `configMap`, `secret` and `projected` with
//! configMap, secret and service-account token sources (their objects read through
//! `crate::pods::objects`); a static or standalone pod asking for them is refused, as everything
//! else that needs objects or drivers this node does not have (PVCs, CSI, network file
//! systems): the pod is refused at admission with reason [`UNSUPPORTED_VOLUME_REASON`], never
//! run without a volume it asked for. kubelet has no such reason (it would wait for the mount
//! forever).
//!
//! By job: [`plugins`] (each volume as this node's volume plugins set it up, or the refusal),
//! [`mounts`] (a container's mounts) and [`files`] (the content of downward API and
//! object-backed volumes); here, what a planned volume is and the path rules they share.

pub mod files;
pub mod mounts;
pub mod plugins;

pub use files::{VolumeFilesError, downward_files, object_files};
pub use mounts::{MountError, PlannedMount, container_mounts, expand_sub_path_expr, propagation};
pub use plugins::{VolumePlanError, admit, admit_with, plan, plan_with};

use std::path::{Component, Path, PathBuf};

use k8s_openapi::api::core::v1::{Pod, ResourceFieldSelector};

use super::objects::{ObjectProjection, TokenRef};

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

/// Why a path in a volume is refused (AtomicWriter's `validatePath`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum PathError {
    #[error("must not be empty")]
    Empty,
    #[error("must not be an absolute path")]
    Absolute,
    #[error("must not contain NUL")]
    Nul,
    #[error("must not contain '..'")]
    Backsteps,
    #[error("must not start with '..'")]
    StartsWithDots,
}

/// A relative path with no `..` element (AtomicWriter's `validatePath`).
fn relative_no_backsteps(p: &str) -> Result<(), PathError> {
    if p.is_empty() {
        return Err(PathError::Empty);
    }
    if p.starts_with('/') {
        return Err(PathError::Absolute);
    }
    if p.contains('\0') {
        return Err(PathError::Nul);
    }
    if p.split('/').any(|part| part == "..") {
        return Err(PathError::Backsteps);
    }
    if p.starts_with("..") {
        return Err(PathError::StartsWithDots);
    }
    Ok(())
}

fn file_mode(mode: Option<i32>, default: Option<i32>) -> u32 {
    mode.or(default)
        .and_then(|m| u32::try_from(m).ok())
        .map_or(DEFAULT_FILE_MODE, |m| m & 0o7777)
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

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("pod yaml: {e}"))
    }

    pub(super) const POD: &str = r#"
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
