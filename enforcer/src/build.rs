//! What this binary is: its version and the commit it was built from (`build.rs` reads the
//! commit from git, or `ENFORCER_COMMIT` for a build from a source archive).

/// The crate's version.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the binary was built from (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("ENFORCER_COMMIT");

/// `enforcer --version`'s text after the name: `0.1.0 (commit 0123456789ab)`.
pub const VERSION_LINE: &str = env!("ENFORCER_VERSION_LINE");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_line_carries_the_version_and_the_commit() {
        assert_eq!(VERSION_LINE, format!("{VERSION} (commit {COMMIT})"));
        assert!(
            COMMIT == "unknown"
                || (COMMIT.len() == 12 && COMMIT.chars().all(|c| c.is_ascii_hexdigit())),
            "{COMMIT}"
        );
    }
}
