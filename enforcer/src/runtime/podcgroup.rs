//! Pod cgroups (cgroupfs driver): `<cgroup root>/kubepods[/<tier>]/pod<uid>`, created and
//! limited by the enforcer before the sandbox, removed after it (containerd does neither).
//! Every path is joined with [`join_inside`], so no name or uid can leave the cgroup root.
//!
//! Timed as kubelet's cgroup manager (`kubelet_cgroup_manager_duration_seconds`): `create`
//! when the pod cgroup is new, `update` when its values are re-written, `destroy` when it is
//! removed.

use std::{io, path::PathBuf, time::Duration};

use crate::{
    cgroup::{
        CgroupError, CgroupLayout, CgroupVersion, WithPath as _, join_inside,
        kubepods::{self, Kubepods},
        writer::CgroupWriter,
    },
    policy::resources::cgroup::{CgroupOptions, PodCgroupValues},
};

use super::spec::Qos;

/// The pod cgroups below one cgroup root on this node's hierarchies.
#[derive(Clone, Debug)]
pub struct PodCgroups {
    /// The cgroup root, relative to each hierarchy (`/` or e.g. `/enforcer-test-1`).
    root: String,
    layout: CgroupLayout,
    kubepods: Kubepods,
    options: CgroupOptions,
    /// Where the operations are timed ([`crate::metrics::global`] unless a test gives one).
    metrics: crate::metrics::Metrics,
}

fn tier(qos: Qos) -> &'static str {
    match qos {
        Qos::Guaranteed => "",
        Qos::Burstable => "burstable/",
        Qos::BestEffort => "besteffort/",
    }
}

impl PodCgroups {
    #[must_use]
    pub fn new(root: &str, layout: CgroupLayout) -> Self {
        let root = format!("/{}", root.trim_matches('/'));
        let options = CgroupOptions {
            v2: matches!(layout.controller("memory"), Some((_, CgroupVersion::V2))),
            ..CgroupOptions::default()
        };
        Self {
            kubepods: Kubepods::new(&root, layout.clone()),
            root,
            layout,
            options,
            metrics: crate::metrics::global().clone(),
        }
    }

    /// Times the operations into `metrics` instead of the process-wide registry.
    #[must_use]
    pub fn with_metrics(mut self, metrics: crate::metrics::Metrics) -> Self {
        self.metrics = metrics;
        self
    }

    /// The relative pod cgroup path (the CRI `cgroup_parent`); refuses a uid that could escape.
    pub fn pod_path(&self, uid: &str, qos: Qos) -> Result<String, CgroupError> {
        let rel = format!(
            "{}/kubepods/{}pod{uid}",
            self.root.trim_end_matches('/'),
            tier(qos)
        );
        // Validate against a dummy root: the same rules as for every real mount.
        join_inside(std::path::Path::new("/"), &rel)?;
        if uid.is_empty() || uid.contains('/') || uid.contains("..") {
            return Err(CgroupError::Escape {
                root: PathBuf::from(&self.root),
                component: format!("pod{uid}"),
            });
        }
        Ok(rel)
    }

    /// Every hierarchy mount (v1 mounts and the unified one).
    fn mounts(&self) -> Vec<(PathBuf, CgroupVersion)> {
        let mut out: Vec<(PathBuf, CgroupVersion)> = self
            .layout
            .v1
            .iter()
            .map(|m| (m.mount.clone(), CgroupVersion::V1))
            .collect();
        if let Some(u) = &self.layout.unified {
            out.push((u.clone(), CgroupVersion::V2));
        }
        out
    }

    /// The options the decision core computes pod and container values with.
    #[must_use]
    pub fn options(&self) -> &CgroupOptions {
        &self.options
    }

    /// Replaces the cgroup options (`cpuCFSQuota`, Memory QoS, ...); `v2` follows the memory
    /// hierarchy of this node's layout.
    #[must_use]
    pub fn with_options(mut self, options: CgroupOptions) -> Self {
        let v2 = self.options.v2;
        self.options = CgroupOptions { v2, ..options };
        self
    }

    /// The kubepods hierarchy these pod cgroups live in.
    #[must_use]
    pub fn kubepods(&self) -> &Kubepods {
        &self.kubepods
    }

    /// Creates the pod cgroup where its limits are set (memory and cpu) and writes the decision
    /// core's values (`policy::resources::cgroup::pod_cgroup_values`). Returns the relative path.
    /// Timed as `create` when the pod cgroup did not exist yet, else `update`.
    pub fn ensure(
        &self,
        uid: &str,
        qos: Qos,
        values: &PodCgroupValues,
    ) -> Result<String, CgroupError> {
        let rel = self.pod_path(uid, qos)?;
        let operation = if self.limited_dir_exists(&rel) {
            "update"
        } else {
            "create"
        };
        self.metrics.time_cgroup_manager(operation, || {
            self.kubepods.apply(&rel, &kubepods::pod_values(values))
        })?;
        Ok(rel)
    }

    /// Whether `rel` exists where a pod cgroup's limits are written (the memory hierarchy,
    /// else the cpu one).
    fn limited_dir_exists(&self, rel: &str) -> bool {
        ["memory", "cpu"]
            .iter()
            .find_map(|c| self.layout.controller(c))
            .and_then(|(mount, _)| join_inside(mount, rel).ok())
            .is_some_and(|d| d.exists())
    }

    /// Whether the pod cgroup exists in any hierarchy (any tier).
    #[must_use]
    pub fn exists(&self, uid: &str) -> bool {
        self.dirs(uid).iter().any(|d| d.exists())
    }

    fn dirs(&self, uid: &str) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for qos in [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort] {
            let Ok(rel) = self.pod_path(uid, qos) else {
                continue;
            };
            for (mount, _) in self.mounts() {
                if let Ok(dir) = join_inside(&mount, &rel) {
                    out.push(dir);
                }
            }
        }
        out
    }

    /// Removes the pod cgroup (and the per-container leftovers below it) in every hierarchy.
    /// Retries briefly while the kernel still reports it busy. Timed as `destroy` when there
    /// was one.
    pub async fn remove(&self, uid: &str) -> Result<(), CgroupError> {
        let dirs: Vec<PathBuf> = self.dirs(uid).into_iter().filter(|d| d.exists()).collect();
        if dirs.is_empty() {
            return Ok(());
        }
        let _timer = self.metrics.cgroup_manager("destroy");
        for dir in dirs {
            if !dir.exists() {
                continue;
            }
            let mut attempt = 0;
            loop {
                match remove_tree(self.kubepods.writer().as_ref(), &dir) {
                    Ok(()) => break,
                    Err(e) if attempt < 50 => {
                        attempt += 1;
                        if attempt == 50 {
                            return Err(e);
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        Ok(())
    }
}

/// rmdir of a cgroup directory and its child cgroups, deepest first.
fn remove_tree(writer: &dyn CgroupWriter, dir: &std::path::Path) -> Result<(), CgroupError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_path(dir),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(writer, &entry.path())?;
        }
    }
    writer.remove_dir(dir)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubelet's cgroup manager operations: the first `ensure` of a pod creates, the next
    /// ones update, `remove` destroys once (nothing to remove is no operation).
    #[tokio::test]
    async fn create_update_and_destroy_are_timed_apart() {
        let dir = tempfile::tempdir().expect("tempdir");
        for c in ["memory", "cpu"] {
            std::fs::create_dir_all(dir.path().join(c)).expect("mkdir");
        }
        let mount = |c: &str| crate::cgroup::V1Mount {
            mount: dir.path().join(c),
            controllers: vec![c.to_owned()],
            hierarchy_id: Some(1),
        };
        let layout = CgroupLayout {
            v1: vec![mount("memory"), mount("cpu")],
            unified: None,
            unified_controllers: Vec::new(),
        };
        let metrics = crate::metrics::Metrics::new();
        let pc = PodCgroups::new("/r", layout).with_metrics(metrics.clone());
        let count = |op: &str| {
            let text = crate::metrics::encode(&[metrics.registry()]).expect("encode");
            let want = format!(
                "kubelet_cgroup_manager_duration_seconds_count{{operation_type=\"{op}\"}} "
            );
            text.lines()
                .find_map(|l| l.strip_prefix(want.as_str()))
                .map_or(0, |v| v.parse::<u64>().expect("a count"))
        };
        let values = PodCgroupValues {
            cpu_shares: 2,
            cpu_weight: None,
            cpu_quota_micros: None,
            cpu_period_micros: None,
            memory_limit_bytes: Some(64 << 20),
            memory_min_bytes: None,
            pids_limit: None,
        };
        let rel = pc.ensure("u1", Qos::Burstable, &values).expect("ensure");
        assert_eq!(rel, "/r/kubepods/burstable/podu1");
        assert_eq!((count("create"), count("update")), (1, 0));
        pc.ensure("u1", Qos::Burstable, &values).expect("ensure");
        pc.ensure("u1", Qos::Burstable, &values).expect("ensure");
        assert_eq!((count("create"), count("update")), (1, 2));
        // A fake hierarchy keeps the value files a real one hides from rmdir: remove them.
        for c in ["memory", "cpu"] {
            let pod = dir.path().join(c).join("r/kubepods/burstable/podu1");
            for f in std::fs::read_dir(&pod).expect("read").flatten() {
                std::fs::remove_file(f.path()).expect("rm");
            }
        }
        pc.remove("u1").await.expect("remove");
        assert!(!pc.exists("u1"));
        pc.remove("u1").await.expect("nothing to remove");
        assert_eq!(count("destroy"), 1);
    }

    #[test]
    fn paths_stay_inside_the_root() {
        let pc = PodCgroups::new("/enforcer-test-1", CgroupLayout::default());
        assert_eq!(
            pc.pod_path("abc", Qos::Burstable).ok().as_deref(),
            Some("/enforcer-test-1/kubepods/burstable/podabc")
        );
        assert_eq!(
            pc.pod_path("abc", Qos::Guaranteed).ok().as_deref(),
            Some("/enforcer-test-1/kubepods/podabc")
        );
        for bad in ["", "../x", "a/b", "..", "a\0b"] {
            assert!(pc.pod_path(bad, Qos::BestEffort).is_err(), "{bad:?}");
        }
        let root = PodCgroups::new("/", CgroupLayout::default());
        assert_eq!(
            root.pod_path("u", Qos::BestEffort).ok().as_deref(),
            Some("/kubepods/besteffort/podu")
        );
    }
}
