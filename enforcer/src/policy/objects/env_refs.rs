//! The environment variables a container takes from objects (kubelet's
//! `makeEnvironmentVariables`): `envFrom` sources and `valueFrom` key references.

use super::{ObjectError, ObjectKind, PodObjects, secret_data};

/// Variables (name, value) and the keys skipped as invalid names.
pub type EnvFromVars = (Vec<(String, String)>, Vec<String>);

/// kubelet's (relaxed) environment variable name rule: printable ASCII, no `=`.
#[must_use]
pub fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .bytes()
            .all(|b| (b' '..=b'~').contains(&b) && b != b'=')
}

/// One `envFrom` source's variables (`makeEnvironmentVariables`): each key with the prefix,
/// in key order; keys that are no valid names are skipped and returned apart (kubelet's
/// `InvalidEnvironmentVariableNames` event). A missing optional object gives nothing.
pub fn env_from(
    objects: &PodObjects,
    kind: ObjectKind,
    name: &str,
    prefix: &str,
    optional: bool,
) -> Result<EnvFromVars, ObjectError> {
    let data = match kind {
        ObjectKind::ConfigMap => objects.config_map(name)?.map(|cm| {
            cm.data
                .iter()
                .flatten()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect::<Vec<_>>()
        }),
        ObjectKind::Secret => objects.secret(name)?.map(|s| {
            secret_data(s)
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8_lossy(&v).into_owned()))
                .collect()
        }),
    };
    let Some(data) = data else {
        return if optional {
            Ok((Vec::new(), Vec::new()))
        } else {
            Err(ObjectError::NotFound {
                kind,
                name: name.to_owned(),
            })
        };
    };
    let mut vars = Vec::new();
    let mut invalid = Vec::new();
    for (k, v) in data {
        let k = format!("{prefix}{k}");
        if valid_env_name(&k) {
            vars.push((k, v));
        } else {
            invalid.push(k);
        }
    }
    invalid.sort();
    Ok((vars, invalid))
}

/// One `valueFrom.configMapKeyRef` / `secretKeyRef`: the value, `None` to leave the variable
/// out (an optional object or key that is missing), or kubelet's error.
pub fn env_key(
    objects: &PodObjects,
    kind: ObjectKind,
    name: &str,
    key: &str,
    optional: bool,
) -> Result<Option<String>, ObjectError> {
    let value = match kind {
        ObjectKind::ConfigMap => objects
            .config_map(name)?
            .map(|cm| cm.data.as_ref().and_then(|d| d.get(key)).cloned()),
        ObjectKind::Secret => objects.secret(name)?.map(|s| {
            s.data
                .as_ref()
                .and_then(|d| d.get(key))
                .map(|v| String::from_utf8_lossy(&v.0).into_owned())
        }),
    };
    match value {
        None if optional => Ok(None),
        None => Err(ObjectError::NotFound {
            kind,
            name: name.to_owned(),
        }),
        Some(Some(v)) => Ok(Some(v)),
        Some(None) if optional => Ok(None),
        Some(None) => Err(ObjectError::NoKey {
            kind,
            key: key.to_owned(),
            namespace: objects.namespace.clone(),
            name: name.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::objects::tests::objects;

    /// The error as its text (kubelet's message).
    fn env_key(
        o: &PodObjects,
        kind: ObjectKind,
        name: &str,
        key: &str,
        optional: bool,
    ) -> Result<Option<String>, String> {
        super::env_key(o, kind, name, key, optional).map_err(|e| e.to_string())
    }

    fn env_from(
        o: &PodObjects,
        kind: ObjectKind,
        name: &str,
        prefix: &str,
        optional: bool,
    ) -> Result<EnvFromVars, String> {
        super::env_from(o, kind, name, prefix, optional).map_err(|e| e.to_string())
    }

    #[test]
    fn env_values_as_kubelet() {
        let o = objects();
        use ObjectKind::{ConfigMap as C, Secret as S};
        assert_eq!(env_key(&o, C, "cfg", "a", false), Ok(Some("1".to_owned())));
        assert_eq!(
            env_key(&o, S, "sec", "pw", false),
            Ok(Some("s3cret".to_owned()))
        );
        assert_eq!(
            env_key(&o, C, "cfg", "zz", false),
            Err("couldn't find key zz in ConfigMap ns/cfg".to_owned())
        );
        assert_eq!(
            env_key(&o, S, "sec", "zz", false),
            Err("couldn't find key zz in Secret ns/sec".to_owned())
        );
        assert_eq!(env_key(&o, C, "cfg", "zz", true), Ok(None));
        assert_eq!(env_key(&o, C, "gone", "a", true), Ok(None));
        assert_eq!(
            env_key(&o, C, "gone", "a", false),
            Err("configmaps \"gone\" not found".to_owned())
        );
        assert_eq!(
            env_key(&PodObjects::none("ns"), C, "cfg", "a", false),
            Err("couldn't get configMap ns/cfg, no kubeClient defined".to_owned())
        );
        let (vars, invalid) = env_from(&o, S, "sec", "P_", false).expect("envFrom");
        assert_eq!(vars, [("P_pw".to_owned(), "s3cret".to_owned())]);
        assert_eq!(invalid, ["P_bad=name"]);
        assert_eq!(
            env_from(&o, C, "gone", "", true),
            Ok((Vec::new(), Vec::new()))
        );
        assert!(env_from(&o, C, "gone", "", false).is_err());
    }
}
