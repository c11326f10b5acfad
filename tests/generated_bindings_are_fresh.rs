//! The committed bindings are what the generator makes from the pinned headers today.
//!
//! Built only with the `regenerate` feature (`required-features` in Cargo.toml), when build.rs has
//! just regenerated everything into `OUT_DIR`: `scripts/regenerate-bindings --check` (which
//! `.ci/run` calls) sets that up.

use std::path::Path;

const FILES: &[&str] = &[
    "bindings.rs",
    "functions.rs",
    "result_codes.rs",
    "REPORT.md",
];

#[test]
fn committed_generated_files_equal_a_fresh_regeneration() {
    let fresh = Path::new(env!("OUT_DIR")).join("generated");
    let committed = Path::new(env!("CARGO_MANIFEST_DIR")).join("cuda-sys/src/generated");
    let mut stale = Vec::new();
    for name in FILES {
        let want = std::fs::read_to_string(fresh.join(name))
            .unwrap_or_else(|e| panic!("build.rs wrote no {name}: {e}"));
        let have = std::fs::read_to_string(committed.join(name)).unwrap_or_default();
        if want != have {
            let line = want
                .lines()
                .zip(have.lines())
                .position(|(a, b)| a != b)
                .map_or_else(
                    || "at the end".to_string(),
                    |n| format!("from line {}", n + 1),
                );
            stale.push(format!("{name} differs {line}"));
        }
    }
    assert!(
        stale.is_empty(),
        "cuda-sys/src/generated is stale ({}); run scripts/regenerate-bindings and commit the result",
        stale.join("; ")
    );
}

/// The value of `#define NAME ((CUstream)0xN)` in `header`, if it has that form.
fn stream_handle_define(header: &str, name: &str) -> Option<usize> {
    header.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        if words.next() != Some("#define") || words.next() != Some(name) {
            return None;
        }
        let value: String = words.collect();
        let hex = value.strip_prefix("((CUstream)0x")?.strip_suffix(')')?;
        usize::from_str_radix(hex, 16).ok()
    })
}

/// `cuda.h` defines the special stream handles as casts, which bindgen cannot translate, so
/// `cuda-sys/src/streams.rs` writes them by hand: they must be the pinned header's values.
#[test]
fn special_stream_handles_have_the_values_the_pinned_cuda_h_defines() {
    assert_eq!(
        stream_handle_define("#define CU_STREAM_X     ((CUstream)0x1f)\n", "CU_STREAM_X"),
        Some(0x1f),
        "the parser reads the header's form"
    );
    let include = std::env::var("CUDA_DL_SYS_INCLUDE_DIR")
        .expect("CUDA_DL_SYS_INCLUDE_DIR (scripts/regenerate-bindings sets it)");
    let cuda_h = std::fs::read_to_string(Path::new(&include).join("cuda.h")).expect("cuda.h");
    for (name, ours) in [
        ("CU_STREAM_LEGACY", cuda_dl_sys::CU_STREAM_LEGACY),
        ("CU_STREAM_PER_THREAD", cuda_dl_sys::CU_STREAM_PER_THREAD),
    ] {
        let theirs = stream_handle_define(&cuda_h, name)
            .unwrap_or_else(|| panic!("cuda.h has no `#define {name} ((CUstream)0x..)`"));
        assert_eq!(ours.addr(), theirs, "{name}");
    }
}
