//! The committed bindings are what the generator makes from the pinned headers today.
//!
//! Runs only with the `regenerate` feature, when build.rs has just regenerated everything into
//! `OUT_DIR`: `scripts/regenerate-bindings --check` (which `.ci/run` calls) sets that up.
#![cfg(feature = "regenerate")]

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
