//! The machine's NUMA cells, after cAdvisor's `MachineInfo.Topology` (`info/v1/machine.go`:
//! `Node`, `HugePagesInfo`) as kubelet's memory and topology managers use it: each cell's id,
//! memory (bytes), hugepages pools and CPUs. Built by the caller from sysfs
//! ([`crate::node::numa_topology`]), or as a single cell on machines without NUMA nodes in
//! sysfs; the parsers of sysfs' texts live here, pure.

use std::collections::BTreeMap;

use crate::{
    policy::cpu::CpuSet,
    quantity::{Format, Quantity},
};

/// One hugepages pool of a cell (`HugePagesInfo`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HugePages {
    /// Page size in KiB (`PageSize`).
    pub page_size_kib: u64,
    /// Pages in the pool (`NumPages`, sysfs' `nr_hugepages`).
    pub num_pages: u64,
}

impl HugePages {
    /// The resource name of the pool (`hugepages-2Mi`, `hugepages-1Gi`), as kubelet's
    /// `HugePageResourceName` prints the page size.
    #[must_use]
    pub fn resource_name(&self) -> String {
        hugepage_resource_name(self.page_size_kib)
    }

    /// The pool's size in bytes.
    #[must_use]
    pub fn total_bytes(&self) -> u64 {
        self.num_pages
            .saturating_mul(self.page_size_kib)
            .saturating_mul(1024)
    }
}

/// `hugepages-<size>` for a page size in KiB, the size printed in binary SI.
#[must_use]
pub fn hugepage_resource_name(page_size_kib: u64) -> String {
    let bytes = i64::try_from(page_size_kib.saturating_mul(1024)).unwrap_or(i64::MAX);
    format!(
        "hugepages-{}",
        Quantity::from_int(bytes, Format::BinarySI).canonical()
    )
}

/// One NUMA cell (`Node`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NumaCell {
    /// The node id (`Id`).
    pub id: usize,
    /// Memory in bytes (`Memory`, the cell's `MemTotal`).
    pub memory: u64,
    /// Hugepages pools (`HugePages`).
    pub hugepages: Vec<HugePages>,
    /// The cell's CPUs.
    pub cpus: CpuSet,
}

/// The machine's NUMA cells (`MachineInfo.Topology`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NumaTopology {
    /// The cells, by id.
    pub cells: Vec<NumaCell>,
}

impl NumaTopology {
    /// The node ids, ascending.
    #[must_use]
    pub fn node_ids(&self) -> Vec<usize> {
        let mut ids: Vec<usize> = self.cells.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// A cell by id.
    #[must_use]
    pub fn cell(&self, id: usize) -> Option<&NumaCell> {
        self.cells.iter().find(|c| c.id == id)
    }

    /// CPU id -> NUMA node.
    #[must_use]
    pub fn cpu_nodes(&self) -> BTreeMap<u32, usize> {
        self.cells
            .iter()
            .flat_map(|c| c.cpus.iter().map(move |cpu| (cpu, c.id)))
            .collect()
    }
}

/// The `MemTotal` of a cell's `meminfo` (`Node 0 MemTotal:  16310036 kB`), in bytes.
#[must_use]
pub fn node_meminfo_total(text: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let mut words = l.split_whitespace();
        // "Node", "<id>", "MemTotal:", "<kB>", "kB"
        let (_, _, key, value) = (words.next()?, words.next()?, words.next()?, words.next()?);
        (key == "MemTotal:")
            .then(|| value.parse::<u64>().ok())
            .flatten()
            .and_then(|kib| kib.checked_mul(1024))
    })
}

/// The page size in KiB of a `hugepages-2048kB` directory name.
#[must_use]
pub fn hugepages_dir_size_kib(name: &str) -> Option<u64> {
    name.strip_prefix("hugepages-")?
        .strip_suffix("kB")?
        .parse()
        .ok()
}

/// The id of a `node3` directory name.
#[must_use]
pub fn node_dir_id(name: &str) -> Option<usize> {
    let digits = name.strip_prefix("node")?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sysfs_texts() {
        let meminfo = "Node 1 MemTotal:       16310036 kB\nNode 1 MemFree:        1000 kB\n";
        assert_eq!(node_meminfo_total(meminfo), Some(16_310_036 * 1024));
        assert_eq!(node_meminfo_total("garbage"), None);
        assert_eq!(hugepages_dir_size_kib("hugepages-2048kB"), Some(2048));
        assert_eq!(hugepages_dir_size_kib("hugepages-x"), None);
        assert_eq!(node_dir_id("node12"), Some(12));
        assert_eq!(node_dir_id("node"), None);
        assert_eq!(node_dir_id("nodex"), None);
        assert_eq!(node_dir_id("possible"), None);
        assert_eq!(hugepage_resource_name(2048), "hugepages-2Mi");
        assert_eq!(hugepage_resource_name(1_048_576), "hugepages-1Gi");
        assert_eq!(hugepage_resource_name(64), "hugepages-64Ki");
    }
}
