//! The user a container runs as: the image's user (kubelet's `getImageUser` in
//! `kuberuntime_container.go`) and the `runAsNonRoot` check (`verifyRunAsNonRoot`,
//! `security_context_others.go`).

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::{Container, Pod};

use super::{SecurityError, effective_security_context, format_pod};

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::security::tests::{container, pod_with, uid};

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
}
