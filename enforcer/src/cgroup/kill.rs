//! Killing a pod through its cgroup: what a hard memory eviction does first.

use crate::cgroup::{CgroupLayout, join_inside, writer::CgroupWriter};

/// Sends SIGKILL to every process in a pod cgroup (and its container cgroups) of the memory
/// hierarchy, through `writer` (`cgroup.kill` where cgroup v2 offers it). Returns how many
/// processes were signalled (1 for cgroup.kill); 0 when the path is not inside the hierarchy.
pub fn kill_pod_cgroup(writer: &dyn CgroupWriter, layout: &CgroupLayout, rel: &str) -> usize {
    let Some((mount, version)) = layout.controller("memory") else {
        return 0;
    };
    let Ok(dir) = join_inside(mount, rel) else {
        return 0;
    };
    writer.kill(&dir, version)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroup::{V1Mount, writer::RecordingCgroups};

    #[test]
    fn the_kill_goes_to_the_pod_cgroup_of_the_memory_hierarchy_only() {
        let layout = CgroupLayout {
            v1: vec![V1Mount {
                mount: "/m".into(),
                controllers: vec!["memory".to_owned()],
                hierarchy_id: Some(4),
            }],
            ..CgroupLayout::default()
        };
        let w = RecordingCgroups::default();
        assert_eq!(kill_pod_cgroup(&w, &layout, "/kubepods/podu"), 1);
        assert_eq!(kill_pod_cgroup(&w, &layout, "/kubepods/../../etc"), 0);
        assert_eq!(
            kill_pod_cgroup(&w, &CgroupLayout::default(), "/kubepods/podu"),
            0
        );
        assert_eq!(w.ops(), ["kill /m/kubepods/podu V1"]);
    }
}
