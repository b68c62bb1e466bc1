//! The crossing tripwire on kubepods (`policy::eviction::tripwire`): placed after every step
//! so the next crossing is a kernel event. Where the eBPF crossing check attached it is the
//! check's level (`kernel::crossing`: compared at the charge that crosses it, nothing
//! written to any cgroup file). Else, on cgroup v2, kubepods' `memory.high` (the kernel
//! reclaims past it, which eBPF and `memory.events` report); on v1 a usage threshold eventfd
//! at the same place, which the crossing thread's own reactor waits on (no reader thread
//! between the kernel and the step).

use std::path::PathBuf;

use tokio::io::unix::AsyncFd;

use super::EvictionManager;
use crate::{
    kernel::crossing::CrossingLevels,
    kernel::threshold::UsageThreshold,
    policy::eviction::tripwire::{self, Tripwire},
    signal::{Signal, SignalKind, SourceKind},
    stats::NodeSnapshot,
};

/// The tripwire as the manager laid it: what was last written, and on v1 the usage threshold
/// registered (or being registered) in the crossing thread's reactor.
#[derive(Debug, Default)]
pub(super) struct Wire {
    /// As last written (v2 `memory.high`, v1 usage threshold).
    placed: Option<Tripwire>,
    /// The v1 usage threshold, registered.
    pub(super) fd: Option<std::sync::Arc<AsyncFd<UsageThreshold>>>,
    /// The usage was already past the v1 threshold when it was registered (which the kernel
    /// does not signal): the loop steps at once.
    pub(super) missed: bool,
    /// The v1 threshold's next registration, under way on a thread of its own.
    pub(super) pending: Option<tokio::sync::oneshot::Receiver<std::io::Result<UsageThreshold>>>,
}

/// How the tripwire is laid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TripwireHow {
    /// The eBPF crossing check's level ([`TripwireCgroup::levels`]): no cgroup file written.
    EbpfLevel,
    /// cgroup v2: `memory.high` of kubepods.
    MemoryHigh,
    /// cgroup v1: a usage threshold on kubepods' `memory.usage_in_bytes`, through an eventfd.
    UsageEventfd,
}

/// The kubepods cgroup of the tripwire: its directory and the hierarchy's mount.
#[derive(Clone, Debug)]
pub struct TripwireCgroup {
    pub dir: PathBuf,
    pub mount: PathBuf,
    pub how: TripwireHow,
    /// With [`TripwireHow::EbpfLevel`]: the check's level.
    pub levels: Option<CrossingLevels>,
}

impl TripwireCgroup {
    /// The tripwire on kubepods (`dir`, in the memory hierarchy mounted at `mount`): the eBPF
    /// crossing check's level when it attached (`levels`), else the cgroup file `file_how`
    /// says.
    #[must_use]
    pub fn new(
        dir: PathBuf,
        mount: PathBuf,
        file_how: TripwireHow,
        levels: Option<CrossingLevels>,
    ) -> Self {
        let how = if levels.is_some() {
            TripwireHow::EbpfLevel
        } else {
            file_how
        };
        Self {
            dir,
            mount,
            how,
            levels,
        }
    }
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
    pub(super) fn place_tripwire(&self, snapshot: &NodeSnapshot, waiting: bool, wire: &mut Wire) {
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
        self.write_tripwire(next, wire);
    }

    pub(super) fn write_tripwire(&self, next: Tripwire, wire: &mut Wire) {
        let Some(t) = &self.tripwire else {
            return;
        };
        if t.how == TripwireHow::UsageEventfd {
            self.register_wire(t, next, wire);
            return;
        }
        if let Some(levels) = &t.levels {
            arm_level(levels, &t.dir, next, wire);
            return;
        }
        // Another writer may have put it back to `max`: systemd re-applies a slice's memory
        // attributes when its children change (the systemd driver's kubepods slice). An armed
        // tripwire the file no longer shows is forgotten, so it is written again.
        if matches!(wire.placed, Some(Tripwire::At(_)))
            && std::fs::read_to_string(t.dir.join("memory.high")).is_ok_and(|v| v.trim() == "max")
        {
            tracing::info!(cgroup = %t.dir.display(), "memory.high tripwire found reset by another writer: placing it again");
            wire.placed = None;
        }
        if !tripwire::worth_writing(wire.placed, next, TRIPWIRE_SLACK) {
            return;
        }
        let high = match next {
            Tripwire::At(v) => Some(v),
            Tripwire::Off => None,
        };
        match self.cgroups.set_memory_high(&t.dir, &t.mount, high) {
            Ok(()) => {
                let armed_changed = wire
                    .placed
                    .is_none_or(|was| (was == Tripwire::Off) != (next == Tripwire::Off));
                if armed_changed {
                    tracing::info!(tripwire = ?next, cgroup = %t.dir.display(), "memory.high tripwire");
                } else {
                    tracing::debug!(tripwire = ?next, "memory.high tripwire moved");
                }
                wire.placed = Some(next);
            }
            Err(e) => tracing::warn!(error = %e, "placing the memory.high tripwire"),
        }
    }
}

/// The eBPF crossing check's level at `next` for the cgroup `dir` (found by its inode at
/// each arming: kubelet may make kubepods after the companion starts), or disarmed when off:
/// armed again after every step (the program disarms it at the crossing it reports; a map
/// write, cheap).
fn arm_level(levels: &CrossingLevels, dir: &std::path::Path, next: Tripwire, wire: &mut Wire) {
    use std::os::unix::fs::MetadataExt as _;
    let armed = match next {
        Tripwire::At(at) => {
            let Ok(bytes) = u64::try_from(at) else {
                return;
            };
            match std::fs::metadata(dir) {
                Ok(m) => levels.arm(m.ino(), bytes),
                Err(e) => {
                    if wire.placed.is_some() {
                        tracing::info!(cgroup = %dir.display(), error = %e, "the crossing check's cgroup is not there: armed once it is");
                    }
                    wire.placed = None;
                    return;
                }
            }
        }
        Tripwire::Off => levels.disarm(),
    };
    if let Err(e) = armed {
        tracing::warn!(error = %e, "arming the crossing check's level");
        return;
    }
    if wire
        .placed
        .is_none_or(|was| (was == Tripwire::Off) != (next == Tripwire::Off))
    {
        tracing::info!(tripwire = ?next, attach = levels.attach.name(), "crossing check level");
    } else {
        tracing::debug!(tripwire = ?next, "crossing check level moved");
    }
    wire.placed = Some(next);
}

impl EvictionManager {
    /// The v1 tripwire: the usage threshold registered again at `next`, or none when off.
    /// The kernel's registration ends by waiting for an RCU grace period, so it is done on a
    /// thread of its own; the last threshold stays armed until the new one is in
    /// ([`Self::install_wire`]), then is closed (which unregisters it in a kernel worker).
    fn register_wire(&self, t: &TripwireCgroup, next: Tripwire, wire: &mut Wire) {
        if !tripwire::worth_writing(wire.placed, next, TRIPWIRE_SLACK) {
            return;
        }
        // A registration still under way: its threshold is closed when it arrives.
        wire.pending = None;
        match next {
            Tripwire::Off => {
                wire.fd = None;
                wire.missed = false;
            }
            Tripwire::At(at) => {
                let Ok(bytes) = u64::try_from(at) else {
                    return;
                };
                let (tx, rx) = tokio::sync::oneshot::channel();
                let dir = t.dir.clone();
                let spawned = std::thread::Builder::new()
                    .name("tripwire".to_owned())
                    .spawn(move || {
                        // Refused (the manager moved on): dropped, so closed and unregistered.
                        let _ = tx.send(UsageThreshold::register(&dir, bytes));
                    });
                if let Err(e) = spawned {
                    tracing::warn!(error = %e, "starting the usage-threshold tripwire's registration");
                    return;
                }
                wire.pending = Some(rx);
            }
        }
        if wire
            .placed
            .is_none_or(|was| (was == Tripwire::Off) != (next == Tripwire::Off))
        {
            tracing::info!(tripwire = ?next, cgroup = %t.dir.display(), "usage-threshold tripwire");
        } else {
            tracing::debug!(tripwire = ?next, "usage-threshold tripwire moved");
        }
        wire.placed = Some(next);
    }

    /// A registered threshold into the crossing thread's reactor, replacing the last one (a
    /// usage already past it steps at once: the kernel signals only the next crossing).
    pub(super) fn install_wire(
        &self,
        registered: std::io::Result<UsageThreshold>,
        wire: &mut Wire,
    ) {
        match registered.and_then(UsageThreshold::into_async) {
            Ok(fd) => {
                let usage = fd.get_ref().usage();
                wire.missed = usage.is_some_and(|u| u >= fd.get_ref().bytes);
                wire.fd = Some(std::sync::Arc::new(fd));
            }
            Err(e) => {
                let dir = self.tripwire.as_ref().map(|t| t.dir.display().to_string());
                tracing::warn!(error = %e, cgroup = ?dir, "registering the usage-threshold tripwire");
                // Placed again at the next step.
                wire.placed = None;
            }
        }
    }

    /// Resolves when the v1 tripwire fires (at once when `missed`: the usage was past it
    /// when registered), with the signal an eventfd reader would have made of it; never
    /// without one.
    pub(super) async fn wire_fired(
        &self,
        wire: Option<&AsyncFd<UsageThreshold>>,
        missed: bool,
    ) -> Signal {
        let (Some(w), Some(t)) = (wire, &self.tripwire) else {
            return std::future::pending().await;
        };
        if !missed {
            loop {
                let Ok(mut ready) = w.readable().await else {
                    return std::future::pending().await;
                };
                match ready.try_io(|fd| fd.get_ref().drain()) {
                    Ok(Ok(n)) if n > 0 => break,
                    Ok(Ok(_)) | Err(_) => {}
                    Ok(Err(e)) => {
                        tracing::warn!(error = %e, "reading the usage-threshold tripwire");
                        return std::future::pending().await;
                    }
                }
            }
        }
        let mut s = Signal::new(SignalKind::MemoryThreshold, SourceKind::Eventfd);
        s.detail.threshold_bytes = Some(w.get_ref().bytes);
        s.detail.usage_bytes = w.get_ref().usage();
        if let Ok(rel) = t.dir.strip_prefix(&t.mount) {
            s.set_cgroup(format!("/{}", rel.display()), "memory".to_owned());
        }
        s
    }
}

/// Resolves with the registration under way (never without one).
pub(super) async fn wire_registered(
    pending: &mut Option<tokio::sync::oneshot::Receiver<std::io::Result<UsageThreshold>>>,
) -> std::io::Result<UsageThreshold> {
    let Some(rx) = pending.as_mut() else {
        return std::future::pending().await;
    };
    let r = rx.await;
    *pending = None;
    r.unwrap_or_else(|_| Err(std::io::Error::other("the registration thread ended")))
}
