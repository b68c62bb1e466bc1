//! `policy_static_test.go`, ported table by table (the allocation tables in [`allocate`], the
//! removal and hints tables in [`hints`]): `TestStaticPolicyNew`,
//! `TestStaticPolicyStart`, `TestStaticPolicyAllocate`,
//! `TestStaticPolicyAllocateWithInitContainers`, `TestStaticPolicyRemoveContainer`,
//! `TestStaticPolicyGetTopologyHints`. Machine states are compared as kubelet's tests compare
//! them (`areMachineStatesEqual`), assignments exactly.

use std::collections::BTreeMap;

use k8s_openapi::{
    api::core::v1::{Container, Pod, PodSpec},
    apimachinery::pkg::apis::meta::v1::ObjectMeta,
};

use super::{
    Block, ContainerMemoryAssignments, MemoryError, MemoryState, MemoryTable, NumaNodeMap,
    NumaNodeState, StaticPolicy, SystemReservedMemory, static_policy::machine_states_equal,
};
use crate::policy::{
    resources::test_pods::container,
    topology::{BitMask, HugePages, NumaCell, NumaTopology, ProviderHints, TopologyHint},
};

mod allocate;
mod hints;

const MB: u64 = 1 << 20;
const GB: u64 = 1 << 30;
const HP1G: &str = "hugepages-1Gi";
const HP2M: &str = "hugepages-2Mi";

/// `MemoryTable{Allocatable, Free, Reserved, SystemReserved, TotalMemSize}` in the tests' order.
fn t(allocatable: u64, free: u64, reserved: u64, system_reserved: u64, total: u64) -> MemoryTable {
    MemoryTable {
        total_mem_size: total,
        system_reserved,
        allocatable,
        reserved,
        free,
    }
}

fn node(assignments: i64, cells: &[usize], tables: &[(&str, MemoryTable)]) -> NumaNodeState {
    NumaNodeState {
        number_of_assignments: assignments,
        memory_map: tables.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect(),
        cells: cells.to_vec(),
    }
}

fn ms(nodes: Vec<NumaNodeState>) -> NumaNodeMap {
    nodes.into_iter().enumerate().collect()
}

fn b(affinity: &[usize], resource: &str, size: u64) -> Block {
    Block {
        numa_affinity: affinity.to_vec(),
        resource: resource.to_owned(),
        size,
    }
}

fn assign(items: &[(&str, &str, Vec<Block>)]) -> ContainerMemoryAssignments {
    let mut out = ContainerMemoryAssignments::new();
    for (pod, c, blocks) in items {
        out.entry((*pod).to_owned())
            .or_default()
            .insert((*c).to_owned(), blocks.clone());
    }
    out
}

fn reserved(nodes: &[(usize, u64)]) -> SystemReservedMemory {
    nodes
        .iter()
        .map(|(n, v)| (*n, [("memory".to_owned(), *v)].into()))
        .collect()
}

/// One cell per `(memory, 1Gi pages)`.
fn machine(cells: &[(u64, u64)]) -> NumaTopology {
    NumaTopology {
        cells: cells
            .iter()
            .enumerate()
            .map(|(id, (memory, pages))| NumaCell {
                id,
                memory: *memory,
                hugepages: vec![HugePages {
                    page_size_kib: 1_048_576,
                    num_pages: *pages,
                }],
                cpus: crate::policy::cpu::CpuSet::default(),
            })
            .collect(),
    }
}

/// A Guaranteed container: cpu 1000Mi, memory and hugepages requested as limited.
fn g(name: &str, memory: &str, hp: &str, hp_size: &str) -> Container {
    let r = format!("cpu=1000Mi,memory={memory},{hp}={hp_size}");
    container(name, &r, &r)
}

fn burstable(name: &str) -> Container {
    container(
        name,
        "cpu=1000Mi,memory=1Gi,hugepages-1Gi=1Gi",
        "cpu=1000Mi,memory=2Gi,hugepages-1Gi=2Gi",
    )
}

fn pod(uid: &str, containers: Vec<Container>, init: Vec<Container>) -> Pod {
    Pod {
        metadata: ObjectMeta {
            name: Some(uid.to_owned()),
            uid: Some(uid.to_owned()),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers,
            init_containers: (!init.is_empty()).then_some(init),
            ..Default::default()
        }),
        status: None,
    }
}

fn guaranteed_pod(uid: &str, name: &str) -> Pod {
    pod(uid, vec![g(name, "1Gi", HP1G, "1Gi")], vec![])
}

fn policy(
    res: &[(usize, u64)],
    m: NumaTopology,
    machine_state: NumaNodeMap,
    a: ContainerMemoryAssignments,
) -> StaticPolicy {
    StaticPolicy::new(m, reserved(res))
        .unwrap()
        .with_state(MemoryState {
            machine_state,
            assignments: a,
        })
}

fn mask(bits: &[usize]) -> BitMask {
    BitMask::new(bits).unwrap()
}

/// Blocks in a stable order (kubelet's tests compare them as sets: `areMemoryBlocksEqual`).
fn sorted(a: &ContainerMemoryAssignments) -> ContainerMemoryAssignments {
    let mut a = a.clone();
    for blocks in a.values_mut().flat_map(BTreeMap::values_mut) {
        blocks.sort_by(|x, y| x.resource.cmp(&y.resource));
    }
    a
}

fn check(
    p: &StaticPolicy,
    name: &str,
    want_assign: &ContainerMemoryAssignments,
    want_ms: &NumaNodeMap,
) {
    assert_eq!(
        sorted(&p.state().assignments),
        sorted(want_assign),
        "{name}: assignments"
    );
    assert!(
        machine_states_equal(&p.state().machine_state, want_ms),
        "{name}: machine state {:#?} != {want_ms:#?}",
        p.state().machine_state
    );
}

#[test]
fn static_policy_new() {
    assert_eq!(
        StaticPolicy::new(NumaTopology::default(), SystemReservedMemory::new()).unwrap_err(),
        MemoryError::NoSystemReserved
    );
    let r: SystemReservedMemory = [
        (0, BTreeMap::new()),
        (1, [("memory".to_owned(), 512 * MB)].into()),
    ]
    .into();
    assert!(StaticPolicy::new(NumaTopology::default(), r).is_ok());
}

#[test]
fn static_policy_start() {
    let differs = MemoryError::MachineStateDiffers;
    let one_2g = machine(&[(2 * GB, 1)]);
    let base = || {
        vec![node(
            0,
            &[0],
            &[
                ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
                (HP1G, t(GB, GB, 0, 0, GB)),
            ],
        )]
    };
    type StartCase = (
        &'static str,
        NumaTopology,
        NumaNodeMap,
        ContainerMemoryAssignments,
        Result<NumaNodeMap, MemoryError>,
    );
    let cases: Vec<StartCase> = vec![
        (
            "should fail, if machine state is empty, but it has memory assignments",
            NumaTopology::default(),
            NumaNodeMap::new(),
            assign(&[("pod", "container1", vec![b(&[0], "memory", 512 * MB)])]),
            Err(MemoryError::EmptyMachineState),
        ),
        (
            "should fill the state with default values, when the state is empty",
            machine(&[(3 * GB, 1)]),
            NumaNodeMap::new(),
            assign(&[]),
            Ok(ms(vec![node(
                0,
                &[0],
                &[
                    ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 3 * GB)),
                    (HP1G, t(GB, GB, 0, 0, GB)),
                ],
            )])),
        ),
        (
            "should fail when machine state does not have all NUMA nodes",
            machine(&[(2 * GB, 1), (2 * GB, 1)]),
            ms(base()),
            assign(&[]),
            Err(differs.clone()),
        ),
        (
            "should fail when machine state does not have memory resource",
            one_2g.clone(),
            ms(vec![node(0, &[0], &[(HP1G, t(GB, GB, 0, 0, GB))])]),
            assign(&[]),
            Err(differs.clone()),
        ),
        (
            "should fail when machine state has wrong size of total memory",
            one_2g.clone(),
            ms(vec![node(
                0,
                &[0],
                &[("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 1536 * MB))],
            )]),
            assign(&[]),
            Err(differs.clone()),
        ),
        (
            "should fail when machine state has wrong size of system reserved memory",
            one_2g.clone(),
            ms(vec![node(
                0,
                &[0],
                &[("memory", t(1536 * MB, 1536 * MB, 0, 1024, 2 * GB))],
            )]),
            assign(&[]),
            Err(differs.clone()),
        ),
        (
            "should fail when machine state reserved memory is different from the memory of all containers memory assignments",
            one_2g.clone(),
            ms(vec![node(
                1,
                &[0],
                &[("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB))],
            )]),
            assign(&[("pod", "container1", vec![b(&[0], "memory", 512 * MB)])]),
            Err(differs.clone()),
        ),
        (
            "should fail when machine state has wrong size of hugepages",
            machine(&[(2 * GB, 2)]),
            ms(base()),
            assign(&[]),
            Err(differs.clone()),
        ),
        (
            "should fail when machine state has wrong size of system reserved hugepages",
            machine(&[(2 * GB, 2)]),
            ms(vec![node(
                0,
                &[0],
                &[
                    ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
                    (HP1G, t(GB, GB, 0, GB, 2 * GB)),
                ],
            )]),
            assign(&[]),
            Err(differs.clone()),
        ),
        (
            "should fail when the hugepages reserved machine state is different from the hugepages of all containers memory assignments",
            machine(&[(2 * GB, 4)]),
            ms(vec![node(
                2,
                &[0],
                &[
                    ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
                    (HP1G, t(4 * GB, GB, 3 * GB, 0, 4 * GB)),
                ],
            )]),
            assign(&[
                ("pod1", "container1", vec![b(&[0], HP1G, GB)]),
                ("pod2", "container2", vec![b(&[0], HP1G, GB)]),
            ]),
            Err(differs.clone()),
        ),
        (
            "should fail when machine state does not have NUMA node that used under the memory assignment",
            one_2g.clone(),
            ms(base()),
            assign(&[("pod1", "container1", vec![b(&[1], "memory", GB)])]),
            Err(MemoryError::AssignmentNodeMissing {
                pod: "pod1".into(),
                container: "container1".into(),
            }),
        ),
        (
            "should fail when machine state does not have resource that used under the memory assignment",
            one_2g.clone(),
            ms(vec![node(
                2,
                &[0],
                &[
                    ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
                    (HP1G, t(GB, GB, 0, 0, GB)),
                ],
            )]),
            assign(&[(
                "pod1",
                "container1",
                vec![b(&[0], "memory", GB), b(&[0], HP2M, GB)],
            )]),
            Err(MemoryError::AssignmentResourceMissing {
                pod: "pod1".into(),
                container: "container1".into(),
            }),
        ),
        (
            "should fail when machine state number of assignments is different from the expected one",
            one_2g,
            ms(vec![node(
                1,
                &[0],
                &[
                    ("memory", t(1536 * MB, 1536 * MB, 0, 512 * MB, 2 * GB)),
                    (HP1G, t(GB, GB, 0, 0, GB)),
                ],
            )]),
            assign(&[(
                "pod1",
                "container1",
                vec![b(&[0], "memory", GB), b(&[0], HP1G, GB)],
            )]),
            Err(differs),
        ),
        {
            let cross = || {
                ms(vec![
                    node(
                        4,
                        &[0, 1],
                        &[
                            ("memory", t(640 * MB, 0, 640 * MB, 512 * MB, 2176 * MB)),
                            (HP1G, t(GB, 0, GB, 0, GB)),
                        ],
                    ),
                    node(
                        4,
                        &[0, 1],
                        &[
                            (
                                "memory",
                                t(640 * MB, 256 * MB, 384 * MB, 512 * MB, 2176 * MB),
                            ),
                            (HP1G, t(GB, 0, GB, 0, GB)),
                        ],
                    ),
                ])
            };
            (
                "should validate cross NUMA reserved memory vs container assignments",
                machine(&[(2176 * MB, 1), (2176 * MB, 1)]),
                cross(),
                assign(&[
                    (
                        "pod1",
                        "container1",
                        vec![b(&[0, 1], "memory", 768 * MB), b(&[0, 1], HP1G, GB)],
                    ),
                    (
                        "pod2",
                        "container2",
                        vec![b(&[0, 1], "memory", 256 * MB), b(&[0, 1], HP1G, GB)],
                    ),
                ]),
                Ok(cross()),
            )
        },
    ];
    for (name, m, state, a, want) in cases {
        let res = if name.contains("cross NUMA") {
            &[(0, 512 * MB), (1, 512 * MB)][..]
        } else {
            &[(0, 512 * MB)][..]
        };
        let mut p = StaticPolicy::new(m, reserved(res)).unwrap();
        let r = p.start(MemoryState {
            machine_state: state,
            assignments: a.clone(),
        });
        match want {
            Err(e) => assert_eq!(r, Err(e), "{name}"),
            Ok(want_ms) => {
                assert_eq!(r, Ok(()), "{name}");
                check(&p, name, &a, &want_ms);
            }
        }
    }
}
