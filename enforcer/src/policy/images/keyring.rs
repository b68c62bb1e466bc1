//! Pull credentials as kubelet finds them (`pkg/credentialprovider`): docker config
//! documents (`.dockerconfigjson` `{"auths": {...}}` and the older `.dockercfg` map), each
//! entry's key a registry URL with an optional scheme and path and `*` globs per host label;
//! `Lookup(image)` returns every entry whose key matches the image, in reverse lexical order
//! of the keys (the most specific path first), then the default registry's entry for a
//! Docker Hub image. A pod's `imagePullSecrets` come before the node's own file
//! (`MakeDockerKeyring`: the secrets' keyring, then the default one).

use std::collections::BTreeMap;

/// One credential (`credentialprovider.AuthConfig`, as CRI's `AuthConfig` carries it).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Credential {
    pub username: String,
    pub password: String,
    /// The registry key it was found under, without scheme.
    pub server_address: String,
}

/// Why a docker config document does not parse.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum KeyringError {
    #[error("{source_name}: not a docker config (JSON object expected): {message}")]
    Json {
        source_name: String,
        message: String,
    },
    #[error("{source_name}: entry {key:?}: auth is not base64 of user:password")]
    Auth { source_name: String, key: String },
}

/// The credentials from docker config documents, by normalized key.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Keyring {
    creds: BTreeMap<String, Vec<Credential>>,
}

fn b64_decode(s: &str) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(s.len() * 3 / 4);
    let mut acc = 0u32;
    let mut bits = 0u32;
    for c in s.trim_end_matches('=').bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' | b'-' => 62,
            b'/' | b'_' => 63,
            _ => return None,
        };
        acc = (acc << 6) | u32::from(v);
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push(u8::try_from((acc >> bits) & 0xff).ok()?);
        }
    }
    Some(out)
}

/// A key or an image as a schemeless URL: `(host, path)`; `/v1/` and `/v2/` path prefixes of
/// keys are dropped as kubelet drops them.
fn host_and_path(key: &str) -> (String, String) {
    let rest = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    let (host, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, ""),
    };
    let path = path
        .strip_prefix("/v2")
        .or_else(|| path.strip_prefix("/v1"))
        .filter(|p| p.starts_with('/'))
        .unwrap_or(path);
    let path = if path == "/" { "" } else { path };
    (host.to_owned(), path.to_owned())
}

/// `filepath.Match` for one host label with `*` and `?` (no character classes).
fn glob(pattern: &[u8], s: &[u8]) -> bool {
    match (pattern.first(), s.first()) {
        (None, None) => true,
        (Some(b'*'), _) => glob(&pattern[1..], s) || (!s.is_empty() && glob(pattern, &s[1..])),
        (Some(b'?'), Some(_)) => glob(&pattern[1..], &s[1..]),
        (Some(p), Some(c)) if p == c => glob(&pattern[1..], &s[1..]),
        _ => false,
    }
}

fn split_port(host: &str) -> (&str, &str) {
    match host.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|c| c.is_ascii_digit()) => (h, p),
        _ => (host, ""),
    }
}

/// `URLsMatch`: same port, the same number of host labels each matching its glob, and the
/// key's path a prefix of the image's.
fn matches(key: &str, image: &str) -> bool {
    let (khost, kpath) = host_and_path(key);
    let (ihost, ipath) = host_and_path(image);
    let ((kh, kp), (ih, ip)) = (split_port(&khost), split_port(&ihost));
    if kp != ip {
        return false;
    }
    let (kl, il): (Vec<&str>, Vec<&str>) = (kh.split('.').collect(), ih.split('.').collect());
    kl.len() == il.len()
        && kl
            .iter()
            .zip(&il)
            .all(|(k, i)| glob(k.as_bytes(), i.as_bytes()))
        && ipath.starts_with(&kpath)
}

/// The Docker Hub host kubelet files default-registry credentials under.
const DEFAULT_REGISTRY_HOST: &str = "index.docker.io";

impl Keyring {
    /// Adds the entries of one docker config document (`{"auths": {...}}` or the bare map).
    /// `source_name` names it in errors (the Secret or the file).
    pub fn add_document(&mut self, source_name: &str, text: &[u8]) -> Result<(), KeyringError> {
        let value: serde_json::Value =
            serde_json::from_slice(text).map_err(|e| KeyringError::Json {
                source_name: source_name.to_owned(),
                message: e.to_string(),
            })?;
        let entries = match value.get("auths") {
            Some(serde_json::Value::Object(m)) => m.clone(),
            _ => match value {
                serde_json::Value::Object(m) => m,
                other => {
                    return Err(KeyringError::Json {
                        source_name: source_name.to_owned(),
                        message: format!("found {other}"),
                    });
                }
            },
        };
        for (key, entry) in entries {
            let field = |name: &str| {
                entry
                    .get(name)
                    .and_then(serde_json::Value::as_str)
                    .unwrap_or_default()
                    .to_owned()
            };
            let (mut username, mut password) = (field("username"), field("password"));
            let auth = field("auth");
            if !auth.is_empty() {
                let decoded = b64_decode(&auth)
                    .and_then(|b| String::from_utf8(b).ok())
                    .ok_or_else(|| KeyringError::Auth {
                        source_name: source_name.to_owned(),
                        key: key.clone(),
                    })?;
                let (u, p) = decoded.split_once(':').ok_or_else(|| KeyringError::Auth {
                    source_name: source_name.to_owned(),
                    key: key.clone(),
                })?;
                username = u.to_owned();
                password = p.to_owned();
            }
            let (host, path) = host_and_path(&key);
            let normalized = format!("{host}{path}");
            self.creds
                .entry(normalized.clone())
                .or_default()
                .push(Credential {
                    username,
                    password,
                    server_address: normalized,
                });
        }
        Ok(())
    }

    /// Whether there is no credential at all.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.creds.is_empty()
    }

    /// `Lookup(repo)`: the credentials for an image's repository (kubelet looks up the
    /// normalized name, `docker.io/library/busybox` for `busybox`: [`repository`]), the most
    /// specific key first; Docker Hub's entry for a Docker Hub image nothing else matched.
    #[must_use]
    pub fn lookup(&self, repo: &str) -> Vec<Credential> {
        let mut out = Vec::new();
        for (key, creds) in self.creds.iter().rev() {
            if matches(key, repo) {
                out.extend(creds.iter().cloned());
            }
        }
        if out.is_empty()
            && is_default_registry(repo)
            && let Some(c) = self.creds.get(DEFAULT_REGISTRY_HOST)
        {
            out.extend(c.iter().cloned());
        }
        out
    }
}

/// `isDefaultRegistryMatch`.
fn is_default_registry(image: &str) -> bool {
    match image.split_once('/') {
        _ if image.is_empty() => false,
        None => true,
        Some(("", _)) => false,
        Some((first, _)) => {
            first == "docker.io" || first == DEFAULT_REGISTRY_HOST || !first.contains(['.', ':'])
        }
    }
}

/// The repository kubelet looks credentials up for: the normalized name without tag or
/// digest (`busybox:1` -> `docker.io/library/busybox`); the image as written when it does not
/// parse.
#[must_use]
pub fn repository(image: &str) -> String {
    match super::reference::parse(image) {
        Ok(r) if r.domain == "docker.io" && !r.path.contains('/') => {
            format!("docker.io/library/{}", r.path)
        }
        Ok(r) => format!("{}/{}", r.domain, r.path),
        Err(_) => image.to_owned(),
    }
}

/// `UnionDockerKeyring.Lookup`: each keyring's credentials in turn (the pod's secrets first,
/// then the node's).
#[must_use]
pub fn lookup_all(keyrings: &[&Keyring], image: &str) -> Vec<Credential> {
    let repo = repository(image);
    keyrings.iter().flat_map(|k| k.lookup(&repo)).collect()
}
