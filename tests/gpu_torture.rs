//! The torture run on the real GPU: a randomized, seeded, multi-threaded run of the public API of
//! `cuda-host-launch` against the real driver, judged by sequence numbers that kernels write into
//! host-mapped memory (see `gpu_torture/oracle.rs`), with what other code does to the same driver
//! mixed in through raw calls: primary-context retains and releases, raw streams destroyed with
//! work pending, and stream captures in every mode by another thread, which must all end valid.
//!
//! The fake-driver harness (`cuda_workspace::testing::torture`, `tests/torture.rs`) judges far more
//! (injected faults, sticky errors, resets, exit) against the fake's own record of every stream;
//! this one checks on the H200 what only the real driver can show: its threads, its timing, its
//! capture rules.
//!
//! The test's user code (an owner's `Drop`, a `spawn_after` callback) sometimes blocks, awaits a
//! completion of the crate, flushes or panics on the crate's reaper (`oracle::Antics`, a fifth of
//! them): none of it may stall the watching of completions. The on-purpose panic prints nothing;
//! any other panic the crate reports is a violation, and so is an on-purpose one it never reports.
//! The summary's `antics: ...` counters show how many were done.
//!
//! - `random_use_of_the_api_..._keeps_every_promise`, on the GPU. Opt-in: `--ignored
//!   --test-threads=1`, or the bundle of `scripts/gpu-bundle`. Settings: `GPU_TORTURE_SECONDS`
//!   (default 60), `GPU_TORTURE_SEED` (default 29). A seed fixes every random choice (thread
//!   count, operations, kernel lengths), not the timing, so a replay of a failing seed reruns the
//!   same mix rather than the same interleaving. Rounds of up to 15 s each start fresh threads and
//!   streams and end with every promise checked. A run that does not end within its time and two
//!   minutes is ended by a watchdog, which prints the seed and each thread's last operations.
//! - `the_harness_finds_nothing_in_a_short_run_on_the_fake_driver`: the same harness for 3 s on the
//!   fake driver, which runs no kernels (`cuStreamWriteValue32` writes the sequence numbers
//!   instead), so that `cargo test` checks the harness itself where no GPU is. Not in the bundle
//!   (`--ignored` runs the GPU test only).

#[path = "gpu_torture/capturer.rs"]
mod capturer;
#[path = "gpu_torture/oracle.rs"]
mod oracle;
#[path = "gpu_torture/worker.rs"]
mod worker;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::CUstreamCaptureMode;
use cuda_host_launch::{Config, PollerSettings, RawStream};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{PATIENCE, fake_driver_path, quiet_expected_panics};

use oracle::{ANTICS_PANIC, Run, Tracked, run};
use worker::{Lane, Worker};

/// The seed when `GPU_TORTURE_SEED` is not set.
const DEFAULT_SEED: u64 = 29;
/// The run's length when `GPU_TORTURE_SECONDS` is not set.
const DEFAULT_SECONDS: u64 = 60;
/// The longest round.
const ROUND: Duration = Duration::from_secs(15);

/// A small, seeded random number generator (xorshift64*).
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed` (any value; mixed first, so nearby seeds differ).
    pub fn new(seed: u64) -> Rng {
        // splitmix64 of the seed, never 0 (xorshift's fixed point).
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A number in `0..n` (0 for `n == 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }

    /// True `p` times in a hundred.
    pub fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
}

/// An environment variable as a number, or `default`; a value that is not one fails the test.
fn setting(name: &str, default: u64) -> u64 {
    match std::env::var(name) {
        Ok(text) => text
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name}={text:?} is not a whole number")),
        Err(_) => default,
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored (GPU_TORTURE_SECONDS, GPU_TORTURE_SEED)"]
fn random_use_of_the_api_by_many_threads_beside_foreign_captures_keeps_every_promise() {
    let seed = setting("GPU_TORTURE_SEED", DEFAULT_SEED);
    let seconds = setting("GPU_TORTURE_SECONDS", DEFAULT_SECONDS);
    torture(Run::open, seed, seconds);
}

isolated_test! {
    /// The harness itself, where no GPU is: on the fake driver, with value writes
    /// (`cuStreamWriteValue32`) for kernels, a short run finds nothing and ends.
    fn the_harness_finds_nothing_in_a_short_run_on_the_fake_driver(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        torture(Run::open_on_fake, setting("GPU_TORTURE_SEED", DEFAULT_SEED), 3);
    }
}

/// Sets the run up with `open`, then runs rounds for `seconds`; fails with every violation, the
/// seed and the threads' last operations.
fn torture(open: fn(u64) -> &'static Run, seed: u64, seconds: u64) {
    let replay = format!("GPU_TORTURE_SEED={seed} GPU_TORTURE_SECONDS={seconds}");
    println!("gpu torture: seed {seed}, {seconds} s (replay with {replay})");
    // The event poller's pace is the process's (the crate's configuration is set once): spinning
    // for 30 % of the seeds (`CUDA_HOST_LAUNCH_POLLER` overrides it).
    let spinning = Rng::new(seed).percent(30);
    Config::new()
        .event_poller(if spinning {
            PollerSettings::LOW_LATENCY
        } else {
            PollerSettings::DEFAULT
        })
        .install()
        .expect("the configuration installed before the crate's first use");
    let spinning =
        cuda_host_launch::config().unwrap().event_poller_settings() == PollerSettings::LOW_LATENCY;
    println!(
        "gpu torture: the event poller {}",
        if spinning { "spinning" } else { "by default" }
    );
    let run = open(seed);
    // User code that panics on purpose (`Antics::Panics`): the crate reports it; nothing prints.
    quiet_expected_panics(|message| message == ANTICS_PANIC);
    cuda_host_launch::set_panic_handler(|report| {
        let run = oracle::run();
        if report.message == ANTICS_PANIC {
            run.stats.add("antics: panic reported");
        } else {
            run.violation(format!("an unexpected panic was reported: {report}"));
        }
    });
    // The test's own threads never invalidate a capture themselves: what would is the crate's.
    capturer::set_interaction_mode(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
    let finished = Arc::new(AtomicBool::new(false));
    watchdog(
        Duration::from_secs(seconds) + 12 * PATIENCE,
        Arc::clone(&finished),
        replay.clone(),
    );
    let started = Instant::now();
    let end = started + Duration::from_secs(seconds);
    let mut round = 0;
    loop {
        round += 1;
        run.round.store(round, Ordering::Relaxed);
        let until = end.min(Instant::now() + ROUND);
        run_round(seed, round, until);
        if run.failed() || Instant::now() >= end {
            break;
        }
    }
    finished.store(true, Ordering::Release);
    panics_reported(run);
    let (violations, count) = run.violations();
    println!(
        "gpu torture: seed {seed}, {round} rounds in {:.1?}: {}",
        started.elapsed(),
        run.stats.summary()
    );
    assert!(
        count == 0,
        "gpu torture: {count} violations with seed {seed} (replay with {replay}):\n{}\n{}",
        violations.join("\n"),
        run.log_tails(24)
    );
}

/// One round: 4 to 8 workers and the capturer until `until`, then every promise checked.
fn run_round(seed: u64, round: u32, until: Instant) {
    let run = run();
    run.clear_logs();
    let mut rng = Rng::new(seed ^ u64::from(round).wrapping_mul(0xA076_1D64_78BD_642F));
    let workers = 4 + rng.below(5) as usize;
    println!("round {round}: {workers} workers");
    run.bind_thread();
    let mut shared: Vec<Mutex<Lane>> = (0..2)
        .filter_map(|i| Lane::new_crate(format!("shared.s{i} (crate)"), true))
        .map(Mutex::new)
        .collect();
    shared.extend(Lane::new_raw("shared.legacy".into(), RawStream::LEGACY, true).map(Mutex::new));
    assert_eq!(shared.len(), 3, "slots for the shared lanes");
    let shared = Arc::new(shared);
    let capturer = {
        let seed = rng.below(u64::MAX);
        spawn("gpu-torture-capturer".into(), move || {
            capturer::set_interaction_mode(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
            capturer::capture_until(seed, until)
        })
    };
    let threads: Vec<_> = (0..workers)
        .map(|index| {
            let seed = rng.below(u64::MAX);
            let shared = Arc::clone(&shared);
            spawn(format!("gpu-torture-w{index}"), move || {
                capturer::set_interaction_mode(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED);
                Worker::new(index, seed, shared).run(until)
            })
        })
        .collect();
    let mut open: Vec<Arc<Tracked>> = Vec::new();
    for (name, thread) in std::iter::once(capturer).chain(threads) {
        match thread.join() {
            Ok(tracked) => open.extend(tracked),
            Err(panic) => run.violation(format!(
                "{name} panicked: {}",
                panic
                    .downcast_ref::<String>()
                    .map(String::as_str)
                    .or_else(|| panic.downcast_ref::<&str>().copied())
                    .unwrap_or("(not a string)")
            )),
        }
    }
    settle(&mut open);
    drop(shared);
}

/// Every on-purpose panic of user code was reported to the panic handler, once (waits, bounded,
/// for reports still on their way: a report follows the owner's `Drop` it comes from).
fn panics_reported(run: &Run) {
    let deadline = Instant::now() + PATIENCE;
    let counts = || {
        (
            run.stats.get("antics: panicked"),
            run.stats.get("antics: panic reported"),
        )
    };
    while counts().0 != counts().1 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let (panicked, reported) = counts();
    if panicked != reported {
        run.violation(format!(
            "user code panicked on purpose {panicked} times on the reaper, and the crate \
             reported {reported} panics of it"
        ));
    }
}

/// Starts a named thread.
fn spawn<T: Send + 'static>(
    name: String,
    f: impl FnOnce() -> T + Send + 'static,
) -> (String, std::thread::JoinHandle<T>) {
    let thread = std::thread::Builder::new()
        .name(name.clone())
        .spawn(f)
        .unwrap_or_else(|e| panic!("cannot start {name}: {e}"));
    (name, thread)
}

/// The end of a round: waits (bounded) until every operation did all it must (callbacks ran,
/// owners dropped, futures resolved), then judges what is left, then that no launch is pending.
fn settle(open: &mut Vec<Arc<Tracked>>) {
    let run = run();
    let deadline = Instant::now() + 2 * PATIENCE;
    loop {
        let _ = cuda_host_launch::flush(Duration::from_millis(100));
        open.retain(|t| !t.settled());
        if open.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    for t in open.iter().take(20) {
        if let Some(verdict) = t.final_verdict() {
            run.violation(format!("after {:?}: {verdict}", 2 * PATIENCE));
        }
    }
    if open.len() > 20 {
        run.violation(format!("... {} unsettled operations in all", open.len()));
    }
    // Everything ran and was released: nothing of the crate's may still count as pending.
    let deadline = Instant::now() + PATIENCE;
    while cuda_host_launch::pending_launches(None) > 0 && Instant::now() < deadline {
        let _ = cuda_host_launch::flush(Duration::from_millis(100));
        std::thread::sleep(Duration::from_millis(5));
    }
    let pending = cuda_host_launch::pending_launches(None);
    if pending > 0 {
        run.violation(format!(
            "{pending} launches still pending with all their work done and released"
        ));
    }
    let both = run.driver_threads.common(&run.drop_threads);
    if !both.is_empty() {
        run.violation(format!(
            "threads that ran host functions also dropped owners: {both:?}"
        ));
    }
}

/// Ends the process if the test is not over in `limit` (a hang is a failure, with the seed and
/// every thread's last operations printed first).
fn watchdog(limit: Duration, finished: Arc<AtomicBool>, replay: String) {
    let deadline = Instant::now() + limit;
    let spawned = std::thread::Builder::new()
        .name("gpu-torture-watchdog".into())
        .spawn(move || {
            while !finished.load(Ordering::Acquire) {
                if Instant::now() >= deadline {
                    let run = run();
                    let (violations, count) = run.violations();
                    eprintln!(
                        "gpu torture: HUNG, not finished after {limit:?} (replay with {replay}); \
                         {count} violations so far:\n{}\n{}",
                        violations.join("\n"),
                        run.log_tails(24)
                    );
                    // SAFETY: ends the process at once with a failure status, as a hung test must
                    // (its threads cannot be stopped).
                    unsafe { libc::_exit(101) };
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        });
    spawned.unwrap_or_else(|e| panic!("cannot start the watchdog: {e}"));
}
