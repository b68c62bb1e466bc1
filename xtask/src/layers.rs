//! `cargo xtask layers`: the enforcer library's import graph, checked.
//!
//! Every `.rs` file of `enforcer/src` is a node (tests excluded: `#[cfg(test)]` modules,
//! inline or in their own file); every `crate::`, `super::` or `self::` path in its code
//! (`use` trees expanded, comments and string literals ignored) is an arrow to the file that
//! defines the longest prefix of the path that is a module. Two rules:
//! - no arrow points up the layer order of [`LAYERS`] (a top-level module may import only
//!   from its own layer or the layers below it);
//! - no cycle, neither between files nor between top-level modules. An arrow from a file up
//!   to a module it is part of (`super::`: the child files of a split module extend their
//!   parent's types) is not counted for the file cycles; between top-level modules, every
//!   arrow counts.
//!
//! Exits non-zero naming each offending arrow (with the file and the path that makes it) or
//! each cycle.

use std::{
    collections::{BTreeMap, BTreeSet},
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};

/// The top-level modules of the enforcer library, bottom up. A module may import from its
/// own layer and those below. `main.rs` (the binary) may import anything.
pub const LAYERS: &[&[&str]] = &[
    // the floor: small shared types and helpers with no knowledge of the node
    &[
        "quantity",
        "paths",
        "duration",
        "clock",
        "locks",
        "state_log",
        "recorder",
        "build",
    ],
    // pure decisions: values in, values out
    &["policy"],
    // the kernel and the host, read and written
    &["cgroup"],
    &["health"],
    &["signal"],
    &["kernel"],
    &["node"],
    // configuration (KubeletConfiguration + flags -> validated config, the node's observer)
    &["config"],
    // effects: kubelet's rooms (the status manager, the CRI side, the container manager, the
    // pod sources, the pods), the API server, the operator surface
    &["metrics"],
    &["kills", "stats"],
    &["status_manager"],
    &["cri"],
    &["container_manager"],
    &["sources"],
    &["pods"],
    &["cluster"],
    &["node_report"],
    // beside kubelet: its pods, their eviction made known, the OOM scores aligned
    &["companion"],
    &["eviction_manager"],
    &["server"],
    &["daemon"],
    &["cli"],
];

type Module = Vec<String>;

struct File {
    module: Module,
    path: PathBuf,
    code: String,
}

/// Runs the check on `root` (`enforcer/src`), printing the verdict.
pub fn check(root: &Path) -> anyhow::Result<()> {
    let files = read_tree(root)?;
    let known: BTreeSet<&Module> = files.iter().map(|f| &f.module).collect();
    let layer_of = |top: &str| LAYERS.iter().position(|l| l.contains(&top));
    let mut errors = Vec::new();
    let mut file_edges: BTreeMap<&Module, BTreeSet<&Module>> = BTreeMap::new();
    let mut top_edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut arrows = 0usize;
    for f in &files {
        let Some(from_top) = f.module.first() else {
            continue; // lib.rs declares the modules
        };
        let Some(from_layer) = layer_of(from_top) else {
            errors.push(format!(
                "{}: top-level module `{from_top}` is in no layer of xtask/src/layers.rs",
                f.path.display()
            ));
            continue;
        };
        for path in paths_in(&f.code) {
            let Some(target) = resolve(&f.module, &path, &known) else {
                continue;
            };
            if *target == f.module || target.is_empty() {
                continue;
            }
            arrows += 1;
            // A file is part of the modules above it (a child file holds `impl super::X`
            // blocks of its parent's types): an arrow up to an ancestor makes no cycle.
            if !f.module.starts_with(target) {
                file_edges.entry(&f.module).or_default().insert(target);
            }
            let to_top = &target[0];
            if to_top != from_top {
                top_edges
                    .entry(from_top.clone())
                    .or_default()
                    .insert(to_top.clone());
            }
            if let Some(to_layer) = layer_of(to_top)
                && to_layer > from_layer
            {
                errors.push(format!(
                    "{}: upward import `{}` ({from_top} -> {to_top})",
                    f.path.display(),
                    path.join("::")
                ));
            }
        }
    }
    errors.sort();
    errors.dedup();
    for cycle in cycles(&file_edges) {
        errors.push(format!(
            "file cycle: {}",
            cycle
                .iter()
                .map(|m| m.join("/"))
                .collect::<Vec<_>>()
                .join(" -> ")
        ));
    }
    let top_refs: BTreeMap<&String, BTreeSet<&String>> = top_edges
        .iter()
        .map(|(k, v)| (k, v.iter().collect()))
        .collect();
    for cycle in cycles(&top_refs) {
        errors.push(format!(
            "module cycle: {}",
            cycle
                .iter()
                .map(|m| m.as_str())
                .collect::<Vec<_>>()
                .join(" -> ")
        ));
    }
    if !errors.is_empty() {
        for e in &errors {
            eprintln!("layers: {e}");
        }
        bail!(
            "{} import rule(s) broken in {}",
            errors.len(),
            root.display()
        );
    }
    println!(
        "layers: {} files, {arrows} imports between files, {} top-level modules in {} layers: no upward import, no cycle",
        files.len(),
        files
            .iter()
            .filter_map(|f| f.module.first())
            .collect::<BTreeSet<_>>()
            .len(),
        LAYERS.len()
    );
    Ok(())
}

/// Every library file under `root` with its module path, test modules left out.
fn read_tree(root: &Path) -> anyhow::Result<Vec<File>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let p = entry?.path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|e| e == "rs") {
                let rel = p.strip_prefix(root)?.with_extension("");
                let mut module: Module = rel
                    .components()
                    .map(|c| c.as_os_str().to_string_lossy().into_owned())
                    .collect();
                if module == ["main"] {
                    continue;
                }
                if module == ["lib"] {
                    module.clear();
                }
                let text =
                    fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
                out.push(File {
                    module,
                    code: strip(&text),
                    path: p,
                });
            }
        }
    }
    // files that are test modules (`#[cfg(test)] mod x;` in their parent)
    let mut tests: BTreeSet<Module> = BTreeSet::new();
    for f in &out {
        for name in test_mod_decls(&f.code) {
            let mut m = f.module.clone();
            m.push(name);
            tests.insert(m);
        }
    }
    out.retain(|f| !tests.iter().any(|t| f.module.starts_with(t)));
    out.sort_by(|a, b| a.module.cmp(&b.module));
    Ok(out)
}

/// The code with comments, string and char literals blanked and inline `#[cfg(test)]`
/// modules removed.
fn strip(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r'
            && (b.get(i + 1) == Some(&b'"') || b.get(i + 1) == Some(&b'#'))
            && (i == 0 || !is_ident(b[i - 1]))
        {
            // raw string r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&b'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            j += 1;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while j < b.len() && !b[j..].starts_with(&close) {
                j += 1;
            }
            i = j + close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                if b[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' {
            // a char literal ('x', '\n', '\u{..}') or a lifetime ('a)
            let end = if b.get(i + 1) == Some(&b'\\') {
                b[i + 2..]
                    .iter()
                    .position(|&c| c == b'\'')
                    .map(|p| i + 2 + p)
            } else if b.get(i + 2) == Some(&b'\'') {
                Some(i + 2)
            } else {
                None
            };
            match end {
                Some(e) => {
                    out.push_str("' '");
                    i = e + 1;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    remove_test_blocks(&out)
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

const CFG_TEST: &str = "#[cfg(test)]";

/// `#[cfg(test)] mod name { ... }` blocks removed (the attribute may be followed by others).
fn remove_test_blocks(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find(CFG_TEST) {
        out.push_str(&rest[..at]);
        let after = &rest[at + CFG_TEST.len()..];
        let decl = skip_attrs_and_vis(after);
        if let Some(m) = decl.strip_prefix("mod ") {
            let name_len = m.bytes().take_while(|&c| is_ident(c)).count();
            let tail = m[name_len..].trim_start();
            if tail.starts_with('{') {
                let open = after.len() - tail.len();
                let mut depth = 0usize;
                let mut end = after.len();
                for (k, c) in after[open..].char_indices() {
                    match c {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                rest = &after[end..];
                continue;
            }
        }
        out.push_str(CFG_TEST);
        rest = after;
    }
    out.push_str(rest);
    out
}

fn skip_attrs_and_vis(s: &str) -> &str {
    let mut s = s.trim_start();
    while s.starts_with("#[") {
        match s.find(']') {
            Some(e) => s = s[e + 1..].trim_start(),
            None => return s,
        }
    }
    if let Some(r) = s.strip_prefix("pub") {
        s = r.trim_start();
        if s.starts_with('(')
            && let Some(e) = s.find(')')
        {
            s = s[e + 1..].trim_start();
        }
    }
    s
}

/// The names of `#[cfg(test)] mod name;` declarations (test modules in their own file).
fn test_mod_decls(code: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(CFG_TEST) {
        let after = &rest[at + CFG_TEST.len()..];
        let decl = skip_attrs_and_vis(after);
        if let Some(m) = decl.strip_prefix("mod ") {
            let name: String = m
                .chars()
                .take_while(|&c| c.is_alphanumeric() || c == '_')
                .collect();
            if m[name.len()..].trim_start().starts_with(';') {
                out.push(name);
            }
        }
        rest = after;
    }
    out
}

/// Every path that starts with `crate`, `super` or `self`, `use` trees expanded.
fn paths_in(code: &str) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let b = code.as_bytes();
    let mut i = 0;
    while i < b.len() {
        let at_word = i == 0 || !is_ident(b[i - 1]) && b[i - 1] != b':';
        let head = ["crate", "super", "self"]
            .into_iter()
            .find(|h| code[i..].starts_with(h) && code[i + h.len()..].starts_with("::"));
        match head {
            Some(_) if at_word => {
                let (paths, end) = parse_tree(code, i, Vec::new());
                out.extend(paths);
                i = end.max(i + 1);
            }
            _ => i += 1,
        }
    }
    out
}

/// Parses a path (possibly ending in a `{...}` group) starting at `i`; returns the expanded
/// paths and where it ended.
fn parse_tree(code: &str, mut i: usize, mut prefix: Vec<String>) -> (Vec<Vec<String>>, usize) {
    let b = code.as_bytes();
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        if i < b.len() && b[i] == b'{' {
            let mut out = Vec::new();
            i += 1;
            loop {
                while i < b.len() && (b[i].is_ascii_whitespace() || b[i] == b',') {
                    i += 1;
                }
                if i >= b.len() || b[i] == b'}' {
                    return (out, i + 1);
                }
                let (paths, end) = parse_tree(code, i, prefix.clone());
                out.extend(paths);
                // skip an `as name` and anything up to the next `,` or `}` at this level
                i = end;
                while i < b.len() && b[i] != b',' && b[i] != b'}' {
                    i += 1;
                }
            }
        }
        let start = i;
        while i < b.len() && is_ident(b[i]) {
            i += 1;
        }
        if start == i {
            return (vec![prefix], i);
        }
        prefix.push(code[start..i].to_owned());
        if code[i..].starts_with("::") {
            i += 2;
        } else {
            return (vec![prefix], i);
        }
    }
}

/// The file a path lands in: the longest prefix of it that is a module of the tree.
fn resolve<'a>(from: &Module, path: &[String], known: &BTreeSet<&'a Module>) -> Option<&'a Module> {
    let mut full: Module = match path.first().map(String::as_str) {
        Some("crate") => Vec::new(),
        Some("self") => from.clone(),
        Some("super") => from.clone(),
        _ => return None,
    };
    let mut rest = &path[1..];
    if path[0] == "super" {
        full.pop();
        while rest.first().is_some_and(|s| s == "super") {
            full.pop();
            rest = &rest[1..];
        }
    }
    full.extend(rest.iter().cloned());
    (0..=full.len())
        .rev()
        .find_map(|k| known.get(&full[..k].to_vec()).copied())
}

/// The cycles of a graph (one per strongly connected component of more than one node),
/// each as a path that returns to its start.
fn cycles<N: Ord + Clone>(edges: &BTreeMap<N, BTreeSet<N>>) -> Vec<Vec<N>> {
    // Tarjan's algorithm, iterative.
    let nodes: BTreeSet<&N> = edges
        .iter()
        .flat_map(|(k, v)| std::iter::once(k).chain(v.iter()))
        .collect();
    let nodes: Vec<&N> = nodes.into_iter().collect();
    let id = |n: &N| nodes.binary_search(&n).ok();
    let succ: Vec<Vec<usize>> = nodes
        .iter()
        .map(|n| {
            edges
                .get(*n)
                .map(|s| s.iter().filter_map(id).collect())
                .unwrap_or_default()
        })
        .collect();
    let n = nodes.len();
    let (mut index, mut low, mut on) = (vec![usize::MAX; n], vec![0; n], vec![false; n]);
    let (mut stack, mut next, mut comps) = (Vec::new(), 0, Vec::new());
    for root in 0..n {
        if index[root] != usize::MAX {
            continue;
        }
        let mut work = vec![(root, 0usize)];
        while let Some(&mut (v, ref mut k)) = work.last_mut() {
            if *k == 0 {
                index[v] = next;
                low[v] = next;
                next += 1;
                stack.push(v);
                on[v] = true;
            }
            if *k < succ[v].len() {
                let w = succ[v][*k];
                *k += 1;
                if index[w] == usize::MAX {
                    work.push((w, 0));
                } else if on[w] {
                    low[v] = low[v].min(index[w]);
                }
                continue;
            }
            work.pop();
            if let Some(&(parent, _)) = work.last() {
                low[parent] = low[parent].min(low[v]);
            }
            if low[v] == index[v] {
                let mut comp = Vec::new();
                while let Some(w) = stack.pop() {
                    on[w] = false;
                    comp.push(w);
                    if w == v {
                        break;
                    }
                }
                if comp.len() > 1 {
                    comps.push(comp);
                }
            }
        }
    }
    comps
        .into_iter()
        .map(|comp| {
            let inside: BTreeSet<usize> = comp.iter().copied().collect();
            cycle_path(comp.iter().copied().min().unwrap_or(0), &succ, &inside)
                .into_iter()
                .map(|i| nodes[i].clone())
                .collect()
        })
        .collect()
}

/// A shortest cycle through `start` inside one component (breadth first).
fn cycle_path(start: usize, succ: &[Vec<usize>], inside: &BTreeSet<usize>) -> Vec<usize> {
    let mut prev: BTreeMap<usize, usize> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start]);
    while let Some(v) = queue.pop_front() {
        for &w in &succ[v] {
            if !inside.contains(&w) {
                continue;
            }
            if w == start {
                let mut path = vec![start];
                let mut cur = v;
                while cur != start {
                    path.push(cur);
                    cur = prev[&cur];
                }
                path.push(start);
                let n = path.len();
                path[1..n - 1].reverse();
                return path;
            }
            if let std::collections::btree_map::Entry::Vacant(e) = prev.entry(w) {
                e.insert(v);
                queue.push_back(w);
            }
        }
    }
    vec![start, start]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(s: &str) -> Module {
        s.split('/')
            .filter(|p| !p.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[test]
    fn use_trees_and_inline_paths_expand() {
        let code = strip(
            "use crate::{a::{B, c::D as E}, f};\n// crate::comment::X\nlet s = \"crate::string\";\nsuper::g::h();\nself::k::L;",
        );
        let got: Vec<String> = paths_in(&code).iter().map(|p| p.join("::")).collect();
        assert_eq!(
            got,
            [
                "crate::a::B",
                "crate::a::c::D",
                "crate::f",
                "super::g::h",
                "self::k::L"
            ]
        );
    }

    #[test]
    fn test_modules_are_left_out() {
        let code = strip(
            "fn a() {}\n#[cfg(test)]\nmod tests {\n use crate::x::Y;\n}\n#[cfg(test)]\nmod more;\n",
        );
        assert!(paths_in(&code).is_empty());
        assert_eq!(test_mod_decls(&code), ["more"]);
    }

    #[test]
    fn paths_land_in_the_longest_module_prefix() {
        let a = m("policy");
        let b = m("policy/qos");
        let c = m("runtime");
        let known: BTreeSet<&Module> = [&a, &b, &c].into_iter().collect();
        let p = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
        assert_eq!(
            resolve(&m("runtime"), &p("crate::policy::qos::Class"), &known),
            Some(&b)
        );
        assert_eq!(
            resolve(&m("policy/qos"), &p("super::Thing"), &known),
            Some(&a)
        );
        assert_eq!(
            resolve(&m("runtime"), &p("crate::policy::Other"), &known),
            Some(&a)
        );
        assert_eq!(
            resolve(&m("runtime"), &p("self::inner::X"), &known),
            Some(&c)
        );
    }

    #[test]
    fn cycles_are_found_and_dags_pass() {
        let mut g: BTreeMap<u8, BTreeSet<u8>> = BTreeMap::new();
        g.insert(1, [2].into());
        g.insert(2, [3].into());
        g.insert(3, [4].into());
        assert!(cycles(&g).is_empty());
        g.insert(4, [2].into());
        assert_eq!(cycles(&g), vec![vec![2, 3, 4, 2]]);
    }
}
