//! The programs' rare diagnostics (a kernel field that cannot be read, a record lost to a full
//! ring, a level map without its entry), written by aya-log in the kernel, into the daemon's
//! tracing. The programs log only where they also count (the pipeline's kernel counters), at
//! the 1st, 2nd, 4th, 8th... occurrence per CPU, always at debug level: the daemon's filter
//! (`RUST_LOG`, or `PUT /debug/flags/v` at run time) decides whether they are printed.

/// The tracing target of the programs' records (`RUST_LOG=enforcer::ebpf=debug`).
pub const TARGET: &str = "enforcer::ebpf";

/// aya-log's records (through the `log` facade) as tracing events of [`TARGET`], at the
/// level the program gave and with its source line.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgramLog;

impl log::Log for ProgramLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, r: &log::Record<'_>) {
        let at = format!("{}:{}", r.file().unwrap_or("?"), r.line().unwrap_or(0));
        let msg = r.args();
        match r.level() {
            log::Level::Error => tracing::error!(target: TARGET, program = %at, "{msg}"),
            log::Level::Warn => tracing::warn!(target: TARGET, program = %at, "{msg}"),
            log::Level::Info => tracing::info!(target: TARGET, program = %at, "{msg}"),
            log::Level::Debug => tracing::debug!(target: TARGET, program = %at, "{msg}"),
            log::Level::Trace => tracing::trace!(target: TARGET, program = %at, "{msg}"),
        }
    }

    fn flush(&self) {}
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use log::Log as _;

    use super::*;

    /// What tracing prints, under `filter`, of one program record at debug level.
    fn printed(filter: &str, file: Option<&'static str>, line: Option<u32>, msg: &str) -> String {
        let out = tempfile::NamedTempFile::new().expect("temp file");
        let sub = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(Mutex::new(out.reopen().expect("reopen")))
            .with_ansi(false)
            .finish();
        tracing::subscriber::with_default(sub, || {
            ProgramLog.log(
                &log::Record::builder()
                    .level(log::Level::Debug)
                    .file(file)
                    .line(line)
                    .args(format_args!("{msg}"))
                    .build(),
            );
        });
        std::fs::read_to_string(out.path()).unwrap_or_default()
    }

    #[test]
    fn a_program_record_becomes_a_tracing_event_of_the_target_at_its_level() {
        let msg = "crossing check: a kernel read at offset 256 faulted";
        let out = printed(
            "enforcer::ebpf=debug",
            Some("src/crossing.rs"),
            Some(47),
            msg,
        );
        assert!(out.contains("DEBUG"), "{out}");
        assert!(out.contains("enforcer::ebpf"), "{out}");
        assert!(out.contains("program=src/crossing.rs:47"), "{out}");
        assert!(out.contains(msg), "{out}");
    }

    #[test]
    fn at_the_default_info_filter_the_programs_debug_lines_are_not_printed() {
        assert_eq!(printed("info", None, None, "SIGNALS ring buffer full"), "");
    }
}
