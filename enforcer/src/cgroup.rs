//! cgroup hierarchies: discovery of the v1 / v2 layout, path arithmetic that never escapes a
//! root, and the kubepods naming (`kubepods/<tier>/pod<uid>`).

pub mod hierarchy;
pub mod kill;
pub mod kubepods;
pub mod layout;
pub mod manager;
pub mod paths;
pub mod pod;
pub mod reaper;
pub mod systemd;
pub mod writer;

pub use hierarchy::{CrossingNotice, Hierarchy, RootMemory};
pub use layout::{CgroupLayout, CgroupVersion, V1Mount};
pub use paths::{PodCgroupRef, QosTier, container_dir, join_inside, pod_of_path};
pub use pod::PodCgroup;

use std::path::PathBuf;

/// Errors of the cgroup module; each names the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {what}")]
    Invalid { path: PathBuf, what: String },
    /// A controller write (through `cgroups-rs`) failed.
    #[error("{path}: {source}")]
    Controller {
        path: PathBuf,
        #[source]
        source: cgroups_rs::fs::error::Error,
    },
    #[error("cgroup path component {component:?} is not allowed (it could escape {root})")]
    Escape { root: PathBuf, component: String },
}

impl From<crate::paths::PathEscape> for CgroupError {
    fn from(e: crate::paths::PathEscape) -> Self {
        Self::Escape {
            root: e.root,
            component: e.component,
        }
    }
}

/// Adds the path to an I/O error: the only way this crate reads and writes cgroup files.
pub trait WithPath<T> {
    /// Wraps the error with the path it happened on.
    fn with_path(self, path: impl Into<PathBuf>) -> Result<T, CgroupError>;
}

impl<T> WithPath<T> for std::io::Result<T> {
    fn with_path(self, path: impl Into<PathBuf>) -> Result<T, CgroupError> {
        self.map_err(|source| CgroupError::Io {
            path: path.into(),
            source,
        })
    }
}
