//! The node's Pod Security rules at admission: Pod Security "baseline" (privileged
//! containers, capabilities, seccomp, `procMount`, AppArmor, SELinux), host namespaces and
//! `hostPath` volumes, each refused unless the node allows it; the sysctl allowlist and the
//! host's AppArmor, which [`Admitter`] checks in kubelet's handler order.

use k8s_openapi::api::core::v1::Pod;

use super::Admitter;
use crate::policy::{
    eviction::manager::AdmitResult,
    resources,
    security::{self, SysctlAllowlist},
};

/// Reason of a pod-security rejection.
pub const SECURITY_REASON: &str = "PodSecurity";

/// The capabilities Pod Security "baseline" lets a container add; any other is refused
/// unless privileged containers are allowed.
pub const BASELINE_CAPABILITIES: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// The node's pod-security rules: Pod Security "baseline" (privileged containers, added
/// capabilities beyond baseline's list, seccomp `Unconfined`, `procMount: Unmasked`, AppArmor
/// `unconfined`, SELinux types and users beyond baseline's, each host namespace, hostPath
/// volumes), each refused unless allowed; kubelet's sysctl allowlist (`allowedUnsafeSysctls`)
/// and whether the host enforces AppArmor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecurityPolicy {
    /// Allow `securityContext.privileged: true`, capabilities beyond
    /// [`BASELINE_CAPABILITIES`], and the other container settings baseline refuses (seccomp
    /// `Unconfined`, `procMount: Unmasked`, AppArmor `unconfined`, SELinux beyond baseline):
    /// the node's containers then run at Pod Security level "privileged".
    pub allow_privileged: bool,
    /// Allow `hostNetwork`.
    pub allow_host_namespaces: bool,
    /// Allow `hostPID`.
    pub allow_host_pid: bool,
    /// Allow `hostIPC`.
    pub allow_host_ipc: bool,
    /// Allow `hostPath` volumes.
    pub allow_host_paths: bool,
    /// The safe sysctls plus `allowedUnsafeSysctls` (kubelet's sysctl admission, reason
    /// `SysctlForbidden`).
    pub sysctls: SysctlAllowlist,
    /// Whether the kernel enforces AppArmor (`/sys/module/apparmor/parameters/enabled`); a pod
    /// asking for a profile other than `unconfined` is refused (reason `AppArmor`) when not.
    pub apparmor_enabled: bool,
}

impl Admitter {
    pub(super) fn security_check(&self, pod: &Pod) -> AdmitResult {
        let uid = resources::pod_uid(pod);
        let Some(spec) = pod.spec.as_ref() else {
            return AdmitResult::admit();
        };
        let reject = |what: &str| {
            AdmitResult::reject(
                SECURITY_REASON,
                format!("pod with UID {uid:?} specified {what}, but is disallowed"),
            )
        };
        if !self.security.allow_privileged {
            let all = spec
                .containers
                .iter()
                .chain(spec.init_containers.iter().flatten());
            let privileged =
                all.clone()
                    .any(|c| c.security_context.as_ref().and_then(|s| s.privileged) == Some(true))
                    || spec.ephemeral_containers.iter().flatten().any(|c| {
                        c.security_context.as_ref().and_then(|s| s.privileged) == Some(true)
                    });
            if privileged {
                return reject("privileged container");
            }
            let added = all
                .filter_map(|c| c.security_context.as_ref())
                .filter_map(|s| s.capabilities.as_ref())
                .filter_map(|c| c.add.as_ref())
                .flatten()
                .chain(
                    spec.ephemeral_containers
                        .iter()
                        .flatten()
                        .filter_map(|c| c.security_context.as_ref())
                        .filter_map(|s| s.capabilities.as_ref())
                        .filter_map(|c| c.add.as_ref())
                        .flatten(),
                )
                .find(|cap| !BASELINE_CAPABILITIES.contains(&cap.as_str()));
            if let Some(cap) = added {
                return reject(&format!("capability {cap}"));
            }
            if let Some(what) = baseline_container_settings(pod) {
                return reject(&what);
            }
        }
        if !self.security.allow_host_namespaces && spec.host_network == Some(true) {
            return reject("host networking");
        }
        if !self.security.allow_host_pid && spec.host_pid == Some(true) {
            return reject("host PID");
        }
        if !self.security.allow_host_ipc && spec.host_ipc == Some(true) {
            return reject("host ipc");
        }
        if !self.security.allow_host_paths
            && spec.volumes.iter().flatten().any(|v| v.host_path.is_some())
        {
            return reject("hostPath volume");
        }
        AdmitResult::admit()
    }
}

/// The SELinux types Pod Security baseline allows (besides none).
pub const BASELINE_SELINUX_TYPES: &[&str] = &[
    "container_t",
    "container_init_t",
    "container_kvm_t",
    "container_engine_t",
];

/// The first container-level setting Pod Security baseline refuses beyond privileged and
/// capabilities: an explicit seccomp `Unconfined` (pod or container), `procMount` other than
/// `Default`, an AppArmor profile `unconfined` (field or annotation), SELinux options with a
/// user, a role or a type outside [`BASELINE_SELINUX_TYPES`]. `None` when there is none.
fn baseline_container_settings(pod: &Pod) -> Option<String> {
    if let Some((c, _)) = security::explicit_seccomp_types(pod)
        .into_iter()
        .find(|(_, t)| t == "Unconfined")
    {
        return Some(format!("seccomp profile Unconfined for {c}"));
    }
    if let Some((c, m)) =
        security::proc_mounts(pod).find_map(|(c, m)| m.filter(|m| m != "Default").map(|m| (c, m)))
    {
        return Some(format!("procMount {m} for {c}"));
    }
    let annotation_unconfined = pod.metadata.annotations.iter().flatten().find(|(k, v)| {
        k.starts_with(security::APPARMOR_ANNOTATION_PREFIX)
            && !(v.is_empty() || v.as_str() == "runtime/default" || v.starts_with("localhost/"))
    });
    if let Some((k, v)) = annotation_unconfined {
        return Some(format!("AppArmor profile {v} in annotation {k}"));
    }
    let pod_sc = pod.spec.as_ref().and_then(|s| s.security_context.as_ref());
    let field_unconfined = pod_sc
        .and_then(|s| s.app_armor_profile.as_ref())
        .map(|p| ("<pod>", p))
        .into_iter()
        .chain(
            security::security_contexts(pod)
                .filter_map(|(c, s)| s.and_then(|s| s.app_armor_profile.as_ref()).map(|p| (c, p))),
        )
        .find(|(_, p)| p.type_ == "Unconfined");
    if let Some((c, _)) = field_unconfined {
        return Some(format!("AppArmor profile Unconfined for {c}"));
    }
    let selinux = pod_sc
        .and_then(|s| s.se_linux_options.as_ref())
        .map(|o| ("<pod>", o))
        .into_iter()
        .chain(
            security::security_contexts(pod)
                .filter_map(|(c, s)| s.and_then(|s| s.se_linux_options.as_ref()).map(|o| (c, o))),
        )
        .find(|(_, o)| {
            o.user.as_deref().is_some_and(|u| !u.is_empty())
                || o.role.as_deref().is_some_and(|r| !r.is_empty())
                || o.type_
                    .as_deref()
                    .is_some_and(|t| !t.is_empty() && !BASELINE_SELINUX_TYPES.contains(&t))
        });
    if let Some((c, _)) = selinux {
        return Some(format!("SELinux options beyond baseline for {c}"));
    }
    None
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{HostPathVolumeSource, SecurityContext, Volume};

    use super::*;
    use crate::policy::{
        admission::tests::node,
        resources::test_pods::{container, pod},
    };

    #[test]
    fn pod_security() {
        let strict = Admitter::new(node(), SecurityPolicy::default(), []);
        let lax = Admitter::new(
            node(),
            SecurityPolicy {
                allow_privileged: true,
                allow_host_namespaces: true,
                allow_host_pid: true,
                allow_host_ipc: true,
                allow_host_paths: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let r = strict.admit(&p, &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "PodSecurity",
                "pod with UID \"uid-p\" specified privileged container, but is disallowed"
            )
        );
        assert!(lax.admit(&p, &[]).admitted);
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().host_network = Some(true);
        assert!(!strict.admit(&p, &[]).admitted);
        // Host network allowed does not allow hostPID or hostIPC.
        let host_net = Admitter::new(
            node(),
            SecurityPolicy {
                allow_host_namespaces: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        assert!(host_net.admit(&p, &[]).admitted);
        for (pid, ipc, what) in [(true, false, "host PID"), (false, true, "host ipc")] {
            let mut q = p.clone();
            q.spec.as_mut().unwrap().host_pid = Some(pid);
            q.spec.as_mut().unwrap().host_ipc = Some(ipc);
            let r = host_net.admit(&q, &[]);
            assert_eq!(
                r.message,
                format!("pod with UID \"uid-p\" specified {what}, but is disallowed")
            );
            assert!(lax.admit(&q, &[]).admitted);
        }
        // Capabilities: baseline's list may be added, anything else is privileged.
        let caps = |add: &[&str]| {
            let mut q = pod("p", vec![container("a", "", "")]);
            q.spec.as_mut().unwrap().containers[0].security_context = Some(SecurityContext {
                capabilities: Some(k8s_openapi::api::core::v1::Capabilities {
                    add: Some(add.iter().map(|s| (*s).to_owned()).collect()),
                    drop: Some(vec!["ALL".to_owned()]),
                }),
                ..Default::default()
            });
            q
        };
        assert!(
            strict
                .admit(&caps(&["NET_BIND_SERVICE", "CHOWN"]), &[])
                .admitted
        );
        let r = strict.admit(&caps(&["NET_BIND_SERVICE", "SYS_ADMIN"]), &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "PodSecurity",
                "pod with UID \"uid-p\" specified capability SYS_ADMIN, but is disallowed"
            )
        );
        assert!(lax.admit(&caps(&["SYS_ADMIN"]), &[]).admitted);
        let mut p = pod("p", vec![container("a", "", "")]);
        p.spec.as_mut().unwrap().volumes = Some(vec![Volume {
            name: "h".into(),
            host_path: Some(HostPathVolumeSource {
                path: "/".into(),
                ..Default::default()
            }),
            ..Default::default()
        }]);
        assert!(!strict.admit(&p, &[]).admitted);
        assert!(lax.admit(&p, &[]).admitted);
    }

    fn yaml_pod(y: &str) -> Pod {
        let mut p: Pod = serde_yaml_ng::from_str(y).unwrap();
        p.metadata.uid = Some("uid-p".into());
        p
    }

    /// kubelet's sysctl admission (before resource fit), the AppArmor admit handler, and the
    /// baseline container settings beyond privileged and capabilities.
    #[test]
    fn sysctls_apparmor_and_baseline_settings() {
        let strict = Admitter::new(node(), SecurityPolicy::default(), []);
        let sysctl = |name: &str, extra: &str| {
            yaml_pod(&format!(
                "metadata: {{name: p}}\nspec: {{{extra}securityContext: {{sysctls: [{{name: {name}, value: '1'}}]}}, containers: [{{name: a}}]}}"
            ))
        };
        assert!(
            strict
                .admit(&sysctl("kernel.shm_rmid_forced", ""), &[])
                .admitted
        );
        let r = strict.admit(&sysctl("kernel.msgmax", ""), &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "SysctlForbidden",
                "forbidden sysctl: \"kernel.msgmax\" not allowlisted"
            )
        );
        // A safe net.* sysctl with the host's network namespace: refused.
        let r = strict.admit(
            &sysctl("net.ipv4.tcp_syncookies", "hostNetwork: true, "),
            &[],
        );
        assert_eq!(
            r.message,
            "forbidden sysctl: \"net.ipv4.tcp_syncookies\" not allowed with host Net enabled"
        );
        let allowing = Admitter::new(
            node(),
            SecurityPolicy {
                sysctls: SysctlAllowlist::new(&["kernel.msg*".to_owned()]).unwrap(),
                ..SecurityPolicy::default()
            },
            [],
        );
        assert!(allowing.admit(&sysctl("kernel.msgmax", ""), &[]).admitted);
        assert_eq!(
            allowing.admit(&sysctl("kernel.sem", ""), &[]).reason,
            "SysctlForbidden"
        );
        // Sysctls come before resource fit, as in kubelet's handler order.
        let mut big = sysctl("kernel.sem", "");
        big.spec.as_mut().unwrap().containers[0] = container("a", "cpu=100", "");
        assert_eq!(strict.admit(&big, &[]).reason, "SysctlForbidden");

        // AppArmor: no AppArmor on the host refuses a profile; unconfined is baseline's
        // refusal instead.
        let runtime_default = yaml_pod(
            "metadata: {name: p}\nspec: {containers: [{name: a, securityContext: {appArmorProfile: {type: RuntimeDefault}}}]}",
        );
        let r = strict.admit(&runtime_default, &[]);
        assert_eq!(
            (r.reason.as_str(), r.message.as_str()),
            (
                "AppArmor",
                "Cannot enforce AppArmor: AppArmor is not enabled on the host"
            )
        );
        let with_apparmor = Admitter::new(
            node(),
            SecurityPolicy {
                apparmor_enabled: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        assert!(with_apparmor.admit(&runtime_default, &[]).admitted);

        let lax = Admitter::new(
            node(),
            SecurityPolicy {
                allow_privileged: true,
                ..SecurityPolicy::default()
            },
            [],
        );
        for (spec, what) in [
            (
                "{securityContext: {seccompProfile: {type: Unconfined}}, containers: [{name: a}]}",
                "seccomp profile Unconfined for <pod>",
            ),
            (
                "{containers: [{name: a, securityContext: {seccompProfile: {type: Unconfined}}}]}",
                "seccomp profile Unconfined for a",
            ),
            (
                "{containers: [{name: a, securityContext: {procMount: Unmasked}}]}",
                "procMount Unmasked for a",
            ),
            (
                "{containers: [{name: a, securityContext: {appArmorProfile: {type: Unconfined}}}]}",
                "AppArmor profile Unconfined for a",
            ),
            (
                "{securityContext: {seLinuxOptions: {type: spc_t}}, containers: [{name: a}]}",
                "SELinux options beyond baseline for <pod>",
            ),
            (
                "{initContainers: [{name: i, securityContext: {seLinuxOptions: {user: system_u}}}], containers: [{name: a}]}",
                "SELinux options beyond baseline for i",
            ),
        ] {
            let p = yaml_pod(&format!("metadata: {{name: p}}\nspec: {spec}"));
            let r = strict.admit(&p, &[]);
            assert_eq!(
                (r.reason.as_str(), r.message),
                (
                    "PodSecurity",
                    format!("pod with UID \"uid-p\" specified {what}, but is disallowed")
                ),
                "{spec}"
            );
            assert!(lax.admit(&p, &[]).admitted, "{spec}");
        }
        for ok in [
            "{securityContext: {seccompProfile: {type: RuntimeDefault}}, containers: [{name: a, securityContext: {procMount: Default, seLinuxOptions: {type: container_t, level: 's0:c1'}}}]}",
            "{containers: [{name: a, securityContext: {seccompProfile: {type: Localhost, localhostProfile: p.json}}}]}",
        ] {
            let p = yaml_pod(&format!("metadata: {{name: p}}\nspec: {ok}"));
            assert!(strict.admit(&p, &[]).admitted, "{ok}");
        }
        let annotated = yaml_pod(
            "metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/a: unconfined}}\nspec: {containers: [{name: a}]}",
        );
        assert_eq!(
            strict.admit(&annotated, &[]).message,
            "pod with UID \"uid-p\" specified AppArmor profile unconfined in annotation container.apparmor.security.beta.kubernetes.io/a, but is disallowed"
        );
    }
}
