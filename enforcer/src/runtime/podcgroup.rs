//! Pod cgroups (cgroupfs driver): `<cgroup root>/kubepods[/<tier>]/pod<uid>`, created and
//! limited by the enforcer before the sandbox, removed after it (containerd does neither).
//! Every path is joined with [`join_inside`], so no name or uid can leave the cgroup root.

use std::{io, path::PathBuf, time::Duration};

use crate::cgroup::{CgroupError, CgroupLayout, CgroupVersion, WithPath as _, join_inside};

use super::spec::{PodCgroupValues, Qos};

/// The pod cgroups below one cgroup root on this node's hierarchies.
#[derive(Clone, Debug)]
pub struct PodCgroups {
    /// The cgroup root, relative to each hierarchy (`/` or e.g. `/enforcer-test-1`).
    root: String,
    layout: CgroupLayout,
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
        Self { root, layout }
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

    /// Creates the pod cgroup where its limits are set (memory and cpu) and writes them.
    /// Returns the relative path.
    pub fn ensure(
        &self,
        uid: &str,
        qos: Qos,
        values: PodCgroupValues,
    ) -> Result<String, CgroupError> {
        let rel = self.pod_path(uid, qos)?;
        let mut done_v2 = false;
        for ctrl in ["memory", "cpu"] {
            let Some((mount, version)) = self.layout.controller(ctrl) else {
                continue;
            };
            let dir = join_inside(mount, &rel)?;
            if version == CgroupVersion::V2 {
                if !done_v2 {
                    self.create_v2(mount, &rel)?;
                    done_v2 = true;
                }
            } else {
                std::fs::create_dir_all(&dir).with_path(&dir)?;
            }
            let writes: Vec<(&str, String)> = match (ctrl, version) {
                ("memory", CgroupVersion::V1) => values
                    .memory_limit
                    .map(|m| vec![("memory.limit_in_bytes", m.to_string())])
                    .unwrap_or_default(),
                ("memory", CgroupVersion::V2) => vec![(
                    "memory.max",
                    values
                        .memory_limit
                        .map_or_else(|| "max".to_owned(), |m| m.to_string()),
                )],
                ("cpu", CgroupVersion::V1) => vec![
                    ("cpu.shares", values.cpu_shares.to_string()),
                    (
                        "cpu.cfs_quota_us",
                        values.cpu_quota.unwrap_or(-1).to_string(),
                    ),
                ],
                ("cpu", CgroupVersion::V2) => vec![
                    (
                        "cpu.weight",
                        (1 + ((values.cpu_shares - 2) * 9999) / 262_142).to_string(),
                    ),
                    (
                        "cpu.max",
                        values
                            .cpu_quota
                            .map_or_else(|| "max 100000".to_owned(), |q| format!("{q} 100000")),
                    ),
                ],
                _ => Vec::new(),
            };
            for (file, value) in writes {
                let path = dir.join(file);
                std::fs::write(&path, &value).with_path(&path)?;
            }
        }
        Ok(rel)
    }

    fn create_v2(&self, mount: &std::path::Path, rel: &str) -> Result<(), CgroupError> {
        let mut dir = mount.to_path_buf();
        let parts: Vec<&str> = rel.split('/').filter(|p| !p.is_empty()).collect();
        for (i, part) in parts.iter().enumerate() {
            dir = join_inside(&dir, part)?;
            if !dir.exists() {
                std::fs::create_dir(&dir).with_path(&dir)?;
            }
            if i + 1 < parts.len() {
                // Delegate the controllers the children need (best effort: some may be absent).
                let ctl = dir.join("cgroup.subtree_control");
                for c in ["+cpu", "+memory", "+pids"] {
                    let _ = std::fs::write(&ctl, c);
                }
            }
        }
        Ok(())
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
    /// Retries briefly while the kernel still reports it busy.
    pub async fn remove(&self, uid: &str) -> Result<(), CgroupError> {
        for dir in self.dirs(uid) {
            if !dir.exists() {
                continue;
            }
            let mut attempt = 0;
            loop {
                match remove_tree(&dir) {
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
fn remove_tree(dir: &std::path::Path) -> Result<(), CgroupError> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(()),
        Err(e) => return Err(e).with_path(dir),
    };
    for entry in entries.flatten() {
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            remove_tree(&entry.path())?;
        }
    }
    match std::fs::remove_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(e).with_path(dir),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
