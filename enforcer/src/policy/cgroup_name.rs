//! kubelet's cgroup names (`cm/cgroup_manager_linux.go`): a cgroup is a list of components
//! (`[kubepods, burstable, pod<uid>]`), written for the cgroup driver the node runs:
//!
//! ```text
//! cgroupfs  /kubepods/burstable/pod1234-5678
//! systemd   /kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_5678.slice
//! ```
//!
//! With systemd each component's `-` becomes `_` (`escapeSystemdCgroupName`), the components
//! are joined by `-` into the unit name, and the unit name is expanded into its parent slices
//! (runc's `ExpandSlice`). Containers below a systemd pod slice are scopes
//! (`cri-containerd-<id>.scope`, containerd with `SystemdCgroup = true`).

use super::qos::QosClass;

/// kubelet's `cgroupDriver`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CgroupDriver {
    /// Directories under each hierarchy, made and removed by the node agent.
    #[default]
    Cgroupfs,
    /// Slices made and removed through systemd's D-Bus API.
    Systemd,
}

impl CgroupDriver {
    /// `cgroupfs` or `systemd`, as kubelet's configuration spells them.
    #[must_use]
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "cgroupfs" => Some(Self::Cgroupfs),
            "systemd" => Some(Self::Systemd),
            _ => None,
        }
    }

    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Cgroupfs => "cgroupfs",
            Self::Systemd => "systemd",
        }
    }

    /// The cgroup's path relative to each hierarchy (kubelet's `CgroupManager.Name`).
    #[must_use]
    pub fn name(self, name: &CgroupName) -> String {
        match self {
            Self::Cgroupfs => name.to_cgroupfs(),
            Self::Systemd => name.to_systemd(),
        }
    }
}

/// A name or uid that cannot be a cgroup component.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("cgroup name component {component:?} is not allowed: {why}")]
pub struct BadComponent {
    pub component: String,
    pub why: &'static str,
}

/// kubelet's `CgroupName`: the components from the hierarchy's root down.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct CgroupName(Vec<String>);

impl CgroupName {
    /// `ParseCgroupfsToCgroupName`: `/a/b` is `[a, b]`, `/` is the root (no component).
    #[must_use]
    pub fn from_cgroupfs(path: &str) -> Self {
        Self(
            path.split('/')
                .filter(|p| !p.is_empty())
                .map(str::to_owned)
                .collect(),
        )
    }

    /// `ParseSystemdToCgroupName`: the last slice of the path, split at `-` and unescaped.
    #[must_use]
    pub fn from_systemd(path: &str) -> Self {
        let base = path.rsplit('/').find(|p| !p.is_empty()).unwrap_or("");
        let base = base.strip_suffix(".slice").unwrap_or(base);
        if base.is_empty() || base == "-" {
            return Self::default();
        }
        Self(base.split('-').map(|p| p.replace('_', "-")).collect())
    }

    /// `NewCgroupName(base, components...)`.
    #[must_use]
    pub fn child(&self, component: &str) -> Self {
        let mut parts = self.0.clone();
        parts.push(component.to_owned());
        Self(parts)
    }

    #[must_use]
    pub fn components(&self) -> &[String] {
        &self.0
    }

    /// `ToCgroupfs`: `/a/b` (`/` for the root).
    #[must_use]
    pub fn to_cgroupfs(&self) -> String {
        format!("/{}", self.0.join("/"))
    }

    /// The systemd unit name of this cgroup (`a_x-b.slice`; `-.slice` for the root).
    #[must_use]
    pub fn systemd_unit(&self) -> String {
        if self.0.is_empty() {
            return "-.slice".to_owned();
        }
        let parts: Vec<String> = self.0.iter().map(|p| p.replace('-', "_")).collect();
        format!("{}.slice", parts.join("-"))
    }

    /// `ToSystemd`: the unit name expanded into its parent slices
    /// (`/a.slice/a-b.slice`; `/` for the root).
    #[must_use]
    pub fn to_systemd(&self) -> String {
        if self.0.is_empty() {
            return "/".to_owned();
        }
        let parts: Vec<String> = self.0.iter().map(|p| p.replace('-', "_")).collect();
        let mut out = String::new();
        for i in 0..parts.len() {
            out.push('/');
            out.push_str(&parts[..=i].join("-"));
            out.push_str(".slice");
        }
        out
    }

    /// The parent slice's unit name (`-.slice` for a top-level slice).
    #[must_use]
    pub fn systemd_parent_unit(&self) -> String {
        let mut parent = self.clone();
        parent.0.pop();
        parent.systemd_unit()
    }
}

/// A pod uid (or any name) as one cgroup component: non-empty, no path separator, no `..`,
/// and only the characters a systemd unit name may hold (`[A-Za-z0-9_.:-]`), so the same
/// name is valid, and stays inside its parent, under both drivers.
pub fn check_component(component: &str) -> Result<(), BadComponent> {
    let bad = |why| {
        Err(BadComponent {
            component: component.to_owned(),
            why,
        })
    };
    if component.is_empty() {
        return bad("it is empty");
    }
    if component == "." || component.contains("..") {
        return bad("it could name a parent directory");
    }
    if !component
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '.' | ':' | '-'))
    {
        return bad("only letters, digits, '_', '.', ':' and '-' can be in a cgroup name");
    }
    Ok(())
}

/// `[<root>..., kubepods]`.
#[must_use]
pub fn kubepods(cgroup_root: &str) -> CgroupName {
    CgroupName::from_cgroupfs(cgroup_root).child("kubepods")
}

/// The QoS tier's cgroup: kubepods itself for Guaranteed, else `kubepods/<tier>`.
#[must_use]
pub fn qos_tier(cgroup_root: &str, qos: QosClass) -> CgroupName {
    let k = kubepods(cgroup_root);
    match qos {
        QosClass::Guaranteed => k,
        QosClass::Burstable => k.child("burstable"),
        QosClass::BestEffort => k.child("besteffort"),
    }
}

/// The pod's cgroup, `<tier>/pod<uid>` (`GetPodContainerName`); refuses a uid that is not
/// one component.
pub fn pod(cgroup_root: &str, qos: QosClass, uid: &str) -> Result<CgroupName, BadComponent> {
    check_component(uid)?;
    Ok(qos_tier(cgroup_root, qos).child(&format!("pod{uid}")))
}

/// The container id of a container cgroup's last component: the cgroupfs directory is the id,
/// a systemd scope is `<runtime>-<id>.scope` (`cri-containerd-`, `crio-`, `docker-`).
#[must_use]
pub fn container_id(component: &str) -> &str {
    let Some(scope) = component.strip_suffix(".scope") else {
        return component;
    };
    ["cri-containerd-", "crio-", "docker-"]
        .iter()
        .find_map(|p| scope.strip_prefix(p))
        .unwrap_or(scope)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn name(parts: &[&str]) -> CgroupName {
        CgroupName(parts.iter().map(|p| (*p).to_owned()).collect())
    }

    /// kubelet's `TestCgroupNameToSystemdBasename`.
    #[test]
    fn systemd_unit_names() {
        let cases: &[(&[&str], &str)] = &[
            (&["system"], "system.slice"),
            (&["system", "Burstable"], "system-Burstable.slice"),
            (&["Burstable", "pod-123"], "Burstable-pod_123.slice"),
            (&["test", "a", "b"], "test-a-b.slice"),
            (&["test", "a", "b", "Burstable"], "test-a-b-Burstable.slice"),
            (&["Burstable"], "Burstable.slice"),
            (
                &["BestEffort", "pod-6c1a4e95-6bb6-11e6-bc26-28d2444e470d"],
                "BestEffort-pod_6c1a4e95_6bb6_11e6_bc26_28d2444e470d.slice",
            ),
        ];
        for (parts, want) in cases {
            assert_eq!(name(parts).systemd_unit(), *want, "{parts:?}");
        }
    }

    /// kubelet's `TestCgroupNameToSystemd` and `TestCgroupNameToCgroupfs`.
    #[test]
    fn systemd_and_cgroupfs_paths() {
        let cases: &[(&[&str], &str, &str)] = &[
            (&[], "/", "/"),
            (&["kubepods"], "/kubepods.slice", "/kubepods"),
            (
                &["kubepods", "burstable"],
                "/kubepods.slice/kubepods-burstable.slice",
                "/kubepods/burstable",
            ),
            (
                &["kubepods", "burstable", "pod1234-abcd-5678-efgh"],
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1234_abcd_5678_efgh.slice",
                "/kubepods/burstable/pod1234-abcd-5678-efgh",
            ),
        ];
        for (parts, systemd, cgroupfs) in cases {
            let n = name(parts);
            assert_eq!(CgroupDriver::Systemd.name(&n), *systemd, "{parts:?}");
            assert_eq!(CgroupDriver::Cgroupfs.name(&n), *cgroupfs, "{parts:?}");
            // And back (kubelet's TestParseSystemdToCgroupName / ParseCgroupfsToCgroupName).
            assert_eq!(CgroupName::from_systemd(systemd), n, "{systemd}");
            assert_eq!(CgroupName::from_cgroupfs(cgroupfs), n, "{cgroupfs}");
        }
        assert_eq!(
            name(&["kubepods", "burstable"]).systemd_parent_unit(),
            "kubepods.slice"
        );
        assert_eq!(name(&["kubepods"]).systemd_parent_unit(), "-.slice");
    }

    #[test]
    fn pod_names_under_a_root_and_hostile_uids() {
        let p = pod("/enforcer-test-3", QosClass::Burstable, "u-1").expect("pod");
        assert_eq!(
            CgroupDriver::Systemd.name(&p),
            "/enforcer_test_3.slice/enforcer_test_3-kubepods.slice/\
             enforcer_test_3-kubepods-burstable.slice/enforcer_test_3-kubepods-burstable-podu_1.slice"
        );
        assert_eq!(
            CgroupDriver::Cgroupfs.name(&p),
            "/enforcer-test-3/kubepods/burstable/podu-1"
        );
        let g = pod("/", QosClass::Guaranteed, "g").expect("pod");
        assert_eq!(
            CgroupDriver::Systemd.name(&g),
            "/kubepods.slice/kubepods-podg.slice"
        );
        for bad in ["", "a/b", "..", "x..y", "a b", "a\nb", "é", "a;b"] {
            assert!(pod("/", QosClass::BestEffort, bad).is_err(), "{bad:?}");
        }
        assert_eq!(CgroupDriver::parse("systemd"), Some(CgroupDriver::Systemd));
        assert_eq!(CgroupDriver::parse("Systemd"), None);
    }

    #[test]
    fn container_ids_of_both_layouts() {
        assert_eq!(container_id("cri-containerd-abc123.scope"), "abc123");
        assert_eq!(container_id("crio-abc.scope"), "abc");
        assert_eq!(container_id("abc123"), "abc123");
        assert_eq!(container_id("other.scope"), "other");
    }
}
