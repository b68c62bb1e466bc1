//! The registry's log read into request entries (see [`super`] for what it logs).

use super::PUSH_USER_AGENT;

/// Whether a log entry marks a request's start or its end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessKind {
    /// `authorizing request`: the dispatcher took the request up.
    Started,
    /// `response completed` (or `... with error`, or an auth failure: status 401).
    Completed,
}

/// One request event of a registry's log.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// The line number in the log (1-based): the order of events.
    pub line: usize,
    /// `http.request.id`: the same for a request's `Started` and `Completed`.
    pub id: String,
    pub kind: AccessKind,
    /// `GET`, `HEAD`, `POST`, `PUT`, ...
    pub method: String,
    /// The request URI (path and query).
    pub uri: String,
    /// The repository (`vars.name`, or read from the URI).
    pub repo: Option<String>,
    /// The tag or digest (`vars.reference` / `vars.digest`).
    pub reference: Option<String>,
    /// The response status (`Completed` only).
    pub status: Option<u16>,
    /// Why the request failed, on a failed `Completed`: `err.message: err.detail` of a
    /// "response completed with error", or the auth failure ("basic authentication
    /// challenge for realm ...: invalid authorization credential" without credentials,
    /// "...: authentication failure" with a wrong password).
    pub error: Option<String>,
    /// `http.response.duration` as logged, e.g. `1.27ms` (`Completed` only).
    pub duration: Option<String>,
    /// The log's RFC 3339 time stamp.
    pub time: String,
    /// `http.request.useragent` (containerd says `containerd/1.6.x`).
    pub user_agent: String,
}

/// What a request asked for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    /// `/v2/`
    Base,
    /// `/v2/<repo>/manifests/<ref>`
    Manifest(String),
    /// `/v2/<repo>/blobs/<digest>`
    Blob(String),
    /// `/v2/<repo>/blobs/uploads/...`
    Upload,
    /// anything else (`tags/list`, `_catalog`)
    Other,
}

impl Access {
    pub(super) fn from_json(line: usize, v: &serde_json::Value) -> Option<Self> {
        let s = |k: &str| v.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        let msg = s("msg")?;
        let id = s("http.request.id")?;
        let (kind, status, error) = if msg == "authorizing request" {
            (AccessKind::Started, None, None)
        } else if msg.starts_with("response completed") {
            let status = v
                .get("http.response.status")
                .and_then(serde_json::Value::as_u64)
                .and_then(|n| u16::try_from(n).ok());
            let error = s("err.message").map(|m| match s("err.detail") {
                Some(d) => format!("{m}: {d}"),
                None => m,
            });
            (AccessKind::Completed, status, error)
        } else if let Some(why) = msg.strip_prefix("error authorizing context: ") {
            (AccessKind::Completed, Some(401), Some(why.to_owned()))
        } else {
            return None;
        };
        let uri = s("http.request.uri").unwrap_or_default();
        Some(Self {
            line,
            id,
            kind,
            method: s("http.request.method").unwrap_or_default(),
            repo: s("vars.name").or_else(|| repo_of_uri(&uri)),
            reference: s("vars.reference").or_else(|| s("vars.digest")),
            uri,
            status,
            error,
            duration: s("http.response.duration"),
            time: s("time").unwrap_or_default(),
            user_agent: s("http.request.useragent").unwrap_or_default(),
        })
    }

    /// What the request asked for, from its URI.
    #[must_use]
    pub fn target(&self) -> Target {
        let path = self.uri.split('?').next().unwrap_or_default();
        if path == "/v2/" || path == "/v2" {
            return Target::Base;
        }
        if path.contains("/blobs/uploads") {
            return Target::Upload;
        }
        if let Some((_, r)) = path.rsplit_once("/manifests/") {
            return Target::Manifest(r.to_owned());
        }
        if let Some((_, d)) = path.rsplit_once("/blobs/") {
            return Target::Blob(d.to_owned());
        }
        Target::Other
    }

    /// A request of a pull: `GET` or `HEAD` from anyone but this fixture (containerd says
    /// `containerd/<version>`).
    #[must_use]
    pub fn is_pull(&self) -> bool {
        (self.method == "GET" || self.method == "HEAD") && self.user_agent != PUSH_USER_AGENT
    }

    /// `METHOD uri -> status` (or `METHOD uri ...` when started), for printing.
    #[must_use]
    pub fn summary(&self) -> String {
        match (self.kind, self.status) {
            (AccessKind::Started, _) => {
                format!("{:>5} {} {} ...", self.line, self.method, self.uri)
            }
            (AccessKind::Completed, s) => format!(
                "{:>5} {} {} -> {} ({}){}",
                self.line,
                self.method,
                self.uri,
                s.map_or_else(|| "?".into(), |s| s.to_string()),
                self.duration.as_deref().unwrap_or("-"),
                self.error
                    .as_deref()
                    .map_or_else(String::new, |e| format!(" {e}"))
            ),
        }
    }
}

/// The repository in a `/v2/<repo>/(manifests|blobs|tags)/...` URI (repositories may have
/// slashes).
fn repo_of_uri(uri: &str) -> Option<String> {
    let path = uri.split('?').next()?.strip_prefix("/v2/")?;
    ["/manifests/", "/blobs/", "/tags/"]
        .iter()
        .find_map(|m| path.find(m).map(|i| path[..i].to_owned()))
}

/// The first `Started` line of a pull request ([`Access::is_pull`]) for `repo`.
#[must_use]
pub fn first_start(log: &[Access], repo: &str) -> Option<usize> {
    log.iter()
        .find(|a| a.kind == AccessKind::Started && a.is_pull() && a.repo.as_deref() == Some(repo))
        .map(|a| a.line)
}

/// The last `Completed` line of a blob `GET` of `repo` by a puller (a pull's end).
#[must_use]
pub fn last_blob_completion(log: &[Access], repo: &str) -> Option<usize> {
    log.iter()
        .rev()
        .find(|a| {
            a.kind == AccessKind::Completed
                && a.method == "GET"
                && a.is_pull()
                && a.repo.as_deref() == Some(repo)
                && matches!(a.target(), Target::Blob(_))
        })
        .map(|a| a.line)
}

/// Whether the pull of `second` began before the pull of `first` ended: `second`'s first
/// request arrived before `first`'s last blob `GET` completed.
#[must_use]
pub fn overlapped(log: &[Access], first: &str, second: &str) -> bool {
    match (first_start(log, second), last_blob_completion(log, first)) {
        (Some(start), Some(end)) => start < end,
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_lines_become_accesses() {
        let started = serde_json::json!({
            "http.request.id": "a", "http.request.method": "HEAD",
            "http.request.uri": "/v2/lib/app/manifests/v1", "level": "debug",
            "msg": "authorizing request", "vars.name": "lib/app", "vars.reference": "v1",
            "time": "t0",
        });
        let done = serde_json::json!({
            "http.request.id": "b", "http.request.method": "GET",
            "http.request.uri": "/v2/lib/app/blobs/sha256:ab", "level": "info",
            "msg": "response completed", "http.response.status": 200,
            "http.response.duration": "1ms", "time": "t1",
        });
        let denied = serde_json::json!({
            "http.request.id": "c", "http.request.method": "GET", "http.request.uri": "/v2/",
            "msg": "error authorizing context: basic authentication challenge",
        });
        let other = serde_json::json!({ "http.request.id": "d", "msg": "GetImageManifest" });
        let a = Access::from_json(1, &started).expect("started");
        assert_eq!(a.kind, AccessKind::Started);
        assert_eq!(a.repo.as_deref(), Some("lib/app"));
        assert_eq!(a.target(), Target::Manifest("v1".into()));
        let b = Access::from_json(2, &done).expect("done");
        assert_eq!((b.kind, b.status), (AccessKind::Completed, Some(200)));
        assert_eq!(b.repo.as_deref(), Some("lib/app"), "repo read from the URI");
        assert_eq!(b.target(), Target::Blob("sha256:ab".into()));
        let c = Access::from_json(3, &denied).expect("denied");
        assert_eq!(
            (c.kind, c.status, c.target()),
            (AccessKind::Completed, Some(401), Target::Base)
        );
        assert_eq!(c.error.as_deref(), Some("basic authentication challenge"));
        assert!(Access::from_json(4, &other).is_none());
        let log = vec![a, b];
        assert_eq!(first_start(&log, "lib/app"), Some(1));
        assert_eq!(last_blob_completion(&log, "lib/app"), Some(2));
    }

    #[test]
    fn overlap_is_read_from_line_order() {
        let ev = |line, repo: &str, kind, uri: &str| Access {
            line,
            id: line.to_string(),
            kind,
            method: "GET".into(),
            uri: uri.into(),
            repo: Some(repo.into()),
            reference: None,
            status: (kind == AccessKind::Completed).then_some(200),
            error: None,
            duration: None,
            time: String::new(),
            user_agent: String::new(),
        };
        use AccessKind::{Completed, Started};
        let serial = vec![
            ev(1, "a", Started, "/v2/a/blobs/sha256:1"),
            ev(2, "a", Completed, "/v2/a/blobs/sha256:1"),
            ev(3, "b", Started, "/v2/b/manifests/t"),
        ];
        assert!(!overlapped(&serial, "a", "b"));
        let parallel = vec![
            ev(1, "a", Started, "/v2/a/blobs/sha256:1"),
            ev(2, "b", Started, "/v2/b/manifests/t"),
            ev(3, "a", Completed, "/v2/a/blobs/sha256:1"),
        ];
        assert!(overlapped(&parallel, "a", "b"));
    }
}
