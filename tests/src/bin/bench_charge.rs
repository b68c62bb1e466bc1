//! `cargo xtask bench charge`: what the crossing check on the charge path costs a memory
//! charge. Two processes at once each touch `--mib` MiB of fresh anonymous memory, 4 KiB page
//! by page, in a pod cgroup below a watched `kubepods` (no limit: no reclaim), with the
//! eBPF pipeline running and the check
//! - not attached (the baseline),
//! - attached, disarmed (a map lookup per charge),
//! - attached and armed far above the usage (every charge runs the whole check: the lookup,
//!   the read of kubepods' page counter, the comparison),
//!
//! the three alternated `--rounds` times in one run. Prints nanoseconds per page (wall time
//! of the two processes over the pages one touched) and each mode's ratio to the baseline.
//!
//! Needs root.

use std::{
    path::PathBuf,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use enforcer::{
    kernel::{self, Capabilities, CrossingMode, PipelineOptions, SourceChoice, crossing::Attach},
    signal::SourceKind,
};
use enforcer_tests::{TestCgroup, layout, require_root, spawn_in, unique_name};

const MIB: u64 = 1 << 20;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Mode {
    Detached,
    Disarmed,
    Armed,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Self::Detached => "check not attached (baseline)",
            Self::Disarmed => "check attached, disarmed",
            Self::Armed => "check attached and armed (every charge checked)",
        }
    }
}

fn memhog() -> PathBuf {
    std::env::current_exe()
        .unwrap_or_default()
        .with_file_name("memhog")
}

/// One trial: the pipeline in `mode`, two hogs of `mib` MiB at once; the wall time and the
/// checks the kernel counted.
async fn trial(
    mode: Mode,
    attach: Option<Attach>,
    mib: u64,
    pod: &TestCgroup,
    watched: &TestCgroup,
) -> anyhow::Result<(Duration, u64, Option<Attach>)> {
    let l = layout();
    let caps = Capabilities::probe(&l);
    let opts = PipelineOptions {
        source: SourceChoice::Only(SourceKind::Ebpf),
        crossing: if mode == Mode::Detached {
            CrossingMode::Off
        } else {
            attach.map_or(CrossingMode::Any, CrossingMode::Only)
        },
        ..PipelineOptions::default()
    };
    let p = kernel::start(&opts, &caps, &l).context("the eBPF pipeline")?;
    let chosen = p.crossing.choice.as_ref().and_then(|c| c.chosen);
    if mode != Mode::Detached {
        let levels = p
            .crossing
            .levels
            .clone()
            .context("the crossing check did not attach on this kernel")?;
        if mode == Mode::Armed {
            levels.arm(watched.ino(), 1 << 40)?;
        }
    }
    let started = Instant::now();
    let mut hogs: Vec<_> = (0..2)
        .map(|_| {
            let mut c = std::process::Command::new(memhog());
            c.args([mib.to_string(), "0".into(), "0".into()]);
            c.stdout(std::process::Stdio::null());
            spawn_in(c, &[pod.dir.as_path()])
        })
        .collect();
    for h in &mut hogs {
        let status = h.wait()?;
        if !status.success() {
            bail!("a hog failed: {status}");
        }
    }
    let wall = started.elapsed();
    // The kernel counters reach the stats at the reader's next tick.
    tokio::time::sleep(kernel::ebpf::TICK + Duration::from_millis(200)).await;
    let checks = p
        .stats
        .crossing_checks
        .load(std::sync::atomic::Ordering::Relaxed);
    drop(p);
    // The programs detach as the pipeline's task ends.
    tokio::time::sleep(Duration::from_millis(300)).await;
    Ok((wall, checks, chosen))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> anyhow::Result<()> {
    require_root();
    if !memhog().exists() {
        bail!(
            "{} is missing: build the enforcer-tests binaries first",
            memhog().display()
        );
    }
    let mib = enforcer_tests::arg_u64("--mib", 1024);
    let rounds = enforcer_tests::arg_u64("--rounds", 5);
    // `--attach fexit|kprobe|tracepoint`: that point alone (else the first this kernel takes).
    let attach = match std::env::args().skip_while(|a| a != "--attach").nth(1) {
        None => None,
        Some(a) => Some(
            Attach::ALL
                .into_iter()
                .find(|x| x.name() == a)
                .with_context(|| format!("--attach {a}: one of fexit, kprobe, tracepoint"))?,
        ),
    };
    let l = layout();
    let (mount, _) = l.controller("memory").context("a memory controller")?;
    let name = unique_name("charge");
    let watched = TestCgroup::create(mount, &format!("{name}/kubepods"));
    let pod = TestCgroup::create(
        mount,
        &format!("{name}/kubepods/besteffort/podfeedface-0000-0000-0000-0000000c4a2e"),
    );
    let modes = [Mode::Detached, Mode::Disarmed, Mode::Armed];
    let mut per_page: Vec<Vec<f64>> = vec![Vec::new(); modes.len()];
    let mut checks: Vec<u64> = vec![0; modes.len()];
    let pages = mib * MIB / 4096;
    let mut attached = None;
    for r in 0..rounds {
        for (i, &m) in modes.iter().enumerate() {
            let (wall, c, chosen) = trial(m, attach, mib, &pod, &watched).await?;
            if let Some(a) = chosen {
                attached = Some(a.name());
            }
            let ns = wall.as_nanos() as f64 / pages as f64;
            eprintln!(
                "round {}: {}: {:.0} ns per page, {c} checks",
                r + 1,
                m.name(),
                ns
            );
            per_page[i].push(ns);
            checks[i] += c;
        }
    }
    let kernel = enforcer_tests::kernel_release();
    println!(
        "\n### The crossing check's cost per charge: two processes touching {mib} MiB each in 4 KiB pages, {rounds} rounds alternated (kernel {kernel}, attached: {})\n",
        attached.unwrap_or("none")
    );
    println!("| mode | ns per page, median of rounds | min | max | vs baseline | checks counted |");
    println!("|---|---|---|---|---|---|");
    let base = median(per_page[0].clone());
    for (i, m) in modes.iter().enumerate() {
        let v = &per_page[i];
        let min = v.iter().copied().fold(f64::INFINITY, f64::min);
        let max = v.iter().copied().fold(0.0, f64::max);
        let med = median(v.clone());
        println!(
            "| {} | {med:.0} | {min:.0} | {max:.0} | {:.3}x | {} |",
            m.name(),
            med / base,
            checks[i]
        );
    }
    Ok(())
}
