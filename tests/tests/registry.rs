//! The registry fixture against a private containerd: three real OCI registries
//! (`docker-registry`, CNCF distribution 2.8; HTTPS with a test CA, HTTPS with basic auth,
//! plain HTTP as a mirror), images pushed through the distribution API, and CRI `PullImage`
//! through each, with the registries' own logs showing what containerd asked for. Prints the
//! error texts containerd returns for the failures a pod's image pull meets (the enforcer's
//! pull-error reasons are written from them). Needs root, containerd and docker-registry;
//! fails loudly without them.

use std::time::Instant;

use enforcer_tests::{
    containerd::Containerd,
    registry::{
        AUTH_PASSWORD, AUTH_USER, Access, AccessKind, OciImage, Registries, Registry, Target,
        cri_pull, first_start, free_port, last_blob_completion, overlapped, require_tools,
    },
};

fn accesses(r: &Registry) -> Vec<Access> {
    r.access_log()
        .unwrap_or_else(|e| panic!("reading the {} registry's log: {e}", r.name))
}

/// The completed pull requests (containerd's, not the fixture's pushes) of `repo` as
/// `METHOD target status`, in log order.
fn completed(log: &[Access], repo: &str) -> Vec<(String, Target, Option<u16>)> {
    log.iter()
        .filter(|a| {
            a.kind == AccessKind::Completed && a.is_pull() && a.repo.as_deref() == Some(repo)
        })
        .map(|a| (a.method.clone(), a.target(), a.status))
        .collect()
}

fn print_log(r: &Registry, log: &[Access]) {
    println!(
        "--- {} registry ({}) pull requests, in log order (pushes left out):",
        r.name, r.host
    );
    for a in log.iter().filter(|a| a.is_pull()) {
        println!("{}", a.summary());
    }
}

/// Asserts that `repo`'s pull fetched the manifest and every blob of `image` with 200, but
/// the busybox layer, which containerd has from the local image it imported at start.
fn assert_pulled(r: &Registry, log: &[Access], repo: &str, image: &OciImage) {
    let done = completed(log, repo);
    assert!(
        done.iter()
            .any(|(m, t, s)| m == "GET" && matches!(t, Target::Manifest(_)) && *s == Some(200)),
        "{}: no manifest GET of {repo}: {done:#?}",
        r.name
    );
    let local = OciImage::busybox(0, 0).expect("busybox").layer_digests();
    for blob in image.blobs.iter().filter(|b| !local.contains(&b.digest)) {
        assert!(
            done.iter().any(|(m, t, s)| m == "GET"
                && *t == Target::Blob(blob.digest.clone())
                && *s == Some(200)),
            "{}: blob {} of {repo} not fetched: {done:#?}",
            r.name,
            blob.digest
        );
    }
}

async fn pull_err(socket: &std::path::Path, image: &str, creds: Option<(&str, &str)>) -> String {
    match cri_pull(socket, image, creds).await {
        Ok(r) => panic!("pulling {image} should fail, got {r}"),
        Err(status) => format!("{:?}: {}", status.code(), status.message()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pulls_through_tls_auth_and_mirror_registries() {
    enforcer_tests::require_root();
    if let Err(e) = require_tools() {
        panic!("{e}");
    }
    let t0 = Instant::now();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut regs = Registries::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    println!("registries up in {:?}", t0.elapsed());
    let cd = Containerd::start("registry");
    regs.write_hosts(&cd.certs_dir())
        .unwrap_or_else(|e| panic!("{e}"));
    println!("containerd up in {:?}", t0.elapsed());

    let small = OciImage::busybox(0, 0).expect("small image");
    let big = OciImage::busybox(4 << 20, 1).expect("big image");
    let private = OciImage::busybox(1 << 20, 2).expect("private image");
    let mirrored = OciImage::busybox(512 << 10, 3).expect("mirrored image");
    let other = OciImage::other_platform().expect("other-platform index");
    let par_a = OciImage::busybox(4 << 20, 10).expect("parallel a");
    let par_b = OciImage::busybox(4 << 20, 11).expect("parallel b");
    println!("images built in {:?}", t0.elapsed());
    let push = |r: &Registry, repo: &str, image: &OciImage| {
        r.push(repo, "v1", image)
            .unwrap_or_else(|e| panic!("pushing {repo} to {}: {e}", r.name))
    };
    let small_digest = push(&regs.tls, "enforcer/small", &small);
    push(&regs.tls, "enforcer/big", &big);
    push(&regs.tls, "enforcer/other", &other);
    push(&regs.tls, "enforcer/par-a", &par_a);
    push(&regs.tls, "enforcer/par-b", &par_b);
    push(&regs.auth, "enforcer/private", &private);
    push(&regs.plain, "enforcer/mirrored", &mirrored);
    println!("pushed in {:?}", t0.elapsed());
    let sock = cd.socket.clone();

    // TLS with the test CA (hosts.toml `ca`): two pulls one after the other.
    for repo in ["enforcer/small", "enforcer/big"] {
        let image = regs.tls.reference(repo, "v1");
        let r = cri_pull(&sock, &image, None)
            .await
            .unwrap_or_else(|e| panic!("pulling {image}: {e}\ncontainerd log:\n{}", cd.log()));
        println!("pulled {image}: {r}");
    }

    // Basic auth: none, a wrong password, then the right one.
    let private_ref = regs.auth.reference("enforcer/private", "v1");
    let no_auth = pull_err(&sock, &private_ref, None).await;
    println!("ERROR TEXT (no credentials): {no_auth}");
    let wrong = pull_err(&sock, &private_ref, Some((AUTH_USER, "wrong"))).await;
    println!("ERROR TEXT (wrong password): {wrong}");
    let r = cri_pull(&sock, &private_ref, Some((AUTH_USER, AUTH_PASSWORD)))
        .await
        .unwrap_or_else(|e| panic!("pulling {private_ref} with credentials: {e}"));
    println!("pulled {private_ref} with credentials: {r}");

    // The mirror: a name that resolves nowhere, served by the plain registry.
    let mirror_ref = Registries::mirror_reference("enforcer/mirrored", "v1");
    let r = cri_pull(&sock, &mirror_ref, None)
        .await
        .unwrap_or_else(|e| panic!("pulling {mirror_ref}: {e}\ncontainerd log:\n{}", cd.log()));
    println!("pulled {mirror_ref}: {r}");

    // Failures: another platform only, an unknown tag, a closed port.
    let other_err = pull_err(&sock, &regs.tls.reference("enforcer/other", "v1"), None).await;
    println!("ERROR TEXT (other platform): {other_err}");
    assert!(other_err.contains("no match for platform"), "{other_err}");
    let unknown = pull_err(&sock, &regs.tls.reference("enforcer/small", "nope"), None).await;
    println!("ERROR TEXT (unknown tag): {unknown}");
    let closed = format!("127.0.0.1:{}", free_port().expect("a free port"));
    let unreachable = pull_err(&sock, &format!("{closed}/enforcer/small:v1"), None).await;
    println!("ERROR TEXT (unreachable registry, closed port, no hosts.toml): {unreachable}");
    let down = format!("127.0.0.1:{}", free_port().expect("a free port"));
    let hosts = cd.certs_dir().join(&down).join("hosts.toml");
    std::fs::create_dir_all(hosts.parent().expect("a parent")).expect("mkdir");
    std::fs::write(
        &hosts,
        format!(
            "server = \"https://{down}\"\nca = \"{}\"\n\n[host]\n",
            regs.ca.display()
        ),
    )
    .expect("hosts.toml");
    let down_err = pull_err(&sock, &format!("{down}/enforcer/small:v1"), None).await;
    println!("ERROR TEXT (unreachable registry, closed port, hosts.toml https + ca): {down_err}");
    let unknown_host = pull_err(&sock, "nowhere.enforcer.test/enforcer/small:v1", None).await;
    println!("ERROR TEXT (unresolvable registry name): {unknown_host}");

    // Two pulls at once.
    let (ref_a, ref_b) = (
        regs.tls.reference("enforcer/par-a", "v1"),
        regs.tls.reference("enforcer/par-b", "v1"),
    );
    let (a, b) = tokio::join!(cri_pull(&sock, &ref_a, None), cri_pull(&sock, &ref_b, None));
    a.expect("parallel pull a");
    b.expect("parallel pull b");

    // What the registries saw.
    let tls_log = accesses(&regs.tls);
    print_log(&regs.tls, &tls_log);
    assert_pulled(&regs.tls, &tls_log, "enforcer/small", &small);
    assert_pulled(&regs.tls, &tls_log, "enforcer/big", &big);
    assert!(
        tls_log.iter().any(|a| a.kind == AccessKind::Completed
            && a.repo.as_deref() == Some("enforcer/small")
            && a.target() == Target::Manifest(small_digest.clone())),
        "the pull fetched the manifest by its digest after resolving the tag"
    );
    // Sequential pulls: small ended before big began.
    assert!(
        !overlapped(&tls_log, "enforcer/small", "enforcer/big"),
        "small: last blob done at line {:?}, big: first request at line {:?}",
        last_blob_completion(&tls_log, "enforcer/small"),
        first_start(&tls_log, "enforcer/big")
    );
    let parallel = overlapped(&tls_log, "enforcer/par-a", "enforcer/par-b")
        || overlapped(&tls_log, "enforcer/par-b", "enforcer/par-a");
    println!(
        "parallel pulls overlapped at the registry: {parallel} (par-a first request line {:?}, last blob done {:?}; par-b {:?}, {:?})",
        first_start(&tls_log, "enforcer/par-a"),
        last_blob_completion(&tls_log, "enforcer/par-a"),
        first_start(&tls_log, "enforcer/par-b"),
        last_blob_completion(&tls_log, "enforcer/par-b"),
    );
    assert!(
        parallel,
        "two concurrent CRI pulls should overlap at the registry"
    );
    let other_done = completed(&tls_log, "enforcer/other");
    assert!(
        !other_done
            .iter()
            .any(|(_, t, _)| matches!(t, Target::Blob(_))),
        "no blob of the other platform is fetched: {other_done:#?}"
    );

    // The mirror gone: its registry stopped.
    regs.plain.stop();
    let mirror_down = pull_err(
        &sock,
        &Registries::mirror_reference("enforcer/mirrored", "v2"),
        None,
    )
    .await;
    println!("ERROR TEXT (mirror's registry stopped): {mirror_down}");

    let auth_log = accesses(&regs.auth);
    print_log(&regs.auth, &auth_log);
    let private_done = completed(&auth_log, "enforcer/private");
    for why in ["invalid authorization credential", "authentication failure"] {
        assert!(
            auth_log.iter().any(|a| a.is_pull()
                && a.status == Some(401)
                && a.error.as_deref().is_some_and(|e| e.ends_with(why))),
            "the auth registry refused a pull with {why:?}: {private_done:#?}"
        );
    }
    assert_pulled(&regs.auth, &auth_log, "enforcer/private", &private);

    let plain_log = accesses(&regs.plain);
    print_log(&regs.plain, &plain_log);
    assert_pulled(&regs.plain, &plain_log, "enforcer/mirrored", &mirrored);

    drop(cd);
    drop(regs);
    println!("fixture test took {:?}", t0.elapsed());
}
