//! What one boot of `vm-test` did, printed.

use std::{fs, time::Duration};

use super::{Init, Vm, guest_total};
use crate::{
    runner::{Outcome, Verdict},
    say,
};

/// Prints the probe, each failing test's log tail, every test's outcome and time, and the
/// totals; returns what failed or did not run.
pub(super) fn report(
    vm: &Vm,
    init: Init,
    jobs: &[crate::runner::Job],
    outcomes: &[Outcome],
    rc: Option<i32>,
    wall: Duration,
    total: Duration,
) -> Vec<String> {
    println!(
        "\n=== vm-test: enforcer probe in the guest ({}) ===",
        vm.kernel_version
    );
    let probe = fs::read_to_string(vm.share.join("probe.out")).unwrap_or_default();
    let probe_rc = fs::read_to_string(vm.share.join("probe.rc")).unwrap_or_default();
    println!("{}", probe.trim_end());
    let mut failed = Vec::new();
    if probe_rc.trim() != "0" {
        failed.push(format!("enforcer probe (exit {:?})", probe_rc.trim()));
    }
    for o in outcomes.iter().filter(|o| o.verdict != Verdict::Passed) {
        println!(
            "\n=== vm-test: {}::{} {:?} in the guest ===",
            o.tier, o.test, o.verdict
        );
        let text = fs::read_to_string(&o.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        println!("{}", lines[lines.len().saturating_sub(150)..].join("\n"));
        failed.push(format!("{}::{}", o.tier, o.test));
    }
    for j in jobs {
        if !outcomes
            .iter()
            .any(|o| o.tier == j.tier && o.test == j.test)
        {
            failed.push(format!(
                "{}::{} (never ran: the guest stopped first)",
                j.tier, j.test
            ));
        }
    }
    let node = match init {
        Init::Busybox => "cgroup v2, cgroupfs driver",
        Init::Systemd => "cgroup v2, systemd as PID 1, systemd driver",
    };
    println!(
        "\n=== vm-test: tests in the guest ({}, {node}) ===",
        vm.kernel_version
    );
    for o in outcomes
        .iter()
        .filter(|o| o.tier != "unit" || o.verdict != Verdict::Passed)
    {
        println!(
            "  {:<12} {:<8} {:>8.1} s  {}",
            o.tier,
            format!("{:?}", o.verdict),
            o.seconds,
            o.test
        );
    }
    println!(
        "\n=== vm-test: tiers in the guest ({}, {node}) ===",
        vm.kernel_version
    );
    for (tier, passed, failed_n, secs) in crate::runner::by_tier(outcomes) {
        println!("  {tier:<14} {passed} passed, {failed_n} failed; {secs:.0} s");
    }
    let guest = guest_total(vm).map_or_else(|| "unknown".to_owned(), |s| format!("{s:.0} s"));
    println!(
        "  guest time (probe and tests) {guest}; VM wall time {:.0} s; vm-test wall time \
         (with the build) {:.0} s; console log {}",
        wall.as_secs_f64(),
        total.as_secs_f64(),
        vm.dir.join("console.log").display()
    );
    if rc.is_none() {
        failed.push("the guest command did not finish (see the console log)".to_owned());
    } else if rc != Some(0) {
        failed.push(format!("the guest command exited {rc:?}"));
    }
    if !failed.is_empty() {
        say(format!(
            "vm-test failed in the guest ({}): {}",
            init.name(),
            failed.join(", ")
        ));
    }
    failed
}
