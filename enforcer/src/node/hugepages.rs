//! The machine's hugepages pools as cAdvisor reads them for kubelet's node capacity
//! (`MachineInfo.HugePages`): each `<sys>/kernel/mm/hugepages/hugepages-<size>kB` directory's
//! `nr_hugepages`. Every supported size is reported, a pool of no pages as 0 (kubelet's
//! capacity lists `hugepages-1Gi: 0` too).

use std::{fs, path::Path};

use crate::policy::topology::{
    HugePages,
    numa::{hugepage_resource_name, hugepages_dir_size_kib},
};

/// The pools under `<sys>/kernel/mm/hugepages`, smallest page first (none where the kernel has
/// no hugetlb support; a pool whose `nr_hugepages` cannot be read is left out).
#[must_use]
pub fn machine_hugepages(sys: &Path) -> Vec<HugePages> {
    let Ok(dirs) = fs::read_dir(sys.join("kernel/mm/hugepages")) else {
        return Vec::new();
    };
    let mut pools: Vec<HugePages> = dirs
        .flatten()
        .filter_map(|d| {
            let page_size_kib = d.file_name().to_str().and_then(hugepages_dir_size_kib)?;
            let text = fs::read_to_string(d.path().join("nr_hugepages")).ok()?;
            let num_pages = text.trim().parse().ok()?;
            Some(HugePages {
                page_size_kib,
                num_pages,
            })
        })
        .collect();
    pools.sort_by_key(|h| h.page_size_kib);
    pools
}

/// The capacity entries of the pools: `hugepages-<size>` -> bytes.
#[must_use]
pub fn capacity_of(pools: &[HugePages]) -> Vec<(String, i64)> {
    pools
        .iter()
        .map(|h| {
            let bytes = i64::try_from(h.total_bytes()).unwrap_or(i64::MAX);
            (hugepage_resource_name(h.page_size_kib), bytes)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pools_from_sysfs_as_kubelet_names_them() {
        let dir = tempfile::tempdir().expect("tempdir");
        let base = dir.path().join("kernel/mm/hugepages");
        for (name, nr) in [
            ("hugepages-2048kB", "512\n"),
            ("hugepages-1048576kB", "0\n"),
            ("not-a-pool", "7\n"),
        ] {
            fs::create_dir_all(base.join(name)).expect("mkdir");
            fs::write(base.join(name).join("nr_hugepages"), nr).expect("write");
        }
        fs::create_dir_all(base.join("hugepages-64kB")).expect("mkdir");
        fs::write(base.join("hugepages-64kB/nr_hugepages"), "x\n").expect("write");
        let pools = machine_hugepages(dir.path());
        assert_eq!(
            capacity_of(&pools),
            vec![
                ("hugepages-2Mi".to_owned(), 512 * 2 * 1024 * 1024),
                ("hugepages-1Gi".to_owned(), 0),
            ]
        );
        assert!(machine_hugepages(&dir.path().join("none")).is_empty());
    }
}
