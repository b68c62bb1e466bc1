//! Pressure stall information (KEP-4205, `KubeletPSI`, GA in 1.36) of a cgroup v2 cgroup: its
//! `cpu.pressure`, `memory.pressure` and `io.pressure`, as kubelet serves them in
//! `/stats/summary` and cAdvisor's `container_pressure_*` series.
//!
//! Read only where kubelet reads it: on cgroup v2 with the root's `cpu.pressure` present
//! (kubelet's `IsPsiEnabled`; on cgroup v1, or a kernel booted with `psi=0`, nothing is served,
//! not zeros). The figures are the kernel's as written: `total` in microseconds (kubelet copies
//! cAdvisor's raw value into the summary; cAdvisor's series turn it into seconds), `avg*` in
//! percent.

use std::path::Path;

use serde::Serialize;

/// kubelet's `PSIData`: one line of a pressure file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct PsiData {
    pub total: u64,
    pub avg10: f64,
    pub avg60: f64,
    pub avg300: f64,
}

/// kubelet's `PSIStats`: the `full` and `some` lines of a pressure file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct PsiStats {
    pub full: PsiData,
    pub some: PsiData,
}

/// A cgroup's three pressure files; a file that could not be read or parsed is `None`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Pressure {
    pub cpu: Option<PsiStats>,
    pub memory: Option<PsiStats>,
    pub io: Option<PsiStats>,
}

/// Why a pressure file's text was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PsiError {
    #[error("line {line}: {what}")]
    Line { line: usize, what: String },
}

/// A pressure file's text (`some avg10=0.00 avg60=0.00 avg300=0.00 total=0`, then `full ...`),
/// as opencontainers/cgroups' `statPSI` reads it: a line absent (`full` of `cpu.pressure`
/// before Linux 5.13) stays zero; an unknown key is ignored; a line of another kind, or a
/// value that is not a number, is refused naming the line.
pub fn parse(text: &str) -> Result<PsiStats, PsiError> {
    let mut out = PsiStats::default();
    for (i, l) in text.lines().enumerate() {
        let line = i + 1;
        let mut fields = l.split_whitespace();
        let data = match fields.next() {
            None => continue,
            Some("some") => &mut out.some,
            Some("full") => &mut out.full,
            Some(other) => {
                return Err(PsiError::Line {
                    line,
                    what: format!("{other:?} is neither \"some\" nor \"full\""),
                });
            }
        };
        for f in fields {
            let Some((k, v)) = f.split_once('=') else {
                return Err(PsiError::Line {
                    line,
                    what: format!("{f:?} is not key=value"),
                });
            };
            let bad = || PsiError::Line {
                line,
                what: format!("{k}={v:?} is not a number"),
            };
            match k {
                "total" => data.total = v.parse().map_err(|_| bad())?,
                "avg10" => data.avg10 = v.parse().map_err(|_| bad())?,
                "avg60" => data.avg60 = v.parse().map_err(|_| bad())?,
                "avg300" => data.avg300 = v.parse().map_err(|_| bad())?,
                _ => {}
            }
        }
    }
    Ok(out)
}

/// The three pressure files of the cgroup directory `dir`.
#[must_use]
pub fn read(dir: &Path) -> Pressure {
    let one = |file: &str| {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).ok()?;
        parse(&text)
            .inspect_err(|e| tracing::debug!(path = %path.display(), error = %e, "pressure file"))
            .ok()
    };
    Pressure {
        cpu: one("cpu.pressure"),
        memory: one("memory.pressure"),
        io: one("io.pressure"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kernel's format, both lines, copied as written (total in µs, avg in %).
    #[test]
    fn a_pressure_file_is_read_as_the_kernel_wrote_it() {
        let p = parse(
            "some avg10=1.50 avg60=0.25 avg300=0.05 total=123456\nfull avg10=0.75 avg60=0.10 avg300=0.00 total=6543\n",
        )
        .expect("parse");
        assert_eq!(
            p,
            PsiStats {
                some: PsiData {
                    total: 123_456,
                    avg10: 1.5,
                    avg60: 0.25,
                    avg300: 0.05
                },
                full: PsiData {
                    total: 6543,
                    avg10: 0.75,
                    avg60: 0.1,
                    avg300: 0.0
                },
            }
        );
    }

    /// `cpu.pressure` before 5.13 has no `full` line: zero, as opencontainers/cgroups leaves
    /// it; unknown keys are ignored; bad lines are refused naming the line.
    #[test]
    fn a_missing_line_is_zero_and_a_bad_one_named() {
        let p = parse("some avg10=0.00 avg60=0.00 avg300=0.00 total=7 extra=1\n").expect("parse");
        assert_eq!((p.some.total, p.full), (7, PsiData::default()));
        assert_eq!(
            parse("some total=1\npartial avg10=1\n")
                .unwrap_err()
                .to_string(),
            "line 2: \"partial\" is neither \"some\" nor \"full\""
        );
        assert_eq!(
            parse("some total=x\n").unwrap_err().to_string(),
            "line 1: total=\"x\" is not a number"
        );
        assert_eq!(
            parse("full avg10\n").unwrap_err().to_string(),
            "line 1: \"avg10\" is not key=value"
        );
    }

    /// A cgroup directory with two of the three files: the third is `None`.
    #[test]
    fn a_cgroups_files_are_read_each_on_its_own() {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(
            dir.path().join("cpu.pressure"),
            "some avg10=0.00 avg60=0.00 avg300=0.00 total=5\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=2\n",
        )
        .expect("write");
        std::fs::write(dir.path().join("memory.pressure"), "bogus\n").expect("write");
        let p = read(dir.path());
        assert_eq!(p.cpu.map(|c| (c.some.total, c.full.total)), Some((5, 2)));
        assert_eq!((p.memory, p.io), (None, None));
    }
}
