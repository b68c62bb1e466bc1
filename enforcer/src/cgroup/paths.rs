//! Path arithmetic for cgroups: joining untrusted names without escaping the root (the pure
//! join is [`crate::paths::join_inside`]), and finding the pod (`pod<uid>`) and QoS tier a
//! cgroup path belongs to.

use std::path::{Path, PathBuf};

use super::CgroupError;
use crate::policy::cgroup_name::{self, CgroupName};

/// QoS tier of a pod cgroup, from where it sits under `kubepods`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "PascalCase")]
pub enum QosTier {
    Guaranteed,
    Burstable,
    BestEffort,
}

/// The pod a cgroup path belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodCgroupRef {
    pub uid: String,
    pub qos: QosTier,
    /// The pod cgroup's path (up to and including `pod<uid>`).
    pub pod_path: String,
    /// The container id below the pod cgroup, when the path goes that deep.
    pub container: Option<String>,
}

/// Finds the pod in a cgroup path (relative to its hierarchy; any prefix such as a configured
/// cgroup root is allowed before `kubepods`), in either driver's layout:
/// `kubepods[/<tier>]/pod<uid>[/<container id>]` (cgroupfs) or
/// `kubepods.slice[/kubepods-<tier>.slice]/kubepods[-<tier>]-pod<uid>.slice[/cri-containerd-<id>.scope]`
/// (systemd, the uid's `-` written `_`).
#[must_use]
pub fn pod_of_path(path: &str) -> Option<PodCgroupRef> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let (uid, qos, pod_idx) = if let Some(k) = parts.iter().position(|p| *p == "kubepods") {
        let (qos, pod_idx) = match *parts.get(k + 1)? {
            "burstable" => (QosTier::Burstable, k + 2),
            "besteffort" => (QosTier::BestEffort, k + 2),
            _ => (QosTier::Guaranteed, k + 1),
        };
        (
            parts.get(pod_idx)?.strip_prefix("pod")?.to_owned(),
            qos,
            pod_idx,
        )
    } else {
        parts.iter().enumerate().find_map(|(i, p)| {
            let (uid, qos) = systemd_pod_slice(p)?;
            Some((uid, qos, i))
        })?
    };
    if uid.is_empty() {
        return None;
    }
    Some(PodCgroupRef {
        uid,
        qos,
        pod_path: format!("/{}", parts[..=pod_idx].join("/")),
        container: parts
            .get(pod_idx + 1)
            .map(|c| cgroup_name::container_id(c).to_owned()),
    })
}

/// The uid and tier of a systemd pod slice (`[<root>-]kubepods[-<tier>]-pod<uid>.slice`).
fn systemd_pod_slice(component: &str) -> Option<(String, QosTier)> {
    component.strip_suffix(".slice")?;
    let name = CgroupName::from_systemd(component);
    let parts = name.components();
    let k = parts.iter().position(|p| p == "kubepods")?;
    let (qos, pod_idx) = match parts.get(k + 1).map(String::as_str) {
        Some("burstable") => (QosTier::Burstable, k + 2),
        Some("besteffort") => (QosTier::BestEffort, k + 2),
        _ => (QosTier::Guaranteed, k + 1),
    };
    if pod_idx + 1 != parts.len() {
        return None;
    }
    Some((parts[pod_idx].strip_prefix("pod")?.to_owned(), qos))
}

/// A container's cgroup directory below its pod's, in either driver's layout: `<pod>/<id>`
/// (cgroupfs), else `<pod>/cri-containerd-<id>.scope` (containerd with `SystemdCgroup`) when
/// that is the one there. Refuses an id that could escape the pod's directory.
pub fn container_dir(pod_dir: &Path, id: &str) -> Result<PathBuf, CgroupError> {
    let plain = join_inside(pod_dir, id)?;
    if plain.exists() {
        return Ok(plain);
    }
    let scope = join_inside(pod_dir, &format!("cri-containerd-{id}.scope"))?;
    Ok(if scope.exists() { scope } else { plain })
}

/// [`crate::paths::join_inside`] with its refusal as a [`CgroupError::Escape`], so a cgroup
/// path that could leave its root is a cgroup error like any other.
pub fn join_inside(root: &Path, rel: &str) -> Result<PathBuf, CgroupError> {
    Ok(crate::paths::join_inside(root, rel)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn container_dirs_of_both_layouts() {
        let d = tempfile::tempdir().expect("tempdir");
        std::fs::create_dir(d.path().join("c1")).expect("mkdir");
        std::fs::create_dir(d.path().join("cri-containerd-c2.scope")).expect("mkdir");
        assert_eq!(
            container_dir(d.path(), "c1").ok(),
            Some(d.path().join("c1"))
        );
        assert_eq!(
            container_dir(d.path(), "c2").ok(),
            Some(d.path().join("cri-containerd-c2.scope"))
        );
        assert_eq!(
            container_dir(d.path(), "c3").ok(),
            Some(d.path().join("c3"))
        );
        assert!(container_dir(d.path(), "../x").is_err());
    }

    #[test]
    fn pod_paths() {
        type Want<'a> = Option<(&'a str, QosTier, Option<&'a str>)>;
        let cases: &[(&str, Want<'_>)] = &[
            (
                "/kubepods/burstable/podabc/ctr1",
                Some(("abc", QosTier::Burstable, Some("ctr1"))),
            ),
            (
                "/kubepods/besteffort/pod1-2",
                Some(("1-2", QosTier::BestEffort, None)),
            ),
            ("/kubepods/pod77", Some(("77", QosTier::Guaranteed, None))),
            (
                "/enforcer-test-3/kubepods/pod77/c",
                Some(("77", QosTier::Guaranteed, Some("c"))),
            ),
            ("/kubepods", None),
            ("/kubepods/burstable", None),
            ("/kubepods/burstable/pod", None),
            ("/system.slice/foo", None),
            (
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1_2.slice/cri-containerd-c1.scope",
                Some(("1-2", QosTier::Burstable, Some("c1"))),
            ),
            (
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podab.slice",
                Some(("ab", QosTier::BestEffort, None)),
            ),
            (
                "/kubepods.slice/kubepods-podg_1.slice/cri-containerd-x.scope",
                Some(("g-1", QosTier::Guaranteed, Some("x"))),
            ),
            (
                "/r.slice/r-kubepods.slice/r-kubepods-burstable.slice/r-kubepods-burstable-podu.slice",
                Some(("u", QosTier::Burstable, None)),
            ),
            ("/kubepods.slice/kubepods-burstable.slice", None),
            ("/kubepods.slice/kubepods-burstable-pod.slice", None),
            ("/system.slice/containerd.service", None),
            ("", None),
        ];
        for (path, want) in cases {
            let got = pod_of_path(path).map(|p| (p.uid, p.qos, p.container));
            let want = want.map(|(u, q, c)| (u.to_owned(), q, c.map(str::to_owned)));
            assert_eq!(got, want, "{path}");
        }
        assert_eq!(
            pod_of_path("/r/kubepods/burstable/podx/c").map(|p| p.pod_path),
            Some("/r/kubepods/burstable/podx".to_owned())
        );
        assert_eq!(
            pod_of_path("/kubepods.slice/kubepods-podx.slice/cri-containerd-c.scope")
                .map(|p| p.pod_path),
            Some("/kubepods.slice/kubepods-podx.slice".to_owned())
        );
    }
}
