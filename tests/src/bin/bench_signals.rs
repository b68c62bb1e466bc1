//! `cargo xtask bench signals`: the signal pipeline measured on this machine, in one run.
//!
//! 1. Latency: one workload (a page-cache reclaim storm in a 64 MiB memory cgroup), watched at
//!    once by every source: eBPF ring buffer, memcg threshold eventfd, PSI trigger, and 1 s /
//!    10 s polls. The reference "crossing" is the kernel's first memcg reclaim of the cgroup
//!    (the eBPF record's kernel timestamp: the moment usage hit the limit). eBPF's own figure
//!    is its record's kernel timestamp to reception.
//! 2. Throughput: the pipeline probe (getppid() of one process -> one record, no folding) at
//!    increasing rates; records received vs lost.
//! 3. The daemon (`enforcer run`) idle and during a reclaim storm: RSS and CPU.
//!
//! Needs root. Prints markdown tables.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};
use enforcer::{
    kernel::{self, Capabilities, PipelineOptions, SourceChoice, Watch},
    signal::{SignalKind, SourceKind, monotonic_ns},
};
use enforcer_tests::{TestCgroup, layout, require_root, spawn_in, unique_name};

const MIB: u64 = 1 << 20;
const LIMIT: u64 = 64 * MIB;

fn memhog() -> PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    exe.with_file_name("memhog")
}

fn arg(name: &str, default: u64) -> u64 {
    enforcer_tests::arg_u64(name, default)
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
    let trials = arg("--trials", 10);
    let poll10 = arg("--poll10", 1) == 1;
    latency(trials, poll10).await?;
    throughput().await?;
    daemon_resources().await?;
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Src {
    Ebpf,
    Eventfd,
    Psi,
    Poll1,
    Poll10,
}

fn summary(name: &str, mut v: Vec<i64>, base_p50: Option<f64>, missed: u64) -> String {
    if v.is_empty() {
        return format!("| {name} | - | - | - | - | - | {missed} |");
    }
    v.sort_unstable();
    let pick = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    let us = |ns: i64| format!("{:.1}", ns as f64 / 1000.0);
    let p50 = pick(0.5);
    let ratio = match base_p50 {
        None => "1".to_owned(),
        Some(_) if p50 <= 0 => "ahead (lower threshold)".to_owned(),
        Some(b) => format!("{:.0}x", p50 as f64 / b.max(1.0)),
    };
    format!(
        "| {name} | {} | {} | {} | {} | {ratio} | {missed} |",
        us(v[0]),
        us(p50),
        us(pick(0.99)),
        us(v[v.len() - 1])
    )
}

async fn latency(trials: u64, poll10: bool) -> anyhow::Result<()> {
    let l = layout();
    let caps = Capabilities::probe(&l);
    let (mem_mount, _) = l.controller("memory").context("no memory controller")?;
    let name = unique_name("bench");
    let mem = TestCgroup::create(mem_mount, &name);
    let v1 = mem.dir.join("memory.limit_in_bytes").exists();
    mem.write(
        if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        },
        &LIMIT.to_string(),
    );
    let uni = l.unified.as_deref().map(|u| TestCgroup::create(u, &name));
    let psi_dir = uni.as_ref().map_or(mem.dir.clone(), |u| u.dir.clone());
    let start = |source: SourceKind, watches: Vec<Watch>, interval: Duration| {
        let opts = PipelineOptions {
            source: SourceChoice::Only(source),
            watches,
            poll_interval: interval,
            ..PipelineOptions::default()
        };
        kernel::start(&opts, &caps, &l)
    };
    let w = |dir: &Path, t: u64| {
        vec![Watch {
            cgroup: dir.to_path_buf(),
            threshold_bytes: Some(t),
        }]
    };
    let mut pipes = vec![(
        Src::Ebpf,
        start(SourceKind::Ebpf, vec![], Duration::from_secs(1))?,
    )];
    if v1 {
        pipes.push((
            Src::Eventfd,
            start(
                SourceKind::Eventfd,
                w(&mem.dir, LIMIT - MIB),
                Duration::from_secs(1),
            )?,
        ));
    }
    pipes.push((
        Src::Psi,
        start(SourceKind::Psi, w(&psi_dir, 0), Duration::from_secs(1))?,
    ));
    pipes.push((
        Src::Poll1,
        start(
            SourceKind::Poll,
            w(&mem.dir, LIMIT - 2 * MIB),
            Duration::from_secs(1),
        )?,
    ));
    if poll10 {
        pipes.push((
            Src::Poll10,
            start(
                SourceKind::Poll,
                w(&mem.dir, LIMIT - 2 * MIB),
                Duration::from_secs(10),
            )?,
        ));
    }
    let mem_rel = mem.rel();
    let uni_rel = uni.as_ref().map(TestCgroup::rel);
    let hold_ms: u64 = if poll10 { 11_500 } else { 3_000 };
    let mut delays: Vec<(Src, Vec<i64>, u64)> =
        pipes.iter().map(|(s, _)| (*s, Vec::new(), 0)).collect();
    let mut groups = vec![mem.dir.clone()];
    if let Some(u) = &uni {
        groups.push(u.dir.clone());
    }
    eprintln!(
        "latency: {trials} trials of a {hold_ms} ms reclaim storm in a 64 MiB memcg ({mem_rel})"
    );
    for trial in 0..trials {
        for (_, p) in &mut pipes {
            while p.signals.try_recv().is_ok() {}
        }
        let file = format!("/var/tmp/{name}.dat");
        let mut cmd = Command::new(memhog());
        cmd.args(["--file", &file, "256", &hold_ms.to_string()])
            .stdout(Stdio::null());
        let refs: Vec<&Path> = groups.iter().map(PathBuf::as_path).collect();
        let trial_start = monotonic_ns();
        let mut child = spawn_in(cmd, &refs);
        let deadline = Instant::now() + Duration::from_millis(hold_ms + 1000);
        let mut reference: Option<u64> = None;
        let mut got: Vec<Option<u64>> = vec![None; pipes.len()];
        while Instant::now() < deadline && got.iter().any(Option::is_none) {
            for (i, (src, p)) in pipes.iter_mut().enumerate() {
                while let Ok(s) = p.signals.try_recv() {
                    if got[i].is_some() || s.received_ns < trial_start {
                        continue;
                    }
                    let mine = match src {
                        Src::Ebpf => {
                            s.kind == SignalKind::MemcgReclaim
                                && s.cgroup.as_deref() == Some(mem_rel.as_str())
                        }
                        Src::Psi => {
                            s.kind == SignalKind::MemoryPressure
                                && s.cgroup == uni_rel.clone().or(Some(mem_rel.clone()))
                        }
                        _ => s.kind == SignalKind::MemoryThreshold,
                    };
                    if !mine {
                        continue;
                    }
                    if *src == Src::Ebpf {
                        reference = s.kernel_ns;
                    }
                    got[i] = Some(s.received_ns);
                }
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
        let _ = child.kill();
        let _ = child.wait();
        let _ = std::fs::remove_file(&file);
        let Some(r) = reference else {
            eprintln!("trial {trial}: no eBPF reclaim record; skipped");
            continue;
        };
        let mut line = format!("trial {trial}:");
        for (i, (src, _)) in pipes.iter().enumerate() {
            match got[i] {
                Some(rx) => {
                    let d = i64::try_from(rx).unwrap_or(i64::MAX) - i64::try_from(r).unwrap_or(0);
                    delays[i].1.push(d);
                    line.push_str(&format!(" {src:?}={:.3}ms", d as f64 / 1e6));
                }
                None => {
                    delays[i].2 += 1;
                    line.push_str(&format!(" {src:?}=none"));
                }
            }
        }
        eprintln!("{line}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let base = delays.first().and_then(|(_, v, _)| {
        let mut v = v.clone();
        v.sort_unstable();
        v.get(v.len() / 2).map(|x| *x as f64)
    });
    println!(
        "\n### Signal delay, kernel event (or crossing) -> daemon, {trials} trials, microseconds\n"
    );
    println!("| source | min | median | p99 | max | median vs eBPF | trials without a signal |");
    println!("|---|---|---|---|---|---|---|");
    for (src, v, missed) in delays {
        let name = match src {
            Src::Ebpf => "eBPF tracepoint -> ring buffer",
            Src::Eventfd => "memcg usage threshold eventfd (v1)",
            Src::Psi => "PSI trigger (some 10% of 2 s)",
            Src::Poll1 => "poll 1 s",
            Src::Poll10 => "poll 10 s (kubelet housekeeping)",
        };
        println!(
            "{}",
            summary(name, v, if src == Src::Ebpf { None } else { base }, missed)
        );
    }
    drop(pipes);
    Ok(())
}

async fn throughput() -> anyhow::Result<()> {
    let l = layout();
    let caps = Capabilities::probe(&l);
    println!("\n### Pipeline throughput (probe records: one per getppid(), no folding)\n");
    println!(
        "| requested rate/s | achieved rate/s | records | received | lost in kernel (ring full) | dropped in daemon |"
    );
    println!("|---|---|---|---|---|---|");
    for (count, rate) in [
        (200_000u64, 100_000u64),
        (400_000, 200_000),
        (1_000_000, 500_000),
        (2_000_000, 0),
    ] {
        let mut child = Command::new(memhog())
            .args(["--getppid", &count.to_string(), &rate.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .context("spawning the getppid load")?;
        let opts = PipelineOptions {
            source: SourceChoice::Only(SourceKind::Ebpf),
            probe_tgid: child.id(),
            channel_capacity: 1 << 20,
            ..PipelineOptions::default()
        };
        let mut p = kernel::start(&opts, &caps, &l)?;
        let counter = tokio::spawn(async move {
            let mut n = 0u64;
            let mut idle_since = Instant::now();
            loop {
                match tokio::time::timeout(Duration::from_millis(50), p.signals.recv()).await {
                    Ok(Some(s)) => {
                        if s.kind == SignalKind::Probe {
                            n += 1;
                        }
                        idle_since = Instant::now();
                    }
                    Ok(None) => break,
                    Err(_) if n > 0 && idle_since.elapsed() > Duration::from_millis(1500) => break,
                    Err(_) if idle_since.elapsed() > Duration::from_secs(20) => break,
                    Err(_) => {}
                }
            }
            tokio::time::sleep(Duration::from_millis(1100)).await;
            (n, p)
        });
        tokio::time::sleep(Duration::from_millis(200)).await;
        if let Some(stdin) = child.stdin.as_mut() {
            stdin.write_all(b"go\n")?;
        }
        let out = child.wait_with_output()?;
        let elapsed_ns: f64 = String::from_utf8_lossy(&out.stdout)
            .trim()
            .parse()
            .unwrap_or(1.0);
        let (received, p) = counter.await?;
        let full = p
            .stats
            .kernel_ring_full
            .load(std::sync::atomic::Ordering::Relaxed);
        let dropped = p.stats.dropped.load(std::sync::atomic::Ordering::Relaxed);
        let achieved = count as f64 / (elapsed_ns / 1e9);
        let req = if rate == 0 {
            "max".to_owned()
        } else {
            rate.to_string()
        };
        println!("| {req} | {achieved:.0} | {count} | {received} | {full} | {dropped} |");
    }
    Ok(())
}

fn proc_cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let after = stat.rsplit_once(')').map(|(_, a)| a).unwrap_or("");
    let f: Vec<&str> = after.split_whitespace().collect();
    let g = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    g(11) + g(12)
}

fn proc_rss_kib(pid: u32, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.split_whitespace().next().and_then(|n| n.parse().ok()))
        .unwrap_or(0)
}

fn metric(addr: &str, name: &str) -> u64 {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return 0;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut body = String::new();
    let _ = s.read_to_string(&mut body);
    body.lines()
        .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
        .unwrap_or(0)
}

async fn daemon_resources() -> anyhow::Result<()> {
    let exe = std::env::current_exe()?.with_file_name("enforcer");
    if !exe.exists() {
        bail!(
            "{} is missing: `cargo build --release -p enforcer` first",
            exe.display()
        );
    }
    let addr = "127.0.0.1:10299";
    let mut daemon = Command::new(&exe)
        .args(["run", "--http-address", addr])
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .context("starting enforcer run")?;
    let pid = daemon.id();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let hz = rustix::param::clock_ticks_per_second() as f64;
    let window = Duration::from_secs(10);
    let t0 = proc_cpu_ticks(pid);
    tokio::time::sleep(window).await;
    let idle_cpu = (proc_cpu_ticks(pid) - t0) as f64 / hz / window.as_secs_f64() * 100.0;
    let idle_rss = proc_rss_kib(pid, "VmRSS:");

    let l = layout();
    let (mem_mount, _) = l.controller("memory").context("no memory controller")?;
    let name = unique_name("storm");
    let mem = TestCgroup::create(mem_mount, &name);
    let v1 = mem.dir.join("memory.limit_in_bytes").exists();
    mem.write(
        if v1 {
            "memory.limit_in_bytes"
        } else {
            "memory.max"
        },
        &LIMIT.to_string(),
    );
    let seen0 = metric(addr, "enforcer_kernel_events_seen_total ");
    let file = format!("/var/tmp/{name}.dat");
    let mut cmd = Command::new(memhog());
    cmd.args(["--file", &file, "256", "10000"])
        .stdout(Stdio::null());
    let t1 = proc_cpu_ticks(pid);
    let started = Instant::now();
    let mut child = spawn_in(cmd, &[mem.dir.as_path()]);
    let _ = child.wait();
    let took = started.elapsed();
    let storm_cpu = (proc_cpu_ticks(pid) - t1) as f64 / hz / took.as_secs_f64() * 100.0;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let seen = metric(addr, "enforcer_kernel_events_seen_total ").saturating_sub(seen0);
    let sent = metric(addr, "enforcer_signals_decoded_total ");
    let storm_rss = proc_rss_kib(pid, "VmRSS:");
    let hwm = proc_rss_kib(pid, "VmHWM:");
    let _ = std::fs::remove_file(&file);
    // The daemon this benchmark started.
    enforcer_tests::kill(pid as i32, rustix::process::Signal::TERM);
    let _ = daemon.wait();
    println!("\n### The daemon (`enforcer run`, eBPF source)\n");
    println!("| state | CPU (% of one core) | RSS (MiB) |");
    println!("|---|---|---|");
    println!(
        "| idle, 10 s | {idle_cpu:.2} | {:.1} |",
        idle_rss as f64 / 1024.0
    );
    println!(
        "| reclaim storm, {:.1} s, {seen} kernel events, {sent} records decoded | {storm_cpu:.2} | {:.1} (peak {:.1}) |",
        took.as_secs_f64(),
        storm_rss as f64 / 1024.0,
        hwm as f64 / 1024.0
    );
    Ok(())
}
