//! Node-level reclaim, which kubelet's eviction manager runs before evicting pods for disk
//! pressure (`reclaimNodeLevelResources`): first dead containers (`DeleteAllUnusedContainers`),
//! then images no container uses (`DeleteUnusedImages`, the image garbage collector's:
//! [`crate::cri::images::ImageGc::delete_unused`]), through CRI.
//!
//! Dead containers: every exited container of a pod that is finished or unknown, and of the
//! other pods all but the newest exited instance of each container name (kubelet's
//! `MaxPerPodContainer` = 1, which keeps the last state). Their logs go with them, as kubelet
//! removes a container's log before `RemoveContainer`.

use std::collections::BTreeMap;

use k8s_cri::v1 as cri;

use crate::cri::{ContainerRuntime, CriError, spec};

/// What one round of node-level reclaim removed.
#[must_use]
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reclaimed {
    /// Dead containers removed (with their logs).
    pub containers: usize,
    /// Bytes of container logs removed.
    pub log_bytes: i64,
    /// Images removed.
    pub images: usize,
}

const EXITED: i32 = cri::ContainerState::ContainerExited as i32;

/// The dead containers to remove: `keep_newest(uid)` says whether the pod still runs (then
/// the newest exited instance of each container name stays for its status).
#[must_use]
pub fn dead_containers_to_remove<'a>(
    containers: &'a [cri::Container],
    keep_newest: &dyn Fn(&str) -> bool,
) -> Vec<&'a cri::Container> {
    let mut units: BTreeMap<(String, String), Vec<&cri::Container>> = BTreeMap::new();
    for c in containers.iter().filter(|c| c.state == EXITED) {
        let uid = c
            .labels
            .get(spec::POD_UID_LABEL)
            .cloned()
            .unwrap_or_default();
        let name = c
            .labels
            .get(spec::CONTAINER_NAME_LABEL)
            .cloned()
            .unwrap_or_default();
        units.entry((uid, name)).or_default().push(c);
    }
    let mut out = Vec::new();
    for ((uid, _), mut unit) in units {
        // Newest first.
        unit.sort_by_key(|c| std::cmp::Reverse(c.created_at));
        let keep = usize::from(!uid.is_empty() && keep_newest(&uid));
        out.extend(unit.into_iter().skip(keep));
    }
    out
}

/// Removes dead containers (and their log files), then unused images. `keep_newest(uid)`:
/// whether the pod is still running (not finished, known to a source). Errors on single
/// containers or images are logged and skipped; a failed listing is returned.
pub async fn reclaim_node_level<R: ContainerRuntime>(
    runtime: &R,
    images: Option<&crate::cri::images::ImageGc>,
    keep_newest: &(dyn Fn(&str) -> bool + Sync),
) -> Result<Reclaimed, CriError> {
    let mut out = Reclaimed::default();
    let managed = cri::ContainerFilter {
        label_selector: std::collections::HashMap::from([(
            spec::MANAGED_LABEL.to_owned(),
            "true".to_owned(),
        )]),
        ..Default::default()
    };
    let containers = runtime.list_containers(managed).await?;
    for c in dead_containers_to_remove(&containers, keep_newest) {
        if let Ok(status) = runtime.container_status(&c.id).await
            && !status.log_path.is_empty()
        {
            let path = std::path::Path::new(&status.log_path);
            let size = crate::node::disk_usage(path);
            match std::fs::remove_file(path) {
                Ok(()) => out.log_bytes += size,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "removing a dead container's log")
                }
            }
        }
        match runtime.remove_container(&c.id).await {
            Ok(()) => out.containers += 1,
            Err(e) if e.is_not_found() => {}
            Err(e) => tracing::warn!(container = %c.id, error = %e, "removing a dead container"),
        }
    }
    // Images: the image garbage collector's `DeleteUnusedImages` (unused, unpinned, not the
    // sandbox image, detected at least `imageMinimumGCAge` ago).
    if let Some(gc) = images {
        out.images = gc.delete_unused(runtime).await?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn container(id: &str, uid: &str, name: &str, state: i32, created_at: i64) -> cri::Container {
        cri::Container {
            id: id.to_owned(),
            state,
            created_at,
            labels: HashMap::from([
                (spec::POD_UID_LABEL.to_owned(), uid.to_owned()),
                (spec::CONTAINER_NAME_LABEL.to_owned(), name.to_owned()),
            ]),
            ..Default::default()
        }
    }

    #[test]
    fn dead_containers_keep_the_newest_of_running_pods() {
        let running = cri::ContainerState::ContainerRunning as i32;
        let cs = vec![
            container("a1", "live", "app", EXITED, 1),
            container("a2", "live", "app", EXITED, 2),
            container("a3", "live", "app", running, 3),
            container("s1", "live", "side", EXITED, 1),
            container("d1", "done", "app", EXITED, 1),
            container("d2", "done", "app", EXITED, 2),
        ];
        let mut ids: Vec<&str> = dead_containers_to_remove(&cs, &|uid| uid == "live")
            .into_iter()
            .map(|c| c.id.as_str())
            .collect();
        ids.sort_unstable();
        assert_eq!(ids, ["a1", "d1", "d2"]);
    }
}
