//! Kubelet flag syntax: `--eviction-hard=memory.available<500Mi,nodefs.available<10%` (`<`
//! separated maps), `--system-reserved=cpu=500m,memory=1Gi` (`=` separated maps), comma lists.

use std::collections::BTreeMap;

/// What is wrong with a flag value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A map entry without its separator.
    #[error("malformed pair {pair:?}, expect string{sep}string")]
    Pair {
        /// The entry.
        pair: String,
        /// The separator expected.
        sep: char,
    },
}

/// Parses `k<v,k2<v2` or `k=v,k2=v2` (kubelet's `MapStringString` / `LangleSeparatedMapStringString`).
/// Repeated occurrences of a flag accumulate; the empty string gives an empty map.
pub fn parse_map<'a>(
    values: impl IntoIterator<Item = &'a String>,
    sep: char,
) -> Result<BTreeMap<String, String>, FlagError> {
    let mut out = BTreeMap::new();
    for value in values {
        for pair in value.split(',') {
            let pair = pair.trim();
            if pair.is_empty() {
                continue;
            }
            let (k, v) = pair.split_once(sep).ok_or_else(|| FlagError::Pair {
                pair: pair.to_owned(),
                sep,
            })?;
            out.insert(k.trim().to_owned(), v.trim().to_owned());
        }
    }
    Ok(out)
}

/// Parses a comma list (`pods,kube-reserved`).
#[must_use]
pub fn parse_list(value: &str) -> Vec<String> {
    value
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps() {
        let v = vec!["memory.available<500Mi,nodefs.available<10%".to_owned()];
        let m = parse_map(&v, '<').unwrap();
        assert_eq!(m["memory.available"], "500Mi");
        assert_eq!(m["nodefs.available"], "10%");
        let v = vec!["cpu=500m".to_owned(), "memory=1Gi".to_owned()];
        assert_eq!(parse_map(&v, '=').unwrap().len(), 2);
        assert!(parse_map(&vec![String::new()], '=').unwrap().is_empty());
        assert!(parse_map(&vec!["memory.available=1Gi".to_owned()], '<').is_err());
        assert_eq!(parse_list("pods, kube-reserved"), ["pods", "kube-reserved"]);
    }
}
