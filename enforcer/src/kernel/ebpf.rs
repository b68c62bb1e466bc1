//! Loads and attaches the embedded eBPF programs and pumps their ring buffer into signals.

use std::{
    path::Path,
    sync::{Arc, atomic::Ordering},
    time::Duration,
};

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::TracePoint,
};
use aya_log::EbpfLogger;
use enforcer_common::{
    CrossingOffsets, GLOBAL_BURST_WINDOW_NS, GLOBAL_CROSSING_OFFSETS, GLOBAL_PROBE_TGID,
    GLOBAL_TP_FIELDS, RING_MAP, STATS_MAP, stat,
};
use serde::Serialize;
use tokio::{io::unix::AsyncFd, sync::mpsc};

use super::{
    CrossingMode, KernelError, PipelineOptions,
    crossing::{self, CrossingChoice, CrossingLevels},
    probe::TRACEFS,
    program_log::ProgramLog,
    tracefmt::{self, Layout, TRACING_ROOTS, TracepointStatus},
};
use crate::{
    cgroup::CgroupLayout,
    health::Heartbeat,
    signal::{Attributor, PipelineStats, Signal, decode},
};

/// The reader's tick: kernel counters refreshed and the heartbeat beaten at least this often,
/// also when the ring buffer stays empty.
pub const TICK: Duration = Duration::from_secs(1);

/// The eBPF object built by build.rs (empty when built with AYA_BUILD_SKIP=1).
static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/enforcer"));

/// The loaded programs and the maps the daemon reads.
pub struct Loaded {
    /// Keeps programs and links alive.
    pub ebpf: Ebpf,
    pub ring: RingBuf<MapData>,
    pub stats: PerCpuArray<MapData, u64>,
    /// Per tracepoint: the fields found (offsets, sizes) or absent in this kernel, attached.
    pub tracepoints: Vec<TracepointStatus>,
    /// The crossing check: where it attached (or why not), and its level when it did.
    pub crossing: Crossing,
    /// The programs' rare diagnostics (aya-log's ring), into tracing when flushed.
    pub logs: EbpfLogger<ProgramLog>,
}

/// The crossing check as loaded: `None` when turned off.
#[derive(Clone, Debug, Default)]
pub struct Crossing {
    pub choice: Option<CrossingChoice>,
    pub levels: Option<CrossingLevels>,
}

/// Mounts tracefs at /sys/kernel/tracing when it is missing (aya finds tracepoint ids there).
pub fn ensure_tracefs() -> Result<bool, KernelError> {
    let events = Path::new(TRACEFS).join("events");
    if events.is_dir() {
        return Ok(false);
    }
    rustix::mount::mount(
        "tracefs",
        TRACEFS,
        "tracefs",
        rustix::mount::MountFlags::empty(),
        None,
    )
    .map_err(|e| KernelError::Tracefs {
        path: TRACEFS.into(),
        source: e.into(),
    })?;
    tracing::info!(path = TRACEFS, "tracefs was not mounted: mounted it");
    Ok(true)
}

/// Reads this kernel's tracepoint formats and loads the object with the field table they
/// give (maps created; no program verified or attached yet).
///
/// The table goes in as a read-only global (`EbpfLoader::override_global`, aya 0.14's name for
/// `set_global`): it is patched into `.rodata` before the maps are created, and aya creates
/// that map `BPF_F_RDONLY_PROG` and freezes it, so the verifier sees the offsets as constants
/// (absent fields' branches are pruned, context offsets are known) and no map lookup or
/// fill-before-attach ordering is needed at run time, as an Array map would.
fn open(
    opts: &PipelineOptions,
) -> Result<(Ebpf, Layout, Result<CrossingOffsets, String>), KernelError> {
    if OBJECT.is_empty() {
        return Err(KernelError::NoObject);
    }
    if let Err(e) = ensure_tracefs() {
        // aya and the format reader also look under debugfs.
        if !Path::new(TRACING_ROOTS[1]).join("events").is_dir() {
            return Err(e);
        }
        tracing::warn!(error = %e, "tracefs could not be mounted; using debugfs's tracing directory");
    }
    let layout =
        tracefmt::layout(|tp| tracefmt::read_format(&opts.tracing_roots, tp.category, tp.name));
    let window = u64::try_from(opts.burst_window.as_nanos()).unwrap_or(u64::MAX);
    // The crossing check's offsets from the kernel's BTF; without them it reads nothing.
    let offsets = if opts.crossing == CrossingMode::Off {
        Err("the crossing check is off".to_owned())
    } else {
        crossing::read_offsets(&crossing::btf_path(opts.btf_path.as_deref()))
    };
    let table = offsets.clone().unwrap_or_default();
    let ebpf = EbpfLoader::new()
        .override_global(GLOBAL_BURST_WINDOW_NS, &window, true)
        .override_global(GLOBAL_PROBE_TGID, &opts.probe_tgid, true)
        .override_global(GLOBAL_TP_FIELDS, &layout.table, true)
        .override_global(GLOBAL_CROSSING_OFFSETS, &table, true)
        .load(OBJECT)
        .map_err(|e| KernelError::Load(Box::new(e)))?;
    Ok((ebpf, layout, offsets))
}

/// Loads the object and attaches every program (the first failure is the error).
pub fn load(opts: &PipelineOptions) -> Result<Loaded, KernelError> {
    let (
        mut ebpf,
        Layout {
            mut tracepoints, ..
        },
        offsets,
    ) = open(opts)?;
    for tp in &mut tracepoints {
        attach(&mut ebpf, tp.program, tp.spec.category, tp.spec.name)?;
        tp.attached = true;
        if let Some(e) = &tp.format_error {
            tracing::warn!(tracepoint = %tp.tracepoint, error = %e, "tracepoint format unreadable: its fields are not read");
        }
    }
    if opts.probe_tgid != 0 {
        attach(&mut ebpf, "pipeline_probe", "syscalls", "sys_enter_getppid")?;
    }
    let crossing = attach_crossing(&mut ebpf, opts, &offsets);
    tracing::debug!(programs = %tracefmt::summary(&tracepoints), "eBPF programs attached");
    let ring = ebpf.take_map(RING_MAP).ok_or(KernelError::Map {
        map: "SIGNALS",
        what: "missing from the object".into(),
    })?;
    let ring = RingBuf::try_from(ring).map_err(|e| KernelError::Map {
        map: "SIGNALS",
        what: e.to_string(),
    })?;
    let stats = ebpf.take_map(STATS_MAP).ok_or(KernelError::Map {
        map: "STATS",
        what: "missing from the object".into(),
    })?;
    let stats = PerCpuArray::try_from(stats).map_err(|e| KernelError::Map {
        map: "STATS",
        what: e.to_string(),
    })?;
    let logs =
        EbpfLogger::init_with_logger(&mut ebpf, ProgramLog).map_err(|e| KernelError::Map {
            map: "AYA_LOGS",
            what: e.to_string(),
        })?;
    Ok(Loaded {
        ebpf,
        ring,
        stats,
        tracepoints,
        crossing,
        logs,
    })
}

/// Attaches the crossing check as `opts.crossing` asks, and takes its level map.
fn attach_crossing(
    ebpf: &mut Ebpf,
    opts: &PipelineOptions,
    offsets: &Result<CrossingOffsets, String>,
) -> Crossing {
    let only = match opts.crossing {
        CrossingMode::Off => return Crossing::default(),
        CrossingMode::Auto => crossing::Only::WithinBudget,
        CrossingMode::Any => crossing::Only::Any,
        CrossingMode::Only(a) => crossing::Only::This(a),
    };
    let btf = crossing::btf_path(opts.btf_path.as_deref());
    let choice = crossing::attach(ebpf, offsets, &btf, only);
    let levels = choice
        .chosen
        .and_then(|a| match CrossingLevels::take(ebpf, a) {
            Ok(l) => Some(l),
            Err(e) => {
                tracing::warn!(error = %e, "the crossing check attached but its level cannot be set: the tripwire stays");
                None
            }
        });
    Crossing {
        choice: Some(choice),
        levels,
    }
}

/// What `enforcer probe` reports of the programs: each tracepoint's fields as this kernel has
/// them and whether its program loaded and attached.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ProgramsProbe {
    /// The object loaded (maps created); each program is verified when it attaches.
    pub object_loaded: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// [`tracefmt::summary`] of the tracepoints.
    pub summary: String,
    pub tracepoints: Vec<TracepointStatus>,
    /// The crossing check: where it attached, or why each point was passed over.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crossing: Option<CrossingChoice>,
}

/// Loads the programs and tries to attach each (every one, not stopping at a failure), then
/// detaches them all. Never fails: what did not work is in the report.
#[must_use]
pub fn probe_programs() -> ProgramsProbe {
    let opts = PipelineOptions::default();
    let (object_loaded, error, tracepoints, crossing) = match open(&opts) {
        Ok((
            mut ebpf,
            Layout {
                mut tracepoints, ..
            },
            offsets,
        )) => {
            for tp in &mut tracepoints {
                match attach(&mut ebpf, tp.program, tp.spec.category, tp.spec.name) {
                    Ok(()) => tp.attached = true,
                    Err(e) => tp.attach_error = Some(e.to_string()),
                }
            }
            let crossing = attach_crossing(&mut ebpf, &opts, &offsets).choice;
            (true, None, tracepoints, crossing)
        }
        Err(e) => {
            let mut tracepoints = tracefmt::kernel_layout().tracepoints;
            // Nothing was verified: say so per tracepoint.
            for tp in &mut tracepoints {
                tp.attach_error = Some("the object did not load".to_owned());
            }
            (false, Some(e.to_string()), tracepoints, None)
        }
    };
    ProgramsProbe {
        object_loaded,
        error,
        summary: tracefmt::summary(&tracepoints),
        tracepoints,
        crossing,
    }
}

/// Where the crossing check would attach as `mode` allows (`enforcer doctor`): the object
/// loaded, the check attached, then all detached. The error when the object does not load.
pub fn probe_crossing(mode: CrossingMode) -> Result<CrossingChoice, String> {
    let opts = PipelineOptions {
        crossing: mode,
        ..PipelineOptions::default()
    };
    let (mut ebpf, _, offsets) = open(&opts).map_err(|e| e.to_string())?;
    Ok(attach_crossing(&mut ebpf, &opts, &offsets)
        .choice
        .unwrap_or_default())
}

fn attach(
    ebpf: &mut Ebpf,
    program: &'static str,
    category: &str,
    name: &str,
) -> Result<(), KernelError> {
    let err = |source: aya::programs::ProgramError| KernelError::Program {
        program,
        source: Box::new(source),
    };
    let prog: &mut TracePoint = ebpf
        .program_mut(program)
        .ok_or(KernelError::Map {
            map: "programs",
            what: format!("program {program} missing from the object"),
        })?
        .try_into()
        .map_err(err)?;
    prog.load().map_err(err)?;
    prog.attach(category, name).map_err(err)?;
    Ok(())
}

/// Sums the per-CPU kernel counters into `stats`.
pub fn refresh_stats(map: &PerCpuArray<MapData, u64>, stats: &PipelineStats) {
    let read = |i: u32| map.get(&i, 0).map(|v| v.iter().sum::<u64>()).unwrap_or(0);
    stats
        .kernel_emitted
        .store(read(stat::EMITTED), Ordering::Relaxed);
    stats
        .kernel_ring_full
        .store(read(stat::RING_FULL), Ordering::Relaxed);
    stats
        .kernel_suppressed
        .store(read(stat::SUPPRESSED), Ordering::Relaxed);
    stats.kernel_seen.store(read(stat::SEEN), Ordering::Relaxed);
    stats
        .crossing_checks
        .store(read(stat::CROSSING_CHECKS), Ordering::Relaxed);
    stats
        .crossing_read_faults
        .store(read(stat::CROSSING_READ_FAULTS), Ordering::Relaxed);
}

/// Loads the programs and spawns the task that pumps the ring buffer into `tx`.
pub fn start(
    opts: &PipelineOptions,
    layout: &CgroupLayout,
    tx: mpsc::Sender<Signal>,
    stats: Arc<PipelineStats>,
    beat: Arc<Heartbeat>,
) -> Result<(tokio::task::JoinHandle<()>, Vec<TracepointStatus>, Crossing), KernelError> {
    let Loaded {
        ebpf,
        ring,
        stats: stats_map,
        tracepoints,
        crossing,
        logs,
    } = load(opts)?;
    tracing::info!(programs = %tracefmt::summary(&tracepoints), "eBPF programs loaded with this kernel's tracepoint offsets");
    // SAFETY: `register` (tokio has no safe constructor since its I/O-safety fix, tokio#8587)
    // needs the fd to stay open and the same for the AsyncFd's lifetime. The RingBuf owns its
    // MapData, which owns the map's fd (an OwnedFd closed only on drop) and always returns it
    // from `as_raw_fd`; the AsyncFd owns the RingBuf and is never `into_inner`ed or forgotten,
    // so the fd outlives the registration.
    let ring = unsafe { AsyncFd::register(ring) }.map_err(|e| KernelError::Io {
        what: "polling the ring buffer".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    // SAFETY: as above: the logger owns its ring's MapData and so the fd, for the AsyncFd's
    // lifetime.
    let logs = unsafe { AsyncFd::register(logs) }.map_err(|e| KernelError::Io {
        what: "polling the programs' log ring".into(),
        source: std::io::Error::other(e.to_string()),
    })?;
    let attributor = Attributor::new(layout.clone());
    let rings = Rings {
        signals: ring,
        logs,
    };
    let task = tokio::spawn(pump(ebpf, rings, stats_map, attributor, tx, stats, beat));
    Ok((task, tracepoints, crossing))
}

/// Decodes, attributes and forwards one ring-buffer item. A malformed item is counted and
/// logged (rate-limited), never fatal. Returns false once the consumer has gone.
pub fn handle_item(
    item: &[u8],
    attributor: &mut Attributor,
    tx: &mpsc::Sender<Signal>,
    stats: &PipelineStats,
) -> bool {
    match decode(item) {
        Ok(raw) => {
            stats.decoded.fetch_add(1, Ordering::Relaxed);
            match tx.try_send(attributor.attribute(&raw)) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    stats.dropped.fetch_add(1, Ordering::Relaxed);
                    true
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            }
        }
        Err(e) => {
            let n = stats.malformed.fetch_add(1, Ordering::Relaxed) + 1;
            if n <= 10 || n.is_power_of_two() {
                tracing::warn!(error = %e, malformed = n, "dropping a malformed ring-buffer record");
            }
            true
        }
    }
}

/// The two rings the pump reads: the signal records and the programs' log records.
struct Rings {
    signals: AsyncFd<RingBuf<MapData>>,
    logs: AsyncFd<EbpfLogger<ProgramLog>>,
}

async fn pump(
    _ebpf: Ebpf,
    rings: Rings,
    stats_map: PerCpuArray<MapData, u64>,
    mut attributor: Attributor,
    tx: mpsc::Sender<Signal>,
    stats: Arc<PipelineStats>,
    beat: Arc<Heartbeat>,
) {
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last_full = 0;
    let Rings {
        signals: mut ring,
        mut logs,
    } = rings;
    loop {
        beat.beat();
        tokio::select! {
            guard = logs.readable_mut() => {
                match guard {
                    Ok(mut g) => {
                        g.get_inner_mut().flush();
                        g.clear_ready();
                    }
                    Err(e) => {
                        tracing::error!(error = %e, "the programs' log ring poll failed; the eBPF source stops");
                        return;
                    }
                }
            }
            guard = ring.readable_mut() => {
                let mut guard = match guard {
                    Ok(g) => g,
                    Err(e) => {
                        tracing::error!(error = %e, "ring buffer poll failed; the eBPF source stops");
                        return;
                    }
                };
                let ring = guard.get_inner_mut();
                while let Some(item) = ring.next() {
                    if !handle_item(&item, &mut attributor, &tx, &stats) {
                        return;
                    }
                }
                guard.clear_ready();
            }
            _ = tick.tick() => {
                refresh_stats(&stats_map, &stats);
                let full = stats.kernel_ring_full.load(Ordering::Relaxed);
                if full > last_full {
                    tracing::warn!(lost = full - last_full, "ring buffer was full: records lost");
                    last_full = full;
                }
                if tx.is_closed() {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn malformed_items_are_counted_not_fatal() {
        let mut attributor = Attributor::new(CgroupLayout::default());
        let (tx, mut rx) = mpsc::channel(4);
        let stats = PipelineStats::default();
        for bad in [
            &[][..],
            &[1, 2, 3][..],
            &[0u8; enforcer_common::RECORD_SIZE][..],
        ] {
            assert!(handle_item(bad, &mut attributor, &tx, &stats));
        }
        assert_eq!(stats.malformed.load(Ordering::Relaxed), 3);
        assert_eq!(stats.decoded.load(Ordering::Relaxed), 0);
        assert!(rx.try_recv().is_err(), "nothing forwarded");
        drop(rx);
        // A good record after the consumer left ends the pump.
        let mut good = [0u8; enforcer_common::RECORD_SIZE];
        good[..2].copy_from_slice(&enforcer_common::ABI_VERSION.to_le_bytes());
        good[2..4].copy_from_slice(&(enforcer_common::RecordKind::Probe as u16).to_le_bytes());
        assert!(!handle_item(&good, &mut attributor, &tx, &stats));
        assert_eq!(stats.decoded.load(Ordering::Relaxed), 1);
    }
}
