//! A container's environment as kubelet makes it (`makeEnvironmentVariables` in
//! `pkg/kubelet/kubelet_pods.go`): `value` with `$(VAR)` expansion over the variables defined
//! before it, `fieldRef` (`podFieldSelectorRuntimeValue`, `fieldpath.ExtractFieldPathAsString`)
//! and `resourceFieldRef` (`ExtractResourceValueByContainerName` on the pod with
//! `MergeContainerResourceLimits` from the node's allocatable); the command and args expanded
//! with the result (`ExpandContainerCommandAndArgs`). ConfigMap and Secret references
//! (`envFrom`, `configMapKeyRef`, `secretKeyRef`) read the objects the worker fetched for the
//! sync; where none can be read (standalone, static pods) they fail with kubelet's message,
//! never dropped.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Container, ObjectFieldSelector, Pod, ResourceFieldSelector};

use super::{
    objects::{self, ObjectKind, PodObjects},
    resources::{self, ResourceList},
};
use crate::quantity::{Format, Quantity};

/// Why a container's environment (or a downward API file) cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EnvError {
    /// A `fieldRef` kubelet does not resolve.
    #[error("unsupported fieldPath: {0}")]
    FieldPath(String),
    /// A `resourceFieldRef` kubelet does not resolve.
    #[error("unsupported container resource : {0}")]
    Resource(String),
    /// `resourceFieldRef.containerName` names no container of the pod.
    #[error("container {0} not found")]
    ContainerNotFound(String),
    /// A divisor of zero or one that does not parse.
    #[error("invalid divisor {divisor:?} for {resource}")]
    Divisor { resource: String, divisor: String },
    /// An env source this node cannot resolve, with kubelet's message.
    #[error("{0}")]
    Unsupported(String),
    /// A configMap, secret or the services the environment reads, not there to use.
    #[error("{0}")]
    Object(#[from] crate::policy::objects::ObjectError),
}

/// What the environment depends on beyond the pod and the container.
#[derive(Debug, Clone, Default)]
pub struct EnvContext {
    /// The node's name (`spec.nodeName` when the pod does not say).
    pub node_name: String,
    /// The node's IPs (`status.hostIP`, `status.hostIPs`), empty when unknown.
    pub host_ips: Vec<String>,
    /// The pod's IPs (`status.podIP`, `status.podIPs`), empty when unknown.
    pub pod_ips: Vec<String>,
    /// The node's allocatable (`cpu`, `memory`, `ephemeral-storage`): the limit a
    /// `resourceFieldRef` reads for a container that sets none.
    pub allocatable: ResourceList,
    /// The ConfigMaps and Secrets the pod reads, as read for this sync; `None` on a
    /// standalone node and for static pods (no objects can be read).
    pub objects: Option<std::sync::Arc<PodObjects>>,
}

/// kubelet's `expansion.Expand`: `$(VAR)` is replaced by the mapping's value, `$$` is a
/// literal `$`, and anything else (an unknown name, an unclosed `$(`) is left as written.
#[must_use]
pub fn expand(input: &str, lookup: &dyn Fn(&str) -> Option<String>) -> String {
    let bytes = input.as_bytes();
    let mut out = String::with_capacity(input.len());
    let mut checkpoint = 0;
    let mut cursor = 0;
    while cursor < bytes.len() {
        if bytes[cursor] == b'$' && cursor + 1 < bytes.len() {
            out.push_str(&input[checkpoint..cursor]);
            let rest = &input[cursor + 1..];
            let advance = match rest.as_bytes()[0] {
                b'$' => {
                    out.push('$');
                    1
                }
                b'(' => match rest.find(')') {
                    Some(close) => {
                        let name = &rest[1..close];
                        match lookup(name) {
                            Some(v) => out.push_str(&v),
                            None => {
                                out.push_str("$(");
                                out.push_str(name);
                                out.push(')');
                            }
                        }
                        close + 1
                    }
                    None => {
                        out.push_str("$(");
                        1
                    }
                },
                _ => {
                    // The operator and the next character (one UTF-8 scalar) as written.
                    out.push('$');
                    let ch = rest.chars().next().map_or(1, char::len_utf8);
                    out.push_str(&rest[..ch]);
                    ch
                }
            };
            cursor += advance;
            checkpoint = cursor + 1;
        }
        cursor += 1;
    }
    if checkpoint < input.len() {
        out.push_str(&input[checkpoint..]);
    }
    out
}

/// Go's `%q` for the strings kubelet quotes (`fieldpath.FormatMap`).
#[must_use]
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `fieldpath.FormatMap`: `key="value"` lines in key order, no trailing newline.
#[must_use]
pub fn format_map(m: &BTreeMap<String, String>) -> String {
    m.iter()
        .map(|(k, v)| format!("{k}={}", go_quote(v)))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The key of `metadata.labels['k']` / `metadata.annotations['k']`.
fn subscript<'a>(path: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = path.strip_prefix(prefix)?.strip_prefix("['")?;
    rest.strip_suffix("']")
}

/// `fieldpath.ExtractFieldPathAsString` on the pod's metadata (what a downward API volume
/// may read).
pub fn metadata_field(pod: &Pod, path: &str) -> Result<String, EnvError> {
    let empty = BTreeMap::new();
    let labels = pod.metadata.labels.as_ref().unwrap_or(&empty);
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    if let Some(k) = subscript(path, "metadata.labels") {
        return Ok(labels.get(k).cloned().unwrap_or_default());
    }
    if let Some(k) = subscript(path, "metadata.annotations") {
        return Ok(annotations.get(k).cloned().unwrap_or_default());
    }
    match path {
        "metadata.labels" => Ok(format_map(labels)),
        "metadata.annotations" => Ok(format_map(annotations)),
        "metadata.name" => Ok(resources::pod_name(pod).to_owned()),
        "metadata.namespace" => Ok(pod
            .metadata
            .namespace
            .clone()
            .unwrap_or_else(|| "default".to_owned())),
        "metadata.uid" => Ok(resources::pod_uid(pod).to_owned()),
        _ => Err(EnvError::FieldPath(path.to_owned())),
    }
}

/// `podFieldSelectorRuntimeValue`: the pod's fields an env var may read.
pub fn pod_field(
    pod: &Pod,
    fs: &ObjectFieldSelector,
    ctx: &EnvContext,
) -> Result<String, EnvError> {
    let spec = pod.spec.as_ref();
    match fs.field_path.as_str() {
        "spec.nodeName" => Ok(spec
            .and_then(|s| s.node_name.clone())
            .filter(|n| !n.is_empty())
            .unwrap_or_else(|| ctx.node_name.clone())),
        "spec.serviceAccountName" => Ok(spec
            .and_then(|s| s.service_account_name.clone())
            .unwrap_or_default()),
        "status.hostIP" => Ok(ctx.host_ips.first().cloned().unwrap_or_default()),
        "status.hostIPs" => Ok(ctx.host_ips.join(",")),
        "status.podIP" => Ok(ctx.pod_ips.first().cloned().unwrap_or_default()),
        "status.podIPs" => Ok(ctx.pod_ips.join(",")),
        other => metadata_field(pod, other),
    }
}

/// `ceil(a / b)` for the non-negative values kubelet divides.
fn ceil_div(a: i64, b: i64) -> i64 {
    if b == 0 {
        return 0;
    }
    let (a, b) = (i128::from(a), i128::from(b));
    let q = a.div_euclid(b) + i128::from(a.rem_euclid(b) != 0);
    i64::try_from(q).unwrap_or(i64::MAX)
}

/// `ExtractContainerResourceValue`: `limits.cpu` etc. in units of the divisor, rounded up
/// (`convertResourceCPUToString` divides milli-values, the others values).
pub fn container_resource_value(
    fs: &ResourceFieldSelector,
    c: &Container,
) -> Result<String, EnvError> {
    let divisor = match fs.divisor.as_ref() {
        None => Quantity::from_int(1, Format::DecimalSI),
        Some(d) => {
            let q = Quantity::from_k8s(d).map_err(|_| EnvError::Divisor {
                resource: fs.resource.clone(),
                divisor: d.0.clone(),
            })?;
            if q.is_zero() {
                Quantity::from_int(1, Format::DecimalSI)
            } else {
                q
            }
        }
    };
    let (which, resource) = fs
        .resource
        .split_once('.')
        .ok_or_else(|| EnvError::Resource(fs.resource.clone()))?;
    let list = match which {
        "limits" => resources::container_limits(c),
        "requests" => resources::container_requests(c),
        _ => return Err(EnvError::Resource(fs.resource.clone())),
    };
    let value = list.get(resource).copied().unwrap_or_default();
    let v = match resource {
        "cpu" => ceil_div(value.milli_value(), divisor.milli_value()),
        "memory" | "ephemeral-storage" => ceil_div(value.value(), divisor.value()),
        r if r.starts_with("hugepages-") => ceil_div(value.value(), divisor.value()),
        _ => return Err(EnvError::Resource(fs.resource.clone())),
    };
    Ok(v.to_string())
}

/// The pod as the downward API reads its resources: API-defaulted (a missing request takes
/// the limit), then every container's missing or zero cpu, memory and ephemeral-storage
/// limit set to the node's allocatable (`MergeContainerResourceLimits`).
#[must_use]
pub fn pod_for_downward_api(pod: &Pod, allocatable: &ResourceList) -> Pod {
    let mut p = pod.clone();
    resources::apply_defaults(&mut p);
    if let Some(spec) = p.spec.as_mut() {
        for c in spec
            .containers
            .iter_mut()
            .chain(spec.init_containers.iter_mut().flatten())
        {
            let res = c.resources.get_or_insert_with(Default::default);
            let limits = res.limits.get_or_insert_with(BTreeMap::new);
            for name in ["cpu", "memory", "ephemeral-storage"] {
                let missing = limits
                    .get(name)
                    .is_none_or(|q| resources::lenient(q).is_zero());
                if missing && let Some(cap) = allocatable.get(name) {
                    limits.insert(
                        name.to_owned(),
                        k8s_openapi::apimachinery::pkg::api::resource::Quantity(cap.canonical()),
                    );
                }
            }
        }
    }
    p
}

/// `ExtractResourceValueByContainerName` on a pod from [`pod_for_downward_api`].
pub fn resource_by_container(
    merged: &Pod,
    fs: &ResourceFieldSelector,
    container: &str,
) -> Result<String, EnvError> {
    let c = merged
        .spec
        .iter()
        .flat_map(|s| {
            s.containers
                .iter()
                .chain(s.init_containers.iter().flatten())
        })
        .find(|c| c.name == container)
        .ok_or_else(|| EnvError::ContainerNotFound(container.to_owned()))?;
    container_resource_value(fs, c)
}

/// The container's environment in spec order (a later definition of a name replaces the
/// earlier value in place), every `value` expanded over the variables defined before it.
pub fn container_env(
    pod: &Pod,
    c: &Container,
    ctx: &EnvContext,
) -> Result<Vec<(String, String)>, EnvError> {
    let none;
    let objects = match &ctx.objects {
        Some(o) => o.as_ref(),
        None => {
            none = PodObjects::none(pod.metadata.namespace.as_deref().unwrap_or("default"));
            &none
        }
    };
    let mut out: Vec<(String, String)> = Vec::new();
    // envFrom first (each source's keys in order, a later source replacing an earlier
    // value), then `env`, which overrides them: kubelet's `makeEnvironmentVariables`.
    for from in c.env_from.iter().flatten() {
        let prefix = from.prefix.as_deref().unwrap_or("");
        let got = if let Some(r) = &from.config_map_ref {
            objects::env_from(
                objects,
                ObjectKind::ConfigMap,
                &r.name,
                prefix,
                r.optional.unwrap_or(false),
            )
            .map(|v| (v, &r.name))
        } else if let Some(r) = &from.secret_ref {
            objects::env_from(
                objects,
                ObjectKind::Secret,
                &r.name,
                prefix,
                r.optional.unwrap_or(false),
            )
            .map(|v| (v, &r.name))
        } else {
            continue;
        };
        let ((vars, invalid), name) = got?;
        if !invalid.is_empty() {
            tracing::warn!(
                container = %c.name,
                source = %name,
                keys = %invalid.join(", "),
                "InvalidEnvironmentVariableNames: keys skipped since they are considered invalid environment variable names"
            );
        }
        for (k, v) in vars {
            match out.iter_mut().find(|(n, _)| *n == k) {
                Some(slot) => slot.1 = v,
                None => out.push((k, v)),
            }
        }
    }
    // The service variables (kubelet's `getServiceEnvVarMap`): `$(VAR)` reads them, and they
    // are added last for names the container does not define itself.
    let services = objects.service_env(objects::service_links(pod))?;
    let merged = pod_for_downward_api(pod, &ctx.allocatable);
    for e in c.env.iter().flatten() {
        let value = if let Some(src) = &e.value_from {
            if let Some(fs) = &src.field_ref {
                pod_field(pod, fs, ctx)?
            } else if let Some(fs) = &src.resource_field_ref {
                let name = fs
                    .container_name
                    .as_deref()
                    .filter(|n| !n.is_empty())
                    .unwrap_or(&c.name);
                resource_by_container(&merged, fs, name)?
            } else {
                let (kind, name, key, optional) = if let Some(k) = &src.config_map_key_ref {
                    (ObjectKind::ConfigMap, &k.name, &k.key, k.optional)
                } else if let Some(k) = &src.secret_key_ref {
                    (ObjectKind::Secret, &k.name, &k.key, k.optional)
                } else {
                    return Err(EnvError::Unsupported(format!(
                        "env {:?}: valueFrom names no source this node knows",
                        e.name
                    )));
                };
                match objects::env_key(objects, kind, name, key, optional.unwrap_or(false))? {
                    Some(v) => v,
                    // An optional object or key that is missing: no variable.
                    None => continue,
                }
            }
        } else {
            let defined = &out;
            expand(e.value.as_deref().unwrap_or(""), &|name| {
                lookup(defined, name).or_else(|| services.get(name).cloned())
            })
        };
        match out.iter_mut().find(|(k, _)| *k == e.name) {
            Some(slot) => slot.1 = value,
            None => out.push((e.name.clone(), value)),
        }
    }
    for (k, v) in services {
        if !out.iter().any(|(n, _)| *n == k) {
            out.push((k, v));
        }
    }
    Ok(out)
}

/// The value of `name` in a container's env (names are unique: [`container_env`] replaces
/// a repeated one).
#[must_use]
pub fn lookup(env: &[(String, String)], name: &str) -> Option<String> {
    env.iter().find(|(k, _)| k == name).map(|(_, v)| v.clone())
}

/// `ExpandContainerCommandAndArgs`: the command and args with `$(VAR)` from the final env.
#[must_use]
pub fn expand_command_and_args(
    c: &Container,
    env: &[(String, String)],
) -> (Vec<String>, Vec<String>) {
    let each = |v: &Option<Vec<String>>| {
        v.iter()
            .flatten()
            .map(|s| expand(s, &|name| lookup(env, name)))
            .collect::<Vec<_>>()
    };
    (each(&c.command), each(&c.args))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).expect("pod yaml")
    }

    #[test]
    fn expansion_as_kubelet() {
        let vars = BTreeMap::from([
            ("VAR_A".to_owned(), "A".to_owned()),
            ("VAR_B".to_owned(), "B".to_owned()),
            ("EMPTY".to_owned(), String::new()),
        ]);
        let lookup = |n: &str| vars.get(n).cloned();
        // Cases from third_party/forked/golang/expansion/expand_test.go.
        let cases = [
            ("$(VAR_A)", "A"),
            ("___$(VAR_B)___", "___B___"),
            ("$(VAR_A)-$(VAR_B)", "A-B"),
            ("$(VAR_A)$(VAR_B)", "AB"),
            ("$(EMPTY)", ""),
            ("$(UNKNOWN)", "$(UNKNOWN)"),
            ("$$(VAR_A)", "$(VAR_A)"),
            ("$$$(VAR_A)", "$A"),
            ("$$$$(VAR_A)", "$$(VAR_A)"),
            ("$(VAR_A", "$(VAR_A"),
            ("$VAR_A", "$VAR_A"),
            ("$", "$"),
            ("foo$", "foo$"),
            ("$()", "$()"),
            ("f00$(VAR_A)$", "f00A$"),
            ("ü$(VAR_A)$ü", "üA$ü"),
            ("no vars", "no vars"),
        ];
        for (input, want) in cases {
            assert_eq!(expand(input, &lookup), want, "{input}");
        }
    }

    #[test]
    fn env_from_values_fields_and_resources() {
        let p = pod(r#"
metadata: {name: web, namespace: ns, uid: u1, labels: {app: x}, annotations: {a: "1"}}
spec:
  serviceAccountName: sa
  containers:
  - name: c
    command: [echo, "$(POD)"]
    args: ["$(CPU_M)-$(MEM_MI)", "$$(POD)"]
    resources: {requests: {cpu: 250m, memory: 100Mi}, limits: {memory: 128Mi}}
    env:
    - {name: POD, valueFrom: {fieldRef: {fieldPath: metadata.name}}}
    - {name: NS, valueFrom: {fieldRef: {fieldPath: metadata.namespace}}}
    - {name: UID, valueFrom: {fieldRef: {fieldPath: metadata.uid}}}
    - {name: APP, valueFrom: {fieldRef: {fieldPath: "metadata.labels['app']"}}}
    - {name: ANN, valueFrom: {fieldRef: {fieldPath: "metadata.annotations['a']"}}}
    - {name: NODE, valueFrom: {fieldRef: {fieldPath: spec.nodeName}}}
    - {name: SA, valueFrom: {fieldRef: {fieldPath: spec.serviceAccountName}}}
    - {name: CPU_M, valueFrom: {resourceFieldRef: {resource: requests.cpu, divisor: 1m}}}
    - {name: CPU_LIMIT, valueFrom: {resourceFieldRef: {resource: limits.cpu}}}
    - {name: MEM_MI, valueFrom: {resourceFieldRef: {resource: limits.memory, divisor: 1Mi}}}
    - {name: MEM_REQ, valueFrom: {resourceFieldRef: {resource: requests.memory}}}
    - {name: COMBINED, value: "$(POD).$(NS)/$(LATER)"}
    - {name: LATER, value: late}
"#);
        let ctx = EnvContext {
            node_name: "node1".into(),
            allocatable: BTreeMap::from([
                ("cpu".to_owned(), Quantity::parse("3500m").expect("q")),
                ("memory".to_owned(), Quantity::parse("8Gi").expect("q")),
            ]),
            ..EnvContext::default()
        };
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let env = container_env(&p, c, &ctx).expect("env");
        let get = |k: &str| {
            env.iter()
                .find(|(n, _)| n == k)
                .map(|(_, v)| v.as_str())
                .expect(k)
        };
        assert_eq!(get("POD"), "web");
        assert_eq!(get("NS"), "ns");
        assert_eq!(get("UID"), "u1");
        assert_eq!(get("APP"), "x");
        assert_eq!(get("ANN"), "1");
        assert_eq!(get("NODE"), "node1");
        assert_eq!(get("SA"), "sa");
        assert_eq!(get("CPU_M"), "250");
        // No cpu limit: the node's allocatable, rounded up to whole cores.
        assert_eq!(get("CPU_LIMIT"), "4");
        assert_eq!(get("MEM_MI"), "128");
        assert_eq!(get("MEM_REQ"), (100 << 20).to_string());
        // Only variables defined before it expand.
        assert_eq!(get("COMBINED"), "web.ns/$(LATER)");
        let (cmd, args) = expand_command_and_args(c, &env);
        assert_eq!(cmd, ["echo", "web"]);
        assert_eq!(args, ["250-128", "$(POD)"]);
    }

    #[test]
    fn divisor_rounding_as_convert_resource_to_string() {
        let c = |req: &str, lim: &str| resources::test_pods::container("c", req, lim);
        let fs = |r: &str, d: Option<&str>| ResourceFieldSelector {
            resource: r.into(),
            divisor: d.map(|d| k8s_openapi::apimachinery::pkg::api::resource::Quantity(d.into())),
            container_name: None,
        };
        let cases: &[(&str, &str, &str, Option<&str>, &str)] = &[
            ("cpu=250m", "", "requests.cpu", None, "1"),
            ("cpu=250m", "", "requests.cpu", Some("1m"), "250"),
            ("cpu=1500m", "", "requests.cpu", Some("1"), "2"),
            ("cpu=1500m", "", "requests.cpu", Some("500m"), "3"),
            ("cpu=1", "", "requests.cpu", Some("0"), "1"),
            ("", "memory=64Mi", "limits.memory", Some("1Mi"), "64"),
            ("", "memory=1000", "limits.memory", Some("1k"), "1"),
            ("", "memory=1001", "limits.memory", Some("1k"), "2"),
            ("", "memory=1Gi", "limits.memory", None, "1073741824"),
            (
                "",
                "ephemeral-storage=1Gi",
                "limits.ephemeral-storage",
                Some("1Mi"),
                "1024",
            ),
            ("", "", "requests.memory", None, "0"),
        ];
        for (req, lim, r, d, want) in cases {
            let got = container_resource_value(&fs(r, *d), &c(req, lim)).expect(r);
            assert_eq!(got, *want, "{req} {lim} {r} {d:?}");
        }
        assert!(matches!(
            container_resource_value(&fs("limits.foo", None), &c("", "")),
            Err(EnvError::Resource(_))
        ));
    }

    #[test]
    fn config_map_and_secret_refs_without_an_api_server_fail_as_kubelet() {
        let p = pod(r#"
metadata: {name: web, namespace: ns}
spec:
  containers:
  - name: c
    env: [{name: X, valueFrom: {configMapKeyRef: {name: cm, key: k}}}]
"#);
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let e = container_env(&p, c, &EnvContext::default()).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "couldn't get configMap ns/cm, no kubeClient defined"
        );
        let p = pod(
            "metadata: {name: web}\nspec: {containers: [{name: c, envFrom: [{secretRef: {name: s}}]}]}",
        );
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let e = container_env(&p, c, &EnvContext::default()).expect_err("refused");
        assert_eq!(
            e.to_string(),
            "couldn't get secret default/s, no kubeClient defined"
        );
    }

    /// envFrom (prefixed, a later source replacing an earlier value), then `env` overriding
    /// it and expanding over it; optional references that are missing leave nothing.
    #[test]
    fn env_from_objects_as_make_environment_variables() {
        use std::sync::Arc;

        use k8s_openapi::{
            ByteString,
            api::core::v1::{ConfigMap, Secret},
        };

        use crate::policy::objects::Fetched;
        let p = pod(r#"
metadata: {name: web, namespace: ns}
spec:
  containers:
  - name: c
    envFrom:
    - configMapRef: {name: cfg}
    - secretRef: {name: sec}
      prefix: S_
    - configMapRef: {name: missing, optional: true}
    env:
    - {name: MODE, value: "$(MODE)-override"}
    - {name: API, value: "https://$(KUBERNETES_SERVICE_HOST):$(KUBERNETES_SERVICE_PORT)"}
    - {name: KUBERNETES_PORT, value: mine}
    - {name: PW, valueFrom: {secretKeyRef: {name: sec, key: pw}}}
    - {name: GONE, valueFrom: {configMapKeyRef: {name: cfg, key: nope, optional: true}}}
"#);
        let objects = PodObjects {
            api: true,
            namespace: "ns".into(),
            config_maps: BTreeMap::from([
                (
                    "cfg".to_owned(),
                    Fetched::Found(Arc::new(ConfigMap {
                        data: Some(BTreeMap::from([
                            ("MODE".into(), "fast".into()),
                            ("LEVEL".into(), "3".into()),
                        ])),
                        ..Default::default()
                    })),
                ),
                ("missing".to_owned(), Fetched::NotFound),
            ]),
            secrets: BTreeMap::from([(
                "sec".to_owned(),
                Fetched::Found(Arc::new(Secret {
                    data: Some(BTreeMap::from([(
                        "pw".into(),
                        ByteString(b"s3cret".to_vec()),
                    )])),
                    ..Default::default()
                })),
            )]),
            tokens: BTreeMap::new(),
            services: Some(Ok(vec![
                serde_json::from_value(serde_json::json!({
                    "metadata": {"name": "kubernetes", "namespace": "default"},
                    "spec": {"clusterIP": "10.96.0.1", "ports": [{"name": "https", "port": 443}]},
                }))
                .expect("service"),
            ])),
        };
        let ctx = EnvContext {
            objects: Some(Arc::new(objects)),
            ..EnvContext::default()
        };
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let env = container_env(&p, c, &ctx).expect("env");
        assert_eq!(
            env,
            [
                ("LEVEL".to_owned(), "3".to_owned()),
                ("MODE".to_owned(), "fast-override".to_owned()),
                ("S_pw".to_owned(), "s3cret".to_owned()),
                ("API".to_owned(), "https://10.96.0.1:443".to_owned()),
                ("KUBERNETES_PORT".to_owned(), "mine".to_owned()),
                ("PW".to_owned(), "s3cret".to_owned()),
                (
                    "KUBERNETES_PORT_443_TCP".to_owned(),
                    "tcp://10.96.0.1:443".to_owned()
                ),
                (
                    "KUBERNETES_PORT_443_TCP_ADDR".to_owned(),
                    "10.96.0.1".to_owned()
                ),
                ("KUBERNETES_PORT_443_TCP_PORT".to_owned(), "443".to_owned()),
                ("KUBERNETES_PORT_443_TCP_PROTO".to_owned(), "tcp".to_owned()),
                ("KUBERNETES_SERVICE_HOST".to_owned(), "10.96.0.1".to_owned()),
                ("KUBERNETES_SERVICE_PORT".to_owned(), "443".to_owned()),
                ("KUBERNETES_SERVICE_PORT_HTTPS".to_owned(), "443".to_owned()),
            ]
        );
    }

    #[test]
    fn labels_and_annotations_formatted_as_format_map() {
        let p = pod(r#"
metadata: {name: web, labels: {b: "2", a: "x\"y"}}
spec: {containers: [{name: c}]}
"#);
        assert_eq!(
            metadata_field(&p, "metadata.labels").expect("labels"),
            "a=\"x\\\"y\"\nb=\"2\""
        );
        assert_eq!(metadata_field(&p, "metadata.annotations").expect("ann"), "");
        assert!(metadata_field(&p, "spec.nodeName").is_err());
    }
}
