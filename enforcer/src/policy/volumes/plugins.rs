//! Each volume of a pod as this node sets it up (kubelet's volume plugins: `emptyDir`,
//! `hostPath`, `downwardAPI`, `configMap`, `secret`, `projected`), or why it cannot; and the
//! admission that refuses a pod with a volume this node cannot set up.

use std::path::PathBuf;

use k8s_openapi::api::core::v1::{DownwardAPIVolumeFile, Pod, ProjectedVolumeSource, Volume};

use super::{
    CONFIG_MAP_PLUGIN, DOWNWARD_API_PLUGIN, DownwardItem, DownwardSource, FileSource, HostPathType,
    PROJECTED_PLUGIN, PathError, PlannedVolume, SECRET_PLUGIN, TokenProjection,
    UNSUPPORTED_VOLUME_REASON, VolumeKind, file_mode, fs_group, is_component,
    relative_no_backsteps,
};
use crate::policy::{
    eviction::manager::AdmitResult,
    objects::{self, KeyToPath, ObjectProjection, TokenRef},
    resources,
};

/// Why a volume cannot be set up by this node: the message of the pod's refusal at admission
/// ([`UNSUPPORTED_VOLUME_REASON`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumePlanError {
    #[error("volume name {0:?} is not a valid name")]
    VolumeName(String),
    #[error("volume {volume:?}: item path {path:?} {why}")]
    ItemPath {
        volume: String,
        path: String,
        why: PathError,
    },
    #[error("volume {volume:?}: item {item:?}: unsupported fieldPath {field_path:?}")]
    FieldPath {
        volume: String,
        item: String,
        field_path: String,
    },
    #[error("volume {volume:?}: item {item:?}: resourceFieldRef needs a containerName")]
    NoContainerName { volume: String, item: String },
    #[error("volume {volume:?}: item {item:?} needs exactly one of fieldRef and resourceFieldRef")]
    OneSource { volume: String, item: String },
    #[error("volume {volume:?}: {name:?} is not a valid object name")]
    ObjectName { volume: String, name: String },
    /// A volume (or projected source: `what`) that needs API objects, for a pod that reads
    /// none.
    #[error(
        "volume {volume:?}: {what} needs API server objects; only pods from the API server read them (not static pods, not a standalone node)"
    )]
    NoApi { volume: String, what: String },
    #[error("volume {volume:?}: token path {path:?} {why}")]
    TokenPath {
        volume: String,
        path: String,
        why: PathError,
    },
    #[error("volume {volume:?}: service account {service_account:?} is not a valid name")]
    ServiceAccount {
        volume: String,
        service_account: String,
    },
    #[error("volume {volume:?}: projected source {what} is not supported by this node")]
    ProjectedSource { volume: String, what: String },
    #[error("volume {volume:?}: emptyDir medium {medium:?} is not supported by this node")]
    Medium { volume: String, medium: String },
    #[error("volume {volume:?}: {host_path_type} is an invalid volume type")]
    HostPathType {
        volume: String,
        host_path_type: String,
    },
    #[error("volume {volume:?}: hostPath {path:?} must be an absolute path")]
    HostPathRelative { volume: String, path: String },
    /// Volume sources (`what`) this node has no plugin for; `why` says more for some.
    #[error("volume {volume:?}: {what} volumes are not supported by this node{why}")]
    Unsupported {
        volume: String,
        what: String,
        why: &'static str,
    },
}

/// The fieldRef paths a downward API volume may read.
fn volume_field_ok(path: &str) -> bool {
    matches!(
        path,
        "metadata.name"
            | "metadata.namespace"
            | "metadata.uid"
            | "metadata.labels"
            | "metadata.annotations"
    ) || path.starts_with("metadata.labels['") && path.ends_with("']")
        || path.starts_with("metadata.annotations['") && path.ends_with("']")
}

fn downward_items(
    volume: &str,
    items: &[DownwardAPIVolumeFile],
    default_mode: Option<i32>,
) -> Result<Vec<DownwardItem>, VolumePlanError> {
    items
        .iter()
        .map(|i| {
            relative_no_backsteps(&i.path).map_err(|why| VolumePlanError::ItemPath {
                volume: volume.to_owned(),
                path: i.path.clone(),
                why,
            })?;
            let source = match (&i.field_ref, &i.resource_field_ref) {
                (Some(f), None) if volume_field_ok(&f.field_path) => {
                    DownwardSource::Field(f.field_path.clone())
                }
                (Some(f), None) => {
                    return Err(VolumePlanError::FieldPath {
                        volume: volume.to_owned(),
                        item: i.path.clone(),
                        field_path: f.field_path.clone(),
                    });
                }
                (None, Some(r)) if r.container_name.as_deref().is_some_and(|n| !n.is_empty()) => {
                    DownwardSource::Resource(r.clone())
                }
                (None, Some(_)) => {
                    return Err(VolumePlanError::NoContainerName {
                        volume: volume.to_owned(),
                        item: i.path.clone(),
                    });
                }
                _ => {
                    return Err(VolumePlanError::OneSource {
                        volume: volume.to_owned(),
                        item: i.path.clone(),
                    });
                }
            };
            Ok(DownwardItem {
                path: i.path.clone(),
                source,
                mode: file_mode(i.mode, default_mode),
            })
        })
        .collect()
}

/// The source kinds a volume (or projected source) names: its JSON keys besides `name`.
/// Asked only of what is refused, to name it.
fn source_kinds(v: &impl serde::Serialize) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::Object(m)) => m.keys().filter(|k| *k != "name").cloned().collect(),
        _ => Vec::new(),
    }
}

/// A configMap's or secret's `items` and modes, validated (relative paths, no `..`).
fn object_projection(
    volume: &str,
    name: &str,
    items: Option<&[k8s_openapi::api::core::v1::KeyToPath]>,
    default_mode: Option<i32>,
    optional: Option<bool>,
) -> Result<ObjectProjection, VolumePlanError> {
    if !objects::valid_name(name) {
        return Err(VolumePlanError::ObjectName {
            volume: volume.to_owned(),
            name: name.to_owned(),
        });
    }
    let items = items
        .unwrap_or(&[])
        .iter()
        .map(|i| {
            relative_no_backsteps(&i.path).map_err(|why| VolumePlanError::ItemPath {
                volume: volume.to_owned(),
                path: i.path.clone(),
                why,
            })?;
            Ok(KeyToPath {
                key: i.key.clone(),
                path: i.path.clone(),
                mode: i
                    .mode
                    .and_then(|m| u32::try_from(m).ok())
                    .map(|m| m & 0o7777),
            })
        })
        .collect::<Result<Vec<_>, VolumePlanError>>()?;
    Ok(ObjectProjection {
        name: name.to_owned(),
        items,
        default_mode: file_mode(None, default_mode),
        optional: optional.unwrap_or(false),
    })
}

/// Why a volume that needs API objects cannot be set up for this pod.
fn no_api(name: &str, what: &str) -> VolumePlanError {
    VolumePlanError::NoApi {
        volume: name.to_owned(),
        what: what.to_owned(),
    }
}

/// A projected volume: its downward API items alone (the downward API plugin's way), or
/// its sources read from the API server (configMaps, secrets, service account tokens).
fn projected(
    pod: &Pod,
    name: &str,
    p: &ProjectedVolumeSource,
    api: bool,
) -> Result<VolumeKind, VolumePlanError> {
    let mut items = Vec::new();
    let mut sources = Vec::new();
    for s in p.sources.iter().flatten() {
        if let Some(d) = s.downward_api.as_ref() {
            let d = downward_items(name, d.items.as_deref().unwrap_or(&[]), p.default_mode)?;
            items.extend(d.iter().cloned());
            sources.push(FileSource::Downward(d));
            continue;
        }
        if !api {
            let what = source_kinds(s).join(", ");
            return Err(no_api(name, &format!("projected source {what}")));
        }
        if let Some(c) = &s.config_map {
            sources.push(FileSource::ConfigMap(object_projection(
                name,
                &c.name,
                c.items.as_deref(),
                p.default_mode,
                c.optional,
            )?));
        } else if let Some(c) = &s.secret {
            sources.push(FileSource::Secret(object_projection(
                name,
                &c.name,
                c.items.as_deref(),
                p.default_mode,
                c.optional,
            )?));
        } else if let Some(t) = &s.service_account_token {
            relative_no_backsteps(&t.path).map_err(|why| VolumePlanError::TokenPath {
                volume: name.to_owned(),
                path: t.path.clone(),
                why,
            })?;
            let service_account = objects::service_account(pod);
            if !objects::valid_name(&service_account) {
                return Err(VolumePlanError::ServiceAccount {
                    volume: name.to_owned(),
                    service_account,
                });
            }
            sources.push(FileSource::Token(TokenProjection {
                token: TokenRef {
                    service_account,
                    audience: t.audience.clone().filter(|a| !a.is_empty()),
                    expiration_seconds: t
                        .expiration_seconds
                        .unwrap_or(objects::DEFAULT_TOKEN_EXPIRATION_SECONDS),
                },
                path: t.path.clone(),
                // kubelet: 0600 when an fsGroup will widen it to 0640, else the
                // volume's default mode.
                mode: if fs_group(pod).is_some() {
                    0o600
                } else {
                    file_mode(None, p.default_mode)
                },
            }));
        } else {
            return Err(VolumePlanError::ProjectedSource {
                volume: name.to_owned(),
                what: source_kinds(s).join(", "),
            });
        }
    }
    Ok(
        if sources.iter().all(|s| matches!(s, FileSource::Downward(_))) {
            VolumeKind::Downward {
                plugin: PROJECTED_PLUGIN,
                items,
            }
        } else {
            VolumeKind::Objects {
                plugin: PROJECTED_PLUGIN,
                sources,
                memory: true,
            }
        },
    )
}

/// One volume as this node sets it up, or why it cannot. `api`: the pod came from the API
/// server and the node reads objects there.
fn plan_volume(pod: &Pod, v: &Volume, api: bool) -> Result<PlannedVolume, VolumePlanError> {
    let name = v.name.clone();
    if !is_component(&name) {
        return Err(VolumePlanError::VolumeName(name));
    }
    let kind = if let Some(e) = &v.empty_dir {
        let memory = match e.medium.as_deref().unwrap_or("") {
            "" => false,
            "Memory" => true,
            other => {
                return Err(VolumePlanError::Medium {
                    volume: name,
                    medium: other.to_owned(),
                });
            }
        };
        VolumeKind::EmptyDir {
            memory,
            size_limit: e
                .size_limit
                .as_ref()
                .map(|q| resources::lenient(q).value())
                .filter(|s| *s > 0),
        }
    } else if let Some(h) = &v.host_path {
        let kind = HostPathType::parse(h.type_.as_deref()).ok_or_else(|| {
            VolumePlanError::HostPathType {
                volume: name.clone(),
                host_path_type: h.type_.clone().unwrap_or_default(),
            }
        })?;
        if !h.path.starts_with('/') {
            return Err(VolumePlanError::HostPathRelative {
                volume: name,
                path: h.path.clone(),
            });
        }
        VolumeKind::HostPath {
            path: PathBuf::from(&h.path),
            kind,
        }
    } else if let Some(d) = &v.downward_api {
        VolumeKind::Downward {
            plugin: DOWNWARD_API_PLUGIN,
            items: downward_items(&name, d.items.as_deref().unwrap_or(&[]), d.default_mode)?,
        }
    } else if let Some(c) = &v.config_map {
        if !api {
            return Err(no_api(&name, "a configMap volume"));
        }
        VolumeKind::Objects {
            plugin: CONFIG_MAP_PLUGIN,
            sources: vec![FileSource::ConfigMap(object_projection(
                &name,
                &c.name,
                c.items.as_deref(),
                c.default_mode,
                c.optional,
            )?)],
            memory: false,
        }
    } else if let Some(sv) = &v.secret {
        if !api {
            return Err(no_api(&name, "a secret volume"));
        }
        VolumeKind::Objects {
            plugin: SECRET_PLUGIN,
            sources: vec![FileSource::Secret(object_projection(
                &name,
                sv.secret_name.as_deref().unwrap_or(""),
                sv.items.as_deref(),
                sv.default_mode,
                sv.optional,
            )?)],
            memory: true,
        }
    } else if let Some(p) = &v.projected {
        projected(pod, &name, p, api)?
    } else {
        let kinds = source_kinds(v);
        if kinds.is_empty() {
            // The API defaults a volume with no source to an emptyDir.
            VolumeKind::EmptyDir {
                memory: false,
                size_limit: None,
            }
        } else {
            let what = kinds.join(", ");
            let why = match what.as_str() {
                "persistentVolumeClaim" | "ephemeral" => " (it needs a volume controller)",
                _ => "",
            };
            return Err(VolumePlanError::Unsupported {
                volume: name,
                what,
                why,
            });
        }
    };
    Ok(PlannedVolume { name, kind })
}

/// The pod's volumes, in spec order, or the first one this node cannot set up (a pod that
/// reads no API objects: standalone, or static).
pub fn plan(pod: &Pod) -> Result<Vec<PlannedVolume>, VolumePlanError> {
    plan_with(pod, false)
}

/// [`plan`], for a pod from the API server when `api` (configMap, secret, token volumes).
pub fn plan_with(pod: &Pod, api: bool) -> Result<Vec<PlannedVolume>, VolumePlanError> {
    pod.spec
        .iter()
        .flat_map(|s| s.volumes.iter().flatten())
        .map(|v| plan_volume(pod, v, api))
        .collect()
}

/// Admission: refuses a pod with a volume this node cannot set up ([`UNSUPPORTED_VOLUME_REASON`]).
pub fn admit(pod: &Pod) -> AdmitResult {
    admit_with(pod, false)
}

/// [`admit`] for a pod from the API server when `api`.
pub fn admit_with(pod: &Pod, api: bool) -> AdmitResult {
    match plan_with(pod, api) {
        Ok(_) => AdmitResult::admit(),
        Err(e) => AdmitResult::reject(UNSUPPORTED_VOLUME_REASON, e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        path::{Path, PathBuf},
    };

    use super::*;
    use crate::{
        policy::volumes::{
            downward_files,
            tests::{POD, pod},
        },
        quantity::Quantity,
    };

    #[test]
    fn plans_the_supported_volumes() {
        let p = pod(POD);
        let vs = plan(&p).expect("supported");
        let names: Vec<&str> = vs.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["scratch", "mem", "host", "info", "proj", "bare"]);
        assert_eq!(
            vs[1].kind,
            VolumeKind::EmptyDir {
                memory: true,
                size_limit: Some(64 << 20)
            }
        );
        assert_eq!(
            vs[5].kind,
            VolumeKind::EmptyDir {
                memory: false,
                size_limit: None
            }
        );
        let dir = Path::new("/state/pods/u1");
        assert_eq!(
            vs[0].path(dir),
            Some(PathBuf::from(
                "/state/pods/u1/volumes/kubernetes.io~empty-dir/scratch"
            ))
        );
        assert_eq!(
            vs[3].path(dir),
            Some(PathBuf::from(
                "/state/pods/u1/volumes/kubernetes.io~downward-api/info"
            ))
        );
        assert_eq!(
            vs[4].path(dir),
            Some(PathBuf::from(
                "/state/pods/u1/volumes/kubernetes.io~projected/proj"
            ))
        );
        assert_eq!(vs[2].path(dir), Some(PathBuf::from("/var/log")));
        let VolumeKind::Downward { items, .. } = &vs[3].kind else {
            panic!("downward");
        };
        let modes: Vec<u32> = items.iter().map(|i| i.mode).collect();
        assert_eq!(modes, [0o600, 0o400, 0o600]);
        let allocatable =
            BTreeMap::from([("memory".to_owned(), Quantity::parse("8Gi").expect("q"))]);
        let files = downward_files(&p, items, &allocatable).expect("files");
        let text: Vec<(&str, String)> = files
            .iter()
            .map(|(p, c, _)| (p.as_str(), String::from_utf8_lossy(c).into_owned()))
            .collect();
        assert_eq!(
            text,
            [
                ("labels", "app=\"x\"\ntier=\"1\"".to_owned()),
                ("sub/name", "web".to_owned()),
                ("mem_limit", "128".to_owned()),
            ]
        );
    }

    #[test]
    fn unsupported_volumes_are_refused() {
        let refused = |vol: &str| {
            let p = pod(&format!(
                "metadata: {{name: a}}\nspec: {{volumes: [{vol}], containers: [{{name: c}}]}}"
            ));
            let r = admit(&p);
            assert!(!r.admitted, "{vol}");
            assert_eq!(r.reason, UNSUPPORTED_VOLUME_REASON);
            r.message
        };
        let m = refused("{name: cfg, configMap: {name: x}}");
        assert!(
            m.contains("configMap volume needs API server objects") && m.contains("static"),
            "{m}"
        );
        let m = refused("{name: s, secret: {secretName: x}}");
        assert!(m.contains("secret volume"), "{m}");
        let m = refused("{name: d, persistentVolumeClaim: {claimName: x}}");
        assert!(m.contains("persistentVolumeClaim"), "{m}");
        let m = refused("{name: n, nfs: {server: s, path: /x}}");
        assert!(m.contains("nfs"), "{m}");
        let m = refused("{name: p, projected: {sources: [{serviceAccountToken: {path: token}}]}}");
        assert!(m.contains("serviceAccountToken"), "{m}");
        let m = refused("{name: h, emptyDir: {medium: HugePages}}");
        assert!(m.contains("HugePages"), "{m}");
        let m = refused("{name: h, hostPath: {path: /x, type: Weird}}");
        assert!(m.contains("Weird is an invalid volume type"), "{m}");
        let m = refused("{name: '..', emptyDir: {}}");
        assert!(m.contains("not a valid name"), "{m}");
        let m = refused(
            "{name: d, downwardAPI: {items: [{path: ../x, fieldRef: {fieldPath: metadata.name}}]}}",
        );
        assert!(m.contains("must not contain '..'"), "{m}");
        let m = refused(
            "{name: d, downwardAPI: {items: [{path: x, fieldRef: {fieldPath: spec.nodeName}}]}}",
        );
        assert!(m.contains("unsupported fieldPath"), "{m}");
        let ok = pod(POD);
        assert!(admit(&ok).admitted);
    }
}
