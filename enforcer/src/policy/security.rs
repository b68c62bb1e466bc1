//! The pod's security context as kubelet runs it, and the node-level checks kubelet makes on
//! it at admission. Pure: a pod (and what the image and the node say) in, CRI values or a
//! refusal out.
//!
//! From kubelet's sources:
//! - `pkg/securitycontext/util.go`: [`effective_security_context`]
//!   (`DetermineEffectiveSecurityContext`), [`add_no_new_privileges`], the default masked and
//!   read-only `/proc` paths ([`masked_paths`], [`readonly_paths`]);
//! - `pkg/kubelet/kuberuntime/security_context.go`: [`container_security_context`]
//!   (`determineEffectiveSecurityContext` + `convertToRuntimeSecurityContext`);
//! - `security_context_others.go`: [`verify_run_as_non_root`]; `kuberuntime_container.go`:
//!   [`ImageUser`] (`getImageUser`);
//! - `helpers.go`: [`seccomp_profile`] (`getSeccompProfile`, `fieldSeccompProfile`) and
//!   [`apparmor_profile`] (`getAppArmorProfile`, `apparmor.GetProfile`);
//! - `kuberuntime_sandbox.go`: [`sandbox_security_context`] and [`pod_sysctls`]
//!   (`generatePodSandboxLinuxConfig`);
//! - `pkg/kubelet/sysctl` and `component-helpers/node/util/sysctl`: [`SAFE_SYSCTLS`],
//!   [`SysctlAllowlist`] (`allowedUnsafeSysctls`, reason `SysctlForbidden`);
//! - `pkg/security/apparmor/validate.go`: [`validate_apparmor`].
//!
//! By job: [`users`] (the image's user, `runAsNonRoot`), [`seccomp`], [`apparmor`],
//! [`proc_mount`] (masked and read-only `/proc` paths), [`runtime_context`] (the CRI security
//! contexts of a container and of the sandbox: capabilities, users and groups, SELinux,
//! namespaces) and [`sysctls`]; here, what they share: the error, the merge of the pod's and
//! a container's security contexts, and the walk over every container's.

pub mod apparmor;
pub mod proc_mount;
pub mod runtime_context;
pub mod seccomp;
pub mod sysctls;
pub mod users;

pub use apparmor::{
    APPARMOR_ANNOTATION_PREFIX, APPARMOR_REASON, apparmor_enabled_from, apparmor_profile,
    validate_apparmor,
};
pub use proc_mount::{
    DEFAULT_MASKED_PATHS, DEFAULT_READONLY_PATHS, UNMASKED_PROC_MOUNT, masked_paths, proc_mounts,
    readonly_paths,
};
pub use runtime_context::{
    container_security_context, decide_container_security, namespace_options,
    sandbox_security_context,
};
pub use seccomp::{SecurityOptions, explicit_seccomp_types, seccomp_profile};
pub use sysctls::{
    SAFE_SYSCTLS, SYSCTL_FORBIDDEN_REASON, SYSCTL_PATTERN_FORMAT, SysctlAllowlist, SysctlNamespace,
    is_valid_sysctl_pattern, normalize_sysctl_name, pod_sysctls, sysctl_namespace,
};
pub use users::{ImageUser, verify_run_as_non_root};

use k8s_openapi::api::core::v1::{Container, Pod, SecurityContext};

/// Why a container's security context cannot be run (kubelet reports these as the waiting
/// reason `CreateContainerConfigError`, the message being the error's text), or why an
/// `allowedUnsafeSysctls` pattern is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecurityError {
    /// `runAsNonRoot` with `runAsUser: 0`.
    #[error("container's runAsUser breaks non-root policy (pod: {pod:?}, container: {container})")]
    RunAsUserBreaksNonRoot { pod: String, container: String },
    /// `runAsNonRoot` and the image's user is a name.
    #[error(
        "container has runAsNonRoot and image has non-numeric user ({username}), cannot verify user is non-root (pod: {pod:?}, container: {container})"
    )]
    NonNumericImageUser {
        username: String,
        pod: String,
        container: String,
    },
    /// `runAsNonRoot` and the image runs as uid 0 (or says nothing: root).
    #[error(
        "container has runAsNonRoot and image will run as root (pod: {pod:?}, container: {container})"
    )]
    ImageRunsAsRoot { pod: String, container: String },
    /// `runAsNonRoot` and the image's uid is out of range.
    #[error(
        "container has runAsNonRoot and image has an invalid user id ({uid}). (Must be 1-({max})): must be between 0 and {max}, inclusive (pod: {pod:?}, container: {container})",
        max = i32::MAX
    )]
    InvalidImageUid {
        uid: i64,
        pod: String,
        container: String,
    },
    /// `seccompProfile.type: Localhost` without `localhostProfile`.
    #[error("localhostProfile must be set if seccompProfile type is Localhost.")]
    SeccompLocalhostWithoutProfile,
    /// `localhostProfile` would leave the seccomp profile root (`..`, NUL).
    #[error("localhostProfile {profile:?} must stay inside the seccomp profile root {root}")]
    SeccompProfileEscape { profile: String, root: String },
    /// `appArmorProfile.type: Localhost` without `localhostProfile`.
    #[error("missing localhost apparmor profile name")]
    AppArmorLocalhostWithoutProfile,
    /// An AppArmor profile type kubelet does not know.
    #[error("unknown apparmor profile type: {0:?}")]
    UnknownAppArmorType(String),
    /// A `supplementalGroupsPolicy` CRI does not know.
    #[error("unsupported supplementalGroupsPolicy: {0}")]
    UnsupportedSupplementalGroupsPolicy(String),
    /// An `allowedUnsafeSysctls` entry that is not a sysctl name or `prefix*` pattern.
    #[error(
        "sysctl {0:?} must have at most 253 characters and match regex {SYSCTL_PATTERN_FORMAT}"
    )]
    InvalidSysctlPattern(String),
    /// An `allowedUnsafeSysctls` entry no Linux namespace isolates.
    #[error("the sysctls {0:?} are not known to be namespaced")]
    SysctlNotNamespaced(String),
    /// A pod's sysctl in a namespace it shares with the host (`validateSysctl`).
    #[error("{sysctl:?} not allowed with host {namespace} enabled")]
    SysctlHostNamespace {
        sysctl: String,
        namespace: sysctls::SysctlNamespace,
    },
    /// A pod's sysctl neither safe nor in `allowedUnsafeSysctls`.
    #[error("{0:?} not allowlisted")]
    SysctlNotAllowlisted(String),
}

/// kubelet's `format.Pod`: `name_namespace(uid)` (the namespace defaulted as the API does).
#[must_use]
pub fn format_pod(pod: &Pod) -> String {
    use super::resources::{pod_name, pod_namespace, pod_uid};
    format!("{}_{}({})", pod_name(pod), pod_namespace(pod), pod_uid(pod))
}

fn pod_security_context(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::PodSecurityContext> {
    pod.spec.as_ref().and_then(|s| s.security_context.as_ref())
}

/// `DetermineEffectiveSecurityContext`: the pod-level `seLinuxOptions`, `windowsOptions`,
/// `runAsUser`, `runAsGroup` and `runAsNonRoot`, overridden field by field by the container's
/// security context. (Seccomp and AppArmor profiles are merged on their own, in
/// [`seccomp_profile`] and [`apparmor_profile`]; supplemental groups, fsGroup and sysctls
/// are pod-level only.)
#[must_use]
pub fn effective_security_context(pod: &Pod, c: &Container) -> SecurityContext {
    effective_of(pod, c.security_context.as_ref())
}

fn effective_of(pod: &Pod, container: Option<&SecurityContext>) -> SecurityContext {
    let from_pod = pod_security_context(pod).map(|p| SecurityContext {
        se_linux_options: p.se_linux_options.clone(),
        windows_options: p.windows_options.clone(),
        run_as_user: p.run_as_user,
        run_as_group: p.run_as_group,
        run_as_non_root: p.run_as_non_root,
        ..SecurityContext::default()
    });
    let (mut e, c) = match (from_pod, container) {
        (None, None) => return SecurityContext::default(),
        (Some(e), None) => return e,
        (None, Some(c)) => return c.clone(),
        (Some(e), Some(c)) => (e, c),
    };
    if c.se_linux_options.is_some() {
        e.se_linux_options.clone_from(&c.se_linux_options);
    }
    if let Some(cw) = &c.windows_options {
        // Only the fields set at the container level, not the whole thing.
        let w = e.windows_options.get_or_insert_with(Default::default);
        if cw.gmsa_credential_spec_name.is_some() || cw.gmsa_credential_spec.is_some() {
            w.gmsa_credential_spec_name
                .clone_from(&cw.gmsa_credential_spec_name);
            w.gmsa_credential_spec.clone_from(&cw.gmsa_credential_spec);
        }
        if cw.run_as_user_name.is_some() {
            w.run_as_user_name.clone_from(&cw.run_as_user_name);
        }
        if cw.host_process.is_some() {
            w.host_process = cw.host_process;
        }
    }
    // Each field the container sets wins over the pod's.
    if c.capabilities.is_some() {
        e.capabilities.clone_from(&c.capabilities);
    }
    if c.proc_mount.is_some() {
        e.proc_mount.clone_from(&c.proc_mount);
    }
    e.privileged = c.privileged.or(e.privileged);
    e.run_as_user = c.run_as_user.or(e.run_as_user);
    e.run_as_group = c.run_as_group.or(e.run_as_group);
    e.run_as_non_root = c.run_as_non_root.or(e.run_as_non_root);
    e.read_only_root_filesystem = c.read_only_root_filesystem.or(e.read_only_root_filesystem);
    e.allow_privilege_escalation = c
        .allow_privilege_escalation
        .or(e.allow_privilege_escalation);
    e
}

/// `AddNoNewPrivileges`: only an explicit `allowPrivilegeEscalation: false` sets
/// `no_new_privs`.
#[must_use]
pub fn add_no_new_privileges(sc: &SecurityContext) -> bool {
    sc.allow_privilege_escalation == Some(false)
}

/// Whether any container of the pod (init, regular or ephemeral) is privileged
/// (`HasPrivilegedContainer`).
#[must_use]
pub fn has_privileged_container(pod: &Pod) -> bool {
    security_contexts(pod).any(|(_, s)| s.and_then(|s| s.privileged) == Some(true))
}

/// Every container's name and security context: init, regular, ephemeral.
pub fn security_contexts(pod: &Pod) -> impl Iterator<Item = (&str, Option<&SecurityContext>)> {
    let spec = pod.spec.as_ref();
    let plain = spec
        .into_iter()
        .flat_map(|s| s.init_containers.iter().flatten().chain(&s.containers))
        .map(|c| (c.name.as_str(), c.security_context.as_ref()));
    let ephemeral = spec
        .into_iter()
        .flat_map(|s| s.ephemeral_containers.iter().flatten())
        .map(|c| (c.name.as_str(), c.security_context.as_ref()));
    plain.chain(ephemeral)
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).expect("pod yaml")
    }

    /// `metadata: {name: p, namespace: ns, uid: u}` with the pod-level `securityContext`
    /// `pod_sc` and one container `c` with `c_sc` (YAML flow maps, empty for none).
    pub(super) fn pod_with(pod_sc: &str, c_sc: &str) -> Pod {
        let psc = if pod_sc.is_empty() {
            String::new()
        } else {
            format!("securityContext: {pod_sc}, ")
        };
        let csc = if c_sc.is_empty() {
            String::new()
        } else {
            format!(", securityContext: {c_sc}")
        };
        pod(&format!(
            "metadata: {{name: p, namespace: ns, uid: u}}\nspec: {{{psc}containers: [{{name: c{csc}}}]}}"
        ))
    }

    pub(super) fn container(p: &Pod) -> &Container {
        &p.spec.as_ref().expect("spec").containers[0]
    }

    pub(super) fn uid(v: i64) -> ImageUser {
        ImageUser {
            uid: Some(v),
            username: String::new(),
        }
    }

    /// `DetermineEffectiveSecurityContext`: the container's fields win, the pod's fill in,
    /// and only the pod fields kubelet merges are merged.
    #[test]
    fn effective_security_context_merges_like_kubelet() {
        let cases: &[(&str, &str, &str, SecurityContext)] = &[
            ("no contexts", "", "", SecurityContext::default()),
            (
                "pod only",
                "{runAsUser: 1, runAsGroup: 2, runAsNonRoot: true, fsGroup: 3, seccompProfile: {type: RuntimeDefault}}",
                "",
                SecurityContext {
                    run_as_user: Some(1),
                    run_as_group: Some(2),
                    run_as_non_root: Some(true),
                    ..Default::default()
                },
            ),
            (
                "container only, as given",
                "",
                "{runAsUser: 5, privileged: true, seccompProfile: {type: Unconfined}}",
                SecurityContext {
                    run_as_user: Some(5),
                    privileged: Some(true),
                    seccomp_profile: Some(k8s_openapi::api::core::v1::SeccompProfile {
                        type_: "Unconfined".into(),
                        localhost_profile: None,
                    }),
                    ..Default::default()
                },
            ),
            (
                "container overrides the pod field by field",
                "{runAsUser: 1, runAsGroup: 2, runAsNonRoot: false}",
                "{runAsUser: 7, runAsNonRoot: true, readOnlyRootFilesystem: true, allowPrivilegeEscalation: false, procMount: Unmasked}",
                SecurityContext {
                    run_as_user: Some(7),
                    run_as_group: Some(2),
                    run_as_non_root: Some(true),
                    read_only_root_filesystem: Some(true),
                    allow_privilege_escalation: Some(false),
                    proc_mount: Some("Unmasked".into()),
                    ..Default::default()
                },
            ),
        ];
        for (name, psc, csc, want) in cases {
            let p = pod_with(psc, csc);
            assert_eq!(
                &effective_security_context(&p, container(&p)),
                want,
                "{name}"
            );
        }
    }

    /// `TestAddNoNewPrivileges`.
    #[test]
    fn no_new_privs_only_for_an_explicit_false() {
        for (ape, want) in [(None, false), (Some(true), false), (Some(false), true)] {
            let sc = SecurityContext {
                allow_privilege_escalation: ape,
                ..Default::default()
            };
            assert_eq!(add_no_new_privileges(&sc), want, "{ape:?}");
        }
    }

    pub(super) fn opts() -> SecurityOptions {
        SecurityOptions {
            seccomp_profile_root: "/var/lib/enforcer/seccomp".into(),
            seccomp_default: false,
        }
    }
}
