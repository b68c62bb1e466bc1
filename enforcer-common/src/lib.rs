//! The kernel <-> userspace ABI of the enforcer.
//!
//! Everything the eBPF programs and the daemon exchange is defined here, once: the ring-buffer
//! record, the rate-limit map's value, the statistics map's indices and the globals the loader
//! sets. The ABI is frozen per release: fixed-width fields, explicit padding, a version number
//! carried by every record, and size asserts that both sides compile against.
#![no_std]

/// Version of the record layout. Bump it on any change to [`SignalRecord`].
/// 2: `flags` (fields the running kernel's tracepoint lacks) took 4 bytes of `path`.
pub const ABI_VERSION: u16 = 2;

/// Bytes of cgroup path carried by mkdir/rmdir records (NUL-terminated when shorter).
pub const PATH_LEN: usize = 220;

/// Name of the ring buffer map.
pub const RING_MAP: &str = "SIGNALS";
/// Name of the per-CPU statistics array.
pub const STATS_MAP: &str = "STATS";
/// Name of the per-cgroup burst map.
pub const BURST_MAP: &str = "BURSTS";
/// Global: minimum nanoseconds between two reclaim records of one cgroup (rest counted).
pub const GLOBAL_BURST_WINDOW_NS: &str = "BURST_WINDOW_NS";
/// Global: tgid whose `getppid()` calls the synthetic probe program reports (0 = none).
pub const GLOBAL_PROBE_TGID: &str = "PROBE_TGID";
/// Global: where the tracepoint fields the programs read sit in this kernel's records
/// ([`TracepointFields`], from the tracepoints' `format` files, set by the loader).
pub const GLOBAL_TP_FIELDS: &str = "TP_FIELDS";

/// Default burst window: one reclaim record per cgroup per millisecond at most.
pub const DEFAULT_BURST_WINDOW_NS: u64 = 1_000_000;
/// Ring buffer size in bytes (a power of two, a multiple of the page size).
pub const RING_BYTES: u32 = 4 << 20;
/// Entries of the burst map (an LRU: the coldest cgroups are forgotten first).
pub const BURST_ENTRIES: u32 = 16_384;

/// What a record reports.
#[repr(u16)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RecordKind {
    /// `cgroup/cgroup_mkdir`: a cgroup was created (any hierarchy).
    CgroupMkdir = 1,
    /// `cgroup/cgroup_rmdir`: a cgroup was removed (any hierarchy).
    CgroupRmdir = 2,
    /// `vmscan/mm_vmscan_memcg_reclaim_begin`: a memcg hit its limit and reclaims.
    MemcgReclaim = 3,
    /// `vmscan/mm_vmscan_direct_reclaim_begin`: the node is short of memory.
    DirectReclaim = 4,
    /// `oom/mark_victim`: the kernel OOM killer chose a victim.
    OomVictim = 5,
    /// `sched/sched_process_fork` from a cgroup over its burst window: pid pressure.
    Fork = 6,
    /// Synthetic records from the pipeline probe (benchmarks only).
    Probe = 7,
    /// The crossing check on the memory charge path: the watched cgroup's page counter
    /// reached the level the daemon armed ([`CrossingLevel`]), at the charge that did it.
    MemcgCrossing = 8,
}

impl RecordKind {
    /// Decodes a raw kind; `None` for kinds this build does not know.
    #[must_use]
    pub const fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            1 => Self::CgroupMkdir,
            2 => Self::CgroupRmdir,
            3 => Self::MemcgReclaim,
            4 => Self::DirectReclaim,
            5 => Self::OomVictim,
            6 => Self::Fork,
            7 => Self::Probe,
            8 => Self::MemcgCrossing,
            _ => return None,
        })
    }
}

/// One ring-buffer record. 272 bytes, 8-byte aligned, no implicit padding.
///
/// Field meaning by kind:
/// - mkdir/rmdir: `cgroup_id` is the new cgroup's id (inode), `hierarchy` the hierarchy id
///   (`root` of the tracepoint; the v2 hierarchy is the default root), `arg0` the level, and
///   `path` the path inside that hierarchy.
/// - reclaim/fork/probe: `pid`/`tid` and `cgroup_id` (v2 id) are the current task's, `count`
///   how many events this record stands for (the first of a burst plus those suppressed since
///   the last record), `arg0` the allocation order and `arg1` the gfp flags.
/// - memcg crossing: `pid`/`tid` are the charging task's, `cgroup_id` the watched cgroup's
///   directory inode, `hierarchy` the arming's sequence number, `arg0` the level in pages,
///   `arg1` the page counter (plus the pages being charged, for a check before the charge),
///   `count` the attach point ([`crossing_attach`]), and `path` the charging task's comm.
/// - OOM: `pid` is the victim's tgid, `tid` the current (charging) task's pid, `cgroup_id`
///   the current task's v2 cgroup id, `arg0` the victim's `oom_score_adj` (as u32 bits),
///   `arg1` its anon RSS in KiB (as the tracepoint reports it), and `path` its comm.
///
/// A slot filled from a tracepoint field the running kernel lacks (Debian 6.1's
/// `oom/mark_victim` has only `pid`) is left zero and named in `flags` ([`absent`]): zero is
/// never read as a value there.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct SignalRecord {
    pub abi: u16,
    pub kind: u16,
    pub hierarchy: u32,
    pub ts_ns: u64,
    pub pid: u32,
    pub tid: u32,
    pub cgroup_id: u64,
    pub count: u32,
    pub arg0: u32,
    pub arg1: u64,
    /// [`absent`] bits: slots the kernel's tracepoint could not fill.
    pub flags: u32,
    pub path: [u8; PATH_LEN],
}

/// Size of one record on the wire.
pub const RECORD_SIZE: usize = core::mem::size_of::<SignalRecord>();
const _: () = assert!(RECORD_SIZE == 272);
const _: () = assert!(core::mem::align_of::<SignalRecord>() == 8);

/// Bits of [`SignalRecord::flags`]: the slot is not filled (zero) because the running kernel's
/// tracepoint has no such field, its size is not one the program reads, or the read failed.
pub mod absent {
    /// `hierarchy` (mkdir/rmdir `root`).
    pub const HIERARCHY: u32 = 1 << 0;
    /// `cgroup_id` (mkdir/rmdir `id`).
    pub const CGROUP_ID: u32 = 1 << 1;
    /// `pid` (OOM victim `pid`).
    pub const PID: u32 = 1 << 2;
    /// `arg0` (level, order, oom_score_adj).
    pub const ARG0: u32 = 1 << 3;
    /// `arg1` (gfp flags, anon RSS).
    pub const ARG1: u32 = 1 << 4;
    /// `path` (cgroup path, comm).
    pub const PATH: u32 = 1 << 5;
}

/// Where one tracepoint field sits in the record the kernel hands the program: its byte offset
/// and size, as the tracepoint's `format` file says. [`FieldLoc::ABSENT`] when the kernel has no
/// such field (or one of a size the program does not read): the program then never reads it.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FieldLoc {
    pub offset: u32,
    pub size: u32,
}

/// Field offsets beyond this are refused (tracepoint records are far smaller); it also bounds
/// the offsets the programs add to the context pointer, for the verifier.
pub const MAX_FIELD_END: u32 = 4096;

impl FieldLoc {
    /// A field this kernel does not have.
    pub const ABSENT: Self = Self {
        offset: u32::MAX,
        size: 0,
    };

    /// A field at `offset`, `size` bytes long.
    #[must_use]
    pub const fn at(offset: u32, size: u32) -> Self {
        Self { offset, size }
    }

    /// Whether the field is there and inside [`MAX_FIELD_END`].
    #[must_use]
    pub const fn is_present(&self) -> bool {
        self.size != 0 && self.offset < MAX_FIELD_END && self.size <= MAX_FIELD_END - self.offset
    }
}

/// Fields of `cgroup/cgroup_mkdir` and `cgroup/cgroup_rmdir`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CgroupFields {
    /// `int root`: hierarchy id.
    pub root: FieldLoc,
    /// `int level`.
    pub level: FieldLoc,
    /// `u64 id` (an `int` before 5.5).
    pub id: FieldLoc,
    /// `__data_loc char[] path`.
    pub path: FieldLoc,
}

/// Fields of `vmscan/mm_vmscan_{memcg,direct}_reclaim_begin`.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReclaimFields {
    /// `int order`.
    pub order: FieldLoc,
    /// `unsigned long gfp_flags` (a `gfp_t`, 4 bytes, on older kernels).
    pub gfp_flags: FieldLoc,
}

/// Fields of `oom/mark_victim` (Debian 6.1 has only `pid`; later kernels added the others).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OomFields {
    /// `int pid`.
    pub pid: FieldLoc,
    /// `__data_loc char[] comm`.
    pub comm: FieldLoc,
    /// `unsigned long anon_rss` (KiB).
    pub anon_rss: FieldLoc,
    /// `short oom_score_adj`.
    pub oom_score_adj: FieldLoc,
}

/// Value of the [`GLOBAL_TP_FIELDS`] global: the running kernel's layout of every tracepoint
/// field the programs read. The loader fills it from the `format` files before loading, so it
/// lands in the frozen read-only data the verifier sees as constants.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TracepointFields {
    pub cgroup_mkdir: CgroupFields,
    pub cgroup_rmdir: CgroupFields,
    pub memcg_reclaim: ReclaimFields,
    pub direct_reclaim: ReclaimFields,
    pub oom_victim: OomFields,
}
const _: () = assert!(core::mem::size_of::<TracepointFields>() == 16 * 8);

impl TracepointFields {
    /// Every field absent: what the programs see if the loader sets nothing (they read none).
    pub const ABSENT: Self = {
        let c = CgroupFields {
            root: FieldLoc::ABSENT,
            level: FieldLoc::ABSENT,
            id: FieldLoc::ABSENT,
            path: FieldLoc::ABSENT,
        };
        let r = ReclaimFields {
            order: FieldLoc::ABSENT,
            gfp_flags: FieldLoc::ABSENT,
        };
        Self {
            cgroup_mkdir: c,
            cgroup_rmdir: c,
            memcg_reclaim: r,
            direct_reclaim: r,
            oom_victim: OomFields {
                pid: FieldLoc::ABSENT,
                comm: FieldLoc::ABSENT,
                anon_rss: FieldLoc::ABSENT,
                oom_score_adj: FieldLoc::ABSENT,
            },
        }
    };
}

/// Burst state of one cgroup (value of the burst map).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Burst {
    /// Kernel time of the last record sent for this cgroup and kind.
    pub last_ns: u64,
    /// Events counted since then and not yet reported.
    pub suppressed: u32,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<Burst>() == 16);

/// Key of the burst map: a cgroup (v2 id, or the tgid when the task has no v2 cgroup) and kind.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct BurstKey {
    pub id: u64,
    pub kind: u16,
    /// 1 when `id` is a tgid rather than a cgroup id.
    pub by_tgid: u16,
    pub _pad: u32,
}
const _: () = assert!(core::mem::size_of::<BurstKey>() == 16);

/// Indices of the per-CPU statistics array.
pub mod stat {
    /// Records written to the ring buffer.
    pub const EMITTED: u32 = 0;
    /// Ring-buffer reservations that failed (the buffer was full): records lost.
    pub const RING_FULL: u32 = 1;
    /// Events folded into a later record by the per-cgroup burst limiter.
    pub const SUPPRESSED: u32 = 2;
    /// Events seen by the programs, in all.
    pub const SEEN: u32 = 3;
    /// Charges the crossing check compared with an armed level.
    pub const CROSSING_CHECKS: u32 = 4;
    /// Reads of the kernel's structures by the crossing check that faulted.
    pub const CROSSING_READ_FAULTS: u32 = 5;
    /// Number of counters.
    pub const COUNT: u32 = 6;
}

/// Global of the `memcg-usage` object: where the fields its cgroup iterator reads sit in the
/// running kernel ([`MemcgOffsets`], from the kernel's BTF, set by the loader).
pub const GLOBAL_MEMCG_OFFSETS: &str = "MEMCG_OFFSETS";
/// The `memcg-usage` object's program: a cgroup iterator writing one [`MemcgUsage`] per
/// memory cgroup it visits.
pub const MEMCG_USAGE_PROGRAM: &str = "memcg_usage";

/// Byte offsets (and the memory controller's index) the cgroup iterator reads at, from the
/// running kernel's BTF: `cgroup.subsys[memory_cgrp_id]` is the memory cgroup's
/// `cgroup_subsys_state`, the first member of its `mem_cgroup`; `mem_cgroup.memory.usage` is
/// its page counter (pages, what `memory.usage_in_bytes` / `memory.current` print times the
/// page size); `cgroup.kn->id` is the cgroup directory's inode number.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgOffsets {
    /// `offsetof(struct cgroup, subsys) + memory_cgrp_id * 8`.
    pub cgroup_memory_css: u32,
    /// `offsetof(struct cgroup, kn)`.
    pub cgroup_kn: u32,
    /// `offsetof(struct kernfs_node, id)`.
    pub kn_id: u32,
    /// `offsetof(struct mem_cgroup, memory) + offsetof(struct page_counter, usage)`.
    pub memcg_usage: u32,
    /// `offsetof(struct cgroup, level)`.
    pub cgroup_level: u32,
    /// The deepest level written: a cgroup below it is passed over after one read (the
    /// pods' containers: their figures are not what a crossing reads).
    pub max_level: u32,
}

/// One memory cgroup as the iterator writes it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemcgUsage {
    /// The cgroup directory's inode number (`kernfs_node.id`).
    pub ino: u64,
    /// Its page counter, in pages.
    pub pages: u64,
}

const _: () = assert!(core::mem::size_of::<MemcgOffsets>() == 24);
const _: () = assert!(core::mem::size_of::<MemcgUsage>() == 16);

/// Global of the `enforcer` object: where the fields the crossing check reads sit in the
/// running kernel ([`CrossingOffsets`], from the kernel's BTF, set by the loader).
pub const GLOBAL_CROSSING_OFFSETS: &str = "CROSSING_OFFSETS";
/// The crossing check's level map: one [`CrossingLevel`] (index 0).
pub const CROSSING_MAP: &str = "CROSSING";

/// The crossing check's attach points, as the record's `count` names them.
pub mod crossing_attach {
    /// fexit on `try_charge_memcg` (after the charge).
    pub const FEXIT: u32 = 1;
    /// kprobe on `try_charge_memcg` (before the charge: the pages charged are added).
    pub const KPROBE: u32 = 2;
    /// The memcg statistics tracepoints (6.14+): `memcg:mod_memcg_lruvec_state` and
    /// `memcg:mod_memcg_state`, right after the charge in the same path.
    pub const TRACEPOINT: u32 = 3;
}

/// Byte offsets the crossing check reads at, from the running kernel's BTF. `enabled` is 0
/// when the loader could not find them (the check then reads nothing).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrossingOffsets {
    /// `offsetof(struct cgroup_subsys_state, cgroup)` (the css is `mem_cgroup`'s first member).
    pub css_cgroup: u32,
    /// `offsetof(struct cgroup, level)`.
    pub cgroup_level: u32,
    /// `offsetof(struct cgroup, ancestors)`: `ancestors[level]` is the cgroup's ancestor at
    /// that level.
    pub cgroup_ancestors: u32,
    /// `offsetof(struct cgroup, kn)`.
    pub cgroup_kn: u32,
    /// `offsetof(struct kernfs_node, id)`.
    pub kn_id: u32,
    /// `offsetof(struct cgroup, subsys) + memory_cgrp_id * 8`.
    pub cgroup_memory_css: u32,
    /// `offsetof(struct mem_cgroup, memory) + offsetof(struct page_counter, usage)`.
    pub memcg_usage: u32,
    /// 1 when the offsets were found.
    pub enabled: u32,
}

/// The level the crossing check compares the watched cgroup's page counter with.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CrossingLevel {
    /// The watched cgroup's directory inode (its `kernfs_node.id`), in its memory hierarchy.
    pub ino: u64,
    /// The level, in pages: a page counter at or past it is a crossing.
    pub pages: u64,
    /// The watched cgroup's `struct mem_cgroup *`, found by the program at the first charge
    /// below it and kept (0 until then; the daemon sets it back to 0 when `ino` changes).
    pub memcg: u64,
    /// Counts the armings; the record carries it.
    pub seq: u32,
    /// 1 while armed; the program sets 0 when it reports the crossing (one record per arming).
    pub armed: u32,
}

const _: () = assert!(core::mem::size_of::<CrossingOffsets>() == 32);
const _: () = assert!(core::mem::size_of::<CrossingLevel>() == 32);

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, `repr(C)`, no padding bytes (checked by the size asserts).
    unsafe impl aya::Pod for super::SignalRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Burst {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::BurstKey {}
    // SAFETY: as above (`repr(C)` of u32 pairs, size asserted).
    unsafe impl aya::Pod for super::TracepointFields {}
    // SAFETY: as above (`repr(C)` of six u32, size asserted).
    unsafe impl aya::Pod for super::MemcgOffsets {}
    // SAFETY: as above (`repr(C)` of eight u32, size asserted).
    unsafe impl aya::Pod for super::CrossingOffsets {}
    // SAFETY: as above (`repr(C)`, three u64 and two u32, size asserted).
    unsafe impl aya::Pod for super::CrossingLevel {}
}
