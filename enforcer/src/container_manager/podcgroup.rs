//! Pod cgroups: `<cgroup root>/kubepods[/<tier>]/pod<uid>` (cgroupfs) or
//! `kubepods[-<tier>]-pod<uid>.slice` (systemd), created and limited by the enforcer before the
//! sandbox, removed after it (containerd does neither).
//! Every path is joined with [`join_inside`], so no name or uid can leave the cgroup root.
//!
//! Timed as kubelet's cgroup manager (`kubelet_cgroup_manager_duration_seconds`): `create`
//! when the pod cgroup is new, `update` when its values are re-written, `destroy` when it is
//! removed.

use std::{path::PathBuf, time::Duration};

use crate::{
    cgroup::{
        CgroupError, CgroupLayout, join_inside,
        kubepods::{self, Kubepods},
    },
    policy::{
        cgroup_name::{self, CgroupName},
        qos::QosClass,
        resources::cgroup::{CgroupOptions, PodCgroupValues},
    },
};

use crate::cri::spec::Qos;

/// The pod cgroups below one cgroup root on this node's hierarchies.
#[derive(Clone, Debug)]
pub struct PodCgroups {
    kubepods: Kubepods,
    options: CgroupOptions,
    /// Where the operations are timed ([`crate::metrics::global`] unless a test gives one).
    metrics: crate::metrics::Metrics,
}

fn class(qos: Qos) -> QosClass {
    match qos {
        Qos::Guaranteed => QosClass::Guaranteed,
        Qos::Burstable => QosClass::Burstable,
        Qos::BestEffort => QosClass::BestEffort,
    }
}

impl PodCgroups {
    /// The cgroupfs driver below `root`.
    #[must_use]
    pub fn new(root: &str, layout: CgroupLayout) -> Self {
        Self::with_kubepods(Kubepods::new(root, layout))
    }

    /// Below the kubepods hierarchy `kubepods` (its root, driver and writer).
    #[must_use]
    pub fn with_kubepods(kubepods: Kubepods) -> Self {
        let options = CgroupOptions {
            v2: kubepods.layout().memory_on_v2(),
            ..CgroupOptions::default()
        };
        Self {
            kubepods,
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

    fn name(&self, uid: &str, qos: Qos) -> Result<CgroupName, CgroupError> {
        cgroup_name::pod(self.kubepods.root(), class(qos), uid).map_err(|e| CgroupError::Escape {
            root: PathBuf::from(self.kubepods.root()),
            component: format!("pod{} ({})", e.component, e.why),
        })
    }

    /// The relative pod cgroup path in the driver's form (the CRI `cgroup_parent`, as kubelet
    /// passes it); refuses a uid that is not one cgroup component.
    pub fn pod_path(&self, uid: &str, qos: Qos) -> Result<String, CgroupError> {
        self.path_of(&self.name(uid, qos)?)
    }

    /// The pod cgroup's memory usage in bytes (kubelet's `GetPodCgroupMemoryUsage`; `None`:
    /// no memory hierarchy, or unreadable).
    #[must_use]
    pub fn memory_usage(&self, uid: &str, qos: Qos) -> Option<u64> {
        let rel = self.pod_path(uid, qos).ok()?;
        let usage = crate::cgroup::PodCgroup::resolve(self.kubepods.layout(), &rel)?.usage()?;
        u64::try_from(usage).ok()
    }

    /// `name`'s relative path, checked against a dummy root: the same rules as for every
    /// real mount.
    fn path_of(&self, name: &CgroupName) -> Result<String, CgroupError> {
        let rel = self.kubepods.path_of(name);
        join_inside(std::path::Path::new("/"), &rel)?;
        Ok(rel)
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
        let name = self.name(uid, qos)?;
        let rel = self.path_of(&name)?;
        let operation = if self.kubepods.manager().exists(&name) {
            "update"
        } else {
            "create"
        };
        self.metrics.time_cgroup_manager(operation, || {
            self.kubepods.apply(&name, &kubepods::pod_values(values))
        })?;
        Ok(rel)
    }

    /// The pod's cgroup names in every tier (a pod's QoS class can be unknown on removal).
    fn names(&self, uid: &str) -> Vec<CgroupName> {
        [Qos::Guaranteed, Qos::Burstable, Qos::BestEffort]
            .into_iter()
            .filter_map(|q| self.name(uid, q).ok())
            .collect()
    }

    /// Whether the pod cgroup exists in any hierarchy (any tier).
    #[must_use]
    pub fn exists(&self, uid: &str) -> bool {
        let m = self.kubepods.manager();
        self.names(uid).iter().any(|n| m.exists(n))
    }

    /// Removes the pod cgroup (and the per-container leftovers below it) in every hierarchy
    /// (cgroupfs: rmdir deepest first; systemd: the slice stopped). Retries briefly while the
    /// kernel still reports it busy. Timed as `destroy` when there was one.
    pub async fn remove(&self, uid: &str) -> Result<(), CgroupError> {
        let m = self.kubepods.manager();
        let names: Vec<CgroupName> = self
            .names(uid)
            .into_iter()
            .filter(|n| m.exists(n))
            .collect();
        if names.is_empty() {
            return Ok(());
        }
        let _timer = self.metrics.cgroup_manager("destroy");
        for name in names {
            let mut attempt = 0;
            loop {
                match m.destroy(&name) {
                    Ok(_) => break,
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
            memory_low_bytes: None,
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
