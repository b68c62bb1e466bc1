//! Swap readings: the machine's swap (`/proc/meminfo`), whether swap is on (`/proc/swaps`),
//! whether the kernel has a swap controller where kubelet looks for one, and a cgroup v2
//! cgroup's swap usage and limit. Reading only; the decisions are `policy::swap`'s.

use std::path::Path;

use super::{NodeError, meminfo_bytes, read};
use crate::cgroup::CgroupLayout;

/// The machine's swap from `/proc/meminfo` text: (`SwapTotal`, `SwapFree`) in bytes.
#[must_use]
pub fn swap_figures(meminfo: &str) -> Option<(i64, i64)> {
    Some((
        meminfo_bytes(meminfo, "SwapTotal:")?,
        meminfo_bytes(meminfo, "SwapFree:")?,
    ))
}

/// (`SwapTotal`, `SwapFree`) of this machine (cAdvisor's `SwapCapacity` is the first).
pub fn machine_swap() -> Result<(i64, i64), NodeError> {
    let path = Path::new("/proc/meminfo");
    let text = read(path)?;
    swap_figures(&text).ok_or_else(|| NodeError::Parse {
        path: path.to_path_buf(),
        what: "no SwapTotal / SwapFree".into(),
    })
}

/// The swap areas `/proc/swaps` text lists (the lines below its header), by file name.
#[must_use]
pub fn swap_areas(proc_swaps: &str) -> Vec<String> {
    proc_swaps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// The swap areas in use on this machine (kubelet's `failSwapOn` check reads `/proc/swaps`).
pub fn swap_on() -> Result<Vec<String>, NodeError> {
    Ok(swap_areas(&read(Path::new("/proc/swaps"))?))
}

/// kubelet's `swapControllerAvailable` (the memory hierarchy answers where kubelet looks).
#[must_use]
pub fn swap_controller_available(layout: &CgroupLayout) -> bool {
    let own = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    layout
        .memory()
        .is_some_and(|m| m.swap_controller_available(&own))
}

/// A cgroup v2 cgroup's swap: `memory.swap.current` and `memory.swap.max` (`None` for
/// `max`), in bytes; `None` where the files are missing (cgroup v1, no swap controller).
#[must_use]
pub fn cgroup_swap(dir: &Path) -> Option<(u64, Option<u64>)> {
    let current = std::fs::read_to_string(dir.join("memory.swap.current")).ok()?;
    let current = current.trim().parse().ok()?;
    let max = std::fs::read_to_string(dir.join("memory.swap.max")).ok()?;
    let max = match max.trim() {
        "max" => None,
        v => Some(v.parse().ok()?),
    };
    Some((current, max))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readings() {
        let meminfo = "MemTotal: 16 kB\nSwapCached: 0 kB\nSwapTotal:  4096 kB\nSwapFree: 1024 kB\n";
        assert_eq!(swap_figures(meminfo), Some((4 << 20, 1 << 20)));
        assert_eq!(swap_figures("MemTotal: 16 kB\n"), None);
        let swaps = "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n/swap.img  file  2097148  0  -2\n/dev/zram0 partition 8 0 100\n";
        assert_eq!(swap_areas(swaps), ["/swap.img", "/dev/zram0"]);
        assert!(swap_areas("Filename Type Size Used Priority\n").is_empty());
        let dir = std::env::temp_dir().join(format!("enforcer-swap-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        assert_eq!(cgroup_swap(&dir), None);
        std::fs::write(dir.join("memory.swap.current"), "4096\n").unwrap();
        std::fs::write(dir.join("memory.swap.max"), "max\n").unwrap();
        assert_eq!(cgroup_swap(&dir), Some((4096, None)));
        std::fs::write(dir.join("memory.swap.max"), "134217728\n").unwrap();
        assert_eq!(cgroup_swap(&dir), Some((4096, Some(134_217_728))));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
