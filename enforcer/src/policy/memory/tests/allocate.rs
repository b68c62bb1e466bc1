//! `TestStaticPolicyAllocate`, `TestStaticPolicyAllocateWithInitContainers` and
//! `TestStaticPolicyAllocateWithRestartableInitContainers`.

use super::*;
#[test]
fn static_policy_allocate() {
    let one = |assignments, mem: MemoryTable, hp: MemoryTable| {
        ms(vec![node(
            assignments,
            &[0],
            &[("memory", mem), (HP1G, hp)],
        )])
    };
    let fresh = || {
        one(
            0,
            t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB),
            t(GB, GB, 0, 0, GB),
        )
    };
    let used = || {
        one(
            2,
            t(1536 * MB, 512 * MB, 1024 * MB, 512 * MB, 2 * GB),
            t(GB, 0, GB, 0, GB),
        )
    };
    let three = |n0: NumaNodeState| {
        ms(vec![
            n0,
            node(
                0,
                &[1],
                &[
                    ("memory", t(512 * MB, 512 * MB, 0, 512 * MB, 1536 * MB)),
                    (HP1G, t(GB, GB, 0, 0, GB)),
                ],
            ),
            node(
                0,
                &[2],
                &[
                    ("memory", t(512 * MB, 512 * MB, 0, 512 * MB, 1536 * MB)),
                    (HP1G, t(GB, GB, 0, 0, GB)),
                ],
            ),
        ])
    };
    let n0_half = || {
        node(
            1,
            &[0],
            &[
                ("memory", t(GB, 512 * MB, 512 * MB, 512 * MB, 1536 * MB)),
                (HP1G, t(GB, GB, 0, 0, GB)),
            ],
        )
    };
    let small = |cells: &[usize], assignments| {
        node(
            assignments,
            cells,
            &[
                ("memory", t(512 * MB, 512 * MB, 0, 512 * MB, GB)),
                (HP1G, t(GB, GB, 0, 0, GB)),
            ],
        )
    };
    let r3 = &[(0, 512 * MB), (1, 512 * MB), (2, 512 * MB)][..];
    let r4 = &[(0, 512 * MB), (1, 512 * MB), (2, 512 * MB), (3, 512 * MB)][..];
    let both = |n: &[usize]| vec![b(n, "memory", GB), b(n, HP1G, GB)];
    type Case<'a> = (
        &'a str,
        &'a [(usize, u64)],
        NumaNodeMap,
        ContainerMemoryAssignments,
        Pod,
        TopologyHint,
        Result<(ContainerMemoryAssignments, NumaNodeMap), MemoryError>,
    );
    let cases: Vec<Case<'_>> = vec![
        (
            "should do nothing for non-guaranteed pods",
            &[(0, 512 * MB)][..],
            fresh(),
            assign(&[]),
            pod("pod1", vec![burstable("container1")], vec![]),
            TopologyHint::default(),
            Ok((assign(&[]), fresh())),
        ),
        (
            "should do nothing once container already exists under the state file",
            &[(0, 512 * MB)][..],
            one(
                0,
                t(1536 * MB, 512 * MB, 1024 * MB, 512 * MB, 2 * GB),
                t(GB, GB, 0, 0, GB),
            ),
            assign(&[("pod1", "container1", vec![b(&[0], "memory", GB)])]),
            guaranteed_pod("pod1", "container1"),
            TopologyHint::default(),
            Ok((
                assign(&[("pod1", "container1", vec![b(&[0], "memory", GB)])]),
                one(
                    0,
                    t(1536 * MB, 512 * MB, 1024 * MB, 512 * MB, 2 * GB),
                    t(GB, GB, 0, 0, GB),
                ),
            )),
        ),
        (
            "should calculate a default topology hint when no NUMA affinity was provided by the topology manager hint",
            &[(0, 512 * MB)][..],
            fresh(),
            assign(&[]),
            guaranteed_pod("pod1", "container1"),
            TopologyHint::default(),
            Ok((assign(&[("pod1", "container1", both(&[0]))]), used())),
        ),
        (
            "should fail when no NUMA affinity was provided under the topology manager hint and calculation of the default hint failed",
            &[(0, 512 * MB)][..],
            used(),
            assign(&[("pod1", "container1", both(&[0]))]),
            guaranteed_pod("pod2", "container2"),
            TopologyHint::default(),
            Err(MemoryError::NoDefaultAffinity),
        ),
        (
            "should fail when no NUMA affinity was provided under the topology manager preferred hint and default hint has preferred false",
            r3,
            three(n0_half()),
            assign(&[("pod1", "container1", vec![b(&[0], "memory", 512 * MB)])]),
            guaranteed_pod("pod2", "container2"),
            TopologyHint {
                affinity: None,
                preferred: true,
            },
            Err(MemoryError::NoDefaultPreferredHint),
        ),
        (
            "should fail when NUMA affinity provided under the topology manager hint did not satisfy container requirements and extended hint generation failed",
            r3,
            ms(vec![
                node(
                    0,
                    &[0],
                    &[
                        ("memory", t(512 * MB, 512 * MB, 0, 512 * MB, GB)),
                        (HP1G, t(GB, GB, 0, 0, GB)),
                    ],
                ),
                node(
                    1,
                    &[1, 2],
                    &[
                        ("memory", t(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB)),
                        (HP1G, t(GB, GB, 0, 0, GB)),
                    ],
                ),
                node(
                    1,
                    &[1, 2],
                    &[
                        ("memory", t(1536 * MB, 512 * MB, GB, 512 * MB, 2 * GB)),
                        (HP1G, t(GB, GB, 0, 0, GB)),
                    ],
                ),
            ]),
            assign(&[]),
            guaranteed_pod("pod1", "container1"),
            TopologyHint::new(mask(&[0]), false),
            Err(MemoryError::NoExtension),
        ),
        (
            "should fail when the topology manager provided the preferred hint and extended hint has preferred false",
            r3,
            three(n0_half()),
            assign(&[("pod1", "container1", vec![b(&[0], "memory", 512 * MB)])]),
            guaranteed_pod("pod2", "container2"),
            TopologyHint::new(mask(&[1]), true),
            Err(MemoryError::NoExtendedPreferredHint),
        ),
        (
            "should succeed to allocate memory from multiple NUMA nodes",
            r4,
            ms(vec![
                small(&[0], 0),
                small(&[1], 0),
                small(&[2], 0),
                small(&[3], 0),
            ]),
            assign(&[]),
            guaranteed_pod("pod1", "container1"),
            TopologyHint {
                affinity: None,
                preferred: true,
            },
            Ok((
                assign(&[("pod1", "container1", both(&[0, 1]))]),
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
                    small(&[2], 0),
                    small(&[3], 0),
                ]),
            )),
        ),
    ];
    for (name, res, state, a, p, hint, want) in cases {
        let mut policy = policy(res, NumaTopology::default(), state, a);
        let c = p.spec.as_ref().unwrap().containers[0].clone();
        let r = policy.allocate(&p, &c, &hint);
        match want {
            Err(e) => assert_eq!(r, Err(e), "{name}"),
            Ok((wa, wms)) => {
                assert_eq!(r, Ok(()), "{name}");
                check(&policy, name, &wa, &wms);
            }
        }
    }
    // The errors as kubelet prints them.
    assert_eq!(
        MemoryError::NoDefaultAffinity.to_string(),
        "[memorymanager] failed to get the default NUMA affinity, no NUMA nodes with enough memory is available"
    );
}

#[test]
fn static_policy_allocate_with_init_containers() {
    // (init sizes, app sizes, node memory GiB, reusable preset for another pod, expected init
    // blocks after reuse, expected reserved, expected free)
    type InitCase = (
        &'static str,
        [u64; 2],
        [u64; 2],
        u64,
        bool,
        [u64; 2],
        u64,
        u64,
    );
    let cases: &[InitCase] = &[
        (
            "init containers requests 1Gi and 2Gi, apps containers 3Gi and 4Gi",
            [1, 2],
            [3, 4],
            8,
            false,
            [0, 0],
            7 * GB,
            512 * MB,
        ),
        (
            "init containers requests 4Gi and 3Gi, apps containers 2Gi and 1Gi",
            [4, 3],
            [2, 1],
            8,
            false,
            [0, GB],
            4 * GB,
            3584 * MB,
        ),
        (
            "init containers requests 7Gi and 4Gi, apps containers 4Gi and 3Gi",
            [7, 4],
            [4, 3],
            8,
            false,
            [0, 0],
            7 * GB,
            512 * MB,
        ),
        (
            "init containers requests 7Gi and 4Gi, apps containers 5Gi and 2Gi",
            [7, 4],
            [5, 2],
            10,
            true,
            [0, 0],
            7 * GB,
            3072 * MB,
        ),
    ];
    for (name, init, apps, gib, preset, want_init, want_reserved, want_free) in cases {
        let c = |n: &str, size: u64| g(n, &format!("{size}Gi"), HP1G, &format!("{size}Gi"));
        let p = pod(
            "pod1",
            vec![c("container1", apps[0]), c("container2", apps[1])],
            vec![c("initContainer1", init[0]), c("initContainer2", init[1])],
        );
        let total = gib * GB;
        // kubelet's 10Gi table has the whole node allocatable despite its 512Mi reserved.
        let alloc = if *gib == 10 { total } else { total - 512 * MB };
        let state = ms(vec![node(
            0,
            &[0],
            &[
                ("memory", t(alloc, alloc, 0, 512 * MB, total)),
                (HP1G, t(total, total, 0, 0, total)),
            ],
        )]);
        let mut policy = policy(
            &[(0, 512 * MB)],
            NumaTopology::default(),
            state,
            assign(&[]),
        );
        if *preset {
            policy = policy.with_reusable("pod0");
        }
        let spec = p.spec.clone().unwrap();
        for c in spec
            .init_containers
            .iter()
            .flatten()
            .chain(&spec.containers)
        {
            assert_eq!(
                policy.allocate(&p, c, &TopologyHint::default()),
                Ok(()),
                "{name}"
            );
        }
        let blocks = |size: u64| vec![b(&[0], "memory", size), b(&[0], HP1G, size)];
        let want = assign(&[
            ("pod1", "initContainer1", blocks(want_init[0])),
            ("pod1", "initContainer2", blocks(want_init[1])),
            ("pod1", "container1", blocks(apps[0] * GB)),
            ("pod1", "container2", blocks(apps[1] * GB)),
        ]);
        let hp_free = total - want_reserved;
        let want_ms = ms(vec![node(
            8,
            &[0],
            &[
                (
                    "memory",
                    t(alloc, *want_free, *want_reserved, 512 * MB, total),
                ),
                (HP1G, t(total, hp_free, *want_reserved, 0, total)),
            ],
        )]);
        check(&policy, name, &want, &want_ms);
    }
}

#[test]
fn static_policy_allocate_with_restartable_init_containers() {
    let sidecar = |name: &str, size: &str| Container {
        restart_policy: Some("Always".to_owned()),
        ..g(name, size, HP1G, size)
    };
    // should do nothing once containers already exist under the state file
    let existing = assign(&[
        ("pod1", "initContainer1", vec![b(&[0], "memory", GB)]),
        ("pod1", "container1", vec![b(&[0], "memory", GB)]),
    ]);
    let state = ms(vec![node(
        0,
        &[],
        &[
            (
                "memory",
                t(2560 * MB, 512 * MB, 2048 * MB, 512 * MB, 3 * GB),
            ),
            (HP1G, t(2 * GB, 2 * GB, 0, 0, 2 * GB)),
        ],
    )]);
    let mut p = policy(
        &[(0, 512 * MB)],
        NumaTopology::default(),
        state.clone(),
        existing.clone(),
    );
    let pd = pod(
        "pod1",
        vec![g("container1", "1Gi", HP1G, "1Gi")],
        vec![sidecar("initContainer1", "1Gi")],
    );
    let spec = pd.spec.clone().unwrap();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        assert_eq!(p.allocate(&pd, c, &TopologyHint::default()), Ok(()));
    }
    check(&p, "existing", &existing, &state);

    // should not re-use restartable init containers memory
    let state = ms(vec![node(
        0,
        &[0],
        &[
            ("memory", t(7 * GB, 7 * GB, 0, 512 * MB, 7680 * MB)),
            (HP1G, t(7 * GB, 7 * GB, 0, 0, 7 * GB)),
        ],
    )]);
    let mut p = policy(
        &[(0, 512 * MB)],
        NumaTopology::default(),
        state,
        assign(&[]),
    );
    let pd = pod(
        "pod1",
        vec![g("container1", "1Gi", HP1G, "1Gi")],
        vec![
            g("initContainer1", "1Gi", HP1G, "1Gi"),
            sidecar("restartableInitContainer2", "2Gi"),
            g("initContainer3", "3Gi", HP1G, "3Gi"),
            sidecar("restartableInitContainer4", "4Gi"),
        ],
    );
    let spec = pd.spec.clone().unwrap();
    for c in spec
        .init_containers
        .iter()
        .flatten()
        .chain(&spec.containers)
    {
        assert_eq!(
            p.allocate(&pd, c, &TopologyHint::default()),
            Ok(()),
            "{}",
            c.name
        );
    }
    let blocks = |size: u64| vec![b(&[0], "memory", size), b(&[0], HP1G, size)];
    let want = assign(&[
        ("pod1", "initContainer1", blocks(0)),
        ("pod1", "restartableInitContainer2", blocks(2 * GB)),
        ("pod1", "initContainer3", blocks(0)),
        ("pod1", "restartableInitContainer4", blocks(4 * GB)),
        ("pod1", "container1", blocks(GB)),
    ]);
    let want_ms = ms(vec![node(
        10,
        &[0],
        &[
            ("memory", t(7 * GB, 0, 7 * GB, 512 * MB, 7680 * MB)),
            (HP1G, t(7 * GB, 0, 7 * GB, 0, 7 * GB)),
        ],
    )]);
    check(&p, "restartable", &want, &want_ms);
}
