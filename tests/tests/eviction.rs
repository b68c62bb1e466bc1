//! The heart of the product on the real kernel, cgroups and containerd: a small "node" (a
//! capacity override) under memory pressure; the eviction manager, woken by kernel signals,
//! evicts the BestEffort pod with kubelet's status and message before the kernel OOM killer
//! has to act, and leaves the Guaranteed and Burstable pods running.

use std::{path::Path, time::Duration};

use enforcer::{config::ConfigArgs, status_manager::PodRecord};
use enforcer_tests::{
    Daemon,
    containerd::Containerd,
    layout,
    node::{find, node_oom_kills, pod, status_file, wait_until},
};

const MIB: u64 = 1 << 20;
const GRACE_30: &str = "  terminationGracePeriodSeconds: 30\n";

fn records(state: &Path) -> Vec<PodRecord> {
    status_file(state).pods
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_memory_threshold_evicts_the_besteffort_pod_before_the_kernel_oom_killer() {
    let cd = Containerd::start("evict");
    let manifests = cd.dir.join("manifests");
    let state = cd.dir.join("state");
    std::fs::create_dir_all(&manifests).expect("manifest dir");
    let sleep = "trap 'exit 0' TERM; sleep 3600 & wait";
    std::fs::write(
        manifests.join("guaranteed.yaml"),
        pod(
            "guaranteed",
            "aaaaaaaa-0000-0000-0000-000000000001",
            GRACE_30,
            "    resources: {limits: {cpu: 100m, memory: 32Mi}}",
            sleep,
        ),
    )
    .expect("write");
    std::fs::write(
        manifests.join("burstable.yaml"),
        pod(
            "burstable",
            "aaaaaaaa-0000-0000-0000-000000000002",
            GRACE_30,
            "    resources: {requests: {memory: 32Mi}}",
            sleep,
        ),
    )
    .expect("write");
    // Grows by about 20 MiB/s up to 600 MiB: past the threshold and, if nothing acted, past
    // the kubepods limit into the kernel OOM killer.
    let grow = "(i=0; while [ $i -lt 600 ]; do head -c 1048576 /dev/zero; i=$((i+1)); sleep 0.05; done) | tail -c 600m >/dev/null; sleep 3600";
    let besteffort = pod(
        "besteffort",
        "aaaaaaaa-0000-0000-0000-000000000003",
        GRACE_30,
        "",
        grow,
    );

    let args = ConfigArgs {
        eviction_hard: vec!["memory.available<150Mi".to_owned()],
        node_capacity: vec!["memory=400Mi".to_owned()],
        cgroup_root: Some(cd.cgroup_root.clone()),
        cgroup_driver: Some(cd.driver.as_str().to_owned()),
        cri_socket: Some(cd.socket.clone()),
        manifest_dir: Some(manifests.clone()),
        state_dir: Some(state.clone()),
        http_address: Some("127.0.0.1:0".to_owned()),
        allow_host_namespaces: Some(true),
        housekeeping_interval: Some("10s".to_owned()),
        ..ConfigArgs::default()
    };
    let config = enforcer::config::load(&enforcer_tests::disk_neutral(&args))
        .expect("configuration")
        .config;
    let daemon = Daemon::start(config);

    wait_until(
        "guaranteed and burstable running",
        Duration::from_secs(30),
        || {
            let r = records(&state);
            ["guaranteed", "burstable"]
                .iter()
                .all(|p| find(&r, p).is_some_and(|x| x.phase == "Running"))
        },
    )
    .await;
    let l = layout();
    let (mem_mount, _) = l.controller("memory").expect("memory controller");
    let kubepods = mem_mount.join(cd.kubepods_path().trim_start_matches('/'));
    let limit = std::fs::read_to_string(kubepods.join("memory.limit_in_bytes"))
        .or_else(|_| std::fs::read_to_string(kubepods.join("memory.max")))
        .expect("kubepods limit");
    assert_eq!(
        limit.trim(),
        (400 * MIB).to_string(),
        "kubepods limited to the node's capacity"
    );
    let ooms_before = node_oom_kills();

    std::fs::write(manifests.join("besteffort.yaml"), besteffort).expect("write");
    wait_until(
        "the BestEffort pod evicted",
        Duration::from_secs(60),
        || find(&records(&state), "besteffort").is_some_and(|x| x.reason == "Evicted"),
    )
    .await;
    let recs = records(&state);
    let be = find(&recs, "besteffort").expect("record");
    assert_eq!(be.phase, "Failed");
    assert!(
        be.message.starts_with(
            "The node was low on resource: memory. Threshold quantity: 150Mi, available: "
        ),
        "kubelet's message: {}",
        be.message
    );
    assert!(
        be.message.contains("Container app was using"),
        "names the container over its request: {}",
        be.message
    );
    for p in ["guaranteed", "burstable"] {
        assert_eq!(
            find(&recs, p).map(|x| x.phase.as_str()),
            Some("Running"),
            "{p} keeps running"
        );
    }
    assert_eq!(
        node_oom_kills(),
        ooms_before,
        "the kernel OOM killer never fired"
    );
    // The evicted pod stays evicted (phase Failed is terminal): still so a little later.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        find(&records(&state), "besteffort").map(|x| x.reason.clone()),
        Some("Evicted".to_owned())
    );

    daemon.stop().await;
    drop(cd);
}
