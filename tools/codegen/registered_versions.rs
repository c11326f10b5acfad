//! Typedefs whose version `cudaTypedefs.h` marks as a placeholder, and the version the driver
//! really registers each under: what the table asks `cuGetProcAddress` for instead.
//!
//! `cudaTypedefs.h` names each entry point's pointer type `PFN_<name>_v<version>`, and the table
//! takes the ABI version from that name. For a few typedefs the header says the number is not
//! final (`// Update 13010 to a proper version number` above `PFN_cuLaunchHostFunc_v13010`), and
//! asking the driver at that number gets an older ABI (`cuLaunchHostFunc` at 13010 is the
//! three-argument v1 on a 13.1 driver, and on newer ones too: the driver registers v2 at 13020).
//! Each such typedef must be listed in [`REGISTERED`] with the version the driver registers it
//! at, and where that number comes from; the generator refuses a marked typedef that is not
//! listed, and a listed one the header no longer marks (then the header's number is final: drop
//! the line). Entries made from a listed typedef are requested and gated at the registered
//! version, and checked at resolution against the library's export of their name
//! (`cuda-sys/src/resolve.rs`).
//!
//! No dependency, so `tests/codegen_registered_versions.rs` checks it in plain `cargo test`.

/// A typedef with a placeholder version, and the version the driver registers it at.
pub struct Registered {
    /// The typedef, as `cudaTypedefs.h` names it (`PFN_cuLaunchHostFunc_v13010`).
    pub typedef: &'static str,
    /// The version the driver registers the variant at (`13020`: CUDA 13.2).
    pub registered: u32,
    /// Where that number comes from.
    pub source: &'static str,
}

/// Every placeholder-versioned typedef of the pinned header, with its registered version.
pub const REGISTERED: &[Registered] = &[
    Registered {
        typedef: "PFN_cuLaunchHostFunc_v13010",
        registered: 13020,
        source: "cuLaunchHostFunc_v2 first ships in CUDA 13.2, the 13.1.80 headers have none, and \
                 NVIDIA's cuda-bindings 13.5 requests it from cuGetProcAddress at 13020",
    },
    Registered {
        typedef: "PFN_cuLaunchHostFunc_v13010_ptsz",
        registered: 13020,
        source: "the per-thread twin of PFN_cuLaunchHostFunc_v13010, registered with it",
    },
];

/// The typedefs `typedefs_h` (the text of `cudaTypedefs.h`) marks as placeholders: those named
/// `..._v<N>` or `..._v<N>_ptsz`/`_ptds` on the typedef lines right after a comment
/// `// Update <N> to a proper version number`, with `N`.
pub fn marked_placeholders(typedefs_h: &str) -> Vec<(String, u32)> {
    let mut marked = Vec::new();
    let mut pending: Option<u32> = None;
    for line in typedefs_h.lines().map(str::trim) {
        if let Some(n) = placeholder_comment(line) {
            pending = Some(n);
            continue;
        }
        let Some(n) = pending else { continue };
        match typedef_name(line) {
            Some(name) if typedef_version(name) == Some(n) => marked.push((name.to_string(), n)),
            _ => pending = None,
        }
    }
    marked
}

/// `N` of a line `// Update N to a proper version number`.
fn placeholder_comment(line: &str) -> Option<u32> {
    let rest = line.strip_prefix("//")?.trim().strip_prefix("Update ")?;
    let (number, tail) = rest.split_once(' ')?;
    if tail.trim() != "to a proper version number" {
        return None;
    }
    number.parse().ok()
}

/// The `PFN_` name a typedef line declares.
fn typedef_name(line: &str) -> Option<&str> {
    if !line.starts_with("typedef") {
        return None;
    }
    let start = line.find("PFN_")?;
    let rest = &line[start..];
    let end = rest
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .unwrap_or(rest.len());
    Some(&rest[..end])
}

/// `N` of `PFN_<name>_v<N>` or `PFN_<name>_v<N>_ptsz`/`_ptds`.
pub fn typedef_version(typedef: &str) -> Option<u32> {
    let name = typedef
        .strip_suffix("_ptsz")
        .or_else(|| typedef.strip_suffix("_ptds"))
        .unwrap_or(typedef);
    let at = name.rfind("_v")?;
    name[at + 2..].parse().ok()
}

/// Checks [`REGISTERED`] against what the header marks: every marked typedef listed, every
/// listed typedef still marked, and each registered version above the placeholder. The problems
/// found, one sentence each (empty: all is well).
pub fn check(marked: &[(String, u32)]) -> Vec<String> {
    let mut problems = Vec::new();
    for (typedef, placeholder) in marked {
        match REGISTERED.iter().find(|r| r.typedef == typedef) {
            None => problems.push(format!(
                "cudaTypedefs.h marks {typedef}'s version {placeholder} as a placeholder; add it \
                 to REGISTERED in tools/codegen/registered_versions.rs with the version the \
                 driver registers it at (NVIDIA's cuda-bindings shows what it requests)"
            )),
            Some(r) if r.registered <= *placeholder => problems.push(format!(
                "{typedef}: the registered version {} is not above the placeholder {placeholder}",
                r.registered
            )),
            Some(_) => {}
        }
    }
    for r in REGISTERED {
        if !marked.iter().any(|(typedef, _)| typedef == r.typedef) {
            problems.push(format!(
                "{} is listed in tools/codegen/registered_versions.rs but cudaTypedefs.h no \
                 longer marks it as a placeholder (or no longer has it): drop the line",
                r.typedef
            ));
        }
    }
    problems
}

/// The version the driver registers `typedef` at, if the header's is a placeholder.
pub fn registered(typedef: &str) -> Option<u32> {
    REGISTERED
        .iter()
        .find(|r| r.typedef == typedef)
        .map(|r| r.registered)
}
