//! Pod sources. The manifest directory (kubelet's static pods, `--pod-manifest-path`): every
//! `*.yaml` / `*.yml` / `*.json` file holds one or more Pod documents; the directory is polled
//! and add / change / delete of files become ADD / UPDATE / DELETE pod updates. A bad file is
//! reported with the file and the problem and changes nothing else: the pods it held before stay
//! as they were.

pub mod apiserver;
pub(crate) mod feeds;
mod manifest;

use std::{
    collections::{BTreeMap, HashMap},
    io::Read as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::SystemTime,
};

use k8s_openapi::api::core::v1::Pod;

pub use manifest::{
    InvalidPod, is_dns_subdomain, is_valid_uid, parse_manifest, too_deep, validate,
};

/// Largest manifest file accepted.
pub const MAX_MANIFEST_BYTES: u64 = 1 << 20;
/// Deepest nesting of flow collections (`{`, `[`) accepted before parsing: a pod is a dozen
/// levels deep; a deeply nested file would cost the parser time quadratic in its depth.
pub const MAX_MANIFEST_DEPTH: usize = 64;
/// Which manifest file owns each pod uid, kept in the state directory so that ownership
/// survives a restart (a later file claiming a running pod's uid never wins by sorting first).
pub const UID_OWNERS_FILE: &str = "manifest-uids.json";
/// kubelet's `kubernetes.io/config.source`.
pub const CONFIG_SOURCE_ANNOTATION: &str = "kubernetes.io/config.source";
/// kubelet's `kubernetes.io/config.hash`.
pub const CONFIG_HASH_ANNOTATION: &str = "kubernetes.io/config.hash";

/// Why a manifest was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SourceError {
    #[error("{file}: cannot read: {message}")]
    Read { file: PathBuf, message: String },
    #[error("{file}: {size} bytes is larger than the {max} byte limit")]
    TooLarge { file: PathBuf, size: u64, max: u64 },
    #[error("{file}: line {line}: nested deeper than {max} levels")]
    TooDeep {
        file: PathBuf,
        line: usize,
        max: usize,
    },
    #[error("{file}: invalid YAML: {message}")]
    Yaml { file: PathBuf, message: String },
    #[error("{file}: document {doc}: {message}")]
    Invalid {
        file: PathBuf,
        doc: usize,
        message: String,
    },
    #[error("{file}: document {doc}: pod uid {uid:?} is already used by {other}")]
    DuplicateUid {
        file: PathBuf,
        doc: usize,
        uid: String,
        other: String,
    },
}

/// What happened to a pod.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PodOp {
    Add,
    Update,
    Delete,
}

/// One pod update, as kubelet's config sources send them.
#[derive(Clone, Debug, PartialEq)]
pub struct PodUpdate {
    pub op: PodOp,
    pub pod: Arc<Pod>,
    /// The file it came from, or `api`.
    pub source: String,
}

/// What a source reports.
#[derive(Clone, Debug, PartialEq)]
pub enum SourceEvent {
    Pod(PodUpdate),
    /// A file was refused (`Some(message)`), or is fine again (`None`).
    Rejected {
        file: String,
        message: Option<String>,
    },
    /// The source has delivered its complete initial state.
    Synced,
}

#[derive(Clone, Debug)]
struct FileState {
    stamp: (SystemTime, u64, u64),
    pods: Vec<Arc<Pod>>,
    rejected: bool,
}

/// The manifest directory source.
#[derive(Debug)]
pub struct ManifestDir {
    dir: PathBuf,
    node_name: String,
    files: BTreeMap<PathBuf, FileState>,
    synced: bool,
    /// Where uid ownership is persisted ([`UID_OWNERS_FILE`]), and what it holds now.
    owners_file: Option<PathBuf>,
    persisted: BTreeMap<String, PathBuf>,
    /// Entries with a manifest name that cannot be read as a file (a FIFO, a device, a
    /// symlink loop or a dangling link), reported once each, with why.
    unreadable: BTreeMap<PathBuf, String>,
}

/// The events of a manifest file's new pods against its `old` ones: a delete for each pod
/// gone, then an update for each changed and an add for each new one, in the file's order.
fn pod_changes(
    old_pods: &[Arc<Pod>],
    pods: &[Arc<Pod>],
    file: &str,
    events: &mut Vec<SourceEvent>,
) {
    let uid = |p: &Pod| p.metadata.uid.clone().unwrap_or_default();
    for old in old_pods {
        if !pods.iter().any(|p| uid(p) == uid(old)) {
            events.push(SourceEvent::Pod(PodUpdate {
                op: PodOp::Delete,
                pod: old.clone(),
                source: file.to_owned(),
            }));
        }
    }
    for p in pods {
        match old_pods.iter().find(|o| uid(o) == uid(p)) {
            Some(o) if o == p => {}
            Some(_) => events.push(SourceEvent::Pod(PodUpdate {
                op: PodOp::Update,
                pod: p.clone(),
                source: file.to_owned(),
            })),
            None => events.push(SourceEvent::Pod(PodUpdate {
                op: PodOp::Add,
                pod: p.clone(),
                source: file.to_owned(),
            })),
        }
    }
}

fn read_limited(path: &Path) -> Result<String, SourceError> {
    let read_err = |e: std::io::Error| SourceError::Read {
        file: path.to_path_buf(),
        message: e.to_string(),
    };
    let f = std::fs::File::open(path).map_err(read_err)?;
    let mut buf = Vec::new();
    f.take(MAX_MANIFEST_BYTES + 1)
        .read_to_end(&mut buf)
        .map_err(read_err)?;
    if buf.len() as u64 > MAX_MANIFEST_BYTES {
        return Err(SourceError::TooLarge {
            file: path.to_path_buf(),
            size: std::fs::metadata(path).map_or(buf.len() as u64, |m| m.len()),
            max: MAX_MANIFEST_BYTES,
        });
    }
    String::from_utf8(buf).map_err(|e| SourceError::Yaml {
        file: path.to_path_buf(),
        message: format!("not UTF-8: {e}"),
    })
}

fn stamp(meta: &std::fs::Metadata) -> (SystemTime, u64, u64) {
    use std::os::unix::fs::MetadataExt as _;
    (
        meta.modified().unwrap_or(SystemTime::UNIX_EPOCH),
        meta.len(),
        meta.ino(),
    )
}

impl ManifestDir {
    #[must_use]
    pub fn new(dir: impl Into<PathBuf>, node_name: &str) -> Self {
        Self {
            dir: dir.into(),
            node_name: node_name.to_owned(),
            files: BTreeMap::new(),
            synced: false,
            owners_file: None,
            persisted: BTreeMap::new(),
            unreadable: BTreeMap::new(),
        }
    }

    /// Persists which file owns each uid in `path` (read now, rewritten when it changes): after
    /// a restart a uid stays with the file that had it while that file still claims it.
    #[must_use]
    pub fn with_ownership_file(mut self, path: PathBuf) -> Self {
        match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice(&bytes) {
                Ok(map) => self.persisted = map,
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "ignoring an unreadable uid ownership file")
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "reading the uid ownership file")
            }
        }
        self.owners_file = Some(path);
        self
    }

    /// Writes the current ownership when it differs from what is persisted.
    fn persist_owners(&mut self) {
        let Some(path) = &self.owners_file else {
            return;
        };
        let now: BTreeMap<String, PathBuf> = self.owners().into_iter().collect();
        if now == self.persisted {
            return;
        }
        let written = serde_json::to_vec_pretty(&now)
            .map_err(|e| e.to_string())
            .and_then(|bytes| {
                crate::status_manager::write_atomic(path, &bytes).map_err(|e| e.to_string())
            });
        match written {
            Ok(()) => self.persisted = now,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "writing the uid ownership file")
            }
        }
    }

    /// Whether the directory has been read once (only then are running pods it does not
    /// list orphans).
    #[must_use]
    pub fn synced(&self) -> bool {
        self.synced
    }

    /// The uids currently owned, with the file owning each.
    fn owners(&self) -> HashMap<String, PathBuf> {
        let mut out = HashMap::new();
        for (path, st) in &self.files {
            for p in &st.pods {
                if let Some(uid) = &p.metadata.uid {
                    out.insert(uid.clone(), path.clone());
                }
            }
        }
        out
    }

    /// A changed manifest file's pods: bounded in size and depth, parsed, their uids checked
    /// against the other `present` files.
    fn read_manifest(
        &self,
        path: &Path,
        meta: &std::fs::Metadata,
        present: &BTreeMap<PathBuf, std::fs::Metadata>,
    ) -> Result<Vec<Pod>, SourceError> {
        let parsed = if meta.len() > MAX_MANIFEST_BYTES {
            Err(SourceError::TooLarge {
                file: path.to_path_buf(),
                size: meta.len(),
                max: MAX_MANIFEST_BYTES,
            })
        } else {
            read_limited(path).and_then(|text| {
                if let Some(line) = too_deep(&text, MAX_MANIFEST_DEPTH) {
                    return Err(SourceError::TooDeep {
                        file: path.to_path_buf(),
                        line,
                        max: MAX_MANIFEST_DEPTH,
                    });
                }
                parse_manifest(path, &text, &self.node_name)
            })
        };
        parsed.and_then(|pods| self.check_uids(path, pods, present))
    }

    /// The directory's manifest files (`.yaml`, `.yml`, `.json`, not hidden; symlinks
    /// followed) and the entries with a manifest name that cannot be read, with why; `None`
    /// when the directory cannot be read (an absent one is empty).
    fn list(
        &self,
    ) -> Option<(
        BTreeMap<PathBuf, std::fs::Metadata>,
        BTreeMap<PathBuf, String>,
    )> {
        let mut present: BTreeMap<PathBuf, std::fs::Metadata> = BTreeMap::new();
        let mut unreadable: BTreeMap<PathBuf, String> = BTreeMap::new();
        match std::fs::read_dir(&self.dir) {
            Ok(rd) => {
                for e in rd.flatten() {
                    let path = e.path();
                    let name = e.file_name();
                    let name = name.to_string_lossy();
                    if name.starts_with('.') {
                        continue;
                    }
                    let ext_ok = matches!(
                        path.extension().and_then(|x| x.to_str()),
                        Some("yaml" | "yml" | "json")
                    );
                    if !ext_ok {
                        continue;
                    }
                    // Follow symlinks (ConfigMap-style layouts), skip directories; anything
                    // else with a manifest name is reported, never opened (a FIFO would block).
                    match std::fs::metadata(&path) {
                        Ok(meta) if meta.is_file() => {
                            present.insert(path, meta);
                        }
                        Ok(meta) if meta.is_dir() => {}
                        Ok(meta) => {
                            use std::os::unix::fs::FileTypeExt as _;
                            let t = meta.file_type();
                            let kind = if t.is_fifo() {
                                "a FIFO"
                            } else if t.is_block_device() || t.is_char_device() {
                                "a device"
                            } else if t.is_socket() {
                                "a socket"
                            } else {
                                "not a regular file"
                            };
                            unreadable.insert(path, format!("{kind}, not a manifest file"));
                        }
                        Err(e) => {
                            let why = if e.raw_os_error()
                                == Some(rustix::io::Errno::LOOP.raw_os_error())
                            {
                                "a symlink loop".to_owned()
                            } else if e.kind() == std::io::ErrorKind::NotFound {
                                "a dangling symlink".to_owned()
                            } else {
                                e.to_string()
                            };
                            unreadable.insert(path, format!("cannot be read: {why}"));
                        }
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                tracing::warn!(dir = %self.dir.display(), error = %e, "reading manifest directory");
                return None;
            }
        }
        Some((present, unreadable))
    }

    /// One pass over the directory: the updates since the last pass.
    pub fn scan(&mut self) -> Vec<SourceEvent> {
        let mut events = Vec::new();
        let Some((present, unreadable)) = self.list() else {
            return events;
        };
        // Entries that cannot be manifests: reported when they appear or change, cleared
        // when they go.
        for (path, why) in &unreadable {
            if self.unreadable.get(path) != Some(why) {
                let file = path.display().to_string();
                tracing::warn!(file = %file, problem = %why, "manifest directory entry skipped");
                events.push(SourceEvent::Rejected {
                    file: file.clone(),
                    message: Some(format!("{file}: {why}")),
                });
            }
        }
        for path in self.unreadable.keys() {
            if !unreadable.contains_key(path) {
                events.push(SourceEvent::Rejected {
                    file: path.display().to_string(),
                    message: None,
                });
            }
        }
        self.unreadable = unreadable;
        // Deleted files: their pods go.
        let gone: Vec<PathBuf> = self
            .files
            .keys()
            .filter(|p| !present.contains_key(*p))
            .cloned()
            .collect();
        for path in gone {
            if let Some(st) = self.files.remove(&path) {
                let file = path.display().to_string();
                if st.rejected {
                    events.push(SourceEvent::Rejected {
                        file: file.clone(),
                        message: None,
                    });
                }
                for pod in st.pods {
                    events.push(SourceEvent::Pod(PodUpdate {
                        op: PodOp::Delete,
                        pod,
                        source: file.clone(),
                    }));
                }
            }
        }
        for (path, meta) in &present {
            let path = path.clone();
            let st = stamp(meta);
            if self.files.get(&path).is_some_and(|f| f.stamp == st) {
                continue;
            }
            let file = path.display().to_string();
            let old_pods = self
                .files
                .get(&path)
                .map(|f| f.pods.clone())
                .unwrap_or_default();
            let parsed = self.read_manifest(&path, meta, &present);
            match parsed {
                Err(e) => {
                    tracing::warn!(file = %file, error = %e, "manifest rejected; its previous pods (if any) are kept");
                    events.push(SourceEvent::Rejected {
                        file,
                        message: Some(e.to_string()),
                    });
                    self.files.insert(
                        path,
                        FileState {
                            stamp: st,
                            pods: old_pods,
                            rejected: true,
                        },
                    );
                }
                Ok(pods) => {
                    if self.files.get(&path).is_some_and(|f| f.rejected) {
                        events.push(SourceEvent::Rejected {
                            file: file.clone(),
                            message: None,
                        });
                    }
                    let pods: Vec<Arc<Pod>> = pods.into_iter().map(Arc::new).collect();
                    pod_changes(&old_pods, &pods, &file, &mut events);
                    self.files.insert(
                        path,
                        FileState {
                            stamp: st,
                            pods,
                            rejected: false,
                        },
                    );
                }
            }
        }
        if !self.synced {
            self.synced = true;
            events.push(SourceEvent::Synced);
        }
        self.persist_owners();
        events
    }

    /// Refuses uids used twice in the file or already owned by another file.
    fn check_uids(
        &self,
        path: &Path,
        pods: Vec<Pod>,
        present: &BTreeMap<PathBuf, std::fs::Metadata>,
    ) -> Result<Vec<Pod>, SourceError> {
        let owners = self.owners();
        let mut seen: HashMap<String, usize> = HashMap::new();
        for (i, p) in pods.iter().enumerate() {
            let uid = p.metadata.uid.clone().unwrap_or_default();
            if let Some(prev) = seen.insert(uid.clone(), i + 1) {
                return Err(SourceError::DuplicateUid {
                    file: path.to_path_buf(),
                    doc: i + 1,
                    uid,
                    other: format!("document {prev} of the same file"),
                });
            }
            if let Some(owner) = owners.get(&uid)
                && owner != path
            {
                return Err(SourceError::DuplicateUid {
                    file: path.to_path_buf(),
                    doc: i + 1,
                    uid,
                    other: owner.display().to_string(),
                });
            }
            // Ownership from before a restart holds while its file is still there and not
            // yet re-read (files are read in name order; the owner may come later).
            if let Some(owner) = self.persisted.get(&uid)
                && owner != path
                && !self.files.contains_key(owner)
                && present.contains_key(owner)
            {
                return Err(SourceError::DuplicateUid {
                    file: path.to_path_buf(),
                    doc: i + 1,
                    uid,
                    other: format!("{} (its owner before the restart)", owner.display()),
                });
            }
        }
        Ok(pods)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POD: &str = "apiVersion: v1\nkind: Pod\nmetadata: {name: web, uid: u-1}\nspec:\n  containers: [{name: c, image: 'busybox:local'}]\n";

    fn pods(ev: &[SourceEvent]) -> Vec<(PodOp, String)> {
        ev.iter()
            .filter_map(|e| match e {
                SourceEvent::Pod(u) => Some((u.op, u.pod.metadata.uid.clone().unwrap_or_default())),
                _ => None,
            })
            .collect()
    }

    fn rejections(ev: &[SourceEvent]) -> Vec<String> {
        ev.iter()
            .filter_map(|e| match e {
                SourceEvent::Rejected {
                    message: Some(m), ..
                } => Some(m.clone()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn add_update_delete() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut src = ManifestDir::new(dir.path(), "node1");
        assert_eq!(src.scan(), vec![SourceEvent::Synced]);
        std::fs::write(dir.path().join("web.yaml"), POD).expect("write");
        let ev = src.scan();
        assert_eq!(pods(&ev), vec![(PodOp::Add, "u-1".to_owned())]);
        let SourceEvent::Pod(u) = &ev[0] else {
            panic!("{ev:?}")
        };
        assert_eq!(u.pod.metadata.name.as_deref(), Some("web-node1"));
        assert_eq!(u.pod.metadata.namespace.as_deref(), Some("default"));
        assert!(src.scan().is_empty());
        std::fs::write(
            dir.path().join("web.yaml"),
            POD.replace("busybox:local", "busybox:x"),
        )
        .expect("write");
        assert_eq!(pods(&src.scan()), vec![(PodOp::Update, "u-1".to_owned())]);
        std::fs::remove_file(dir.path().join("web.yaml")).expect("rm");
        assert_eq!(pods(&src.scan()), vec![(PodOp::Delete, "u-1".to_owned())]);
    }

    #[test]
    fn nesting_depth_is_bounded_before_parsing() {
        for (text, max, want) in [
            ("a: {b: [1, 2]}\n", 2, None),
            ("a: {b: [1, 2]}\n", 1, Some(1)),
            ("a: 1\nb: {c: {d: {}}}\n", 2, Some(2)),
            ("a: '{{{{{{'\nb: \"[[[[[\\\"[[\"\n", 1, None),
            ("a: x # {{{{{{\n", 1, None),
            ("a: don't{\n", 1, None),
        ] {
            assert_eq!(too_deep(text, max), want, "{text:?} max {max}");
        }
        // kubelet-sized pods pass; 100,000 levels are refused at once.
        let mut deep = String::new();
        for _ in 0..100_000 {
            deep.push_str("{\"a\":");
        }
        let started = std::time::Instant::now();
        assert_eq!(too_deep(&deep, MAX_MANIFEST_DEPTH), Some(1));
        assert!(started.elapsed() < std::time::Duration::from_secs(1));
        assert_eq!(too_deep(POD, MAX_MANIFEST_DEPTH), None);
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("deep.json"), &deep).expect("write");
        let mut src = ManifestDir::new(dir.path(), "n");
        let ev = src.scan();
        assert_eq!(
            rejections(&ev),
            [format!(
                "{}: line 1: nested deeper than 64 levels",
                dir.path().join("deep.json").display()
            )]
        );
    }

    /// A file claiming a running pod's uid is refused, also after a restart, where files are
    /// read in name order and the squatter would come first.
    #[test]
    fn uid_ownership_survives_a_restart() {
        let dir = tempfile::tempdir().expect("tempdir");
        let state = tempfile::tempdir().expect("state");
        let owners = state.path().join(UID_OWNERS_FILE);
        std::fs::write(dir.path().join("canary.yaml"), POD).expect("write");
        let mut first = ManifestDir::new(dir.path(), "n").with_ownership_file(owners.clone());
        assert_eq!(pods(&first.scan()), [(PodOp::Add, "u-1".to_owned())]);
        let hijack = POD.replace("name: web", "name: hijack");
        std::fs::write(dir.path().join("0-hijack.yaml"), &hijack).expect("write");
        let ev = first.scan();
        assert!(pods(&ev).is_empty(), "{ev:?}");
        assert_eq!(rejections(&ev).len(), 1, "{ev:?}");
        // Restart.
        let mut second = ManifestDir::new(dir.path(), "n").with_ownership_file(owners.clone());
        let ev = second.scan();
        let added: Vec<_> = ev
            .iter()
            .filter_map(|e| match e {
                SourceEvent::Pod(u) => Some((u.source.clone(), u.pod.metadata.uid.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(
            added,
            [(
                dir.path().join("canary.yaml").display().to_string(),
                Some("u-1".to_owned())
            )]
        );
        let r = rejections(&ev);
        assert!(
            r.len() == 1 && r[0].contains("0-hijack.yaml") && r[0].contains("canary.yaml"),
            "{r:?}"
        );
        // The owner's file goes: the uid is free for the other file on its next change.
        std::fs::remove_file(dir.path().join("canary.yaml")).expect("rm");
        std::fs::write(dir.path().join("0-hijack.yaml"), hijack + "\n").expect("touch");
        let ev = second.scan();
        assert!(
            pods(&ev).contains(&(PodOp::Add, "u-1".to_owned())),
            "{ev:?}"
        );
    }

    #[test]
    fn fifos_and_symlink_loops_are_reported_not_opened() {
        let dir = tempfile::tempdir().expect("tempdir");
        let fifo = dir.path().join("pipe.yaml");
        let made = std::process::Command::new("mkfifo")
            .arg(&fifo)
            .status()
            .expect("mkfifo");
        assert!(made.success());
        std::os::unix::fs::symlink("loop.yaml", dir.path().join("loop.yaml")).expect("symlink");
        std::os::unix::fs::symlink("nowhere", dir.path().join("dangling.yaml")).expect("symlink");
        let mut src = ManifestDir::new(dir.path(), "n");
        let r = rejections(&src.scan());
        assert_eq!(r.len(), 3, "{r:?}");
        assert!(
            r.iter()
                .any(|m| m.contains("pipe.yaml") && m.contains("a FIFO")),
            "{r:?}"
        );
        assert!(
            r.iter()
                .any(|m| m.contains("loop.yaml") && m.contains("symlink loop")),
            "{r:?}"
        );
        assert!(
            r.iter()
                .any(|m| m.contains("dangling.yaml") && m.contains("dangling")),
            "{r:?}"
        );
        assert!(src.scan().is_empty(), "reported once");
        std::fs::remove_file(&fifo).expect("rm");
        let ev = src.scan();
        assert!(
            ev.contains(&SourceEvent::Rejected {
                file: fifo.display().to_string(),
                message: None
            }),
            "{ev:?}"
        );
    }

    #[test]
    fn bad_files_are_rejected_clearly_and_touch_nothing_else() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut src = ManifestDir::new(dir.path(), "n");
        std::fs::write(dir.path().join("good.yaml"), POD).expect("write");
        assert_eq!(pods(&src.scan()), vec![(PodOp::Add, "u-1".to_owned())]);
        let cases: &[(&str, String, &str)] = &[
            (
                "yaml.yaml",
                "kind: Pod\n  bad: [".to_owned(),
                "invalid YAML",
            ),
            (
                "types.yaml",
                POD.replace("uid: u-1", "uid: u-2").replace(
                    "containers: [",
                    "terminationGracePeriodSeconds: soon\n  containers: [",
                ),
                "spec.terminationGracePeriodSeconds",
            ),
            (
                "empty.yaml",
                "apiVersion: v1\nkind: Pod\nmetadata: {name: e}\nspec: {containers: []}\n"
                    .to_owned(),
                "at least one container",
            ),
            (
                "slash.yaml",
                POD.replace("name: web", "name: a/b").replace("u-1", "u-3"),
                "metadata.name",
            ),
            (
                "dots.yaml",
                POD.replace("name: web", "name: '..'").replace("u-1", "u-4"),
                "metadata.name",
            ),
            (
                "uid.yaml",
                POD.replace("uid: u-1", "uid: ../../x"),
                "metadata.uid",
            ),
            (
                "uidslash.yaml",
                POD.replace("uid: u-1", "uid: a/b"),
                "metadata.uid",
            ),
            (
                "dup.yaml",
                POD.replace("name: web", "name: other"),
                "already used by",
            ),
            (
                "dup2.yaml",
                format!(
                    "{}---\n{}",
                    POD.replace("u-1", "u-9"),
                    POD.replace("u-1", "u-9").replace("web", "w2")
                ),
                "document 1 of the same file",
            ),
            (
                "big.yaml",
                format!("{POD}# {}\n", "x".repeat(2 << 20)),
                "byte limit",
            ),
            (
                "kind.yaml",
                POD.replace("kind: Pod", "kind: Deployment"),
                "only Pod",
            ),
        ];
        for (file, text, want) in cases {
            std::fs::write(dir.path().join(file), text).expect("write");
            let ev = src.scan();
            assert!(pods(&ev).is_empty(), "{file}: {ev:?}");
            let r = rejections(&ev);
            assert_eq!(r.len(), 1, "{file}: {ev:?}");
            assert!(r[0].contains(file), "{file}: {}", r[0]);
            assert!(r[0].contains(want), "{file}: want {want:?} in {}", r[0]);
            std::fs::remove_file(dir.path().join(file)).expect("rm");
            assert!(pods(&src.scan()).is_empty(), "{file}");
        }
        // A good file that turns bad keeps its pods; fixed again, it is accepted.
        std::fs::write(dir.path().join("good.yaml"), "::: nope").expect("write");
        let ev = src.scan();
        assert!(pods(&ev).is_empty());
        assert_eq!(rejections(&ev).len(), 1);
        std::fs::write(dir.path().join("good.yaml"), POD).expect("write");
        let ev = src.scan();
        assert!(pods(&ev).is_empty(), "{ev:?}");
        assert!(ev.contains(&SourceEvent::Rejected {
            file: dir.path().join("good.yaml").display().to_string(),
            message: None
        }));
    }
}
