//! The pod workers as `kubelet_working_pods` counts them: each worker's lifecycle and where
//! its configuration stands ([`WorkingPod`]), counted into [`WorkingPods`].

use std::collections::HashMap;

use super::is_static;

/// A pod worker's lifecycle, as `kubelet_working_pods` labels it (kubelet's
/// `PodWorkerState`: `sync`, `terminating`, `terminated`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum WorkingLifecycle {
    /// Running the pod towards its spec.
    Sync,
    /// Being killed.
    Terminating,
    /// Ran to its end (or was evicted), kept until its source removes it.
    Terminated,
}

impl WorkingLifecycle {
    /// kubelet's label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Sync => "sync",
            Self::Terminating => "terminating",
            Self::Terminated => "terminated",
        }
    }
}

/// Where a working pod's configuration stands (`kubelet_working_pods{config}`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub enum WorkingConfig {
    /// A source asks for the pod.
    Desired,
    /// Its source removed it (or it was force deleted) while its worker still runs.
    Orphan,
    /// Only the container runtime knows it (found at start, no source has it).
    RuntimeOnly,
}

impl WorkingConfig {
    /// kubelet's label value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Desired => "desired",
            Self::Orphan => "orphan",
            Self::RuntimeOnly => "runtime_only",
        }
    }
}

/// One pod worker as `kubelet_working_pods` counts it (kubelet's `PodWorkerSync`).
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
pub struct WorkingPod {
    pub lifecycle: WorkingLifecycle,
    pub config: WorkingConfig,
    /// Whether the pod is not from the API server; `None` for a runtime-only pod (kubelet's
    /// `unknown`).
    pub is_static: Option<bool>,
}

impl WorkingPod {
    /// The worker of a pod a source gave (`source`: the pod's config source, `api` for the
    /// API server's).
    #[must_use]
    pub fn desired(source: &str) -> Self {
        Self {
            lifecycle: WorkingLifecycle::Sync,
            config: WorkingConfig::Desired,
            is_static: Some(is_static(source) == "true"),
        }
    }

    /// The worker of a pod only the runtime knows (it only removes what is left).
    #[must_use]
    pub fn runtime_only() -> Self {
        Self {
            lifecycle: WorkingLifecycle::Terminating,
            config: WorkingConfig::RuntimeOnly,
            is_static: None,
        }
    }

    /// Its source removed the pod: killed, an orphan until its worker ends.
    pub fn deleted(&mut self) {
        self.lifecycle = WorkingLifecycle::Terminating;
        if self.config == WorkingConfig::Desired {
            self.config = WorkingConfig::Orphan;
        }
    }

    /// A source gave the pod (again): desired.
    pub fn updated(&mut self) {
        if self.config == WorkingConfig::Orphan {
            self.config = WorkingConfig::Desired;
        }
    }

    /// The pod is being killed (evicted, preempted): still desired.
    pub fn killed(&mut self) {
        self.lifecycle = WorkingLifecycle::Terminating;
    }

    /// As counted now: a syncing worker whose pod ran to its end (`finished`: its status
    /// phase is terminal) is terminated.
    #[must_use]
    pub fn now(self, finished: bool) -> Self {
        if self.lifecycle == WorkingLifecycle::Sync && finished {
            Self {
                lifecycle: WorkingLifecycle::Terminated,
                ..self
            }
        } else {
            self
        }
    }
}

/// The pod workers counted by [`WorkingPod`] (`kubelet_working_pods`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WorkingPods(HashMap<WorkingPod, i64>);

impl WorkingPods {
    /// Counts one worker.
    pub fn add(&mut self, w: WorkingPod) {
        *self.0.entry(w).or_default() += 1;
    }

    /// The workers in `w`'s series.
    #[must_use]
    pub fn get(&self, w: WorkingPod) -> i64 {
        self.0.get(&w).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::{Metrics, encode};

    /// kubelet's 15 series, each set (0 without a worker); a worker moves between them as
    /// the dispatcher sees it deleted, re-added, killed or finished.
    #[test]
    fn working_pods_by_lifecycle_config_and_static() {
        let m = Metrics::new();
        let mut counts = WorkingPods::default();
        let web = WorkingPod::desired("/etc/manifests/web.yaml");
        counts.add(web);
        counts.add(WorkingPod::desired("api").now(true));
        let mut gone = WorkingPod::desired("api");
        gone.deleted();
        counts.add(gone.now(true));
        let mut back = gone;
        back.updated();
        counts.add(back);
        let mut evicted = WorkingPod::desired("api");
        evicted.killed();
        counts.add(evicted);
        counts.add(WorkingPod::runtime_only());
        m.working_pods(&counts);
        let text = encode(&[m.registry()]).expect("encode");
        let series = |l: &str, c: &str, s: &str| {
            format!("kubelet_working_pods{{lifecycle=\"{l}\",config=\"{c}\",static=\"{s}\"}} ")
        };
        for (l, c, s, n) in [
            ("sync", "desired", "true", 1),
            ("terminated", "desired", "false", 1),
            ("terminating", "orphan", "false", 1),
            ("terminating", "desired", "false", 2),
            ("terminating", "runtime_only", "unknown", 1),
            ("sync", "desired", "false", 0),
            ("terminated", "orphan", "true", 0),
            ("terminated", "runtime_only", "unknown", 0),
        ] {
            let want = format!("{}{n}\n", series(l, c, s));
            assert!(text.contains(&want), "{want:?} missing in:\n{text}");
        }
        assert_eq!(text.matches("kubelet_working_pods{").count(), 15, "{text}");
        // The next count replaces the last: a worker gone is 0, not left behind.
        m.working_pods(&WorkingPods::default());
        let text = encode(&[m.registry()]).expect("encode");
        assert!(
            text.contains(&format!("{}0\n", series("sync", "desired", "true"))),
            "{text}"
        );
        assert!(!text.contains("} 1\n"), "{text}");
    }
}
