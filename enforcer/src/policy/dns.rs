//! A pod's name resolution as kubelet sets it up: the sandbox's DNS configuration
//! (`pkg/kubelet/network/dns/dns.go`, `GetPodDNS`) from `dnsPolicy`, `dnsConfig`, the
//! node's `clusterDNS` / `clusterDomain` and its resolver file; the pod's host name and
//! domain (`GeneratePodHostNameAndDomain`); and the managed `/etc/hosts` every container
//! gets (`makeHostsMount`: the pod's IPs and name, `hostAliases`; for host-network pods the
//! node's own hosts file with the aliases). Pure: files are read and written by the pod
//! worker.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Pod;

/// The most nameservers a resolver reads (glibc's `MAXNS`).
pub const MAX_NAMESERVERS: usize = 3;
/// kubelet's `MaxDNSSearchPaths` and `MaxDNSSearchListChars`.
pub const MAX_SEARCH_PATHS: usize = 32;
pub const MAX_SEARCH_LIST_CHARS: usize = 2048;
/// `defaultDNSOptions` of a ClusterFirst pod.
pub const CLUSTER_FIRST_OPTIONS: &[&str] = &["ndots:5"];
/// The header of a managed hosts file.
pub const MANAGED_HOSTS_HEADER: &str = "# Kubernetes-managed hosts file.\n";
/// The header of a host-network pod's hosts file.
pub const MANAGED_HOSTS_HEADER_HOST_NETWORK: &str =
    "# Kubernetes-managed hosts file (host network).\n";

/// What the node contributes to pods' DNS (kubelet's `clusterDNS`, `clusterDomain`,
/// `resolvConf`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsSettings {
    pub cluster_dns: Vec<String>,
    pub cluster_domain: String,
    /// The node's resolver file (`/etc/resolv.conf`); empty disables host DNS for pods
    /// (they get `127.0.0.1` and search `.`).
    pub resolv_conf: String,
}

/// kubelet's defaults: no cluster DNS, no domain, `/etc/resolv.conf`.
impl Default for DnsSettings {
    fn default() -> Self {
        Self {
            cluster_dns: Vec::new(),
            cluster_domain: String::new(),
            resolv_conf: DEFAULT_RESOLV_CONF.to_owned(),
        }
    }
}

/// kubelet's default `resolvConf`.
pub const DEFAULT_RESOLV_CONF: &str = "/etc/resolv.conf";

/// A resolver configuration (servers, search domains, options).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Resolver {
    pub servers: Vec<String>,
    pub searches: Vec<String>,
    pub options: Vec<String>,
}

impl Resolver {
    #[must_use]
    pub fn to_cri(&self) -> cri::DnsConfig {
        cri::DnsConfig {
            servers: self.servers.clone(),
            searches: self.searches.clone(),
            options: self.options.clone(),
        }
    }
}

/// A resolv.conf's `nameserver`, `search` (the last line wins) and `options` lines
/// (kubelet's `parseResolvConf`).
#[must_use]
pub fn parse_resolv_conf(text: &str) -> Resolver {
    let mut r = Resolver::default();
    for line in text.lines() {
        let line = line.split(['#', ';']).next().unwrap_or("");
        let mut f = line.split_whitespace();
        match f.next() {
            Some("nameserver") => r.servers.extend(f.next().map(str::to_owned)),
            Some("search") => {
                r.searches = f
                    .map(|s| s.trim_end_matches('.').to_owned())
                    .filter(|s| !s.is_empty())
                    .collect();
            }
            Some("options") => r.options.extend(f.map(str::to_owned)),
            _ => {}
        }
    }
    r
}

fn omit_duplicates(v: Vec<String>) -> Vec<String> {
    let mut out: Vec<String> = Vec::with_capacity(v.len());
    for s in v {
        if !out.contains(&s) {
            out.push(s);
        }
    }
    out
}

/// A warning kubelet records on the pod: (reason, message).
pub type Warning = (&'static str, String);

/// The pod's DNS type (`getPodDNSType`): ClusterFirst, Default (the host's), or None.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DnsType {
    Cluster,
    Host,
    None,
}

/// Why the pod's DNS configuration cannot be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DnsError {
    /// A `dnsPolicy` kubelet does not know.
    #[error("invalid DNSPolicy={0}")]
    Policy(String),
}

fn dns_type(pod: &Pod) -> Result<DnsType, DnsError> {
    let spec = pod.spec.as_ref();
    let host_network = spec.and_then(|s| s.host_network).unwrap_or(false);
    match spec
        .and_then(|s| s.dns_policy.as_deref())
        .unwrap_or("ClusterFirst")
    {
        "None" => Ok(DnsType::None),
        "ClusterFirstWithHostNet" => Ok(DnsType::Cluster),
        "ClusterFirst" if !host_network => Ok(DnsType::Cluster),
        "ClusterFirst" | "Default" => Ok(DnsType::Host),
        other => Err(DnsError::Policy(other.to_owned())),
    }
}

/// The sandbox's DNS configuration and the warnings kubelet records on the pod (reason,
/// message): `MissingClusterDNS` when a ClusterFirst pod meets a node without `clusterDNS`
/// (it falls back to the host's), `DNSConfigForming` when a limit cut something.
/// `host` is the node's resolver file, as read (`None` when `resolv_conf` is empty).
pub fn pod_dns(
    pod: &Pod,
    settings: &DnsSettings,
    host: Option<&Resolver>,
) -> Result<(Resolver, Vec<Warning>), DnsError> {
    let mut warnings = Vec::new();
    let mut r = host.cloned().unwrap_or_default();
    match dns_type(pod)? {
        DnsType::None => r = Resolver::default(),
        DnsType::Cluster if !settings.cluster_dns.is_empty() => {
            r.servers.clone_from(&settings.cluster_dns);
            if !settings.cluster_domain.is_empty() {
                let d = &settings.cluster_domain;
                let ns = pod.metadata.namespace.as_deref().unwrap_or("default");
                let mut s = vec![format!("{ns}.svc.{d}"), format!("svc.{d}"), d.clone()];
                s.append(&mut r.searches);
                r.searches = omit_duplicates(s);
            }
            r.options = CLUSTER_FIRST_OPTIONS
                .iter()
                .map(|s| (*s).to_owned())
                .collect();
        }
        t => {
            if t == DnsType::Cluster {
                warnings.push((
                    "MissingClusterDNS",
                    format!(
                        "pod: {:?}. kubelet does not have ClusterDNS IP configured and cannot create Pod using \"ClusterFirst\" policy. Falling back to \"Default\" policy.",
                        crate::policy::security::format_pod(pod)
                    ),
                ));
            }
            if settings.resolv_conf.is_empty() {
                r.servers = vec!["127.0.0.1".to_owned()];
                r.searches = vec![".".to_owned()];
            }
        }
    }
    if let Some(c) = pod.spec.as_ref().and_then(|s| s.dns_config.as_ref()) {
        let mut servers = std::mem::take(&mut r.servers);
        servers.extend(c.nameservers.iter().flatten().cloned());
        r.servers = omit_duplicates(servers);
        let mut searches = std::mem::take(&mut r.searches);
        searches.extend(c.searches.iter().flatten().cloned());
        r.searches = omit_duplicates(searches);
        // mergeDNSOptions: by name, the pod's value winning; kubelet's map has no order,
        // this one is sorted.
        let mut opts: std::collections::BTreeMap<String, String> = r
            .options
            .iter()
            .map(|o| match o.split_once(':') {
                Some((k, v)) => (k.to_owned(), v.to_owned()),
                None => (o.clone(), String::new()),
            })
            .collect();
        for o in c.options.iter().flatten() {
            if let Some(name) = &o.name {
                opts.insert(name.clone(), o.value.clone().unwrap_or_default());
            }
        }
        r.options = opts
            .into_iter()
            .map(|(k, v)| if v.is_empty() { k } else { format!("{k}:{v}") })
            .collect();
    }
    // formDNSConfigFitsLimits.
    if r.servers.len() > MAX_NAMESERVERS {
        r.servers.truncate(MAX_NAMESERVERS);
        warnings.push((
            "DNSConfigForming",
            format!(
                "Nameserver limits were exceeded, some nameservers have been omitted, the applied nameserver line is: {}",
                r.servers.join(" ")
            ),
        ));
    }
    let mut cut = false;
    if r.searches.len() > MAX_SEARCH_PATHS {
        r.searches.truncate(MAX_SEARCH_PATHS);
        cut = true;
    }
    while !r.searches.is_empty() && r.searches.join(" ").len() > MAX_SEARCH_LIST_CHARS {
        r.searches.pop();
        cut = true;
    }
    if cut {
        warnings.push((
            "DNSConfigForming",
            format!(
                "Search Line limits were exceeded, some search paths have been omitted, the applied search line is: {}",
                r.searches.join(" ")
            ),
        ));
    }
    Ok((r, warnings))
}

/// The pod's host name and domain (`GeneratePodHostNameAndDomain`): `spec.hostname` or the
/// pod's name, cut to 63 characters (no trailing `-` or `.`); the domain
/// `<subdomain>.<namespace>.svc.<clusterDomain>` when a subdomain is set.
#[must_use]
pub fn host_name_and_domain(pod: &Pod, cluster_domain: &str) -> (String, String) {
    let spec = pod.spec.as_ref();
    let mut name = spec
        .and_then(|s| s.hostname.clone())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| pod.metadata.name.clone().unwrap_or_default());
    if name.len() > 63 {
        let mut cut = 63;
        while !name.is_char_boundary(cut) {
            cut -= 1;
        }
        name.truncate(cut);
        while name.ends_with(['-', '.']) {
            name.pop();
        }
    }
    let domain = spec
        .and_then(|s| s.subdomain.as_deref())
        .filter(|s| !s.is_empty())
        .map(|sub| {
            format!(
                "{sub}.{}.svc.{cluster_domain}",
                pod.metadata.namespace.as_deref().unwrap_or("default")
            )
        })
        .unwrap_or_default();
    (name, domain)
}

fn host_aliases(pod: &Pod) -> String {
    let aliases = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_aliases.as_ref())
        .filter(|a| !a.is_empty());
    let Some(aliases) = aliases else {
        return String::new();
    };
    let mut out = String::from("\n# Entries added by HostAliases.\n");
    for a in aliases {
        out.push_str(&format!(
            "{}\t{}\n",
            a.ip,
            a.hostnames
                .iter()
                .flatten()
                .cloned()
                .collect::<Vec<_>>()
                .join("\t")
        ));
    }
    out
}

/// The managed `/etc/hosts` of a pod (`managedHostsFileContent`, or for a host-network pod
/// `nodeHostsFileContent` over `node_hosts`, the node's hosts file).
#[must_use]
pub fn hosts_file(pod: &Pod, pod_ips: &[String], cluster_domain: &str, node_hosts: &str) -> String {
    let host_network = pod
        .spec
        .as_ref()
        .and_then(|s| s.host_network)
        .unwrap_or(false);
    if host_network {
        return format!(
            "{MANAGED_HOSTS_HEADER_HOST_NETWORK}{node_hosts}{}",
            host_aliases(pod)
        );
    }
    let (name, domain) = host_name_and_domain(pod, cluster_domain);
    let mut out = String::from(MANAGED_HOSTS_HEADER);
    out.push_str("127.0.0.1\tlocalhost\n");
    out.push_str("::1\tlocalhost ip6-localhost ip6-loopback\n");
    out.push_str("fe00::0\tip6-localnet\n");
    out.push_str("fe00::0\tip6-mcastprefix\n");
    out.push_str("fe00::1\tip6-allnodes\n");
    out.push_str("fe00::2\tip6-allrouters\n");
    for ip in pod_ips {
        if domain.is_empty() {
            out.push_str(&format!("{ip}\t{name}\n"));
        } else {
            out.push_str(&format!("{ip}\t{name}.{domain}\t{name}\n"));
        }
    }
    out.push_str(&host_aliases(pod));
    out
}

/// Whether the container gets the managed hosts file (kubelet: when the pod has IPs and the
/// container mounts nothing at `/etc/hosts` itself).
#[must_use]
pub fn mounts_hosts_file(c: &k8s_openapi::api::core::v1::Container, pod_ips: &[String]) -> bool {
    !pod_ips.is_empty()
        && !c
            .volume_mounts
            .iter()
            .flatten()
            .any(|m| m.mount_path.trim_end_matches('/') == "/etc/hosts")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).unwrap_or_else(|e| panic!("pod yaml: {e}"))
    }

    fn settings(dns: &[&str]) -> DnsSettings {
        DnsSettings {
            cluster_dns: dns.iter().map(|s| (*s).to_owned()).collect(),
            cluster_domain: "cluster.local".to_owned(),
            resolv_conf: "/etc/resolv.conf".to_owned(),
        }
    }

    fn host() -> Resolver {
        parse_resolv_conf(
            "# generated\nnameserver 10.0.0.2\nnameserver 10.0.0.3 ; x\nsearch old.example\nsearch corp.example. lab.example\noptions edns0 timeout:2\n",
        )
    }

    #[test]
    fn resolv_conf_as_parse_resolv_conf() {
        let r = host();
        assert_eq!(r.servers, ["10.0.0.2", "10.0.0.3"]);
        assert_eq!(
            r.searches,
            ["corp.example", "lab.example"],
            "the last search line"
        );
        assert_eq!(r.options, ["edns0", "timeout:2"]);
    }

    /// kubelet's `TestGetPodDNSType` and `TestGetPodDNS` cases.
    #[test]
    fn policies_as_get_pod_dns() {
        let h = host();
        // ClusterFirst with clusterDNS: only the cluster's servers, its searches first.
        let p = pod("metadata: {name: web, namespace: ns}\nspec: {containers: [{name: c}]}");
        let (r, w) = pod_dns(&p, &settings(&["10.96.0.10"]), Some(&h)).expect("dns");
        assert_eq!(r.servers, ["10.96.0.10"]);
        assert_eq!(
            r.searches,
            [
                "ns.svc.cluster.local",
                "svc.cluster.local",
                "cluster.local",
                "corp.example",
                "lab.example"
            ]
        );
        assert_eq!(r.options, ["ndots:5"]);
        assert!(w.is_empty());
        // Without clusterDNS: the host's, and kubelet's warning.
        let (r, w) = pod_dns(&p, &settings(&[]), Some(&h)).expect("dns");
        assert_eq!(r, h);
        assert_eq!(w.len(), 1);
        assert_eq!(w[0].0, "MissingClusterDNS");
        assert!(
            w[0].1.contains("Falling back to \"Default\" policy."),
            "{}",
            w[0].1
        );
        // A host-network pod: ClusterFirst is the host's; ClusterFirstWithHostNet the cluster's.
        let hn = pod("metadata: {name: web}\nspec: {hostNetwork: true, containers: [{name: c}]}");
        assert_eq!(
            pod_dns(&hn, &settings(&["10.96.0.10"]), Some(&h))
                .expect("dns")
                .0,
            h
        );
        let hn2 = pod(
            "metadata: {name: web}\nspec: {hostNetwork: true, dnsPolicy: ClusterFirstWithHostNet, containers: [{name: c}]}",
        );
        assert_eq!(
            pod_dns(&hn2, &settings(&["10.96.0.10"]), Some(&h))
                .expect("dns")
                .0
                .servers,
            ["10.96.0.10"]
        );
        // None: only the pod's dnsConfig; options merged by name, the pod's winning.
        let none = pod(
            "metadata: {name: web}\nspec:\n  dnsPolicy: None\n  dnsConfig: {nameservers: [1.1.1.1, 1.1.1.1, 8.8.8.8], searches: [a.example], options: [{name: ndots, value: '2'}, {name: edns0}]}\n  containers: [{name: c}]",
        );
        let (r, _) = pod_dns(&none, &settings(&["10.96.0.10"]), Some(&h)).expect("dns");
        assert_eq!(r.servers, ["1.1.1.1", "8.8.8.8"]);
        assert_eq!(r.searches, ["a.example"]);
        assert_eq!(r.options, ["edns0", "ndots:2"]);
        let over = pod(
            "metadata: {name: web}\nspec:\n  dnsConfig: {options: [{name: ndots, value: '1'}]}\n  containers: [{name: c}]",
        );
        let (r, _) = pod_dns(&over, &settings(&["10.96.0.10"]), Some(&h)).expect("dns");
        assert_eq!(r.options, ["ndots:1"]);
        // Default with resolvConf "": localhost and search ".".
        let d = pod("metadata: {name: web}\nspec: {dnsPolicy: Default, containers: [{name: c}]}");
        let no_file = DnsSettings {
            resolv_conf: String::new(),
            ..settings(&[])
        };
        let (r, _) = pod_dns(&d, &no_file, None).expect("dns");
        assert_eq!(
            (r.servers, r.searches),
            (vec!["127.0.0.1".to_owned()], vec![".".to_owned()])
        );
        let bad =
            pod("metadata: {name: web}\nspec: {dnsPolicy: Sideways, containers: [{name: c}]}");
        assert_eq!(
            pod_dns(&bad, &settings(&[]), Some(&h)).map_err(|e| e.to_string()),
            Err("invalid DNSPolicy=Sideways".to_owned())
        );
    }

    #[test]
    fn limits_cut_with_a_warning() {
        let p = pod(
            "metadata: {name: web}\nspec:\n  dnsPolicy: None\n  dnsConfig: {nameservers: [1.0.0.1, 1.0.0.2, 1.0.0.3, 1.0.0.4]}\n  containers: [{name: c}]",
        );
        let (r, w) = pod_dns(&p, &settings(&[]), None).expect("dns");
        assert_eq!(r.servers, ["1.0.0.1", "1.0.0.2", "1.0.0.3"]);
        assert_eq!(w[0].0, "DNSConfigForming");
        assert!(w[0].1.ends_with("1.0.0.1 1.0.0.2 1.0.0.3"), "{}", w[0].1);
        let searches: Vec<String> = (0..40).map(|i| format!("s{i}.example")).collect();
        let mut p = pod("metadata: {name: web}\nspec: {dnsPolicy: None, containers: [{name: c}]}");
        p.spec.as_mut().expect("spec").dns_config =
            Some(k8s_openapi::api::core::v1::PodDNSConfig {
                searches: Some(searches),
                ..Default::default()
            });
        let (r, w) = pod_dns(&p, &settings(&[]), None).expect("dns");
        assert_eq!(r.searches.len(), MAX_SEARCH_PATHS);
        assert!(
            w.iter()
                .any(|(k, m)| *k == "DNSConfigForming" && m.contains("Search Line"))
        );
    }

    /// kubelet's `TestManagedHostsFileContent` / `TestNodeHostsFileContent` shapes.
    #[test]
    fn hosts_files() {
        let p = pod(
            "metadata: {name: web, namespace: ns}\nspec:\n  hostname: h\n  subdomain: sub\n  hostAliases: [{ip: 10.1.1.1, hostnames: [a.example, b.example]}]\n  containers: [{name: c}]",
        );
        assert_eq!(
            hosts_file(&p, &["10.244.0.7".to_owned()], "cluster.local", ""),
            "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\nfe00::0\tip6-localnet\nfe00::0\tip6-mcastprefix\nfe00::1\tip6-allnodes\nfe00::2\tip6-allrouters\n10.244.0.7\th.sub.ns.svc.cluster.local\th\n\n# Entries added by HostAliases.\n10.1.1.1\ta.example\tb.example\n"
        );
        let plain = pod("metadata: {name: web}\nspec: {containers: [{name: c}]}");
        assert!(
            hosts_file(&plain, &["10.244.0.8".to_owned()], "", "")
                .ends_with("fe00::2\tip6-allrouters\n10.244.0.8\tweb\n")
        );
        let hn = pod(
            "metadata: {name: web}\nspec: {hostNetwork: true, hostAliases: [{ip: 10.1.1.1, hostnames: [a]}], containers: [{name: c}]}",
        );
        assert_eq!(
            hosts_file(
                &hn,
                &["192.168.1.5".to_owned()],
                "",
                "127.0.0.1 localhost\n"
            ),
            "# Kubernetes-managed hosts file (host network).\n127.0.0.1 localhost\n\n# Entries added by HostAliases.\n10.1.1.1\ta\n"
        );
        let long = pod(&format!(
            "metadata: {{name: {}-x}}\nspec: {{containers: [{{name: c}}]}}",
            "a".repeat(62)
        ));
        assert_eq!(
            host_name_and_domain(&long, "").0,
            "a".repeat(62),
            "cut at 63, no trailing '-'"
        );
    }

    #[test]
    fn containers_mounting_etc_hosts_keep_theirs() {
        let ips = vec!["10.0.0.1".to_owned()];
        let c: k8s_openapi::api::core::v1::Container =
            serde_yaml_ng::from_str("{name: c, volumeMounts: [{name: v, mountPath: /etc/hosts}]}")
                .expect("c");
        assert!(!mounts_hosts_file(&c, &ips));
        let c: k8s_openapi::api::core::v1::Container =
            serde_yaml_ng::from_str("{name: c}").expect("c");
        assert!(mounts_hosts_file(&c, &ips));
        assert!(!mounts_hosts_file(&c, &[]), "no IPs yet: no hosts file");
    }
}
