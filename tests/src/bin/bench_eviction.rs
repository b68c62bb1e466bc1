//! `cargo xtask bench eviction`: the headline number. N trials of the pressure scenario per
//! signal mode, in one run: a "node" of 512 MiB (a capacity override; kubepods limited to it),
//! a hard threshold `memory.available<100Mi`, and a BestEffort pod whose process grows its
//! memory 1 MiB at a time (~100 MiB/s) past the threshold towards the limit. Measured: from
//! the threshold crossing (the growing process's own timestamp of the quarter MiB that crossed it) to
//! SIGKILL sent by the eviction manager, and to the process's memory being released (its exit
//! reaped); and how many trials ended with a kernel OOM kill instead.
//!
//! The modes follow the node's memory controller. On cgroup v1: eBPF with the usage-threshold
//! tripwire on kubepods (the daemon's way; with the static threshold eventfds), eBPF with the
//! crossing check on the charge path as the tripwire (nothing written), the same without the
//! tripwire, the memcg eventfds alone, PSI, kubelet's 10 s poll. On cgroup v2
//! (`cargo xtask bench eviction --vm` runs it in Debian's 6.1 kernel): eBPF with the
//! `memory.high` tripwire on kubepods (the kernel-driven path), eBPF with the crossing check
//! (the first point the kernel takes, and pinned to the kprobe), the tripwire's
//! `memory.events` notification without eBPF, a PSI trigger, a 1 s poll (the cadence of
//! systemd-oomd and koordlet) and kubelet's 10 s poll. A third table gives how far past the
//! threshold the growth was at the kernel event and at the SIGKILL. Each mode is reported as a ratio to
//! the fastest mode of the same run. A trial lost to the kernel OOM killer is censored: the
//! mode had not acted by the process's last stamp, which bounds its time from below; the
//! median over won times and bounds is a lower bound of the mode's median (`>=`). A second
//! table splits the won trials' time into the chain's segments (from the kill records):
//! crossing -> kernel event -> received by the daemon -> node and pods read -> decided ->
//! SIGKILL sent.
//! `--pods N` runs each mode twice, with the growing pod alone and with N - 1 idle Burstable
//! neighbours beside it (each in its pod and container cgroups, writing a log line every
//! second: kubelet's 110 pods with `--pods 110`);
//! `--log FILTER` prints the daemon's log with times; `--mode a,b` runs some modes only (`=name`: that one alone);
//! `--companion` adds the eBPF mode as `enforcer run --companion` runs it beside kubelet
//! (its configuration: no tripwire written; the companion's eviction manager), without and
//! with the crossing check on the charge path.
//!
//! The eviction manager is the daemon's own (`enforcer::eviction_manager::EvictionManager`), fed by the
//! daemon's signal pipeline in each mode; pods are plain cgroups with the growing process
//! (no containerd: the runtime is not what is measured here).

use std::{
    io::{BufRead as _, BufReader, Write as _},
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use anyhow::{Context as _, bail};
use enforcer::{
    cgroup::{kubepods::Kubepods, writer::CgroupValues},
    config::{ConfigArgs, SignalSource},
    eviction_manager::EvictionManager,
    kernel::{
        self, Capabilities, CrossingMode, PipelineOptions, PsiWatch, SourceChoice, Watch,
        crossing::Attach,
    },
    node::NodeObserver,
    pods::{ActiveEntry, NodeLink},
    policy::{
        cgroup_name::{self, CgroupDriver, CgroupName},
        qos::QosClass,
    },
    signal::{SourceKind, monotonic_ns},
    status_manager::StatusManager,
};
use enforcer_tests::{TestCgroup, layout, require_root, spawn_in, unique_name};

const MIB: u64 = 1 << 20;
const CAPACITY_MIB: u64 = 512;
const THRESHOLD_MIB: u64 = 100;

fn arg(name: &str, default: u64) -> u64 {
    enforcer_tests::arg_u64(name, default)
}

struct ModeResult {
    name: String,
    to_kill: Vec<u64>,
    to_free: Vec<u64>,
    oom: u64,
    neither: u64,
    /// Won trials whose memory process_mrelease reclaimed before the victim's exit.
    reaped: u64,
    /// Trials whose victim ended by its graceful stop's SIGTERM (throttle modes).
    graceful: u64,
    /// Trials whose victim ended by SIGKILL (the manager's, at once or escalated).
    sigkilled: u64,
    /// The node's smallest headroom over the mode (capacity less kubepods' peak usage).
    headroom_min: Option<u64>,
    /// Per trial lost to the kernel OOM killer, a lower bound of the mode's crossing ->
    /// SIGKILL: the process was still running at its last stamp, so the mode had not acted
    /// by then (its SIGKILL time instead, if it sent one after all).
    lost: Vec<u64>,
    /// Per won trial, the chain's segments (ns): crossing -> kernel event, -> received by
    /// the daemon, -> node and pods read, -> decided, -> SIGKILL sent (from the kill record).
    segments: Vec<[Option<u64>; SEGMENTS]>,
    /// Per won trial, the bytes the growing process had touched past the crossing when the
    /// kernel event came (trials with one) and when the SIGKILL was sent (from its stamps).
    past_event: Vec<u64>,
    past_kill: Vec<u64>,
    /// Per won trial led by a signal carrying the watched cgroup's usage and level (a crossing
    /// record: the page counter at the crossing charge; a v1 threshold eventfd: the usage read
    /// when it fired), the usage past the level.
    past_level: Vec<u64>,
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    require_root();
    // `--log FILTER`: the daemon's log on standard error (e.g. `enforcer=debug`), with each
    // line's time since the start, to follow a trial signal by signal.
    if let Some(filter) = std::env::args()
        .position(|a| a == "--log")
        .and_then(|i| std::env::args().nth(i + 1))
    {
        tracing_subscriber::fmt()
            .with_writer(std::io::stderr)
            .with_timer(tracing_subscriber::fmt::time::uptime())
            .with_env_filter(tracing_subscriber::EnvFilter::try_new(&filter)?)
            .init();
        eprintln!("log times count from monotonic {} ns", monotonic_ns());
    }
    let trials = arg("--trials", 20);
    let hog = std::env::current_exe()?.with_file_name("memhog");
    if !hog.exists() {
        bail!("{} is missing", hog.display());
    }
    let v2 = enforcer_tests::memory_is_v2();
    let ten = Duration::from_secs(10);
    // `--companion`: the eBPF mode also as companion mode runs it beside kubelet (its
    // configuration: no tripwire, nothing written to kubepods), in the same table.
    let companion = std::env::args().any(|a| a == "--companion");
    let mut modes: Vec<Mode> = if v2 {
        vec![
            Mode::new("eBPF + memory.high tripwire", SignalSource::Ebpf, ten, true),
            Mode::new(
                "eBPF + crossing check on the charge path",
                SignalSource::Ebpf,
                ten,
                true,
            )
            .checking_charges(),
            Mode::new(
                "eBPF + crossing check on the charge path, kprobe",
                SignalSource::Ebpf,
                ten,
                true,
            )
            .checking_charges_at(Attach::Kprobe),
            Mode::new(
                "memory.events (tripwire), no eBPF",
                SignalSource::Psi,
                ten,
                true,
            ),
            Mode::new("PSI trigger alone", SignalSource::Psi, ten, false).without_memory_events(),
            Mode::new(
                "1 s poll (oomd, koordlet)",
                SignalSource::Poll,
                Duration::from_secs(1),
                false,
            ),
            Mode::new(
                "10 s housekeeping poll (kubelet)",
                SignalSource::Poll,
                ten,
                false,
            ),
        ]
    } else {
        vec![
            Mode::new(
                "eBPF + usage-threshold tripwire (+ v1 threshold eventfds)",
                SignalSource::Ebpf,
                ten,
                true,
            ),
            Mode::new(
                "eBPF + crossing check on the charge path (+ v1 threshold eventfds)",
                SignalSource::Ebpf,
                ten,
                true,
            )
            .checking_charges(),
            Mode::new(
                "eBPF (+ v1 threshold eventfds), no tripwire",
                SignalSource::Ebpf,
                ten,
                false,
            ),
            Mode::new("memcg eventfd", SignalSource::Eventfd, ten, false),
            Mode::new("PSI trigger", SignalSource::Psi, ten, false),
            Mode::new(
                "10 s housekeeping poll (kubelet)",
                SignalSource::Poll,
                ten,
                false,
            ),
        ]
    };
    // `--streams N`: the first mode again, with N log follows and an exec session open on
    // the secure port in the same process during its trials.
    let streams = usize::try_from(arg("--streams", 0)).unwrap_or(0);
    if streams > 0 {
        let first = modes
            .first()
            .map(|m| (m.source, m.housekeeping, m.tripwire));
        if let Some((source, housekeeping, tripwire)) = first {
            let name: &'static str = Box::leak(
                format!(
                    "{} + {streams} log follows and an exec session",
                    modes[0].name
                )
                .into_boxed_str(),
            );
            modes.insert(
                1,
                Mode::new(name, source, housekeeping, tripwire).with_streams(streams),
            );
        }
    }
    // The first mode again as it ran before the crossing thread and without reclaiming the
    // victim's memory: what each of the two adds, in the same run.
    if let Some((source, housekeeping, tripwire)) = modes
        .first()
        .map(|m| (m.source, m.housekeeping, m.tripwire))
    {
        let leak = |s: String| -> &'static str { Box::leak(s.into_boxed_str()) };
        let first = modes[0].name;
        modes.insert(
            1,
            Mode::new(
                leak(format!("{first}, no process_mrelease")),
                source,
                housekeeping,
                tripwire,
            )
            .without_reaping(),
        );
        modes.insert(
            1,
            Mode::new(
                leak(format!("{first}, usage files (no cgroup iterator)")),
                source,
                housekeeping,
                tripwire,
            )
            .reading_files(),
        );
        modes.insert(
            1,
            Mode::new(
                leak(format!("{first}, throttle then graceful stop")),
                source,
                housekeeping,
                tripwire,
            )
            .throttling(),
        );
        modes.insert(
            1,
            Mode::new(
                leak(format!("{first}, shared runtime (no crossing thread)")),
                source,
                housekeeping,
                tripwire,
            )
            .on_shared_runtime(),
        );
    }
    if companion {
        modes.insert(
            1,
            Mode::new(
                "companion beside kubelet (eBPF, no tripwire)",
                SignalSource::Ebpf,
                ten,
                false,
            )
            .beside_kubelet(),
        );
        modes.insert(
            2,
            Mode::new(
                "companion beside kubelet, crossing check on the charge path",
                SignalSource::Ebpf,
                ten,
                false,
            )
            .beside_kubelet()
            .checking_charges(),
        );
    }
    // `--drivers cgroupfs,systemd`: each mode with the pods laid out by each driver (systemd:
    // real slices over D-Bus, the process in a real scope; needs systemd as PID 1, as in
    // `cargo xtask bench eviction --vm --systemd`).
    let drivers: Vec<CgroupDriver> = match std::env::args()
        .position(|a| a == "--drivers")
        .and_then(|i| std::env::args().nth(i + 1))
    {
        None => vec![CgroupDriver::Cgroupfs],
        Some(list) => list
            .split(',')
            .map(|d| {
                CgroupDriver::parse(d.trim())
                    .with_context(|| format!("--drivers: {d:?} is not cgroupfs or systemd"))
            })
            .collect::<anyhow::Result<_>>()?,
    };
    // `--pods N`: each mode with one pod and again with N (the growing one and N - 1 idle
    // neighbours, `enforcer_tests::neighbours`), the 1-pod rows in the same run.
    let pods = usize::try_from(arg("--pods", 1)).unwrap_or(1).max(1);
    let pod_counts: Vec<usize> = if pods > 1 { vec![1, pods] } else { vec![1] };
    if pods > 1 && drivers.contains(&CgroupDriver::Systemd) {
        bail!(
            "--pods with the systemd driver: the neighbours are laid out by the cgroupfs driver only"
        );
    }
    let mut results = Vec::new();
    let only = std::env::args()
        .position(|a| a == "--mode")
        .and_then(|i| std::env::args().nth(i + 1));
    for mode in modes {
        // `--mode a,b`: the modes whose names contain any of the comma-separated words (a
        // word `=name`: the mode of that name only).
        if only.as_deref().is_some_and(|o| {
            !o.split(',').any(|w| match w.trim().strip_prefix('=') {
                Some(exact) => mode.name.eq_ignore_ascii_case(exact),
                None => mode.name.to_lowercase().contains(&w.trim().to_lowercase()),
            })
        }) {
            continue;
        }
        for &driver in &drivers {
            for &n in &pod_counts {
                eprintln!(
                    "mode {} ({} driver, {n} pods): {trials} trials",
                    mode.name,
                    driver.as_str()
                );
                let run = Run {
                    driver,
                    label_driver: drivers.len() > 1,
                    pods: n,
                    label_pods: pod_counts.len() > 1,
                    trials,
                };
                results.push(run_mode(&mode, &run, &hog).await?);
            }
        }
    }
    println!(
        "\n### Eviction: threshold crossing -> SIGKILL / memory released, {trials} trials per mode, milliseconds (kernel {}, memory cgroup {})\n",
        enforcer_tests::kernel_release(),
        if v2 { "v2" } else { "v1" }
    );
    println!(
        "| mode | to SIGKILL p50 | p99 | max | to memory released p50 | p99 | max | released by process_mrelease | to SIGKILL p50, lost trials as lower bounds | p50 vs fastest | kernel OOM kills | neither |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|");
    // A trial lost to the OOM killer is censored: the mode's time is only known to exceed its
    // bound. The median over won times and bounds together is then a lower bound of the
    // mode's median (each trial's true time is at least its entry), written `>=`; over won
    // trials only it would be biased low (a slow mode wins only its fastest trials).
    let median = |r: &ModeResult| {
        let all: Vec<u64> = r.to_kill.iter().chain(&r.lost).copied().collect();
        pct(&all, 0.5).map(|m| (m, !r.lost.is_empty()))
    };
    let base = results
        .iter()
        .filter(|r| r.lost.is_empty())
        .filter_map(|r| pct(&r.to_kill, 0.5))
        .min();
    for r in &results {
        let (med, ratio) = match (median(r), base) {
            (Some((m, censored)), Some(b)) if b > 0 => {
                let ge = if censored { ">= " } else { "" };
                (
                    format!("{ge}{}", ms(Some(m))),
                    format!("{ge}{:.1}x", m as f64 / b as f64),
                )
            }
            (Some((m, censored)), _) => (
                format!("{}{}", if censored { ">= " } else { "" }, ms(Some(m))),
                "-".to_owned(),
            ),
            _ => ("-".to_owned(), "-".to_owned()),
        };
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {}/{} | {med} | {ratio} | {} | {} |",
            r.name,
            ms(pct(&r.to_kill, 0.5)),
            ms(pct(&r.to_kill, 0.99)),
            ms(pct(&r.to_kill, 1.0)),
            ms(pct(&r.to_free, 0.5)),
            ms(pct(&r.to_free, 0.99)),
            ms(pct(&r.to_free, 1.0)),
            r.reaped,
            r.to_free.len(),
            r.oom,
            r.neither
        );
    }
    println!(
        "\n#### How the victims ended, and the node's smallest headroom (capacity less kubepods' peak usage)\n"
    );
    println!(
        "| mode | graceful stops (SIGTERM) | SIGKILL | kernel OOM kills | minimum node headroom, MiB |"
    );
    println!("|---|---|---|---|---|");
    for r in &results {
        println!(
            "| {} | {}/{trials} | {}/{trials} | {}/{trials} | {} |",
            r.name,
            r.graceful,
            r.sigkilled,
            r.oom,
            r.headroom_min
                .map_or("-".to_owned(), |h| format!("{:.1}", h as f64 / MIB as f64))
        );
    }
    println!(
        "\n#### How far past the threshold the growth was (MiB touched past the crossing, from the growing process's quarter-MiB stamps; where the leading signal carries the watched cgroup's usage and level (a crossing record, a v1 threshold eventfd), its own figure)\n"
    );
    println!(
        "| mode | at the kernel event p50 | p99 | trials | at the SIGKILL p50 | p99 | the signal's own figure: usage past the level it watched p50, KiB | p99 | max | signals with one |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|");
    let mib =
        |v: Option<u64>| v.map_or("-".to_owned(), |b| format!("{:.2}", b as f64 / MIB as f64));
    let kib = |v: Option<u64>| v.map_or("-".to_owned(), |b| format!("{}", b >> 10));
    for r in &results {
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            mib(pct(&r.past_event, 0.5)),
            mib(pct(&r.past_event, 0.99)),
            r.past_event.len(),
            mib(pct(&r.past_kill, 0.5)),
            mib(pct(&r.past_kill, 0.99)),
            kib(pct(&r.past_level, 0.5)),
            kib(pct(&r.past_level, 0.99)),
            kib(pct(&r.past_level, 1.0)),
            r.past_level.len(),
        );
    }
    println!(
        "\n#### Where the time to SIGKILL goes (p50 of each segment over the won trials, milliseconds)\n"
    );
    println!(
        "| mode | crossing -> kernel event | -> received by the daemon | -> node and pods read | -> decided | -> SIGKILL sent | the daemon's part (received -> SIGKILL) p50 | p99 |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for r in &results {
        let col = |i: usize| {
            let v: Vec<u64> = r.segments.iter().filter_map(|s| s[i]).collect();
            ms(pct(&v, 0.5))
        };
        let daemon = daemon_part(&r.segments);
        println!(
            "| {} | {} | {} | {} | {} | {} | {} | {} |",
            r.name,
            col(0),
            col(1),
            col(2),
            col(3),
            col(4),
            ms(pct(&daemon, 0.5)),
            ms(pct(&daemon, 0.99))
        );
    }
    Ok(())
}

/// One way of learning of the crossing.
struct Mode {
    name: &'static str,
    source: SignalSource,
    housekeeping: Duration,
    /// The tripwire on kubepods (v2 `memory.high`, v1 a usage-threshold eventfd).
    tripwire: bool,
    /// What the PSI source watches (the daemon's default: triggers and `memory.events`).
    psi_watch: PsiWatch,
    /// Companion mode's configuration and manager (`enforcer::companion::adjust_config`: no
    /// tripwire, no limit written; the release is the processes being gone).
    companion: bool,
    /// Log follows (and one exec session) on the secure port during the trials
    /// (`enforcer_tests::streams::StreamLoad`); 0: none.
    streams: usize,
    /// The readers and the manager on the crossing thread (the daemon's way); false: on the
    /// harness's shared two-worker runtime.
    crossing_thread: bool,
    /// process_mrelease(2) of the victim after the SIGKILL (`reapMemory`).
    reap: bool,
    /// `throttleBeforeEvict: [memory.available]`: the victim capped, then stopped gracefully
    /// (the harness sends the SIGTERM the pod worker would).
    throttle: bool,
    /// The crossing reads the memory cgroup iterator (each pod's usage file when false).
    iterator: bool,
    /// The eBPF crossing check on the memory charge path as the tripwire (its level armed,
    /// no cgroup file written) where it may attach; `Off`: the check is not attached.
    crossing: CrossingMode,
}

impl Mode {
    fn new(
        name: &'static str,
        source: SignalSource,
        housekeeping: Duration,
        tripwire: bool,
    ) -> Self {
        Self {
            name,
            source,
            housekeeping,
            tripwire,
            psi_watch: PsiWatch::default(),
            companion: false,
            streams: 0,
            crossing_thread: true,
            reap: true,
            throttle: false,
            iterator: true,
            crossing: CrossingMode::Off,
        }
    }

    /// The eBPF crossing check on the charge path as the tripwire (nothing written), at the
    /// first point this kernel takes.
    fn checking_charges(mut self) -> Self {
        self.crossing = CrossingMode::Any;
        self
    }

    /// The same, pinned to one attach point.
    fn checking_charges_at(mut self, at: Attach) -> Self {
        self.crossing = CrossingMode::Only(at);
        self
    }

    /// The same mode, its crossings reading each pod's usage file (not the iterator).
    fn reading_files(mut self) -> Self {
        self.iterator = false;
        self
    }

    /// The same mode, throttling the victim before its graceful stop.
    fn throttling(mut self) -> Self {
        self.throttle = true;
        self
    }

    /// The same mode on the shared runtime, without the crossing thread.
    fn on_shared_runtime(mut self) -> Self {
        self.crossing_thread = false;
        self
    }

    /// The same mode without process_mrelease (the victim frees its memory as it exits).
    fn without_reaping(mut self) -> Self {
        self.reap = false;
        self
    }

    /// The same mode with `n` log follows and an exec session open on the secure port.
    fn with_streams(mut self, n: usize) -> Self {
        self.streams = n;
        self
    }

    /// The same source, run as `--companion` beside kubelet.
    fn beside_kubelet(mut self) -> Self {
        self.companion = true;
        self.tripwire = false;
        self
    }

    /// The PSI trigger alone, without `memory.events`.
    fn without_memory_events(mut self) -> Self {
        self.psi_watch = PsiWatch::Triggers;
        self
    }
}

fn ms(v: Option<u64>) -> String {
    v.map_or("-".to_owned(), |ns| format!("{:.2}", ns as f64 / 1e6))
}

/// The chain's segments the second table splits the time to SIGKILL into.
const SEGMENTS: usize = 5;

/// The latest kill record of `uid` (read once a trial is over).
fn latest_record(state: &std::path::Path, uid: &str) -> Option<enforcer::kills::KillRecord> {
    let (records, _) = enforcer::kills::read(state).ok()?;
    records.into_iter().rev().find(|r| r.uid == uid)
}

/// Per won trial with a kernel signal, the daemon's own part: from the signal's receipt to
/// the SIGKILL (the segments after "received", each measured from the one before).
fn daemon_part(segments: &[[Option<u64>; SEGMENTS]]) -> Vec<u64> {
    segments
        .iter()
        .filter(|s| s[1].is_some() && s[SEGMENTS - 1].is_some())
        .map(|s| s[2..].iter().flatten().sum())
        .collect()
}

/// The segments of a kill record, from the crossing at `crossing`.
fn segments(r: Option<&enforcer::kills::KillRecord>, crossing: u64) -> [Option<u64>; SEGMENTS] {
    let Some(r) = r else {
        return [None; SEGMENTS];
    };
    let t = r.trigger.as_ref();
    let kernel = t.and_then(|t| t.kernel_ns);
    let received = t.map(|t| t.received_ns);
    let mut out = [None; SEGMENTS];
    let mut prev = Some(crossing);
    for (i, at) in [kernel, received, r.observed_ns, r.decision_ns, r.sigkill_ns]
        .into_iter()
        .enumerate()
    {
        if let (Some(a), Some(p)) = (at, prev) {
            // A signal that came before the crossing (an earlier one the step acted on) counts
            // as no time.
            out[i] = Some(a.saturating_sub(p));
        }
        if at.is_some() {
            prev = at;
        }
    }
    out
}

/// The KiB the growing process had touched by `at` (its latest stamp at or before it).
fn kib_touched_by(stamps: &[(u64, u64)], at: u64) -> u64 {
    stamps
        .iter()
        .filter(|(_, t)| *t <= at)
        .map(|(kib, _)| *kib)
        .max()
        .unwrap_or(0)
}

fn pct(v: &[u64], q: f64) -> Option<u64> {
    if v.is_empty() {
        return None;
    }
    let mut v = v.to_vec();
    v.sort_unstable();
    Some(v[((v.len() - 1) as f64 * q).round() as usize])
}

/// The systemd slices of one mode's run, stopped at its end (the root slice with
/// everything below it).
struct Slices {
    kubepods: Kubepods,
    root: String,
}

impl Drop for Slices {
    fn drop(&mut self) {
        let root = CgroupName::from_cgroupfs(&self.root);
        if let Err(e) = self.kubepods.manager().destroy(&root) {
            eprintln!("stopping the slice of {}: {e}", self.root);
        }
    }
}

/// One mode's run: the driver laying out the pods, how many pods, the trials.
struct Run {
    driver: CgroupDriver,
    label_driver: bool,
    /// The growing pod and `pods - 1` idle neighbours.
    pods: usize,
    label_pods: bool,
    trials: u64,
}

async fn run_mode(mode: &Mode, run: &Run, hog: &std::path::Path) -> anyhow::Result<ModeResult> {
    let load = if mode.streams > 0 {
        Some(enforcer_tests::streams::StreamLoad::start(mode.streams).await?)
    } else {
        None
    };
    let result = run_mode_inner(mode, run, hog).await;
    if let Some(l) = load {
        eprintln!(
            "stream clients received {} bytes during the trials",
            l.received.load(std::sync::atomic::Ordering::Relaxed)
        );
        l.stop().await;
    }
    result
}

async fn run_mode_inner(
    mode: &Mode,
    run: &Run,
    hog: &std::path::Path,
) -> anyhow::Result<ModeResult> {
    let (source, housekeeping) = (mode.source, mode.housekeeping);
    let (driver, trials) = (run.driver, run.trials);
    let mut name = mode.name.to_owned();
    if run.label_driver {
        name = format!("{name} ({} driver)", driver.as_str());
    }
    if run.label_pods {
        name = format!(
            "{name}, {} pod{}",
            run.pods,
            if run.pods == 1 { "" } else { "s" }
        );
    }
    let l = layout();
    let caps = Capabilities::probe(&l);
    let (mem_mount, version) = l.controller("memory").context("memory controller")?;
    // The kill records (`enforcer why`): where each trial's time went.
    let state = tempfile::tempdir().context("state directory")?;
    let root = format!("/{}", unique_name("bench-evict"));
    let v1 = version == enforcer::cgroup::CgroupVersion::V1;
    // kubepods limited to the node's capacity: a directory (cgroupfs), or a slice with
    // MemoryMax (systemd).
    let (_kubepods_cgroup, slices) = match driver {
        CgroupDriver::Cgroupfs => {
            let kubepods = TestCgroup::create(mem_mount, &format!("{root}/kubepods"));
            kubepods.write(
                if v1 {
                    "memory.limit_in_bytes"
                } else {
                    "memory.max"
                },
                &(CAPACITY_MIB * MIB).to_string(),
            );
            // Its children (the QoS tiers) get the memory controller's files on v2, as the
            // daemon's cgroup manager gives them.
            enforcer_tests::enable_subtree_controllers(&kubepods.dir);
            (Some(kubepods), None)
        }
        CgroupDriver::Systemd => {
            let k = Kubepods::for_driver(&root, l.clone(), CgroupDriver::Systemd)?;
            k.apply(
                &cgroup_name::kubepods(&root),
                &CgroupValues {
                    memory_limit: Some(Some(i64::try_from(CAPACITY_MIB * MIB)?)),
                    ..CgroupValues::default()
                },
            )?;
            (
                None,
                Some(Slices {
                    kubepods: k,
                    root: root.clone(),
                }),
            )
        }
    };
    let kubepods_rel = driver.name(&cgroup_name::kubepods(&root));
    let kubepods_dir = mem_mount.join(kubepods_rel.trim_start_matches('/'));
    // The node's headroom over the mode: kubepods' peak usage (v1: reset now; v2: a new
    // cgroup's `memory.peak`).
    if v1 {
        let _ = std::fs::write(kubepods_dir.join("memory.max_usage_in_bytes"), "0");
    }

    let args = ConfigArgs {
        eviction_hard: vec![format!("memory.available<{THRESHOLD_MIB}Mi")],
        node_capacity: vec![format!("memory={CAPACITY_MIB}Mi")],
        cgroup_root: Some(root.clone()),
        housekeeping_interval: Some(format!("{}s", housekeeping.as_secs())),
        http_address: Some("127.0.0.1:0".into()),
        state_dir: Some(state.path().to_path_buf()),
        reap_memory: Some(mode.reap),
        throttle_before_evict: if mode.throttle {
            vec!["memory.available".to_owned()]
        } else {
            Vec::new()
        },
        ..ConfigArgs::default()
    };
    let config = enforcer::config::load(&args)
        .context("configuration")?
        .config;
    let config = if mode.companion {
        enforcer::companion::adjust_config(config, false)
            .context("companion configuration")?
            .0
    } else {
        config
    };
    let observer = NodeObserver {
        layout: l.clone(),
        kubepods: kubepods_rel.clone(),
        memory_capacity: i64::try_from(CAPACITY_MIB * MIB)?,
        capacity_override: true,
        kubepods_memory_limit: i64::try_from(CAPACITY_MIB * MIB)?,
        nodefs: "/".into(),
        imagefs: None,
        pid_capacity: None,
    };
    let choice = match source {
        SignalSource::Ebpf => SourceChoice::Only(SourceKind::Ebpf),
        SignalSource::Eventfd => SourceChoice::Only(SourceKind::Eventfd),
        SignalSource::Psi => SourceChoice::Only(SourceKind::Psi),
        _ => SourceChoice::Only(SourceKind::Poll),
    };
    let threshold_usage = (CAPACITY_MIB - THRESHOLD_MIB) * MIB;
    let opts = PipelineOptions {
        source: choice,
        watches: vec![Watch {
            cgroup: kubepods_dir.clone(),
            threshold_bytes: Some(threshold_usage),
        }],
        poll_interval: housekeeping,
        psi_watch: mode.psi_watch,
        crossing: mode.crossing,
        ..PipelineOptions::default()
    };
    // As the daemon runs them: the pipeline's readers and the manager on the crossing thread
    // (real-time where allowed); `shared runtime` modes: on this runtime's two workers, as
    // before the crossing thread.
    let (pipeline, crossing, charge_check, pipeline_stats) = if mode.crossing_thread {
        let (info, runner) = enforcer::eviction_manager::thread::start(opts, caps, l.clone(), true)
            .await
            .context("the crossing thread")?;
        eprintln!("  crossing thread: {}", info.scheduling);
        (None, Some(runner), info.crossing, info.stats)
    } else {
        let p = kernel::start(&opts, &caps, &l)?;
        let (c, st) = (p.crossing.clone(), p.stats.clone());
        (Some(p), None, c, st)
    };
    // The pipeline's counters, for a trial the crossing check did not lead: (decoded,
    // dropped by a full channel, lost to a full ring, crossing checks).
    let counters = || {
        use std::sync::atomic::Ordering::Relaxed;
        let st = &pipeline_stats;
        [
            st.decoded.load(Relaxed),
            st.dropped.load(Relaxed),
            st.kernel_ring_full.load(Relaxed),
            st.crossing_checks.load(Relaxed),
        ]
    };
    if let Some(c) = &charge_check.choice {
        eprintln!("  crossing check: {}", c.summary());
    }
    anyhow::ensure!(
        mode.crossing == CrossingMode::Off || charge_check.levels.is_some(),
        "the crossing check did not attach on this kernel"
    );
    let link = NodeLink::default();
    let status = StatusManager::default();
    // Dropped before the kubepods cgroup above (declared after it).
    let _neighbours = enforcer_tests::neighbours::Neighbours::start(
        run.pods.saturating_sub(1),
        &root,
        mem_mount,
        hog,
        &link,
        &status,
    )?;
    let manager = EvictionManager {
        config,
        layout: observer.layout.clone(),
        cgroups: Arc::new(enforcer::cgroup::writer::KernelCgroups),
        // As the daemon: the crossing check's level where it attached (nothing written, so
        // also beside kubelet), else the tripwire file where the mode has one.
        tripwire: (mode.tripwire || charge_check.levels.is_some()).then(|| {
            enforcer::eviction_manager::TripwireCgroup::new(
                kubepods_dir.clone(),
                mem_mount.to_path_buf(),
                if enforcer_tests::memory_is_v2() {
                    enforcer::eviction_manager::TripwireHow::MemoryHigh
                } else {
                    enforcer::eviction_manager::TripwireHow::UsageEventfd
                },
                charge_check.levels.clone(),
            )
        }),
        stats: enforcer::stats::StatsCollector::spawn_with(observer, mode.iterator)?,
        link: link.clone(),
        status,
        housekeeping,
        node_reclaim: None,
        image_gc: None,
        health: std::sync::Arc::default(),
        events: enforcer::recorder::Recorder::default(),
        companion: mode.companion,
    };
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let stop = async {
        let _ = stop_rx.await;
    };
    let task = match (pipeline, crossing) {
        (Some(p), _) => tokio::spawn(manager.run(p, stop)),
        (None, Some(runner)) => tokio::spawn(runner.run(manager, stop)),
        (None, None) => bail!("no pipeline"),
    };

    let mut res = ModeResult {
        name,
        to_kill: Vec::new(),
        to_free: Vec::new(),
        oom: 0,
        neither: 0,
        reaped: 0,
        graceful: 0,
        sigkilled: 0,
        headroom_min: None,
        lost: Vec::new(),
        segments: Vec::new(),
        past_event: Vec::new(),
        past_kill: Vec::new(),
        past_level: Vec::new(),
    };
    for trial in 0..trials {
        // A new pod each trial, as a new BestEffort pod would be (the manager waits for an
        // evicted pod's cleanup before evicting again, kubelet's rule).
        let uid = format!("bbbbbbbb-0000-0000-0000-{trial:012}");
        let pod_name = cgroup_name::pod(&root, QosClass::BestEffort, &uid)?;
        let pod_rel = driver.name(&pod_name);
        let pod = Arc::new(enforcer_tests::besteffort_pod("hog", &uid));
        // The container: a directory (cgroupfs), or a real scope the process is started in
        // (`systemd-run --scope`, as runc makes `cri-containerd-<id>.scope`).
        let (ctr, mut cmd, ctr_dir) = match &slices {
            None => {
                let ctr = TestCgroup::create(mem_mount, &format!("{pod_rel}/ctr"));
                let dir = ctr.dir.clone();
                (Some(ctr), Command::new(hog), dir)
            }
            Some(s) => {
                s.kubepods.apply(&pod_name, &CgroupValues::default())?;
                let scope = format!("cri-containerd-bench{trial}.scope");
                let mut cmd = Command::new("systemd-run");
                cmd.args(["--scope", "--quiet", "--collect"])
                    .arg(format!("--slice={}", pod_name.systemd_unit()))
                    .arg(format!("--unit={scope}"))
                    .arg("--")
                    .arg(hog);
                let dir = mem_mount.join(pod_rel.trim_start_matches('/')).join(scope);
                (None, cmd, dir)
            }
        };
        let _ = link.take_evictions();
        link.set_active(&uid, ActiveEntry::new(pod.clone(), pod_rel.clone()));
        let ooms = enforcer_tests::oom_kills_in(&kubepods_dir);
        // Grow fast to 40 MiB under the threshold (what the neighbours hold counted), then
        // 1 MiB per ms (with the page faults, about 100-200 MiB/s) up to 600 MiB: past the
        // limit if nothing acts.
        let others =
            u64::try_from(enforcer::node::working_set(&kubepods_dir).unwrap_or(0)).unwrap_or(0);
        let fast = (threshold_usage.saturating_sub(others) / MIB).saturating_sub(40);
        cmd.args(["--report", &fast.to_string(), "600", "1000"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = match &ctr {
            Some(ctr) => spawn_in(cmd, &[ctr.dir.as_path()]),
            None => cmd.spawn().context("systemd-run --scope")?,
        };
        // What is charged before the process grows (its binary and stack), as the eviction
        // manager measures it: the working set.
        tokio::time::sleep(Duration::from_millis(50)).await;
        let baseline =
            u64::try_from(enforcer::node::working_set(&kubepods_dir).unwrap_or(0)).unwrap_or(0);
        // The crossing check's level as the growth begins (a trial it does not lead says
        // whether it was armed, and where).
        let level_at_start = charge_check.levels.as_ref().and_then(|l| l.current().ok());
        let counters_at_start = counters();
        // The stamps are read once the process is gone: they fit in the pipe (at most ~920
        // lines, 17 KB), so no reader wakes up at every MiB during the measurement.
        let Some(out) = child.stdout.take() else {
            let _ = child.kill();
            let _ = child.wait();
            bail!("the hog has no stdout");
        };
        if let Some(stdin) = child.stdin.as_mut()
            && let Err(e) = stdin.write_all(b"go\n")
        {
            let _ = child.kill();
            let _ = child.wait();
            return Err(e.into());
        }
        // The exit is awaited by a thread blocked in waitpid (no polling beside the measured
        // path: the guest has 2 CPUs, and every wakeup of the harness competes with the
        // daemon's); after 30 s the process is killed.
        let pid = child.id();
        let (exited_tx, exited_rx) = tokio::sync::oneshot::channel();
        // The waiter returns the exit status and the stamps, `(KiB, monotonic ns)`.
        let waiter = std::thread::spawn(move || {
            let st = child.wait().ok();
            let _ = exited_tx.send(monotonic_ns());
            let stamps: Vec<(u64, u64)> = BufReader::new(out)
                .lines()
                .map_while(Result::ok)
                .filter_map(|line| {
                    let mut f = line.split_whitespace();
                    Some((f.next()?.parse().ok()?, f.next()?.parse().ok()?))
                })
                .collect();
            (st, stamps)
        });
        // What the pod worker does with an eviction without SIGKILL (a graceful stop): its
        // SIGTERM, sent here to the growing process; every eviction is kept for the trial.
        let taken: Arc<std::sync::Mutex<Vec<enforcer::pods::Evict>>> = Arc::default();
        let watcher = {
            let (link, taken) = (link.clone(), taken.clone());
            tokio::spawn(async move {
                loop {
                    link.evictions_pending().await;
                    for e in link.take_evictions() {
                        if e.sigkill_ns.is_none()
                            && let Ok(p) = i32::try_from(pid)
                            && let Some(p) = rustix::process::Pid::from_raw(p)
                        {
                            let _ = rustix::process::kill_process(p, rustix::process::Signal::TERM);
                        }
                        if let Ok(mut t) = taken.lock() {
                            t.push(e);
                        }
                    }
                }
            })
        };
        let mut exited_rx = exited_rx;
        let freed_ns = match tokio::time::timeout(Duration::from_secs(30), &mut exited_rx).await {
            Ok(Ok(at)) => at,
            _ => {
                if let Ok(p) = i32::try_from(pid)
                    && let Some(p) = rustix::process::Pid::from_raw(p)
                {
                    let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
                }
                exited_rx.await.unwrap_or_else(|_| monotonic_ns())
            }
        };
        let (status, stamps) = waiter.join().unwrap_or_default();
        let exit = status.map(|st| format!("{st:?}")).unwrap_or_default();
        watcher.abort();
        let mut evictions = taken
            .lock()
            .map(|mut t| std::mem::take(&mut *t))
            .unwrap_or_default();
        evictions.extend(link.take_evictions());
        // The eviction is recorded once its step is done (after process_mrelease returns),
        // which can be after the victim's exit was seen: wait a moment for it.
        for _ in 0..20 {
            if !evictions.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
            evictions.extend(link.take_evictions());
        }
        {
            use std::os::unix::process::ExitStatusExt as _;
            match status.and_then(|st| st.signal()) {
                Some(15) => res.graceful += 1,
                Some(9) if !evictions.is_empty() => res.sigkilled += 1,
                _ => {}
            }
        }
        // On cgroup v1 the kill is counted in the victim's own memory cgroup, on v2 also up
        // the tree: look at both.
        let oom = enforcer_tests::oom_kills_in(&kubepods_dir) > ooms
            || enforcer_tests::oom_kills_in(&ctr_dir) > 0;
        // The MiB at which the working set crossed the threshold (the baseline is what was
        // charged before the process grew: its binary, stack and the fast part).
        // The growth is known quarter MiB by quarter MiB (the process's stamps); what else is charged (its
        // binary, page tables, the kernel's charge batching) is taken from the eviction
        // decision itself: the working set it observed minus the MiB touched when its read
        // began (the kill record's `observe_ns`; touched by the SIGKILL where a record lacks
        // it: that counts the growth during the step as overhead and places the crossing
        // late). MiB touched during the read count as overhead: the crossing is placed no
        // later than it was.
        let record = latest_record(state.path(), &uid);
        let observed_at = record.as_ref().and_then(|r| r.observe_ns);
        let decided = evictions.iter().find_map(|e| {
            let avail = e.message.split("available: ").nth(1)?.split(". ").next()?;
            let avail = enforcer::quantity::Quantity::parse(avail.trim())
                .ok()?
                .value();
            Some((
                observed_at.or(e.sigkill_ns)?,
                CAPACITY_MIB * MIB - u64::try_from(avail).ok()?,
            ))
        });
        let overhead = match decided {
            Some((k, ws)) => ws.saturating_sub(kib_touched_by(&stamps, k) * 1024),
            None => baseline,
        };
        let crossing = stamps
            .iter()
            .find(|(kib, _)| overhead + kib * 1024 > threshold_usage)
            .map(|(_, t)| *t);
        match (evictions.iter().find_map(|e| e.sigkill_ns), crossing, oom) {
            // A graceful stop (throttle modes): no SIGKILL sent with the eviction.
            (None, _, false) if !evictions.is_empty() => {
                eprintln!(
                    "  trial {trial}: capped, then stopped gracefully (exit {exit}, grace {:?} s)",
                    evictions.first().map(|e| e.grace_seconds)
                );
            }
            (Some(k), Some(c), false) => {
                res.to_kill.push(k.saturating_sub(c));
                if let Some(l) = level_at_start.filter(|_| {
                    record
                        .as_ref()
                        .and_then(|r| r.trigger.as_ref())
                        .is_none_or(|t| t.usage_bytes.is_none())
                }) {
                    // The kernel's counters are read every second.
                    tokio::time::sleep(Duration::from_millis(1100)).await;
                    let now = counters();
                    let after = charge_check.levels.as_ref().and_then(|l| l.current().ok());
                    eprintln!(
                        "  trial {trial}: not led by a crossing record; the level as the growth began: armed {}, seq {}, at {} MiB (threshold at {} MiB of usage), trigger {:?}; since: decoded {}, dropped {}, ring full {}, crossing checks {}; the level now: {after:?}",
                        l.armed,
                        l.seq,
                        l.pages * rustix::param::page_size() as u64 / MIB,
                        threshold_usage / MIB,
                        record
                            .as_ref()
                            .and_then(|r| r.trigger.as_ref())
                            .map(|t| (&t.kind, &t.source)),
                        now[0] - counters_at_start[0],
                        now[1] - counters_at_start[1],
                        now[2] - counters_at_start[2],
                        now[3] - counters_at_start[3],
                    );
                }
                // Released: reclaimed by process_mrelease (the kill record's time) or freed
                // by the exit, whichever came first.
                let reaped = record.as_ref().and_then(|r| r.reaped_ns);
                let freed_ns = match reaped {
                    Some(r) if r < freed_ns => {
                        res.reaped += 1;
                        r
                    }
                    _ => freed_ns,
                };
                res.to_free.push(freed_ns.saturating_sub(c));
                let seg = segments(record.as_ref(), c);
                res.segments.push(seg);
                // How far past the threshold the growth was at the kernel event and at the
                // SIGKILL (the stamps' quarter MiB), and the crossing record's own figure.
                let touched = |at: u64| {
                    (overhead + kib_touched_by(&stamps, at) * 1024).saturating_sub(threshold_usage)
                };
                let trigger = record.as_ref().and_then(|r| r.trigger.as_ref());
                if let Some(e) = trigger.and_then(|t| t.kernel_ns) {
                    res.past_event.push(touched(e));
                }
                res.past_kill.push(touched(k));
                if let Some((u, l)) = trigger.and_then(|t| t.usage_bytes.zip(t.threshold_bytes)) {
                    res.past_level.push(u.saturating_sub(l));
                }
                eprintln!(
                    "  trial {trial}: crossing at monotonic {c} ns; SIGKILL {:.3} ms after it, memory freed at {:.3} ms (kernel event {}, received {}, read {}, decided {}, SIGKILL {} ms after the step before)",
                    (k.saturating_sub(c)) as f64 / 1e6,
                    (freed_ns.saturating_sub(c)) as f64 / 1e6,
                    ms(seg[0]),
                    ms(seg[1]),
                    ms(seg[2]),
                    ms(seg[3]),
                    ms(seg[4]),
                );
            }
            (k, Some(c), true) => {
                res.oom += 1;
                let last = stamps.iter().map(|(_, t)| *t).max().unwrap_or(c);
                let bound = k.unwrap_or(last).saturating_sub(c);
                res.lost.push(bound);
                eprintln!(
                    "  trial {trial}: kernel OOM kill (the mode had not acted {:.3} ms after the crossing; the crossing level as the growth began: {level_at_start:?})",
                    bound as f64 / 1e6
                );
            }
            (_, None, true) => {
                res.oom += 1;
                eprintln!("  trial {trial}: kernel OOM kill (no crossing stamp)");
            }
            _ => {
                res.neither += 1;
                eprintln!(
                    "  trial {trial}: no eviction and no OOM kill (crossing seen: {}, evictions {:?}, exit {exit}, stamps {})",
                    crossing.is_some(),
                    evictions,
                    stamps.len()
                );
            }
        }
        drop(ctr);
        if let Some(s) = &slices {
            s.kubepods.manager().destroy(&pod_name)?;
        }
        // What the runtime loop and the pod worker do for an evicted pod (there is no runtime
        // here): it leaves the active set, and once its process is reaped and its cgroup
        // removed its eviction is answered (released), which ends the manager's cleanup wait (kubelet's
        // waitForPodsCleanup) so the next trial's pod can be evicted.
        link.remove_active(&uid);
        for e in &mut evictions {
            if let Some(c) = e.completed.take() {
                c.complete(enforcer::pods::KillDone {
                    stopped_ns: Some(monotonic_ns()),
                });
            }
        }
        // Let the manager see the node recover before the next trial.
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let peak = std::fs::read_to_string(kubepods_dir.join(if v1 {
        "memory.max_usage_in_bytes"
    } else {
        "memory.peak"
    }))
    .ok()
    .and_then(|t| t.trim().parse::<u64>().ok());
    res.headroom_min = peak.map(|p| (CAPACITY_MIB * MIB).saturating_sub(p));
    let _ = stop_tx.send(());
    let _ = task.await;
    Ok(res)
}
