//! The checkpoint as kubelet writes it (`allocation/state/state_checkpoint_test.go`,
//! `Test_stateCheckpoint_formatUpgraded`).

use std::collections::BTreeMap;

use super::{checkpoint, *};
use crate::policy::resources::test_pods::{container, pod};

fn list(s: &str) -> ResourceList {
    s.split(',')
        .filter(|kv| !kv.is_empty())
        .map(|kv| kv.split_once('=').unwrap())
        .map(|(k, v)| (k.to_owned(), crate::quantity::Quantity::parse(v).unwrap()))
        .collect()
}

fn with_uid(mut p: Pod, uid: &str) -> Pod {
    p.metadata.uid = Some(uid.to_owned());
    p
}

// --- the checkpoint -------------------------------------------------------------------------

#[test]
fn checkpoint_written_by_kubelet_reads_back() {
    // Test_stateCheckpoint_formatUpgraded's checkpoint, as a kubelet wrote it.
    let text = r#"{"data":"{\"entries\":{\"pod1\":{\"ContainerResources\":{\"container1\":{\"requests\":{\"cpu\":\"1Ki\",\"memory\":\"1Ki\"}}}}}}","checksum":1178570812}"#;
    let got = checkpoint::from_json(text).unwrap();
    let r = &got["pod1"].containers["container1"];
    assert_eq!(
        requirement_lists(Some(r)),
        (list("cpu=1Ki,memory=1Ki"), ResourceList::new())
    );
    // A changed byte is refused.
    let bad = text.replace("1Ki\\\",\\\"memory", "2Ki\\\",\\\"memory");
    assert!(matches!(
        checkpoint::from_json(&bad),
        Err(checkpoint::CheckpointError::Checksum { .. })
    ));
    assert!(checkpoint::from_json("not json").is_err());
    assert!(checkpoint::from_json(r#"{"data":"[","checksum":0}"#).is_err());
}

#[test]
fn checkpoint_round_trip() {
    let p = with_uid(
        pod(
            "p",
            vec![container("c", "cpu=1000m,memory=1Gi", "memory=2Gi")],
        ),
        "u1",
    );
    let mut all = BTreeMap::new();
    all.insert("u1".to_owned(), PodAllocation::of(&p));
    let text = checkpoint::to_json(&all);
    assert!(
        text.contains(r#"\"ContainerResources\":{\"c\":{\"limits\":{\"memory\":\"2Gi\"},\"requests\":{\"cpu\":\"1\",\"memory\":\"1Gi\"}}},\"PodLevelResources\":null"#),
        "{text}"
    );
    let back = checkpoint::from_json(&text).unwrap();
    assert!(same_resources(
        back["u1"].containers.get("c"),
        all["u1"].containers.get("c")
    ));
    // Empty state: kubelet's `{}` (entries omitted).
    let empty = checkpoint::to_json(&BTreeMap::new());
    assert_eq!(
        empty,
        format!(
            r#"{{"data":"{{}}","checksum":{}}}"#,
            checkpoint::checksum_of("{}")
        )
    );
}
