//! The crossing's read of every pod's memory, in one call: a cgroup iterator (`iter/cgroup`)
//! the daemon runs over the kubepods memory cgroup's descendants, writing one
//! [`MemcgUsage`] (directory inode, page counter) per cgroup into the iterator's read
//! buffer. No map, no policy: what `memory.usage_in_bytes` / `memory.current` of each cgroup
//! would print, without opening or reading a file per pod. Cgroups deeper than the loader's
//! `max_level` (the pods' containers) are passed over after reading their level.
//!
//! The fields are read at the offsets the running kernel's BTF gives ([`MEMCG_OFFSETS`], set
//! by the loader), through `bpf_probe_read_kernel`: a read that faults writes nothing.
#![no_std]
#![no_main]

use core::ffi::c_void;

use aya_ebpf::{
    bindings::seq_file,
    helpers::{bpf_probe_read_kernel, generated::bpf_seq_write},
};
use enforcer_common::{MemcgOffsets, MemcgUsage};

/// Set by the loader from the running kernel's BTF.
#[unsafe(no_mangle)]
static MEMCG_OFFSETS: MemcgOffsets = MemcgOffsets {
    cgroup_memory_css: 0,
    cgroup_kn: 0,
    kn_id: 0,
    memcg_usage: 0,
    cgroup_level: 0,
    max_level: 0,
};

/// `struct bpf_iter__cgroup`: the iterator's context.
#[repr(C)]
struct IterCgroup {
    /// `struct bpf_iter_meta *`: its first member is the `seq_file` written to.
    meta: *const *mut seq_file,
    /// `struct cgroup *`, null at the end of the walk.
    cgroup: *const u8,
}

/// One cgroup of the walk: its inode and memory page counter, when it has a memory cgroup.
#[inline(always)]
fn visit(ctx: *const IterCgroup) -> Option<()> {
    // SAFETY: the loader set the global before load; volatile so the build-time value is not
    // folded in.
    let off = unsafe { core::ptr::read_volatile(&MEMCG_OFFSETS) };
    // SAFETY: the iterator's context, as the kernel passes it (two pointers).
    let (meta, cgroup) = unsafe { ((*ctx).meta, (*ctx).cgroup) };
    if cgroup.is_null() || meta.is_null() {
        return None;
    }
    // SAFETY: kernel reads through the probe helper (a fault is an error, not a crash).
    let level: i32 = unsafe {
        bpf_probe_read_kernel(cgroup.wrapping_add(off.cgroup_level as usize).cast()).ok()?
    };
    if level < 0 || level as u32 > off.max_level {
        return None;
    }
    // SAFETY: as above.
    let css: *const u8 = unsafe {
        bpf_probe_read_kernel(cgroup.wrapping_add(off.cgroup_memory_css as usize).cast()).ok()?
    };
    if css.is_null() {
        return None;
    }
    // SAFETY: as above.
    let pages: u64 =
        unsafe { bpf_probe_read_kernel(css.wrapping_add(off.memcg_usage as usize).cast()).ok()? };
    // SAFETY: as above.
    let kn: *const u8 =
        unsafe { bpf_probe_read_kernel(cgroup.wrapping_add(off.cgroup_kn as usize).cast()).ok()? };
    // SAFETY: as above.
    let ino: u64 =
        unsafe { bpf_probe_read_kernel(kn.wrapping_add(off.kn_id as usize).cast()).ok()? };
    let rec = MemcgUsage { ino, pages };
    // SAFETY: the meta's first member is the seq_file; the record is on the stack.
    unsafe {
        let seq = *meta;
        bpf_seq_write(
            seq,
            (&raw const rec).cast::<c_void>(),
            core::mem::size_of::<MemcgUsage>() as u32,
        );
    }
    Some(())
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/cgroup")]
pub fn memcg_usage(ctx: *mut c_void) -> i32 {
    let _ = visit(ctx.cast_const().cast());
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
