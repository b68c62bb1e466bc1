//! The volume executor: sets up what `policy::volumes` planned (kubelet's volume plugins'
//! `SetUp`) and tears it down when the pod is gone (`TearDown`). Volumes live under
//! `<state dir>/pods/<uid>/volumes/<plugin>/<name>`, kubelet's layout under its root dir:
//!
//! - emptyDir: a 0777 directory; `medium: Memory` mounts a tmpfs there (`size=` from
//!   `policy::volumes::tmpfs_size`, and `noswap` where the kernel has it). Its pages are charged to the memory cgroup of the
//!   process that writes them, so the pod's memory usage counts them.
//! - hostPath: the type check of `host_path.go` (`DirectoryOrCreate` creates, `Directory`
//!   must be one, ...), with kubelet's `hostPath type check failed: ...` message.
//! - downwardAPI / projected / configMap / secret: files written as kubelet's `AtomicWriter`
//!   does: a fresh `..<timestamp>` directory, the `..data` symlink swapped to it by rename,
//!   one symlink per top-level name pointing into `..data`; rewritten only when the content
//!   changes. Secret and projected volumes with API sources sit on a tmpfs (kubelet's wrapped
//!   memory emptyDir): a secret or token never reaches a disk.
//! - With a pod `fsGroup`, kubelet's `SetVolumeOwnership`: every file and directory of an
//!   emptyDir or object volume gets the group, group read (and write for emptyDirs), and
//!   directories the setgid bit.

use std::{
    collections::BTreeMap,
    io::Write as _,
    os::unix::fs::{
        DirBuilderExt as _, FileTypeExt as _, MetadataExt as _, OpenOptionsExt as _,
        PermissionsExt as _,
    },
    path::{Path, PathBuf},
};

use k8s_openapi::api::core::v1::Pod;

use crate::policy::{
    objects::PodObjects,
    resources::ResourceList,
    volumes::{self, HostPathType, PlannedMount, PlannedVolume, VolumeKind},
};

/// What failed while setting up or tearing down a volume.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    /// kubelet's `MountVolume.SetUp failed for volume "<name>" : <why>`.
    #[error("MountVolume.SetUp failed for volume {volume:?} : {message}")]
    SetUp { volume: String, message: String },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    /// A subPath that resolves outside its volume (a symlink in the volume pointing out).
    #[error("failed to prepare subPath for volumeMount {volume:?} of container {container:?}")]
    SubPath { volume: String, container: String },
    /// tmpfs mount options with a NUL byte.
    #[error("{0}")]
    TmpfsOptions(#[source] std::ffi::NulError),
    #[error("mounting tmpfs at {}: {source}", .path.display())]
    Tmpfs {
        path: PathBuf,
        #[source]
        source: rustix::io::Errno,
    },
    /// A hostPath that is not of its volume's `type` (`is_not`: "a directory", "a file"...).
    #[error("hostPath type check failed: {} is not {is_not}", .path.display())]
    HostPathType { path: PathBuf, is_not: &'static str },
}

trait WithPath<T> {
    fn with_path(self, path: &Path) -> Result<T, VolumeError>;
}

impl<T> WithPath<T> for std::io::Result<T> {
    fn with_path(self, path: &Path) -> Result<T, VolumeError> {
        self.map_err(|source| VolumeError::Io {
            path: path.to_path_buf(),
            source,
        })
    }
}

/// Whether `path` is a mount point (its device differs from its parent's).
#[must_use]
pub fn is_mount_point(path: &Path) -> bool {
    let (Ok(me), Some(Ok(parent))) = (
        std::fs::symlink_metadata(path),
        path.parent().map(std::fs::symlink_metadata),
    ) else {
        return false;
    };
    me.is_dir() && me.dev() != parent.dev()
}

fn make_dir(path: &Path, mode: u32) -> Result<(), VolumeError> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(mode)
        .create(path)
        .with_path(path)?;
    // The umask may have narrowed it (kubelet chmods emptyDirs to 0777 as well).
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).with_path(path)
}

/// Mounts a tmpfs of `size` bytes at `path` (kubelet's `generateTmpfsMountOptions`: `size=`
/// when known, and `noswap` where the kernel has it: 6.4+; an older kernel refuses the
/// option, and the mount is made without it).
fn mount_tmpfs(path: &Path, size: Option<i64>) -> Result<(), VolumeError> {
    let size_opt = size.map(|s| format!("size={s}"));
    let with_noswap = size_opt
        .as_ref()
        .map_or_else(|| "noswap".to_owned(), |o| format!("{o},noswap"));
    let mount = |opts: Option<&str>| -> Result<(), VolumeError> {
        let data = opts
            .map(std::ffi::CString::new)
            .transpose()
            .map_err(VolumeError::TmpfsOptions)?;
        rustix::mount::mount(
            "tmpfs",
            path,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            data.as_deref(),
        )
        .map_err(|source| VolumeError::Tmpfs {
            path: path.to_path_buf(),
            source,
        })
    };
    mount(Some(&with_noswap)).or_else(|_| mount(size_opt.as_deref()))
}

/// kubelet's `SetVolumeOwnership` (`changeFilePermission`): the group of everything below
/// `dir` becomes `gid`; files get group read (and write unless `read_only`), directories
/// also group execute and setgid. Symlinks get the group only.
pub fn set_volume_ownership(dir: &Path, gid: u32, read_only: bool) -> Result<(), VolumeError> {
    let mask = if read_only { 0o440 } else { 0o660 };
    let mut stack = vec![dir.to_path_buf()];
    while let Some(p) = stack.pop() {
        let md = std::fs::symlink_metadata(&p).with_path(&p)?;
        std::os::unix::fs::lchown(&p, None, Some(gid)).with_path(&p)?;
        if md.file_type().is_symlink() {
            continue;
        }
        let mut mode = md.permissions().mode() & 0o7777 | mask;
        if md.is_dir() {
            mode |= 0o2000 | 0o110;
            for e in std::fs::read_dir(&p).with_path(&p)?.flatten() {
                stack.push(e.path());
            }
        }
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).with_path(&p)?;
    }
    Ok(())
}

/// The pod's volumes, set up (idempotent: each sync calls it). `objects` holds the API
/// objects read for this sync (configMap, secret and projected volumes).
///
/// `pod_memory_limit` is the pod cgroup's memory limit, `allocatable` the node's.
pub fn setup(
    pod_dir: &Path,
    pod: &Pod,
    planned: &[PlannedVolume],
    allocatable: &ResourceList,
    pod_memory_limit: Option<i64>,
    objects: &PodObjects,
) -> Result<(), VolumeError> {
    let group = volumes::fs_group(pod);
    for v in planned {
        let fail = |message: String| VolumeError::SetUp {
            volume: v.name.clone(),
            message,
        };
        let Some(path) = v.path(pod_dir) else {
            return Err(fail("invalid volume name".to_owned()));
        };
        match &v.kind {
            VolumeKind::EmptyDir { memory, size_limit } => {
                let fresh = std::fs::symlink_metadata(&path).is_err();
                make_dir(&path, 0o777)?;
                if *memory && !is_mount_point(&path) {
                    let size = volumes::tmpfs_size(
                        allocatable.get("memory").map(|q| q.value()),
                        pod_memory_limit,
                        *size_limit,
                    );
                    mount_tmpfs(&path, size).map_err(|e| fail(e.to_string()))?;
                    tracing::info!(volume = %v.name, path = %path.display(), ?size, "memory emptyDir mounted");
                }
                if let Some(gid) = group
                    && (fresh || *memory)
                    && std::fs::metadata(&path).is_ok_and(|m| m.gid() != gid)
                {
                    set_volume_ownership(&path, gid, false)?;
                }
            }
            VolumeKind::HostPath { path, kind } => {
                check_host_path(path, *kind).map_err(|e| fail(e.to_string()))?
            }
            VolumeKind::Downward { items, .. } => {
                let files = volumes::downward_files(pod, items, allocatable)
                    .map_err(|e| fail(e.to_string()))?;
                make_dir(&path, 0o755)?;
                if write_atomic(&path, &owned_modes(files, group))?
                    && let Some(gid) = group
                {
                    set_volume_ownership(&path, gid, true)?;
                }
            }
            VolumeKind::Objects {
                sources, memory, ..
            } => {
                // Everything is read first: a volume whose objects cannot be read is not
                // touched (its last content stays).
                let files = volumes::object_files(pod, sources, objects, allocatable)
                    .map_err(|e| fail(e.to_string()))?;
                make_dir(&path, 0o755)?;
                if *memory && !is_mount_point(&path) {
                    let size = volumes::tmpfs_size(
                        allocatable.get("memory").map(|q| q.value()),
                        pod_memory_limit,
                        None,
                    );
                    mount_tmpfs(&path, size).map_err(|e| fail(e.to_string()))?;
                    tracing::info!(volume = %v.name, path = %path.display(), "volume tmpfs mounted");
                }
                if write_atomic(&path, &owned_modes(files, group))? {
                    tracing::info!(volume = %v.name, path = %path.display(), "volume content written");
                    if let Some(gid) = group {
                        set_volume_ownership(&path, gid, true)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// The modes files end with after [`set_volume_ownership`] (group read), so that an
/// unchanged volume is recognised as such.
fn owned_modes(
    files: Vec<(String, Vec<u8>, u32)>,
    group: Option<u32>,
) -> Vec<(String, Vec<u8>, u32)> {
    if group.is_none() {
        return files;
    }
    files
        .into_iter()
        .map(|(p, c, m)| (p, c, m | 0o440))
        .collect()
}

/// `checkType` of `host_path.go`.
pub fn check_host_path(path: &Path, kind: HostPathType) -> Result<(), VolumeError> {
    let meta = std::fs::metadata(path);
    let ft = meta.as_ref().ok().map(std::fs::Metadata::file_type);
    let exists = ft.is_some();
    let is_not = |is_not: &'static str| -> Result<(), VolumeError> {
        Err(VolumeError::HostPathType {
            path: path.to_path_buf(),
            is_not,
        })
    };
    match kind {
        HostPathType::Unset => Ok(()),
        HostPathType::DirectoryOrCreate if !exists => std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(path)
            .with_path(path),
        HostPathType::DirectoryOrCreate | HostPathType::Directory => {
            if ft.is_some_and(|t| t.is_dir()) {
                Ok(())
            } else {
                is_not("a directory")
            }
        }
        HostPathType::FileOrCreate if !exists => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o644)
            .open(path)
            .map(|_| ())
            .with_path(path),
        HostPathType::FileOrCreate | HostPathType::File => {
            if ft.is_some_and(|t| t.is_file()) {
                Ok(())
            } else {
                is_not("a file")
            }
        }
        HostPathType::Socket if ft.is_some_and(|t| t.is_socket()) => Ok(()),
        HostPathType::Socket => is_not("a socket file"),
        HostPathType::CharDevice if ft.is_some_and(|t| t.is_char_device()) => Ok(()),
        HostPathType::CharDevice => is_not("a character device"),
        HostPathType::BlockDevice if ft.is_some_and(|t| t.is_block_device()) => Ok(()),
        HostPathType::BlockDevice => is_not("a block device"),
    }
}

const DATA_DIR: &str = "..data";
const DATA_TMP: &str = "..data_tmp";

/// Whether the volume already holds exactly `files` (under `..data`).
fn unchanged(dir: &Path, files: &[(String, Vec<u8>, u32)]) -> bool {
    let data = dir.join(DATA_DIR);
    if std::fs::symlink_metadata(&data).is_err() {
        return false;
    }
    let mut count = 0usize;
    let mut stack = vec![data.clone()];
    while let Some(d) = stack.pop() {
        let Ok(rd) = std::fs::read_dir(&d) else {
            return false;
        };
        for e in rd.flatten() {
            match e.file_type() {
                Ok(t) if t.is_dir() => stack.push(e.path()),
                Ok(_) => count += 1,
                Err(_) => return false,
            }
        }
    }
    count == files.len()
        && files.iter().all(|(rel, content, mode)| {
            let p = data.join(rel);
            std::fs::read(&p).is_ok_and(|c| c == *content)
                && std::fs::metadata(&p).is_ok_and(|m| m.permissions().mode() & 0o7777 == *mode)
        })
}

/// kubelet's `AtomicWriter.Write` for one volume directory; whether it wrote (false when
/// the volume already held exactly `files`).
pub fn write_atomic(dir: &Path, files: &[(String, Vec<u8>, u32)]) -> Result<bool, VolumeError> {
    if unchanged(dir, files) {
        return Ok(false);
    }
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let ts_name = format!("..{nanos}");
    let ts = dir.join(&ts_name);
    make_dir(&ts, 0o755)?;
    let mut top: BTreeMap<String, ()> = BTreeMap::new();
    for (rel, content, mode) in files {
        // Planned paths are relative with no `..`; join each part to stay inside.
        let mut p = ts.clone();
        for part in rel.split('/').filter(|s| !s.is_empty() && *s != ".") {
            p.push(part);
        }
        if let Some(first) = rel.split('/').find(|s| !s.is_empty() && *s != ".") {
            top.insert(first.to_owned(), ());
        }
        if let Some(parent) = p.parent() {
            make_dir(parent, 0o755)?;
        }
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(true)
            .write(true)
            .mode(*mode)
            .open(&p)
            .with_path(&p)?;
        f.write_all(content).with_path(&p)?;
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(*mode)).with_path(&p)?;
    }
    // Swap `..data` to the new payload by rename (atomic for readers).
    let old = std::fs::read_link(dir.join(DATA_DIR)).ok();
    let tmp = dir.join(DATA_TMP);
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(&ts_name, &tmp).with_path(&tmp)?;
    std::fs::rename(&tmp, dir.join(DATA_DIR)).with_path(&dir.join(DATA_DIR))?;
    // User-visible names: symlinks into `..data`; stale ones go.
    for name in top.keys() {
        let link = dir.join(name);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new(DATA_DIR).join(name), &link).with_path(&link)?;
        }
    }
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !name.starts_with("..") && !top.contains_key(&name) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    if let Some(old) = old.filter(|o| o.as_os_str() != ts_name.as_str()) {
        let old = dir.join(old.file_name().unwrap_or_default());
        if old != *dir
            && old
                .file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with(".."))
        {
            let _ = std::fs::remove_dir_all(old);
        }
    }
    Ok(true)
}

/// The host path of one mount: the volume's, or its subPath inside the volume, created when
/// missing (kubelet's `SafeMakeDir`) and refused when it resolves outside the volume.
pub fn mount_host_path(m: &PlannedMount, container: &str) -> Result<PathBuf, VolumeError> {
    let Some(sub) = &m.sub_path else {
        return Ok(m.volume_path.clone());
    };
    let escape = || VolumeError::SubPath {
        volume: m.volume.clone(),
        container: container.to_owned(),
    };
    let mut p = m.volume_path.clone();
    for part in sub.split('/').filter(|s| !s.is_empty() && *s != ".") {
        if part == ".." {
            return Err(escape());
        }
        p.push(part);
    }
    if std::fs::symlink_metadata(&p).is_err() {
        let mode = std::fs::metadata(&m.volume_path)
            .map(|md| md.permissions().mode() & 0o7777)
            .unwrap_or(0o755);
        // Created part by part below the resolved volume root, never through a symlink out.
        let root = std::fs::canonicalize(&m.volume_path).map_err(|_| escape())?;
        let mut cur = root.clone();
        for part in sub.split('/').filter(|s| !s.is_empty() && *s != ".") {
            cur.push(part);
            match std::fs::symlink_metadata(&cur) {
                Ok(md) if md.file_type().is_symlink() => {
                    cur = std::fs::canonicalize(&cur).map_err(|_| escape())?;
                    if !cur.starts_with(&root) {
                        return Err(escape());
                    }
                }
                Ok(_) => {}
                Err(_) => make_dir(&cur, mode).map_err(|_| escape())?,
            }
        }
    }
    let resolved = std::fs::canonicalize(&p).map_err(|_| escape())?;
    let root = std::fs::canonicalize(&m.volume_path).map_err(|_| escape())?;
    if !resolved.starts_with(&root) {
        return Err(escape());
    }
    Ok(resolved)
}

/// Unmounts every volume mount under `<pod dir>/volumes` and removes the directory. An
/// unmount that fails leaves the directory (never walks into a live mount).
pub fn teardown(pod_dir: &Path) -> Result<(), VolumeError> {
    let root = pod_dir.join("volumes");
    let plugins = match std::fs::read_dir(&root) {
        Ok(rd) => rd,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => {
            return Err(VolumeError::Io {
                path: root,
                source: e,
            });
        }
    };
    for plugin in plugins.flatten() {
        let Ok(rd) = std::fs::read_dir(plugin.path()) else {
            continue;
        };
        for vol in rd.flatten() {
            let path = vol.path();
            if is_mount_point(&path) {
                rustix::mount::unmount(&path, rustix::mount::UnmountFlags::DETACH).map_err(
                    |e| VolumeError::Io {
                        path: path.clone(),
                        source: e.into(),
                    },
                )?;
                tracing::info!(path = %path.display(), "volume unmounted");
            }
        }
    }
    std::fs::remove_dir_all(&root).with_path(&root)
}

/// Removes a pod's directory: its volumes torn down first ([`teardown`]), then the rest
/// (logs) without ever crossing into another file system: a mount found below (one a
/// privileged container propagated back, say) is refused, and its directory left, rather
/// than its live contents deleted.
pub fn remove_pod_dir(pod_dir: &Path) -> Result<(), VolumeError> {
    teardown(pod_dir)?;
    let top = match std::fs::symlink_metadata(pod_dir) {
        Ok(md) => md,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_path(pod_dir),
    };
    remove_on_device(pod_dir, top.dev())
}

fn remove_on_device(dir: &Path, dev: u64) -> Result<(), VolumeError> {
    for e in std::fs::read_dir(dir).with_path(dir)?.flatten() {
        let path = e.path();
        let md = std::fs::symlink_metadata(&path).with_path(&path)?;
        if md.is_dir() {
            if md.dev() != dev {
                return Err(VolumeError::Io {
                    path,
                    source: std::io::Error::other("a mount point: not removed"),
                });
            }
            remove_on_device(&path, dev)?;
        } else {
            std::fs::remove_file(&path).with_path(&path)?;
        }
    }
    std::fs::remove_dir(dir).with_path(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn atomic_writer_layout_and_rewrites() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let files = vec![
            ("labels".to_owned(), b"a=\"1\"".to_vec(), 0o644),
            ("sub/name".to_owned(), b"web".to_vec(), 0o400),
        ];
        write_atomic(d, &files).expect("write");
        assert_eq!(std::fs::read(d.join("labels")).expect("labels"), b"a=\"1\"");
        assert_eq!(std::fs::read(d.join("sub/name")).expect("name"), b"web");
        assert!(
            std::fs::symlink_metadata(d.join("labels"))
                .expect("l")
                .file_type()
                .is_symlink()
        );
        let first = std::fs::read_link(d.join("..data")).expect("..data");
        // Unchanged content: nothing rewritten.
        write_atomic(d, &files).expect("again");
        assert_eq!(std::fs::read_link(d.join("..data")).expect("..data"), first);
        // Changed: a new payload, the old one and stale names gone.
        let files2 = vec![("labels".to_owned(), b"a=\"2\"".to_vec(), 0o644)];
        write_atomic(d, &files2).expect("rewrite");
        assert_eq!(std::fs::read(d.join("labels")).expect("labels"), b"a=\"2\"");
        assert!(std::fs::symlink_metadata(d.join("sub")).is_err());
        assert!(std::fs::symlink_metadata(d.join(&first)).is_err());
    }

    #[test]
    fn host_path_type_checks() {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let file = d.join("f");
        std::fs::write(&file, b"x").expect("file");
        let check = |p: &Path, k| check_host_path(p, k).map_err(|e| e.to_string());
        assert_eq!(check(d, HostPathType::Directory), Ok(()));
        assert_eq!(
            check(&file, HostPathType::Directory),
            Err(format!(
                "hostPath type check failed: {} is not a directory",
                file.display()
            ))
        );
        assert_eq!(
            check(d, HostPathType::File),
            Err(format!(
                "hostPath type check failed: {} is not a file",
                d.display()
            ))
        );
        assert_eq!(
            check(&file, HostPathType::Socket),
            Err(format!(
                "hostPath type check failed: {} is not a socket file",
                file.display()
            ))
        );
        let made = d.join("a/b");
        assert_eq!(check(&made, HostPathType::DirectoryOrCreate), Ok(()));
        assert!(made.is_dir());
        let new_file = d.join("new");
        assert_eq!(check(&new_file, HostPathType::FileOrCreate), Ok(()));
        assert!(new_file.is_file());
        assert_eq!(check(&d.join("nope"), HostPathType::Unset), Ok(()));
        assert!(check(&d.join("nope"), HostPathType::CharDevice).is_err());
        assert_eq!(
            check(Path::new("/dev/null"), HostPathType::CharDevice),
            Ok(())
        );
    }

    #[test]
    fn sub_paths_are_created_inside_and_never_escape() {
        let dir = tempfile::tempdir().expect("tempdir");
        let vol = dir.path().join("vol");
        std::fs::create_dir(&vol).expect("vol");
        let m = |sub: &str| PlannedMount {
            volume: "v".into(),
            container_path: "/x".into(),
            volume_path: vol.clone(),
            sub_path: Some(sub.into()),
            readonly: false,
            propagation: k8s_cri::v1::MountPropagation::PropagationPrivate,
        };
        let got = mount_host_path(&m("a/b"), "c").expect("made");
        assert!(got.is_dir() && got.ends_with("vol/a/b"));
        std::os::unix::fs::symlink("/etc", vol.join("out")).expect("symlink");
        assert!(matches!(
            mount_host_path(&m("out"), "c"),
            Err(VolumeError::SubPath { .. })
        ));
        assert!(matches!(
            mount_host_path(&m("out/new"), "c"),
            Err(VolumeError::SubPath { .. })
        ));
    }

    #[test]
    fn teardown_removes_the_volumes() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod_dir = dir.path().join("pod");
        let v = pod_dir
            .join("volumes")
            .join(volumes::EMPTY_DIR_PLUGIN)
            .join("x");
        std::fs::create_dir_all(&v).expect("dir");
        std::fs::write(v.join("f"), b"data").expect("file");
        assert!(crate::node::disk_usage(&v) > 0);
        teardown(&pod_dir).expect("teardown");
        assert!(!pod_dir.join("volumes").exists());
        teardown(&pod_dir).expect("idempotent");
    }

    /// The pod directory goes (volumes, logs, nested), but never through a mount found below
    /// it: the mount's contents survive and the error names it. Needs root (a tmpfs).
    #[test]
    fn pod_dir_removal_stops_at_mount_points() {
        let dir = tempfile::tempdir().expect("tempdir");
        let pod_dir = dir.path().join("pod");
        std::fs::create_dir_all(pod_dir.join("app")).expect("dir");
        std::fs::write(pod_dir.join("app/0.log"), b"log").expect("log");
        std::fs::create_dir_all(pod_dir.join("volumes/kubernetes.io~empty-dir/x/a")).expect("v");
        remove_pod_dir(&pod_dir).expect("removed");
        assert!(!pod_dir.exists());
        remove_pod_dir(&pod_dir).expect("a missing directory is fine");

        let mnt = pod_dir.join("app/propagated");
        std::fs::create_dir_all(&mnt).expect("dir");
        rustix::mount::mount(
            "tmpfs",
            &mnt,
            "tmpfs",
            rustix::mount::MountFlags::empty(),
            None,
        )
        .expect("tmpfs (root)");
        std::fs::write(mnt.join("live"), b"data").expect("file in the mount");
        let err = remove_pod_dir(&pod_dir).expect_err("a mount below is refused");
        assert!(err.to_string().contains("propagated"), "{err}");
        assert!(mnt.join("live").exists(), "the mount's contents are kept");
        rustix::mount::unmount(&mnt, rustix::mount::UnmountFlags::DETACH).expect("unmount");
        remove_pod_dir(&pod_dir).expect("removed once unmounted");
    }
}
