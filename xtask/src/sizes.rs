//! `cargo xtask sizes`: no production function over [`MAX_FN_LINES`] lines, no production
//! file over [`MAX_FILE_LINES`].
//!
//! Production code is every `.rs` file under [`ROOTS`] except the tests: files named
//! `tests.rs` or `*_tests.rs`, files under a `tests/` folder, files declared by a
//! `#[cfg(test)] mod name;` in their parent, and every item carrying a `#[cfg(test)]`
//! attribute (its lines are not counted in its file either). A function is a free `fn`, a
//! method or a trait's provided method (closures are part of the function they sit in; a
//! `fn` nested in another is measured on its own too), from its signature to its closing
//! brace, doc comments and attributes not counted. The spans come from `syn`'s syntax tree.
//!
//! Prints the longest function and the longest file, then every offender; exits non-zero
//! naming them.

use std::{
    collections::BTreeSet,
    fs,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use syn::{spanned::Spanned as _, visit::Visit};

/// The longest a production function may be, in lines.
pub const MAX_FN_LINES: usize = 120;

/// The longest a production file may be, in lines (its test items not counted).
pub const MAX_FILE_LINES: usize = 900;

/// The production source trees measured.
pub const ROOTS: &[&str] = &[
    "enforcer/src",
    "enforcer-common/src",
    "enforcer-ebpf/src",
    "xtask/src",
];

/// One function's span.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FnSize {
    /// `name` or `Type::name` for a method.
    pub name: String,
    /// The line of its signature (1-based).
    pub line: usize,
    /// Lines from its signature to its closing brace.
    pub lines: usize,
}

/// One file measured.
#[derive(Debug, Default)]
pub struct Measured {
    /// Its lines, less those of its `#[cfg(test)]` items.
    pub lines: usize,
    /// Its production functions.
    pub fns: Vec<FnSize>,
    /// The modules it declares as test modules in their own file (`#[cfg(test)] mod x;`).
    pub test_mods: Vec<String>,
}

/// Runs the check on [`ROOTS`] (relative to the workspace root), printing the verdict.
pub fn check() -> anyhow::Result<()> {
    let mut files = Vec::new();
    for root in ROOTS {
        files.extend(measure_tree(Path::new(root))?);
    }
    let offenders = offenders(&files);
    let fns: usize = files.iter().map(|(_, m)| m.fns.len()).sum();
    println!("sizes: {} files, {fns} functions measured", files.len());
    let longest_fn = files
        .iter()
        .flat_map(|(p, m)| m.fns.iter().map(move |f| (p, f)))
        .max_by_key(|(_, f)| f.lines);
    if let Some((path, f)) = longest_fn {
        println!(
            "  longest function: {}:{} {}, {} lines",
            path.display(),
            f.line,
            f.name,
            f.lines
        );
    }
    if let Some((path, m)) = files.iter().max_by_key(|(_, m)| m.lines) {
        println!("  longest file: {}, {} lines", path.display(), m.lines);
    }
    for o in &offenders {
        println!("  over: {o}");
    }
    if offenders.is_empty() {
        Ok(())
    } else {
        bail!(
            "sizes: {} over the bounds:\n{}",
            offenders.len(),
            offenders.join("\n")
        )
    }
}

/// Every file over [`MAX_FILE_LINES`] and every function over [`MAX_FN_LINES`], named with
/// its path (and line) and size.
fn offenders(files: &[(PathBuf, Measured)]) -> Vec<String> {
    let mut out = Vec::new();
    for (path, m) in files {
        if m.lines > MAX_FILE_LINES {
            out.push(format!(
                "{}: {} lines (a file's most: {MAX_FILE_LINES})",
                path.display(),
                m.lines
            ));
        }
        for f in m.fns.iter().filter(|f| f.lines > MAX_FN_LINES) {
            out.push(format!(
                "{}:{} {}: {} lines (a function's most: {MAX_FN_LINES})",
                path.display(),
                f.line,
                f.name,
                f.lines
            ));
        }
    }
    out
}

/// Every production file of `root`, measured, sorted by path.
fn measure_tree(root: &Path) -> anyhow::Result<Vec<(PathBuf, Measured)>> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in fs::read_dir(&dir).with_context(|| format!("read {}", dir.display()))? {
            let p = entry
                .with_context(|| format!("read {}", dir.display()))?
                .path();
            let name = p
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            if p.is_dir() {
                if name != "tests" {
                    stack.push(p);
                }
            } else if name.ends_with(".rs") && name != "tests.rs" && !name.ends_with("_tests.rs") {
                let text =
                    fs::read_to_string(&p).with_context(|| format!("read {}", p.display()))?;
                let m = measure(&text).with_context(|| format!("parse {}", p.display()))?;
                out.push((p, m));
            }
        }
    }
    // files (and folders) that are test modules declared in their parent
    let mut tests: BTreeSet<PathBuf> = BTreeSet::new();
    for (p, m) in &out {
        let dir = child_dir(p);
        for name in &m.test_mods {
            tests.insert(dir.join(format!("{name}.rs")));
            tests.insert(dir.join(name));
        }
    }
    out.retain(|(p, _)| !tests.iter().any(|t| p.starts_with(t)));
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The folder a file's child modules live in: beside `lib.rs`, `main.rs` and `mod.rs`, in a
/// folder of the file's name otherwise.
fn child_dir(file: &Path) -> PathBuf {
    let parent = file.parent().unwrap_or(Path::new(""));
    match file.file_stem().and_then(|s| s.to_str()) {
        Some("lib" | "main" | "mod") | None => parent.to_path_buf(),
        Some(stem) => parent.join(stem),
    }
}

/// Measures one file's source.
pub fn measure(source: &str) -> syn::Result<Measured> {
    let file = syn::parse_file(source)?;
    let mut v = Measurer::default();
    v.visit_file(&file);
    let total = source.lines().count();
    Ok(Measured {
        lines: total.saturating_sub(v.test_lines),
        fns: v.fns,
        test_mods: v.test_mods,
    })
}

#[derive(Default)]
struct Measurer {
    fns: Vec<FnSize>,
    test_lines: usize,
    test_mods: Vec<String>,
    /// The type of the `impl` or the name of the trait being walked.
    owner: Vec<String>,
}

impl Measurer {
    /// Skips a `#[cfg(test)]` item, counting its lines (attributes included) as test lines.
    fn skip_test(&mut self, attrs: &[syn::Attribute], span: proc_macro2::Span) -> bool {
        if !attrs.iter().any(is_cfg_test) {
            return false;
        }
        let start = attrs
            .iter()
            .map(|a| a.span().start().line)
            .chain([span.start().line])
            .min()
            .unwrap_or(0);
        self.test_lines += span.end().line + 1 - start;
        true
    }

    fn record(&mut self, ident: &syn::Ident, sig: &syn::Signature, block: &syn::Block) {
        let line = sig.span().start().line;
        let end = block.brace_token.span.close().end().line;
        let name = match self.owner.last() {
            Some(owner) => format!("{owner}::{ident}"),
            None => ident.to_string(),
        };
        self.fns.push(FnSize {
            name,
            line,
            lines: end + 1 - line,
        });
    }
}

impl<'ast> Visit<'ast> for Measurer {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs: &[syn::Attribute] = match item {
            syn::Item::Const(i) => &i.attrs,
            syn::Item::Enum(i) => &i.attrs,
            syn::Item::ExternCrate(i) => &i.attrs,
            syn::Item::Fn(i) => &i.attrs,
            syn::Item::ForeignMod(i) => &i.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Macro(i) => &i.attrs,
            syn::Item::Mod(i) => &i.attrs,
            syn::Item::Static(i) => &i.attrs,
            syn::Item::Struct(i) => &i.attrs,
            syn::Item::Trait(i) => &i.attrs,
            syn::Item::TraitAlias(i) => &i.attrs,
            syn::Item::Type(i) => &i.attrs,
            syn::Item::Union(i) => &i.attrs,
            syn::Item::Use(i) => &i.attrs,
            _ => &[],
        };
        if self.skip_test(attrs, item.span()) {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
            {
                self.test_mods.push(m.ident.to_string());
            }
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let attrs: &[syn::Attribute] = match item {
            syn::ImplItem::Const(i) => &i.attrs,
            syn::ImplItem::Fn(i) => &i.attrs,
            syn::ImplItem::Type(i) => &i.attrs,
            syn::ImplItem::Macro(i) => &i.attrs,
            _ => &[],
        };
        if self.skip_test(attrs, item.span()) {
            return;
        }
        syn::visit::visit_impl_item(self, item);
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        let owner = match &*item.self_ty {
            syn::Type::Path(p) => p
                .path
                .segments
                .last()
                .map_or_else(|| "impl".to_owned(), |s| s.ident.to_string()),
            _ => "impl".to_owned(),
        };
        self.owner.push(owner);
        syn::visit::visit_item_impl(self, item);
        self.owner.pop();
    }

    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        self.owner.push(item.ident.to_string());
        syn::visit::visit_item_trait(self, item);
        self.owner.pop();
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        self.record(&item.sig.ident, &item.sig, &item.block);
        // a fn nested in a fn or a method is named on its own
        let owner = std::mem::take(&mut self.owner);
        syn::visit::visit_item_fn(self, item);
        self.owner = owner;
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        self.record(&item.sig.ident, &item.sig, &item.block);
        let owner = std::mem::take(&mut self.owner);
        syn::visit::visit_impl_item_fn(self, item);
        self.owner = owner;
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if self.skip_test(&item.attrs, item.span()) {
            return;
        }
        if let Some(block) = &item.default {
            self.record(&item.sig.ident, &item.sig, block);
        }
        let owner = std::mem::take(&mut self.owner);
        syn::visit::visit_trait_item_fn(self, item);
        self.owner = owner;
    }
}

/// `#[cfg(test)]`, or a `cfg` that needs `test` (`all(test, ...)`), not one that excludes it.
fn is_cfg_test(attr: &syn::Attribute) -> bool {
    if !attr.path().is_ident("cfg") {
        return false;
    }
    let Ok(list) = attr.meta.require_list() else {
        return false;
    };
    let mut idents = Vec::new();
    collect_idents(list.tokens.clone(), &mut idents);
    idents.iter().any(|i| i == "test") && !idents.iter().any(|i| i == "not" || i == "any")
}

fn collect_idents(tokens: proc_macro2::TokenStream, out: &mut Vec<String>) {
    for t in tokens {
        match t {
            proc_macro2::TokenTree::Ident(i) => out.push(i.to_string()),
            proc_macro2::TokenTree::Group(g) => collect_idents(g.stream(), out),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A free function of `body` lines between its signature and closing brace.
    fn function(name: &str, body: usize) -> String {
        let mut s = format!("/// Doc.\n#[inline]\npub fn {name}() {{\n");
        for i in 0..body {
            s.push_str(&format!("    let _x{i} = {i};\n"));
        }
        s.push_str("}\n");
        s
    }

    #[test]
    fn a_function_is_measured_from_its_signature_to_its_closing_brace() {
        let m = measure(&function("f", 3)).unwrap();
        assert_eq!(
            m.fns,
            [FnSize {
                name: "f".into(),
                line: 3,
                lines: 5
            }]
        );
        assert_eq!(m.lines, 7);
    }

    #[test]
    fn a_function_of_120_lines_passes_one_of_121_does_not() {
        let at = measure(&function("at", MAX_FN_LINES - 2)).unwrap();
        assert_eq!(at.fns[0].lines, MAX_FN_LINES);
        assert!(offenders(&[(PathBuf::from("a.rs"), at)]).is_empty());
        let over = measure(&function("over", MAX_FN_LINES - 1)).unwrap();
        assert_eq!(over.fns[0].lines, MAX_FN_LINES + 1);
        assert_eq!(
            offenders(&[(PathBuf::from("b.rs"), over)]),
            ["b.rs:3 over: 121 lines (a function's most: 120)"]
        );
    }

    #[test]
    fn a_file_of_900_lines_passes_one_of_901_does_not() {
        let lines = |n: usize| "struct S;\n".repeat(n);
        let at = measure(&lines(MAX_FILE_LINES)).unwrap();
        assert!(offenders(&[(PathBuf::from("a.rs"), at)]).is_empty());
        let over = measure(&lines(MAX_FILE_LINES + 1)).unwrap();
        assert_eq!(
            offenders(&[(PathBuf::from("b.rs"), over)]),
            ["b.rs: 901 lines (a file's most: 900)"]
        );
    }

    #[test]
    fn a_long_test_module_is_not_an_offender() {
        let src = format!(
            "fn small() {{}}\n#[cfg(test)]\nmod tests {{\n{}}}\n",
            function("long", 1000)
        );
        let m = measure(&src).unwrap();
        assert_eq!(m.lines, 1);
        assert!(offenders(&[(PathBuf::from("c.rs"), m)]).is_empty());
    }

    #[test]
    fn test_modules_and_items_are_not_counted() {
        let src = format!(
            "fn small() {{}}\n#[cfg(test)]\nmod tests {{\n{}}}\n#[cfg(test)]\nmod fake;\n\
             struct S;\nimpl S {{\n    #[cfg(test)]\n    fn helper() {{}}\n    fn method() {{\n    }}\n}}\n",
            function("long", 200)
        );
        let m = measure(&src).unwrap();
        let names: Vec<_> = m.fns.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["small", "S::method"]);
        assert_eq!(m.test_mods, ["fake"]);
        // `small`, `struct S;`, the impl's opening and closing lines and the method's two
        assert_eq!(m.lines, 1 + 1 + 2 + 2);
    }

    #[test]
    fn methods_trait_defaults_and_nested_fns_are_measured() {
        let src = "trait T {\n    fn req();\n    fn provided() {\n    }\n}\n\
                   fn outer() {\n    fn inner() {\n    }\n    let _c = || {\n        1\n    };\n}\n";
        let m = measure(src).unwrap();
        let got: Vec<_> = m.fns.iter().map(|f| (f.name.as_str(), f.lines)).collect();
        assert_eq!(got, [("T::provided", 2), ("outer", 7), ("inner", 2)]);
    }

    #[test]
    fn test_files_are_not_measured() {
        let root = std::env::temp_dir().join(format!("xtask-sizes-{}", std::process::id()));
        let files = [
            ("lib.rs", "#[cfg(test)]\nmod fake;\nmod a;\n"),
            ("fake.rs", "fn f() {}\n"),
            ("a.rs", "fn g() {}\n"),
            ("a/tests.rs", "fn t() {}\n"),
            ("a/b_tests.rs", "fn t() {}\n"),
            ("a/tests/c.rs", "fn t() {}\n"),
        ];
        for (path, text) in files {
            let path = root.join(path);
            fs::create_dir_all(path.parent().unwrap()).unwrap();
            fs::write(path, text).unwrap();
        }
        let measured = measure_tree(&root).unwrap();
        let names: Vec<_> = measured
            .iter()
            .map(|(p, _)| p.strip_prefix(&root).unwrap().display().to_string())
            .collect();
        fs::remove_dir_all(&root).unwrap();
        assert_eq!(names, ["a.rs", "lib.rs"]);
    }

    #[test]
    fn cfg_not_test_is_production() {
        let m = measure("#[cfg(not(test))]\nfn real() {\n}\n").unwrap();
        assert_eq!(m.fns.len(), 1);
        assert_eq!(m.lines, 3);
    }
}
