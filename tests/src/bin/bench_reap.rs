//! `cargo xtask bench reap`: how soon a SIGKILLed victim's memory is back, against the
//! physical limit measured in the same run. A victim (one process in a cgroup of its own)
//! touches `--sizes` MiB of anonymous memory in 4 KiB pages and holds it; then it is SIGKILLed
//! and its memory is back when its cgroup's usage has fallen by all but 1 % of it. Modes,
//! alternated `--rounds` times:
//! - `munmap` (the physical limit): this process unmaps the same amount of touched memory;
//! - the victim's own exit frees it (no `process_mrelease`);
//! - `process_mrelease(2)` on the killing thread (`enforcer::cgroup::kill::reap_dir`: the
//!   crossing thread's reaping before the reaper);
//! - the reaper's threads (`enforcer::cgroup::reaper::Reaper`, what the eviction manager does):
//!   the killing thread hands the pidfds over and is free.
//!
//! As in the daemon, the killing thread runs at the crossing thread's real-time priority
//! (SCHED_FIFO, when allowed) and the reaper's threads inherit it; the victim does not.
//! `--busy`: the kills happen with every CPU kept busy by spinning threads of ordinary
//! priority (a loaded node, where the victim waits for a CPU to run its own exit); the munmap
//! baseline is always measured on an idle machine.
//!
//! Prints, per size and mode, kill -> released (median, min, max, ratio to `munmap`) and how
//! long the killing thread was busy after the SIGKILL. Needs root.

use std::{
    io::{BufRead as _, BufReader, Write as _},
    path::PathBuf,
    process::{Child, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use enforcer::cgroup::{kill::reap_dir, reaper::Reaper};
use enforcer_tests::{TestCgroup, layout, require_root, spawn_in, unique_name};

const MIB: u64 = 1 << 20;
const PAGE: usize = 4096;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Munmap,
    Exit,
    Inline,
    Reaper,
}

impl Mode {
    const ALL: [Self; 4] = [Self::Munmap, Self::Exit, Self::Inline, Self::Reaper];

    fn name(self) -> &'static str {
        match self {
            Self::Munmap => "munmap of the same touched memory (physical limit)",
            Self::Exit => "the victim's own exit (no process_mrelease)",
            Self::Inline => "process_mrelease on the killing thread",
            Self::Reaper => "the reaper's threads (process_mrelease, the exit at nice -20)",
        }
    }
}

fn memhog() -> PathBuf {
    std::env::current_exe()
        .unwrap_or_default()
        .with_file_name("memhog")
}

/// The cgroup's memory usage (bytes).
fn usage(cg: &TestCgroup) -> u64 {
    let read = |f: &str| std::fs::read_to_string(cg.dir.join(f)).ok();
    read("memory.usage_in_bytes")
        .or_else(|| read("memory.current"))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// A victim in `cg` holding `mib` MiB touched: returned once it has touched all of it.
fn victim(cg: &TestCgroup, mib: u64) -> anyhow::Result<Child> {
    let mut c = std::process::Command::new(memhog());
    // `--report`: waits for a line, touches all but the last MiB at once, reports each
    // quarter of the last, then holds until killed.
    c.args([
        "--report".to_owned(),
        (mib - 1).to_string(),
        mib.to_string(),
        "0".to_owned(),
    ]);
    c.stdin(Stdio::piped()).stdout(Stdio::piped());
    let mut child = spawn_in(c, &[cg.dir.as_path()]);
    match ready(&mut child, mib) {
        Ok(()) => Ok(child),
        Err(e) => {
            let _ = child.kill();
            let _ = child.wait();
            Err(e)
        }
    }
}

/// The victim set to ordinary priority, told to go, and read until it has touched `mib` MiB.
fn ready(child: &mut Child, mib: u64) -> anyhow::Result<()> {
    // Ordinary priority, as a pod's processes (it inherited this thread's real-time policy).
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sets the scheduling policy of the child just spawned, by its pid; `param`
    // outlives the call.
    if unsafe { libc::sched_setscheduler(i32::try_from(child.id())?, libc::SCHED_OTHER, &param) }
        != 0
    {
        bail!("the victim's policy: {}", std::io::Error::last_os_error());
    }
    child
        .stdin
        .as_mut()
        .context("the victim's stdin")?
        .write_all(b"go\n")?;
    let out = child.stdout.take().context("the victim's stdout")?;
    let want = mib * 1024;
    for line in BufReader::new(out).lines() {
        let line = line?;
        let kib: u64 = line
            .split_whitespace()
            .next()
            .and_then(|k| k.parse().ok())
            .unwrap_or(0);
        if kib >= want {
            return Ok(());
        }
    }
    bail!("the victim ended before touching {mib} MiB")
}

/// `munmap` of `mib` MiB this process touched: its duration.
fn munmap_trial(mib: u64) -> anyhow::Result<Duration> {
    let len = usize::try_from(mib * MIB)?;
    // SAFETY: a fresh private anonymous mapping of `len` bytes, written only inside its
    // bounds below and unmapped once, by this function alone.
    unsafe {
        let p = libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        );
        if p == libc::MAP_FAILED {
            bail!("mmap: {}", std::io::Error::last_os_error());
        }
        let base = p.cast::<u8>();
        for off in (0..len).step_by(PAGE) {
            base.add(off).write_volatile(1);
        }
        let t = Instant::now();
        if libc::munmap(p, len) != 0 {
            bail!("munmap: {}", std::io::Error::last_os_error());
        }
        Ok(t.elapsed())
    }
}

/// One kill: (kill -> released, the killing thread's time after the SIGKILL).
fn kill_trial(
    mode: Mode,
    mib: u64,
    cg: &TestCgroup,
    reaper: &Reaper,
    mut child: Child,
) -> anyhow::Result<(Duration, Duration)> {
    let held = usage(cg);
    // What stays charged after the exit (the binary's page cache): all but the touched MiB.
    let rest = held.saturating_sub(mib * MIB);
    let released_at = rest + mib * MIB / 100;
    let pid =
        rustix::process::Pid::from_raw(i32::try_from(child.id())?).context("the victim's pid")?;
    let kill = || rustix::process::kill_process(pid, rustix::process::Signal::KILL);
    let t0 = Instant::now();
    match mode {
        Mode::Inline => {
            kill()?;
            let r = reap_dir(&cg.dir);
            if r.processes == 0 {
                eprintln!("  (the exit was first: {r})");
            }
        }
        // The daemon's order: the threads handed the pidfds, then the SIGKILL.
        Mode::Reaper => reaper.reap_around(&cg.dir, kill, |r, _| {
            if r.processes == 0 {
                eprintln!("  (the exit was first: {r})");
            }
        })?,
        Mode::Exit | Mode::Munmap => kill()?,
    }
    let busy = t0.elapsed();
    let deadline = t0 + Duration::from_secs(60);
    while usage(cg) > released_at {
        if Instant::now() > deadline {
            bail!("{mib} MiB not released within 60 s");
        }
        std::thread::sleep(Duration::from_micros(50));
    }
    let released = t0.elapsed();
    let _ = child.wait();
    Ok((released, busy))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn main() -> anyhow::Result<()> {
    require_root();
    if !memhog().exists() {
        bail!(
            "{} is missing: build the enforcer-tests binaries first",
            memhog().display()
        );
    }
    let rounds = enforcer_tests::arg_u64("--rounds", 5);
    let sizes: Vec<u64> = std::env::args()
        .skip_while(|a| a != "--sizes")
        .nth(1)
        .unwrap_or_else(|| "1024,4096".to_owned())
        .split(',')
        .map(|s| s.trim().parse().context("--sizes: MiB, comma separated"))
        .collect::<anyhow::Result<_>>()?;
    let l = layout();
    let (mount, _) = l.controller("memory").context("a memory controller")?;
    let name = unique_name("reap");
    let cg = TestCgroup::create(mount, &name);
    let realtime = enforcer::kernel::realtime::make_realtime(enforcer::kernel::realtime::PRIORITY);
    if let Err(e) = &realtime {
        eprintln!("the killing thread stays at ordinary priority: {e}");
    }
    let reaper = Reaper::start(enforcer::cgroup::reaper::THREADS);
    let busy_node = std::env::args().any(|a| a == "--busy");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let spin = |on: bool| -> Vec<std::thread::JoinHandle<()>> {
        if !on {
            return Vec::new();
        }
        stop.store(false, std::sync::atomic::Ordering::Relaxed);
        (0..cpus)
            .map(|_| {
                let stop = std::sync::Arc::clone(&stop);
                std::thread::spawn(move || {
                    // Ordinary priority, whatever the spawning thread runs at.
                    let _ = enforcer::kernel::realtime::make_normal();
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        std::hint::spin_loop();
                    }
                })
            })
            .collect()
    };
    // (size, mode) -> released ms, busy ms
    let mut released = vec![vec![Vec::new(); Mode::ALL.len()]; sizes.len()];
    let mut busy = vec![vec![Vec::new(); Mode::ALL.len()]; sizes.len()];
    for r in 0..rounds {
        for (si, &mib) in sizes.iter().enumerate() {
            for (mi, &m) in Mode::ALL.iter().enumerate() {
                let (rel, b) = if m == Mode::Munmap {
                    let d = munmap_trial(mib)?;
                    (d, d)
                } else {
                    // The victim touches its memory on an idle machine; the spinners start
                    // before the kill.
                    let child = victim(&cg, mib)?;
                    let spinners = spin(busy_node);
                    std::thread::sleep(Duration::from_millis(20));
                    let r = kill_trial(m, mib, &cg, &reaper, child);
                    stop.store(true, std::sync::atomic::Ordering::Relaxed);
                    for h in spinners {
                        let _ = h.join();
                    }
                    r?
                };
                eprintln!(
                    "round {}: {mib} MiB: {}: released {:.1} ms, killing thread busy {:.3} ms",
                    r + 1,
                    m.name(),
                    ms(rel),
                    ms(b)
                );
                released[si][mi].push(ms(rel));
                busy[si][mi].push(ms(b));
            }
        }
    }
    drop(reaper);
    let kernel = enforcer_tests::kernel_release();
    println!(
        "\n### Kill -> memory released, {rounds} rounds alternated (kernel {kernel}, {cpus} CPUs{}{})\n",
        if busy_node {
            ", every CPU busy at the kill"
        } else {
            ", idle"
        },
        if realtime.is_ok() {
            ", killing and reaping threads SCHED_FIFO"
        } else {
            ""
        }
    );
    println!(
        "| victim | how its memory comes back | kill -> released, median ms | min | max | vs munmap | killing thread busy, median ms |"
    );
    println!("|---|---|---|---|---|---|---|");
    for (si, &mib) in sizes.iter().enumerate() {
        let base = median(released[si][0].clone());
        for (mi, m) in Mode::ALL.iter().enumerate() {
            let v = &released[si][mi];
            let min = v.iter().copied().fold(f64::INFINITY, f64::min);
            let max = v.iter().copied().fold(0.0, f64::max);
            let med = median(v.clone());
            let busy = if *m == Mode::Munmap {
                "-".to_owned()
            } else {
                format!("{:.3}", median(busy[si][mi].clone()))
            };
            println!(
                "| {} GiB | {} | {med:.1} | {min:.1} | {max:.1} | {:.2}x | {busy} |",
                mib as f64 / 1024.0,
                m.name(),
                med / base,
            );
        }
    }
    Ok(())
}
