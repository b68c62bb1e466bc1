//! Images from real registries (the `images` tier): kubelet's image manager in the enforcer's
//! pod runtime against a private containerd and Debian's `docker-registry` (HTTPS with a test
//! CA, HTTPS with basic auth, a plain-HTTP mirror; see `enforcer_tests::registry`). What
//! happened at the registry is read from its own log: which repositories were asked for, in
//! what order, and whether two pulls overlapped. Needs root, containerd and docker-registry;
//! fails loudly without them.

use std::time::{Duration, Instant};

use enforcer::{
    cri::{
        ContainerRuntime as _, CriRuntime,
        images::{ImageGc, ImageManager, ImageOptions},
    },
    policy::{images::gc::GcPolicy, pod_status::ContainerState},
    recorder::EventType,
    status_manager::StatusFile,
};
use enforcer_tests::{
    containerd::Containerd,
    pods::{Enforcer, finish, pod, state, wait_status, write_manifest},
    registry::{
        AUTH_PASSWORD, AUTH_USER, Access, AccessKind, OciImage, Registries, Registry,
        docker_config, free_port, require_tools,
    },
};

fn start_registries() -> (tempfile::TempDir, Registries) {
    enforcer_tests::require_root();
    if let Err(e) = require_tools() {
        panic!("{e}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let regs = Registries::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (dir, regs)
}

fn push(r: &Registry, repo: &str, tag: &str, image: &OciImage) {
    r.push(repo, tag, image)
        .unwrap_or_else(|e| panic!("pushing {repo}:{tag} to {}: {e}", r.name));
}

fn log_of(r: &Registry) -> Vec<Access> {
    r.access_log()
        .unwrap_or_else(|e| panic!("reading the {} registry's log: {e}", r.name))
}

/// containerd's requests (not the fixture's pushes) that reached `repo`.
fn pulls_of(log: &[Access], repo: &str) -> usize {
    log.iter()
        .filter(|a| a.is_pull() && a.kind == AccessKind::Started && a.repo.as_deref() == Some(repo))
        .count()
}

fn pod_yaml(name: &str, uid: &str, spec_extra: &str, image: &str, policy: &str) -> String {
    let policy = if policy.is_empty() {
        String::new()
    } else {
        format!("    imagePullPolicy: {policy}\n")
    };
    format!(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: {name}\n  uid: {uid}\nspec:\n  hostNetwork: true\n  terminationGracePeriodSeconds: 1\n{spec_extra}  containers:\n  - name: c\n    image: {image}\n{policy}    command: [/bin/sleep, '3600']\n"
    )
}

fn state_of(s: &StatusFile, uid: &str) -> Option<ContainerState> {
    pod(s, uid)
        .and_then(|p| p.container_statuses.first())
        .map(|c| c.state.clone())
}

fn running(s: &StatusFile, uid: &str) -> bool {
    matches!(state_of(s, uid), Some(ContainerState::Running { .. }))
}

fn waiting(s: &StatusFile, uid: &str, reason: &str) -> Option<String> {
    match state_of(s, uid) {
        Some(ContainerState::Waiting { reason: r, message }) if r == reason => Some(message),
        _ => None,
    }
}

fn reasons(e: &mut Enforcer, name: &str) -> Vec<(EventType, String, String)> {
    e.events_of(name, "c")
}

/// Pull policies, pull secrets, kubelet's events and waiting reasons, the errors a pull meets
/// (bad reference, unreachable registry, wrong password, another platform), backoff and its
/// retry, all at once: the good pods run while the bad ones wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pull_policies_secrets_errors_and_backoff() {
    let (_dir, regs) = start_registries();
    let cd = Containerd::start("img-policy");
    regs.write_hosts(&cd.certs_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    let app = OciImage::busybox(256 << 10, 21).expect("image");
    let latest = OciImage::busybox(256 << 10, 22).expect("image");
    let private = OciImage::busybox(256 << 10, 23).expect("image");
    let mirrored = OciImage::busybox(256 << 10, 24).expect("image");
    let other = OciImage::other_platform().expect("image");
    push(&regs.tls, "team/app", "v1", &app);
    push(&regs.tls, "team/app", "latest", &latest);
    push(&regs.auth, "team/private", "v1", &private);
    // Each failing pod its own image: a present image is not pulled again (IfNotPresent).
    push(&regs.auth, "team/private2", "v1", &private);
    push(&regs.auth, "team/private3", "v1", &private);
    push(&regs.plain, "team/mirrored", "v1", &mirrored);
    push(&regs.tls, "team/other", "v1", &other);
    // Standalone pull secrets: docker config files by secret name.
    let secrets = cd.dir.join("pull-secrets");
    std::fs::create_dir_all(&secrets).expect("secret dir");
    let config = |user: &str, password: &str| docker_config(&regs.auth, user, password);
    std::fs::write(secrets.join("good.json"), config(AUTH_USER, AUTH_PASSWORD)).expect("secret");
    std::fs::write(secrets.join("bad.json"), config(AUTH_USER, "wrong")).expect("secret");

    let mut e = Enforcer::start(&cd);
    let app_ref = regs.tls.reference("team/app", "v1");
    let untagged = format!("{}/team/app", regs.tls.host);
    let private_ref = regs.auth.reference("team/private", "v1");
    let private2 = regs.auth.reference("team/private2", "v1");
    let private3 = regs.auth.reference("team/private3", "v1");
    let closed = format!("127.0.0.1:{}/team/app:v1", free_port().expect("port"));
    let pods = [
        ("ifnp", "img-1", String::new(), app_ref.clone(), ""),
        ("always", "img-2", String::new(), untagged.clone(), ""),
        (
            "never",
            "img-3",
            String::new(),
            regs.tls.reference("team/absent", "v1"),
            "Never",
        ),
        (
            "secret",
            "img-4",
            "  imagePullSecrets: [{name: good}]\n".to_owned(),
            private_ref.clone(),
            "",
        ),
        (
            "wrongpw",
            "img-5",
            "  imagePullSecrets: [{name: bad}]\n".to_owned(),
            private2.clone(),
            "",
        ),
        (
            "nosecret",
            "img-6",
            "  imagePullSecrets: [{name: missing}]\n".to_owned(),
            private3.clone(),
            "",
        ),
        (
            "badref",
            "img-7",
            String::new(),
            "bad image:v1".to_owned(),
            "",
        ),
        ("unreach", "img-8", String::new(), closed.clone(), ""),
        (
            "platform",
            "img-9",
            String::new(),
            regs.tls.reference("team/other", "v1"),
            "",
        ),
        (
            "mirror",
            "img-10",
            String::new(),
            Registries::mirror_reference("team/mirrored", "v1"),
            "",
        ),
    ];
    let t0 = Instant::now();
    for (name, uid, extra, image, policy) in &pods {
        write_manifest(
            &cd,
            &format!("{name}.yaml"),
            &pod_yaml(name, uid, extra, &format!("'{image}'"), policy),
        );
    }
    let s = wait_status(
        &cd,
        Duration::from_secs(60),
        "every pod running or waiting with kubelet's reason",
        |s| {
            ["img-1", "img-2", "img-4", "img-10"]
                .iter()
                .all(|u| running(s, u))
                && waiting(s, "img-3", "ErrImageNeverPull").is_some()
                && waiting(s, "img-7", "InvalidImageName").is_some()
                && ["img-5", "img-6", "img-8", "img-9"].iter().all(|u| {
                    waiting(s, u, "ErrImagePull").is_some()
                        || waiting(s, u, "ImagePullBackOff").is_some()
                })
        },
    )
    .await;
    println!("all pods settled in {:?}", t0.elapsed());
    let msg = |uid: &str| match state_of(&s, uid) {
        Some(ContainerState::Waiting { reason, message }) => format!("{reason}: {message}"),
        other => format!("{other:?}"),
    };
    for uid in ["img-3", "img-5", "img-6", "img-7", "img-8", "img-9"] {
        println!("{uid}: {}", msg(uid));
    }
    assert!(
        msg("img-3").contains(&format!(
            "Container image \"{}\" is not present with pull policy of Never",
            regs.tls.reference("team/absent", "v1")
        )),
        "{}",
        msg("img-3")
    );
    assert!(
        msg("img-7").contains(
            "Failed to apply default image tag \"bad image:v1\": couldn't parse image name \"bad image:v1\": invalid reference format"
        ),
        "{}",
        msg("img-7")
    );
    // The registry's own words reach the pod: 401 for the wrong password (and for no
    // credentials at all: the missing secret), the closed port, the platform.
    for uid in ["img-5", "img-6"] {
        assert!(
            msg(uid).to_lowercase().contains("unauthorized") || msg(uid).contains("401"),
            "{uid}: {}",
            msg(uid)
        );
    }
    assert!(
        msg("img-8").contains("connection refused"),
        "{}",
        msg("img-8")
    );
    assert!(
        msg("img-9").contains("no match for platform"),
        "{}",
        msg("img-9")
    );

    // kubelet's events, in order, with its texts.
    let ev = reasons(&mut e, "ifnp");
    let texts: Vec<String> = ev.iter().map(|(_, r, m)| format!("{r}: {m}")).collect();
    println!("ifnp events: {texts:#?}");
    assert!(
        texts
            .iter()
            .any(|t| t == &format!("Pulling: Pulling image \"{app_ref}\"")),
        "{texts:#?}"
    );
    let pulled = texts
        .iter()
        .find(|t| {
            t.starts_with(&format!(
                "Pulled: Successfully pulled image \"{app_ref}\" in "
            ))
        })
        .unwrap_or_else(|| panic!("no Pulled event: {texts:#?}"));
    assert!(
        pulled.contains(" including waiting). Image size: ") && pulled.ends_with(" bytes."),
        "{pulled}"
    );
    let ev = reasons(&mut e, "wrongpw");
    let texts: Vec<String> = ev.iter().map(|(_, r, m)| format!("{r}: {m}")).collect();
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with(&format!("Failed: Failed to pull image \"{private2}\": "))),
        "{texts:#?}"
    );
    assert!(
        texts.iter().any(|t| t == "Failed: Error: ErrImagePull"),
        "{texts:#?}"
    );

    // IfNotPresent: a second pod of the same image does not pull; the untagged image
    // (Always) pulls again each time.
    let log = log_of(&regs.tls);
    let app_pulls = pulls_of(&log, "team/app");
    write_manifest(
        &cd,
        "ifnp2.yaml",
        &pod_yaml("ifnp2", "img-11", "", &format!("'{app_ref}'"), ""),
    );
    write_manifest(
        &cd,
        "always2.yaml",
        &pod_yaml("always2", "img-12", "", &format!("'{untagged}'"), ""),
    );
    wait_status(
        &cd,
        Duration::from_secs(30),
        "the second pods running",
        |s| running(s, "img-11") && running(s, "img-12"),
    )
    .await;
    let ev: Vec<String> = reasons(&mut e, "ifnp2")
        .into_iter()
        .map(|(_, r, m)| format!("{r}: {m}"))
        .collect();
    assert!(
        ev.contains(&format!(
            "Pulled: Container image \"{app_ref}\" already present on machine"
        )),
        "{ev:#?}"
    );
    assert!(!ev.iter().any(|t| t.starts_with("Pulling")), "{ev:#?}");
    let log = log_of(&regs.tls);
    let latest_manifest = |log: &[Access]| {
        log.iter()
            .filter(|a| {
                a.is_pull()
                    && a.kind == AccessKind::Started
                    && a.repo.as_deref() == Some("team/app")
                    && a.reference.as_deref() == Some("latest")
            })
            .count()
    };
    assert!(
        latest_manifest(&log) >= 2,
        "the untagged image (Always) was resolved at the registry for each pod: {}",
        latest_manifest(&log)
    );
    assert!(pulls_of(&log, "team/app") > app_pulls);

    // Backoff: the wrong password waits ImagePullBackOff, with the last error in its
    // message, and is tried again at the registry after 10 s, not before.
    let auth_log = log_of(&regs.auth);
    let tries_then = pulls_of(&auth_log, "team/private2");
    let s = wait_status(&cd, Duration::from_secs(15), "ImagePullBackOff", |s| {
        waiting(s, "img-5", "ImagePullBackOff").is_some()
    })
    .await;
    let m = waiting(&s, "img-5", "ImagePullBackOff").unwrap_or_default();
    assert!(
        m.starts_with(&format!(
            "Back-off pulling image \"{private2}\": ErrImagePull: "
        )),
        "{m}"
    );
    let ev: Vec<String> = reasons(&mut e, "wrongpw")
        .into_iter()
        .map(|(_, r, m)| format!("{r}: {m}"))
        .collect();
    assert!(
        ev.contains(&format!("BackOff: Back-off pulling image \"{private2}\"")),
        "{ev:#?}"
    );
    assert!(
        ev.contains(&"Failed: Error: ImagePullBackOff".to_owned()),
        "{ev:#?}"
    );
    // Right the secret: the next try (at most 20 s later) succeeds.
    std::fs::write(secrets.join("bad.json"), config(AUTH_USER, AUTH_PASSWORD)).expect("secret");
    wait_status(
        &cd,
        Duration::from_secs(45),
        "the fixed secret's pod running",
        |s| running(s, "img-5"),
    )
    .await;
    let tries_now = pulls_of(&log_of(&regs.auth), "team/private2");
    assert!(tries_now > tries_then, "{tries_now} > {tries_then}");
    // kubelet's pull series: the pull durations by size, the CRI pull operations and errors.
    let m = metrics_text();
    for series in [
        "kubelet_image_pull_duration_seconds_count{image_size_in_bytes=\"0-10MB\"}",
        "kubelet_runtime_operations_total{operation_type=\"pull_image\"}",
        "kubelet_runtime_operations_errors_total{operation_type=\"pull_image\"}",
    ] {
        assert!(value_of(&m, series) >= 1.0, "{series} in\n{m}");
    }
    finish(e, cd).await;
}

fn metrics_text() -> String {
    enforcer::metrics::encode(&[enforcer::metrics::global().registry()]).expect("metrics")
}

/// The value of one series line (0 when absent).
fn value_of(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0)
}

/// The access log's pulls of `repos`: for each, its first request and the completion of its
/// last blob request, in line numbers.
fn spans(log: &[Access], repos: &[&str]) -> Vec<(String, usize, usize)> {
    repos
        .iter()
        .map(|r| {
            let first = enforcer_tests::registry::first_start(log, r)
                .unwrap_or_else(|| panic!("no pull of {r} in the log"));
            let last = enforcer_tests::registry::last_blob_completion(log, r)
                .unwrap_or_else(|| panic!("no blob of {r} completed in the log"));
            ((*r).to_owned(), first, last)
        })
        .collect()
}

fn any_overlap(spans: &[(String, usize, usize)]) -> bool {
    spans
        .iter()
        .any(|(a, a0, a1)| spans.iter().any(|(b, b0, _)| a != b && a0 < b0 && b0 < a1))
}

async fn run_three(
    cd: &Containerd,
    regs: &Registries,
    prefix: &str,
    uids: u32,
    opts: ImageOptions,
) {
    let mut e = Enforcer::start_with(cd, |o| {
        o.images = std::sync::Arc::new(ImageManager::new(&ImageOptions {
            node_config: state(cd).join("config.json"),
            ..opts
        }));
    });
    for i in 0..3 {
        let image = regs.tls.reference(&format!("{prefix}{i}"), "v1");
        write_manifest(
            cd,
            &format!("{prefix}{i}.yaml"),
            &pod_yaml(
                &format!("{prefix}{i}"),
                &format!("{prefix}-{}", uids + i),
                "",
                &format!("'{image}'"),
                "",
            ),
        );
    }
    let uid = |i: u32| format!("{prefix}-{}", uids + i);
    wait_status(cd, Duration::from_secs(90), "three pods running", |s| {
        (0..3).all(|i| running(s, &uid(i)))
    })
    .await;
    e.stop().await;
}

/// `serializeImagePulls` (one pull at a time), then parallel pulls, then the registry QPS
/// limit: three pods of three images each time, read from the registry's own log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serialized_parallel_and_qps_limited_pulls() {
    let (_dir, regs) = start_registries();
    let cd = Containerd::start("img-serial");
    regs.write_hosts(&cd.certs_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    for (i, prefix) in ["ser", "par", "qps"].iter().enumerate() {
        for j in 0..3u64 {
            let seed = 100 + 10 * i as u64 + j;
            let image = OciImage::busybox(8 << 20, seed).expect("image");
            push(&regs.tls, &format!("{prefix}{j}"), "v1", &image);
        }
    }
    // Serialized (kubelet's default).
    run_three(
        &cd,
        &regs,
        "ser",
        0,
        ImageOptions {
            serialize: true,
            qps: 0,
            ..Default::default()
        },
    )
    .await;
    let log = log_of(&regs.tls);
    let ser = spans(&log, &["ser0", "ser1", "ser2"]);
    println!("serialized spans (repo, first request line, last blob completion line): {ser:?}");
    assert!(!any_overlap(&ser), "serialized pulls overlapped: {ser:?}");
    // Parallel, no limit.
    run_three(
        &cd,
        &regs,
        "par",
        0,
        ImageOptions {
            serialize: false,
            max_parallel: None,
            qps: 0,
            ..Default::default()
        },
    )
    .await;
    let log = log_of(&regs.tls);
    let par = spans(&log, &["par0", "par1", "par2"]);
    println!("parallel spans: {par:?}");
    assert!(
        any_overlap(&par),
        "parallel pulls never overlapped: {par:?}"
    );

    // registryPullQPS 1, registryBurst 1: the first pull takes the only token, the others
    // fail at once with kubelet's `pull QPS exceeded` (no request reaches the registry) and
    // are retried after their backoff.
    let before = log_of(&regs.tls).len();
    let mut e = Enforcer::start_with(&cd, |o| {
        o.images = std::sync::Arc::new(ImageManager::new(&ImageOptions {
            serialize: false,
            qps: 1,
            burst: 1,
            node_config: state(&cd).join("config.json"),
            ..Default::default()
        }));
    });
    for i in 0..3 {
        let image = regs.tls.reference(&format!("qps{i}"), "v1");
        write_manifest(
            &cd,
            &format!("qps{i}.yaml"),
            &pod_yaml(
                &format!("qps{i}"),
                &format!("qps-{i}"),
                "",
                &format!("'{image}'"),
                "",
            ),
        );
    }
    let s = wait_status(
        &cd,
        Duration::from_secs(30),
        "one pod running, two refused by the limiter",
        |s| {
            let run = (0..3).filter(|i| running(s, &format!("qps-{i}"))).count();
            let limited = (0..3)
                .filter(|i| {
                    let u = format!("qps-{i}");
                    waiting(s, &u, "ErrImagePull").is_some_and(|m| m == "pull QPS exceeded")
                        || waiting(s, &u, "ImagePullBackOff")
                            .is_some_and(|m| m.ends_with("ErrImagePull: pull QPS exceeded"))
                })
                .count();
            run == 1 && limited == 2
        },
    )
    .await;
    let started = |log: &[Access]| -> Vec<String> {
        let mut repos: Vec<String> = log[before..]
            .iter()
            .filter(|a| a.is_pull() && a.kind == AccessKind::Started)
            .filter_map(|a| a.repo.clone())
            .collect();
        repos.dedup();
        repos.sort();
        repos.dedup();
        repos
    };
    let first = started(&log_of(&regs.tls));
    let running_now: Vec<String> = (0..3)
        .filter(|i| running(&s, &format!("qps-{i}")))
        .map(|i| format!("qps{i}"))
        .collect();
    assert_eq!(
        first, running_now,
        "only the pull that had a token reached the registry"
    );
    let texts: Vec<String> = (0..3)
        .flat_map(|i| reasons(&mut e, &format!("qps{i}")))
        .map(|(_, r, m)| format!("{r}: {m}"))
        .collect();
    assert!(
        texts
            .iter()
            .any(|t| t.starts_with("Failed: Failed to pull image")
                && t.ends_with(": pull QPS exceeded")),
        "{texts:#?}"
    );
    // After the backoff (10 s, then 20 s) the tokens are back and the others pull.
    wait_status(
        &cd,
        Duration::from_secs(60),
        "all three running after backoff",
        |s| (0..3).all(|i| running(s, &format!("qps-{i}"))),
    )
    .await;
    assert_eq!(started(&log_of(&regs.tls)).len(), 3);
    finish(e, cd).await;
}

/// The image garbage collector on containerd's own image filesystem (a tmpfs of the test's):
/// above the high threshold it frees the least recently used images until usage is under the
/// low threshold, never one a container uses; under the threshold it removes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn image_gc_frees_down_to_the_low_threshold() {
    let (_dir, regs) = start_registries();
    let cd = Containerd::start_with_imagefs("img-gc", 200 << 20);
    regs.write_hosts(&cd.certs_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    let rt = CriRuntime::new(&cd.socket, Duration::from_secs(30));
    let fs = rt.image_fs_info().await.expect("ImageFsInfo");
    let mount = enforcer::cri::images::imagefs_mountpoint(&fs).expect("imagefs mountpoint");
    let usage = || {
        let (cap, avail) = enforcer::cri::images::fs_bytes(&mount).expect("statvfs");
        100 - avail * 100 / cap
    };
    println!("imagefs {} at {}% after start", mount.display(), usage());
    let policy = GcPolicy {
        high_percent: 65,
        low_percent: 55,
        min_age: Duration::ZERO,
        max_age: Duration::ZERO,
    };
    let gc = ImageGc::new(policy, Duration::from_secs(300));
    // Seven images of 10 MiB each (about 20 MiB on disk: the blob and its unpacked layer),
    // pulled one after the other, the collector detecting each before the next, so each
    // has its own first-detected time.
    let mut ids = Vec::new();
    for i in 0..7u64 {
        let repo = format!("gc{i}");
        push(
            &regs.tls,
            &repo,
            "v1",
            &OciImage::busybox(10 << 20, 200 + i).expect("image"),
        );
        let image = regs.tls.reference(&repo, "v1");
        let id = rt
            .pull_image(&image, None, Some(k8s_cri::v1::PodSandboxConfig::default()))
            .await
            .unwrap_or_else(|e| panic!("pulling {image}: {e}"));
        ids.push(id);
        gc.detect(&rt).await.expect("detect");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // The oldest is in use: a pod runs it.
    let e = Enforcer::start(&cd);
    write_manifest(
        &cd,
        "user.yaml",
        &pod_yaml(
            "user",
            "gc-user",
            "",
            &format!("'{}'", regs.tls.reference("gc0", "v1")),
            "",
        ),
    );
    wait_status(&cd, Duration::from_secs(30), "the pod using gc0", |s| {
        running(s, "gc-user")
    })
    .await;
    let order = gc.eviction_order(&rt).await.expect("order");
    assert!(!order.contains(&ids[0]), "gc0 is in use: {order:?}");
    assert_eq!(order[..6], ids[1..], "oldest first");
    let before = usage();
    println!("usage {before}% with {} images", ids.len());
    assert!(
        before >= 65,
        "the setup should be above the high threshold: {before}%"
    );
    let collected = gc
        .garbage_collect(&rt, Duration::ZERO)
        .await
        .unwrap_or_else(|e| panic!("garbage collection: {e}"));
    let after = usage();
    println!(
        "collected {} images for space ({} bytes of {} wanted); usage {before}% -> {after}%",
        collected.by_space.len(),
        collected.freed,
        collected.wanted
    );
    assert!(
        after <= 55,
        "usage {after}% is not down to the low threshold"
    );
    assert!(collected.freed >= collected.wanted);
    // Oldest first, never the one in use, and not more than needed.
    let k = collected.by_space.len();
    assert!((1..6).contains(&k), "{k} removed");
    assert_eq!(collected.by_space, ids[1..=k], "least recently used first");
    let left: Vec<String> = rt
        .list_images()
        .await
        .expect("list")
        .into_iter()
        .map(|i| i.id)
        .collect();
    assert!(left.contains(&ids[0]), "the image in use stays");
    assert!(left.contains(&ids[6]), "the newest stays");
    // Below the high threshold: nothing more.
    let again = gc.garbage_collect(&rt, Duration::ZERO).await.expect("gc");
    assert!(
        again.by_space.is_empty() && again.by_age.is_empty(),
        "{again:?}"
    );
    let m = metrics_text();
    let series = "kubelet_image_garbage_collected_total{reason=\"space\"}";
    assert!(value_of(&m, series) >= k as f64, "{series} in\n{m}");
    finish(e, cd).await;
}
