//! `featureGates` / `--feature-gates` and Memory QoS as kubelet 1.37 validates them.

use super::*;

fn load(yaml: &str, args: &ConfigArgs) -> Result<Config, String> {
    let d = parse_document("c.yaml", yaml).map_err(|e| e.to_string())?.0;
    resolve("c.yaml", &d, args)
        .map(|l| l.config)
        .map_err(|e| e.to_string())
}

fn gates(flag: &str) -> ConfigArgs {
    ConfigArgs {
        feature_gates: vec![flag.to_owned()],
        ..ConfigArgs::default()
    }
}

/// kubelet 1.37's defaults: every known gate at its default,
/// Memory QoS on with nothing to write (no factor, the policy `None`).
#[test]
fn the_defaults_are_kubelet_1_37s() {
    let c = load("", &ConfigArgs::default()).expect("defaults");
    assert_eq!(c.feature_gates.get("MemoryQoS"), Some(&true));
    assert_eq!(c.feature_gates.get("KubeletPSI"), Some(&true));
    assert_eq!(c.feature_gates.get("PodLevelResources"), Some(&true));
    assert_eq!(
        c.feature_gates
            .get("InPlacePodLevelResourcesVerticalScaling"),
        Some(&true)
    );
    assert!(c.enforcer.memory_qos);
    assert_eq!(c.memory_throttling_factor, None);
    assert_eq!(c.memory_reservation_policy, MemoryReservationPolicy::None);
}

/// The file's gates, the flag's over them; the knobs taken as given.
#[test]
fn gates_and_knobs_as_given() {
    let c = load(
        "featureGates: {MemoryQoS: true, KubeletPSI: true}\nmemoryThrottlingFactor: 0.8\nmemoryReservationPolicy: TieredReservation\n",
        &ConfigArgs::default(),
    )
    .expect("valid");
    assert_eq!(c.memory_throttling_factor, Some(0.8));
    assert_eq!(
        c.memory_reservation_policy,
        MemoryReservationPolicy::TieredReservation
    );
    let c = load(
        "featureGates: {MemoryQoS: true}\n",
        &gates("MemoryQoS=false"),
    )
    .expect("valid");
    assert!(!c.enforcer.memory_qos, "the flag over the file");
    assert_eq!(c.feature_gates.get("MemoryQoS"), Some(&false));
    // The enforcer's older switch is the gate's other name.
    let c = load("enforcer: {memoryQoS: false}\n", &ConfigArgs::default()).expect("valid");
    assert!(!c.enforcer.memory_qos);
    // The gate off with kubelet's old default factor: accepted, nothing written.
    let c = load(
        "featureGates: {MemoryQoS: false}\nmemoryThrottlingFactor: 0.9\n",
        &ConfigArgs::default(),
    )
    .expect("valid");
    assert_eq!(c.memory_throttling_factor, None);
}

/// Every refusal names where and what, with kubelet's message where kubelet has one.
#[test]
fn bad_gates_and_knobs_are_refused_naming_them() {
    let none = ConfigArgs::default();
    for (yaml, args, want) in [
        (
            "featureGates: {NoSuchGate: true}",
            &none,
            "c.yaml: invalid value \"NoSuchGate=true\" for featureGates: unrecognized feature gate: NoSuchGate",
        ),
        (
            "",
            &gates("PSINodeCondition=true"),
            "command line: invalid value \"PSINodeCondition=true\" for --feature-gates: unrecognized feature gate: PSINodeCondition",
        ),
        (
            "featureGates: {KubeletPSI: false}",
            &none,
            "cannot set feature gate KubeletPSI to false, feature is locked to true",
        ),
        (
            "featureGates: {PodLevelResources: false}",
            &none,
            "feature gate PodLevelResources cannot be turned off",
        ),
        (
            "",
            &gates("MemoryQoS=maybe"),
            "invalid value of MemoryQoS=maybe, err: strconv.ParseBool: parsing \"maybe\": invalid syntax",
        ),
        ("", &gates("MemoryQoS"), "malformed pair \"MemoryQoS\""),
        (
            "memoryThrottlingFactor: 1.5",
            &none,
            "c.yaml: invalid value \"1.5\" for memoryThrottlingFactor: must be greater than 0 and less than or equal to 1.0",
        ),
        ("memoryThrottlingFactor: 0", &none, "must be greater than 0"),
        (
            "featureGates: {MemoryQoS: false}\nmemoryThrottlingFactor: 0.5",
            &none,
            "memoryThrottlingFactor requires the MemoryQoS feature gate",
        ),
        (
            "featureGates: {MemoryQoS: false}\nmemoryReservationPolicy: TieredReservation",
            &none,
            "TieredReservation requires the MemoryQoS feature gate",
        ),
        (
            "memoryReservationPolicy: Hard",
            &none,
            "invalid value \"Hard\" for memoryReservationPolicy: must be None or TieredReservation",
        ),
        (
            "featureGates: {MemoryQoS: true}\nenforcer: {memoryQoS: false}",
            &none,
            "enforcer.memoryQoS: contradicts featureGates MemoryQoS=true",
        ),
    ] {
        let e = load(yaml, args).expect_err(want);
        assert!(e.contains(want), "{yaml:?} {args:?}: {e}");
    }
    // A gate's value that is not a bool in the file: the parser names the field.
    let e = load("featureGates: {MemoryQoS: sometimes}", &none).expect_err("not a bool");
    assert!(e.contains("featureGates"), "{e}");
}

/// Beside kubelet (`--kubelet-config`), the kubelet's own file's gates were kubelet's to
/// validate: one the enforcer does not decide by, or a state it does not implement, is a
/// warning and left out, not a refusal; the command line's are still refused.
#[test]
fn beside_kubelet_its_files_other_gates_are_warned_of_not_refused() {
    let args = ConfigArgs {
        kubelet_config: Some("/var/lib/kubelet/config.yaml".into()),
        ..ConfigArgs::default()
    };
    let d = parse_document(
        "kubelet.yaml",
        "featureGates: {RotateKubeletServerCertificate: true, PodLevelResources: false, InPlacePodLevelResourcesVerticalScaling: false, MemoryQoS: false}\n",
    )
    .expect("parse")
    .0;
    let l = resolve("kubelet.yaml", &d, &args).expect("kubelet's gates taken");
    assert_eq!(l.warnings.len(), 2, "{:?}", l.warnings);
    assert!(
        l.warnings[0].contains("RotateKubeletServerCertificate=true: unrecognized feature gate")
            || l.warnings[1]
                .contains("RotateKubeletServerCertificate=true: unrecognized feature gate"),
        "{:?}",
        l.warnings
    );
    assert_eq!(
        l.config
            .feature_gates
            .get("InPlacePodLevelResourcesVerticalScaling"),
        Some(&false),
        "kubelet's own gate taken"
    );
    assert_eq!(
        l.config.feature_gates.get("PodLevelResources"),
        Some(&true),
        "a state the enforcer cannot run: warned of, left at its default"
    );
    assert!(!l.config.enforcer.memory_qos, "kubelet's MemoryQoS=false");
    let strict = ConfigArgs {
        feature_gates: vec!["Bogus=true".to_owned()],
        ..args
    };
    assert!(resolve("kubelet.yaml", &d, &strict).is_err());
}
