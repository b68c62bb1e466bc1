//! A container's mounts (kubelet's `makeMounts`): each volumeMount's volume path and subPath,
//! read-only and propagation, as CRI mounts.

use std::path::{Path, PathBuf};

use k8s_cri::v1 as cri;
use k8s_openapi::api::core::v1::Container;

use super::PlannedVolume;
use crate::policy::env;

/// Why a container's mounts cannot be made (kubelet's `makeMounts` errors; the container is
/// not created, waiting with `CreateContainerConfigError`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MountError {
    #[error("cannot find volume {volume:?} to mount into container {container:?}")]
    NoVolume { volume: String, container: String },
    #[error("error SubPath `{0}` must not be an absolute path")]
    AbsoluteSubPath(String),
    #[error("unable to provision SubPath `{0}`: must not contain '..'")]
    SubPathBacksteps(String),
    #[error("missing value for {0}")]
    SubPathExpr(String),
    #[error("invalid MountPropagation mode: {0:?}")]
    Propagation(String),
    #[error(
        "container {0:?}: Bidirectional mount propagation is available only to privileged containers"
    )]
    BidirectionalUnprivileged(String),
}

/// One mount of a container, before its subPath (if any) is made safe on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMount {
    pub volume: String,
    pub container_path: String,
    /// The volume's host path.
    pub volume_path: PathBuf,
    /// The relative subPath inside the volume (validated: relative, no `..`).
    pub sub_path: Option<String>,
    pub readonly: bool,
    pub propagation: cri::MountPropagation,
}

impl PlannedMount {
    /// The CRI mount with `host_path` (the volume's, or the checked subPath's).
    #[must_use]
    pub fn to_cri(&self, host_path: &Path) -> cri::Mount {
        cri::Mount {
            container_path: self.container_path.clone(),
            host_path: host_path.display().to_string(),
            readonly: self.readonly,
            selinux_relabel: false,
            propagation: self.propagation as i32,
            ..Default::default()
        }
    }
}

/// `translateMountPropagation`.
pub fn propagation(mode: Option<&str>) -> Result<cri::MountPropagation, MountError> {
    match mode {
        None | Some("None") => Ok(cri::MountPropagation::PropagationPrivate),
        Some("HostToContainer") => Ok(cri::MountPropagation::PropagationHostToContainer),
        Some("Bidirectional") => Ok(cri::MountPropagation::PropagationBidirectional),
        Some(other) => Err(MountError::Propagation(other.to_owned())),
    }
}

/// `ExpandContainerVolumeMounts`: `subPathExpr` with the container's env; a variable that is
/// missing or empty is an error.
pub fn expand_sub_path_expr(expr: &str, env: &[(String, String)]) -> Result<String, MountError> {
    let missing = std::cell::RefCell::new(std::collections::BTreeSet::new());
    let out = env::expand(expr, &|name| {
        let v = env::lookup(env, name).unwrap_or_default();
        if v.is_empty() {
            missing.borrow_mut().insert(name.to_owned());
        }
        Some(v)
    });
    let missing = missing.into_inner();
    if missing.is_empty() {
        Ok(out)
    } else {
        Err(MountError::SubPathExpr(
            missing.into_iter().collect::<Vec<_>>().join(", "),
        ))
    }
}

/// kubelet's `makeMounts` for one container: each volumeMount's volume path (plus subPath),
/// read-only when the mount or the volume says so, and its propagation. `env` is the
/// container's environment (for `subPathExpr`).
pub fn container_mounts(
    c: &Container,
    volumes: &[PlannedVolume],
    pod_dir: &Path,
    env: &[(String, String)],
) -> Result<Vec<PlannedMount>, MountError> {
    let privileged = c.security_context.as_ref().and_then(|s| s.privileged) == Some(true);
    let mut out = Vec::new();
    for m in c.volume_mounts.iter().flatten() {
        let no_volume = || MountError::NoVolume {
            volume: m.name.clone(),
            container: c.name.clone(),
        };
        let v = volumes
            .iter()
            .find(|v| v.name == m.name)
            .ok_or_else(no_volume)?;
        let volume_path = v.path(pod_dir).ok_or_else(no_volume)?;
        let sub_path = match m.sub_path_expr.as_deref().filter(|e| !e.is_empty()) {
            Some(expr) => expand_sub_path_expr(expr, env)?,
            None => m.sub_path.clone().unwrap_or_default(),
        };
        let sub_path = if sub_path.is_empty() {
            None
        } else {
            if sub_path.starts_with('/') {
                return Err(MountError::AbsoluteSubPath(sub_path));
            }
            if sub_path.split('/').any(|p| p == "..") {
                return Err(MountError::SubPathBacksteps(sub_path));
            }
            Some(sub_path)
        };
        let propagation = propagation(m.mount_propagation.as_deref())?;
        if propagation == cri::MountPropagation::PropagationBidirectional && !privileged {
            return Err(MountError::BidirectionalUnprivileged(c.name.clone()));
        }
        out.push(PlannedMount {
            volume: m.name.clone(),
            container_path: m.mount_path.clone(),
            volume_path,
            sub_path,
            readonly: m.read_only == Some(true) || v.kind.read_only(),
            propagation,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::volumes::{
        VolumeKind, plan,
        tests::{POD, pod},
    };

    #[test]
    fn mounts_as_make_mounts() {
        let p = pod(POD);
        let vs = plan(&p).expect("supported");
        let c = &p.spec.as_ref().expect("spec").containers[0];
        let env = vec![("DIR".to_owned(), "logs".to_owned())];
        let ms = container_mounts(c, &vs, Path::new("/s/pods/u1"), &env).expect("mounts");
        let got: Vec<(&str, Option<&str>, bool, cri::MountPropagation)> = ms
            .iter()
            .map(|m| {
                (
                    m.container_path.as_str(),
                    m.sub_path.as_deref(),
                    m.readonly,
                    m.propagation,
                )
            })
            .collect();
        use cri::MountPropagation::*;
        assert_eq!(
            got,
            [
                ("/scratch", None, false, PropagationPrivate),
                ("/sub", Some("a/b"), false, PropagationPrivate),
                ("/expr", Some("logs/x"), false, PropagationPrivate),
                ("/host", None, true, PropagationHostToContainer),
                // Downward API and projected volumes are always read-only.
                ("/etc/info", None, true, PropagationPrivate),
                ("/etc/proj", None, true, PropagationPrivate),
                ("/mem", None, false, PropagationPrivate),
            ]
        );
        let cm = ms[3].to_cri(Path::new("/var/log"));
        assert_eq!(
            (
                cm.host_path.as_str(),
                cm.readonly,
                cm.selinux_relabel,
                cm.propagation
            ),
            ("/var/log", true, false, PropagationHostToContainer as i32)
        );
    }

    #[test]
    fn sub_path_and_propagation_refusals() {
        let vs = vec![PlannedVolume {
            name: "v".into(),
            kind: VolumeKind::EmptyDir {
                memory: false,
                size_limit: None,
            },
        }];
        let c = |mount: &str| -> Container {
            serde_yaml_ng::from_str(&format!("name: c\nvolumeMounts: [{mount}]")).expect("c")
        };
        let cases: &[(&str, Result<(), MountError>)] = &[
            ("{name: v, mountPath: /a, subPath: x/y}", Ok(())),
            (
                "{name: v, mountPath: /a, subPath: /etc}",
                Err(MountError::AbsoluteSubPath("/etc".into())),
            ),
            (
                "{name: v, mountPath: /a, subPath: ../x}",
                Err(MountError::SubPathBacksteps("../x".into())),
            ),
            (
                "{name: v, mountPath: /a, subPath: x/../../y}",
                Err(MountError::SubPathBacksteps("x/../../y".into())),
            ),
            // `..` inside a name is not a backstep.
            ("{name: v, mountPath: /a, subPath: x..y}", Ok(())),
            (
                "{name: v, mountPath: /a, subPathExpr: '$(NOPE)/x'}",
                Err(MountError::SubPathExpr("NOPE".into())),
            ),
            (
                "{name: v, mountPath: /a, subPathExpr: '$(UP)'}",
                Err(MountError::SubPathBacksteps("..".into())),
            ),
            (
                "{name: w, mountPath: /a}",
                Err(MountError::NoVolume {
                    volume: "w".into(),
                    container: "c".into(),
                }),
            ),
            (
                "{name: v, mountPath: /a, mountPropagation: Bidirectional}",
                Err(MountError::BidirectionalUnprivileged("c".into())),
            ),
            (
                "{name: v, mountPath: /a, mountPropagation: Sideways}",
                Err(MountError::Propagation("Sideways".into())),
            ),
        ];
        let env = vec![("UP".to_owned(), "..".to_owned())];
        for (mount, want) in cases {
            let got = container_mounts(&c(mount), &vs, Path::new("/p"), &env).map(|_| ());
            assert_eq!(&got, want, "{mount}");
        }
        // Bidirectional is for privileged containers.
        let mut priv_c = c("{name: v, mountPath: /a, mountPropagation: Bidirectional}");
        priv_c.security_context = Some(k8s_openapi::api::core::v1::SecurityContext {
            privileged: Some(true),
            ..Default::default()
        });
        let ms = container_mounts(&priv_c, &vs, Path::new("/p"), &env).expect("privileged");
        assert_eq!(
            ms[0].propagation,
            cri::MountPropagation::PropagationBidirectional
        );
    }
}
