//! `GET /containerLogs/{namespace}/{pod}/{container}` (kubelet's `getContainerLogs` and the
//! CRI log reader, `cri-client/pkg/logs`): the container's CRI log file (`<timestamp>
//! <stream> <P|F> <content>` lines) with `follow`, `tailLines` (`tail`), `sinceSeconds`,
//! `sinceTime`, `timestamps`, `previous` and `limitBytes`, validated as kubelet validates
//! `PodLogOptions` (400 `{"message": "Unable to decode query."}`, 422 `{"message": "Invalid
//! request."}`). `tailLines` is found by reading the file backwards, so a huge value costs
//! what the file holds; a follow ends once the container is no longer running and the file
//! is drained.

use std::{
    io::{Read as _, Seek as _, SeekFrom},
    path::PathBuf,
    time::Duration,
};

use axum::{
    body::Body,
    extract::{Path, RawQuery, State},
    http::{StatusCode, header},
    response::{IntoResponse, Response},
};
use k8s_cri::v1 as cri;
use k8s_openapi::jiff::Timestamp;

use super::Shared;
use crate::{cri::ContainerRuntime as _, policy::pod_status::ContainerState};

/// `PodLogOptions` as the reader uses them.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LogOptions {
    pub follow: bool,
    pub previous: bool,
    pub timestamps: bool,
    pub tail_lines: Option<u64>,
    pub limit_bytes: Option<u64>,
    /// Nanoseconds since the epoch; older lines are skipped.
    pub since_nanos: Option<i128>,
}

/// Why a query is refused: 400 (undecodable) or 422 (invalid), kubelet's bodies.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum QueryError {
    Decode,
    Invalid(String),
}

fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'+' => out.push(b' '),
            b'%' if i + 2 < b.len() => match u8::from_str_radix(&s[i + 1..i + 3], 16) {
                Ok(v) => {
                    out.push(v);
                    i += 2;
                }
                Err(_) => out.push(b'%'),
            },
            c => out.push(c),
        }
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The query's pairs, decoded.
#[must_use]
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    query
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| match p.split_once('=') {
            Some((k, v)) => (percent_decode(k), percent_decode(v)),
            None => (percent_decode(p), String::new()),
        })
        .collect()
}

/// `PodLogOptions` from the query, at `now` (nanoseconds since the epoch).
pub fn parse_options(query: &str, now_nanos: i128) -> Result<LogOptions, QueryError> {
    let pairs = query_pairs(query);
    let get = |k: &str| {
        pairs
            .iter()
            .rev()
            .find(|(n, _)| n == k)
            .map(|(_, v)| v.as_str())
    };
    // Present: true unless "0" or "false" (the parameter codec's bools).
    let flag = |k: &str| get(k).is_some_and(|v| !(v == "0" || v.eq_ignore_ascii_case("false")));
    let int = |k: &str| -> Result<Option<i64>, QueryError> {
        get(k).map_or(Ok(None), |v| {
            v.parse::<i64>().map(Some).map_err(|_| QueryError::Decode)
        })
    };
    let mut tail = int("tailLines")?;
    match get("tail") {
        Some("all") => tail = None,
        Some(v) => tail = Some(v.parse::<i64>().map_err(|_| QueryError::Decode)?),
        None => {}
    }
    let since_seconds = int("sinceSeconds")?;
    let limit = int("limitBytes")?;
    let since_time = match get("sinceTime") {
        None => None,
        Some(v) => Some(
            v.parse::<Timestamp>()
                .map_err(|_| QueryError::Decode)?
                .as_nanosecond(),
        ),
    };
    if tail.is_some_and(|t| t < 0) {
        return Err(QueryError::Invalid(
            "tailLines: must be greater than or equal to 0".into(),
        ));
    }
    if limit.is_some_and(|l| l < 1) {
        return Err(QueryError::Invalid(
            "limitBytes: must be greater than 0".into(),
        ));
    }
    if since_seconds.is_some() && since_time.is_some() {
        return Err(QueryError::Invalid(
            "at most one of `sinceTime` or `sinceSeconds` may be specified".into(),
        ));
    }
    if since_seconds.is_some_and(|s| s < 1) {
        return Err(QueryError::Invalid(
            "sinceSeconds: must be greater than 0".into(),
        ));
    }
    let since_nanos =
        since_time.or_else(|| since_seconds.map(|s| now_nanos - i128::from(s) * 1_000_000_000));
    Ok(LogOptions {
        follow: flag("follow"),
        previous: flag("previous"),
        timestamps: flag("timestamps"),
        tail_lines: tail.and_then(|t| u64::try_from(t).ok()),
        limit_bytes: limit.and_then(|l| u64::try_from(l).ok()),
        since_nanos,
    })
}

/// One CRI log line: its time, and its content with `\n` unless partial.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogLine {
    pub timestamp: Timestamp,
    pub partial: bool,
    pub content: Vec<u8>,
}

/// Parses `<RFC3339Nano> <stdout|stderr> <tags> <content>` (without its `\n`).
#[must_use]
pub fn parse_line(line: &[u8]) -> Option<LogLine> {
    let mut parts = line.splitn(4, |b| *b == b' ');
    let ts = std::str::from_utf8(parts.next()?)
        .ok()?
        .parse::<Timestamp>()
        .ok()?;
    let stream = parts.next()?;
    if stream != b"stdout" && stream != b"stderr" {
        return None;
    }
    let tags = parts.next()?;
    let partial = tags.split(|b| *b == b':').next() == Some(b"P");
    let mut content = parts.next().unwrap_or_default().to_vec();
    if !partial {
        content.push(b'\n');
    }
    Some(LogLine {
        timestamp: ts,
        partial,
        content,
    })
}

/// The offset of the `n`-th line from the end (newline-terminated lines; an unterminated
/// last line does not count), read backwards in blocks.
pub fn tail_start(f: &mut std::fs::File, n: u64) -> std::io::Result<u64> {
    let len = f.metadata()?.len();
    if n == 0 {
        return Ok(len);
    }
    let mut pos = len;
    let mut count = 0u64;
    let mut buf = vec![0u8; 64 * 1024];
    while pos > 0 {
        let take = usize::try_from(pos.min(buf.len() as u64)).unwrap_or(buf.len());
        pos -= take as u64;
        f.seek(SeekFrom::Start(pos))?;
        f.read_exact(&mut buf[..take])?;
        // Each newline ends a line; the (n+1)-th from the end is where the last n begin.
        for i in (0..take).rev().filter(|&i| buf[i] == b'\n') {
            count += 1;
            if count > n {
                return Ok(pos + i as u64 + 1);
            }
        }
    }
    Ok(0)
}

/// The reader's state across lines (a partial line's continuation gets no timestamp).
#[derive(Debug)]
pub struct Writer {
    opts: LogOptions,
    new_line: bool,
    remaining: Option<u64>,
    emitted: u64,
}

impl Writer {
    #[must_use]
    pub fn new(opts: LogOptions) -> Self {
        Self {
            remaining: opts.limit_bytes,
            opts,
            new_line: true,
            emitted: 0,
        }
    }

    /// The bytes to send for one line, and whether the reader is done.
    pub fn line(&mut self, l: &LogLine) -> (Vec<u8>, bool) {
        if self
            .opts
            .since_nanos
            .is_some_and(|s| l.timestamp.as_nanosecond() < s)
        {
            return (Vec::new(), false);
        }
        let mut out = Vec::new();
        if self.opts.timestamps && self.new_line {
            out.extend_from_slice(format!("{:.9} ", l.timestamp).as_bytes());
        }
        out.extend_from_slice(&l.content);
        self.new_line = !l.partial;
        self.emitted += 1;
        let mut done = false;
        if let Some(r) = self.remaining.as_mut() {
            let n = out.len() as u64;
            if n >= *r {
                out.truncate(usize::try_from(*r).unwrap_or(out.len()));
                *r = 0;
                done = true;
            } else {
                *r -= n;
            }
        }
        // Not following, a tail is a bounded read.
        if !self.opts.follow && self.opts.tail_lines.is_some_and(|t| self.emitted >= t) {
            done = true;
        }
        (out, done)
    }
}

fn message(status: StatusCode, body: &str) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/plain; charset=utf-8")],
        body.to_owned(),
    )
        .into_response()
}

/// The container id to read: the running (or last) instance, or with `previous` the one
/// before it.
async fn container_id(
    s: &Shared,
    uid: &str,
    pod: &str,
    c: &crate::policy::pod_status::ContainerRecord,
    previous: bool,
) -> Result<String, Response> {
    let bad = |m: String| message(StatusCode::BAD_REQUEST, &m);
    let current = c
        .container_id
        .split_once("://")
        .map_or(c.container_id.as_str(), |(_, id)| id)
        .to_owned();
    if previous {
        let Some(rt) = &s.sources.runtime else {
            return Err(bad(format!(
                "previous terminated container {:?} in pod {pod:?} not found",
                c.name
            )));
        };
        let filter = cri::ContainerFilter {
            label_selector: [
                (crate::cri::spec::POD_UID_LABEL.to_owned(), uid.to_owned()),
                (
                    crate::cri::spec::CONTAINER_NAME_LABEL.to_owned(),
                    c.name.clone(),
                ),
            ]
            .into(),
            ..Default::default()
        };
        let mut list = rt.list_containers(filter).await.unwrap_or_default();
        list.retain(|x| x.id != current);
        list.sort_by_key(|x| std::cmp::Reverse(x.created_at));
        return list.first().map(|x| x.id.clone()).ok_or_else(|| {
            bad(format!(
                "previous terminated container {:?} in pod {pod:?} not found",
                c.name
            ))
        });
    }
    if current.is_empty() {
        let why = match &c.state {
            ContainerState::Waiting { reason, .. } if reason == "ErrImagePull" => {
                ": image can't be pulled".to_owned()
            }
            ContainerState::Waiting { reason, .. } if reason == "ImagePullBackOff" => {
                ": trying and failing to pull image".to_owned()
            }
            ContainerState::Waiting { reason, .. } if !reason.is_empty() => format!(": {reason}"),
            _ => " - no logs yet".to_owned(),
        };
        return Err(bad(format!(
            "container {:?} in pod {pod:?} is waiting to start{why}",
            c.name
        )));
    }
    Ok(current)
}

/// The handler.
pub(super) async fn handler(
    State(s): State<Shared>,
    Path((namespace, pod, container)): Path<(String, String, String)>,
    RawQuery(query): RawQuery,
) -> Response {
    let now = Timestamp::now().as_nanosecond();
    let opts = match parse_options(query.as_deref().unwrap_or(""), now) {
        Ok(o) => o,
        Err(QueryError::Decode) => {
            return message(
                StatusCode::BAD_REQUEST,
                r#"{"message": "Unable to decode query."}"#,
            );
        }
        Err(QueryError::Invalid(why)) => {
            tracing::debug!(%why, "containerLogs: invalid options");
            return message(
                StatusCode::UNPROCESSABLE_ENTITY,
                r#"{"message": "Invalid request."}"#,
            );
        }
    };
    let (_, file) = s.sources.status.snapshot();
    let Some(rec) = file
        .pods
        .iter()
        .find(|p| p.namespace == namespace && p.name == pod)
    else {
        return message(
            StatusCode::NOT_FOUND,
            &format!("pod {pod:?} does not exist"),
        );
    };
    let Some(c) = rec
        .container_statuses
        .iter()
        .chain(&rec.init_container_statuses)
        .find(|c| c.name == container)
    else {
        return message(
            StatusCode::NOT_FOUND,
            &format!("container {container:?} not found in pod {pod:?}"),
        );
    };
    let id = match container_id(&s, &rec.uid, &pod, c, opts.previous).await {
        Ok(id) => id,
        Err(r) => return r,
    };
    let Some(rt) = s.sources.runtime.clone() else {
        return message(StatusCode::BAD_REQUEST, "no container runtime");
    };
    let path = match rt.container_status(&id).await {
        Ok(st) if !st.log_path.is_empty() => PathBuf::from(st.log_path),
        Ok(_) => {
            return message(
                StatusCode::BAD_REQUEST,
                &format!("container {container:?} in pod {pod:?} has no log file"),
            );
        }
        Err(e) => {
            return message(
                StatusCode::BAD_REQUEST,
                &format!("unable to retrieve container logs for {id}: {e}"),
            );
        }
    };
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(16);
    tokio::spawn(read_logs(path, opts, id, rt, tx));
    let stream = futures::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|chunk| (Ok::<_, std::io::Error>(bytes::Bytes::from(chunk)), rx))
    });
    Response::builder()
        .status(StatusCode::OK)
        .header(header::CONTENT_TYPE, "text/plain")
        .body(Body::from_stream(stream))
        .unwrap_or_else(|_| message(StatusCode::INTERNAL_SERVER_ERROR, "response"))
}

/// How often a follow looks for new lines, and how often it asks whether the container
/// still runs (kubelet: file events, and a check every second).
const FOLLOW_POLL: Duration = Duration::from_millis(100);
const FOLLOW_CHECK: Duration = Duration::from_secs(1);

async fn read_logs(
    path: PathBuf,
    opts: LogOptions,
    id: String,
    rt: std::sync::Arc<crate::cri::CriRuntime>,
    tx: tokio::sync::mpsc::Sender<Vec<u8>>,
) {
    let fail = |e: String| async {
        let _ = tx.send(e.into_bytes()).await;
    };
    let mut f = match std::fs::File::open(&path) {
        Ok(f) => f,
        Err(e) => return fail(format!("failed to open log file {}: {e}", path.display())).await,
    };
    let start = match opts.tail_lines {
        Some(n) => match tail_start(&mut f, n) {
            Ok(s) => s,
            Err(e) => return fail(format!("{}: {e}", path.display())).await,
        },
        None => 0,
    };
    if f.seek(SeekFrom::Start(start)).is_err() {
        return;
    }
    let mut w = Writer::new(opts.clone());
    let mut pending: Vec<u8> = Vec::new();
    let mut buf = vec![0u8; 32 * 1024];
    let mut last_check = tokio::time::Instant::now();
    let mut running = opts.follow;
    loop {
        let n = match f.read(&mut buf) {
            Ok(n) => n,
            Err(_) => return,
        };
        if n > 0 {
            pending.extend_from_slice(&buf[..n]);
            let mut out = Vec::new();
            let mut done = false;
            while let Some(i) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=i).collect();
                if let Some(l) = parse_line(&line[..line.len() - 1]) {
                    let (bytes, end) = w.line(&l);
                    out.extend_from_slice(&bytes);
                    if end {
                        done = true;
                        break;
                    }
                }
            }
            if !out.is_empty() && tx.send(out).await.is_err() {
                return;
            }
            if done {
                return;
            }
            continue;
        }
        // End of file.
        if !opts.follow || !running {
            // An incomplete last line is still written on a bounded read.
            if !opts.follow
                && let Some(l) = parse_line(&pending)
            {
                let (bytes, _) = w.line(&l);
                let _ = tx.send(bytes).await;
            }
            return;
        }
        if tx.is_closed() {
            return;
        }
        tokio::time::sleep(FOLLOW_POLL).await;
        if last_check.elapsed() >= FOLLOW_CHECK {
            last_check = tokio::time::Instant::now();
            running = matches!(
                rt.container_status(&id).await,
                Ok(st) if st.state == cri::ContainerState::ContainerRunning as i32
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: i128 = 1_700_000_000_000_000_000;

    #[test]
    fn options_as_kubelet_decodes_and_validates_them() {
        let o = parse_options("follow=true&tailLines=5&timestamps&limitBytes=10", NOW)
            .expect("options");
        assert_eq!(
            o,
            LogOptions {
                follow: true,
                timestamps: true,
                tail_lines: Some(5),
                limit_bytes: Some(10),
                ..Default::default()
            }
        );
        assert!(
            !parse_options("follow=0&previous=false", NOW)
                .expect("o")
                .follow
        );
        assert_eq!(parse_options("tail=3", NOW).expect("o").tail_lines, Some(3));
        assert_eq!(
            parse_options("tailLines=3&tail=all", NOW)
                .expect("o")
                .tail_lines,
            None
        );
        assert_eq!(
            parse_options("sinceSeconds=10", NOW)
                .expect("o")
                .since_nanos,
            Some(NOW - 10_000_000_000)
        );
        assert_eq!(
            parse_options("sinceTime=2023-11-14T22%3A13%3A20Z", NOW)
                .expect("o")
                .since_nanos,
            Some(1_700_000_000_000_000_000)
        );
        assert_eq!(parse_options("tailLines=abc", NOW), Err(QueryError::Decode));
        assert_eq!(
            parse_options("sinceTime=yesterday", NOW),
            Err(QueryError::Decode)
        );
        for bad in [
            "tailLines=-1",
            "limitBytes=0",
            "sinceSeconds=0",
            "sinceSeconds=5&sinceTime=2023-11-14T22:13:20Z",
        ] {
            assert!(
                matches!(parse_options(bad, NOW), Err(QueryError::Invalid(_))),
                "{bad}"
            );
        }
        // A huge tail is fine (the reader scans the file backwards).
        assert_eq!(
            parse_options("tailLines=9223372036854775807", NOW)
                .expect("o")
                .tail_lines,
            Some(9_223_372_036_854_775_807)
        );
    }

    fn file(text: &str) -> (tempfile::TempDir, std::fs::File) {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("0.log");
        std::fs::write(&p, text).expect("write");
        let f = std::fs::File::open(&p).expect("open");
        (dir, f)
    }

    fn read_all(text: &str, opts: LogOptions) -> String {
        let (_d, mut f) = file(text);
        let start = opts
            .tail_lines
            .map_or(0, |n| tail_start(&mut f, n).expect("tail"));
        let mut w = Writer::new(opts);
        let mut out = Vec::new();
        let body = &text.as_bytes()[usize::try_from(start).expect("usize")..];
        for line in body.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
            if let Some(l) = parse_line(line) {
                let (b, done) = w.line(&l);
                out.extend(b);
                if done {
                    break;
                }
            }
        }
        String::from_utf8(out).expect("utf8")
    }

    /// logs_test.go's `TestReadLogs` cases: tail, since, timestamps, limitBytes, partial lines.
    #[test]
    fn the_cri_log_reader() {
        let text = "2016-10-06T00:17:09.669794202Z stdout F line one\n\
                    2016-10-06T00:17:10.669794202Z stderr P part \n\
                    2016-10-06T00:17:10.769794202Z stderr F two\n\
                    2016-10-06T00:17:11.0Z stdout F line three\n";
        assert_eq!(
            read_all(text, LogOptions::default()),
            "line one\npart two\nline three\n"
        );
        assert_eq!(
            read_all(
                text,
                LogOptions {
                    tail_lines: Some(1),
                    ..Default::default()
                }
            ),
            "line three\n"
        );
        assert_eq!(
            read_all(
                text,
                LogOptions {
                    tail_lines: Some(2),
                    ..Default::default()
                }
            ),
            "two\nline three\n",
            "a partial line counts as a line"
        );
        assert_eq!(
            read_all(
                text,
                LogOptions {
                    tail_lines: Some(0),
                    ..Default::default()
                }
            ),
            ""
        );
        assert_eq!(
            read_all(
                text,
                LogOptions {
                    tail_lines: Some(1 << 40),
                    ..Default::default()
                }
            ),
            "line one\npart two\nline three\n"
        );
        assert_eq!(
            read_all(
                text,
                LogOptions {
                    timestamps: true,
                    ..Default::default()
                }
            ),
            "2016-10-06T00:17:09.669794202Z line one\n\
             2016-10-06T00:17:10.669794202Z part two\n\
             2016-10-06T00:17:11.000000000Z line three\n"
        );
        assert_eq!(
            read_all(
                text,
                LogOptions {
                    limit_bytes: Some(12),
                    ..Default::default()
                }
            ),
            "line one\npar"
        );
        let since = "2016-10-06T00:17:10.7Z"
            .parse::<Timestamp>()
            .expect("ts")
            .as_nanosecond();
        assert_eq!(
            read_all(
                text,
                LogOptions {
                    since_nanos: Some(since),
                    ..Default::default()
                }
            ),
            "two\nline three\n"
        );
        assert!(parse_line(b"garbage").is_none());
        assert!(parse_line(b"2016-10-06T00:17:09Z stdin F x").is_none());
    }
}
