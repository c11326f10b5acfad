//! The torture harness (`cuda_workspace::testing::torture`): seeded random runs of the whole API
//! against the fake driver, with other code's calls to the same driver mixed in, judged by the
//! fake's oracle. Each run is a child process of this binary.
//!
//! - `fixed_seeds_run_clean`: the short fixed seeds `cargo test` runs.
//! - `regressions`: the shrunk script of each failure the harness found (`tests/torture/*.txt`),
//!   each run several times.
//! - `torture_from_env` (ignored; `scripts/torture` runs it): `TORTURE_SECONDS` of new seeds from
//!   `TORTURE_SEED`, or `TORTURE_REPLAY=FILE`, or `TORTURE_SHRINK=FILE`.
//! - `torture_child` (ignored): what a child process runs.

use std::time::{Duration, Instant};

use cuda_workspace::testing::torture::{
    self, CHILD_TEST, SCRIPT_ENV, Script, Size, generate, read_script, report_failure, run_child,
    run_here, shrink,
};

/// The seeds `cargo test` runs (a few seconds in all); every fourth ends in an exit.
const FIXED_SEEDS: std::ops::RangeInclusive<u64> = 1..=12;

fn run_and_report(script: &Script) -> Result<Duration, String> {
    let outcome = run_child(script);
    if outcome.passed {
        Ok(outcome.took)
    } else {
        Err(report_failure(script, &outcome))
    }
}

#[test]
fn fixed_seeds_run_clean() {
    let failures: Vec<String> = FIXED_SEEDS
        .filter_map(|seed| {
            run_and_report(&generate(seed, Size::SHORT, seed.is_multiple_of(4))).err()
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

#[test]
fn regressions() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/torture");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    files.retain(|f| f.extension().is_some_and(|e| e == "txt"));
    files.sort();
    let mut failures = Vec::new();
    for file in &files {
        let script = read_script(file).unwrap_or_else(|e| panic!("{e}"));
        for _ in 0..5 {
            if let Err(e) = run_and_report(&script) {
                failures.push(format!("{}: {e}", file.display()));
                break;
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
}

/// `scripts/torture`'s entry: new seeds for `TORTURE_SECONDS`, a replay, or a shrink.
#[test]
#[ignore = "run by scripts/torture"]
fn torture_from_env() {
    let var = |name: &str| std::env::var(name).ok();
    if let Some(file) = var("TORTURE_REPLAY") {
        let script = read_script(file.as_ref()).unwrap_or_else(|e| panic!("{e}"));
        let times: usize = var("TORTURE_TIMES")
            .and_then(|t| t.parse().ok())
            .unwrap_or(1);
        for i in 0..times {
            if let Err(e) = run_and_report(&script) {
                panic!("replay {i} failed: {e}");
            }
        }
        println!("replayed {file} {times} times: clean");
        return;
    }
    let size = if var("TORTURE_SIZE").as_deref() == Some("short") {
        Size::SHORT
    } else {
        Size::LONG
    };
    // The script `TORTURE_SECONDS` runs for a seed: the same choice of size and exit.
    let script_of = |seed: u64| generate(seed, size, seed.is_multiple_of(5));
    if let Some(seed) = var("TORTURE_DUMP").and_then(|s| s.parse().ok()) {
        print!("{}", script_of(seed));
        return;
    }
    if let Some(file) = var("TORTURE_SHRINK") {
        let script = read_script(file.as_ref()).unwrap_or_else(|e| panic!("{e}"));
        let attempts = var("TORTURE_ATTEMPTS")
            .and_then(|t| t.parse().ok())
            .unwrap_or(3);
        let small = shrink(&script, attempts, &mut |line| println!("{line}"));
        let out = format!("{file}.shrunk");
        std::fs::write(&out, small.to_string()).expect("write the shrunk script");
        println!(
            "shrunk script ({} ops) written to {out}:\n{small}",
            small.threads.iter().map(Vec::len).sum::<usize>()
        );
        return;
    }
    let seconds: u64 = var("TORTURE_SECONDS")
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let first: u64 = var("TORTURE_SEED")
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_secs())
        });
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let (mut runs, mut failures) = (0u64, Vec::new());
    let mut seed = first;
    while Instant::now() < deadline {
        match run_and_report(&script_of(seed)) {
            Ok(took) => println!("seed {seed}: clean in {took:.2?}"),
            Err(e) => {
                eprintln!("{e}\n");
                failures.push(seed);
            }
        }
        runs += 1;
        seed += 1;
    }
    println!(
        "torture: {runs} runs (seeds {first}..{seed}) in {seconds} s: {} failed {:?}",
        failures.len(),
        failures
    );
    assert!(failures.is_empty(), "failing seeds: {failures:?}");
}

/// What a child process runs: the script `TORTURE_SCRIPT` names.
#[test]
#[ignore = "a child process of the torture tests runs it"]
fn torture_child() {
    let Some(file) = std::env::var_os(SCRIPT_ENV) else {
        return;
    };
    let script = read_script(file.as_ref()).unwrap_or_else(|e| panic!("{e}"));
    let violations = run_here(&script);
    for v in &violations {
        eprintln!("violation: {v}");
    }
    assert!(
        violations.is_empty(),
        "TORTURE FAILED: {} violations",
        violations.len()
    );
    let _ = (CHILD_TEST, torture::failure_dir());
}
