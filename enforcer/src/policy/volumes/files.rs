//! The content of the volumes whose files the node writes: downward API items, and the
//! files of object-backed volumes (configMap, secret and projected payloads, tokens).

use k8s_openapi::api::core::v1::Pod;

use super::{DownwardItem, DownwardSource, FileSource, PathError, relative_no_backsteps};
use crate::policy::{
    env::{self, EnvError},
    objects::{self, ObjectError, PodObjects},
    resources::ResourceList,
};

/// Why an object-backed volume's files cannot be made (kubelet's `MountVolume.SetUp`
/// message).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VolumeFilesError {
    /// A downward API source's value.
    #[error("{0}")]
    Downward(#[from] EnvError),
    /// A configMap, secret or token not there to use.
    #[error("{0}")]
    Object(#[from] ObjectError),
    /// A file path (a key included) that would leave the volume.
    #[error("invalid path {path:?}: {why}")]
    Path { path: String, why: PathError },
    /// Several sources failed (kubelet's aggregate: `[a, b]`).
    #[error("[{}]", joined(.0))]
    Several(Vec<VolumeFilesError>),
}

fn joined(errors: &[VolumeFilesError]) -> String {
    errors
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// The files of a downward API volume: (relative path, content, mode), from the pod (with its
/// limits merged from the node's allocatable for `resourceFieldRef`).
pub fn downward_files(
    pod: &Pod,
    items: &[DownwardItem],
    allocatable: &ResourceList,
) -> Result<Vec<(String, Vec<u8>, u32)>, EnvError> {
    let merged = env::pod_for_downward_api(pod, allocatable);
    items
        .iter()
        .map(|i| {
            let content = match &i.source {
                DownwardSource::Field(path) => env::metadata_field(pod, path)?,
                DownwardSource::Resource(fs) => env::resource_by_container(
                    &merged,
                    fs,
                    fs.container_name.as_deref().unwrap_or(""),
                )?,
            };
            Ok((i.path.clone(), content.into_bytes(), i.mode))
        })
        .collect()
}

/// The files of an object-backed volume (kubelet's projected `collectData`, and the
/// configMap and secret plugins' payloads): every source's files, later ones replacing
/// earlier ones at the same path; the errors of all failing sources together (kubelet's
/// aggregate: one error as is, several as `[a, b]`). Every path is checked as the
/// AtomicWriter checks it (relative, no `..`), a key included.
pub fn object_files(
    pod: &Pod,
    sources: &[FileSource],
    objects: &PodObjects,
    allocatable: &ResourceList,
) -> Result<Vec<objects::File>, VolumeFilesError> {
    let mut files: Vec<objects::File> = Vec::new();
    let mut errors: Vec<VolumeFilesError> = Vec::new();
    for s in sources {
        let got: Result<_, VolumeFilesError> = match s {
            FileSource::Downward(items) => {
                downward_files(pod, items, allocatable).map_err(Into::into)
            }
            FileSource::ConfigMap(p) => objects::config_map_payload(objects, p).map_err(Into::into),
            FileSource::Secret(p) => objects::secret_payload(objects, p).map_err(Into::into),
            FileSource::Token(t) => objects
                .token(&t.token)
                .map(|tok| vec![(t.path.clone(), tok.as_bytes().to_vec(), t.mode)])
                .map_err(Into::into),
        };
        match got {
            Ok(fs) => {
                for f in fs {
                    if let Err(why) = relative_no_backsteps(&f.0) {
                        errors.push(VolumeFilesError::Path {
                            path: f.0.clone(),
                            why,
                        });
                        continue;
                    }
                    files.retain(|g| g.0 != f.0);
                    files.push(f);
                }
            }
            Err(e) => errors.push(e),
        }
    }
    match errors.len() {
        0 => Ok(files),
        1 => Err(errors.remove(0)),
        _ => Err(VolumeFilesError::Several(errors)),
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::BTreeMap,
        path::{Path, PathBuf},
    };

    use super::*;
    use crate::policy::volumes::{VolumeKind, admit, admit_with, plan_with, tests::pod};

    /// The error as its text (kubelet's message).
    fn object_files(
        pod: &Pod,
        sources: &[FileSource],
        objects: &PodObjects,
        allocatable: &ResourceList,
    ) -> Result<Vec<objects::File>, String> {
        super::object_files(pod, sources, objects, allocatable).map_err(|e| e.to_string())
    }

    /// An API pod's configMap, secret and kube-api-access volumes: planned with kubelet's
    /// plugins, modes and media, and their files from a snapshot of the objects.
    #[test]
    fn api_pods_get_object_volumes() {
        use std::sync::Arc;

        use k8s_openapi::api::core::v1::ConfigMap;

        use crate::policy::objects::Fetched;
        let p = pod(r#"
metadata: {name: web, namespace: ns, uid: u1}
spec:
  securityContext: {fsGroup: 2000}
  volumes:
  - {name: cfg, configMap: {name: app, defaultMode: 288, items: [{key: a, path: conf/a}]}}
  - {name: sec, secret: {secretName: creds, optional: true}}
  - name: kube-api-access
    projected:
      defaultMode: 272
      sources:
      - serviceAccountToken: {expirationSeconds: 3607, path: token}
      - configMap: {name: kube-root-ca.crt, items: [{key: ca.crt, path: ca.crt}]}
      - downwardAPI: {items: [{path: namespace, fieldRef: {fieldPath: metadata.namespace}}]}
  containers: [{name: c}]
"#);
        assert!(!admit(&p).admitted, "not from the API server");
        assert!(admit_with(&p, true).admitted);
        let vs = plan_with(&p, true).expect("planned");
        let dir = Path::new("/s/pods/u1");
        assert_eq!(
            vs[0].path(dir),
            Some(PathBuf::from(
                "/s/pods/u1/volumes/kubernetes.io~configmap/cfg"
            ))
        );
        assert_eq!(
            vs[1].path(dir),
            Some(PathBuf::from("/s/pods/u1/volumes/kubernetes.io~secret/sec"))
        );
        let media: Vec<bool> = vs
            .iter()
            .map(|v| matches!(v.kind, VolumeKind::Objects { memory: true, .. }))
            .collect();
        assert_eq!(media, [false, true, true], "secrets and projected on tmpfs");
        assert!(vs.iter().all(|v| v.kind.read_only() && v.kind.from_api()));
        let VolumeKind::Objects { sources, .. } = &vs[2].kind else {
            panic!("projected");
        };
        let FileSource::Token(t) = &sources[0] else {
            panic!("token first");
        };
        assert_eq!(
            t.mode, 0o600,
            "fsGroup: 0600, widened by the ownership change"
        );
        assert_eq!(t.token.expiration_seconds, 3607);
        assert_eq!(t.token.service_account, "default");
        let objects = PodObjects {
            api: true,
            namespace: "ns".into(),
            config_maps: BTreeMap::from([
                (
                    "app".to_owned(),
                    Fetched::Found(Arc::new(ConfigMap {
                        data: Some(BTreeMap::from([("a".into(), "1".into())])),
                        ..Default::default()
                    })),
                ),
                (
                    "kube-root-ca.crt".to_owned(),
                    Fetched::Found(Arc::new(ConfigMap {
                        data: Some(BTreeMap::from([("ca.crt".into(), "PEM".into())])),
                        ..Default::default()
                    })),
                ),
            ]),
            secrets: BTreeMap::from([("creds".to_owned(), Fetched::NotFound)]),
            tokens: BTreeMap::from([(t.token.clone(), Ok("jwt".to_owned()))]),
            services: None,
        };
        let files = |i: usize| {
            let VolumeKind::Objects { sources, .. } = &vs[i].kind else {
                panic!("objects");
            };
            object_files(&p, sources, &objects, &BTreeMap::new())
        };
        assert_eq!(files(0), Ok(vec![("conf/a".into(), b"1".to_vec(), 0o440)]));
        assert_eq!(
            files(1),
            Ok(Vec::new()),
            "an optional secret that is missing"
        );
        assert_eq!(
            files(2),
            Ok(vec![
                ("token".into(), b"jwt".to_vec(), 0o600),
                ("ca.crt".into(), b"PEM".to_vec(), 0o420),
                ("namespace".into(), b"ns".to_vec(), 0o420),
            ])
        );
        // A failing token and a missing configMap: both named.
        let mut broken = objects.clone();
        broken
            .tokens
            .insert(t.token.clone(), Err("failed to fetch token: 403".into()));
        broken
            .config_maps
            .insert("kube-root-ca.crt".into(), Fetched::NotFound);
        let VolumeKind::Objects { sources, .. } = &vs[2].kind else {
            panic!("objects");
        };
        assert_eq!(
            object_files(&p, sources, &broken, &BTreeMap::new()),
            Err("[failed to fetch token: 403, configmaps \"kube-root-ca.crt\" not found]".into())
        );
        // A key that would leave the volume.
        broken.config_maps.insert(
            "app".into(),
            Fetched::Found(Arc::new(ConfigMap {
                data: Some(BTreeMap::from([("..evil".into(), "x".into())])),
                ..Default::default()
            })),
        );
        let all = pod(
            "metadata: {name: w, namespace: ns}\nspec: {volumes: [{name: c, configMap: {name: app}}], containers: [{name: c}]}",
        );
        let vs = plan_with(&all, true).expect("planned");
        let VolumeKind::Objects { sources, .. } = &vs[0].kind else {
            panic!("objects");
        };
        let e = object_files(&all, sources, &broken, &BTreeMap::new()).expect_err("refused");
        assert!(e.contains("..evil"), "{e}");
        // Hostile object names never reach a URL.
        let hostile = pod(
            "metadata: {name: w}\nspec: {volumes: [{name: c, secret: {secretName: ../../nodes/x}}], containers: [{name: c}]}",
        );
        assert!(!admit_with(&hostile, true).admitted);
    }
}
