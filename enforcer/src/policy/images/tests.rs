use std::{collections::BTreeSet, time::Duration};

use super::{
    gc::{self, Candidate, GcPolicy, ImageInfo, Records},
    keyring::{Keyring, lookup_all},
    reference::{ReferenceError, parse, with_default_tag},
    *,
};

const S: fn(u64) -> Duration = Duration::from_secs;

#[test]
fn default_tag_as_kubelet_applies_it() {
    // (image, result) from image_manager_test.go's TestApplyDefaultImageTag and more.
    let cases: &[(&str, Result<&str, ReferenceError>)] = &[
        ("root", Ok("root:latest")),
        ("root:tag", Ok("root:tag")),
        (
            "root@sha256:e7bbc8a6e69a1c9a1a8c6b8cda1b2b5d3c3b3e36d2f8e1f53e1eab9a1b4c5e6f",
            Ok("root@sha256:e7bbc8a6e69a1c9a1a8c6b8cda1b2b5d3c3b3e36d2f8e1f53e1eab9a1b4c5e6f"),
        ),
        (
            "root:tag@sha256:e7bbc8a6e69a1c9a1a8c6b8cda1b2b5d3c3b3e36d2f8e1f53e1eab9a1b4c5e6f",
            Ok("root:tag@sha256:e7bbc8a6e69a1c9a1a8c6b8cda1b2b5d3c3b3e36d2f8e1f53e1eab9a1b4c5e6f"),
        ),
        (
            "127.0.0.1:5000/busybox",
            Ok("127.0.0.1:5000/busybox:latest"),
        ),
        ("localhost/a/b:v1", Ok("localhost/a/b:v1")),
        (
            "registry.k8s.io/pause:3.10",
            Ok("registry.k8s.io/pause:3.10"),
        ),
        ("", Err(ReferenceError::InvalidFormat)),
        ("bad image", Err(ReferenceError::InvalidFormat)),
        ("a:b:c", Err(ReferenceError::InvalidFormat)),
        ("busybox:", Err(ReferenceError::InvalidFormat)),
        ("busybox@sha256:short", Err(ReferenceError::InvalidFormat)),
        ("a//b", Err(ReferenceError::InvalidFormat)),
        (
            "Busybox",
            Err(ReferenceError::Uppercase("library/Busybox".into())),
        ),
    ];
    for (image, want) in cases {
        assert_eq!(
            with_default_tag(image).as_deref().map_err(Clone::clone),
            want.clone(),
            "{image:?}"
        );
    }
    let r = parse("127.0.0.1:5000/team/app:v2").unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (r.domain, r.path, r.tag, r.digest),
        ("127.0.0.1:5000", "team/app", Some("v2"), None)
    );
    let long = format!("x/{}", "a".repeat(260));
    assert_eq!(with_default_tag(&long), Err(ReferenceError::TooLong));
    assert_eq!(
        reference::invalid_name_message("bad image", &ReferenceError::InvalidFormat),
        "Failed to apply default image tag \"bad image\": couldn't parse image name \"bad image\": invalid reference format"
    );
}

#[test]
fn the_token_bucket_starts_full_and_refills_at_qps() {
    assert!(TokenBucket::new(0, 10).is_none(), "qps 0 is no limit");
    let mut b = TokenBucket::new(1, 3).unwrap_or_else(|| panic!("a limiter"));
    let t0 = S(100);
    // The burst at once, then nothing.
    assert_eq!(
        (0..5).map(|_| b.try_accept(t0)).collect::<Vec<_>>(),
        [true, true, true, false, false]
    );
    // Half a second refills half a token: still nothing; a full second one.
    assert!(!b.try_accept(t0 + Duration::from_millis(500)));
    assert!(b.try_accept(t0 + S(1)));
    assert!(!b.try_accept(t0 + S(1)));
    // A long pause refills to the burst, not beyond.
    let t1 = t0 + S(60);
    assert_eq!((0..4).filter(|_| b.try_accept(t1)).count(), 3);
    // A clock that goes back takes nothing and gives nothing.
    assert!(!b.try_accept(t0));
}

#[test]
fn pull_errors_as_kubelet_evaluates_them() {
    assert_eq!(
        pull_error("a:1", "rpc error: code = NotFound desc = not found"),
        (
            ERR_IMAGE_PULL,
            "rpc error: code = NotFound desc = not found".to_owned()
        )
    );
    assert_eq!(
        pull_error("a:1", "RegistryUnavailable: connection refused"),
        (
            ERR_REGISTRY_UNAVAILABLE,
            "image pull failed for a:1 because the registry is unavailable: connection refused"
                .to_owned()
        )
    );
    assert_eq!(
        pull_error("a:1", "SignatureValidationFailed: no"),
        (
            ERR_SIGNATURE_VALIDATION_FAILED,
            "image pull failed for a:1 because the signature validation failed: no".to_owned()
        )
    );
    assert_eq!(aggregate(&["x".into()]), "x");
    assert_eq!(aggregate(&["x".into(), "y".into()]), "[x, y]");
    assert_eq!(aggregate(&["x".into(), "x".into()]), "x");
}

#[test]
fn pull_event_text_and_size_bucket() {
    assert_eq!(go_duration_ms(Duration::from_micros(1500)), "1ms");
    assert_eq!(go_duration_ms(Duration::from_millis(1234)), "1.234s");
    assert_eq!(go_duration_ms(Duration::from_millis(1500)), "1.5s");
    assert_eq!(go_duration_ms(Duration::from_millis(123_400)), "2m3.4s");
    assert_eq!(go_duration_ms(S(3600)), "1h0m0s");
    assert_eq!(go_duration_ms(Duration::ZERO), "0s");
    assert_eq!(
        pulled_message(
            "b:1",
            Duration::from_millis(250),
            Duration::from_millis(1250),
            4096
        ),
        "Successfully pulled image \"b:1\" in 250ms (1.25s including waiting). Image size: 4096 bytes."
    );
    let mb = 1024 * 1024;
    // metrics_test.go's cases, and the boundaries.
    for (size, label) in [
        (0, "N/A"),
        (5 * mb, "0-10MB"),
        (10 * mb, "0-10MB"),
        (15 * mb, "10MB-100MB"),
        (500 * mb, "100MB-500MB"),
        (15 * 1024 * mb, "10GB-20GB"),
        (200 * 1024 * mb, "GT100GB"),
    ] {
        assert_eq!(image_size_bucket(size), label, "{size}");
    }
}

fn keyring(doc: &str) -> Keyring {
    let mut k = Keyring::default();
    k.add_document("test", doc.as_bytes())
        .unwrap_or_else(|e| panic!("{e}"));
    k
}

#[test]
fn keyring_matches_as_credentialprovider_does() {
    // "user:pass" and "other:word" in base64.
    let k = keyring(
        r#"{"auths": {
            "https://127.0.0.1:5000": {"auth": "dXNlcjpwYXNz"},
            "127.0.0.1:5000/team": {"username": "team", "password": "t"},
            "*.example.com": {"auth": "b3RoZXI6d29yZA=="},
            "https://index.docker.io/v1/": {"username": "hub", "password": "h"}
        }}"#,
    );
    let users = |image: &str| {
        k.lookup(image)
            .into_iter()
            .map(|c| c.username)
            .collect::<Vec<_>>()
    };
    // The most specific key first.
    assert_eq!(users("127.0.0.1:5000/team/app:v1"), ["team", "user"]);
    assert_eq!(users("127.0.0.1:5000/other:v1"), ["user"]);
    // The port must match exactly.
    assert!(users("127.0.0.1:5001/other:v1").is_empty());
    assert!(users("127.0.0.1/other:v1").is_empty());
    // A glob covers one label, not two.
    assert_eq!(users("registry.example.com/a:1"), ["other"]);
    assert!(users("a.registry.example.com/a:1").is_empty());
    // Docker Hub images get the default registry's entry.
    assert_eq!(users("busybox"), ["hub"]);
    assert_eq!(users("docker.io/library/busybox:1"), ["hub"]);
    assert_eq!(users("jenkins"), ["hub"]);
    assert!(users("world.mesos.org/foo/bar").is_empty());
    let c = &k.lookup("127.0.0.1:5000/x")[0];
    assert_eq!(
        (c.password.as_str(), c.server_address.as_str()),
        ("pass", "127.0.0.1:5000")
    );
    // The older .dockercfg map, and the union: the pod's keyring before the node's.
    let node = keyring(r#"{"127.0.0.1:5000": {"username": "node", "password": "n"}}"#);
    let all: Vec<String> = lookup_all(&[&k, &node], "127.0.0.1:5000/x:1")
        .into_iter()
        .map(|c| c.username)
        .collect();
    assert_eq!(all, ["user", "node"]);
    // Bad documents name what is wrong.
    let mut bad = Keyring::default();
    let e = bad
        .add_document("secret default/regcred", b"[1]")
        .map_err(|e| e.to_string());
    assert!(
        e.as_ref()
            .is_err_and(|e| e.starts_with("secret default/regcred: not a docker config")),
        "{e:?}"
    );
    let e = bad
        .add_document("f", br#"{"auths": {"r": {"auth": "!!!"}}}"#)
        .map_err(|e| e.to_string());
    assert_eq!(
        e,
        Err("f: entry \"r\": auth is not base64 of user:password".to_owned())
    );
}

fn info(id: &str, size: u64) -> ImageInfo {
    ImageInfo {
        id: id.to_owned(),
        size,
        pinned: false,
    }
}

#[test]
fn gc_records_and_eviction_order() {
    let mut r = Records::default();
    let used: BTreeSet<String> = ["b".to_owned()].into();
    r.detect(&[info("a", 1), info("b", 2), info("c", 3)], &used, S(10));
    // c is used later; a never.
    r.detect(
        &[info("a", 1), info("b", 2), info("c", 3), info("d", 4)],
        &["c".to_owned()].into(),
        S(20),
    );
    let none = BTreeSet::new();
    let order: Vec<String> = r.eviction_order(&none).into_iter().map(|c| c.id).collect();
    // Never used first (by detection), then by last use.
    assert_eq!(order, ["a", "d", "b", "c"]);
    // In use and pinned images are not candidates; gone images are forgotten.
    let mut pinned = info("d", 4);
    pinned.pinned = true;
    r.detect(&[info("a", 1), info("c", 3), pinned], &none, S(30));
    let order: Vec<String> = r
        .eviction_order(&["a".to_owned()].into())
        .into_iter()
        .map(|c| c.id)
        .collect();
    assert_eq!(order, ["c"]);
    assert!(!r.by_id.contains_key("b"));
}

fn candidate(first: u64, last: u64) -> Candidate {
    Candidate {
        id: "x".into(),
        record: gc::Record {
            first_detected: S(first),
            last_used: S(last),
            size: 1,
            pinned: false,
        },
    }
}

#[test]
fn gc_space_and_age_rules() {
    let p = GcPolicy::default();
    // image_gc_manager_test.go's TestGarbageCollectBelowLowThreshold / BelowSuccess etc.:
    // 1000 capacity, 500 available: 50 % < 85 %, nothing to do.
    assert_eq!(gc::amount_to_free(1000, 500, &p), Ok(None));
    // 10 % available: 90 % >= 85 %: free to 20 % available = 100 bytes.
    assert_eq!(gc::amount_to_free(1000, 100, &p), Ok(Some(100)));
    // Exactly at the high threshold collects.
    assert_eq!(gc::amount_to_free(1000, 150, &p), Ok(Some(50)));
    // Available above capacity is capacity.
    assert_eq!(gc::amount_to_free(1000, 2000, &p), Ok(None));
    assert_eq!(
        gc::amount_to_free(0, 0, &p),
        Err(gc::GcError::InvalidCapacity)
    );
    // Minimum age: detected 1 minute ago is kept, 2 minutes ago may go; used now is kept.
    let now = S(1000);
    assert!(!gc::may_free_for_space(&candidate(940, 0), &p, now));
    assert!(gc::may_free_for_space(&candidate(880, 0), &p, now));
    assert!(!gc::may_free_for_space(&candidate(0, 1000), &p, now));
    // Maximum age: off by default; once on, not before max_age since the collector began.
    assert!(!gc::too_old(&candidate(0, 0), &p, now, S(0)));
    let aged = GcPolicy {
        max_age: S(60),
        ..p
    };
    assert!(gc::too_old(&candidate(0, 900), &aged, now, S(0)));
    assert!(!gc::too_old(&candidate(0, 950), &aged, now, S(0)));
    assert!(!gc::too_old(&candidate(0, 900), &aged, now, S(950)));
    assert_eq!(
        gc::free_failed_message(100, 40),
        "Failed to garbage collect required amount of images. Attempted to free 100 bytes, but only found 40 bytes eligible to free."
    );
}
