//! Derives the driver-function table: for each function `cuda.h` declares, the `PFN_<base>_v<version>`
//! typedef of `cudaTypedefs.h` whose signature equals the declaration's, which gives the ABI version the
//! Rust signature binds and the symbol `cuGetProcAddress` takes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::model::{Function, Model, Pfn};

#[derive(Clone)]
pub struct Entry {
    /// The name users write (`cuMemAlloc`, `cuLaunchHostFunc_v2`).
    pub name: String,
    /// The base name `cuGetProcAddress` takes (`cuMemAlloc`, `cuLaunchHostFunc`).
    pub symbol: String,
    /// The ABI version the signature binds (`3020` for `cuMemAlloc`).
    pub version: u32,
    /// The library export of that version (`cuMemAlloc_v2`), used on drivers older than 11.3.
    pub export: String,
    /// The export with per-thread default-stream semantics (`cuStreamSynchronize_ptsz`), if any.
    pub per_thread_export: Option<String>,
    /// The ABI version of that per-thread variant (`7000` for `cuStreamSynchronize_ptsz`).
    pub per_thread_version: Option<u32>,
    pub params: Vec<(String, String)>,
    pub pfn: String,
    /// The version in `pfn`'s name where `cudaTypedefs.h` marks it a placeholder: `version` is
    /// then the one the driver registers the variant at (`registered_versions`).
    pub placeholder: Option<u32>,
    /// The header's Doxygen comment of the declaration (empty for an older ABI variant, which
    /// `cuda.h` does not document).
    pub doc: String,
    /// What the entry is: a `cuda.h` declaration, an export name of one, or an older ABI variant.
    pub kind: EntryKind,
    /// The canonical C signature (aliases resolved), to find the variants that share it.
    pub signature: String,
    /// The entries of the same symbol with this signature, newest version first, one per version:
    /// what `Driver::newest_variant` chooses among.
    pub family: Vec<String>,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub enum EntryKind {
    Declared,
    ExportName,
    Variant,
}

pub struct LeftOut {
    pub name: String,
    pub reason: String,
}

pub struct Table {
    pub entries: Vec<Entry>,
    pub left_out: Vec<LeftOut>,
    pub ambiguous: Vec<String>,
    /// `cuda.h` macro names with no typedef of their own, served by their target's entry.
    pub alias_only: Vec<(String, String)>,
    /// `PFN_` typedefs with no entry, and why.
    pub typedefs_left_out: Vec<(String, String)>,
    /// The typedefs of `cudaTypedefs.h`'s `__CUDA_API_VERSION_INTERNAL` part that entries use: their
    /// items go into bindings.rs beside the public ones.
    pub internal_typedefs: Vec<String>,
}

pub fn build(
    normal: &Model,
    per_thread: &Model,
    internal: &Model,
    aliases: &BTreeMap<String, Vec<String>>,
    all_versions: &BTreeMap<String, Vec<u32>>,
) -> Table {
    assert_eq!(
        normal.functions.len(),
        per_thread.functions.len(),
        "the per-thread view of cuda.h declares a different number of functions"
    );
    let mut by_base: BTreeMap<&str, Vec<&Pfn>> = BTreeMap::new();
    let mut per_thread_by_base: BTreeMap<&str, Vec<&Pfn>> = BTreeMap::new();
    for pfn in &normal.pfns {
        let map = if pfn.per_thread {
            &mut per_thread_by_base
        } else {
            &mut by_base
        };
        map.entry(&pfn.base).or_default().push(pfn);
    }
    let result_type = normal.canonical(&syn::parse_quote!(CUresult));

    let mut entries = Vec::new();
    let mut keys = BTreeSet::new();
    let mut left_out = Vec::new();
    let mut ambiguous = Vec::new();
    let mut alias_only = Vec::new();
    for (f, pt) in normal.functions.iter().zip(&per_thread.functions) {
        let per_thread_export = per_thread_export(f, &pt.export);
        let signature = normal.canonical_signature(f.params.iter().map(|(_, t)| t), &f.output);
        if f.output.as_ref().map(|t| normal.canonical(t)) != Some(result_type.clone()) {
            left_out.push(LeftOut {
                name: f.export.clone(),
                reason: "does not return CUresult".into(),
            });
            continue;
        }
        // Public aliases first (`cuMemAlloc` for `cuMemAlloc_v2`), then the export's own name.
        let mut names: Vec<&str> = aliases
            .get(&f.export)
            .map(|v| v.iter().map(String::as_str).collect())
            .unwrap_or_default();
        names.push(&f.export);
        let mut reasons = Vec::new();
        let mut produced = false;
        for name in names {
            let Some((base, pfns)) = pfn_family(&by_base, name) else {
                if name != f.export {
                    alias_only.push((name.to_string(), f.export.clone()));
                }
                reasons.push(format!("no PFN_{name}_v* typedef"));
                continue;
            };
            let matching: Vec<&&Pfn> = pfns
                .iter()
                .filter(|p| normal.canonical_signature(p.params.iter(), &p.output) == signature)
                .collect();
            // The export's own suffix names its variant: `X` is the first version of X, `X_v2` the
            // second, `X_v3` the third (counting every PFN_X_v* of cudaTypedefs.h, hidden ones too).
            let by_export = export_variant(&f.export, base)
                .and_then(|k| all_versions.get(base)?.get(k - 1).copied());
            let chosen = if matching.len() > 1 {
                matching.iter().find(|p| Some(p.version) == by_export)
            } else {
                matching.first()
            };
            let Some(pfn) = chosen else {
                let versions: Vec<String> = pfns.iter().map(|p| p.version.to_string()).collect();
                reasons.push(format!(
                    "no PFN_{base}_v* typedef has its signature (versions {})",
                    versions.join(", ")
                ));
                continue;
            };
            produced = true;
            // Several names of one export can reach the same (symbol, version): keep the first, the
            // public alias.
            if !keys.insert((base.to_string(), pfn.version)) {
                continue;
            }
            if matching.len() > 1 {
                ambiguous.push(format!(
                    "`{name}` (export `{}`): {} typedefs share the signature; the export's suffix \
                     picks v{}",
                    f.export,
                    matching.len(),
                    pfn.version
                ));
            } else if by_export.is_some_and(|v| v != pfn.version) {
                panic!(
                    "{name}: the signature picks v{} but the export {} suggests v{:?}",
                    pfn.version, f.export, by_export
                );
            }
            // The per-thread variant has its own typedef (`PFN_cuStreamSynchronize_v7000_ptsz`):
            // the first version, at or after the legacy one, with the same signature.
            let per_thread_version = per_thread_export.as_ref().and_then(|_| {
                per_thread_by_base
                    .get(base)?
                    .iter()
                    .filter(|p| p.version >= pfn.version)
                    .filter(|p| normal.canonical_signature(p.params.iter(), &p.output) == signature)
                    .map(|p| p.version)
                    .min()
            });
            if per_thread_export.is_some() && per_thread_version.is_none() {
                panic!("{name}: a per-thread export but no matching PFN_{base}_v*_ptsz typedef");
            }
            entries.push(Entry {
                per_thread_version,
                name: name.to_string(),
                symbol: base.to_string(),
                version: pfn.version,
                export: f.export.clone(),
                per_thread_export: per_thread_export.clone(),
                params: f
                    .params
                    .iter()
                    .map(|(n, t)| (n.clone(), print_type(t)))
                    .collect(),
                pfn: pfn.typedef.clone(),
                placeholder: None,
                doc: f.doc.clone(),
                kind: EntryKind::Declared,
                signature: internal.canonical_signature(f.params.iter().map(|(_, t)| t), &f.output),
                family: Vec::new(),
            });
        }
        if !produced {
            left_out.push(LeftOut {
                name: f.export.clone(),
                reason: reasons.join("; "),
            });
        }
    }
    let (typedefs_left_out, internal_typedefs) =
        add_variants(&mut entries, &mut keys, normal, internal, all_versions);
    for e in &mut entries {
        use_registered_versions(e);
    }
    // Each entry's family: the entries of its symbol and signature, newest first, one per version
    // (a declaration before the export name or variant of the same version).
    let families: Vec<Vec<String>> = entries
        .iter()
        .map(|e| {
            let mut members: Vec<&Entry> = entries
                .iter()
                .filter(|o| o.symbol == e.symbol && o.signature == e.signature)
                .collect();
            members.sort_by_key(|o| (std::cmp::Reverse(o.version), o.kind != EntryKind::Declared));
            members.dedup_by_key(|o| o.version);
            members.iter().map(|o| o.name.clone()).collect()
        })
        .collect();
    for (e, family) in entries.iter_mut().zip(families) {
        e.family = family;
    }
    Table {
        entries,
        left_out,
        ambiguous,
        alias_only,
        typedefs_left_out,
        internal_typedefs,
    }
}

/// Issue 23: every `PFN_<base>_v<version>` of `cudaTypedefs.h` is an entry of its own. Adds
/// (1) for each declared entry whose export is not its name (`cuCtxCreate` is the export
/// `cuCtxCreate_v4`), an entry under the export's name; (2) for every typedef whose (base, version)
/// no entry has yet, an entry with the typedef's signature, named by its export (`X` is the first
/// version of `X`, `X_v2` the second, ..., counting every typedef, the internal ones too), or
/// `<base>_v<version>` where that export's name is taken by a newer variant (`cuEventElapsedTime`
/// is 12.8's, so 2.0's is `cuEventElapsedTime_v2000`). The `__CUDA_API_VERSION_INTERNAL` typedefs
/// are read from `internal` and kept where every type they name is public.
fn add_variants(
    entries: &mut Vec<Entry>,
    keys: &mut BTreeSet<(String, u32)>,
    normal: &Model,
    internal: &Model,
    all_versions: &BTreeMap<String, Vec<u32>>,
) -> (Vec<(String, String)>, Vec<String>) {
    let mut names: BTreeSet<String> = entries.iter().map(|e| e.name.clone()).collect();
    let declared: Vec<Entry> = entries.clone();
    for e in &declared {
        if e.export != e.name && names.insert(e.export.clone()) {
            entries.push(Entry {
                name: e.export.clone(),
                kind: EntryKind::ExportName,
                ..e.clone()
            });
        }
    }

    // Every typedef: the public ones as a normal program sees them, then the internal ones.
    let mut pfns: Vec<(&Pfn, bool)> = normal.pfns.iter().map(|p| (p, false)).collect();
    for p in &internal.pfns {
        if !normal.pfns.iter().any(|n| n.typedef == p.typedef) {
            pfns.push((p, true));
        }
    }
    let available = |p: &Pfn| -> Result<(), String> {
        let missing: BTreeSet<String> = p
            .params
            .iter()
            .chain(p.output.iter())
            .flat_map(super::model::named_types)
            .filter(|n| !normal.defines_type(n))
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "names types only `__CUDA_API_VERSION_INTERNAL` defines: {}",
                missing.into_iter().collect::<Vec<_>>().join(", ")
            ))
        }
    };
    let mut left_out = Vec::new();
    let mut internal_used = Vec::new();
    let mut legacy: Vec<&(&Pfn, bool)> = pfns.iter().filter(|(p, _)| !p.per_thread).collect();
    legacy.sort_by(|a, b| (&a.0.base, a.0.version).cmp(&(&b.0.base, b.0.version)));
    for &&(pfn, is_internal) in &legacy {
        if keys.contains(&(pfn.base.clone(), pfn.version)) {
            continue;
        }
        if let Err(reason) = available(pfn) {
            left_out.push((pfn.typedef.clone(), reason));
            continue;
        }
        let ordinal = all_versions
            .get(&pfn.base)
            .and_then(|v| v.iter().position(|&x| x == pfn.version))
            .map(|i| i + 1)
            .unwrap_or_else(|| panic!("{} is not among cudaTypedefs.h's versions", pfn.typedef));
        let export = if ordinal == 1 {
            pfn.base.clone()
        } else {
            format!("{}_v{ordinal}", pfn.base)
        };
        let name = if names.contains(&export) {
            format!("{}_v{}", pfn.base, pfn.version)
        } else {
            export.clone()
        };
        if names.contains(&name) {
            left_out.push((pfn.typedef.clone(), format!("the name `{name}` is taken")));
            continue;
        }
        let signature = internal.canonical_signature(pfn.params.iter(), &pfn.output);
        let per_thread = pfns
            .iter()
            .filter(|(p, _)| p.per_thread && p.base == pfn.base && p.version >= pfn.version)
            .filter(|(p, _)| internal.canonical_signature(p.params.iter(), &p.output) == signature)
            .filter(|(p, _)| available(p).is_ok())
            .min_by_key(|(p, _)| p.version);
        if let Some((p, true)) = per_thread {
            internal_used.push(p.typedef.clone());
        }
        if is_internal {
            internal_used.push(pfn.typedef.clone());
        }
        keys.insert((pfn.base.clone(), pfn.version));
        names.insert(name.clone());
        entries.push(Entry {
            name,
            symbol: pfn.base.clone(),
            version: pfn.version,
            per_thread_export: per_thread.map(|(p, _)| {
                format!(
                    "{export}{}",
                    p.per_thread_suffix.as_deref().unwrap_or("_ptsz")
                )
            }),
            per_thread_version: per_thread.map(|(p, _)| p.version),
            export,
            params: pfn
                .params
                .iter()
                .zip(&pfn.param_names)
                .enumerate()
                .map(|(i, (t, n))| {
                    (
                        n.clone().unwrap_or_else(|| format!("arg{i}")),
                        print_type(t),
                    )
                })
                .collect(),
            pfn: pfn.typedef.clone(),
            placeholder: None,
            doc: String::new(),
            kind: EntryKind::Variant,
            signature,
            family: Vec::new(),
        });
    }
    internal_used.sort();
    internal_used.dedup();
    (left_out, internal_used)
}

/// An entry made from a typedef whose version `cudaTypedefs.h` marks as a placeholder is requested
/// and gated at the version the driver registers it at (`registered_versions::REGISTERED`), its
/// per-thread variant likewise; it keeps the placeholder in `placeholder`.
fn use_registered_versions(e: &mut Entry) {
    let Some(registered) = super::registered_versions::registered(&e.pfn) else {
        return;
    };
    e.placeholder = Some(e.version);
    e.version = registered;
    if let Some(version) = e.per_thread_version {
        let twin = ["_ptsz", "_ptds"].iter().find_map(|suffix| {
            super::registered_versions::registered(&format!("PFN_{}_v{version}{suffix}", e.symbol))
        });
        match twin {
            Some(v) => e.per_thread_version = Some(v),
            None => panic!(
                "{}: its typedef {} has a registered version, its per-thread twin (v{version}) \
                 none; list both in tools/codegen/registered_versions.rs",
                e.name, e.pfn
            ),
        }
    }
}

/// The `PFN_` typedefs for `name`, or for `name` less a `_v<digits>` suffix (`cuLaunchHostFunc_v2` is
/// `PFN_cuLaunchHostFunc_v13010`).
fn pfn_family<'a, 'b>(
    by_base: &'b BTreeMap<&'a str, Vec<&'a Pfn>>,
    name: &'b str,
) -> Option<(&'a str, &'b Vec<&'a Pfn>)> {
    if let Some((k, v)) = by_base.get_key_value(name) {
        return Some((k, v));
    }
    let at = name.rfind("_v")?;
    let digits = &name[at + 2..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    by_base.get_key_value(&name[..at]).map(|(k, v)| (*k, v))
}

/// An ABI version as people write it: `3020` → `3.2`.
pub fn version_text(version: u32) -> String {
    format!("{}.{}", version / 1000, (version % 1000) / 10)
}

/// `X` → 1, `X_v2` → 2, `X_v3` → 3 (for base `X`); `None` for an export of another stem.
fn export_variant(export: &str, base: &str) -> Option<usize> {
    if export == base {
        return Some(1);
    }
    export.strip_prefix(base)?.strip_prefix("_v")?.parse().ok()
}

fn per_thread_export(f: &Function, per_thread_name: &str) -> Option<String> {
    if per_thread_name == f.export {
        return None;
    }
    let suffix = per_thread_name
        .strip_prefix(f.export.as_str())
        .unwrap_or_else(|| {
            panic!(
                "declaration order differs: {} vs {per_thread_name}",
                f.export
            )
        });
    assert!(
        suffix == "_ptsz" || suffix == "_ptds",
        "unexpected per-thread export {per_thread_name} for {}",
        f.export
    );
    Some(per_thread_name.to_string())
}

fn print_type(ty: &syn::Type) -> String {
    let file: syn::File = syn::parse_quote!(type T = #ty;);
    let text = prettyplease::unparse(&file);
    text.trim()
        .strip_prefix("type T = ")
        .and_then(|t| t.strip_suffix(';'))
        .unwrap_or_else(|| panic!("cannot print type: {text}"))
        .to_string()
}

impl Table {
    /// The declarative table: one line per entry, after its documentation (see
    /// [`Table::docs`]). `links` maps the names the header's comments mention to their rustdoc
    /// paths (types and constants; the table's entries are added here).
    pub fn render_table(&self, links: &BTreeMap<String, String>) -> String {
        let mut links = links.clone();
        for e in &self.entries {
            links.insert(e.name.clone(), format!("crate::functions::{}", e.name));
        }
        let link = |name: &str| links.get(name).cloned();
        let mut s = String::new();
        s.push_str(
            "// One entry per driver function: `#[summary = \"what it does\"]`, the header's documentation\n\
             // as Markdown (`///`), then `name(params) = ABI version, the same as people write it,\n\
             // cuGetProcAddress symbol, library export, per-thread export (\"\" if none), its ABI version\n\
             // (0 if none), PFN typedef, `placeholder <its version>,` where cudaTypedefs.h marks the\n\
             // typedef's version a placeholder (the ABI version is then the one the driver registers),\n\
             // [the entries of its symbol with its signature, newest first];`.\n\
             // See cuda-sys/src/table.rs and functions.rs.\n",
        );
        s.push_str("driver_function_table! {\n");
        for e in &self.entries {
            let (summary, mut body) = self.docs(e, &link);
            if let Some(placeholder) = e.placeholder {
                body.push(String::new());
                body.push(format!(
                    "ABI version {}: `cudaTypedefs.h` names its typedef `{}` with a placeholder \
                     version ({placeholder}, \"Update {placeholder} to a proper version number\"); \
                     the driver registers this variant at {}: {}. It is requested and gated \
                     there, and the pointer `cuGetProcAddress` returns is checked against the \
                     library's export `{}` (`MissingReason::OtherVariant` if it is another).",
                    version_text(e.version),
                    e.pfn,
                    version_text(e.version),
                    super::registered_versions::REGISTERED
                        .iter()
                        .find(|r| r.typedef == e.pfn)
                        .map_or("", |r| r.source),
                    e.export,
                ));
            }
            let _ = writeln!(s, "    #[summary = {summary:?}]");
            for line in body {
                let line = line.trim_end();
                if line.is_empty() {
                    let _ = writeln!(s, "    ///");
                } else {
                    let _ = writeln!(s, "    /// {line}");
                }
            }
            let params: Vec<String> = e.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
            let placeholder = e
                .placeholder
                .map(|v| format!("placeholder {v}, "))
                .unwrap_or_default();
            let _ = writeln!(
                s,
                "    {}({}) = {}, {:?}, {:?}, {:?}, {:?}, {}, {}, {placeholder}[{}];",
                e.name,
                params.join(", "),
                e.version,
                version_text(e.version),
                e.symbol,
                e.export,
                e.per_thread_export.as_deref().unwrap_or(""),
                e.per_thread_version.unwrap_or(0),
                e.pfn,
                e.family.join(", ")
            );
        }
        s.push_str("}\n");
        s
    }

    /// An entry's one-sentence summary and its Markdown documentation: a declaration's from the
    /// header's comment; an export name's and an older variant's pointing at the declaration
    /// that carries the header's text.
    fn docs(&self, e: &Entry, link: &dyn Fn(&str) -> Option<String>) -> (String, Vec<String>) {
        let declared = |name: Option<&str>| {
            self.entries
                .iter()
                .filter(|d| d.kind == EntryKind::Declared && d.symbol == e.symbol)
                .filter(|d| name.is_none_or(|n| d.name == n))
                .max_by_key(|d| d.version)
        };
        match e.kind {
            EntryKind::Declared => {
                let doc = super::doc_markdown::convert(&e.doc, link)
                    .unwrap_or_else(|error| panic!("{}'s documentation: {error}", e.name));
                let summary = if doc.summary.is_empty() {
                    format!("`{}` (the header does not document it).", e.name)
                } else {
                    doc.summary
                };
                (summary, doc.body)
            }
            EntryKind::ExportName => {
                let of = self
                    .entries
                    .iter()
                    .find(|d| {
                        d.kind == EntryKind::Declared
                            && d.symbol == e.symbol
                            && d.version == e.version
                    })
                    .unwrap_or_else(|| panic!("{}: no declaration of this export", e.name));
                let summary = super::doc_markdown::convert(&of.doc, link)
                    .unwrap_or_else(|error| panic!("{}'s documentation: {error}", of.name))
                    .summary;
                let body = vec![format!(
                    "[`{0}`](crate::functions::{0}) under its export's name, `{1}`: the same \
                     function, ABI version {2}.",
                    of.name,
                    e.name,
                    version_text(e.version)
                )];
                (summary, body)
            }
            EntryKind::Variant => {
                let summary = format!(
                    "The ABI variant {} of `{}`, with `{}`'s signature.",
                    version_text(e.version),
                    e.symbol,
                    e.pfn
                );
                let body = match declared(None) {
                    Some(newest) => vec![format!(
                        "`cuda.h` documents the function as [`{0}`](crate::functions::{0}), \
                         bound at ABI version {1}; this older ABI may differ in signature or \
                         behaviour.",
                        newest.name,
                        version_text(newest.version)
                    )],
                    None => Vec::new(),
                };
                (summary, body)
            }
        }
    }

    pub fn render_report(&self, cuda_version: u32, package: &str) -> String {
        let mut s = String::new();
        let _ = writeln!(s, "# The driver-function table\n");
        let _ = writeln!(
            s,
            "Generated by `tools/codegen` from `cuda.h` and `cudaTypedefs.h` of `{package}` \
             (CUDA_VERSION {cuda_version}). Do not edit: run `scripts/regenerate-bindings`.\n"
        );
        let per_thread = self
            .entries
            .iter()
            .filter(|e| e.per_thread_export.is_some())
            .count();
        let declared = self
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::Declared)
            .count();
        let _ = writeln!(
            s,
            "- entries in the table: **{}** ({declared} `cuda.h` declarations, {} export names, {} \
             older ABI variants)",
            self.entries.len(),
            self.entries
                .iter()
                .filter(|e| e.kind == EntryKind::ExportName)
                .count(),
            self.entries
                .iter()
                .filter(|e| e.kind == EntryKind::Variant)
                .count()
        );
        let _ = writeln!(
            s,
            "- with a per-thread default-stream variant: {per_thread}"
        );
        let _ = writeln!(
            s,
            "- declarations of `cuda.h` left out: {}\n",
            self.left_out.len()
        );
        let mut by_major: BTreeMap<u32, usize> = BTreeMap::new();
        for e in self
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::Declared)
        {
            *by_major.entry(e.version / 1000).or_default() += 1;
        }
        let _ = writeln!(s, "| ABI version | functions |\n| --- | --- |");
        for (major, n) in by_major {
            let _ = writeln!(s, "| {major}.x | {n} |");
        }
        let _ = writeln!(s, "\n## Left out\n");
        if self.left_out.is_empty() {
            let _ = writeln!(s, "None: every function `cuda.h` declares is in the table.");
        }
        for l in &self.left_out {
            let _ = writeln!(s, "- `{}`: {}", l.name, l.reason);
        }
        let _ = writeln!(
            s,
            "\n## Entries whose name is not their `cuGetProcAddress` symbol\n"
        );
        let _ = writeln!(
            s,
            "| name | symbol | version | export |\n| --- | --- | --- | --- |"
        );
        for e in self
            .entries
            .iter()
            .filter(|e| e.name != e.symbol && e.kind == EntryKind::Declared)
        {
            let _ = writeln!(
                s,
                "| `{}` | `{}` | {} | `{}` |",
                e.name,
                e.symbol,
                version_text(e.version),
                e.export
            );
        }
        if !self.alias_only.is_empty() {
            let _ = writeln!(s, "\n## `cuda.h` macro names served by another entry\n");
            for (alias, target) in &self.alias_only {
                match self.entries.iter().find(|e| &e.name == alias) {
                    // An older ABI's export has the macro's name (cuGraphInstantiate, 10.0).
                    Some(e) => {
                        let _ = writeln!(
                            s,
                            "- `{alias}` is `#define`d to `{target}`: for what the macro means, call \
                             `{target}`. The table's `{alias}` is the export of that name, the ABI \
                             variant {} (`{}`), with that older signature.",
                            version_text(e.version),
                            e.pfn
                        );
                    }
                    None => {
                        let _ = writeln!(
                            s,
                            "- `{alias}` is `#define`d to `{target}` and has no typedef of its own: \
                             call `{target}`."
                        );
                    }
                }
            }
        }
        let variants: Vec<&Entry> = self
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::Variant)
            .collect();
        let _ = writeln!(
            s,
            "\n## ABI variants\n\nEvery `PFN_<name>_v<version>` of `cudaTypedefs.h` that no declaration \
             of `cuda.h` binds is an entry of its own: {} variants, each with its typedef's \
             signature, gated on its version and resolved lazily (`cuGetProcAddress` at that \
             version; before 11.3, the export).\n",
            variants.len()
        );
        let _ = writeln!(
            s,
            "| name | symbol | version | export | per-thread export |\n| --- | --- | --- | --- | --- |"
        );
        for e in &variants {
            let _ = writeln!(
                s,
                "| `{}` | `{}` | {} | `{}` | {} |",
                e.name,
                e.symbol,
                version_text(e.version),
                e.export,
                e.per_thread_export
                    .as_deref()
                    .map(|p| format!(
                        "`{p}` ({})",
                        version_text(e.per_thread_version.unwrap_or(0))
                    ))
                    .unwrap_or_default()
            );
        }
        let _ = writeln!(
            s,
            "\n## Placeholder versions\n\nTypedefs whose version `cudaTypedefs.h` marks \
             \"Update <N> to a proper version number\": their entries are requested and gated at \
             the version the driver registers them at (`tools/codegen/registered_versions.rs`), \
             and checked against the library's export at resolution.\n"
        );
        let _ = writeln!(
            s,
            "| name | typedef | placeholder | requested at | per-thread |\n| --- | --- | --- | --- | --- |"
        );
        for e in self.entries.iter().filter(|e| e.placeholder.is_some()) {
            let _ = writeln!(
                s,
                "| `{}` | `{}` | {} | {} | {} |",
                e.name,
                e.pfn,
                e.placeholder.unwrap_or(0),
                e.version,
                e.per_thread_version
                    .map(|v| v.to_string())
                    .unwrap_or_default()
            );
        }
        let exports: Vec<String> = self
            .entries
            .iter()
            .filter(|e| e.kind == EntryKind::ExportName)
            .map(|e| format!("`{}`", e.name))
            .collect();
        let _ = writeln!(
            s,
            "\n## Export names\n\n{} entries repeat a declaration under its export's name (the \
             name cudarc and the headers' exports use): {}.",
            exports.len(),
            exports.join(", ")
        );
        let _ = writeln!(s, "\n## Typedefs without an entry\n");
        if self.typedefs_left_out.is_empty() {
            let _ = writeln!(s, "None.");
        }
        for (typedef, reason) in &self.typedefs_left_out {
            let _ = writeln!(s, "- `{typedef}`: {reason}");
        }
        if !self.ambiguous.is_empty() {
            let _ = writeln!(
                s,
                "\n## Several typedefs with one signature (the export's suffix decides)\n"
            );
            for a in &self.ambiguous {
                let _ = writeln!(s, "- {a}");
            }
        }
        s
    }
}
