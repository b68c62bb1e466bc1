//! The enforcer's kernel programs.
//!
//! Capture and filter only: attribute each event to a cgroup, fold bursts per cgroup in a map,
//! and emit one compact [`SignalRecord`] per burst through the `SIGNALS` ring buffer. No policy
//! here. Every program is a thin `prog(ctx) -> u32` over one helper.
//!
//! Tracepoint fields are read at the offsets the running kernel's `format` files give
//! ([`TP_FIELDS`], set by the loader), never at offsets fixed at build time: a field this kernel
//! lacks is not read, and the record says so in its `flags`.
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
use aya_log_ebpf::debug;
use enforcer_common::{
    ABI_VERSION, BURST_ENTRIES, Burst, BurstKey, CgroupFields, DEFAULT_BURST_WINDOW_NS, FieldLoc,
    MAX_FIELD_END, PATH_LEN, RING_BYTES, ReclaimFields, RecordKind, SignalRecord, TracepointFields,
    absent, stat,
};

mod crossing;

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

/// Set by the loader from the running kernel's tracepoint `format` files: where each field
/// read below sits. A field the kernel lacks is [`FieldLoc::ABSENT`] and is never read. The
/// global lives in the frozen `.rodata` map, so the verifier knows these values as constants
/// and prunes the branches of absent fields.
#[unsafe(no_mangle)]
static TP_FIELDS: TracepointFields = TracepointFields::ABSENT;

/// One field location from [`TP_FIELDS`], read as the loader set it (not the build's default).
#[inline(always)]
fn loc(field: &FieldLoc) -> FieldLoc {
    // SAFETY: a reference to part of an immutable global; volatile so the compiler does not
    // fold in the build-time default.
    unsafe { core::ptr::read_volatile(field) }
}

/// The field's offset when it is present, exactly `want` bytes long (a read never goes past
/// the field) and inside the bound the verifier needs for context-pointer arithmetic.
#[inline(always)]
fn offset_if(l: FieldLoc, want: u32) -> Option<usize> {
    if l.size == want && l.offset < MAX_FIELD_END && l.size <= MAX_FIELD_END - l.offset {
        Some(l.offset as usize)
    } else {
        None
    }
}

/// Reads a 4-byte signed field (`int`, `pid_t`).
#[inline(always)]
fn read_i32(ctx: &TracePointContext, l: FieldLoc) -> Option<i32> {
    let off = offset_if(l, 4)?;
    // SAFETY: a 4-byte field inside the record, at the offset its format file gives.
    unsafe { ctx.read_at::<i32>(off) }.ok()
}

/// Reads a 2-byte signed field (`short`).
#[inline(always)]
fn read_i16(ctx: &TracePointContext, l: FieldLoc) -> Option<i16> {
    let off = offset_if(l, 2)?;
    // SAFETY: a 2-byte field inside the record, at the offset its format file gives.
    unsafe { ctx.read_at::<i16>(off) }.ok()
}

/// Reads an unsigned field of 8 bytes (`u64`, `unsigned long`) or 4 (older kernels' `int` ids
/// and `gfp_t`), widened to u64.
#[inline(always)]
fn read_unsigned(ctx: &TracePointContext, l: FieldLoc) -> Option<u64> {
    if let Some(off) = offset_if(l, 8) {
        // SAFETY: an 8-byte field inside the record, at the offset its format file gives.
        return unsafe { ctx.read_at::<u64>(off) }.ok();
    }
    let off = offset_if(l, 4)?;
    // SAFETY: a 4-byte field inside the record, at the offset its format file gives.
    unsafe { ctx.read_at::<u32>(off) }.ok().map(u64::from)
}

/// Adds `n` to a kernel counter; returns this CPU's count after it (0 when the slot is
/// missing).
#[inline(always)]
fn count(index: u32, n: u64) -> u64 {
    match STATS.get_ptr_mut(index) {
        Some(slot) => {
            // SAFETY: per-CPU slot, no concurrent writer on this CPU.
            unsafe {
                *slot += n;
                *slot
            }
        }
        None => 0,
    }
}

/// Whether the `n`th occurrence of a rare diagnostic on this CPU is logged (aya-log, debug
/// level): the 1st, 2nd, 4th, 8th...; the counter has every one.
#[inline(always)]
fn worth_logging(n: u64) -> bool {
    n.is_power_of_two()
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
    rec.flags = 0;
    rec.path[0] = 0;
}

/// Reads a `__data_loc char[]` field (a 4-byte locator: offset in the low half) into `dst`
/// (NUL-terminated, truncated to fit). Returns false, leaving `dst` empty, when the field is
/// absent or unreadable.
#[inline(always)]
fn read_data_loc(ctx: &TracePointContext, l: FieldLoc, dst: &mut [u8; PATH_LEN]) -> bool {
    let Some(loc_offset) = offset_if(l, 4) else {
        return false;
    };
    // SAFETY: reading the tracepoint record at a field offset from its format file.
    let loc: u32 = match unsafe { ctx.read_at::<u32>(loc_offset) } {
        Ok(v) => v,
        Err(_) => return false,
    };
    let off = (loc & 0xffff) as usize;
    // SAFETY: the data_loc offset points inside the same record.
    let src = unsafe { (ctx.as_ptr() as *const u8).add(off) };
    // SAFETY: bounded by dst's length; the helper NUL-terminates.
    if unsafe { bpf_probe_read_kernel_str_bytes(src, dst) }.is_err() {
        dst[0] = 0;
        return false;
    }
    true
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
        None => {
            let lost = count(stat::RING_FULL, 1);
            if worth_logging(lost) {
                debug!(
                    &(),
                    "SIGNALS ring buffer full: a record lost ({} on this CPU)", lost
                );
            }
        }
    }
    0
}

fn cgroup_event(ctx: &TracePointContext, kind: RecordKind, f: &CgroupFields) -> u32 {
    count(stat::SEEN, 1);
    let root = read_i32(ctx, loc(&f.root));
    let level = read_i32(ctx, loc(&f.level));
    let id = read_unsigned(ctx, loc(&f.id));
    let path = loc(&f.path);
    emit(|rec| {
        blank(kind, rec);
        match root {
            Some(v) => rec.hierarchy = v as u32,
            None => rec.flags |= absent::HIERARCHY,
        }
        match level {
            Some(v) => rec.arg0 = v as u32,
            None => rec.flags |= absent::ARG0,
        }
        match id {
            Some(v) => rec.cgroup_id = v,
            None => {
                rec.cgroup_id = 0;
                rec.flags |= absent::CGROUP_ID;
            }
        }
        if !read_data_loc(ctx, path, &mut rec.path) {
            rec.flags |= absent::PATH;
        }
    })
}

fn reclaim_event(ctx: &TracePointContext, kind: RecordKind, f: &ReclaimFields) -> u32 {
    count(stat::SEEN, 1);
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(n) = admit_burst(kind, now) else {
        return 0;
    };
    let order = read_i32(ctx, loc(&f.order));
    let gfp = read_unsigned(ctx, loc(&f.gfp_flags));
    emit(|rec| {
        blank(kind, rec);
        rec.ts_ns = now;
        rec.count = n;
        match order {
            Some(v) => rec.arg0 = v as u32,
            None => rec.flags |= absent::ARG0,
        }
        match gfp {
            Some(v) => rec.arg1 = v,
            None => rec.flags |= absent::ARG1,
        }
    })
}

#[tracepoint]
pub fn cgroup_mkdir(ctx: TracePointContext) -> u32 {
    cgroup_event(&ctx, RecordKind::CgroupMkdir, &TP_FIELDS.cgroup_mkdir)
}

#[tracepoint]
pub fn cgroup_rmdir(ctx: TracePointContext) -> u32 {
    cgroup_event(&ctx, RecordKind::CgroupRmdir, &TP_FIELDS.cgroup_rmdir)
}

#[tracepoint]
pub fn memcg_reclaim(ctx: TracePointContext) -> u32 {
    reclaim_event(&ctx, RecordKind::MemcgReclaim, &TP_FIELDS.memcg_reclaim)
}

#[tracepoint]
pub fn direct_reclaim(ctx: TracePointContext) -> u32 {
    reclaim_event(&ctx, RecordKind::DirectReclaim, &TP_FIELDS.direct_reclaim)
}

fn oom_event(ctx: &TracePointContext) -> u32 {
    count(stat::SEEN, 1);
    let f = &TP_FIELDS.oom_victim;
    // Only `pid` exists on every kernel (upstream 6.1 has nothing else; Debian backported the rest); the rest is read only
    // where this kernel's format has it, else flagged absent.
    let victim = read_i32(ctx, loc(&f.pid));
    let adj = read_i16(ctx, loc(&f.oom_score_adj));
    let anon = read_unsigned(ctx, loc(&f.anon_rss));
    let comm = loc(&f.comm);
    emit(|rec| {
        blank(RecordKind::OomVictim, rec);
        match victim {
            Some(v) => rec.pid = v as u32,
            None => {
                rec.pid = 0;
                rec.flags |= absent::PID;
            }
        }
        match adj {
            Some(v) => rec.arg0 = v as i32 as u32,
            None => rec.flags |= absent::ARG0,
        }
        match anon {
            Some(v) => rec.arg1 = v,
            None => rec.flags |= absent::ARG1,
        }
        if !read_data_loc(ctx, comm, &mut rec.path) {
            rec.flags |= absent::PATH;
        }
    })
}

#[tracepoint]
pub fn oom_victim(ctx: TracePointContext) -> u32 {
    oom_event(&ctx)
}

fn fork_event() -> u32 {
    count(stat::SEEN, 1);
    // SAFETY: a helper with no preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    let Some(n) = admit_burst(RecordKind::Fork, now) else {
        return 0;
    };
    emit(|rec| {
        blank(RecordKind::Fork, rec);
        rec.ts_ns = now;
        rec.count = n;
    })
}

/// Reads no tracepoint field: the event itself is the signal.
#[tracepoint]
pub fn process_fork(_ctx: TracePointContext) -> u32 {
    fork_event()
}

fn probe_event() -> u32 {
    // SAFETY: a global the loader may set before load.
    let want = unsafe { core::ptr::read_volatile(&PROBE_TGID) };
    if want == 0 || (bpf_get_current_pid_tgid() >> 32) as u32 != want {
        return 0;
    }
    count(stat::SEEN, 1);
    emit(|rec| blank(RecordKind::Probe, rec))
}

/// Pipeline probe for benchmarks: every getppid() of one chosen process becomes a record,
/// with no folding, so the sustained record rate can be measured end to end.
#[tracepoint]
pub fn pipeline_probe(_ctx: TracePointContext) -> u32 {
    probe_event()
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
