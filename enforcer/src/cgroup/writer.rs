//! Every change the enforcer makes to a cgroup goes through a [`CgroupWriter`]: creating and
//! removing directories, delegating controllers (v2 `cgroup.subtree_control`), writing the
//! memory and cpu values, and killing what runs inside. [`KernelCgroups`] does it on the real
//! hierarchies, the values through `cgroups-rs` controllers; a recording writer stands in for
//! it in the unit tests of the code that decides what to write (kubepods, pod cgroups, the
//! eviction kill). Paths arrive already joined inside their root ([`super::join_inside`]).

use std::{
    collections::BTreeMap,
    fmt, io,
    path::{Path, PathBuf},
    sync::Mutex,
};

use cgroups_rs::fs::{
    MaxValue,
    cpu::CpuController,
    memory::{MemController, SetMemory},
    pid::PidController,
};

use super::{CgroupError, CgroupVersion, WithPath as _};
use crate::policy::resources::cgroup::shares_to_weight;

/// What to write to one cgroup; `None` leaves a value as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CgroupValues {
    /// cgroup v1 `cpu.shares` (v2: `cpu.weight` derived from it).
    pub cpu_shares: Option<u64>,
    /// CFS quota in microseconds; `Some(None)` is unlimited.
    pub cpu_quota: Option<Option<i64>>,
    /// CFS period in microseconds (written with the quota).
    pub cpu_period: Option<u64>,
    /// Memory limit in bytes; `Some(None)` is unlimited.
    pub memory_limit: Option<Option<i64>>,
    /// Memory QoS `memory.min` (cgroup v2 only; ignored on v1).
    pub memory_min: Option<i64>,
    /// Memory QoS `memory.low` (cgroup v2 only; ignored on v1).
    pub memory_low: Option<i64>,
    /// `pids.max`; `None` leaves it as it is (kubelet writes it only when limited).
    pub pids_max: Option<i64>,
}

/// What [`KernelCgroups`] last wrote, file by file (the value as the kernel shows it back,
/// before page rounding), so `enforcer doctor` can compare it with what is on disk now.
#[derive(Debug, Default)]
pub struct Ledger {
    files: BTreeMap<PathBuf, String>,
    generation: u64,
}

static LEDGER: Mutex<Ledger> = Mutex::new(Ledger {
    files: BTreeMap::new(),
    generation: 0,
});

fn ledger() -> std::sync::MutexGuard<'static, Ledger> {
    crate::locks::lock(&LEDGER)
}

fn wrote(dir: &Path, file: &str, value: String) {
    let mut l = ledger();
    if l.files.insert(dir.join(file), value.clone()).as_ref() != Some(&value) {
        l.generation += 1;
    }
}

/// The values written so far (file -> value) and a generation that moves on every change.
#[must_use]
pub fn written() -> (u64, BTreeMap<PathBuf, String>) {
    let l = ledger();
    (l.generation, l.files.clone())
}

/// The cgroup effects.
pub trait CgroupWriter: Send + Sync + fmt::Debug {
    /// Creates one cgroup directory (its parent exists); an existing one is fine.
    fn create_dir(&self, dir: &Path) -> Result<(), CgroupError>;
    /// Delegates `controllers` to the children of `parent` (cgroup v2), best effort: a
    /// controller the parent lacks cannot be delegated.
    fn delegate(&self, parent: &Path, controllers: &[&str]);
    /// Writes the memory values of `dir` in the hierarchy mounted at `mount`.
    fn set_memory(
        &self,
        dir: &Path,
        mount: &Path,
        version: CgroupVersion,
        values: &CgroupValues,
    ) -> Result<(), CgroupError>;
    /// Writes the cpu values (shares or weight, quota and period).
    fn set_cpu(
        &self,
        dir: &Path,
        mount: &Path,
        version: CgroupVersion,
        values: &CgroupValues,
    ) -> Result<(), CgroupError>;
    /// Writes `pids.max`.
    fn set_pids(
        &self,
        dir: &Path,
        mount: &Path,
        version: CgroupVersion,
        max: i64,
    ) -> Result<(), CgroupError>;
    /// Sets cgroup v2 `memory.high` (`None`: `max`).
    fn set_memory_high(
        &self,
        dir: &Path,
        mount: &Path,
        high: Option<i64>,
    ) -> Result<(), CgroupError>;
    /// Removes one empty cgroup directory; a missing one is fine.
    fn remove_dir(&self, dir: &Path) -> Result<(), CgroupError>;
    /// SIGKILL to every process in `dir` and its child cgroups (`cgroup.kill` where v2 has
    /// it); returns how many were signalled (1 for `cgroup.kill`).
    fn kill(&self, dir: &Path, version: CgroupVersion) -> usize;
}

/// The real hierarchies.
#[derive(Clone, Copy, Debug, Default)]
pub struct KernelCgroups;

fn controller_err(
    dir: &Path,
    file: &str,
) -> impl FnOnce(cgroups_rs::fs::error::Error) -> CgroupError {
    let path = dir.join(file);
    move |source| CgroupError::Controller { path, source }
}

impl CgroupWriter for KernelCgroups {
    fn create_dir(&self, dir: &Path) -> Result<(), CgroupError> {
        match std::fs::create_dir(dir) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e).with_path(dir),
            _ => Ok(()),
        }
    }

    fn delegate(&self, parent: &Path, controllers: &[&str]) {
        let ctl = parent.join("cgroup.subtree_control");
        for c in controllers {
            let _ = std::fs::write(&ctl, format!("+{c}"));
        }
    }

    fn set_memory(
        &self,
        dir: &Path,
        mount: &Path,
        version: CgroupVersion,
        v: &CgroupValues,
    ) -> Result<(), CgroupError> {
        match version {
            CgroupVersion::V1 => {
                if let Some(limit) = v.memory_limit {
                    MemController::new(dir.to_path_buf(), mount.to_path_buf(), false)
                        .set_limit(limit.unwrap_or(-1))
                        .map_err(controller_err(dir, "memory.limit_in_bytes"))?;
                    wrote(
                        dir,
                        "memory.limit_in_bytes",
                        limit.map_or_else(|| "max".to_owned(), |l| l.to_string()),
                    );
                }
            }
            CgroupVersion::V2 => {
                let max = v
                    .memory_limit
                    .map(|l| l.map_or(MaxValue::Max, MaxValue::Value));
                let min = v.memory_min.map(MaxValue::Value);
                let low = v.memory_low.map(MaxValue::Value);
                if max.is_some() || min.is_some() || low.is_some() {
                    MemController::new(dir.to_path_buf(), mount.to_path_buf(), true)
                        .set_mem(SetMemory {
                            low,
                            high: None,
                            min,
                            max,
                        })
                        .map_err(controller_err(dir, "memory.max"))?;
                    if let Some(limit) = v.memory_limit {
                        wrote(
                            dir,
                            "memory.max",
                            limit.map_or_else(|| "max".to_owned(), |l| l.to_string()),
                        );
                    }
                    if let Some(m) = v.memory_min {
                        wrote(dir, "memory.min", m.to_string());
                    }
                    if let Some(m) = v.memory_low {
                        wrote(dir, "memory.low", m.to_string());
                    }
                }
            }
        }
        Ok(())
    }

    fn set_cpu(
        &self,
        dir: &Path,
        mount: &Path,
        version: CgroupVersion,
        v: &CgroupValues,
    ) -> Result<(), CgroupError> {
        let v2 = version == CgroupVersion::V2;
        let cpu = CpuController::new(dir.to_path_buf(), mount.to_path_buf(), v2);
        if let Some(shares) = v.cpu_shares {
            let (file, value) = if v2 {
                ("cpu.weight", shares_to_weight(shares))
            } else {
                ("cpu.shares", shares)
            };
            cpu.set_shares(value).map_err(controller_err(dir, file))?;
            wrote(dir, file, value.to_string());
        }
        if let Some(quota) = v.cpu_quota {
            let file = if v2 { "cpu.max" } else { "cpu.cfs_quota_us" };
            cpu.set_cfs_quota_and_period(Some(quota.unwrap_or(-1)), v.cpu_period)
                .map_err(controller_err(dir, file))?;
            let q = quota.map_or_else(|| "max".to_owned(), |q| q.to_string());
            wrote(
                dir,
                file,
                if v2 {
                    format!("{q} {}", v.cpu_period.unwrap_or(100_000))
                } else {
                    quota.unwrap_or(-1).to_string()
                },
            );
        }
        Ok(())
    }

    fn set_pids(
        &self,
        dir: &Path,
        mount: &Path,
        version: CgroupVersion,
        max: i64,
    ) -> Result<(), CgroupError> {
        PidController::new(
            dir.to_path_buf(),
            mount.to_path_buf(),
            version == CgroupVersion::V2,
        )
        .set_pid_max(MaxValue::Value(max))
        .map_err(controller_err(dir, "pids.max"))?;
        wrote(dir, "pids.max", max.to_string());
        Ok(())
    }

    fn set_memory_high(
        &self,
        dir: &Path,
        mount: &Path,
        high: Option<i64>,
    ) -> Result<(), CgroupError> {
        MemController::new(dir.to_path_buf(), mount.to_path_buf(), true)
            .set_mem(SetMemory {
                low: None,
                high: Some(high.map_or(MaxValue::Max, MaxValue::Value)),
                min: None,
                max: None,
            })
            .map_err(controller_err(dir, "memory.high"))
    }

    fn remove_dir(&self, dir: &Path) -> Result<(), CgroupError> {
        {
            let mut l = ledger();
            let before = l.files.len();
            l.files.retain(|f, _| !f.starts_with(dir));
            if l.files.len() != before {
                l.generation += 1;
            }
        }
        match std::fs::remove_dir(dir) {
            Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e).with_path(dir),
            _ => Ok(()),
        }
    }

    fn kill(&self, dir: &Path, version: CgroupVersion) -> usize {
        if version == CgroupVersion::V2 && std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
            return 1;
        }
        let mut killed = 0;
        for_each_process(dir, |pid| {
            if pid.as_raw_nonzero().get() > 1
                && rustix::process::kill_process(pid, rustix::process::Signal::KILL).is_ok()
            {
                killed += 1;
            }
            true
        });
        killed
    }
}

/// Calls `f` with every process in the cgroup `dir` and its descendants (each directory's
/// `cgroup.procs`, the directories walked depth first) until `f` returns false.
pub fn for_each_process(dir: &Path, mut f: impl FnMut(rustix::process::Pid) -> bool) {
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        if let Ok(text) = std::fs::read_to_string(d.join("cgroup.procs")) {
            for pid in text
                .lines()
                .filter_map(|l| l.trim().parse::<i32>().ok())
                .filter_map(rustix::process::Pid::from_raw)
            {
                if !f(pid) {
                    return;
                }
            }
        }
        if let Ok(entries) = std::fs::read_dir(&d) {
            stack.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
    }
}

/// A writer that records what it is asked, for tests of the code that decides the writes.
#[cfg(test)]
#[derive(Debug, Default)]
pub struct RecordingCgroups {
    ops: std::sync::Mutex<Vec<String>>,
}

#[cfg(test)]
impl RecordingCgroups {
    fn push(&self, op: String) {
        crate::locks::lock(&self.ops).push(op);
    }

    /// What was asked, in order.
    pub fn ops(&self) -> Vec<String> {
        crate::locks::lock(&self.ops).clone()
    }
}

#[cfg(test)]
impl CgroupWriter for RecordingCgroups {
    fn create_dir(&self, dir: &Path) -> Result<(), CgroupError> {
        self.push(format!("mkdir {}", dir.display()));
        Ok(())
    }

    fn delegate(&self, parent: &Path, controllers: &[&str]) {
        self.push(format!(
            "delegate {} {}",
            parent.display(),
            controllers.join(",")
        ));
    }

    fn set_memory(
        &self,
        dir: &Path,
        _mount: &Path,
        version: CgroupVersion,
        v: &CgroupValues,
    ) -> Result<(), CgroupError> {
        self.push(format!(
            "memory {} {version:?} limit={:?} min={:?} low={:?}",
            dir.display(),
            v.memory_limit,
            v.memory_min,
            v.memory_low
        ));
        Ok(())
    }

    fn set_cpu(
        &self,
        dir: &Path,
        _mount: &Path,
        version: CgroupVersion,
        v: &CgroupValues,
    ) -> Result<(), CgroupError> {
        self.push(format!(
            "cpu {} {version:?} shares={:?} quota={:?} period={:?}",
            dir.display(),
            v.cpu_shares,
            v.cpu_quota,
            v.cpu_period
        ));
        Ok(())
    }

    fn set_memory_high(
        &self,
        dir: &Path,
        _mount: &Path,
        high: Option<i64>,
    ) -> Result<(), CgroupError> {
        self.push(format!("memory.high {} {high:?}", dir.display()));
        Ok(())
    }

    fn set_pids(
        &self,
        dir: &Path,
        _mount: &Path,
        version: CgroupVersion,
        max: i64,
    ) -> Result<(), CgroupError> {
        self.push(format!("pids {} {version:?} max={max}", dir.display()));
        Ok(())
    }

    fn remove_dir(&self, dir: &Path) -> Result<(), CgroupError> {
        self.push(format!("rmdir {}", dir.display()));
        Ok(())
    }

    fn kill(&self, dir: &Path, version: CgroupVersion) -> usize {
        self.push(format!("kill {} {version:?}", dir.display()));
        1
    }
}
