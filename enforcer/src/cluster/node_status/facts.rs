//! What the node reports about itself ([`NodeFacts`]): this machine's kernel, OS image, ids
//! and address, the version, and kubelet's default labels.

use std::collections::BTreeMap;

use crate::node::node_ip;

/// What the node reports about itself.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct NodeFacts {
    /// `hostnameOverride`, else the hostname; lower-cased (also the `kubernetes.io/hostname`
    /// label and the `Hostname` address, as kubelet's hostname is the override when given).
    pub name: String,
    /// `--node-labels` (the default labels are added by [`default_labels`]).
    pub labels: BTreeMap<String, String>,
    pub capacity: BTreeMap<String, String>,
    pub allocatable: BTreeMap<String, String>,
    /// The `InternalIP` address (and pods' `hostIP`).
    pub host_ip: Option<String>,
    pub kernel_version: String,
    pub os_image: String,
    /// `containerd://1.6.20`, from CRI `Version`.
    pub container_runtime_version: String,
    pub machine_id: String,
    pub system_uuid: String,
    pub boot_id: String,
}

/// Go's `runtime.GOARCH` for this build.
#[must_use]
pub fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64le",
        other => other,
    }
}

fn read_trimmed(path: &str) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// `PRETTY_NAME` of `/etc/os-release` (kubelet's `osImage`).
#[must_use]
pub fn os_image(os_release: &str) -> String {
    os_release
        .lines()
        .find_map(|l| l.strip_prefix("PRETTY_NAME="))
        .map(|v| v.trim().trim_matches('"').to_owned())
        .unwrap_or_else(|| "Linux".to_owned())
}

impl NodeFacts {
    /// This machine's facts (kernel, OS image, ids, address) around the given name, labels
    /// and resources.
    #[must_use]
    pub fn gather(
        name: &str,
        labels: BTreeMap<String, String>,
        capacity: &BTreeMap<String, crate::quantity::Quantity>,
        allocatable: &BTreeMap<String, crate::quantity::Quantity>,
        container_runtime_version: String,
    ) -> Self {
        let q = |m: &BTreeMap<String, crate::quantity::Quantity>| {
            m.iter().map(|(k, v)| (k.clone(), v.to_string())).collect()
        };
        Self {
            name: name.to_owned(),
            labels,
            capacity: q(capacity),
            allocatable: q(allocatable),
            host_ip: node_ip(),
            kernel_version: read_trimmed("/proc/sys/kernel/osrelease"),
            os_image: os_image(&std::fs::read_to_string("/etc/os-release").unwrap_or_default()),
            container_runtime_version,
            machine_id: read_trimmed("/etc/machine-id"),
            system_uuid: read_trimmed("/sys/class/dmi/id/product_uuid").to_lowercase(),
            boot_id: read_trimmed("/proc/sys/kernel/random/boot_id"),
        }
    }
}

/// kubelet's default labels (`kubernetes.io/hostname`, `kubernetes.io/os`,
/// `kubernetes.io/arch` and their deprecated `beta.` twins) over `--node-labels`: the labels
/// of the registered Node and the ones admission matches node selectors and affinity against.
#[must_use]
pub fn node_labels(name: &str, node_labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut labels = node_labels.clone();
    // kubelet's `hostname`: the override when given, as the node name is.
    for (k, v) in [
        ("kubernetes.io/hostname", name),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", go_arch()),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", go_arch()),
    ] {
        labels.insert(k.to_owned(), v.to_owned());
    }
    labels
}

/// [`node_labels`] of the node's facts.
#[must_use]
pub fn default_labels(facts: &NodeFacts) -> BTreeMap<String, String> {
    node_labels(&facts.name, &facts.labels)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn os_release() {
        assert_eq!(
            os_image("ID=debian\nPRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\n"),
            "Debian GNU/Linux 12 (bookworm)"
        );
        assert_eq!(os_image(""), "Linux");
    }
}
