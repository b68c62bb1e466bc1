//! The crossing check on the memory charge path (`enforcer-ebpf`'s `crossing.rs`): where it
//! attaches on this kernel, why the points before it were passed over, and the level the
//! eviction manager arms for it.
//!
//! The points are tried in order, the first that loads and attaches wins: fexit on
//! `try_charge_memcg` (BTF and trampolines), a kprobe on it (kprobes), then the memcg
//! statistics tracepoints (Linux 6.14+). With none, the crossing falls back to the tripwire a
//! cgroup file carries (v2 `memory.high`, v1 a usage-threshold eventfd), and the reasons say why.

use std::{
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use aya::{
    Ebpf,
    maps::{Array, MapData},
    programs::{FExit, KProbe, ProgramError, RawTracePoint},
};
use enforcer_common::{CROSSING_MAP, CrossingLevel, CrossingOffsets};
use serde::Serialize;

use super::btf::{Btf, BtfError};

/// The kernel function the fexit and kprobe attach to.
pub const CHARGE_FUNCTION: &str = "try_charge_memcg";
/// The tracepoints of the tracepoint attach (the first is required, the second adds kernel
/// memory's charges).
pub const TRACEPOINTS: [&str; 2] = ["mod_memcg_lruvec_state", "mod_memcg_state"];

/// Where the crossing check runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Attach {
    /// fexit on `try_charge_memcg`.
    Fexit,
    /// A kprobe on `try_charge_memcg`.
    Kprobe,
    /// The memcg statistics tracepoints.
    Tracepoint,
}

impl Attach {
    /// In the order tried.
    pub const ALL: [Self; 3] = [Self::Fexit, Self::Kprobe, Self::Tracepoint];

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Fexit => "fexit",
            Self::Kprobe => "kprobe",
            Self::Tracepoint => "tracepoint",
        }
    }

    /// What it attaches to, for reports.
    #[must_use]
    pub fn target(self) -> String {
        match self {
            Self::Fexit | Self::Kprobe => CHARGE_FUNCTION.to_owned(),
            Self::Tracepoint => format!("memcg:{}", TRACEPOINTS.join(", memcg:")),
        }
    }
}

/// What was chosen, and why each point before it was passed over.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct CrossingChoice {
    /// `None`: no point attached; the crossing falls back to the cgroup-file tripwire.
    pub chosen: Option<Attach>,
    pub skipped: Vec<Skipped>,
}

/// One point passed over.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Skipped {
    pub attach: Attach,
    pub reason: String,
}

impl CrossingChoice {
    /// One line: the point chosen (or the fallback) and why the others were passed over.
    #[must_use]
    pub fn summary(&self) -> String {
        let head = match self.chosen {
            Some(a) => format!("{} on {}", a.name(), a.target()),
            None => "none: the crossing falls back to the cgroup-file tripwire".to_owned(),
        };
        if self.skipped.is_empty() {
            return head;
        }
        let why: Vec<String> = self
            .skipped
            .iter()
            .map(|s| format!("{}: {}", s.attach.name(), s.reason))
            .collect();
        format!("{head} ({})", why.join("; "))
    }
}

/// The offsets the check reads at, from `btf`.
pub fn offsets(btf: &Btf) -> Result<CrossingOffsets, BtfError> {
    let memory_id = btf.enum_value("memory_cgrp_id")?;
    let memory_id =
        u32::try_from(memory_id).map_err(|_| BtfError::NoEnumValue("memory_cgrp_id".to_owned()))?;
    let field = |s: &str, m: &str| btf.member_offset(s, m);
    // The css a cgroup points at is the mem_cgroup's first member.
    if field("mem_cgroup", "css")? != 0 {
        return Err(BtfError::NoMember {
            strukt: "mem_cgroup".to_owned(),
            member: "css (as its first member)".to_owned(),
        });
    }
    Ok(CrossingOffsets {
        css_cgroup: field("cgroup_subsys_state", "cgroup")?,
        cgroup_level: field("cgroup", "level")?,
        cgroup_ancestors: field("cgroup", "ancestors")?,
        cgroup_kn: field("cgroup", "kn")?,
        kn_id: field("kernfs_node", "id")?,
        cgroup_memory_css: field("cgroup", "subsys")? + memory_id * 8,
        memcg_usage: field("mem_cgroup", "memory")? + field("page_counter", "usage")?,
        enabled: 1,
    })
}

/// The BTF the check's offsets and the fexit come from: `path`, else the kernel's own.
pub fn btf_path(path: Option<&Path>) -> PathBuf {
    path.map_or_else(|| PathBuf::from(super::btf::VMLINUX), Path::to_path_buf)
}

/// The offsets from the BTF at `path`, or why there are none (the check is then not
/// attached: every point is passed over with this reason).
pub fn read_offsets(path: &Path) -> Result<CrossingOffsets, String> {
    match Btf::read(path) {
        Err(e) => Err(format!("no kernel BTF at {} ({e})", path.display())),
        Ok(Err(e)) => Err(format!("the kernel's BTF at {}: {e}", path.display())),
        Ok(Ok(btf)) => offsets(&btf).map_err(|e| format!("the kernel's layout: {e}")),
    }
}

/// Why a program did not load or attach, in a line.
fn reason(e: &ProgramError) -> String {
    match e {
        ProgramError::LoadError {
            io_error,
            verifier_log,
        } => {
            let last = verifier_log
                .to_string()
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .map(|l| format!(": {}", l.trim()))
                .unwrap_or_default();
            format!("the kernel refused the program ({io_error}){last}")
        }
        other => chain(other),
    }
}

/// An error and its sources, in a line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(e) = src {
        s.push_str(": ");
        s.push_str(&e.to_string());
        src = e.source();
    }
    s
}

/// Which points [`attach`] may take.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Only {
    /// Those within the cost budget (1 % of allocation throughput): fexit and kprobe. The
    /// statistics tracepoints run on several statistics updates per charged page: measured at
    /// 1.12x the page-fault time disarmed, 1.14x armed (`cargo xtask bench charge`, Linux 6.18).
    WithinBudget,
    /// Every point.
    Any,
    /// This point alone.
    This(Attach),
}

/// Why the tracepoints are passed over without being pinned.
pub const OVER_BUDGET: &str = "over the cost budget (1 % of allocation throughput; measured 1.12x the page-fault time here: cargo xtask bench charge): pinned only (--signal-source ebpf-tracepoint)";

/// Attaches the check at the first point this kernel takes among those `only` allows, with
/// the offsets `offsets` gave (their error passes every point over). Never fails: what did
/// not attach is in the choice.
pub fn attach(
    ebpf: &mut Ebpf,
    offsets: &Result<CrossingOffsets, String>,
    btf: &Path,
    only: Only,
) -> CrossingChoice {
    let mut choice = CrossingChoice::default();
    for a in Attach::ALL {
        if matches!(only, Only::This(o) if o != a) {
            continue;
        }
        let tried = match offsets {
            Err(why) => Err(why.clone()),
            Ok(_) if only == Only::WithinBudget && a == Attach::Tracepoint => {
                Err(OVER_BUDGET.to_owned())
            }
            Ok(_) => attach_one(ebpf, a, btf),
        };
        match tried {
            Ok(()) => {
                choice.chosen = Some(a);
                break;
            }
            Err(reason) => choice.skipped.push(Skipped { attach: a, reason }),
        }
    }
    choice
}

fn attach_one(ebpf: &mut Ebpf, a: Attach, btf: &Path) -> Result<(), String> {
    let missing = |p: &str| format!("program {p} missing from the object");
    match a {
        Attach::Fexit => {
            let btf = aya::Btf::parse_file(btf, aya::Endianness::default())
                .map_err(|e| format!("the kernel's BTF at {}: {e}", btf.display()))?;
            let prog: &mut FExit = ebpf
                .program_mut("crossing_fexit")
                .ok_or_else(|| missing("crossing_fexit"))?
                .try_into()
                .map_err(|e| reason(&e))?;
            prog.load(CHARGE_FUNCTION, &btf).map_err(|e| match e {
                ProgramError::Btf(_) => {
                    format!("no function {CHARGE_FUNCTION} in the kernel's BTF")
                }
                other => reason(&other),
            })?;
            prog.attach().map_err(|e| reason(&e))?;
        }
        Attach::Kprobe => {
            let prog: &mut KProbe = ebpf
                .program_mut("crossing_kprobe")
                .ok_or_else(|| missing("crossing_kprobe"))?
                .try_into()
                .map_err(|e| reason(&e))?;
            prog.load().map_err(|e| reason(&e))?;
            prog.attach(CHARGE_FUNCTION, 0).map_err(|e| match e {
                ProgramError::KProbeError(k) => {
                    format!("no kprobe on {CHARGE_FUNCTION}: {}", chain(&k))
                }
                other => reason(&other),
            })?;
        }
        Attach::Tracepoint => {
            for (i, (program, tp)) in [
                ("crossing_lruvec", TRACEPOINTS[0]),
                ("crossing_state", TRACEPOINTS[1]),
            ]
            .into_iter()
            .enumerate()
            {
                let prog: &mut RawTracePoint = ebpf
                    .program_mut(program)
                    .ok_or_else(|| missing(program))?
                    .try_into()
                    .map_err(|e| reason(&e))?;
                prog.load().map_err(|e| reason(&e))?;
                match prog.attach(tp) {
                    Ok(_) => {}
                    // Without the first, no charge of user pages is seen.
                    Err(e) if i == 0 => {
                        return Err(format!(
                            "no tracepoint memcg:{tp} (Linux 6.14+): {}",
                            reason(&e)
                        ));
                    }
                    Err(e) => {
                        tracing::warn!(tracepoint = tp, error = %reason(&e), "the crossing check sees no kernel-memory charge");
                    }
                }
            }
        }
    }
    Ok(())
}

/// Errors arming the level.
#[derive(Debug, thiserror::Error)]
pub enum LevelError {
    #[error("the crossing level map: {0}")]
    Map(#[from] aya::maps::MapError),
    #[error("the crossing level map is missing from the object")]
    Missing,
}

/// The level the check compares with: armed by the eviction manager after each step (where
/// the nearest memory threshold would be crossed), disarmed by the program at the crossing.
#[derive(Clone)]
pub struct CrossingLevels {
    map: Arc<Mutex<Array<MapData, CrossingLevel>>>,
    /// The attach point, for reports.
    pub attach: Attach,
}

impl std::fmt::Debug for CrossingLevels {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CrossingLevels")
            .field("attach", &self.attach)
            .finish_non_exhaustive()
    }
}

/// The level in pages for a crossing once usage passes `bytes`, as `memory.high` is crossed
/// (usage above it): the first whole page past `bytes`. The program reports a counter at or
/// past the level, so the step that reads the usage there finds `available < threshold`
/// met (a level at `bytes` itself would report `available == threshold`, not met yet).
#[must_use]
pub fn level_pages(bytes: u64, page: u64) -> u64 {
    bytes / page.max(1) + 1
}

impl CrossingLevels {
    /// Takes the level map out of `ebpf`.
    pub fn take(ebpf: &mut Ebpf, attach: Attach) -> Result<Self, LevelError> {
        let map = ebpf.take_map(CROSSING_MAP).ok_or(LevelError::Missing)?;
        Ok(Self {
            map: Arc::new(Mutex::new(Array::try_from(map)?)),
            attach,
        })
    }

    /// Arms the level for the cgroup whose directory inode is `ino`: a crossing when its
    /// page counter passes `bytes`.
    pub fn arm(&self, ino: u64, bytes: u64) -> Result<(), LevelError> {
        let page = rustix::param::page_size() as u64;
        let mut map = crate::locks::lock(&self.map);
        let was = map.get(&0, 0)?;
        let next = CrossingLevel {
            ino,
            pages: level_pages(bytes, page),
            // Kept while the cgroup is the same (the program found it); found again otherwise.
            memcg: if was.ino == ino { was.memcg } else { 0 },
            seq: was.seq.wrapping_add(1),
            armed: 1,
        };
        map.set(0, next, 0)?;
        Ok(())
    }

    /// Disarms the level (no record until armed again).
    pub fn disarm(&self) -> Result<(), LevelError> {
        let mut map = crate::locks::lock(&self.map);
        let mut was = map.get(&0, 0)?;
        was.armed = 0;
        map.set(0, was, 0)?;
        Ok(())
    }

    /// The level as the map holds it (tests, reports).
    pub fn current(&self) -> Result<CrossingLevel, LevelError> {
        Ok(crate::locks::lock(&self.map).get(&0, 0)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_level_is_the_first_page_past_its_bytes() {
        assert_eq!(level_pages(0, 4096), 1);
        assert_eq!(level_pages(1, 4096), 1);
        assert_eq!(level_pages(4095, 4096), 1);
        assert_eq!(level_pages(4096, 4096), 2);
        assert_eq!(level_pages(4097, 4096), 2);
        assert_eq!(level_pages(100 << 20, 4096), 25_601);
    }

    #[test]
    fn the_summary_names_the_choice_and_each_point_passed_over() {
        let c = CrossingChoice {
            chosen: Some(Attach::Tracepoint),
            skipped: vec![
                Skipped {
                    attach: Attach::Fexit,
                    reason: "the kernel refused the program (EPERM)".into(),
                },
                Skipped {
                    attach: Attach::Kprobe,
                    reason: "no kprobes".into(),
                },
            ],
        };
        assert_eq!(
            c.summary(),
            "tracepoint on memcg:mod_memcg_lruvec_state, memcg:mod_memcg_state (fexit: the kernel \
             refused the program (EPERM); kprobe: no kprobes)"
        );
        let none = CrossingChoice {
            chosen: None,
            skipped: vec![Skipped {
                attach: Attach::Fexit,
                reason: "the kernel's layout: struct page_counter has no member usage".into(),
            }],
        };
        assert!(none.summary().starts_with("none: the crossing falls back"));
        assert!(none.summary().contains("page_counter has no member usage"));
    }

    #[test]
    fn a_bad_btf_is_a_reason_not_a_crash() {
        let dir = tempfile::tempdir().expect("tempdir");
        let missing = dir.path().join("none");
        assert!(
            read_offsets(&missing)
                .expect_err("no file")
                .starts_with("no kernel BTF at")
        );
        let junk = dir.path().join("junk");
        std::fs::write(&junk, b"not btf").expect("write");
        assert!(
            read_offsets(&junk)
                .expect_err("junk")
                .contains("the kernel's BTF at")
        );
    }
}
