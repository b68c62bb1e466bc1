//! Seccomp profiles as kubelet resolves them (`getSeccompProfile`, `fieldSeccompProfile` in
//! `kuberuntime/helpers.go`), and the profile types a pod sets explicitly, for the Pod Security
//! checks.

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod, SecurityContext};

use super::{SecurityError, pod_security_context, security_contexts};

/// Node settings the container security context depends on.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct SecurityOptions {
    /// kubelet's `seccompProfileRoot` (`<root dir>/seccomp`): where `Localhost` seccomp
    /// profiles are found.
    pub seccomp_profile_root: String,
    /// kubelet's `seccompDefault`: `RuntimeDefault` for containers that name no profile.
    pub seccomp_default: bool,
}

pub(super) fn profile(t: cri::security_profile::ProfileType) -> cri::SecurityProfile {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::security::tests::{container, opts, pod_with};

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
}
