//! The generator's table of placeholder-versioned typedefs (`tools/codegen/registered_versions.rs`,
//! which has no dependency, so it is compiled here too and checked without the `regenerate`
//! feature): which typedefs the header marks, and the refusals that keep the table in step with it.

#[path = "../tools/codegen/registered_versions.rs"]
#[allow(dead_code)]
mod registered_versions;

use registered_versions::{REGISTERED, check, marked_placeholders, registered, typedef_version};

/// The lines of the pinned `cudaTypedefs.h` (13.5.37) around the marked typedefs.
const PINNED_EXCERPT: &str = "\
typedef CUresult (CUDAAPI *PFN_cuLogsDumpToMemory_v12090)(CUlogIterator *iterator, char *buffer, size_t *size, unsigned int flags);
// Update 13010 to a proper version number
typedef CUresult (CUDAAPI *PFN_cuLaunchHostFunc_v13010)(CUstream hStream, CUhostFn fn, void *userData, unsigned int syncMode);
typedef CUresult (CUDAAPI *PFN_cuLaunchHostFunc_v13010_ptsz)(CUstream hStream, CUhostFn fn, void *userData, unsigned int syncMode);
typedef CUresult (CUDAAPI *PFN_cuCoredumpRegisterStartCallback_v13020)(CUcoredumpStatusCallback callback, void *userData, CUcoredumpCallbackHandle *callbackOut);
";

#[test]
fn the_typedefs_right_after_the_headers_placeholder_comment_are_marked_and_no_others() {
    let marked = marked_placeholders(PINNED_EXCERPT);
    assert_eq!(
        marked,
        [
            ("PFN_cuLaunchHostFunc_v13010".to_string(), 13010),
            ("PFN_cuLaunchHostFunc_v13010_ptsz".to_string(), 13010),
        ]
    );
    assert!(check(&marked).is_empty(), "{:?}", check(&marked));
}

#[test]
fn cu_launch_host_func_v2_and_its_twin_are_requested_at_13_2() {
    assert_eq!(registered("PFN_cuLaunchHostFunc_v13010"), Some(13020));
    assert_eq!(registered("PFN_cuLaunchHostFunc_v13010_ptsz"), Some(13020));
    assert_eq!(registered("PFN_cuLaunchHostFunc_v10000"), None);
    for r in REGISTERED {
        assert!(
            !r.source.is_empty(),
            "{} says where its number comes from",
            r.typedef
        );
        assert!(r.registered > typedef_version(r.typedef).unwrap_or(u32::MAX));
    }
}

#[test]
fn a_marked_typedef_missing_from_the_table_is_refused() {
    let text = format!(
        "{PINNED_EXCERPT}// Update 13060 to a proper version number\n\
         typedef CUresult (CUDAAPI *PFN_cuNewThing_v13060)(int x);\n"
    );
    let problems = check(&marked_placeholders(&text));
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        problems[0].contains("PFN_cuNewThing_v13060"),
        "{problems:?}"
    );
    assert!(problems[0].contains("add it to REGISTERED"), "{problems:?}");
}

#[test]
fn a_listed_typedef_the_header_no_longer_marks_is_refused() {
    // The header's number made final: the same typedefs without the comment.
    let text = PINNED_EXCERPT.replace("// Update 13010 to a proper version number\n", "");
    let problems = check(&marked_placeholders(&text));
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(
        problems.iter().all(|p| p.contains("drop the line")),
        "{problems:?}"
    );
}
