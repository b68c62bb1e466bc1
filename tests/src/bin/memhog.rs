//! Test workload.
//! - `memhog <MiB> [step_ms] [hold_ms]`: touches anonymous memory one MiB per step, holds it.
//! - `memhog --file <path> <MiB> <hold_ms>`: writes a file of that size (synced every 8 MiB),
//!   then re-reads it, dropping its own cached pages before each pass, until hold_ms pass: a
//!   sustained page-cache reclaim storm in a small memory cgroup, with no OOM.
//! - `memhog --report <fast_MiB> <total_MiB> <step_us>`: waits for a line on stdin, touches
//!   fast_MiB at once, then one MiB every step_us up to total_MiB, printing `<KiB> <monotonic
//!   ns>` after each quarter MiB touched; then holds until killed.
//! - `memhog --log <path> <MiB> <interval_ms>`: touches MiB, then appends a line to the file
//!   at path every interval_ms (as a container writing its log) until killed; no forks.
//! - `memhog --getppid <count> <rate_per_s>`: waits for a line on stdin, then calls getppid()
//!   `count` times at about that rate (0 = as fast as possible): the pipeline probe's load.

use std::{
    fs::OpenOptions,
    io::{BufRead as _, Read as _, Write as _},
    time::{Duration, Instant},
};

fn num(args: &[String], i: usize, default: u64) -> u64 {
    args.get(i).and_then(|a| a.parse().ok()).unwrap_or(default)
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("--file") => file_storm(&args),
        Some("--getppid") => getppid_storm(&args),
        Some("--report") => report(&args),
        Some("--log") => log_writer(&args),
        _ => anon(&args),
    }
}

fn anon(args: &[String]) {
    let (mib, step_ms, hold_ms) = (num(args, 0, 200), num(args, 1, 0), num(args, 2, 0));
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for _ in 0..mib {
        let mut chunk = vec![0u8; 1 << 20];
        for i in (0..chunk.len()).step_by(4096) {
            chunk[i] = 1;
        }
        chunks.push(chunk);
        if step_ms > 0 {
            std::thread::sleep(Duration::from_millis(step_ms));
        }
    }
    std::thread::sleep(Duration::from_millis(hold_ms));
    println!("{}", chunks.len());
}

fn file_storm(args: &[String]) {
    let Some(path) = args.get(1) else {
        eprintln!("memhog --file <path> <MiB> <hold_ms>");
        std::process::exit(2);
    };
    let (mib, hold_ms) = (num(args, 2, 256), num(args, 3, 5000));
    let mut f = match OpenOptions::new()
        .create(true)
        .truncate(true)
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    let chunk = vec![7u8; 1 << 20];
    for i in 0..mib {
        if f.write_all(&chunk).is_err() {
            std::process::exit(1);
        }
        if i % 8 == 7 {
            let _ = f.sync_data();
        }
    }
    let _ = f.sync_data();
    let deadline = Instant::now() + Duration::from_millis(hold_ms);
    let mut buf = vec![0u8; 1 << 20];
    while Instant::now() < deadline {
        let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
        let mut r = match std::fs::File::open(path) {
            Ok(r) => r,
            Err(_) => break,
        };
        while let Ok(n) = r.read(&mut buf) {
            if n == 0 || Instant::now() >= deadline {
                break;
            }
        }
    }
    let _ = std::fs::remove_file(path);
}

fn getppid_storm(args: &[String]) {
    let (count, rate) = (num(args, 1, 100_000), num(args, 2, 0));
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let start = Instant::now();
    for i in 0..count {
        // A real system call each time (the probe program sits on its tracepoint).
        std::hint::black_box(rustix::process::getppid());
        if rate > 0 && i % 64 == 0 {
            let due = Duration::from_secs_f64(i as f64 / rate as f64);
            while start.elapsed() < due {
                std::hint::spin_loop();
            }
        }
    }
    println!("{}", start.elapsed().as_nanos());
}

fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

fn log_writer(args: &[String]) {
    let Some(path) = args.get(1) else {
        eprintln!("memhog --log <path> <MiB> <interval_ms>");
        std::process::exit(2);
    };
    let (mib, interval_ms) = (num(args, 2, 1), num(args, 3, 1000));
    let mut held = vec![0u8; usize::try_from(mib << 20).unwrap_or(1 << 20)];
    for i in (0..held.len()).step_by(4096) {
        held[i] = 1;
    }
    let mut f = match OpenOptions::new().create(true).append(true).open(path) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("{path}: {e}");
            std::process::exit(1);
        }
    };
    for n in 0u64.. {
        let _ = writeln!(
            f,
            "line {n} of a container's log, held {} bytes",
            held.len()
        );
        std::thread::sleep(Duration::from_millis(interval_ms));
    }
}

fn report(args: &[String]) {
    let (fast, total, step_us) = (num(args, 1, 0), num(args, 2, 100), num(args, 3, 1000));
    let mut line = String::new();
    let _ = std::io::stdin().lock().read_line(&mut line);
    let mut out = std::io::stdout().lock();
    let mut chunks: Vec<Vec<u8>> = Vec::new();
    for i in 0..total {
        let mut chunk = vec![0u8; 1 << 20];
        for (q, quarter) in chunk.chunks_mut(1 << 18).enumerate() {
            for j in (0..quarter.len()).step_by(4096) {
                quarter[j] = 1;
            }
            if i >= fast {
                let _ = writeln!(
                    out,
                    "{} {}",
                    i * 1024 + (q as u64 + 1) * 256,
                    monotonic_ns()
                );
                let _ = out.flush();
            }
        }
        chunks.push(chunk);
        if i >= fast {
            std::thread::sleep(Duration::from_micros(step_us));
        }
    }
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}
