//! The end of `cargo xtask test`: the doc tests run with their report kept back, and the table
//! of times with the closing line of the counts.

use std::{fmt::Write as _, process::Command, time::Duration};

use anyhow::{Context as _, bail};

use crate::{HOST_PARALLEL, runner, say, vm};

/// The end of `cargo xtask test`: each tier's time on this host and in each boot, the
/// phases' wall times and the total, and the plain closing line of the counts.
pub fn print_times(
    checks: Duration,
    build: Duration,
    host: &[runner::Outcome],
    host_wall: Duration,
    boots: &[(vm::Init, vm::VmRun)],
    doc_passed: usize,
    total: Duration,
) {
    let host_tiers = runner::by_tier(host);
    let boot_tiers: Vec<Vec<(String, usize, usize, f64)>> = boots
        .iter()
        .map(|(_, r)| runner::by_tier(&r.outcomes))
        .collect();
    let mut names: Vec<String> = host_tiers.iter().map(|t| t.0.clone()).collect();
    for b in &boot_tiers {
        for t in b {
            if !names.contains(&t.0) {
                names.push(t.0.clone());
            }
        }
    }
    let cell = |tiers: &[(String, usize, usize, f64)], name: &str| {
        tiers.iter().find(|t| t.0 == name).map_or_else(
            || "-".to_owned(),
            |t| {
                if t.2 == 0 {
                    format!("{:.0} s ({})", t.3, t.1)
                } else {
                    format!("{:.0} s ({} ok, {} FAILED)", t.3, t.1, t.2)
                }
            },
        )
    };
    println!(
        "\n=== cargo xtask test: time per tier (the tests' own times added up; tests run) ==="
    );
    let mut header = format!("  {:<28} {:>22}", "tier", "host");
    for (init, _) in boots {
        let _ = write!(header, " {:>22}", format!("VM, {}", init.name()));
    }
    println!("{header}");
    for n in &names {
        let mut line = format!("  {n:<28} {:>22}", cell(&host_tiers, n));
        for b in &boot_tiers {
            let _ = write!(line, " {:>22}", cell(b, n));
        }
        println!("{line}");
    }
    println!(
        "  wall: checks (fmt, layers, sizes, clippy) {:.0} s; build {:.0} s; host tests {:.0} s ({} \
         at once)",
        checks.as_secs_f64(),
        build.as_secs_f64(),
        host_wall.as_secs_f64(),
        HOST_PARALLEL
    );
    for (init, r) in boots {
        println!("  wall: VM, {} {:.0} s", init.name(), r.wall.as_secs_f64());
    }
    println!("  total {:.1} min", total.as_secs_f64() / 60.0);
    let all = host
        .iter()
        .chain(boots.iter().flat_map(|(_, r)| &r.outcomes));
    let (passed, failed) = all.fold((doc_passed, 0), |(p, f), o| {
        if o.verdict == runner::Verdict::Passed {
            (p + 1, f)
        } else {
            (p, f + 1)
        }
    });
    println!("tests: {passed} passed, {failed} failed");
}

/// Runs the workspace's doc tests with cargo's report kept back, and returns how many passed.
/// Cargo's report is shown only when one failed: a workspace without doc tests would otherwise
/// close its cargo output on "0 passed" lines, which a reader of the log takes for a run of no
/// test (the suite's own closing line counts them in).
pub fn doc_tests(cargo: Command, workspace: &[&str]) -> anyhow::Result<usize> {
    let mut cmd = cargo;
    cmd.args(["test", "--doc"]).args(workspace);
    say(format!(
        "running {cmd:?} (its report shown only on a failure)"
    ));
    let out = cmd.output().with_context(|| format!("starting {cmd:?}"))?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        print!("{stdout}");
        eprint!("{}", String::from_utf8_lossy(&out.stderr));
        bail!("{cmd:?} failed: {}", out.status);
    }
    let passed = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("test result: ok. "))
        .filter_map(|l| l.split(' ').next()?.parse::<usize>().ok())
        .sum();
    say(format!("doc tests: {passed} ran and passed"));
    Ok(passed)
}
