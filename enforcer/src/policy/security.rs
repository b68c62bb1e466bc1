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

use std::collections::{BTreeMap, HashMap};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{AppArmorProfile, Container, Pod, SecurityContext};

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

/// kubelet's (and moby's) default masked paths.
pub const DEFAULT_MASKED_PATHS: &[&str] = &[
    "/proc/asound",
    "/proc/acpi",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
];

/// kubelet's (and moby's) default read-only paths.
pub const DEFAULT_READONLY_PATHS: &[&str] = &[
    "/proc/bus",
    "/proc/fs",
    "/proc/irq",
    "/proc/sys",
    "/proc/sysrq-trigger",
];

/// `procMount: Unmasked`.
pub const UNMASKED_PROC_MOUNT: &str = "Unmasked";

/// `ConvertToRuntimeMaskedPaths`: none for `procMount: Unmasked`, else the defaults.
#[must_use]
pub fn masked_paths(proc_mount: Option<&str>) -> Vec<String> {
    if proc_mount == Some(UNMASKED_PROC_MOUNT) {
        Vec::new()
    } else {
        DEFAULT_MASKED_PATHS
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }
}

/// `ConvertToRuntimeReadonlyPaths`: none for `procMount: Unmasked`, else the defaults.
#[must_use]
pub fn readonly_paths(proc_mount: Option<&str>) -> Vec<String> {
    if proc_mount == Some(UNMASKED_PROC_MOUNT) {
        Vec::new()
    } else {
        DEFAULT_READONLY_PATHS
            .iter()
            .map(|s| (*s).to_owned())
            .collect()
    }
}

/// The user an image runs as, from CRI `ImageStatus` (kubelet's `getImageUser`): its uid if
/// the runtime gives one, else its user name; an image that says neither runs as root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImageUser {
    /// `image.uid`.
    pub uid: Option<i64>,
    /// `image.username` (only when there is no uid).
    pub username: String,
}

impl Default for ImageUser {
    /// Root: what kubelet assumes of an image that names no user.
    fn default() -> Self {
        Self {
            uid: Some(0),
            username: String::new(),
        }
    }
}

impl ImageUser {
    /// From the runtime's image status (`None`: the image is not there, treated as root).
    #[must_use]
    pub fn of(image: Option<&cri::Image>) -> Self {
        match image {
            Some(i) if i.uid.is_some() => Self {
                uid: i.uid.as_ref().map(|u| u.value),
                username: String::new(),
            },
            Some(i) if !i.username.is_empty() => Self {
                uid: None,
                username: i.username.clone(),
            },
            _ => Self::default(),
        }
    }
}

/// `verifyRunAsNonRoot`: with `runAsNonRoot: true`, the effective `runAsUser` must not be 0;
/// without one, the image's uid must be a valid non-zero uid (a user name cannot be verified).
pub fn verify_run_as_non_root(
    pod: &Pod,
    c: &Container,
    image: &ImageUser,
) -> Result<(), SecurityError> {
    let sc = effective_security_context(pod, c);
    if sc.run_as_non_root != Some(true) {
        return Ok(());
    }
    let pod_name = format_pod(pod);
    let container = c.name.clone();
    if let Some(uid) = sc.run_as_user {
        if uid == 0 {
            return Err(SecurityError::RunAsUserBreaksNonRoot {
                pod: pod_name,
                container,
            });
        }
        return Ok(());
    }
    match image.uid {
        None if !image.username.is_empty() => Err(SecurityError::NonNumericImageUser {
            username: image.username.clone(),
            pod: pod_name,
            container,
        }),
        Some(0) => Err(SecurityError::ImageRunsAsRoot {
            pod: pod_name,
            container,
        }),
        Some(uid) if !(0..=i64::from(i32::MAX)).contains(&uid) => {
            Err(SecurityError::InvalidImageUid {
                uid,
                pod: pod_name,
                container,
            })
        }
        _ => Ok(()),
    }
}

/// Node settings the container security context depends on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecurityOptions {
    /// kubelet's `seccompProfileRoot` (`<root dir>/seccomp`): where `Localhost` seccomp
    /// profiles are found.
    pub seccomp_profile_root: String,
    /// kubelet's `seccompDefault`: `RuntimeDefault` for containers that name no profile.
    pub seccomp_default: bool,
}

fn profile(t: cri::security_profile::ProfileType) -> cri::SecurityProfile {
    cri::SecurityProfile {
        profile_type: t as i32,
        localhost_ref: String::new(),
    }
}

/// `fieldSeccompProfile`: `RuntimeDefault`; `Localhost` at `<root>/<localhostProfile>`;
/// anything else `Unconfined`.
fn field_seccomp_profile(
    scmp: &k8s_openapi::api::core::v1::SeccompProfile,
    root: &str,
) -> Result<cri::SecurityProfile, SecurityError> {
    use cri::security_profile::ProfileType;
    match scmp.type_.as_str() {
        "RuntimeDefault" => Ok(profile(ProfileType::RuntimeDefault)),
        "Localhost" => match scmp.localhost_profile.as_deref() {
            // Joined as Go's `filepath.Join` does (a leading `/` stays below the root), and
            // never out of it: a manifest's profile name is untrusted input.
            Some(p) if !p.is_empty() => crate::paths::join_inside(std::path::Path::new(root), p)
                .map(|path| cri::SecurityProfile {
                    profile_type: ProfileType::Localhost as i32,
                    localhost_ref: path.display().to_string(),
                })
                .map_err(|_| SecurityError::SeccompProfileEscape {
                    profile: p.to_owned(),
                    root: root.to_owned(),
                }),
            _ => Err(SecurityError::SeccompLocalhostWithoutProfile),
        },
        _ => Ok(profile(ProfileType::Unconfined)),
    }
}

/// `getSeccompProfile`: the container's `seccompProfile`, else the pod's, else
/// `RuntimeDefault` with `seccompDefault`, else `Unconfined`.
pub fn seccomp_profile(
    pod: &Pod,
    c: &Container,
    opts: &SecurityOptions,
) -> Result<cri::SecurityProfile, SecurityError> {
    seccomp_of(pod, c.security_context.as_ref(), opts)
}

fn seccomp_of(
    pod: &Pod,
    container: Option<&SecurityContext>,
    opts: &SecurityOptions,
) -> Result<cri::SecurityProfile, SecurityError> {
    use cri::security_profile::ProfileType;
    if let Some(s) = container.and_then(|s| s.seccomp_profile.as_ref()) {
        return field_seccomp_profile(s, &opts.seccomp_profile_root);
    }
    if let Some(s) = pod_security_context(pod).and_then(|s| s.seccomp_profile.as_ref()) {
        return field_seccomp_profile(s, &opts.seccomp_profile_root);
    }
    Ok(profile(if opts.seccomp_default {
        ProfileType::RuntimeDefault
    } else {
        ProfileType::Unconfined
    }))
}

/// The deprecated AppArmor annotation prefix (`container.apparmor.security.beta.kubernetes.io/`).
pub const APPARMOR_ANNOTATION_PREFIX: &str = "container.apparmor.security.beta.kubernetes.io/";

/// `getProfileFromPodAnnotations`: `runtime/default`, `unconfined`, `localhost/<name>`;
/// anything else is no profile.
fn apparmor_from_annotation(pod: &Pod, container: &str) -> Option<AppArmorProfile> {
    let v = pod
        .metadata
        .annotations
        .as_ref()?
        .get(&format!("{APPARMOR_ANNOTATION_PREFIX}{container}"))?;
    let p = |t: &str, l: Option<String>| AppArmorProfile {
        type_: t.to_owned(),
        localhost_profile: l,
    };
    match v.as_str() {
        "runtime/default" => Some(p("RuntimeDefault", None)),
        "unconfined" => Some(p("Unconfined", None)),
        v => v
            .strip_prefix("localhost/")
            .map(|name| p("Localhost", Some(name.to_owned()))),
    }
}

/// `apparmor.GetProfile`: the container's `appArmorProfile`, else the deprecated container
/// annotation, else the pod's `appArmorProfile`.
#[must_use]
pub fn apparmor_profile(pod: &Pod, c: &Container) -> Option<AppArmorProfile> {
    apparmor_of(pod, &c.name, c.security_context.as_ref())
}

fn apparmor_of(
    pod: &Pod,
    name: &str,
    container: Option<&SecurityContext>,
) -> Option<AppArmorProfile> {
    container
        .and_then(|s| s.app_armor_profile.clone())
        .or_else(|| apparmor_from_annotation(pod, name))
        .or_else(|| pod_security_context(pod).and_then(|s| s.app_armor_profile.clone()))
}

/// `getAppArmorProfile`: the CRI profile and the deprecated string form
/// (`runtime/default`, `unconfined`, `localhost/<name>`).
fn apparmor_to_cri(p: &AppArmorProfile) -> Result<(cri::SecurityProfile, String), SecurityError> {
    use cri::security_profile::ProfileType;
    match p.type_.as_str() {
        "RuntimeDefault" => Ok((
            profile(ProfileType::RuntimeDefault),
            "runtime/default".to_owned(),
        )),
        "Unconfined" => Ok((profile(ProfileType::Unconfined), "unconfined".to_owned())),
        "Localhost" => {
            let name = p
                .localhost_profile
                .clone()
                .ok_or(SecurityError::AppArmorLocalhostWithoutProfile)?;
            Ok((
                cri::SecurityProfile {
                    profile_type: ProfileType::Localhost as i32,
                    localhost_ref: name.clone(),
                },
                format!("localhost/{name}"),
            ))
        }
        other => Err(SecurityError::UnknownAppArmorType(other.to_owned())),
    }
}

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
    pub fn validate(&self, sysctl: &str, host_net: bool, host_ipc: bool) -> Result<(), String> {
        let sysctl = normalize_sysctl_name(sysctl);
        let ns = self.sysctls.get(&sysctl).copied().or_else(|| {
            self.prefixes
                .iter()
                .find(|(p, _)| sysctl.starts_with(p.as_str()))
                .map(|(_, ns)| *ns)
        });
        match ns {
            Some(ns @ SysctlNamespace::Ipc) if host_ipc => {
                Err(format!("{sysctl:?} not allowed with host {ns} enabled"))
            }
            Some(ns @ SysctlNamespace::Net) if host_net => {
                Err(format!("{sysctl:?} not allowed with host {ns} enabled"))
            }
            Some(_) => Ok(()),
            None => Err(format!("{sysctl:?} not allowlisted")),
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

/// Reason of an AppArmor rejection at admission (`AppArmorNotAdmittedReason`).
pub const APPARMOR_REASON: &str = "AppArmor";

/// Whether the kernel enforces AppArmor, from `/sys/module/apparmor/parameters/enabled`'s
/// text (`Y`).
#[must_use]
pub fn apparmor_enabled_from(parameter: Option<&str>) -> bool {
    parameter.is_some_and(|t| t.trim_start().starts_with('Y'))
}

/// The AppArmor admit handler (`Validate`): a pod that asks for a profile other than
/// `unconfined` needs a host with AppArmor; a `Localhost` profile needs a name.
/// `Err((reason, message))` as kubelet reports it.
pub fn validate_apparmor(pod: &Pod, host_enabled: bool) -> Result<(), (&'static str, String)> {
    let fail = |e: &str| (APPARMOR_REASON, format!("Cannot enforce AppArmor: {e}"));
    let confined = |p: &AppArmorProfile| p.type_ != "Unconfined";
    let required = pod_security_context(pod)
        .and_then(|s| s.app_armor_profile.as_ref())
        .is_some_and(confined)
        || security_contexts(pod).any(|(_, s)| {
            s.and_then(|s| s.app_armor_profile.as_ref())
                .is_some_and(confined)
        })
        || pod
            .metadata
            .annotations
            .iter()
            .flatten()
            .any(|(k, v)| k.starts_with(APPARMOR_ANNOTATION_PREFIX) && v != "unconfined");
    if !required {
        return Ok(());
    }
    if !host_enabled {
        return Err(fail("AppArmor is not enabled on the host"));
    }
    for (name, sc) in security_contexts(pod) {
        if let Some(p) = apparmor_of(pod, name, sc)
            && p.type_ == "Localhost"
            && p.localhost_profile
                .as_deref()
                .is_none_or(|n| n.trim().is_empty())
        {
            return Err(fail(&format!(
                "invalid empty AppArmor profile name: \"localhost/{}\"",
                p.localhost_profile.as_deref().unwrap_or_default()
            )));
        }
    }
    Ok(())
}

/// The seccomp profile types set explicitly, pod-level (`<pod>`) then per container (init,
/// regular, ephemeral), for Pod Security checks: `(where, profile type)`.
#[must_use]
pub fn explicit_seccomp_types(pod: &Pod) -> Vec<(String, String)> {
    let pod_level = pod_security_context(pod)
        .and_then(|s| s.seccomp_profile.as_ref())
        .map(|p| ("<pod>".to_owned(), p.type_.clone()));
    pod_level
        .into_iter()
        .chain(security_contexts(pod).filter_map(|(n, s)| {
            s.and_then(|s| s.seccomp_profile.as_ref())
                .map(|p| (n.to_owned(), p.type_.clone()))
        }))
        .collect()
}

/// The effective `procMount` of every container (init, regular, ephemeral).
pub fn proc_mounts(pod: &Pod) -> impl Iterator<Item = (&str, Option<String>)> {
    security_contexts(pod).map(move |(n, s)| (n, effective_of(pod, s).proc_mount))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pod(yaml: &str) -> Pod {
        serde_yaml_ng::from_str(yaml).expect("pod yaml")
    }

    /// `metadata: {name: p, namespace: ns, uid: u}` with the pod-level `securityContext`
    /// `pod_sc` and one container `c` with `c_sc` (YAML flow maps, empty for none).
    fn pod_with(pod_sc: &str, c_sc: &str) -> Pod {
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

    fn container(p: &Pod) -> &Container {
        &p.spec.as_ref().expect("spec").containers[0]
    }

    fn uid(v: i64) -> ImageUser {
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

    /// `TestVerifyRunAsNonRoot`, with kubelet's messages.
    #[test]
    fn verify_run_as_non_root_cases() {
        let none = ImageUser {
            uid: None,
            username: String::new(),
        };
        let named = ImageUser {
            uid: None,
            username: "test".into(),
        };
        let cases: &[(&str, &str, &str, ImageUser, Option<&str>)] = &[
            ("no security context", "", "", uid(0), None),
            ("runAsNonRoot unset", "", "{runAsUser: 0}", uid(0), None),
            (
                "runAsNonRoot false, image root",
                "",
                "{runAsNonRoot: false}",
                uid(0),
                None,
            ),
            (
                "runAsUser root and runAsNonRoot",
                "",
                "{runAsNonRoot: true, runAsUser: 0}",
                uid(1),
                Some(
                    "container's runAsUser breaks non-root policy (pod: \"p_ns(u)\", container: c)",
                ),
            ),
            (
                "image root and runAsNonRoot",
                "",
                "{runAsNonRoot: true}",
                uid(0),
                Some(
                    "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: c)",
                ),
            ),
            (
                "image says nothing: root",
                "{runAsNonRoot: true}",
                "",
                ImageUser::of(Some(&cri::Image::default())),
                Some(
                    "container has runAsNonRoot and image will run as root (pod: \"p_ns(u)\", container: c)",
                ),
            ),
            (
                "image user name",
                "",
                "{runAsNonRoot: true}",
                named.clone(),
                Some(
                    "container has runAsNonRoot and image has non-numeric user (test), cannot verify user is non-root (pod: \"p_ns(u)\", container: c)",
                ),
            ),
            (
                "image user name but runAsUser set",
                "",
                "{runAsNonRoot: true, runAsUser: 1000}",
                named,
                None,
            ),
            (
                "image non-root",
                "",
                "{runAsNonRoot: true}",
                uid(1000),
                None,
            ),
            (
                "pod runAsNonRoot, container runAsUser non-root, image root",
                "{runAsNonRoot: true}",
                "{runAsUser: 9}",
                uid(0),
                None,
            ),
            (
                "neither uid nor name",
                "",
                "{runAsNonRoot: true}",
                none,
                None,
            ),
            (
                "image uid out of range",
                "",
                "{runAsNonRoot: true}",
                uid(1 << 40),
                Some(
                    "container has runAsNonRoot and image has an invalid user id (1099511627776). (Must be 1-(2147483647)): must be between 0 and 2147483647, inclusive (pod: \"p_ns(u)\", container: c)",
                ),
            ),
        ];
        for (name, psc, csc, image, want) in cases {
            let p = pod_with(psc, csc);
            let got = verify_run_as_non_root(&p, container(&p), image)
                .err()
                .map(|e| e.to_string());
            assert_eq!(got.as_deref(), *want, "{name}");
        }
    }

    #[test]
    fn image_user_from_image_status() {
        let img = |uid: Option<i64>, name: &str| cri::Image {
            uid: uid.map(|value| cri::Int64Value { value }),
            username: name.into(),
            ..Default::default()
        };
        assert_eq!(ImageUser::of(Some(&img(Some(5), "x"))), uid(5));
        assert_eq!(
            ImageUser::of(Some(&img(None, "www"))),
            ImageUser {
                uid: None,
                username: "www".into()
            }
        );
        assert_eq!(ImageUser::of(Some(&img(None, ""))), uid(0));
        assert_eq!(ImageUser::of(None), uid(0));
    }

    fn opts() -> SecurityOptions {
        SecurityOptions {
            seccomp_profile_root: "/var/lib/enforcer/seccomp".into(),
            seccomp_default: false,
        }
    }

    /// `TestFieldProfile` / `TestGetSeccompProfile`: container field, pod field,
    /// `seccompDefault`, Unconfined.
    #[test]
    fn seccomp_profiles() {
        use cri::security_profile::ProfileType::{Localhost, RuntimeDefault, Unconfined};
        type Want = Result<(cri::security_profile::ProfileType, &'static str), SecurityError>;
        let cases: &[(&str, &str, bool, Want)] = &[
            ("none", "", false, Ok((Unconfined, ""))),
            ("none, seccompDefault", "", true, Ok((RuntimeDefault, ""))),
            (
                "pod RuntimeDefault",
                "{seccompProfile: {type: RuntimeDefault}}|",
                false,
                Ok((RuntimeDefault, "")),
            ),
            (
                "container overrides pod",
                "{seccompProfile: {type: RuntimeDefault}}|{seccompProfile: {type: Unconfined}}",
                true,
                Ok((Unconfined, "")),
            ),
            (
                "localhost",
                "|{seccompProfile: {type: Localhost, localhostProfile: profiles/audit.json}}",
                false,
                Ok((Localhost, "/var/lib/enforcer/seccomp/profiles/audit.json")),
            ),
            (
                "localhost, absolute name: below the root, as filepath.Join",
                "|{seccompProfile: {type: Localhost, localhostProfile: /etc/x.json}}",
                false,
                Ok((Localhost, "/var/lib/enforcer/seccomp/etc/x.json")),
            ),
            (
                "localhost escaping the root",
                "|{seccompProfile: {type: Localhost, localhostProfile: ../../etc/x.json}}",
                false,
                Err(SecurityError::SeccompProfileEscape {
                    profile: "../../etc/x.json".into(),
                    root: "/var/lib/enforcer/seccomp".into(),
                }),
            ),
            (
                "localhost without a profile",
                "|{seccompProfile: {type: Localhost}}",
                false,
                Err(SecurityError::SeccompLocalhostWithoutProfile),
            ),
            (
                "unknown type",
                "|{seccompProfile: {type: Other}}",
                false,
                Ok((Unconfined, "")),
            ),
        ];
        for (name, scs, default, want) in cases {
            let (psc, csc) = scs.split_once('|').unwrap_or((scs, ""));
            let p = pod_with(psc, csc);
            let o = SecurityOptions {
                seccomp_default: *default,
                ..opts()
            };
            let got = seccomp_profile(&p, container(&p), &o);
            let want = want.clone().map(|(t, r)| cri::SecurityProfile {
                profile_type: t as i32,
                localhost_ref: r.to_owned(),
            });
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn apparmor_from_field_annotation_and_pod() {
        let p = pod(
            "metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/a: localhost/prof, container.apparmor.security.beta.kubernetes.io/b: bogus}}\nspec: {securityContext: {appArmorProfile: {type: RuntimeDefault}}, containers: [{name: a}, {name: b}, {name: c, securityContext: {appArmorProfile: {type: Unconfined}}}]}",
        );
        let cs = &p.spec.as_ref().expect("spec").containers;
        let types: Vec<(String, Option<String>)> = cs
            .iter()
            .map(|c| {
                let pr = apparmor_profile(&p, c).expect("a profile");
                (pr.type_, pr.localhost_profile)
            })
            .collect();
        assert_eq!(
            types,
            [
                ("Localhost".to_owned(), Some("prof".to_owned())),
                ("RuntimeDefault".to_owned(), None),
                ("Unconfined".to_owned(), None)
            ]
        );
        let sc = container_security_context(&p, &cs[0], &uid(0), &opts()).expect("sc");
        assert_eq!(
            sc.apparmor,
            Some(cri::SecurityProfile {
                profile_type: cri::security_profile::ProfileType::Localhost as i32,
                localhost_ref: "prof".into()
            })
        );
        #[expect(deprecated, reason = "the string form kubelet still sets")]
        let deprecated = sc.apparmor_profile.clone();
        assert_eq!(deprecated, "localhost/prof");
        // No profile anywhere: no AppArmor field.
        let plain = pod_with("", "");
        let sc =
            container_security_context(&plain, container(&plain), &uid(0), &opts()).expect("sc");
        assert_eq!(sc.apparmor, None);
    }

    /// The AppArmor admit handler: a host without AppArmor refuses any profile but
    /// unconfined.
    #[test]
    fn apparmor_admission() {
        let rd = pod_with("", "{appArmorProfile: {type: RuntimeDefault}}");
        let unconfined = pod_with("{appArmorProfile: {type: Unconfined}}", "");
        let none = pod_with("", "");
        assert_eq!(
            validate_apparmor(&rd, false),
            Err((
                "AppArmor",
                "Cannot enforce AppArmor: AppArmor is not enabled on the host".to_owned()
            ))
        );
        assert_eq!(validate_apparmor(&rd, true), Ok(()));
        assert_eq!(validate_apparmor(&unconfined, false), Ok(()));
        assert_eq!(validate_apparmor(&none, false), Ok(()));
        let annotated = pod(
            "metadata: {name: p, annotations: {container.apparmor.security.beta.kubernetes.io/c: runtime/default}}\nspec: {containers: [{name: c}]}",
        );
        assert!(validate_apparmor(&annotated, false).is_err());
        let empty = pod_with(
            "",
            "{appArmorProfile: {type: Localhost, localhostProfile: ' '}}",
        );
        assert!(
            validate_apparmor(&empty, true)
                .err()
                .is_some_and(|(_, m)| m.contains("invalid empty AppArmor profile name"))
        );
        assert!(apparmor_enabled_from(Some("Y\n")));
        assert!(!apparmor_enabled_from(Some("N\n")));
        assert!(!apparmor_enabled_from(None));
    }

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
                w.validate(name, host_net, host_ipc),
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
