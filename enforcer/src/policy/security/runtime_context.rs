//! The CRI security contexts kubelet builds: a container's
//! (`kuberuntime/security_context.go`: `determineEffectiveSecurityContext` and
//! `convertToRuntimeSecurityContext`: capabilities, users and groups, SELinux, seccomp,
//! AppArmor, `no_new_privs`, `/proc` paths) and the sandbox's (`kuberuntime_sandbox.go`:
//! `generatePodSandboxLinuxConfig`), with the pod's namespaces.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::{
    ImageUser, SecurityError, SecurityOptions, add_no_new_privileges, apparmor::apparmor_to_cri,
    apparmor_profile, effective_security_context, has_privileged_container, masked_paths,
    pod_security_context, readonly_paths, seccomp::profile, seccomp_profile,
    verify_run_as_non_root,
};

/// The namespaces of the pod's sandbox and containers (`NamespacesForPod`).
#[must_use]
pub fn namespace_options(pod: &Pod) -> cri::NamespaceOption {
    let s = pod.spec.as_ref();
    let node = |b: Option<bool>| b == Some(true);
    let mode = |m: cri::NamespaceMode| m as i32;
    cri::NamespaceOption {
        network: if node(s.and_then(|s| s.host_network)) {
            mode(cri::NamespaceMode::Node)
        } else {
            mode(cri::NamespaceMode::Pod)
        },
        pid: if node(s.and_then(|s| s.host_pid)) {
            mode(cri::NamespaceMode::Node)
        } else if node(s.and_then(|s| s.share_process_namespace)) {
            mode(cri::NamespaceMode::Pod)
        } else {
            mode(cri::NamespaceMode::Container)
        },
        ipc: if node(s.and_then(|s| s.host_ipc)) {
            mode(cri::NamespaceMode::Node)
        } else {
            mode(cri::NamespaceMode::Pod)
        },
        target_id: String::new(),
        userns_options: None,
    }
}

/// CRI's `SupplementalGroupsPolicy` for the pod's `supplementalGroupsPolicy` (`Merge`, the
/// default, or `Strict`).
fn supplemental_groups_policy(pod: &Pod) -> Result<i32, SecurityError> {
    match pod_security_context(pod).and_then(|s| s.supplemental_groups_policy.as_deref()) {
        None | Some("Merge") => Ok(cri::SupplementalGroupsPolicy::Merge as i32),
        Some("Strict") => Ok(cri::SupplementalGroupsPolicy::Strict as i32),
        Some(other) => Err(SecurityError::UnsupportedSupplementalGroupsPolicy(
            other.to_owned(),
        )),
    }
}

fn selinux(o: &k8s_openapi::api::core::v1::SELinuxOptions) -> cri::SeLinuxOption {
    cri::SeLinuxOption {
        user: o.user.clone().unwrap_or_default(),
        role: o.role.clone().unwrap_or_default(),
        r#type: o.type_.clone().unwrap_or_default(),
        level: o.level.clone().unwrap_or_default(),
    }
}

/// A container's CRI security context (kubelet's `determineEffectiveSecurityContext`): the
/// merged pod and container settings; the image's user when neither sets `runAsUser`; the
/// pod's `fsGroup` then `supplementalGroups` as supplemental groups; seccomp and AppArmor
/// profiles; `no_new_privs`; the masked and read-only `/proc` paths of its `procMount`.
pub fn container_security_context(
    pod: &Pod,
    c: &Container,
    image: &ImageUser,
    opts: &SecurityOptions,
) -> Result<cri::LinuxContainerSecurityContext, SecurityError> {
    let eff = effective_security_context(pod, c);
    let mut sc = cri::LinuxContainerSecurityContext {
        capabilities: eff.capabilities.as_ref().map(|caps| cri::Capability {
            add_capabilities: caps.add.clone().unwrap_or_default(),
            drop_capabilities: caps.drop.clone().unwrap_or_default(),
            add_ambient_capabilities: Vec::new(),
        }),
        selinux_options: eff.se_linux_options.as_ref().map(selinux),
        run_as_user: eff.run_as_user.map(|value| cri::Int64Value { value }),
        run_as_group: eff.run_as_group.map(|value| cri::Int64Value { value }),
        privileged: eff.privileged.unwrap_or(false),
        readonly_rootfs: eff.read_only_root_filesystem.unwrap_or(false),
        ..Default::default()
    };
    sc.seccomp = Some(seccomp_profile(pod, c, opts)?);
    if let Some(p) = apparmor_profile(pod, c) {
        let (profile, deprecated) = apparmor_to_cri(&p)?;
        sc.apparmor = Some(profile);
        #[expect(
            deprecated,
            reason = "kubelet still sets the string form for runtimes that predate the field"
        )]
        {
            sc.apparmor_profile = deprecated;
        }
    }
    if sc.run_as_user.is_none() {
        sc.run_as_user = image.uid.map(|value| cri::Int64Value { value });
        sc.run_as_username.clone_from(&image.username);
    }
    sc.namespace_options = Some(namespace_options(pod));
    if let Some(p) = pod_security_context(pod) {
        sc.supplemental_groups.extend(p.fs_group);
        sc.supplemental_groups
            .extend(p.supplemental_groups.iter().flatten());
        sc.supplemental_groups_policy = supplemental_groups_policy(pod)?;
    }
    sc.no_new_privs = add_no_new_privileges(&eff);
    sc.masked_paths = masked_paths(eff.proc_mount.as_deref());
    sc.readonly_paths = readonly_paths(eff.proc_mount.as_deref());
    Ok(sc)
}

/// What a container start needs decided before CreateContainer: its security context, or
/// the reason it cannot be created (kubelet: `CreateContainerConfigError`, the container is
/// not created and the next sync tries again).
pub fn decide_container_security(
    pod: &Pod,
    c: &Container,
    image: &ImageUser,
    opts: &SecurityOptions,
) -> Result<cri::LinuxContainerSecurityContext, SecurityError> {
    verify_run_as_non_root(pod, c, image)?;
    container_security_context(pod, c, image, opts)
}

/// The sandbox's CRI security context (`generatePodSandboxLinuxConfig`): privileged when a
/// container is, seccomp always `RuntimeDefault` (the pause container; pods may then use the
/// least privileged profiles), the pod's `runAsUser` / `runAsGroup`, its namespaces, `fsGroup`
/// then `supplementalGroups`, and its SELinux options. An unknown `supplementalGroupsPolicy`
/// (refused by API validation) is left at `Merge` here; the containers refuse it.
#[must_use]
pub fn sandbox_security_context(pod: &Pod) -> cri::LinuxSandboxSecurityContext {
    let mut sc = cri::LinuxSandboxSecurityContext {
        privileged: has_privileged_container(pod),
        seccomp: Some(profile(cri::security_profile::ProfileType::RuntimeDefault)),
        namespace_options: Some(namespace_options(pod)),
        ..Default::default()
    };
    if let Some(p) = pod_security_context(pod) {
        sc.run_as_user = p.run_as_user.map(|value| cri::Int64Value { value });
        sc.run_as_group = p.run_as_group.map(|value| cri::Int64Value { value });
        sc.supplemental_groups.extend(p.fs_group);
        sc.supplemental_groups
            .extend(p.supplemental_groups.iter().flatten());
        sc.supplemental_groups_policy = supplemental_groups_policy(pod).unwrap_or_default();
        sc.selinux_options = p.se_linux_options.as_ref().map(selinux);
    }
    sc
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::security::{
        DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS, pod_sysctls,
        tests::{container, opts, pod, pod_with, uid},
    };

    /// Every field of the CRI container security context, as kubelet fills it.
    #[test]
    fn container_security_context_fields() {
        let p = pod(
            "metadata: {name: p, namespace: ns, uid: u}\nspec:\n  hostPID: true\n  securityContext: {runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000, 5000], seccompProfile: {type: RuntimeDefault}, seLinuxOptions: {level: 's0:c1'}}\n  containers:\n  - name: c\n    securityContext: {runAsGroup: 3001, capabilities: {drop: [ALL], add: [NET_BIND_SERVICE]}, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false}",
        );
        let sc = container_security_context(&p, container(&p), &uid(0), &opts()).expect("sc");
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3001 }));
        assert_eq!(sc.run_as_username, "");
        assert_eq!(sc.supplemental_groups, [2000, 4000, 5000]);
        assert_eq!(
            sc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Merge as i32
        );
        assert_eq!(
            sc.capabilities,
            Some(cri::Capability {
                add_capabilities: vec!["NET_BIND_SERVICE".into()],
                drop_capabilities: vec!["ALL".into()],
                add_ambient_capabilities: vec![],
            })
        );
        assert!(!sc.privileged);
        assert!(sc.readonly_rootfs);
        assert!(sc.no_new_privs);
        assert_eq!(
            sc.seccomp.map(|s| s.profile_type),
            Some(cri::security_profile::ProfileType::RuntimeDefault as i32)
        );
        assert_eq!(sc.selinux_options.map(|o| o.level), Some("s0:c1".into()));
        assert_eq!(sc.masked_paths, DEFAULT_MASKED_PATHS);
        assert_eq!(sc.readonly_paths, DEFAULT_READONLY_PATHS);
        assert_eq!(
            sc.namespace_options.map(|n| (n.network, n.pid, n.ipc)),
            Some((
                cri::NamespaceMode::Pod as i32,
                cri::NamespaceMode::Node as i32,
                cri::NamespaceMode::Pod as i32
            ))
        );

        // Nothing set: the image's user, no groups, Unconfined, default /proc paths.
        let plain = pod_with("", "");
        let sc =
            container_security_context(&plain, container(&plain), &uid(42), &opts()).expect("sc");
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 42 }));
        assert!(sc.supplemental_groups.is_empty());
        assert!(!sc.no_new_privs && !sc.readonly_rootfs && !sc.privileged);
        assert_eq!(sc.capabilities, None);
        assert_eq!(
            sc.seccomp.map(|s| s.profile_type),
            Some(cri::security_profile::ProfileType::Unconfined as i32)
        );
        // An image with a user name: no uid, the name passed on.
        let named = ImageUser {
            uid: None,
            username: "www".into(),
        };
        let sc =
            container_security_context(&plain, container(&plain), &named, &opts()).expect("sc");
        assert_eq!((sc.run_as_user, sc.run_as_username.as_str()), (None, "www"));

        // procMount Unmasked: nothing masked or read-only; privileged passes through.
        let unmasked = pod_with("", "{procMount: Unmasked, privileged: true}");
        let sc = container_security_context(&unmasked, container(&unmasked), &uid(0), &opts())
            .expect("sc");
        assert!(sc.masked_paths.is_empty() && sc.readonly_paths.is_empty());
        assert!(sc.privileged);
        let strict = pod_with("{supplementalGroupsPolicy: Strict}", "");
        let sc =
            container_security_context(&strict, container(&strict), &uid(0), &opts()).expect("sc");
        assert_eq!(
            sc.supplemental_groups_policy,
            cri::SupplementalGroupsPolicy::Strict as i32
        );
        let bad = pod_with("{supplementalGroupsPolicy: Loose}", "");
        assert_eq!(
            container_security_context(&bad, container(&bad), &uid(0), &opts()).err(),
            Some(SecurityError::UnsupportedSupplementalGroupsPolicy(
                "Loose".into()
            ))
        );
        // runAsNonRoot is checked before anything else.
        let nonroot = pod_with("{runAsNonRoot: true}", "");
        assert_eq!(
            decide_container_security(&nonroot, container(&nonroot), &uid(0), &opts())
                .err()
                .map(|e| e.to_string()),
            Some(
                "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: c)"
                    .to_owned()
            )
        );
        assert!(decide_container_security(&nonroot, container(&nonroot), &uid(7), &opts()).is_ok());
    }

    /// `generatePodSandboxLinuxConfig`.
    #[test]
    fn sandbox_security_context_and_sysctls() {
        let p = pod(
            "metadata: {name: p}\nspec:\n  hostNetwork: true\n  securityContext: {runAsUser: 1000, runAsGroup: 3000, fsGroup: 2000, supplementalGroups: [4000], sysctls: [{name: kernel.shm_rmid_forced, value: '1'}, {name: net.ipv4.tcp_syncookies, value: '0'}]}\n  initContainers: [{name: i, securityContext: {privileged: true}}]\n  containers: [{name: c}]",
        );
        let sc = sandbox_security_context(&p);
        assert!(sc.privileged);
        assert_eq!(
            sc.seccomp.map(|s| s.profile_type),
            Some(cri::security_profile::ProfileType::RuntimeDefault as i32)
        );
        assert_eq!(sc.run_as_user, Some(cri::Int64Value { value: 1000 }));
        assert_eq!(sc.run_as_group, Some(cri::Int64Value { value: 3000 }));
        assert_eq!(sc.supplemental_groups, [2000, 4000]);
        assert!(!sc.readonly_rootfs);
        assert_eq!(
            sc.namespace_options.map(|n| n.network),
            Some(cri::NamespaceMode::Node as i32)
        );
        let sysctls = pod_sysctls(&p);
        assert_eq!(sysctls.len(), 2);
        assert_eq!(
            sysctls.get("kernel.shm_rmid_forced").map(String::as_str),
            Some("1")
        );
        let plain = pod_with("", "");
        let sc = sandbox_security_context(&plain);
        assert!(!sc.privileged && sc.run_as_user.is_none() && sc.supplemental_groups.is_empty());
        assert!(pod_sysctls(&plain).is_empty());
    }
}
