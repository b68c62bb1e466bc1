//! AppArmor profiles as kubelet resolves them (`apparmor.GetProfile`, `getAppArmorProfile` in
//! `kuberuntime/helpers.go`), and kubelet's AppArmor admit handler
//! (`pkg/security/apparmor/validate.go`).

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{AppArmorProfile, Container, Pod, SecurityContext};

use super::{SecurityError, pod_security_context, seccomp::profile, security_contexts};

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
pub(super) fn apparmor_to_cri(
    p: &AppArmorProfile,
) -> Result<(cri::SecurityProfile, String), SecurityError> {
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::security::{
        container_security_context,
        tests::{container, opts, pod, pod_with, uid},
    };

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
}
