//! The kernel <-> userspace ABI of the enforcer.
//!
//! Everything the eBPF programs and the daemon exchange is defined here, once: the ring-buffer
//! record, the rate-limit map's value, the statistics map's indices and the globals the loader
//! sets. The ABI is frozen per release: fixed-width fields, explicit padding, a version number
//! carried by every record, and size asserts that both sides compile against.
#![no_std]

/// Version of the record layout. Bump it on any change to [`SignalRecord`].
pub const ABI_VERSION: u16 = 1;

/// Bytes of cgroup path carried by mkdir/rmdir records (NUL-terminated when shorter).
pub const PATH_LEN: usize = 224;

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
/// - OOM: `pid` is the victim's tgid, `tid` the current (charging) task's pid, `cgroup_id`
///   the current task's v2 cgroup id, `arg0` the victim's `oom_score_adj` (as u32 bits),
///   `arg1` its anon RSS in KiB (as the tracepoint reports it), and `path` its comm.
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
    pub path: [u8; PATH_LEN],
}

/// Size of one record on the wire.
pub const RECORD_SIZE: usize = core::mem::size_of::<SignalRecord>();
const _: () = assert!(RECORD_SIZE == 272);
const _: () = assert!(core::mem::align_of::<SignalRecord>() == 8);

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
    /// Number of counters.
    pub const COUNT: u32 = 4;
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain-old-data, `repr(C)`, no padding bytes (checked by the size asserts).
    unsafe impl aya::Pod for super::SignalRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::Burst {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::BurstKey {}
}
