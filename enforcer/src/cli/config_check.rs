//! `enforcer config check [--config FILE] [flags]`: validate and print the effective
//! configuration, thresholds resolved.

use super::CliError;
use crate::config::{self, ConfigArgs};

/// Validates the configuration; returns the effective configuration as pretty JSON and the
/// warnings (for stderr).
pub fn config_check(args: &ConfigArgs) -> Result<(String, Vec<String>), CliError> {
    let loaded = config::load(args)?;
    let c = &loaded.config;
    let mut value = serde_json::to_value(c)
        .map_err(|e| CliError::invalid(std::path::Path::new("configuration"), ".", e))?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert(
            "thresholds".to_owned(),
            serde_json::Value::Array(c.thresholds_json(&c.enforcer.node_capacity)),
        );
    }
    let text = serde_json::to_string_pretty(&value)
        .map_err(|e| CliError::invalid(std::path::Path::new("configuration"), ".", e))?;
    Ok((text, loaded.warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_resolved_thresholds() {
        let args = ConfigArgs {
            eviction_hard: vec!["memory.available<50%".into()],
            node_capacity: vec!["memory=2Gi".into()],
            ..ConfigArgs::default()
        };
        let (text, warnings) = config_check(&args).unwrap();
        assert!(warnings.is_empty());
        assert!(text.contains("\"quantity\": \"1Gi\""), "{text}");
        assert!(text.contains("allocatableMemory.available"));
        let bad = ConfigArgs {
            eviction_hard: vec!["memory.available<-1".into()],
            ..ConfigArgs::default()
        };
        assert!(
            config_check(&bad)
                .unwrap_err()
                .to_string()
                .contains("--eviction-hard")
        );
    }
}
