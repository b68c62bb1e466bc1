//! Sysctls: the pod's, for the sandbox (`generatePodSandboxLinuxConfig`), and kubelet's sysctl
//! admission (`pkg/kubelet/sysctl`, `component-helpers/node/util/sysctl`): the safe sysctls,
//! `allowedUnsafeSysctls` patterns and namespaces, reason `SysctlForbidden`.

use std::collections::{BTreeMap, HashMap};

use k8s_openapi::api::core::v1::Pod;

use super::{SecurityError, pod_security_context};

/// The pod's sysctls for `LinuxPodSandboxConfig.sysctls` (the last of a repeated name wins).
#[must_use]
pub fn pod_sysctls(pod: &Pod) -> HashMap<String, String> {
    pod_security_context(pod)
        .and_then(|s| s.sysctls.as_ref())
        .into_iter()
        .flatten()
        .map(|s| (s.name.clone(), s.value.clone()))
        .collect()
}

/// kubelet's safe sysctls (`pkg/kubelet/sysctl/safe_sysctls.go`): namespaced and isolated, so
/// every pod may set them. (kubelet drops the few that need a newer kernel than 4.6; the
/// enforcer needs a newer kernel than that for its ring buffers anyway.)
pub const SAFE_SYSCTLS: &[&str] = &[
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
    "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
];

/// The kernel namespace that isolates a sysctl.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SysctlNamespace {
    /// The IPC namespace (`kernel.sem`, `kernel.shm*`, `kernel.msg*`, `fs.mqueue.*`).
    Ipc,
    /// The network namespace (`net.*`).
    Net,
}

impl std::fmt::Display for SysctlNamespace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ipc => "IPC",
            Self::Net => "Net",
        })
    }
}

/// `NormalizeName`: a sysctl written with `/` separators (`net/ipv4/conf/eno2.100/rp_filter`)
/// in the dotted form (`net.ipv4.conf.eno2/100.rp_filter`).
#[must_use]
pub fn normalize_sysctl_name(name: &str) -> String {
    match name.find(['.', '/']) {
        Some(i) if name.as_bytes().get(i) == Some(&b'/') => name
            .chars()
            .map(|c| match c {
                '.' => '/',
                '/' => '.',
                c => c,
            })
            .collect(),
        _ => name.to_owned(),
    }
}

/// `namespaceOf`: the namespace of a (dotted) sysctl name or prefix, if it is namespaced.
#[must_use]
pub fn sysctl_namespace(name: &str) -> Option<SysctlNamespace> {
    const IPC_NAMES: &[&str] = &[
        "kernel.sem",
        "kernel.shmall",
        "kernel.shmmax",
        "kernel.shmmni",
        "kernel.shm_rmid_forced",
        "kernel.shm",
        "kernel.msgmax",
        "kernel.msgmnb",
        "kernel.msgmni",
        "kernel.msg",
    ];
    if IPC_NAMES.contains(&name) {
        return Some(SysctlNamespace::Ipc);
    }
    if name.starts_with("net.") {
        Some(SysctlNamespace::Net)
    } else if name.starts_with("fs.mqueue.") {
        Some(SysctlNamespace::Ipc)
    } else {
        None
    }
}

/// The sysctl name / pattern syntax kubelet checks `allowedUnsafeSysctls` against
/// (`SysctlContainSlashPatternFmt`).
pub const SYSCTL_PATTERN_FORMAT: &str =
    "([a-z0-9]([-_a-z0-9]*[a-z0-9])?[\\./])*([a-z0-9][-_a-z0-9]*)?[a-z0-9*]";

/// `SysctlSegmentFmt`: `[a-z0-9]([-_a-z0-9]*[a-z0-9])?`.
fn is_segment(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-' || *c == b'_')
}

/// The pattern's last segment: `([a-z0-9][-_a-z0-9]*)?[a-z0-9*]`.
fn is_last_pattern_segment(s: &str) -> bool {
    let b = s.as_bytes();
    let alnum = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    let Some((last, rest)) = b.split_last() else {
        return false;
    };
    (alnum(last) || *last == b'*')
        && rest.first().is_none_or(alnum)
        && rest.iter().all(|c| alnum(c) || *c == b'-' || *c == b'_')
}

/// `IsValidSysctlPattern`: at most 253 characters matching [`SYSCTL_PATTERN_FORMAT`]: dot- or
/// slash-separated segments, the last one possibly ending in `*`.
#[must_use]
pub fn is_valid_sysctl_pattern(p: &str) -> bool {
    if p.len() > 253 {
        return false;
    }
    let mut segments: Vec<&str> = p.split(['.', '/']).collect();
    let last = segments.pop().unwrap_or_default();
    segments.into_iter().all(is_segment) && is_last_pattern_segment(last)
}

/// kubelet's sysctl admission (`patternAllowlist`): the safe sysctls plus
/// `allowedUnsafeSysctls`, names and `prefix*` patterns, each known to be namespaced.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SysctlAllowlist {
    sysctls: BTreeMap<String, SysctlNamespace>,
    prefixes: BTreeMap<String, SysctlNamespace>,
}

impl Default for SysctlAllowlist {
    /// The safe sysctls only.
    fn default() -> Self {
        let mut w = Self {
            sysctls: BTreeMap::new(),
            prefixes: BTreeMap::new(),
        };
        for s in SAFE_SYSCTLS {
            if let Some(ns) = sysctl_namespace(s) {
                w.sysctls.insert((*s).to_owned(), ns);
            }
        }
        w
    }
}

/// Reason of a sysctl rejection at admission.
pub const SYSCTL_FORBIDDEN_REASON: &str = "SysctlForbidden";

impl SysctlAllowlist {
    /// The safe sysctls plus `allowed_unsafe` (`NewAllowlist(SafeSysctlAllowlist() +
    /// allowedUnsafeSysctls)`); an invalid or not namespaced entry is an error.
    pub fn new(allowed_unsafe: &[String]) -> Result<Self, SecurityError> {
        let mut w = Self::default();
        for s in allowed_unsafe {
            if !is_valid_sysctl_pattern(s) {
                return Err(SecurityError::InvalidSysctlPattern(s.clone()));
            }
            let normal = normalize_sysctl_name(s);
            let (name, prefixed) = match normal.find('*') {
                Some(i) => (normal.get(..i).unwrap_or_default().to_owned(), true),
                None => (normal, false),
            };
            let ns = sysctl_namespace(&name)
                .ok_or_else(|| SecurityError::SysctlNotNamespaced(name.clone()))?;
            if prefixed {
                w.prefixes.insert(name, ns);
            } else {
                w.sysctls.insert(name, ns);
            }
        }
        Ok(w)
    }

    /// `validateSysctl`: allowlisted, and not in a namespace the pod shares with the host.
    pub fn validate(
        &self,
        sysctl: &str,
        host_net: bool,
        host_ipc: bool,
    ) -> Result<(), SecurityError> {
        let sysctl = normalize_sysctl_name(sysctl);
        let ns = self.sysctls.get(&sysctl).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| sysctl.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            Some(namespace @ SysctlNamespace::Ipc) if host_ipc => {
                Err(SecurityError::SysctlHostNamespace { sysctl, namespace })
            }
            Some(namespace @ SysctlNamespace::Net) if host_net => {
                Err(SecurityError::SysctlHostNamespace { sysctl, namespace })
            }
            Some(_) => Ok(()),
            None => Err(SecurityError::SysctlNotAllowlisted(sysctl)),
        }
    }

    /// kubelet's sysctl admit handler: `Err((reason, message))` for the first sysctl of the
    /// pod that is not allowed (`forbidden sysctl: "kernel.msgmax" not allowlisted`).
    pub fn admit(&self, pod: &Pod) -> Result<(), (&'static str, String)> {
        let Some(spec) = pod.spec.as_ref() else {
            return Ok(());
        };
        let host_net = spec.host_network == Some(true);
        let host_ipc = spec.host_ipc == Some(true);
        for s in pod_security_context(pod)
            .and_then(|s| s.sysctls.as_ref())
            .into_iter()
            .flatten()
        {
            self.validate(&s.name, host_net, host_ipc)
                .map_err(|e| (SYSCTL_FORBIDDEN_REASON, format!("forbidden sysctl: {e}")))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::security::tests::{pod, pod_with};

    /// `TestNewAllowlist`.
    #[test]
    fn allowlist_patterns() {
        let ok = |v: &[&str]| {
            SysctlAllowlist::new(&v.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>())
        };
        for valid in [
            &["kernel.msg*", "kernel.sem"][..],
            &["net.b.*", "net.c.*"],
            &["net.*"],
            &["kernel.shm*"],
            &["fs.mqueue.*"],
            &["net/ipv4/conf/eth0/rp_filter"],
        ] {
            assert!(ok(valid).is_ok(), "{valid:?}");
        }
        assert_eq!(
            ok(&["foo"]).err(),
            Some(SecurityError::SysctlNotNamespaced("foo".into()))
        );
        assert_eq!(
            ok(&["kernel.panic"]).err(),
            Some(SecurityError::SysctlNotNamespaced("kernel.panic".into()))
        );
        // `*` is a valid pattern, of no known namespace.
        assert_eq!(
            ok(&["*"]).err(),
            Some(SecurityError::SysctlNotNamespaced(String::new()))
        );
        for invalid in ["foo*bar", "net.*.x", "Net.core", "-x.y", "a..b", "a-", ""] {
            assert_eq!(
                ok(&[invalid]).err(),
                Some(SecurityError::InvalidSysctlPattern(invalid.into())),
                "{invalid:?}"
            );
        }
    }

    /// `TestAllowlist`: safe sysctls, allowed unsafe ones, host namespaces, messages.
    #[test]
    fn allowlist_validates_like_kubelet() {
        let w = SysctlAllowlist::new(&["kernel.msg*".to_owned(), "kernel.sem".to_owned()])
            .expect("allowlist");
        for (name, host_net, host_ipc) in [
            ("kernel.shm_rmid_forced", false, false),
            ("net.ipv4.ip_local_port_range", false, false),
            ("kernel.msgmax", false, false),
            ("kernel.sem", false, false),
            ("net/ipv4/ip_local_port_range", false, false),
        ] {
            assert_eq!(w.validate(name, host_net, host_ipc), Ok(()), "{name}");
        }
        for (name, host_net, host_ipc, want) in [
            (
                "kernel.shm_rmid_forced",
                false,
                true,
                "\"kernel.shm_rmid_forced\" not allowed with host IPC enabled",
            ),
            (
                "net.ipv4.ip_local_port_range",
                true,
                false,
                "\"net.ipv4.ip_local_port_range\" not allowed with host Net enabled",
            ),
            (
                "kernel.msgmax",
                false,
                true,
                "\"kernel.msgmax\" not allowed with host IPC enabled",
            ),
            ("foo", false, false, "\"foo\" not allowlisted"),
            (
                "net.core.somaxconn",
                false,
                false,
                "\"net.core.somaxconn\" not allowlisted",
            ),
        ] {
            assert_eq!(
                w.validate(name, host_net, host_ipc)
                    .map_err(|e| e.to_string()),
                Err(want.to_owned()),
                "{name}"
            );
        }
        let safe_only = SysctlAllowlist::default();
        let p = pod(
            "metadata: {name: p}\nspec: {securityContext: {sysctls: [{name: kernel.shm_rmid_forced, value: '1'}, {name: kernel.msgmax, value: '9'}]}, containers: [{name: c}]}",
        );
        assert_eq!(
            safe_only.admit(&p),
            Err((
                "SysctlForbidden",
                "forbidden sysctl: \"kernel.msgmax\" not allowlisted".to_owned()
            ))
        );
        assert_eq!(w.admit(&p), Ok(()));
        assert_eq!(safe_only.admit(&pod_with("", "")), Ok(()));
        assert_eq!(
            normalize_sysctl_name("net/ipv4/conf/eno2.100/rp_filter"),
            "net.ipv4.conf.eno2/100.rp_filter"
        );
    }
}
