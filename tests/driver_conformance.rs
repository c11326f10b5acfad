//! The driver conformance suite: the behaviours the fake driver (`tests/fake-cuda`) models,
//! written once against the driver API through `cuda-dl-sys`, run against the fake in `cargo test`
//! and against the real driver in the GPU bundle (`CONFORMANCE_DRIVER=real`, see
//! `scripts/gpu-bundle`).
//!
//! Each case states what the fake does, and must pass on the fake. On the real driver it must
//! pass too, unless `tests/conformance/differences.txt` lists it with the reason the drivers
//! differ; a listed case must then fail on the real driver, so the list cannot go stale. Each case
//! runs in a process of its own, with device 0's primary context current; a "hold" (a stream
//! blocked on a `cuStreamWaitValue32` of a host-mapped word) stands in for long device work on
//! both drivers, and a sticky error is the fake's control function or a trapping kernel.
//!
//! Areas: stream order and the one host-function thread per context, host functions and stream
//! callbacks, stream and context destruction with work pending (`streams`, `contexts`); events
//! (record, query, synchronize, elapsed time, under capture); stream memory operations
//! (`memops`); capture and its interaction modes (`capture`); graphs and user objects
//! (`graphs`); sticky errors (`contexts`); `cuGetProcAddress` (`entry_points`); error names and
//! strings (`errors`); memory, synchronous copies and sets, and modules (`memory`); stream-ordered
//! copies, sets and allocations (`memory_async`).

#![warn(clippy::undocumented_unsafe_blocks)]

mod conformance;

use std::collections::BTreeSet;
use std::process::Command;

use conformance::harness::{DIFFERENCES, differences};

/// Every case `differences.txt` lists is a case of this suite, listed once; every line is
/// `case-name: reason` or `case-name [not run]: reason`.
#[test]
fn the_differences_list_names_cases_of_the_suite() {
    let exe = std::env::current_exe().unwrap();
    let out = Command::new(exe)
        .args(["--list", "--format", "terse"])
        .output()
        .unwrap();
    let listing = String::from_utf8_lossy(&out.stdout);
    let cases: BTreeSet<&str> = listing
        .lines()
        .filter_map(|line| line.strip_suffix(": test"))
        .filter_map(|path| path.strip_prefix("conformance::"))
        .filter_map(|path| path.rsplit("::").next())
        .collect();
    assert!(cases.len() >= 30, "{} cases: {listing}", cases.len());
    let mut seen = BTreeSet::new();
    for listed in differences() {
        let name = listed.name;
        assert!(
            cases.contains(name),
            "differences.txt lists {name:?}, which is not a case"
        );
        assert!(seen.insert(name), "differences.txt lists {name:?} twice");
    }
    assert!(DIFFERENCES.ends_with('\n'));
}
