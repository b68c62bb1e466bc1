//! Outboxes: what the API server has not acknowledged yet, kept in the state directory so a
//! daemon that dies before delivering it sends it after its restart. The pod status writer's
//! ([`OUTBOX_FILE`]: a final status waiting for its pod's DELETE, an eviction's `Failed` /
//! `Evicted`, any status not delivered), the event writer's and the companion's eviction
//! statuses'. kubelet keeps them in memory only; the node keeps what only it knew (an
//! eviction's reason and message, `DisruptionTarget`, its event).
//!
//! A file is written whole and atomically at every change, in kubelet's checkpoint form
//! `{"data":"<json>","checksum":N}` (FNV-32a as kubelet's checkpoint manager sums a string,
//! [`crate::policy::resize::checkpoint::checksum_of`]). One that does not decode or whose sum
//! does not match is reported, set aside as `<file>.corrupt` and not replayed: never a crash,
//! never a silent reset.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize, de::DeserializeOwned};

use super::PodRecord;
use crate::policy::resize::checkpoint::checksum_of;

/// The outbox file in the state directory.
pub const OUTBOX_FILE: &str = "pod_status_outbox";

/// One status to deliver.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Pending {
    pub record: PodRecord,
    /// The pod's worker had terminated: its final status (then DELETE, once terminal).
    pub finished: bool,
}

#[derive(Serialize, Deserialize)]
struct Checkpoint {
    data: String,
    checksum: u64,
}

/// What is wrong with an outbox file.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a checkpoint: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("{path}: checksum {found} does not match its data's {computed} (truncated or altered)")]
    Checksum {
        path: PathBuf,
        found: u64,
        computed: u64,
    },
}

/// The file's text for `pending`.
pub fn encode<T: Serialize>(pending: &[T]) -> Result<String, serde_json::Error> {
    let data = serde_json::to_string(pending)?;
    let checksum = checksum_of(&data);
    serde_json::to_string(&Checkpoint { data, checksum })
}

/// The items in the file's text (`path` names it in errors).
pub fn decode<T: DeserializeOwned>(path: &Path, text: &str) -> Result<Vec<T>, OutboxError> {
    let json = |source| OutboxError::Json {
        path: path.to_path_buf(),
        source,
    };
    let c: Checkpoint = serde_json::from_str(text).map_err(json)?;
    let computed = checksum_of(&c.data);
    if computed != c.checksum {
        return Err(OutboxError::Checksum {
            path: path.to_path_buf(),
            found: c.checksum,
            computed,
        });
    }
    serde_json::from_str(&c.data).map_err(json)
}

/// One outbox file.
#[derive(Debug)]
pub struct Outbox {
    path: PathBuf,
    /// The text last written (nothing is written again while it is the same).
    written: Option<String>,
    /// The last write failed (logged once until one works again).
    failing: bool,
}

impl Outbox {
    /// The pod status outbox of `state_dir`.
    #[must_use]
    pub fn new(state_dir: &Path) -> Self {
        Self::at(state_dir.join(OUTBOX_FILE))
    }

    /// The outbox file `path`.
    #[must_use]
    pub fn at(path: PathBuf) -> Self {
        Self {
            path,
            written: None,
            failing: false,
        }
    }

    /// The final statuses of evictions a previous run decided and did not deliver (the pod
    /// loop keeps those pods from running again); read only: [`Self::load`] reports a bad
    /// file.
    #[must_use]
    pub fn evictions(state_dir: &Path) -> Vec<PodRecord> {
        let path = state_dir.join(OUTBOX_FILE);
        std::fs::read_to_string(&path)
            .ok()
            .and_then(|t| decode::<Pending>(&path, &t).ok())
            .unwrap_or_default()
            .into_iter()
            .filter(|p| {
                !p.finished
                    && p.record.phase == super::PodPhase::Failed
                    && p.record.reason == crate::policy::eviction::manager::REASON
            })
            .map(|p| p.record)
            .collect()
    }

    /// What a previous run left undelivered. A file that cannot be read or does not decode
    /// is reported and set aside (`.corrupt`), and nothing is replayed from it.
    pub fn load<T: DeserializeOwned>(&mut self) -> Vec<T> {
        let text = match std::fs::read_to_string(&self.path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Vec::new(),
            Err(source) => {
                self.set_aside(&OutboxError::Io {
                    path: self.path.clone(),
                    source,
                });
                return Vec::new();
            }
        };
        match decode(&self.path, &text) {
            Ok(p) => {
                if !p.is_empty() {
                    tracing::info!(file = %self.path.display(), items = p.len(), "left undelivered by the last run: sending it");
                }
                self.written = Some(text);
                p
            }
            Err(e) => {
                self.set_aside(&e);
                Vec::new()
            }
        }
    }

    fn set_aside(&self, e: &OutboxError) {
        let aside = self.path.with_extension("corrupt");
        match std::fs::rename(&self.path, &aside) {
            Ok(()) => {
                tracing::error!(error = %e, set_aside = %aside.display(), "an outbox is unreadable: set aside, nothing replayed from it")
            }
            Err(r) => {
                tracing::error!(error = %e, rename = %r, "an outbox is unreadable and could not be set aside; nothing replayed from it")
            }
        }
    }

    /// Writes `pending` (nothing when unchanged). A failure (a full disk) is returned and the
    /// next call tries again: the items stay in memory meanwhile.
    pub fn save<T: Serialize>(&mut self, pending: &[T]) -> Result<(), String> {
        let text = encode(pending).map_err(|e| format!("encoding the outbox: {e}"))?;
        if self.written.as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        super::write_atomic(&self.path, text.as_bytes()).map_err(|e| e.to_string())?;
        self.written = Some(text);
        Ok(())
    }

    /// [`Self::save`], a failure logged (once until a write works again).
    pub fn keep<T: Serialize>(&mut self, pending: &[T]) {
        match self.save(pending) {
            Ok(()) => {
                if std::mem::take(&mut self.failing) {
                    tracing::info!(file = %self.path.display(), "the outbox is written again");
                }
            }
            Err(e) => {
                if !std::mem::replace(&mut self.failing, true) {
                    tracing::warn!(file = %self.path.display(), error = %e, "writing an outbox failed; what it holds stays in memory and it is tried again");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pending(uid: &str) -> Pending {
        Pending {
            record: serde_json::from_value(serde_json::json!({
                "uid": uid, "name": "web", "namespace": "default", "source": "api",
                "phase": "Failed", "reason": "Evicted",
                "message": "The node was low on resource: memory. ", "qosClass": "Burstable",
                "conditions": [], "initContainerStatuses": [], "containerStatuses": []
            }))
            .expect("a record"),
            finished: true,
        }
    }

    /// Saved, loaded back whole; a file truncated or altered is reported with its path,
    /// set aside and not replayed; a later save writes a good one again.
    #[test]
    fn statuses_survive_a_restart_and_a_bad_file_is_set_aside() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut o = Outbox::new(dir.path());
        assert!(o.load::<Pending>().is_empty(), "no file: nothing");
        let saved = vec![pending("u1"), pending("u2")];
        o.save(&saved).expect("saved");
        assert_eq!(Outbox::new(dir.path()).load::<Pending>(), saved);
        let path = dir.path().join(OUTBOX_FILE);
        let text = std::fs::read_to_string(&path).expect("file");
        // Truncated.
        std::fs::write(&path, &text[..text.len() / 2]).expect("write");
        let e = decode::<Pending>(&path, &text[..text.len() / 2]).expect_err("truncated");
        assert!(e.to_string().contains(OUTBOX_FILE), "{e}");
        assert!(Outbox::new(dir.path()).load::<Pending>().is_empty());
        assert!(!path.exists() && path.with_extension("corrupt").exists());
        // Altered: the sum says so.
        let altered = text.replace("u2", "u3");
        let e = decode::<Pending>(&path, &altered).expect_err("altered");
        assert!(matches!(e, OutboxError::Checksum { .. }), "{e}");
        std::fs::write(&path, altered).expect("write");
        assert!(Outbox::new(dir.path()).load::<Pending>().is_empty());
        let mut o = Outbox::new(dir.path());
        o.save(&saved[..1]).expect("saved again");
        assert_eq!(Outbox::new(dir.path()).load::<Pending>(), saved[..1]);
    }
}
