//! The files of a configMap or secret projected into a volume (kubelet's
//! `configmap.MakePayload`, `secret.MakePayload`).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{ConfigMap, Secret};

use super::{File, ObjectError, ObjectKind, PodObjects};

/// One `items` entry of a configMap or secret projection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyToPath {
    pub key: String,
    pub path: String,
    pub mode: Option<u32>,
}

/// A configMap or secret projected into a volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectProjection {
    pub name: String,
    pub items: Vec<KeyToPath>,
    pub default_mode: u32,
    pub optional: bool,
}

/// The files of one object (`MakePayload`): every key when there are no items, else each
/// item's key at its path (a missing key is an error unless optional).
fn make_payload(
    kind: ObjectKind,
    p: &ObjectProjection,
    data: &BTreeMap<String, Vec<u8>>,
) -> Result<Vec<File>, ObjectError> {
    if p.items.is_empty() {
        return Ok(data
            .iter()
            .map(|(k, v)| (k.clone(), v.clone(), p.default_mode))
            .collect());
    }
    let mut out = Vec::new();
    for i in &p.items {
        let Some(v) = data.get(&i.key) else {
            if p.optional {
                continue;
            }
            return Err(match kind {
                ObjectKind::ConfigMap => ObjectError::NoConfigMapKey(i.key.clone()),
                ObjectKind::Secret => ObjectError::NoSecretKey(i.key.clone()),
            });
        };
        out.push((i.path.clone(), v.clone(), i.mode.unwrap_or(p.default_mode)));
    }
    Ok(out)
}

/// A ConfigMap's keys and values: `data` and `binaryData`.
#[must_use]
pub fn config_map_data(cm: &ConfigMap) -> BTreeMap<String, Vec<u8>> {
    let mut out: BTreeMap<String, Vec<u8>> = cm
        .data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.clone().into_bytes()))
        .collect();
    for (k, v) in cm.binary_data.iter().flatten() {
        out.insert(k.clone(), v.0.clone());
    }
    out
}

/// A Secret's keys and values.
#[must_use]
pub fn secret_data(s: &Secret) -> BTreeMap<String, Vec<u8>> {
    s.data
        .iter()
        .flatten()
        .map(|(k, v)| (k.clone(), v.0.clone()))
        .collect()
}

/// The files of a configMap projection: the object's keys, an empty payload for a missing
/// optional object, or kubelet's error.
pub fn config_map_payload(
    objects: &PodObjects,
    p: &ObjectProjection,
) -> Result<Vec<File>, ObjectError> {
    match objects.config_map(&p.name)? {
        Some(cm) => make_payload(ObjectKind::ConfigMap, p, &config_map_data(cm)),
        None if p.optional => Ok(Vec::new()),
        None => Err(ObjectError::NotFound {
            kind: ObjectKind::ConfigMap,
            name: p.name.clone(),
        }),
    }
}

/// The files of a secret projection (as [`config_map_payload`]).
pub fn secret_payload(
    objects: &PodObjects,
    p: &ObjectProjection,
) -> Result<Vec<File>, ObjectError> {
    match objects.secret(&p.name)? {
        Some(s) => make_payload(ObjectKind::Secret, p, &secret_data(s)),
        None if p.optional => Ok(Vec::new()),
        None => Err(ObjectError::NotFound {
            kind: ObjectKind::Secret,
            name: p.name.clone(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::objects::tests::objects;

    /// The error as its text (kubelet's message).
    fn config_map_payload(o: &PodObjects, p: &ObjectProjection) -> Result<Vec<File>, String> {
        super::config_map_payload(o, p).map_err(|e| e.to_string())
    }

    fn secret_payload(o: &PodObjects, p: &ObjectProjection) -> Result<Vec<File>, String> {
        super::secret_payload(o, p).map_err(|e| e.to_string())
    }

    fn proj(name: &str, items: &[(&str, &str, Option<u32>)], optional: bool) -> ObjectProjection {
        ObjectProjection {
            name: name.to_owned(),
            items: items
                .iter()
                .map(|(k, p, m)| KeyToPath {
                    key: (*k).to_owned(),
                    path: (*p).to_owned(),
                    mode: *m,
                })
                .collect(),
            default_mode: 0o644,
            optional,
        }
    }

    #[test]
    fn payloads_as_make_payload() {
        let o = objects();
        let all = config_map_payload(&o, &proj("cfg", &[], false)).expect("all keys");
        assert_eq!(
            all,
            [
                ("a".to_owned(), b"1".to_vec(), 0o644),
                ("b.txt".to_owned(), b"hello".to_vec(), 0o644),
                ("bin".to_owned(), vec![0, 1, 2], 0o644),
            ]
        );
        let items = config_map_payload(
            &o,
            &proj(
                "cfg",
                &[("a", "dir/a", Some(0o400)), ("b.txt", "b", None)],
                false,
            ),
        )
        .expect("items");
        assert_eq!(
            items,
            [
                ("dir/a".to_owned(), b"1".to_vec(), 0o400),
                ("b".to_owned(), b"hello".to_vec(), 0o644),
            ]
        );
        assert_eq!(
            config_map_payload(&o, &proj("cfg", &[("zz", "z", None)], false)),
            Err("configmap references non-existent config key: zz".to_owned())
        );
        assert_eq!(
            config_map_payload(&o, &proj("cfg", &[("zz", "z", None)], true)),
            Ok(Vec::new())
        );
        assert_eq!(
            config_map_payload(&o, &proj("gone", &[], false)),
            Err("configmaps \"gone\" not found".to_owned())
        );
        assert_eq!(
            config_map_payload(&o, &proj("gone", &[], true)),
            Ok(Vec::new())
        );
        // An error that is not NotFound is never taken for an absent optional object.
        assert_eq!(
            config_map_payload(&o, &proj("broken", &[], true)),
            Err("timed out".to_owned())
        );
        assert_eq!(
            secret_payload(&o, &proj("sec", &[("pw", "pw", Some(0o400))], false)),
            Ok(vec![("pw".to_owned(), b"s3cret".to_vec(), 0o400)])
        );
        assert_eq!(
            secret_payload(&o, &proj("sec", &[("nope", "x", None)], false)),
            Err("references non-existent secret key: nope".to_owned())
        );
        assert_eq!(
            secret_payload(&o, &proj("nosec", &[], false)),
            Err("secrets \"nosec\" not found".to_owned())
        );
        // Standalone: kubelet's message.
        assert_eq!(
            secret_payload(&PodObjects::none("ns"), &proj("sec", &[], false)),
            Err("couldn't get secret ns/sec, no kubeClient defined".to_owned())
        );
    }
}
