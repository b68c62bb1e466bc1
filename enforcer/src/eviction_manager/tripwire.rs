//! The v2 `memory.high` tripwire on kubepods (`policy::eviction::tripwire`): placed after
//! every step so the next crossing is a kernel event.

use std::path::PathBuf;

use super::{EvictionManager, Memo};
use crate::{
    policy::eviction::tripwire::{self, Tripwire},
    stats::NodeSnapshot,
};

/// The kubepods cgroup of the v2 tripwire: its directory and the hierarchy's mount.
#[derive(Clone, Debug)]
pub struct TripwireCgroup {
    pub dir: PathBuf,
    pub mount: PathBuf,
}

/// The tripwire is never placed closer than this above kubepods' usage: two charge batches
/// of the kernel's per-CPU stock (64 pages each), the noise of `memory.current`. Every MiB
/// above the threshold is growth the tripwire lets through before it fires, so it is small.
const TRIPWIRE_FLOOR: i64 = 512 << 10;
/// Moves of an armed tripwire smaller than this are not written. Smaller than the floor: a
/// tripwire the usage went past is always moved above it (one left below the usage would
/// throttle kubepods until the next step).
const TRIPWIRE_SLACK: i64 = 256 << 10;
const _: () = assert!(TRIPWIRE_SLACK < TRIPWIRE_FLOOR);

impl EvictionManager {
    /// Places the v2 tripwire for the next crossing (`policy::eviction::tripwire`): off while
    /// a memory threshold is met or an evicted pod is being cleaned up.
    pub(super) fn place_tripwire(&self, snapshot: &NodeSnapshot, waiting: bool, memo: &mut Memo) {
        if self.tripwire.is_none() {
            return;
        }
        let next = match snapshot.kubepods_usage {
            Some(usage) if !waiting => tripwire::place(
                &self.config.eviction,
                &snapshot.observations,
                usage,
                TRIPWIRE_FLOOR,
            ),
            _ => Tripwire::Off,
        };
        self.write_tripwire(next, memo);
    }

    pub(super) fn write_tripwire(&self, next: Tripwire, memo: &mut Memo) {
        let Some(t) = &self.tripwire else {
            return;
        };
        // Another writer may have put it back to `max`: systemd re-applies a slice's memory
        // attributes when its children change (the systemd driver's kubepods slice). An armed
        // tripwire the file no longer shows is forgotten, so it is written again.
        if matches!(memo.tripwire, Some(Tripwire::At(_)))
            && std::fs::read_to_string(t.dir.join("memory.high")).is_ok_and(|v| v.trim() == "max")
        {
            tracing::info!(cgroup = %t.dir.display(), "memory.high tripwire found reset by another writer: placing it again");
            memo.tripwire = None;
        }
        if !tripwire::worth_writing(memo.tripwire, next, TRIPWIRE_SLACK) {
            return;
        }
        let high = match next {
            Tripwire::At(v) => Some(v),
            Tripwire::Off => None,
        };
        match self.cgroups.set_memory_high(&t.dir, &t.mount, high) {
            Ok(()) => {
                let armed_changed = memo
                    .tripwire
                    .is_none_or(|was| (was == Tripwire::Off) != (next == Tripwire::Off));
                if armed_changed {
                    tracing::info!(tripwire = ?next, cgroup = %t.dir.display(), "memory.high tripwire");
                } else {
                    tracing::debug!(tripwire = ?next, "memory.high tripwire moved");
                }
                memo.tripwire = Some(next);
            }
            Err(e) => tracing::warn!(error = %e, "placing the memory.high tripwire"),
        }
    }
}
