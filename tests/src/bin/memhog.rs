//! Test workload: touches memory step by step, then holds it.
//! `memhog <MiB> [step_ms] [hold_ms]` — one MiB per step (pages written, so they are charged).

use std::time::Duration;

fn main() {
    let args: Vec<u64> = std::env::args()
        .skip(1)
        .map(|a| a.parse().unwrap_or(0))
        .collect();
    let mib = args.first().copied().unwrap_or(200);
    let step_ms = args.get(1).copied().unwrap_or(0);
    let hold_ms = args.get(2).copied().unwrap_or(0);
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
