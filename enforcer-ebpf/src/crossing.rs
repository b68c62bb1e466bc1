//! The crossing check on the memory charge path: after (or, for the kprobe, just before) a
//! charge, the watched cgroup's page counter is compared with the level the daemon armed in
//! [`CROSSING`]; at the charge that reaches it, one record, and the level is disarmed until the
//! daemon arms it again after its step. Nothing is written to any cgroup file.
//!
//! Cost on a normal charge: one array lookup and, while armed, one kernel read (the watched
//! cgroup's `struct mem_cgroup` is found once, at the first charge below it, by climbing the
//! charging cgroup's `ancestors[]`, and kept in the map). Disarmed: the lookup only.
//!
//! Fields are read at the offsets the running kernel's BTF gives ([`CROSSING_OFFSETS`], set by
//! the loader), through `bpf_probe_read_kernel`: a read that faults is counted, never a crash.

use aya_ebpf::{
    helpers::{bpf_get_current_comm, bpf_probe_read_kernel},
    macros::{fexit, kprobe, map, raw_tracepoint},
    maps::Array,
    programs::{FExitContext, ProbeContext, RawTracePointContext},
};
use aya_log_ebpf::debug;
use enforcer_common::{CrossingLevel, CrossingOffsets, RecordKind, absent, crossing_attach, stat};

use crate::{blank, count, emit, worth_logging};

#[map]
static CROSSING: Array<CrossingLevel> = Array::with_max_entries(1, 0);

/// Set by the loader from the running kernel's BTF (zero, `enabled == 0`, when it could not).
#[unsafe(no_mangle)]
static CROSSING_OFFSETS: CrossingOffsets = CrossingOffsets {
    css_cgroup: 0,
    cgroup_level: 0,
    cgroup_ancestors: 0,
    cgroup_kn: 0,
    kn_id: 0,
    cgroup_memory_css: 0,
    memcg_usage: 0,
    enabled: 0,
};

/// Reads a `T` at `base + off` in kernel memory; a fault is counted.
#[inline(always)]
fn read<T>(base: *const u8, off: u32) -> Option<T> {
    // SAFETY: the probe helper reads kernel memory and returns an error on a fault.
    match unsafe { bpf_probe_read_kernel(base.wrapping_add(off as usize).cast::<T>()) } {
        Ok(v) => Some(v),
        Err(_) => {
            let n = count(stat::CROSSING_READ_FAULTS, 1);
            if worth_logging(n) {
                debug!(
                    &(),
                    "crossing check: a kernel read at offset {} faulted ({} on this CPU)", off, n
                );
            }
            None
        }
    }
}

/// The watched cgroup's `struct mem_cgroup *`, when `memcg` is it or below it.
#[inline(always)]
fn watched_of(memcg: *const u8, ino: u64, off: &CrossingOffsets) -> Option<u64> {
    let cgroup: *const u8 = read(memcg, off.css_cgroup)?;
    let level: i32 = read(cgroup, off.cgroup_level)?;
    // The watched cgroup's level is not known here: try each ancestor from the charging
    // cgroup up (kubepods sits a few levels down; the bound keeps the verifier's walk short).
    let mut i: i32 = 0;
    while i < 8 {
        let at = level - i;
        if at < 0 {
            return None;
        }
        let anc: *const u8 = read(
            cgroup,
            off.cgroup_ancestors
                .wrapping_add((at as u32).wrapping_mul(8)),
        )?;
        let kn: *const u8 = read(anc, off.cgroup_kn)?;
        let id: u64 = read(kn, off.kn_id)?;
        if id == ino {
            let css: *const u8 = read(anc, off.cgroup_memory_css)?;
            return (!css.is_null()).then_some(css as u64);
        }
        i += 1;
    }
    None
}

/// Compares the watched cgroup's page counter (plus `extra` pages about to be charged) with
/// the armed level; at the crossing, one record and the level disarmed.
#[inline(always)]
fn check(memcg: *const u8, extra: u64, attach: u32) -> u32 {
    // SAFETY: the loader set the global before load; volatile so the build's value is not
    // folded in.
    let off = unsafe { core::ptr::read_volatile(&CROSSING_OFFSETS) };
    if off.enabled == 0 || memcg.is_null() {
        return 0;
    }
    let Some(level) = CROSSING.get_ptr_mut(0) else {
        debug!(&(), "crossing check: the level map CROSSING has no entry");
        return 0;
    };
    // SAFETY: the map value lives while the program runs; the daemon rewrites it whole.
    let level = unsafe { &mut *level };
    // SAFETY: as above; volatile: another CPU may disarm it.
    if unsafe { core::ptr::read_volatile(&level.armed) } == 0 {
        return 0;
    }
    count(stat::CROSSING_CHECKS, 1);
    let mut watched = level.memcg;
    if watched == 0 {
        let Some(found) = watched_of(memcg, level.ino, &off) else {
            return 0;
        };
        level.memcg = found;
        watched = found;
    }
    let Some(pages) = read::<u64>(watched as *const u8, off.memcg_usage) else {
        return 0;
    };
    let at = pages.saturating_add(extra);
    if at < level.pages {
        return 0;
    }
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(&mut level.armed, 0) };
    let (ino, seq, want) = (level.ino, level.seq, level.pages);
    emit(|rec| {
        blank(RecordKind::MemcgCrossing, rec);
        rec.cgroup_id = ino;
        rec.hierarchy = seq;
        rec.arg0 = want as u32;
        rec.arg1 = at;
        rec.count = attach;
        match bpf_get_current_comm() {
            Ok(comm) => {
                rec.path[..comm.len()].copy_from_slice(&comm);
                rec.path[comm.len() - 1] = 0;
            }
            Err(_) => rec.flags |= absent::PATH,
        }
    })
}

/// After `try_charge_memcg(memcg, gfp_mask, nr_pages)` returned 0 (charged).
#[fexit(function = "try_charge_memcg")]
pub fn crossing_fexit(ctx: FExitContext) -> u32 {
    let ret: i32 = ctx.arg(3);
    if ret != 0 {
        return 0;
    }
    check(ctx.arg(0), 0, crossing_attach::FEXIT)
}

/// Before `try_charge_memcg(memcg, gfp_mask, nr_pages)`: the pages about to be charged count.
#[kprobe]
pub fn crossing_kprobe(ctx: ProbeContext) -> u32 {
    let (Some(memcg), Some(nr)) = (ctx.arg::<*const u8>(0), ctx.arg::<u32>(2)) else {
        return 0;
    };
    check(memcg, u64::from(nr), crossing_attach::KPROBE)
}

/// A memcg statistics update `(memcg, item, val)`: an increase follows a charge.
#[inline(always)]
fn stat_update(ctx: &RawTracePointContext) -> u32 {
    let val: i64 = ctx.arg(2);
    if val as i32 <= 0 {
        return 0;
    }
    check(ctx.arg(0), 0, crossing_attach::TRACEPOINT)
}

/// `memcg:mod_memcg_lruvec_state`: a charged page's statistics, right after its charge (anon,
/// file, shmem pages).
#[raw_tracepoint(tracepoint = "mod_memcg_lruvec_state")]
pub fn crossing_lruvec(ctx: RawTracePointContext) -> u32 {
    stat_update(&ctx)
}

/// `memcg:mod_memcg_state`: kernel memory's statistics (kmem, sockets).
#[raw_tracepoint(tracepoint = "mod_memcg_state")]
pub fn crossing_state(ctx: RawTracePointContext) -> u32 {
    stat_update(&ctx)
}
