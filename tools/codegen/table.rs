//! Derives the driver-function table: for each function `cuda.h` declares, the `PFN_<base>_v<version>`
//! typedef of `cudaTypedefs.h` whose signature equals the declaration's, which gives the ABI version the
//! Rust signature binds and the symbol `cuGetProcAddress` takes.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use super::model::{Function, Model, Pfn};

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
    pub brief: String,
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
}

pub fn build(
    normal: &Model,
    per_thread: &Model,
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
                brief: brief(f),
            });
        }
        if !produced {
            left_out.push(LeftOut {
                name: f.export.clone(),
                reason: reasons.join("; "),
            });
        }
    }
    Table {
        entries,
        left_out,
        ambiguous,
        alias_only,
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

/// The header comment's `\brief` sentence, on one line.
fn brief(f: &Function) -> String {
    let doc = f.doc.as_str();
    let text = match doc.find("\\brief") {
        Some(at) => &doc[at + "\\brief".len()..],
        None => doc,
    };
    let text = text.replace("```text", "").replace("```", "");
    let para = text.trim_start().split("\n\n").next().unwrap_or("");
    let line = para.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.is_empty() {
        format!("`{}`", f.export)
    } else {
        line
    }
}

impl Table {
    pub fn render_table(&self) -> String {
        let mut s = String::new();
        s.push_str(
            "// One line per driver function: `name(params) = ABI version, cuGetProcAddress symbol,\n\
             // library export, per-thread export (\"\" if none), its ABI version (0 if none), PFN\n\
             // typedef;`. See cuda-sys/src/table.rs.\n",
        );
        s.push_str("driver_function_table! {\n");
        for e in &self.entries {
            let _ = writeln!(s, "    /// {}", e.brief.replace('\n', " "));
            let params: Vec<String> = e.params.iter().map(|(n, t)| format!("{n}: {t}")).collect();
            let _ = writeln!(
                s,
                "    {}({}) = {}, {:?}, {:?}, {:?}, {}, {};",
                e.name,
                params.join(", "),
                e.version,
                e.symbol,
                e.export,
                e.per_thread_export.as_deref().unwrap_or(""),
                e.per_thread_version.unwrap_or(0),
                e.pfn
            );
        }
        s.push_str("}\n");
        s
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
        let _ = writeln!(s, "- functions in the table: **{}**", self.entries.len());
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
        for e in &self.entries {
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
        for e in self.entries.iter().filter(|e| e.name != e.symbol) {
            let _ = writeln!(
                s,
                "| `{}` | `{}` | {} | `{}` |",
                e.name, e.symbol, e.version, e.export
            );
        }
        if !self.alias_only.is_empty() {
            let _ = writeln!(s, "\n## `cuda.h` macro names served by another entry\n");
            for (alias, target) in &self.alias_only {
                let _ = writeln!(
                    s,
                    "- `{alias}` is `#define`d to `{target}` and has no typedef of its own: call `{target}`."
                );
            }
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
