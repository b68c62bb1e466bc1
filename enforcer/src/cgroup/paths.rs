//! Path arithmetic for cgroups: joining untrusted names without escaping the root (the pure
//! join is [`crate::paths::join_inside`]), and finding the pod (`pod<uid>`) and QoS tier a
//! cgroup path belongs to.

use std::path::{Path, PathBuf};

use super::CgroupError;

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

/// Finds `kubepods[/<tier>]/pod<uid>[/<container>]` in a cgroup path (relative to its
/// hierarchy; any prefix such as a configured cgroup root is allowed before `kubepods`).
#[must_use]
pub fn pod_of_path(path: &str) -> Option<PodCgroupRef> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let k = parts.iter().position(|p| *p == "kubepods")?;
    let (qos, pod_idx) = match *parts.get(k + 1)? {
        "burstable" => (QosTier::Burstable, k + 2),
        "besteffort" => (QosTier::BestEffort, k + 2),
        _ => (QosTier::Guaranteed, k + 1),
    };
    let uid = parts.get(pod_idx)?.strip_prefix("pod")?;
    if uid.is_empty() {
        return None;
    }
    Some(PodCgroupRef {
        uid: uid.to_owned(),
        qos,
        pod_path: format!("/{}", parts[..=pod_idx].join("/")),
        container: parts.get(pod_idx + 1).map(|c| (*c).to_owned()),
    })
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
    }
}
