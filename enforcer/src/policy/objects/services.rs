//! The service environment variables of a pod's containers (kubelet's `getServiceEnvVarMap`
//! and `envvars.FromServices`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Pod, Service};

use super::{ObjectError, PodObjects};

/// The master services every pod gets variables for, whatever `enableServiceLinks` says.
pub const MASTER_SERVICES: &[&str] = &["kubernetes"];

/// Whether the pod asks for its namespace's service variables (`enableServiceLinks`,
/// default true).
#[must_use]
pub fn service_links(pod: &Pod) -> bool {
    pod.spec
        .as_ref()
        .and_then(|s| s.enable_service_links)
        .unwrap_or(true)
}

/// `makeEnvVariableName`.
fn env_prefix(name: &str) -> String {
    name.replace('-', "_").to_uppercase()
}

/// kubelet's `getServiceEnvVarMap` + `envvars.FromServices`: for each service with a cluster
/// IP, the master services of `default` always and the pod's namespace's when
/// `enable_links` (a namespace service of a master's name takes its place, as in kubelet's
/// map):
/// `<NAME>_SERVICE_HOST`, `<NAME>_SERVICE_PORT` (the first port), `<NAME>_SERVICE_PORT_<PORT
/// NAME>` for named ports, and Docker's link variables (`<NAME>_PORT`,
/// `<NAME>_PORT_<port>_<PROTO>` with `_PROTO`, `_PORT`, `_ADDR`).
#[must_use]
pub fn service_env(
    services: &[Service],
    namespace: &str,
    enable_links: bool,
) -> BTreeMap<String, String> {
    let mut chosen: BTreeMap<String, &Service> = BTreeMap::new();
    for s in services {
        let Some(spec) = s.spec.as_ref() else {
            continue;
        };
        let ip = spec.cluster_ip.as_deref().unwrap_or("");
        let name = s.metadata.name.as_deref().unwrap_or("");
        if ip.is_empty() || ip == "None" || name.is_empty() {
            continue;
        }
        let ns = s.metadata.namespace.as_deref().unwrap_or("default");
        if ns == "default" && MASTER_SERVICES.contains(&name) {
            chosen.entry(name.to_owned()).or_insert(s);
        } else if ns == namespace && enable_links {
            chosen.insert(name.to_owned(), s);
        }
    }
    let mut out = BTreeMap::new();
    for (name, s) in chosen {
        let Some(spec) = s.spec.as_ref() else {
            continue;
        };
        let Some(ports) = spec.ports.as_ref().filter(|p| !p.is_empty()) else {
            continue;
        };
        let ip = spec.cluster_ip.clone().unwrap_or_default();
        let prefix = env_prefix(&name);
        out.insert(format!("{prefix}_SERVICE_HOST"), ip.clone());
        out.insert(format!("{prefix}_SERVICE_PORT"), ports[0].port.to_string());
        for p in ports {
            if let Some(pn) = p.name.as_deref().filter(|n| !n.is_empty()) {
                out.insert(
                    format!("{prefix}_SERVICE_PORT_{}", env_prefix(pn)),
                    p.port.to_string(),
                );
            }
        }
        for (i, p) in ports.iter().enumerate() {
            let proto = p.protocol.as_deref().unwrap_or("TCP");
            let host_port = if ip.contains(':') {
                format!("[{ip}]:{}", p.port)
            } else {
                format!("{ip}:{}", p.port)
            };
            let url = format!("{}://{host_port}", proto.to_lowercase());
            if i == 0 {
                out.insert(format!("{prefix}_PORT"), url.clone());
            }
            let pp = format!("{prefix}_PORT_{}_{}", p.port, proto.to_uppercase());
            out.insert(format!("{pp}_PROTO"), proto.to_lowercase());
            out.insert(format!("{pp}_PORT"), p.port.to_string());
            out.insert(format!("{pp}_ADDR"), ip.clone());
            out.insert(pp, url);
        }
    }
    out
}

impl PodObjects {
    /// The service variables of the pod's containers: none when services were not read
    /// (standalone), kubelet's error when they could not be.
    pub fn service_env(&self, enable_links: bool) -> Result<BTreeMap<String, String>, ObjectError> {
        match &self.services {
            None => Ok(BTreeMap::new()),
            Some(Ok(s)) => Ok(service_env(s, &self.namespace, enable_links)),
            Some(Err(e)) => Err(ObjectError::Services(e.clone())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// kubelet's `TestMakeEnvironmentVariables` service cases: master services always, the
    /// namespace's with links, headless ones never, a namespace service of a master's name
    /// taking its place.
    #[test]
    fn service_variables_as_from_services() {
        let svc = |ns: &str, name: &str, ip: &str, ports: serde_json::Value| -> Service {
            serde_json::from_value(serde_json::json!({
                "metadata": {"name": name, "namespace": ns},
                "spec": {"clusterIP": ip, "ports": ports},
            }))
            .expect("service")
        };
        let services = vec![
            svc(
                "default",
                "kubernetes",
                "10.96.0.1",
                serde_json::json!([{"name": "https", "port": 443}]),
            ),
            svc(
                "ns",
                "kubernetes",
                "10.96.9.9",
                serde_json::json!([{"port": 1}]),
            ),
            svc(
                "ns",
                "my-db",
                "10.96.0.20",
                serde_json::json!([{"port": 5432}, {"name": "metrics", "port": 9187, "protocol": "UDP"}]),
            ),
            svc("ns", "headless", "None", serde_json::json!([{"port": 80}])),
            svc(
                "other",
                "elsewhere",
                "10.96.0.30",
                serde_json::json!([{"port": 80}]),
            ),
        ];
        // Without the namespace's own "kubernetes": the master service's variables.
        let no_local: Vec<Service> = services
            .iter()
            .filter(|s| s.spec.as_ref().and_then(|p| p.cluster_ip.as_deref()) != Some("10.96.9.9"))
            .cloned()
            .collect();
        let env = service_env(&no_local, "ns", true);
        let get = |k: &str| env.get(k).map(String::as_str);
        assert_eq!(get("KUBERNETES_SERVICE_HOST"), Some("10.96.0.1"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_SERVICE_PORT_HTTPS"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP"), Some("tcp://10.96.0.1:443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PROTO"), Some("tcp"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_PORT"), Some("443"));
        assert_eq!(get("KUBERNETES_PORT_443_TCP_ADDR"), Some("10.96.0.1"));
        assert_eq!(get("MY_DB_SERVICE_HOST"), Some("10.96.0.20"));
        assert_eq!(get("MY_DB_SERVICE_PORT"), Some("5432"));
        assert_eq!(get("MY_DB_SERVICE_PORT_METRICS"), Some("9187"));
        assert_eq!(get("MY_DB_PORT_9187_UDP"), Some("udp://10.96.0.20:9187"));
        assert_eq!(env.len(), 8 + 2 + 1 + 1 + 4 + 4, "{env:?}");
        assert!(
            !env.keys()
                .any(|k| k.starts_with("HEADLESS") || k.starts_with("ELSEWHERE"))
        );
        // kubelet's map: a service of the pod's namespace replaces a master service of the
        // same name (the master is only added where the name is free).
        let env = service_env(&services, "ns", true);
        assert_eq!(
            env.get("KUBERNETES_SERVICE_HOST").map(String::as_str),
            Some("10.96.9.9")
        );
        // enableServiceLinks: false keeps only the master service.
        let env = service_env(&services, "ns", false);
        assert!(env.keys().all(|k| k.starts_with("KUBERNETES_")), "{env:?}");
        assert_eq!(env.len(), 8);
    }
}
