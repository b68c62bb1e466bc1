//! `TestStaticPolicyRemoveContainer`, `TestStaticPolicyGetTopologyHints`, and the default
//! machine state with a checkpoint round trip.

use super::*;
#[test]
fn static_policy_remove_container() {
    let r = &[(0, 512 * MB), (1, 512 * MB)][..];
    // should do nothing when the container does not exist under the state
    let empty = ms(vec![node(
        0,
        &[],
        &[
            ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
            (HP1G, t(GB, GB, 0, 0, GB)),
        ],
    )]);
    let mut p = policy(r, NumaTopology::default(), empty.clone(), assign(&[]));
    p.remove_container("pod1", "container1");
    check(&p, "nothing", &assign(&[]), &empty);
    // should delete the container assignment and update the machine state
    let mut p = policy(
        r,
        NumaTopology::default(),
        ms(vec![node(
            2,
            &[0],
            &[
                (
                    "memory",
                    t(1536 * MB, 512 * MB, 1024 * MB, 512 * MB, 2 * GB),
                ),
                (HP1G, t(GB, 0, GB, 0, GB)),
            ],
        )]),
        assign(&[(
            "pod1",
            "container1",
            vec![b(&[0], "memory", GB), b(&[0], HP1G, GB)],
        )]),
    );
    p.remove_container("pod1", "container1");
    check(
        &p,
        "single",
        &assign(&[]),
        &ms(vec![node(
            0,
            &[0],
            &[
                ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
                (HP1G, t(GB, GB, 0, 0, GB)),
            ],
        )]),
    );
    // should delete the cross NUMA container assignment and update the machine state
    let mut p = policy(
        r,
        NumaTopology::default(),
        ms(vec![
            node(
                2,
                &[0, 1],
                &[
                    ("memory", t(512 * MB, 0, 512 * MB, 512 * MB, GB)),
                    (HP1G, t(GB, 0, GB, 0, GB)),
                ],
            ),
            node(
                2,
                &[0, 1],
                &[
                    ("memory", t(512 * MB, 0, 512 * MB, 512 * MB, GB)),
                    (HP1G, t(GB, GB, 0, 0, GB)),
                ],
            ),
        ]),
        assign(&[(
            "pod1",
            "container1",
            vec![b(&[0, 1], "memory", GB), b(&[0, 1], HP1G, GB)],
        )]),
    );
    p.remove_container("pod1", "container1");
    let freed = |cells: &[usize]| {
        node(
            0,
            cells,
            &[
                ("memory", t(512 * MB, 512 * MB, 0, 512 * MB, GB)),
                (HP1G, t(GB, GB, 0, 0, GB)),
            ],
        )
    };
    check(
        &p,
        "cross",
        &assign(&[]),
        &ms(vec![freed(&[0]), freed(&[1])]),
    );
    assert_eq!(p.state().machine_state[&1].cells, vec![1]);
}

#[test]
fn static_policy_get_topology_hints() {
    let hints = |items: &[(&str, Vec<TopologyHint>)]| -> ProviderHints {
        items
            .iter()
            .map(|(k, v)| ((*k).to_owned(), Some(v.clone())))
            .collect()
    };
    let h = |bits: &[usize], preferred| TopologyHint::new(mask(bits), preferred);
    let r1 = &[(0, 512 * MB)][..];
    // should not provide topology hints for non-guaranteed pods
    let p = policy(r1, NumaTopology::default(), NumaNodeMap::new(), assign(&[]));
    let bu = pod("pod1", vec![burstable("container1")], vec![]);
    assert_eq!(
        p.topology_hints(&bu, &bu.spec.as_ref().unwrap().containers[0]),
        ProviderHints::new()
    );
    // should provide topology hints based on the existent memory assignment
    let gp = guaranteed_pod("pod1", "container1");
    let gc = gp.spec.as_ref().unwrap().containers[0].clone();
    let p = policy(
        r1,
        NumaTopology::default(),
        NumaNodeMap::new(),
        assign(&[(
            "pod1",
            "container1",
            vec![b(&[0], "memory", GB), b(&[0], HP1G, GB)],
        )]),
    );
    assert_eq!(
        p.topology_hints(&gp, &gc),
        hints(&[("memory", vec![h(&[0], true)]), (HP1G, vec![h(&[0], true)])])
    );
    // should calculate new topology hints, when the container does not exist under assignments
    let grouped = |free_mem| {
        node(
            2,
            &[0, 1],
            &[
                (
                    "memory",
                    t(1536 * MB, free_mem, 1536 * MB - free_mem, 512 * MB, 2 * GB),
                ),
                (HP1G, t(GB, 0, GB, 0, GB)),
            ],
        )
    };
    let free = |cells: &[usize]| {
        node(
            0,
            cells,
            &[
                ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
                (HP1G, t(GB, GB, 0, 0, GB)),
            ],
        )
    };
    let p = policy(
        &[(0, 512 * MB), (1, 512 * MB), (2, 512 * MB), (3, 512 * MB)],
        NumaTopology::default(),
        ms(vec![grouped(0), grouped(GB), free(&[2]), free(&[3])]),
        assign(&[(
            "pod1",
            "container1",
            vec![b(&[0, 1], "memory", 2 * GB), b(&[0, 1], HP1G, 2 * GB)],
        )]),
    );
    let p2 = guaranteed_pod("pod2", "container2");
    let want = vec![h(&[2], true), h(&[3], true), h(&[2, 3], false)];
    assert_eq!(
        p.topology_hints(&p2, &p2.spec.as_ref().unwrap().containers[0]),
        hints(&[("memory", want.clone()), (HP1G, want)])
    );
    // should fail when the existing assignment differs from the request: in resources, in
    // their types, in size (no hints: no preference)
    for blocks in [
        vec![b(&[0], "memory", GB)],
        vec![b(&[0], "memory", GB), b(&[0], HP2M, GB)],
        vec![b(&[0], "memory", 512 * MB), b(&[0], HP1G, GB)],
    ] {
        let p = policy(
            r1,
            NumaTopology::default(),
            NumaNodeMap::new(),
            assign(&[("pod1", "container1", blocks)]),
        );
        assert_eq!(p.topology_hints(&gp, &gc), ProviderHints::new());
    }
    // should not return preferred hints with multiple NUMA nodes for the pod with resources
    // satisfied by a single NUMA node
    let p = policy(
        &[(0, 512 * MB), (1, 512 * MB)],
        NumaTopology::default(),
        ms(vec![
            node(
                2,
                &[0, 1],
                &[
                    ("memory", t(1536 * MB, 0, 1536 * MB, 512 * MB, 2 * GB)),
                    (HP2M, t(20 * MB, 0, 20 * MB, 0, 20 * MB)),
                ],
            ),
            node(
                2,
                &[0, 1],
                &[
                    ("memory", t(1536 * MB, GB, 512 * MB, 512 * MB, 2 * GB)),
                    (HP2M, t(20 * MB, 16 * MB, 4 * MB, 0, 20 * MB)),
                ],
            ),
        ]),
        assign(&[(
            "pod1",
            "container1",
            vec![b(&[0, 1], "memory", 2 * GB), b(&[0, 1], HP2M, 24 * MB)],
        )]),
    );
    let p2 = pod("pod2", vec![g("container2", "1Gi", HP2M, "16Mi")], vec![]);
    assert_eq!(
        p.topology_hints(&p2, &p2.spec.as_ref().unwrap().containers[0]),
        hints(&[
            ("memory", vec![h(&[0, 1], false)]),
            (HP2M, vec![h(&[0, 1], false)])
        ])
    );
}

#[test]
fn default_machine_state_and_checkpoint_round_trip() {
    // Two cells with 2Mi pools; reservations per node; the checkpoint restarts the policy.
    let m = NumaTopology {
        cells: (0..2)
            .map(|id| NumaCell {
                id,
                memory: 4 * GB,
                hugepages: vec![HugePages {
                    page_size_kib: 2048,
                    num_pages: 512,
                }],
                cpus: crate::policy::cpu::CpuSet::default(),
            })
            .collect(),
    };
    let mut p = StaticPolicy::new(m.clone(), reserved(&[(0, 512 * MB), (1, 512 * MB)])).unwrap();
    p.start(MemoryState::default()).unwrap();
    assert_eq!(
        p.state().machine_state[&0].memory_map["memory"],
        t(2560 * MB, 2560 * MB, 0, 512 * MB, 4 * GB)
    );
    assert_eq!(
        p.state().machine_state[&0].memory_map[HP2M],
        t(GB, GB, 0, 0, GB)
    );
    let gp = pod("uid", vec![g("c", "3Gi", HP2M, "1Gi")], vec![]);
    let c = gp.spec.as_ref().unwrap().containers[0].clone();
    // 3Gi fits no single node: the pair, the smallest set that fits, preferred.
    let hints = p.topology_hints(&gp, &c);
    assert_eq!(
        hints["memory"],
        Some(vec![TopologyHint::new(mask(&[0, 1]), true)])
    );
    p.allocate(&gp, &c, &TopologyHint::default()).unwrap();
    assert_eq!(
        p.container_numa_nodes("uid", "c"),
        Some(std::collections::BTreeSet::from([0, 1]))
    );
    let json = p.checkpoint().to_json();
    let cp = crate::policy::memory::Checkpoint::from_json(&json).unwrap();
    let mut q = StaticPolicy::new(m.clone(), reserved(&[(0, 512 * MB), (1, 512 * MB)])).unwrap();
    q.start(cp.to_state("Static").unwrap()).unwrap();
    assert_eq!(q.state(), p.state());
    // A changed reservation refuses to start from that checkpoint.
    let mut r = StaticPolicy::new(m, reserved(&[(0, GB), (1, 512 * MB)])).unwrap();
    assert_eq!(
        r.start(cp.to_state("Static").unwrap()),
        Err(MemoryError::MachineStateDiffers)
    );
    // Stale containers are released.
    p.remove_stale_state(&BTreeMap::new());
    assert!(p.state().assignments.is_empty());
    assert_eq!(p.state().machine_state[&1].cells, vec![1]);
}
