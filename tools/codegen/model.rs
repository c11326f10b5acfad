//! What the generator knows of the headers: read from bindgen's output (with syn) and from `cuda.h`'s
//! own `#define` aliases.

use std::collections::BTreeMap;

use quote::ToTokens;
use syn::visit_mut::VisitMut;

/// One function declaration of `cuda.h`, under the name bindgen saw (its export, e.g. `cuMemAlloc_v2`).
pub struct Function {
    pub export: String,
    /// `(name, type as written in the header)` for each parameter.
    pub params: Vec<(String, syn::Type)>,
    /// The return type as written (`CUresult` for every driver function).
    pub output: Option<syn::Type>,
    /// bindgen's doc text (the header's comment), if any.
    pub doc: String,
}

/// One `PFN_<base>_v<version>[_ptsz|_ptds]` typedef of `cudaTypedefs.h`.
pub struct Pfn {
    pub typedef: String,
    pub base: String,
    pub version: u32,
    pub per_thread: bool,
    /// `_ptsz` or `_ptds` for a per-thread typedef.
    pub per_thread_suffix: Option<String>,
    pub params: Vec<syn::Type>,
    /// The parameter names the typedef gives (bindgen keeps them), where it gives one.
    pub param_names: Vec<Option<String>>,
    pub output: Option<syn::Type>,
}

/// One bindgen output, parsed.
pub struct Model {
    pub file: syn::File,
    pub functions: Vec<Function>,
    pub pfns: Vec<Pfn>,
    aliases: BTreeMap<String, syn::Type>,
}

impl Model {
    pub fn read(source: &str) -> Model {
        let file = syn::parse_file(source)
            .unwrap_or_else(|e| panic!("bindgen output does not parse: {e}"));
        let mut aliases = BTreeMap::new();
        let mut functions = Vec::new();
        let mut pfn_items = Vec::new();
        for item in &file.items {
            match item {
                syn::Item::Type(t) => {
                    let name = t.ident.to_string();
                    if name.starts_with("PFN_") {
                        pfn_items.push((name.clone(), (*t.ty).clone()));
                    }
                    aliases.insert(name, (*t.ty).clone());
                }
                syn::Item::ForeignMod(m) => {
                    for fi in &m.items {
                        if let syn::ForeignItem::Fn(f) = fi {
                            functions.push(read_function(f));
                        }
                    }
                }
                _ => {}
            }
        }
        let pfns = pfn_items
            .into_iter()
            .filter_map(|(name, ty)| read_pfn(&name, &ty))
            .collect();
        Model {
            file,
            functions,
            pfns,
            aliases,
        }
    }

    /// A type with every alias replaced by what it stands for and parameter names erased, printed: two
    /// types are the same C type exactly when these strings are equal.
    pub fn canonical(&self, ty: &syn::Type) -> String {
        let mut ty = ty.clone();
        Canonicalize {
            aliases: &self.aliases,
            depth: 0,
        }
        .visit_type_mut(&mut ty);
        ty.to_token_stream().to_string()
    }

    /// The parameter and return types of a signature, canonical.
    pub fn canonical_signature<'a>(
        &self,
        params: impl Iterator<Item = &'a syn::Type>,
        output: &Option<syn::Type>,
    ) -> String {
        let params: Vec<String> = params.map(|t| self.canonical(t)).collect();
        let output = output
            .as_ref()
            .map(|t| self.canonical(t))
            .unwrap_or_default();
        format!("({}) -> {}", params.join(", "), output)
    }

    /// Whether this output defines a type (struct, union, alias, enum) of this name.
    pub fn defines_type(&self, name: &str) -> bool {
        self.file.items.iter().any(|item| match item {
            syn::Item::Struct(i) => i.ident == name,
            syn::Item::Union(i) => i.ident == name,
            syn::Item::Type(i) => i.ident == name,
            syn::Item::Enum(i) => i.ident == name,
            syn::Item::Use(u) => use_names(&u.tree, name),
            _ => false,
        })
    }

    /// The `type NAME = ...;` item of this output.
    pub fn type_item(&self, name: &str) -> Option<&syn::ItemType> {
        self.file.items.iter().find_map(|item| match item {
            syn::Item::Type(t) if t.ident == name => Some(t),
            _ => None,
        })
    }

    /// Where rustdoc finds each type and constant of this output, for the docs' links: a type or a
    /// `#define`d constant `X` at `crate::types::X`, an enum's constant `C` at
    /// `crate::types::Enum::C` (the first enum that has it).
    pub fn link_targets(&self) -> BTreeMap<String, String> {
        let mut targets = BTreeMap::new();
        for item in &self.file.items {
            let mut add = |name: String, path: String| {
                targets.entry(name).or_insert(path);
            };
            match item {
                syn::Item::Struct(i) => {
                    add(i.ident.to_string(), format!("crate::types::{}", i.ident))
                }
                syn::Item::Union(i) => {
                    add(i.ident.to_string(), format!("crate::types::{}", i.ident))
                }
                syn::Item::Type(i) => {
                    add(i.ident.to_string(), format!("crate::types::{}", i.ident))
                }
                syn::Item::Enum(i) => {
                    add(i.ident.to_string(), format!("crate::types::{}", i.ident))
                }
                syn::Item::Const(i) => {
                    add(i.ident.to_string(), format!("crate::types::{}", i.ident))
                }
                syn::Item::Use(u) => {
                    if let syn::UseTree::Path(p) = &u.tree
                        && let syn::UseTree::Rename(r) = &*p.tree
                    {
                        add(r.rename.to_string(), format!("crate::types::{}", r.rename));
                    }
                }
                syn::Item::Impl(i) if i.trait_.is_none() => {
                    let syn::Type::Path(ty) = &*i.self_ty else {
                        continue;
                    };
                    let Some(owner) = ty.path.get_ident() else {
                        continue;
                    };
                    for member in &i.items {
                        if let syn::ImplItem::Const(c) = member {
                            add(
                                c.ident.to_string(),
                                format!("crate::types::{owner}::{}", c.ident),
                            );
                        }
                    }
                }
                _ => {}
            }
        }
        targets
    }

    /// bindgen's output less the `extern "C"` blocks: the types, constants and `PFN_` typedefs. The
    /// functions are reached only through the table, never by linking.
    pub fn bindings_without_functions(&self) -> String {
        let mut file = self.file.clone();
        file.items
            .retain(|item| !matches!(item, syn::Item::ForeignMod(_)));
        prettyplease::unparse(&file)
    }
}

fn read_function(f: &syn::ForeignItemFn) -> Function {
    let params = f
        .sig
        .inputs
        .iter()
        .map(|arg| match arg {
            syn::FnArg::Typed(pt) => {
                let name = match &*pt.pat {
                    syn::Pat::Ident(id) => id.ident.to_string(),
                    other => panic!("unexpected parameter pattern {}", other.to_token_stream()),
                };
                (name, (*pt.ty).clone())
            }
            syn::FnArg::Receiver(_) => panic!("a C function with a receiver"),
        })
        .collect();
    let output = match &f.sig.output {
        syn::ReturnType::Default => None,
        syn::ReturnType::Type(_, ty) => Some((**ty).clone()),
    };
    Function {
        export: f.sig.ident.to_string(),
        params,
        output,
        doc: doc_text(&f.attrs),
    }
}

/// `Option<unsafe extern "C" fn(..) -> R>` named `PFN_<base>_v<digits>[_ptsz|_ptds]`.
fn read_pfn(name: &str, ty: &syn::Type) -> Option<Pfn> {
    let rest = name.strip_prefix("PFN_")?;
    let (rest, per_thread_suffix) = match ["_ptsz", "_ptds"]
        .iter()
        .find_map(|suffix| Some((rest.strip_suffix(suffix)?, suffix.to_string())))
    {
        Some((r, suffix)) => (r, Some(suffix)),
        None => (rest, None),
    };
    let at = rest.rfind("_v")?;
    let (base, version) = (&rest[..at], &rest[at + 2..]);
    if version.is_empty() || !version.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let bare = option_bare_fn(ty)?;
    Some(Pfn {
        typedef: name.to_string(),
        base: base.to_string(),
        version: version.parse().ok()?,
        per_thread: per_thread_suffix.is_some(),
        per_thread_suffix,
        params: bare.inputs.iter().map(|a| a.ty.clone()).collect(),
        param_names: bare
            .inputs
            .iter()
            .map(|a| a.name.as_ref().map(|(n, _)| n.to_string()))
            .collect(),
        output: match &bare.output {
            syn::ReturnType::Default => None,
            syn::ReturnType::Type(_, t) => Some((**t).clone()),
        },
    })
}

fn option_bare_fn(ty: &syn::Type) -> Option<&syn::TypeFnPtr> {
    let syn::Type::Path(p) = ty else { return None };
    let last = p.path.segments.last()?;
    if last.ident != "Option" {
        return None;
    }
    let syn::PathArguments::AngleBracketed(args) = &last.arguments else {
        return None;
    };
    match args.args.first()? {
        syn::GenericArgument::Type(syn::Type::FnPtr(f)) => Some(f),
        _ => None,
    }
}

/// The text of `#[doc = "..."]` attributes, joined.
pub fn doc_text(attrs: &[syn::Attribute]) -> String {
    let mut out = String::new();
    for attr in attrs {
        if !attr.path().is_ident("doc") {
            continue;
        }
        if let syn::Meta::NameValue(nv) = &attr.meta
            && let syn::Expr::Lit(syn::ExprLit {
                lit: syn::Lit::Str(s),
                ..
            }) = &nv.value
        {
            out.push_str(&s.value());
            out.push('\n');
        }
    }
    out
}

struct Canonicalize<'a> {
    aliases: &'a BTreeMap<String, syn::Type>,
    depth: u32,
}

impl VisitMut for Canonicalize<'_> {
    fn visit_type_mut(&mut self, ty: &mut syn::Type) {
        if let syn::Type::Path(p) = ty
            && p.qself.is_none()
            && p.path.segments.len() == 1
            && matches!(p.path.segments[0].arguments, syn::PathArguments::None)
            && let Some(target) = self.aliases.get(&p.path.segments[0].ident.to_string())
        {
            assert!(
                self.depth < 64,
                "type alias cycle at {}",
                p.path.segments[0].ident
            );
            *ty = target.clone();
            self.depth += 1;
            self.visit_type_mut(ty);
            self.depth -= 1;
            return;
        }
        syn::visit_mut::visit_type_mut(self, ty);
    }

    fn visit_named_arg_mut(&mut self, arg: &mut syn::NamedArg) {
        arg.name = None;
        arg.attrs.clear();
        syn::visit_mut::visit_named_arg_mut(self, arg);
    }
}

/// Whether a `use` tree brings `name` into scope (`pub use self::cudaError_enum as CUresult;`).
fn use_names(tree: &syn::UseTree, name: &str) -> bool {
    match tree {
        syn::UseTree::Path(p) => use_names(&p.tree, name),
        syn::UseTree::Name(n) => n.ident == name,
        syn::UseTree::Rename(r) => r.rename == name,
        syn::UseTree::Group(g) => g.items.iter().any(|t| use_names(t, name)),
        syn::UseTree::Glob(_) => false,
    }
}

/// The single-segment type names a type mentions (`CUdevice`, `CUDA_MEMCPY2D_v1`), less `Option`.
pub fn named_types(ty: &syn::Type) -> Vec<String> {
    struct Names(Vec<String>);
    impl<'ast> syn::visit::Visit<'ast> for Names {
        fn visit_type_path(&mut self, p: &'ast syn::TypePath) {
            if p.qself.is_none() && p.path.leading_colon.is_none() && p.path.segments.len() == 1 {
                let name = p.path.segments[0].ident.to_string();
                if name != "Option" && !is_primitive(&name) {
                    self.0.push(name);
                }
            }
            syn::visit::visit_type_path(self, p);
        }
    }
    let mut names = Names(Vec::new());
    syn::visit::Visit::visit_type(&mut names, ty);
    names.0
}

fn is_primitive(name: &str) -> bool {
    matches!(
        name,
        "u8" | "u16"
            | "u32"
            | "u64"
            | "u128"
            | "usize"
            | "i8"
            | "i16"
            | "i32"
            | "i64"
            | "i128"
            | "isize"
            | "f32"
            | "f64"
            | "bool"
            | "char"
    )
}

/// `#define PUBLIC EXPORT` and `#define PUBLIC __CUDA_API_PTDS(EXPORT)` lines of `cuda.h`: which public
/// name a user writes for each versioned export (`cuMemAlloc` for `cuMemAlloc_v2`). Keyed by export.
pub fn public_aliases(cuda_h: &str) -> BTreeMap<String, Vec<String>> {
    let mut map: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in cuda_h.lines() {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") {
            continue;
        }
        let (Some(name), Some(value), None) = (words.next(), words.next(), words.next()) else {
            continue;
        };
        if !name.starts_with("cu") || !is_ident(name) {
            continue;
        }
        let target = ["__CUDA_API_PTDS(", "__CUDA_API_PTSZ("]
            .iter()
            .find_map(|p| value.strip_prefix(p).and_then(|v| v.strip_suffix(')')))
            .unwrap_or(value);
        if is_ident(target) && target != name {
            map.entry(target.to_string())
                .or_default()
                .push(name.to_string());
        }
    }
    map
}

fn is_ident(s: &str) -> bool {
    !s.is_empty()
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && !s.as_bytes()[0].is_ascii_digit()
}

/// `CUDA_VERSION` of `cuda.h`.
pub fn cuda_version(cuda_h: &str) -> u32 {
    cuda_h
        .lines()
        .find_map(|l| l.trim().strip_prefix("#define CUDA_VERSION "))
        .and_then(|v| v.trim().parse().ok())
        .expect("cuda.h defines CUDA_VERSION")
}

/// Every `PFN_<base>_v<version>` of `cudaTypedefs.h`, read as text so the typedefs under
/// `__CUDA_API_VERSION_INTERNAL` count too: base → versions, ascending.
pub fn all_typedef_versions(typedefs_h: &str) -> BTreeMap<String, Vec<u32>> {
    let mut map: BTreeMap<String, Vec<u32>> = BTreeMap::new();
    for word in typedefs_h.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        let Some(rest) = word.strip_prefix("PFN_") else {
            continue;
        };
        if rest.ends_with("_ptsz") || rest.ends_with("_ptds") {
            continue;
        }
        let Some(at) = rest.rfind("_v") else { continue };
        let Ok(version) = rest[at + 2..].parse::<u32>() else {
            continue;
        };
        let versions = map.entry(rest[..at].to_string()).or_default();
        if !versions.contains(&version) {
            versions.push(version);
        }
    }
    for versions in map.values_mut() {
        versions.sort_unstable();
    }
    map
}
