//! The modules of each crate listed in `layers.toml` use only modules of
//! their own layer or below, and form no circle.
//!
//! Each crate's module tree is read from its source with `syn`, from
//! `src/lib.rs` (or `src/main.rs`) through its `mod` declarations, leaving
//! out test-only code (`#[cfg(test)]` modules and items). Every path that
//! names a module of the same crate — `use crate::…`, `crate::x::…` in code
//! and in macro bodies, `super::…`, `self::…`, a child module named directly
//! — is an edge. Modules are grouped into the units `layers.toml` lists (a
//! module belongs to the longest listed path that prefixes it), and the test
//! fails on:
//!
//! - a module that belongs to no listed unit (a new module needs a layer),
//! - an edge from a unit to one of a higher layer,
//! - a circle among units (an edge inside a strongly connected component),
//! - an allowance in `layers.toml` that matches no edge any more (the list
//!   of known exceptions only shrinks).
//!
//! Edges `layers.toml` allows are left out before looking for circles.
//! `scripts/import-graph.py` draws the same graph as a table.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use proc_macro2::{TokenStream, TokenTree};
use serde::Deserialize;
use syn::visit::Visit;

type ModPath = Vec<String>;

#[derive(Deserialize)]
struct Spec {
    #[serde(rename = "crate")]
    crates: BTreeMap<String, CrateSpec>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CrateSpec {
    layer: Vec<Layer>,
    #[serde(default)]
    allow: Vec<String>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Layer {
    name: String,
    modules: Vec<String>,
}

/// One module: its child modules and the paths written in it.
#[derive(Default)]
struct Module {
    children: BTreeSet<String>,
    /// Paths as written; a path starting with neither `crate`, `self` nor
    /// `super` is marked `Bare` (it names this crate only through a child).
    refs: Vec<Ref>,
    /// Crate root only: names it imports, and the module each comes from.
    exports: BTreeMap<String, ModPath>,
}

enum Ref {
    Anchored(Vec<String>),
    Bare(Vec<String>),
}

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|a| {
        if !a.path().is_ident("cfg") {
            return false;
        }
        let syn::Meta::List(list) = &a.meta else {
            return false;
        };
        let text = list.tokens.to_string().replace(' ', "");
        text.split(|c: char| !c.is_alphanumeric() && c != '_')
            .any(|w| w == "test")
            && !text.contains("not(test)")
    })
}

/// Collects the paths written in one module's items (not its child modules').
struct Collector<'a> {
    refs: &'a mut Vec<Ref>,
    /// Inline child modules met while visiting: (name, items).
    inline: Vec<(String, Vec<syn::Item>)>,
    /// File child modules met while visiting.
    files: Vec<String>,
}

impl Collector<'_> {
    fn push(&mut self, segs: Vec<String>) {
        if segs.is_empty() {
            return;
        }
        if matches!(segs[0].as_str(), "crate" | "self" | "super") {
            self.refs.push(Ref::Anchored(segs));
        } else if segs.len() > 1 {
            self.refs.push(Ref::Bare(segs));
        }
    }

    fn use_tree(&mut self, tree: &syn::UseTree, prefix: &mut Vec<String>) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(&p.tree, prefix);
                prefix.pop();
            }
            syn::UseTree::Name(n) => self.use_leaf(prefix, &n.ident),
            syn::UseTree::Rename(r) => self.use_leaf(prefix, &r.ident),
            syn::UseTree::Glob(_) => self.push_use(prefix.clone()),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(t, prefix);
                }
            }
        }
    }

    fn use_leaf(&mut self, prefix: &[String], ident: &syn::Ident) {
        let mut segs = prefix.to_vec();
        if ident != "self" {
            segs.push(ident.to_string());
        }
        self.push_use(segs);
    }

    /// A `use` path: one segment is enough to name a module (`use foo;`).
    fn push_use(&mut self, segs: Vec<String>) {
        if segs.is_empty() {
            return;
        }
        if matches!(segs[0].as_str(), "crate" | "self" | "super") {
            self.refs.push(Ref::Anchored(segs));
        } else {
            self.refs.push(Ref::Bare(segs));
        }
    }

    /// `crate::a::b`, `super::a`, `x::y` sequences in a macro's tokens.
    fn tokens(&mut self, tokens: TokenStream) {
        let trees: Vec<TokenTree> = tokens.into_iter().collect();
        let mut i = 0;
        while i < trees.len() {
            match &trees[i] {
                TokenTree::Group(g) => self.tokens(g.stream()),
                TokenTree::Ident(id) => {
                    let preceded_by_path =
                        i >= 2 && is_colon(&trees[i - 1]) && is_colon(&trees[i - 2]);
                    let mut segs = vec![id.to_string()];
                    let mut j = i + 1;
                    while j + 2 < trees.len() && is_colon(&trees[j]) && is_colon(&trees[j + 1]) {
                        match &trees[j + 2] {
                            TokenTree::Ident(next) => segs.push(next.to_string()),
                            _ => break,
                        }
                        j += 3;
                    }
                    if !preceded_by_path && segs.len() > 1 {
                        self.push(segs);
                        i = j;
                        continue;
                    }
                }
                _ => {}
            }
            i += 1;
        }
    }
}

fn is_colon(t: &TokenTree) -> bool {
    matches!(t, TokenTree::Punct(p) if p.as_char() == ':')
}

impl<'ast> Visit<'ast> for Collector<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
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
            _ => return syn::visit::visit_item(self, item),
        };
        if is_test_only(attrs) {
            return;
        }
        match item {
            syn::Item::Mod(m) => match &m.content {
                Some((_, items)) => self.inline.push((m.ident.to_string(), items.clone())),
                None => self.files.push(m.ident.to_string()),
            },
            syn::Item::Use(u) => self.use_tree(&u.tree, &mut Vec::new()),
            _ => syn::visit::visit_item(self, item),
        }
    }

    fn visit_impl_item(&mut self, item: &'ast syn::ImplItem) {
        let test_only = match item {
            syn::ImplItem::Const(i) => is_test_only(&i.attrs),
            syn::ImplItem::Fn(i) => is_test_only(&i.attrs),
            syn::ImplItem::Type(i) => is_test_only(&i.attrs),
            _ => false,
        };
        if !test_only {
            syn::visit::visit_impl_item(self, item);
        }
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        if path.leading_colon.is_none() {
            self.push(path.segments.iter().map(|s| s.ident.to_string()).collect());
        }
        syn::visit::visit_path(self, path);
    }

    /// `pub(crate)`, `pub(super)`, `pub(in path)` say who may use an item,
    /// not what it uses.
    fn visit_vis_restricted(&mut self, _: &'ast syn::VisRestricted) {}

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        self.tokens(mac.tokens.clone());
        syn::visit::visit_macro(self, mac);
    }
}

/// The file of `mod name;` declared in `parent` (`#[path]` is not used).
fn child_file(parent: &Path, owns_dir: bool, name: &str) -> Option<PathBuf> {
    let mut base = parent.parent()?.to_path_buf();
    if !owns_dir {
        base.push(parent.file_stem()?);
    }
    [
        base.join(format!("{name}.rs")),
        base.join(name).join("mod.rs"),
    ]
    .into_iter()
    .find(|p| p.exists())
}

/// Reads module `path`, whose items are `items` (from `file`), and its children.
fn load(
    modules: &mut BTreeMap<ModPath, Module>,
    path: ModPath,
    file: &Path,
    owns_dir: bool,
    items: &[syn::Item],
) {
    let mut module = Module::default();
    let mut c = Collector {
        refs: &mut module.refs,
        inline: Vec::new(),
        files: Vec::new(),
    };
    for item in items {
        c.visit_item(item);
    }
    let (inline, files) = (c.inline, c.files);
    for (name, _) in &inline {
        module.children.insert(name.clone());
    }
    for name in &files {
        module.children.insert(name.clone());
    }
    modules.insert(path.clone(), module);
    for (name, items) in inline {
        let mut p = path.clone();
        p.push(name);
        // Children of an inline module live in a folder named after it.
        load(modules, p, file, false, &items);
    }
    for name in files {
        let Some(f) = child_file(file, owns_dir, &name) else {
            continue;
        };
        let mut p = path.clone();
        p.push(name);
        let owns = f.file_name().is_some_and(|n| n == "mod.rs");
        let items = parse(&f);
        if !is_test_only(&items.attrs) {
            load(modules, p, &f, owns, &items.items);
        }
    }
}

fn parse(file: &Path) -> syn::File {
    let text = std::fs::read_to_string(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()))
}

/// The module a path written in module `at` names, or `None` (another
/// crate, a local item).
fn resolve(modules: &BTreeMap<ModPath, Module>, at: &[String], r: &Ref) -> Option<ModPath> {
    let mut full: ModPath = match r {
        Ref::Bare(segs) => {
            if !modules[at].children.contains(&segs[0]) {
                return None;
            }
            at.iter().chain(segs).cloned().collect()
        }
        Ref::Anchored(segs) => {
            let mut base = at.to_vec();
            let mut rest = segs.as_slice();
            if rest[0] == "crate" {
                base.clear();
                rest = &rest[1..];
            }
            while let Some(first) = rest.first() {
                match first.as_str() {
                    "self" => {}
                    "super" => {
                        base.pop();
                    }
                    _ => break,
                }
                rest = &rest[1..];
            }
            base.extend(rest.iter().cloned());
            base
        }
    };
    while !full.is_empty() && !modules.contains_key(&full) {
        let last = full.pop();
        if full.is_empty() {
            // A name the crate root re-exports stands for its module.
            if let Some(m) = last.and_then(|n| modules[&full].exports.get(&n).cloned()) {
                return Some(m);
            }
        }
    }
    Some(full)
}

fn crate_graph(dir: &Path) -> (BTreeSet<ModPath>, BTreeSet<(ModPath, ModPath)>) {
    let src = dir.join("src");
    let root = if src.join("lib.rs").exists() {
        src.join("lib.rs")
    } else {
        src.join("main.rs")
    };
    let mut modules = BTreeMap::new();
    load(&mut modules, Vec::new(), &root, true, &parse(&root).items);
    let exports: BTreeMap<String, ModPath> = modules[&Vec::new()]
        .refs
        .iter()
        .filter_map(|r| {
            let m = resolve(&modules, &[], r)?;
            let (Ref::Bare(s) | Ref::Anchored(s)) = r;
            (!m.is_empty()).then(|| (s.last().unwrap().clone(), m))
        })
        .collect();
    modules.get_mut(&Vec::new()).unwrap().exports = exports;
    let mut edges = BTreeSet::new();
    for (path, m) in &modules {
        for r in &m.refs {
            if let Some(t) = resolve(&modules, path, r)
                && &t != path
            {
                edges.insert((path.clone(), t));
            }
        }
    }
    (modules.into_keys().collect(), edges)
}

fn unit_of<'a>(path: &[String], units: &'a [ModPath]) -> Option<&'a ModPath> {
    units
        .iter()
        .filter(|u| path.starts_with(u))
        .max_by_key(|u| u.len())
}

fn split(s: &str) -> ModPath {
    s.split("::").map(str::to_owned).collect()
}

fn show(p: &[String]) -> String {
    if p.is_empty() {
        "(root)".into()
    } else {
        p.join("::")
    }
}

/// Tarjan's strongly connected components with more than one member.
fn circles(
    nodes: &[ModPath],
    succ: &BTreeMap<ModPath, BTreeSet<ModPath>>,
) -> Vec<BTreeSet<ModPath>> {
    struct T<'a> {
        succ: &'a BTreeMap<ModPath, BTreeSet<ModPath>>,
        index: BTreeMap<ModPath, usize>,
        low: BTreeMap<ModPath, usize>,
        stack: Vec<ModPath>,
        on: BTreeSet<ModPath>,
        out: Vec<BTreeSet<ModPath>>,
    }
    fn visit(t: &mut T, v: &ModPath) {
        let n = t.index.len();
        t.index.insert(v.clone(), n);
        t.low.insert(v.clone(), n);
        t.stack.push(v.clone());
        t.on.insert(v.clone());
        for w in t.succ.get(v).into_iter().flatten() {
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).unwrap();
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = BTreeSet::new();
            loop {
                let w = t.stack.pop().unwrap();
                t.on.remove(&w);
                comp.insert(w.clone());
                if &w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        succ,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        out: Vec::new(),
    };
    for v in nodes {
        if !t.index.contains_key(v) {
            visit(&mut t, v);
        }
    }
    t.out
}

/// Every breach of `spec` by the crate in `dir`, as sentences.
fn problems(name: &str, dir: &Path, spec: &CrateSpec) -> Vec<String> {
    let (modules, edges) = crate_graph(dir);
    let mut out = Vec::new();
    let units: Vec<ModPath> = spec
        .layer
        .iter()
        .flat_map(|l| l.modules.iter().map(|m| split(m)))
        .collect();
    let layer_of: BTreeMap<&ModPath, (usize, &str)> = spec
        .layer
        .iter()
        .enumerate()
        .flat_map(|(k, l)| l.modules.iter().map(move |m| (k, l.name.as_str(), m)))
        .map(|(k, n, m)| (units.iter().find(|u| **u == split(m)).unwrap(), (k, n)))
        .collect();
    for m in &modules {
        if !m.is_empty() && unit_of(m, &units).is_none() {
            out.push(format!(
                "{name}: module {} is in no layer of layers.toml",
                show(m)
            ));
        }
    }
    let allow: BTreeSet<(ModPath, ModPath)> = spec
        .allow
        .iter()
        .map(|e| {
            let (a, b) = e
                .split_once("->")
                .unwrap_or_else(|| panic!("allowance {e:?} is not `a -> b`"));
            (split(a.trim()), split(b.trim()))
        })
        .collect();
    let mut unit_edges = BTreeSet::new();
    for (a, b) in &edges {
        if a.is_empty() {
            continue; // the crate root only declares and re-exports
        }
        if let (Some(ua), Some(ub)) = (unit_of(a, &units), unit_of(b, &units))
            && ua != ub
        {
            unit_edges.insert((ua.clone(), ub.clone()));
        }
    }
    let mut succ: BTreeMap<ModPath, BTreeSet<ModPath>> = BTreeMap::new();
    for (a, b) in &unit_edges {
        if allow.contains(&(a.clone(), b.clone())) {
            continue;
        }
        let (la, na) = layer_of[a];
        let (lb, nb) = layer_of[b];
        if lb > la {
            out.push(format!(
                "{name}: {} (layer {na}) uses {} of a higher layer ({nb})",
                show(a),
                show(b)
            ));
        }
        succ.entry(a.clone()).or_default().insert(b.clone());
    }
    for comp in circles(&units, &succ) {
        let members: Vec<String> = comp.iter().map(|u| show(u)).collect();
        let inner: Vec<String> = unit_edges
            .iter()
            .filter(|(a, b)| {
                comp.contains(a) && comp.contains(b) && !allow.contains(&(a.clone(), b.clone()))
            })
            .map(|(a, b)| format!("{} -> {}", show(a), show(b)))
            .collect();
        out.push(format!(
            "{name}: circle among {}: {}",
            members.join(", "),
            inner.join(", ")
        ));
    }
    for (a, b) in &allow {
        if !unit_edges.contains(&(a.clone(), b.clone())) {
            out.push(format!(
                "{name}: allowance `{} -> {}` matches no import any more: remove it from layers.toml",
                show(a),
                show(b)
            ));
        }
    }
    out
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

#[test]
fn every_listed_crate_keeps_its_layers() {
    let text = std::fs::read_to_string(workspace().join("layers.toml")).unwrap();
    let spec: Spec = toml::from_str(&text).unwrap();
    assert!(spec.crates.contains_key("agent") && spec.crates.contains_key("client-lb"));
    let all: Vec<String> = spec
        .crates
        .iter()
        .flat_map(|(name, c)| problems(name, &workspace().join(name), c))
        .collect();
    assert!(
        all.is_empty(),
        "layering broken (layers.toml):\n  {}",
        all.join("\n  ")
    );
}

/// A throwaway crate: `(file under src/, contents)`.
fn fixture(name: &str, files: &[(&str, &str)]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("infermesh-layers-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    for (f, text) in files {
        let p = dir.join("src").join(f);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    }
    dir
}

fn two_layers(allow: &[&str]) -> CrateSpec {
    CrateSpec {
        layer: vec![
            Layer {
                name: "low".into(),
                modules: vec!["low".into(), "low::deep".into()],
            },
            Layer {
                name: "high".into(),
                modules: vec!["high".into()],
            },
        ],
        allow: allow.iter().map(|s| s.to_string()).collect(),
    }
}

#[test]
fn an_upward_import_a_circle_and_a_stale_allowance_are_each_caught() {
    let dir = fixture(
        "upward",
        &[
            (
                "lib.rs",
                "mod low;\npub mod high;\n#[cfg(test)]\nmod tests;\n",
            ),
            (
                "low.rs",
                "mod deep;\npub fn f() { super::high::g() }\n#[cfg(test)]\nfn t() { crate::high::g() }\n",
            ),
            (
                "low/deep.rs",
                "pub fn h() { tracing::info!(\"{}\", crate::high::G) }\n",
            ),
            (
                "high.rs",
                "use crate::low::{self, deep};\npub const G: u8 = 0;\npub fn g() { low::f(); deep::h() }\n",
            ),
            ("tests.rs", "use crate::high::g;\n"),
        ],
    );
    let found = problems(
        "fixture",
        &dir,
        &two_layers(&["low -> high", "high -> low::deep::x"]),
    );
    // `low -> high` is allowed; `low::deep -> high` (in a macro) is not, and
    // with `high -> low::deep` it closes a circle. Test-only code counts for nothing.
    assert_eq!(
        found,
        [
            "fixture: low::deep (layer low) uses high of a higher layer (high)",
            "fixture: circle among high, low::deep: high -> low::deep, low::deep -> high",
            "fixture: allowance `high -> low::deep::x` matches no import any more: remove it from layers.toml",
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_module_without_a_layer_is_caught() {
    let dir = fixture(
        "unlisted",
        &[
            ("lib.rs", "mod low;\nmod high;\nmod new;\n"),
            ("low.rs", ""),
            ("high.rs", ""),
            ("new.rs", ""),
        ],
    );
    let found = problems("fixture", &dir, &two_layers(&[]));
    assert_eq!(found, ["fixture: module new is in no layer of layers.toml"]);
    let _ = std::fs::remove_dir_all(&dir);
}
