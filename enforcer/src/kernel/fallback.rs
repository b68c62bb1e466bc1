//! Fallback signal sources for when eBPF cannot load: cgroup v1 threshold eventfds, PSI
//! triggers with cgroup v2 `memory.events`, and plain polling. Each runs on its own thread
//! (blocking `poll(2)`) and sends the same [`Signal`]s as the eBPF source.

use std::{
    fs::{self, File, OpenOptions},
    io::{Read as _, Seek as _, SeekFrom, Write as _},
    os::fd::{AsRawFd as _, OwnedFd},
    path::{Path, PathBuf},
    sync::{
        Arc,
        atomic::{AtomicBool, Ordering},
    },
    time::{Duration, Instant},
};

use tokio::sync::mpsc;

use super::{Capabilities, KernelError, PipelineOptions, Watch};
use crate::{
    cgroup::{CgroupLayout, CrossingNotice},
    health::Heartbeat,
    signal::{PipelineStats, Signal, SignalKind, SourceKind},
};

/// The longest a notification thread blocks in `poll(2)`: it notices `stop`, a closed
/// channel, and beats its heartbeat at least this often when the kernel is quiet.
const NOTIFY_WAIT: Duration = Duration::from_millis(200);
/// The longest the polling thread sleeps between two looks at the clock (same reasons).
const POLL_NAP: Duration = Duration::from_millis(100);

/// The heartbeat of the thread [`start`] runs for `kind`, named after it.
#[must_use]
pub fn heartbeat(kind: SourceKind, opts: &PipelineOptions) -> Arc<Heartbeat> {
    match kind {
        SourceKind::Poll => Heartbeat::new("signals", "polling signal source", POLL_NAP),
        SourceKind::Eventfd => {
            Heartbeat::new("signals", "eventfd notification reader", NOTIFY_WAIT)
        }
        SourceKind::Psi if opts.psi_watch == super::PsiWatch::Events => {
            Heartbeat::new("signals", "memory.events notification reader", NOTIFY_WAIT)
        }
        SourceKind::Psi | SourceKind::Ebpf => {
            Heartbeat::new("signals", "PSI notification reader", NOTIFY_WAIT)
        }
    }
}

/// Stops the fallback threads when dropped or asked.
#[derive(Clone, Debug, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    pub fn stop(&self) {
        self.0.store(true, Ordering::Relaxed);
    }
    fn stopped(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The best fallback for this node: eventfd on cgroup v1 memory, PSI on v2, else polling.
#[must_use]
pub fn best_for(layout: &CgroupLayout, caps: &Capabilities) -> SourceKind {
    match layout.memory().map(|m| m.crossing_notice()) {
        Some(CrossingNotice::UsageEventfd) => SourceKind::Eventfd,
        Some(CrossingNotice::MemoryEvents) if caps.psi => SourceKind::Psi,
        _ => SourceKind::Poll,
    }
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> KernelError {
    let what = what.into();
    move |source| KernelError::Io { what, source }
}

fn read_u64(path: &Path) -> Result<u64, KernelError> {
    let text = fs::read_to_string(path).map_err(io(path.display().to_string()))?;
    let t = text.trim();
    if t == "max" {
        return Ok(u64::MAX);
    }
    t.parse().map_err(|_| KernelError::Io {
        what: path.display().to_string(),
        source: std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not a number: {t:?}"),
        ),
    })
}

/// Memory usage and limit files of a cgroup directory, v1 or v2.
fn usage_file(dir: &Path) -> PathBuf {
    let v1 = dir.join("memory.usage_in_bytes");
    if v1.exists() {
        v1
    } else {
        dir.join("memory.current")
    }
}

fn limit_of(dir: &Path) -> Option<u64> {
    let v1 = dir.join("memory.limit_in_bytes");
    let v = if v1.exists() {
        read_u64(&v1).ok()?
    } else {
        read_u64(&dir.join("memory.max")).ok()?
    };
    // v1 reports "no limit" as a huge page-aligned number.
    (v < (1 << 62)).then_some(v)
}

/// Resolves a watch's threshold: the given bytes, or 90 % of the cgroup's limit.
pub fn threshold_of(w: &Watch) -> Result<u64, KernelError> {
    if let Some(t) = w.threshold_bytes {
        return Ok(t);
    }
    limit_of(&w.cgroup)
        .map(|l| l / 10 * 9)
        .ok_or_else(|| KernelError::Unavailable {
            signal_source: SourceKind::Eventfd,
            why: format!(
                "{} has no memory limit and no threshold was given",
                w.cgroup.display()
            ),
        })
}

/// cgroup path of a watch relative to the controller's mount, for the signal.
fn relative(layout: &CgroupLayout, dir: &Path) -> (String, String) {
    for (memory, name) in [(true, "memory"), (false, "unified")] {
        let mount = if memory {
            layout.memory().map(|m| m.mount())
        } else {
            layout.unified.as_deref()
        };
        if let Some(m) = mount
            && let Ok(rel) = dir.strip_prefix(m)
        {
            return (format!("/{}", rel.display()), name.to_owned());
        }
    }
    (dir.display().to_string(), "unknown".to_owned())
}

fn send(tx: &mpsc::Sender<Signal>, stats: &PipelineStats, s: Signal) -> bool {
    match tx.try_send(s) {
        Ok(()) => {
            stats.decoded.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(mpsc::error::TrySendError::Full(_)) => {
            stats.dropped.fetch_add(1, Ordering::Relaxed);
            true
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

fn eventfd() -> Result<OwnedFd, KernelError> {
    rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)
        .map_err(|e| io("eventfd")(e.into()))
}

/// What a polled descriptor stands for.
enum Slot {
    Threshold {
        watch: usize,
        efd: OwnedFd,
        _usage: File,
        threshold: u64,
    },
    Oom {
        watch: usize,
        efd: OwnedFd,
        _ctl: File,
    },
    Psi {
        cgroup: Option<usize>,
        file: File,
    },
    Events {
        watch: usize,
        /// `memory.events` (hierarchical): polled, and its `oom_kill` counts.
        file: File,
        /// `memory.events.local` (kernel 5.2+): the cgroup's own `high` and `max` (on v2
        /// `memory.events` also counts every descendant's, so a pod at its own limit would
        /// read as a crossing of the watched cgroup).
        local: Option<File>,
        last: MemEvents,
    },
}

/// Counters of a cgroup v2 `memory.events` file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MemEvents {
    pub high: u64,
    pub max: u64,
    pub oom: u64,
    pub oom_kill: u64,
}

/// Parses `memory.events` text.
#[must_use]
pub fn parse_mem_events(text: &str) -> MemEvents {
    let mut m = MemEvents::default();
    for line in text.lines() {
        let mut f = line.split_whitespace();
        let (Some(k), Some(v)) = (f.next(), f.next().and_then(|v| v.parse().ok())) else {
            continue;
        };
        match k {
            "high" => m.high = v,
            "max" => m.max = v,
            "oom" => m.oom = v,
            "oom_kill" => m.oom_kill = v,
            _ => {}
        }
    }
    m
}

fn read_events(file: &mut File) -> MemEvents {
    let mut text = String::new();
    if file.seek(SeekFrom::Start(0)).is_ok() && file.read_to_string(&mut text).is_ok() {
        parse_mem_events(&text)
    } else {
        MemEvents::default()
    }
}

/// The watched cgroup's counters: `oom_kill` of the whole subtree, `high` and `max` of the
/// cgroup itself where the kernel has `memory.events.local` (else of the subtree).
fn read_own_events(file: &mut File, local: Option<&mut File>) -> MemEvents {
    let all = read_events(file);
    match local {
        Some(l) => MemEvents {
            oom_kill: all.oom_kill,
            ..read_events(l)
        },
        None => all,
    }
}

/// Starts a fallback source on its own thread, which beats `beat` on every iteration.
pub fn start(
    kind: SourceKind,
    opts: &PipelineOptions,
    caps: &Capabilities,
    layout: &CgroupLayout,
    tx: mpsc::Sender<Signal>,
    stats: Arc<PipelineStats>,
    beat: Arc<Heartbeat>,
) -> Result<Stop, KernelError> {
    let stop = Stop::default();
    let watches = opts.watches.clone();
    let layout = layout.clone();
    match kind {
        SourceKind::Ebpf => {
            return Err(KernelError::Unavailable {
                signal_source: kind,
                why: "not a fallback".into(),
            });
        }
        SourceKind::Poll => {
            let thresholds = watches
                .iter()
                .map(threshold_of)
                .collect::<Result<Vec<_>, _>>()?;
            let interval = opts.poll_interval;
            let s = stop.clone();
            spawn("enforcer-poll", move || {
                let io = LoopIo {
                    tx: &tx,
                    stats: &stats,
                    stop: &s,
                    beat: &beat,
                };
                poll_loop(&watches, &thresholds, interval, &layout, &io);
            })?;
        }
        SourceKind::Eventfd | SourceKind::Psi => {
            let slots = if kind == SourceKind::Eventfd {
                if layout.memory().map(|m| m.crossing_notice())
                    != Some(CrossingNotice::UsageEventfd)
                {
                    return Err(KernelError::Unavailable {
                        signal_source: kind,
                        why: "memory cgroup eventfds need the cgroup v1 memory controller".into(),
                    });
                }
                eventfd_slots(&watches)?
            } else {
                if opts.psi_watch.triggers() && !caps.psi {
                    return Err(KernelError::Unavailable {
                        signal_source: kind,
                        why: "/proc/pressure/memory is missing".into(),
                    });
                }
                psi_slots(
                    &watches,
                    opts.psi_watch.triggers().then(|| caps.psi_window_us()),
                    opts.psi_watch.events(),
                )?
            };
            let s = stop.clone();
            spawn("enforcer-notify", move || {
                let io = LoopIo {
                    tx: &tx,
                    stats: &stats,
                    stop: &s,
                    beat: &beat,
                };
                notify_loop(slots, &watches, &layout, &io);
            })?;
        }
    }
    Ok(stop)
}

/// A reader thread, at the spawning thread's real-time priority when it has one (the
/// crossing thread's readers).
fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<(), KernelError> {
    let rt = super::realtime::current_priority();
    std::thread::Builder::new()
        .name(name.to_owned())
        .spawn(move || {
            if let Some(p) = rt
                && let Err(e) = super::realtime::make_realtime(p)
            {
                tracing::warn!(error = %e, "a signal reader could not run at real-time priority");
            }
            f();
        })
        .map(|_| ())
        .map_err(io("spawning a signal thread"))
}

/// Thresholds registered per watched cgroup (the first at the threshold).
pub const LADDER_RUNGS: u64 = 16;
/// Distance between two rungs of the threshold ladder.
pub const LADDER_STEP: u64 = 4 << 20;

fn eventfd_slots(watches: &[Watch]) -> Result<Vec<Slot>, KernelError> {
    let mut slots = Vec::new();
    for (i, w) in watches.iter().enumerate() {
        let threshold = threshold_of(w)?;
        let control = w.cgroup.join("cgroup.event_control");
        let usage_path = w.cgroup.join("memory.usage_in_bytes");
        let usage = File::open(&usage_path).map_err(io(usage_path.display().to_string()))?;
        let efd = eventfd()?;
        let mut ctl = OpenOptions::new()
            .write(true)
            .open(&control)
            .map_err(io(control.display().to_string()))?;
        // A ladder of thresholds: the first at the threshold, then every LADDER_STEP above
        // it, so a usage that keeps climbing past the threshold keeps signalling (a v1
        // threshold fires once per crossing). One write(2) per command: cgroup.event_control
        // rejects a command split in pieces.
        for rung in 0..LADDER_RUNGS {
            let t = threshold.saturating_add(rung * LADDER_STEP);
            ctl.write_all(format!("{} {} {}", efd.as_raw_fd(), usage.as_raw_fd(), t).as_bytes())
                .map_err(io(control.display().to_string()))?;
        }
        slots.push(Slot::Threshold {
            watch: i,
            efd,
            _usage: usage,
            threshold,
        });
        // OOM notifications of the same cgroup.
        let oom_path = w.cgroup.join("memory.oom_control");
        let oom = File::open(&oom_path).map_err(io(oom_path.display().to_string()))?;
        let oefd = eventfd()?;
        ctl.write_all(format!("{} {}", oefd.as_raw_fd(), oom.as_raw_fd()).as_bytes())
            .map_err(io(control.display().to_string()))?;
        slots.push(Slot::Oom {
            watch: i,
            efd: oefd,
            _ctl: oom,
        });
    }
    Ok(slots)
}

/// PSI triggers (`window_us`: the trigger window; `None`: no triggers) and the watched
/// cgroups' `memory.events` (when `memory_events`).
fn psi_slots(
    watches: &[Watch],
    window_us: Option<u64>,
    memory_events: bool,
) -> Result<Vec<Slot>, KernelError> {
    let trigger = window_us.map(|w| format!("some {} {}\0", w / 10, w));
    let open_trigger = |path: &Path, trigger: &str| -> Result<File, KernelError> {
        let mut f = OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(io(path.display().to_string()))?;
        f.write_all(trigger.as_bytes()).map_err(io(format!(
            "{} (trigger {})",
            path.display(),
            trigger.trim_end_matches('\0')
        )))?;
        Ok(f)
    };
    let mut slots = Vec::new();
    if let Some(t) = &trigger {
        slots.push(Slot::Psi {
            cgroup: None,
            file: open_trigger(Path::new("/proc/pressure/memory"), t)?,
        });
    }
    for (i, w) in watches.iter().enumerate() {
        // One watch per cgroup (the daemon watches kubepods once per memory threshold).
        if watches[..i].iter().any(|o| o.cgroup == w.cgroup) {
            continue;
        }
        let pressure = w.cgroup.join("memory.pressure");
        if let Some(t) = &trigger
            && pressure.exists()
        {
            slots.push(Slot::Psi {
                cgroup: Some(i),
                file: open_trigger(&pressure, t)?,
            });
        }
        let events = w.cgroup.join("memory.events");
        if memory_events && events.exists() {
            let mut file = File::open(&events).map_err(io(events.display().to_string()))?;
            let mut local = File::open(w.cgroup.join("memory.events.local")).ok();
            let last = read_own_events(&mut file, local.as_mut());
            slots.push(Slot::Events {
                watch: i,
                file,
                local,
                last,
            });
        }
    }
    Ok(slots)
}

/// What a fallback thread's loop sends to and is told by.
struct LoopIo<'a> {
    tx: &'a mpsc::Sender<Signal>,
    stats: &'a PipelineStats,
    stop: &'a Stop,
    beat: &'a Heartbeat,
}

impl LoopIo<'_> {
    /// Beats the heartbeat; whether the loop goes on (not stopped, the consumer is there).
    fn next(&self) -> bool {
        self.beat.beat();
        !self.stop.stopped() && !self.tx.is_closed()
    }
}

fn notify_loop(mut slots: Vec<Slot>, watches: &[Watch], layout: &CgroupLayout, io: &LoopIo<'_>) {
    use rustix::event::{PollFd, PollFlags};
    let LoopIo { tx, stats, .. } = *io;
    // Wake up at least every NOTIFY_WAIT to notice `stop` and a closed channel.
    let timeout = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: NOTIFY_WAIT.subsec_nanos().into(),
    };
    while io.next() {
        // The descriptors are borrowed from the slots for the poll only: handling a ready
        // slot below reads (mutably) from it.
        let ready: Vec<bool> = {
            let mut fds: Vec<PollFd<'_>> = slots
                .iter()
                .map(|s| match s {
                    Slot::Threshold { efd, .. } | Slot::Oom { efd, .. } => {
                        PollFd::new(efd, PollFlags::IN)
                    }
                    Slot::Psi { file, .. } | Slot::Events { file, .. } => {
                        PollFd::new(file, PollFlags::PRI)
                    }
                })
                .collect();
            match rustix::event::poll(&mut fds, Some(&timeout)) {
                Ok(n) if n > 0 => fds.iter().map(|f| !f.revents().is_empty()).collect(),
                _ => continue,
            }
        };
        for (ready, slot) in ready.into_iter().zip(slots.iter_mut()) {
            if !ready {
                continue;
            }
            let mut signals = Vec::new();
            match slot {
                Slot::Threshold {
                    watch,
                    efd,
                    threshold,
                    ..
                } => {
                    drain_eventfd(efd);
                    let dir = &watches[*watch].cgroup;
                    let mut s = Signal::new(SignalKind::MemoryThreshold, SourceKind::Eventfd);
                    s.detail.threshold_bytes = Some(*threshold);
                    s.detail.usage_bytes = read_u64(&usage_file(dir)).ok();
                    let (p, h) = relative(layout, dir);
                    s.set_cgroup(p, h);
                    signals.push(s);
                }
                Slot::Oom { watch, efd, .. } => {
                    drain_eventfd(efd);
                    let mut s = Signal::new(SignalKind::OomKill, SourceKind::Eventfd);
                    let (p, h) = relative(layout, &watches[*watch].cgroup);
                    s.set_cgroup(p, h);
                    signals.push(s);
                }
                Slot::Psi { cgroup, .. } => {
                    let mut s = Signal::new(SignalKind::MemoryPressure, SourceKind::Psi);
                    match cgroup {
                        Some(i) => {
                            let (p, h) = relative(layout, &watches[*i].cgroup);
                            s.set_cgroup(p, h);
                        }
                        None => s.set_cgroup("/".to_owned(), "node".to_owned()),
                    }
                    signals.push(s);
                }
                Slot::Events {
                    watch,
                    file,
                    local,
                    last,
                } => {
                    let now = read_own_events(file, local.as_mut());
                    let (p, h) = relative(layout, &watches[*watch].cgroup);
                    let grew =
                        |a: u64, b: u64| u32::try_from(a.saturating_sub(b)).unwrap_or(u32::MAX);
                    if now.high > last.high || now.max > last.max {
                        let mut s = Signal::new(SignalKind::MemoryEvents, SourceKind::Psi);
                        s.count = grew(now.high + now.max, last.high + last.max);
                        s.set_cgroup(p.clone(), h.clone());
                        signals.push(s);
                    }
                    if now.oom_kill > last.oom_kill {
                        let mut s = Signal::new(SignalKind::OomKill, SourceKind::Psi);
                        s.count = grew(now.oom_kill, last.oom_kill);
                        s.set_cgroup(p, h);
                        signals.push(s);
                    }
                    *last = now;
                }
            }
            for s in signals {
                if !send(tx, stats, s) {
                    return;
                }
            }
        }
    }
}

fn drain_eventfd(efd: &OwnedFd) {
    let mut buf = [0u8; 8];
    let _ = rustix::io::read(efd, &mut buf);
}

/// Level-triggered, like kubelet's housekeeping: every tick that finds a watched cgroup at or
/// above its threshold reports it.
fn poll_loop(
    watches: &[Watch],
    thresholds: &[u64],
    interval: Duration,
    layout: &CgroupLayout,
    io: &LoopIo<'_>,
) {
    let LoopIo { tx, stats, .. } = *io;
    let mut next = Instant::now();
    while io.next() {
        let now = Instant::now();
        if now < next {
            std::thread::sleep((next - now).min(POLL_NAP));
            continue;
        }
        next += interval;
        for (w, threshold) in watches.iter().zip(thresholds) {
            let Ok(usage) = read_u64(&usage_file(&w.cgroup)) else {
                continue;
            };
            if usage >= *threshold {
                let mut s = Signal::new(SignalKind::MemoryThreshold, SourceKind::Poll);
                s.detail.usage_bytes = Some(usage);
                s.detail.threshold_bytes = Some(*threshold);
                let (p, h) = relative(layout, &w.cgroup);
                s.set_cgroup(p, h);
                if !send(tx, stats, s) {
                    return;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// With nothing to read, both fallback loops keep beating (a bounded wait), and stop
    /// when asked.
    #[test]
    fn quiet_loops_keep_beating() {
        for polling in [false, true] {
            let (tx, _rx) = mpsc::channel(1);
            let stats = PipelineStats::default();
            let stop = Stop::default();
            let beat = heartbeat(
                if polling {
                    SourceKind::Poll
                } else {
                    SourceKind::Eventfd
                },
                &PipelineOptions::default(),
            );
            let first = beat.last_ms();
            std::thread::scope(|s| {
                let t = s.spawn(|| {
                    let io = LoopIo {
                        tx: &tx,
                        stats: &stats,
                        stop: &stop,
                        beat: &beat,
                    };
                    let layout = CgroupLayout::default();
                    if polling {
                        poll_loop(&[], &[], Duration::from_secs(3600), &layout, &io);
                    } else {
                        notify_loop(Vec::new(), &[], &layout, &io);
                    }
                });
                std::thread::sleep(Duration::from_millis(700));
                let last = beat.last_ms();
                stop.stop();
                assert!(t.join().is_ok());
                assert!(
                    last >= first + 200,
                    "{}: beat at {first} ms, then last at {last} ms",
                    beat.component()
                );
            });
        }
    }

    #[test]
    fn memory_events() {
        let m =
            parse_mem_events("low 0\nhigh 3\nmax 7\noom 1\noom_kill 1\noom_group_kill 0\nbad\n");
        assert_eq!(
            m,
            MemEvents {
                high: 3,
                max: 7,
                oom: 1,
                oom_kill: 1
            }
        );
        assert_eq!(parse_mem_events(""), MemEvents::default());
    }

    /// A watched cgroup's own crossings come from `memory.events.local` (a pod at its own
    /// limit moves only the hierarchical file); OOM kills anywhere below count.
    #[test]
    fn own_high_and_max_subtree_oom_kills() {
        let dir = tempfile::tempdir().unwrap();
        let (all, local) = (dir.path().join("events"), dir.path().join("local"));
        std::fs::write(&all, "low 0\nhigh 9\nmax 4\noom 2\noom_kill 2\n").unwrap();
        std::fs::write(&local, "low 0\nhigh 1\nmax 0\noom 0\noom_kill 0\n").unwrap();
        let mut f = File::open(&all).unwrap();
        let mut l = File::open(&local).unwrap();
        let own = read_own_events(&mut f, Some(&mut l));
        assert_eq!((own.high, own.max, own.oom_kill), (1, 0, 2));
        // Without the local file (kernels before 5.2): the hierarchical counts.
        let old = read_own_events(&mut f, None);
        assert_eq!((old.high, old.max, old.oom_kill), (9, 4, 2));
    }
}
