//! The kernel side of the daemon: probe what the kernel offers, load and attach the eBPF
//! programs, read their ring buffer, and fall back to eventfd / PSI / polling sources that
//! produce the same signal stream when eBPF cannot load.

pub mod btf;
pub mod crossing;
pub mod ebpf;
pub mod fallback;
pub mod memcg_iter;
pub mod probe;
pub mod program_log;
pub mod realtime;
pub mod threshold;
pub mod tracefmt;

use std::{path::PathBuf, sync::Arc, time::Duration};

use tokio::sync::mpsc;

pub use probe::{Capabilities, apparmor_enabled};

use crate::{
    cgroup::{CgroupError, CgroupLayout, CrossingNotice},
    health::Heartbeat,
    signal::{PipelineStats, Signal, SourceKind},
};

/// Errors of the kernel module.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error("this binary was built without the eBPF object (AYA_BUILD_SKIP)")]
    NoObject,
    #[error("loading the eBPF object: {0}")]
    Load(#[source] Box<aya::EbpfError>),
    #[error("eBPF program {program}: {source}")]
    Program {
        program: &'static str,
        #[source]
        source: Box<aya::programs::ProgramError>,
    },
    #[error("eBPF map {map}: {what}")]
    Map { map: &'static str, what: String },
    #[error("mounting tracefs at {path}: {source}")]
    Tracefs {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("signal source {signal_source:?} is not available here: {why}")]
    Unavailable {
        signal_source: SourceKind,
        why: String,
    },
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

/// Which source to use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum SourceChoice {
    /// eBPF, else the best fallback for this cgroup layout.
    #[default]
    Auto,
    /// Exactly this source, or an error.
    Only(SourceKind),
}

/// A memory cgroup the fallback sources watch (eBPF sees every cgroup without being told).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Watch {
    /// Absolute directory of the cgroup (in the memory controller's hierarchy).
    pub cgroup: PathBuf,
    /// Usage threshold in bytes; `None`: 90 % of the cgroup's memory limit.
    pub threshold_bytes: Option<u64>,
}

/// How to start the signal pipeline.
#[derive(Clone, Debug)]
pub struct PipelineOptions {
    pub source: SourceChoice,
    pub watches: Vec<Watch>,
    /// Minimum time between two reclaim/fork records of one cgroup (eBPF).
    pub burst_window: Duration,
    /// Tgid whose getppid() calls the probe program reports (benchmarks; 0 = off).
    pub probe_tgid: u32,
    /// Period of the polling source.
    pub poll_interval: Duration,
    /// Signals buffered between the sources and the consumer.
    pub channel_capacity: usize,
    /// Tracing directories whose `events/<category>/<name>/format` files give the eBPF
    /// programs their field offsets, the first that has a tracepoint winning (tracefs, then
    /// debugfs; tests put a directory of other kernels' formats first).
    pub tracing_roots: Vec<PathBuf>,
    /// What the PSI source watches.
    pub psi_watch: PsiWatch,
    /// The crossing check on the memory charge path (eBPF): where it may attach.
    pub crossing: CrossingMode,
    /// The BTF the crossing check's offsets and fexit come from (the kernel's own when
    /// unset; tests hand a doctored copy).
    pub btf_path: Option<PathBuf>,
}

/// Where the crossing check may attach.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum CrossingMode {
    /// The first point this kernel takes ([`crossing::Attach::ALL`]'s order) within the cost
    /// budget: fexit or kprobe; the statistics tracepoints only when pinned or `Any`.
    #[default]
    Auto,
    /// The first point this kernel takes, the tracepoints too (benchmarks, tests).
    Any,
    /// This point alone.
    Only(crossing::Attach),
    /// Not attached: the crossing is the cgroup-file tripwire's.
    Off,
}

/// What the PSI source watches: PSI triggers, the watched cgroups' v2 `memory.events`, or
/// both (the default).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum PsiWatch {
    #[default]
    TriggersAndEvents,
    /// A PSI trigger alone (the eviction benchmark measures it so).
    Triggers,
    /// `memory.events` alone: the watch that runs beside eBPF on cgroup v2.
    Events,
}

impl PsiWatch {
    #[must_use]
    pub fn triggers(self) -> bool {
        self != Self::Events
    }

    #[must_use]
    pub fn events(self) -> bool {
        self != Self::Triggers
    }
}

impl Default for PipelineOptions {
    fn default() -> Self {
        Self {
            source: SourceChoice::Auto,
            watches: Vec::new(),
            burst_window: Duration::from_nanos(enforcer_common::DEFAULT_BURST_WINDOW_NS),
            probe_tgid: 0,
            poll_interval: Duration::from_secs(10),
            channel_capacity: 65_536,
            tracing_roots: tracefmt::TRACING_ROOTS.iter().map(PathBuf::from).collect(),
            psi_watch: PsiWatch::default(),
            crossing: CrossingMode::default(),
            btf_path: None,
        }
    }
}

/// A running signal pipeline.
pub struct Pipeline {
    /// The source in use.
    pub source: SourceKind,
    /// Why this source was chosen (for the log).
    pub reason: String,
    pub stats: Arc<PipelineStats>,
    pub signals: mpsc::Receiver<Signal>,
    /// With eBPF: each tracepoint's program, attached, with the fields found (offsets from
    /// this kernel's formats) or absent. Empty for the fallback sources.
    pub tracepoints: Vec<tracefmt::TracepointStatus>,
    /// One per reader (the eBPF ring-buffer task, each fallback thread), beaten on every
    /// iteration of its loop (`/healthz` reports a reader that stops beating).
    pub heartbeats: Vec<Arc<Heartbeat>>,
    /// With eBPF: the crossing check on the memory charge path.
    pub crossing: ebpf::Crossing,
    _guard: Guard,
}

struct Guard {
    task: Option<tokio::task::JoinHandle<()>>,
    threads: Option<fallback::Stop>,
}

impl Drop for Pipeline {
    fn drop(&mut self) {
        if let Some(h) = &self._guard.task {
            h.abort();
        }
        if let Some(stop) = &self._guard.threads {
            stop.stop();
        }
    }
}

/// Starts the signal pipeline with the chosen (or best available) source.
pub fn start(
    opts: &PipelineOptions,
    caps: &Capabilities,
    layout: &CgroupLayout,
) -> Result<Pipeline, KernelError> {
    let stats = Arc::new(PipelineStats::default());
    let (tx, rx) = mpsc::channel(opts.channel_capacity.max(1));
    let pipeline = |source, reason, task, threads, tracepoints, heartbeats| {
        stats.set_active(source);
        Pipeline {
            source,
            reason,
            stats: stats.clone(),
            signals: rx,
            tracepoints,
            heartbeats,
            crossing: ebpf::Crossing::default(),
            _guard: Guard { task, threads },
        }
    };
    let (source, reason) = match opts.source {
        SourceChoice::Only(k) => (k, "requested".to_owned()),
        SourceChoice::Auto => (SourceKind::Ebpf, "eBPF preferred".to_owned()),
    };
    if source != SourceKind::Ebpf {
        let beat = fallback::heartbeat(source, opts);
        let stop = fallback::start(source, opts, caps, layout, tx, stats.clone(), beat.clone())?;
        return Ok(pipeline(
            source,
            reason,
            None,
            Some(stop),
            Vec::new(),
            vec![beat],
        ));
    }
    let ebpf_beat = Heartbeat::new("signals", "eBPF ring-buffer reader", ebpf::TICK);
    match ebpf::start(opts, layout, tx.clone(), stats.clone(), ebpf_beat.clone()) {
        Ok((handle, tracepoints, crossing)) => {
            let attach = crossing
                .choice
                .as_ref()
                .map(|c| c.chosen.map_or("none", |a| a.name()));
            if let Some(a) = attach {
                let _ = stats.crossing_attach.set(a);
            }
            // Kernel events mark limits (reclaim) and OOM kills; a threshold *below* a limit
            // (an eviction threshold) has no tracepoint, so the watched cgroups with a
            // threshold also get the kernel's own notification of it, feeding the same
            // stream: usage-threshold eventfds on cgroup v1; on v2 `memory.events`, whose
            // `high` count the `memory.high` tripwire moves at the crossing.
            let watches: Vec<Watch> = opts
                .watches
                .iter()
                .filter(|w| w.threshold_bytes.is_some())
                .cloned()
                .collect();
            let beside = match layout.memory().map(|m| m.crossing_notice()) {
                _ if watches.is_empty() => None,
                Some(CrossingNotice::UsageEventfd) => {
                    Some((SourceKind::Eventfd, "usage-threshold eventfds"))
                }
                Some(CrossingNotice::MemoryEvents) => {
                    Some((SourceKind::Psi, "memory.events notifications"))
                }
                None => None,
            };
            let mut heartbeats = vec![ebpf_beat];
            let threads = beside.and_then(|(kind, what)| {
                let o = PipelineOptions {
                    watches,
                    psi_watch: PsiWatch::Events,
                    ..opts.clone()
                };
                let beat = fallback::heartbeat(kind, &o);
                match fallback::start(kind, &o, caps, layout, tx, stats.clone(), beat.clone()) {
                    Ok(stop) => {
                        heartbeats.push(beat);
                        Some((stop, what))
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "{what} beside eBPF could not be armed");
                        None
                    }
                }
            });
            let (threads, reason) = match threads {
                Some((stop, what)) => (Some(stop), format!("{reason}; with {what}")),
                None => (None, reason),
            };
            let mut p = pipeline(
                source,
                reason,
                Some(handle),
                threads,
                tracepoints,
                heartbeats,
            );
            p.crossing = crossing;
            Ok(p)
        }
        Err(e) if opts.source == SourceChoice::Auto => {
            let k = fallback::best_for(layout, caps);
            let reason = format!("eBPF unavailable ({e}); falling back to {k:?}");
            let beat = fallback::heartbeat(k, opts);
            let stop = fallback::start(k, opts, caps, layout, tx, stats.clone(), beat.clone())?;
            Ok(pipeline(
                k,
                reason,
                None,
                Some(stop),
                Vec::new(),
                vec![beat],
            ))
        }
        Err(e) => Err(e),
    }
}
