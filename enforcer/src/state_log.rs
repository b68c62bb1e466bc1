//! Bounded, rotating logs of JSON lines in the state directory: the node's events
//! (`cluster::event_store`) and its kill records (`kills`).
//!
//! One value per line, appended with one write (a reader sees whole lines, or a last one
//! without its newline while it is being written). Past the bound the file becomes `<name>.1`
//! (the older one goes), so at most twice the bound is kept. A value that changes (an event
//! repeated, a kill whose memory was released) is appended again: readers keep the last line
//! of each key.

use std::{
    fs,
    io::Write as _,
    path::{Path, PathBuf},
};

use serde::{Serialize, de::DeserializeOwned};

/// Errors of a log, each naming its file.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{action} {path}: {source}")]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
}

fn io<'a>(action: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> StoreError + 'a {
    move |source| StoreError::Io {
        action,
        path: path.to_path_buf(),
        source,
    }
}

/// The append end of one log.
#[derive(Debug)]
pub struct LineStore {
    current: PathBuf,
    previous: PathBuf,
    max_bytes: u64,
    file: fs::File,
    size: u64,
}

impl LineStore {
    /// Opens (creating) `dir/name` for appending, each file bounded by `max_bytes`.
    ///
    /// # Errors
    /// The directory or file cannot be created or opened.
    pub fn open(dir: &Path, name: &str, max_bytes: u64) -> Result<Self, StoreError> {
        fs::create_dir_all(dir).map_err(io("creating", dir))?;
        let current = dir.join(name);
        let file = open_append(&current)?;
        let size = file.metadata().map_err(io("reading", &current))?.len();
        Ok(Self {
            previous: dir.join(format!("{name}.1")),
            current,
            max_bytes: max_bytes.max(1),
            file,
            size,
        })
    }

    /// Appends one value (rotating first when the line would pass the bound).
    ///
    /// # Errors
    /// Encoding, writing or rotating failed.
    pub fn append<T: Serialize>(&mut self, value: &T) -> Result<(), StoreError> {
        let mut line = serde_json::to_vec(value).map_err(|e| StoreError::Io {
            action: "encoding a line for",
            path: self.current.clone(),
            source: std::io::Error::other(e),
        })?;
        line.push(b'\n');
        let len = u64::try_from(line.len()).unwrap_or(u64::MAX);
        if self.size > 0 && self.size.saturating_add(len) > self.max_bytes {
            fs::rename(&self.current, &self.previous).map_err(io("rotating", &self.current))?;
            self.file = open_append(&self.current)?;
            self.size = 0;
        }
        self.file
            .write_all(&line)
            .map_err(io("writing", &self.current))?;
        self.size = self.size.saturating_add(len);
        Ok(())
    }
}

fn open_append(path: &Path) -> Result<fs::File, StoreError> {
    fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io("opening", path))
}

/// The values of `dir/name.1` then `dir/name`, in file order, with the count of lines that
/// could not be read (a last line without its newline, being written, is not counted). A
/// missing directory or file holds nothing.
///
/// # Errors
/// A file exists but cannot be read.
pub fn read<T: DeserializeOwned>(dir: &Path, name: &str) -> Result<(Vec<T>, usize), StoreError> {
    let mut out = Vec::new();
    let mut bad = 0;
    for path in [dir.join(format!("{name}.1")), dir.join(name)] {
        let text = match fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io("reading", &path)(e)),
        };
        let complete = text.ends_with(b"\n");
        let lines: Vec<&[u8]> = text.split(|b| *b == b'\n').collect();
        let n = lines.len();
        for (i, line) in lines.into_iter().enumerate() {
            if line.is_empty() {
                continue;
            }
            match serde_json::from_slice::<T>(line) {
                Ok(v) => out.push(v),
                Err(_) if complete || i + 1 < n => bad += 1,
                Err(_) => {}
            }
        }
    }
    Ok((out, bad))
}

/// Keeps the last value of each key, in the order keys first appeared.
pub fn last_by_key<T>(values: Vec<T>, key: impl Fn(&T) -> String) -> Vec<T> {
    let mut order: Vec<String> = Vec::new();
    let mut by: std::collections::HashMap<String, T> = std::collections::HashMap::new();
    for v in values {
        let k = key(&v);
        if by.insert(k.clone(), v).is_none() {
            order.push(k);
        }
    }
    order.into_iter().filter_map(|k| by.remove(&k)).collect()
}

/// A field for a table: control characters (a hostile name or message) shown escaped.
#[must_use]
pub fn cell(s: &str) -> String {
    s.chars()
        .flat_map(|c| {
            if c.is_control() {
                c.escape_default().collect::<Vec<_>>()
            } else {
                vec![c]
            }
        })
        .collect()
}

/// Rows as columns padded to their widest cell (3 spaces between), the last column unpadded.
#[must_use]
pub fn table<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for r in rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: [&str; N]| {
        let mut out = String::new();
        for (i, (c, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == N {
                out.push_str(c);
            } else {
                out.push_str(&format!("{c:<w$}   "));
            }
        }
        out.trim_end().to_owned()
    };
    let mut out = vec![line(header)];
    for r in rows {
        out.push(line(std::array::from_fn(|i| r[i].as_str())));
    }
    out.join("\n")
}
