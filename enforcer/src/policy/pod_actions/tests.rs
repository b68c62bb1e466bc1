use super::*;

fn pod(policy: &str, inits: &[(&str, bool)], apps: &[&str]) -> Pod {
    let c = |name: &str| Container {
        name: name.to_owned(),
        image: Some("busybox:local".to_owned()),
        ..Default::default()
    };
    let mut p = Pod::default();
    p.metadata.uid = Some("u".to_owned());
    p.metadata.name = Some("p".to_owned());
    p.metadata.namespace = Some("ns".to_owned());
    p.spec = Some(k8s_openapi::api::core::v1::PodSpec {
        restart_policy: Some(policy.to_owned()),
        init_containers: Some(
            inits
                .iter()
                .map(|(n, sidecar)| Container {
                    restart_policy: sidecar.then(|| "Always".to_owned()),
                    ..c(n)
                })
                .collect(),
        ),
        containers: apps.iter().map(|n| c(n)).collect(),
        ..Default::default()
    });
    p
}

fn sandbox(id: &str, ready: bool, current: bool, attempt: u32) -> SandboxView {
    SandboxView {
        id: id.to_owned(),
        ready,
        current,
        attempt,
        created_at: i64::from(attempt),
    }
}

/// Container `name` in sandbox `s`, state, created at `at`, restart count `n`.
fn ctr(name: &str, s: &str, state: RuntimeState, at: i64, n: u32) -> ContainerView {
    ContainerView {
        id: format!("{name}-{at}"),
        name: name.to_owned(),
        sandbox_id: s.to_owned(),
        state,
        current: true,
        restart_count: n,
        created_at: at,
        started: true,
    }
}

const RUN: RuntimeState = RuntimeState::Running;
const OK: RuntimeState = RuntimeState::Exited { code: 0 };
const ERR: RuntimeState = RuntimeState::Exited { code: 1 };

fn hash(c: &Container) -> String {
    format!("h-{}", c.name)
}

fn plan(p: &Pod, rt: &PodRuntime) -> PodActions {
    let now = Instant::now();
    compute_pod_actions(p, rt, &hash, &Backoff::default(), &HashMap::new(), now)
}

fn starts(a: &PodActions) -> Vec<(&str, u32, &Replace)> {
    a.start
        .iter()
        .map(|s| (s.name.as_str(), s.restart_count, &s.replace))
        .collect()
}

/// kubelet's `TestComputePodActions`, the cases our pod worker has.
#[test]
fn compute_pod_actions_table() {
    // No sandbox: create one (attempt 0), start every app container.
    let p = pod("Always", &[], &["a", "b"]);
    let a = plan(&p, &PodRuntime::default());
    assert_eq!(
        a.sandbox,
        SandboxPlan::Create {
            attempt: 0,
            kill_first: false
        }
    );
    assert_eq!(
        starts(&a),
        [("a", 0, &Replace::Nothing), ("b", 0, &Replace::Nothing)]
    );

    // Everything running: nothing to do.
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s", true, true, 0)],
        containers: vec![ctr("a", "s", RUN, 1, 0), ctr("b", "s", RUN, 1, 0)],
    };
    let a = plan(&p, &rt);
    assert_eq!(a.sandbox, SandboxPlan::Keep("s".to_owned()));
    assert!(a.start.is_empty(), "{a:?}");

    // Sandbox not ready: kill the pod, new sandbox with the next attempt, counts from 0.
    let mut dead = rt.clone();
    dead.sandboxes[0].ready = false;
    let a = plan(&p, &dead);
    assert_eq!(
        a.sandbox,
        SandboxPlan::Create {
            attempt: 1,
            kill_first: true
        }
    );
    assert_eq!(starts(&a).len(), 2);

    // Sandbox definition changed: the same.
    let mut changed = rt.clone();
    changed.sandboxes[0].current = false;
    assert!(matches!(
        plan(&p, &changed).sandbox,
        SandboxPlan::Create {
            kill_first: true,
            ..
        }
    ));

    // One container exited: restarted (Always), count from the highest, older exited
    // instances removed after the start.
    let mut exited = rt.clone();
    exited.containers[1] = ctr("b", "s", ERR, 5, 3);
    exited.containers.push(ctr("b", "s", ERR, 2, 2));
    let a = plan(&p, &exited);
    assert_eq!(
        starts(&a),
        [(
            "b",
            4,
            &Replace::Restart {
                exited: "b-5".to_owned(),
                backoff_key: "u/b/h-b".to_owned(),
                remove_older: vec!["b-2".to_owned()],
            }
        )]
    );

    // OnFailure: exit 0 stays; Never: nothing restarts.
    exited.containers[1] = ctr("b", "s", OK, 5, 3);
    assert!(
        plan(&pod("OnFailure", &[], &["a", "b"]), &exited)
            .start
            .is_empty()
    );
    exited.containers[1] = ctr("b", "s", ERR, 5, 3);
    assert_eq!(
        plan(&pod("OnFailure", &[], &["a", "b"]), &exited)
            .start
            .len(),
        1
    );
    assert!(
        plan(&pod("Never", &[], &["a", "b"]), &exited)
            .start
            .is_empty()
    );

    // A running container of an old definition: stopped and replaced.
    let mut old = rt.clone();
    old.containers[0].current = false;
    assert_eq!(
        starts(&plan(&p, &old)),
        [("a", 1, &Replace::Stop("a-1".to_owned()))]
    );

    // Created and never started: started, not created again; unknown state: removed.
    let mut created = rt.clone();
    created.containers[0].state = RuntimeState::Created;
    created.containers[1].state = RuntimeState::Unknown;
    assert_eq!(
        starts(&plan(&p, &created)),
        [
            ("a", 1, &Replace::StartCreated("a-1".to_owned())),
            ("b", 1, &Replace::Remove("b-1".to_owned()))
        ]
    );
}

#[test]
fn a_pod_that_ran_to_its_end_is_not_started_again() {
    let mut rt = PodRuntime {
        sandboxes: vec![sandbox("s", false, true, 0)],
        containers: vec![ctr("a", "s", OK, 1, 0)],
    };
    for policy in ["Never", "OnFailure"] {
        assert_eq!(
            plan(&pod(policy, &[], &["a"]), &rt).sandbox,
            SandboxPlan::Finished("s".to_owned()),
            "{policy}"
        );
    }
    // Always: a new sandbox.
    assert!(matches!(
        plan(&pod("Always", &[], &["a"]), &rt).sandbox,
        SandboxPlan::Create { attempt: 1, .. }
    ));
    // OnFailure with a failed container: a new sandbox; Never: finished.
    rt.containers[0].state = ERR;
    assert!(matches!(
        plan(&pod("OnFailure", &[], &["a"]), &rt).sandbox,
        SandboxPlan::Create { .. }
    ));
    assert_eq!(
        plan(&pod("Never", &[], &["a"]), &rt).sandbox,
        SandboxPlan::Finished("s".to_owned())
    );
}

#[test]
fn init_containers_one_at_a_time_sidecars_keep_running() {
    let p = pod(
        "Always",
        &[("side", true), ("i1", false), ("i2", false)],
        &["app"],
    );
    let s = |containers| PodRuntime {
        sandboxes: vec![sandbox("s", true, true, 0)],
        containers,
    };
    // Fresh sandbox: the sidecar and the first init container start; nothing after.
    let a = plan(&p, &s(vec![]));
    let names: Vec<&str> = a.start.iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["side", "i1"]);
    assert_eq!(a.start[0].kind, ContainerKind::Sidecar);
    // i1 running: wait.
    let a = plan(
        &p,
        &s(vec![ctr("side", "s", RUN, 1, 0), ctr("i1", "s", RUN, 1, 0)]),
    );
    assert!(a.start.is_empty(), "{a:?}");
    // i1 done: i2.
    let a = plan(
        &p,
        &s(vec![ctr("side", "s", RUN, 1, 0), ctr("i1", "s", OK, 1, 0)]),
    );
    assert_eq!(a.start.len(), 1);
    assert_eq!(a.start[0].name, "i2");
    // All done: the app.
    let a = plan(
        &p,
        &s(vec![
            ctr("side", "s", RUN, 1, 0),
            ctr("i1", "s", OK, 1, 0),
            ctr("i2", "s", OK, 1, 0),
        ]),
    );
    assert_eq!(a.start.len(), 1);
    assert_eq!(a.start[0].name, "app");
    // i1 failed under Always: restarted; under Never: the pod fails.
    let failed = s(vec![ctr("side", "s", RUN, 1, 0), ctr("i1", "s", ERR, 1, 0)]);
    let a = plan(&p, &failed);
    assert_eq!(a.start.len(), 1);
    assert!(!a.init_failed);
    let never = pod("Never", &[("side", true), ("i1", false)], &["app"]);
    let a = plan(&never, &failed);
    assert!(a.init_failed && a.start.is_empty(), "{a:?}");
    // The sidecar exited: restarted (whatever the pod's policy), and the sequence waits.
    let a = plan(&never, &s(vec![ctr("side", "s", OK, 1, 0)]));
    assert_eq!(starts(&a).len(), 1);
    assert_eq!(a.start[0].name, "side");
}

#[test]
fn crash_backoff_waits_and_names_the_container() {
    let p = pod("Always", &[], &["c"]);
    let rt = PodRuntime {
        sandboxes: vec![sandbox("s", true, true, 0)],
        containers: vec![ctr("c", "s", ERR, 2, 1)],
    };
    let t0 = Instant::now();
    let mut backoff = Backoff::default();
    // Restarted once already: the next exit waits 10 s from when it was seen.
    backoff.next("u/c/h-c", t0);
    let seen = HashMap::from([("c-2".to_owned(), t0)]);
    let a = compute_pod_actions(&p, &rt, &hash, &backoff, &seen, t0 + Duration::from_secs(3));
    assert!(a.start.is_empty());
    assert_eq!(a.wake, Some(t0 + Duration::from_secs(10)));
    assert_eq!(
        a.backoff[0].message,
        "back-off 10s restarting failed container=c pod=p_ns(u)"
    );
    let a = compute_pod_actions(
        &p,
        &rt,
        &hash,
        &backoff,
        &seen,
        t0 + Duration::from_secs(10),
    );
    assert_eq!(a.start.len(), 1);
    assert!(a.backoff.is_empty());
}

#[test]
fn phases() {
    use AppState::*;
    use RestartPolicy::*;
    let cases: &[(RestartPolicy, bool, bool, &[AppState], PodPhase)] = &[
        (Always, false, true, &[Waiting], PodPhase::Pending),
        (Never, true, false, &[Waiting], PodPhase::Failed),
        (Always, false, false, &[Running, Waiting], PodPhase::Pending),
        (
            Always,
            false,
            false,
            &[Running, Exited { code: 1 }],
            PodPhase::Running,
        ),
        (
            Always,
            false,
            false,
            &[Exited { code: 0 }],
            PodPhase::Running,
        ),
        (
            OnFailure,
            false,
            false,
            &[Exited { code: 0 }],
            PodPhase::Succeeded,
        ),
        (
            OnFailure,
            false,
            false,
            &[Exited { code: 2 }],
            PodPhase::Running,
        ),
        (
            Never,
            false,
            false,
            &[Exited { code: 0 }, Exited { code: 0 }],
            PodPhase::Succeeded,
        ),
        (
            Never,
            false,
            false,
            &[Exited { code: 0 }, Exited { code: 137 }],
            PodPhase::Failed,
        ),
    ];
    for (policy, init_failed, init_pending, apps, want) in cases {
        assert_eq!(
            pod_phase(*policy, *init_failed, *init_pending, apps),
            *want,
            "{policy:?} {apps:?}"
        );
    }
}

#[test]
fn phases_serialize_as_kubelets_strings() {
    for p in [
        PodPhase::Pending,
        PodPhase::Running,
        PodPhase::Succeeded,
        PodPhase::Failed,
        PodPhase::Terminating,
    ] {
        let json = serde_json::to_string(&p).expect("json");
        assert_eq!(json, format!("\"{}\"", p.as_str()));
        assert_eq!(serde_json::from_str::<PodPhase>(&json).expect("back"), p);
    }
}

/// kubelet's `computeInitContainerActions`: a sidecar with a startup probe holds the
/// containers after it until the probe succeeded; restarts are not held.
#[test]
fn a_sidecars_startup_probe_holds_the_first_start_of_later_containers() {
    let mut p = pod("Always", &[("side", true), ("i1", false)], &["app"]);
    if let Some(s) = p.spec.as_mut()
        && let Some(inits) = s.init_containers.as_mut()
    {
        inits[0].startup_probe = Some(k8s_openapi::api::core::v1::Probe::default());
    }
    let s = |containers| PodRuntime {
        sandboxes: vec![sandbox("s", true, true, 0)],
        containers,
    };
    let names =
        |a: &PodActions| -> Vec<String> { a.start.iter().map(|x| x.name.clone()).collect() };
    // Fresh pod: the sidecar starts now (not started yet), nothing after it.
    assert_eq!(names(&plan(&p, &PodRuntime::default())), ["side"]);
    assert_eq!(names(&plan(&p, &s(vec![]))), ["side"]);
    // Running, before its startup probe: i1 waits; once started, i1 starts.
    let mut side = ctr("side", "s", RUN, 1, 0);
    side.started = false;
    assert!(plan(&p, &s(vec![side.clone()])).start.is_empty());
    side.started = true;
    assert_eq!(names(&plan(&p, &s(vec![side.clone()]))), ["i1"]);
    // A later container's restart is not held by a sidecar restarted meanwhile.
    side.started = false;
    let a = plan(
        &p,
        &s(vec![
            side.clone(),
            ctr("i1", "s", OK, 1, 0),
            ctr("app", "s", ERR, 2, 0),
        ]),
    );
    assert_eq!(names(&a), ["app"]);
    assert!(
        matches!(a.start[0].replace, Replace::Restart { .. }),
        "{a:?}"
    );
    // An instance in another sandbox does not hold anything: the next sandbox's plan is
    // the sidecar alone (it starts now).
    let mut dead = s(vec![side]);
    dead.sandboxes[0].ready = false;
    assert_eq!(names(&plan(&p, &dead)), ["side"]);
    // Without a startup probe: no gate.
    let q = pod("Always", &[("side", true), ("i1", false)], &["app"]);
    assert_eq!(names(&plan(&q, &s(vec![]))), ["side", "i1"]);
}

#[test]
fn effective_exit_codes() {
    for (code, killed, want) in [(0, false, 0), (0, true, 1), (137, true, 137), (2, false, 2)] {
        assert_eq!(effective_exit_code(code, killed), want, "{code} {killed}");
    }
}

/// kubelet's `computePodActions` / `computeInitContainerActions` messages and
/// `setTerminationGracePeriod`.
#[test]
fn probe_kill_table() {
    use FailedProbe::{Liveness, Startup};
    let with_deletion = |mut p: Pod, g: i64| {
        p.metadata.deletion_grace_period_seconds = Some(g);
        p
    };
    #[expect(clippy::type_complexity, reason = "a table")]
    let cases: Vec<(Pod, &str, FailedProbe, Option<i64>, &str, i64)> = vec![
        (
            pod("Always", &[], &["c"]),
            "c",
            Liveness,
            None,
            "Container c failed liveness probe, will be restarted",
            30,
        ),
        (
            pod("OnFailure", &[], &["c"]),
            "c",
            Startup,
            Some(5),
            "Container c failed startup probe, will be restarted",
            5,
        ),
        (
            pod("Never", &[], &["c"]),
            "c",
            Liveness,
            Some(1),
            "Container c failed liveness probe",
            2,
        ),
        (
            pod("Never", &[("side", true)], &["c"]),
            "side",
            Startup,
            None,
            "Init container side failed startup probe",
            30,
        ),
        (
            with_deletion(pod("Always", &[], &["c"]), 7),
            "c",
            Liveness,
            Some(5),
            "Container c failed liveness probe, will be restarted",
            7,
        ),
    ];
    for (p, name, probe, probe_grace, message, grace) in cases {
        assert_eq!(
            probe_kill(&p, name, probe, probe_grace, 30, 2),
            ProbeKill {
                message: message.to_owned(),
                grace
            },
            "{name} {probe:?}"
        );
    }
}
