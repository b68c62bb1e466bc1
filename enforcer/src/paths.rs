//! Path arithmetic every layer may use: joining a relative path made of untrusted names below
//! a root without ever leaving it.

use std::path::{Component, Path, PathBuf};

/// A path component [`join_inside`] refused: it could leave the root.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("path component {component:?} is not allowed (it could escape {root})")]
pub struct PathEscape {
    /// The root the path was to stay below.
    pub root: PathBuf,
    /// The refused component.
    pub component: String,
}

/// Joins a relative cgroup path made of untrusted names below `root`, refusing anything that
/// could leave it (`..`, absolute paths, empty or NUL-containing components).
pub fn join_inside(root: &Path, rel: &str) -> Result<PathBuf, PathEscape> {
    let mut out = root.to_path_buf();
    for part in rel.split('/').filter(|p| !p.is_empty()) {
        let ok = !part.contains('\0')
            && matches!(
                Path::new(part).components().next(),
                Some(Component::Normal(_))
            )
            && Path::new(part).components().count() == 1;
        if !ok {
            return Err(PathEscape {
                root: root.to_path_buf(),
                component: part.to_owned(),
            });
        }
        out.push(part);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_refuses_escapes() {
        let root = Path::new("/sys/fs/cgroup/memory");
        assert_eq!(
            join_inside(root, "/kubepods/podA").ok(),
            Some(PathBuf::from("/sys/fs/cgroup/memory/kubepods/podA"))
        );
        for bad in ["../x", "kubepods/../../etc", "a/./b", "a\0b"] {
            assert!(join_inside(root, bad).is_err(), "{bad:?}");
        }
    }
}
