//! Image references as kubelet reads them: `applyDefaultImageTag` (`images/image_manager.go`)
//! on the grammar of `github.com/distribution/reference` (`ParseNormalizedNamed`).
//!
//! `[domain[:port]/]path-component[/path-component...][:tag][@algorithm:hex]`: a first
//! component is the domain when it holds a `.` or a `:` or is `localhost`; path components
//! are lowercase `[a-z0-9]+` joined by `.`, `_`, `__` or dashes; a tag is `\w[\w.-]{0,127}`;
//! the name is at most 255 characters.

/// Why a reference does not parse (distribution's error texts).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ReferenceError {
    #[error("invalid reference format")]
    InvalidFormat,
    #[error("invalid reference format: repository name ({0}) must be lowercase")]
    Uppercase(String),
    #[error("repository name must have at least one component")]
    Empty,
    #[error("repository name must not be more than 255 characters")]
    TooLong,
    #[error("invalid repository name ({0}), cannot specify 64-byte hexadecimal strings")]
    Hex64(String),
}

/// A parsed reference.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference<'a> {
    /// The registry host (`docker.io` when the reference names none).
    pub domain: &'a str,
    /// The repository path, without the domain.
    pub path: &'a str,
    pub tag: Option<&'a str>,
    pub digest: Option<&'a str>,
}

fn is_path_component(s: &str) -> bool {
    // [a-z0-9]+ (separator [a-z0-9]+)* where a separator is '.', '_', '__' or '-'+.
    let b = s.as_bytes();
    let alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &s[start..i];
        let ok = sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|c| c == b'-');
        if !ok {
            return false;
        }
    }
    true
}

fn is_domain(s: &str) -> bool {
    let (host, port) = match s.rsplit_once(':') {
        Some((h, p)) if !h.contains(']') || h.ends_with(']') => (h, Some(p)),
        _ => (s, None),
    };
    if port.is_some_and(|p| p.is_empty() || !p.bytes().all(|c| c.is_ascii_digit())) {
        return false;
    }
    if let Some(v6) = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')) {
        return !v6.is_empty() && v6.bytes().all(|c| c.is_ascii_hexdigit() || c == b':');
    }
    !host.is_empty()
        && host.split('.').all(|label| {
            let b = label.as_bytes();
            !b.is_empty()
                && b[0].is_ascii_alphanumeric()
                && b[b.len() - 1].is_ascii_alphanumeric()
                && b.iter().all(|c| c.is_ascii_alphanumeric() || *c == b'-')
        })
}

fn is_tag(s: &str) -> bool {
    let b = s.as_bytes();
    let word = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    !b.is_empty()
        && b.len() <= 128
        && word(b[0])
        && b.iter().all(|&c| word(c) || c == b'.' || c == b'-')
}

fn is_digest(s: &str) -> bool {
    let Some((algo, hex)) = s.split_once(':') else {
        return false;
    };
    let algo_ok = !algo.is_empty()
        && algo.as_bytes()[0].is_ascii_alphabetic()
        && algo
            .bytes()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'+' | b'.'));
    algo_ok && hex.len() >= 32 && hex.bytes().all(|c| c.is_ascii_hexdigit())
}

/// Parses `image` as `ParseNormalizedNamed` does.
pub fn parse(image: &str) -> Result<Reference<'_>, ReferenceError> {
    if image.is_empty() {
        return Err(ReferenceError::InvalidFormat);
    }
    let (rest, digest) = match image.split_once('@') {
        Some((r, d)) => {
            if !is_digest(d) {
                return Err(ReferenceError::InvalidFormat);
            }
            (r, Some(d))
        }
        None => (image, None),
    };
    // A tag is after the last ':' that follows the last '/'.
    let last_slash = rest.rfind('/').map_or(0, |i| i + 1);
    let (name, tag) = match rest[last_slash..].rfind(':') {
        Some(i) => (&rest[..last_slash + i], Some(&rest[last_slash + i + 1..])),
        None => (rest, None),
    };
    if tag.is_some_and(|t| !is_tag(t)) {
        return Err(ReferenceError::InvalidFormat);
    }
    if name.is_empty() {
        return Err(ReferenceError::Empty);
    }
    let (domain, path) = match name.split_once('/') {
        Some((first, rest))
            if first.contains(['.', ':'])
                || first == "localhost"
                || first.to_lowercase() != first =>
        {
            (first, rest)
        }
        _ => ("docker.io", name),
    };
    if domain == "docker.io" && path.len() == 64 && path.bytes().all(|c| c.is_ascii_hexdigit()) {
        return Err(ReferenceError::Hex64(path.to_owned()));
    }
    if path.to_lowercase() != path {
        let remote = if domain == "docker.io" && !path.contains('/') {
            format!("library/{path}")
        } else {
            path.to_owned()
        };
        return Err(ReferenceError::Uppercase(remote));
    }
    if !is_domain(domain) || path.split('/').any(|c| !is_path_component(c)) {
        return Err(ReferenceError::InvalidFormat);
    }
    if name.len() > 255 {
        return Err(ReferenceError::TooLong);
    }
    Ok(Reference {
        domain,
        path,
        tag,
        digest,
    })
}

/// `applyDefaultImageTag`: the image with `:latest` when it has neither a tag nor a digest;
/// otherwise as written.
pub fn with_default_tag(image: &str) -> Result<String, ReferenceError> {
    let r = parse(image)?;
    if r.tag.is_none() && r.digest.is_none() {
        return Ok(format!("{image}:latest"));
    }
    Ok(image.to_owned())
}

/// kubelet's event and message for a reference that does not parse.
#[must_use]
pub fn invalid_name_message(image: &str, e: &ReferenceError) -> String {
    format!(
        "Failed to apply default image tag \"{image}\": couldn't parse image name \"{image}\": {e}"
    )
}
