//! The enforcer's kernel programs.
//!
//! Capture and filter only: attribute each event to a cgroup, fold bursts per cgroup in a map,
//! and emit one compact [`SignalRecord`] per burst through the `SIGNALS` ring buffer. No policy
//! here. Every program has the thin `prog(ctx) -> u32 { match try_prog(ctx) { .. } }` shape.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext as _,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_pid_tgid, bpf_ktime_get_ns,
        bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, tracepoint},
    maps::{LruHashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use enforcer_common::{
    ABI_VERSION, BURST_ENTRIES, Burst, BurstKey, DEFAULT_BURST_WINDOW_NS, PATH_LEN, RING_BYTES,
    RecordKind, SignalRecord, stat,
};

#[map]
static SIGNALS: RingBuf = RingBuf::with_byte_size(RING_BYTES, 0);

#[map]
static STATS: PerCpuArray<u64> = PerCpuArray::with_max_entries(stat::COUNT, 0);

#[map]
static BURSTS: LruHashMap<BurstKey, Burst> = LruHashMap::with_max_entries(BURST_ENTRIES, 0);

/// Set by the loader: minimum time between two records of one cgroup and kind.
#[unsafe(no_mangle)]
static BURST_WINDOW_NS: u64 = DEFAULT_BURST_WINDOW_NS;

/// Set by the loader for benchmarks: the tgid whose getppid() calls are reported.
#[unsafe(no_mangle)]
static PROBE_TGID: u32 = 0;

// Tracepoint field offsets (from /sys/kernel/tracing/events/*/format; stable since 4.x for the
// fields read here).
const CGROUP_ROOT: usize = 8;
const CGROUP_LEVEL: usize = 12;
const CGROUP_ID: usize = 16;
const CGROUP_PATH_LOC: usize = 24;
const RECLAIM_ORDER: usize = 8;
const RECLAIM_GFP: usize = 16;
const OOM_PID: usize = 8;
const OOM_COMM_LOC: usize = 12;
const OOM_ANON_RSS: usize = 24;
const OOM_SCORE_ADJ: usize = 64;

#[inline(always)]
fn count(index: u32, n: u64) {
    if let Some(slot) = STATS.get_ptr_mut(index) {
        // SAFETY: per-CPU slot, no concurrent writer on this CPU.
        unsafe { *slot += n };
    }
}

#[inline(always)]
fn blank(kind: RecordKind, rec: &mut SignalRecord) {
    let pid_tgid = bpf_get_current_pid_tgid();
    rec.abi = ABI_VERSION;
    rec.kind = kind as u16;
    rec.hierarchy = 0;
    // SAFETY: helpers with no preconditions.
    rec.ts_ns = unsafe { bpf_ktime_get_ns() };
    rec.pid = (pid_tgid >> 32) as u32;
    rec.tid = pid_tgid as u32;
    // SAFETY: as above.
    rec.cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    rec.count = 1;
    rec.arg0 = 0;
    rec.arg1 = 0;
    rec.path[0] = 0;
}

/// Reads a `__data_loc char[]` field into `dst` (NUL-terminated, truncated to fit).
#[inline(always)]
fn read_data_loc(ctx: &TracePointContext, loc_offset: usize, dst: &mut [u8; PATH_LEN]) {
    // SAFETY: reading the tracepoint record at a field offset from its format file.
    let loc: u32 = match unsafe { ctx.read_at::<u32>(loc_offset) } {
        Ok(v) => v,
        Err(_) => return,
    };
    let off = (loc & 0xffff) as usize;
    // SAFETY: the data_loc offset points inside the same record.
    let src = unsafe { (ctx.as_ptr() as *const u8).add(off) };
    // SAFETY: bounded by dst's length; the helper NUL-terminates.
    if unsafe { bpf_probe_read_kernel_str_bytes(src, dst) }.is_err() {
        dst[0] = 0;
    }
}

/// Folds bursts: returns how many events the record to send now stands for, or `None` when
/// this event is counted for later (the cgroup sent one within the window).
#[inline(always)]
fn admit_burst(kind: RecordKind, now: u64) -> Option<u32> {
    // SAFETY: a helper with no preconditions.
    let cg = unsafe { bpf_get_current_cgroup_id() };
    let key = if cg > 1 {
        BurstKey {
            id: cg,
            kind: kind as u16,
            by_tgid: 0,
            _pad: 0,
        }
    } else {
        // No v2 cgroup (cgroup v1 only task): fold per process instead.
        let tgid = bpf_get_current_pid_tgid() >> 32;
        BurstKey {
            id: tgid,
            kind: kind as u16,
            by_tgid: 1,
            _pad: 0,
        }
    };
    // SAFETY: a global the loader may set before load; read once.
    let window = unsafe { core::ptr::read_volatile(&BURST_WINDOW_NS) };
    match BURSTS.get_ptr_mut(key) {
        Some(b) => {
            // SAFETY: the map value lives while this program runs.
            let b = unsafe { &mut *b };
            if now.wrapping_sub(b.last_ns) < window {
                b.suppressed = b.suppressed.saturating_add(1);
                count(stat::SUPPRESSED, 1);
                None
            } else {
                let n = b.suppressed.saturating_add(1);
                b.last_ns = now;
                b.suppressed = 0;
                Some(n)
            }
        }
        None => {
            let fresh = Burst {
                last_ns: now,
                suppressed: 0,
                _pad: 0,
            };
            let _ = BURSTS.insert(key, fresh, 0);
            Some(1)
        }
    }
}

#[inline(always)]
fn emit(fill: impl FnOnce(&mut SignalRecord)) -> u32 {
    match SIGNALS.reserve::<SignalRecord>(0) {
        Some(mut entry) => {
            // SAFETY: the reservation is sized for a SignalRecord; every field is written
            // by `blank` and `fill` before submit (path is NUL-terminated at 0 by `blank`).
            let rec = unsafe { &mut *entry.as_mut_ptr() };
            fill(rec);
            entry.submit(0);
            count(stat::EMITTED, 1);
        }
        None => count(stat::RING_FULL, 1),
    }
    0
}

fn cgroup_event(ctx: &TracePointContext, kind: RecordKind) -> Result<u32, u32> {
    count(stat::SEEN, 1);
    // SAFETY: field offsets from the tracepoint format.
    let root: i32 = unsafe { ctx.read_at(CGROUP_ROOT) }.map_err(|_| 1u32)?;
    let level: i32 = unsafe { ctx.read_at(CGROUP_LEVEL) }.map_err(|_| 1u32)?;
    let id: u64 = unsafe { ctx.read_at(CGROUP_ID) }.map_err(|_| 1u32)?;
    Ok(emit(|rec| {
        blank(kind, rec);
        rec.hierarchy = root as u32;
        rec.arg0 = level as u32;
        rec.cgroup_id = id;
        read_data_loc(ctx, CGROUP_PATH_LOC, &mut rec.path);
    }))
}

fn reclaim_event(ctx: &TracePointContext, kind: RecordKind) -> Result<u32, u32> {
    count(stat::SEEN, 1);
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(n) = admit_burst(kind, now) else {
        return Ok(0);
    };
    // SAFETY: field offsets from the tracepoint format.
    let order: i32 = unsafe { ctx.read_at(RECLAIM_ORDER) }.map_err(|_| 1u32)?;
    let gfp: u64 = unsafe { ctx.read_at(RECLAIM_GFP) }.map_err(|_| 1u32)?;
    Ok(emit(|rec| {
        blank(kind, rec);
        rec.ts_ns = now;
        rec.count = n;
        rec.arg0 = order as u32;
        rec.arg1 = gfp;
    }))
}

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    match cgroup_event(&ctx, RecordKind::CgroupMkdir) {
        Ok(r) | Err(r) => r,
    }
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    match cgroup_event(&ctx, RecordKind::CgroupRmdir) {
        Ok(r) | Err(r) => r,
    }
}

#[tracepoint]
pub fn memcg_reclaim(ctx: TracePointContext) -> u32 {
    match reclaim_event(&ctx, RecordKind::MemcgReclaim) {
        Ok(r) | Err(r) => r,
    }
}

#[tracepoint]
pub fn direct_reclaim(ctx: TracePointContext) -> u32 {
    match reclaim_event(&ctx, RecordKind::DirectReclaim) {
        Ok(r) | Err(r) => r,
    }
}

fn try_oom_victim(ctx: &TracePointContext) -> Result<u32, u32> {
    count(stat::SEEN, 1);
    // SAFETY: field offsets from the tracepoint format (pid is at 8 on every kernel; the
    // other fields exist since 6.7 and read as garbage-free zeroes where the record ends).
    let victim: i32 = unsafe { ctx.read_at(OOM_PID) }.map_err(|_| 1u32)?;
    let adj: i16 = unsafe { ctx.read_at(OOM_SCORE_ADJ) }.unwrap_or(0);
    let anon: u64 = unsafe { ctx.read_at(OOM_ANON_RSS) }.unwrap_or(0);
    Ok(emit(|rec| {
        blank(RecordKind::OomVictim, rec);
        rec.pid = victim as u32;
        rec.arg0 = adj as i32 as u32;
        rec.arg1 = anon;
        read_data_loc(ctx, OOM_COMM_LOC, &mut rec.path);
    }))
}

#[tracepoint]
pub fn oom_victim(ctx: TracePointContext) -> u32 {
    match try_oom_victim(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_fork(_ctx: &TracePointContext) -> Result<u32, u32> {
    count(stat::SEEN, 1);
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(n) = admit_burst(RecordKind::Fork, now) else {
        return Ok(0);
    };
    Ok(emit(|rec| {
        blank(RecordKind::Fork, rec);
        rec.ts_ns = now;
        rec.count = n;
    }))
}

#[tracepoint]
pub fn process_fork(ctx: TracePointContext) -> u32 {
    match try_fork(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

fn try_probe(_ctx: &TracePointContext) -> Result<u32, u32> {
    // SAFETY: a global the loader may set before load.
    let want = unsafe { core::ptr::read_volatile(&PROBE_TGID) };
    if want == 0 || (bpf_get_current_pid_tgid() >> 32) as u32 != want {
        return Ok(0);
    }
    count(stat::SEEN, 1);
    Ok(emit(|rec| blank(RecordKind::Probe, rec)))
}

/// Pipeline probe for benchmarks: every getppid() of one chosen process becomes a record,
/// with no folding, so the sustained record rate can be measured end to end.
#[tracepoint]
pub fn pipeline_probe(ctx: TracePointContext) -> u32 {
    match try_probe(&ctx) {
        Ok(r) | Err(r) => r,
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
