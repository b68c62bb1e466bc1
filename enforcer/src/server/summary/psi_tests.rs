//! PSI in `/stats/summary`: kubelet's shape (`cpu.psi`, `memory.psi`, `io: {time, psi}` of
//! the node, each pod and each container, `full` and `some` with `total`, `avg10`, `avg60`,
//! `avg300`) where it is read; nothing, not zeros, where it is not (cgroup v1).

use std::collections::HashMap;

use super::{PsiData, PsiStats, summarize, tests::reading};
use crate::stats::psi::Pressure;

fn stats(total: u64) -> PsiStats {
    PsiStats {
        some: PsiData {
            total,
            avg10: 1.5,
            avg60: 0.5,
            avg300: 0.25,
        },
        full: PsiData {
            total: total / 2,
            avg10: 0.75,
            avg60: 0.0,
            avg300: 0.0,
        },
    }
}

/// A cgroup whose cpu, memory and io totals are 10n, 10n + 2, 10n + 4.
fn pressure(n: u64) -> Pressure {
    Pressure {
        cpu: Some(stats(10 * n)),
        memory: Some(stats(10 * n + 2)),
        io: Some(stats(10 * n + 4)),
    }
}

#[test]
fn the_node_its_pods_and_containers_carry_their_own_pressure() {
    let mut r = reading();
    r.psi = HashMap::from([
        (String::new(), pressure(1)),
        ("/kubepods/podu1".to_owned(), pressure(2)),
        ("/kubepods/podu1/c1".to_owned(), pressure(3)),
        ("/kubepods".to_owned(), pressure(4)),
    ]);
    let s = serde_json::to_value(summarize(&r, "n1", None)).expect("json");
    let node = &s["node"];
    let pod = &s["pods"][0];
    let container = &pod["containers"][0];
    let pods = &node["systemContainers"][0];
    for (who, v, n) in [
        ("node", node, 1),
        ("pod", pod, 2),
        ("container", container, 3),
        ("the pods system container", pods, 4),
    ] {
        assert_eq!(v["cpu"]["psi"]["some"]["total"], 10 * n, "{who}: {v}");
        assert_eq!(v["cpu"]["psi"]["full"]["total"], 5 * n, "{who}");
        assert_eq!(v["memory"]["psi"]["some"]["total"], 10 * n + 2, "{who}");
        assert_eq!(v["io"]["psi"]["some"]["total"], 10 * n + 4, "{who}");
        assert_eq!(v["io"]["time"], "2026-01-01T00:00:00Z", "{who}");
    }
    // kubelet's field names, each line whole.
    assert_eq!(
        node["memory"]["psi"],
        serde_json::json!({
            "full": {"total": 6, "avg10": 0.75, "avg60": 0.0, "avg300": 0.0},
            "some": {"total": 12, "avg10": 1.5, "avg60": 0.5, "avg300": 0.25},
        })
    );
    assert_eq!(pods["name"], "pods");
}

/// cgroup v1 (or `psi=0`): no `psi` and no `io` anywhere, as kubelet serves it.
#[test]
fn without_pressure_files_nothing_is_served_not_zeros() {
    let s = serde_json::to_string(&summarize(&reading(), "n1", None)).expect("json");
    assert!(!s.contains("\"psi\"") && !s.contains("\"io\""), "{s}");
}
