//! The torture harness: a randomized, seeded, multi-threaded run of the whole public API of
//! `cuda-host-launch` against the fake driver, together with what other code does to the same
//! driver behind the crate's back (other bindings' retains, releases, resets, streams and
//! captures; created contexts; sticky errors; long kernels; injected faults; exit), every step
//! judged by an oracle that the fake driver keeps (see [`oracle`]).
//!
//! - A run is a [`Script`]: settings and each thread's operations, generated from a seed
//!   ([`generate`]) or read back from its text. Each run is a process of its own (the driver's
//!   state is per process): [`run_child`] starts one, [`run_here`] is what it runs.
//! - A failure prints the script and the violations, and writes the script to
//!   `target/torture-failures/`; `scripts/torture --replay FILE` runs it again and
//!   `scripts/torture --shrink FILE` cuts it down to what still fails ([`shrink`]). A shrunk
//!   script of each failure found becomes a regression test (`tests/torture/*.txt`).
//! - Budgets: `cargo test` runs a fixed set of short seeds; `.ci/run` runs longer ones under
//!   AddressSanitizer (`scripts/torture --seconds N`); the same script runs for ten minutes here.

pub mod oracle;
pub mod script;
mod world;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

pub use script::{HookAntics, Op, Script, Settings, Size, generate};

use super::{fake, fake_driver_path, load_fake_driver};
use world::{ThreadState, World};

/// The variable that names the script file a child process runs.
pub const SCRIPT_ENV: &str = "TORTURE_SCRIPT";

/// The test (in `tests/torture.rs`) that a child process runs: it runs the script [`SCRIPT_ENV`]
/// names.
pub const CHILD_TEST: &str = "torture_child";

/// The oracle of the run in this process, for the exit handler of an exit run.
static ORACLE: OnceLock<Arc<oracle::Oracle>> = OnceLock::new();

/// Runs `script` in this process, which must be fresh (the driver not loaded yet; the parent set
/// `CUDA_DL_SYS_LIBRARY`, `FAKE_CUDA_DEVICES` and the cleanup mode). Returns the violations.
pub fn run_here(script: &Script) -> Vec<String> {
    let settings = script.settings;
    let world = Arc::new(World::new());
    let _ = ORACLE.set(Arc::clone(&world.oracle));
    if settings.exit {
        // Registered before the driver is loaded: runs after the driver's teardown.
        // SAFETY: `check_at_exit` is an `extern "C" fn()` that only reads statics and exits.
        unsafe { libc::atexit(check_at_exit) };
    }
    load_fake_driver();
    // User code that panics on purpose (`Antics::Panics`): the crate reports it; nothing prints.
    // (A start hook's payload whose `Drop` panics is not a string: `HookAntics::PanicsTwice`.)
    super::quiet_expected_panics(|message| {
        message == oracle::ANTICS_PANIC || message == oracle::ANTICS_PAYLOAD_PANIC
    });
    {
        let oracle = Arc::clone(&world.oracle);
        cuda_host_launch::set_panic_handler(move |report| {
            if !oracle::expected_report(report) {
                oracle.violation(format!("an unexpected panic was reported: {report}"));
            }
            // The handler is user code on the reaper: it may leave a context current, which the
            // next owners must not see (the oracle's check in `Owner::drop`).
            oracle::handler_binds_a_context();
        });
    }
    let mut config = cuda_host_launch::Config::new();
    if settings.spinning_poller {
        config = config.event_poller(cuda_host_launch::PollerSettings::LOW_LATENCY);
    }
    if settings.hooks != HookAntics::Off {
        let (oracle, for_names) = (Arc::clone(&world.oracle), Arc::clone(&world.oracle));
        let hooks = settings.hooks;
        config = config.threads(
            cuda_host_launch::ThreadSettings::new()
                .on_start(move |thread| oracle::hook_acts(hooks, thread, &oracle))
                .name(move |thread| oracle::name_acts(hooks, thread, &for_names)),
        );
    }
    config
        .install()
        .expect("the torture run installs its configuration before the crate's first use");
    let keeper = {
        let world = Arc::clone(&world);
        std::thread::Builder::new()
            .name("torture-holds".into())
            .spawn(move || world.keep_holds())
            .expect("the hold keeper")
    };
    let threads: Vec<_> = script
        .threads
        .iter()
        .enumerate()
        .map(|(index, ops)| {
            let world = Arc::clone(&world);
            let ops = ops.clone();
            std::thread::Builder::new()
                .name(format!("torture-{index}"))
                .spawn(move || {
                    relaxed_capture_mode();
                    let mut me = ThreadState::new(index, settings.seed);
                    for op in ops {
                        world.run(op, &mut me);
                    }
                    world.thread_done(me);
                })
                .expect("a torture thread")
        })
        .collect();
    for thread in threads {
        if thread.join().is_err() {
            world
                .oracle
                .violation("a torture thread panicked".to_string());
        }
    }
    let mut violations = world.finish(&settings);
    let _ = keeper.join();
    violations.extend(oracle::names_missing());
    violations
}

/// The harness's threads never invalidate a capture themselves: what invalidates one is the
/// crate's doing.
fn relaxed_capture_mode() {
    let driver = load_fake_driver();
    let mut mode = cuda_dl_sys::types::CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a valid in/out mode.
    let _ = unsafe { driver.cuThreadExchangeStreamCaptureMode(&mut mode) };
}

/// The exit handler of an exit run: runs after the driver's teardown; fails the process if anyone
/// called the driver after it, or the oracle saw a violation before the exit.
extern "C" fn check_at_exit() {
    // The harness's own threads go on calling while the process exits (a user's may); the
    // crate's threads must not.
    let after = fake().calls_after_teardown_by("cuda-h");
    let violations = ORACLE.get().map_or_else(Vec::new, |o| {
        o.violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    });
    if after == 0 && violations.is_empty() {
        return;
    }
    eprintln!(
        "TORTURE FAILED at exit: {after} driver calls after the driver's teardown by the crate's \
         threads"
    );
    if after != 0 {
        // Each line marked, so that the failure report keeps it.
        for line in fake().after_teardown_report().lines() {
            eprintln!("TORTURE after teardown: {line}");
        }
    }
    for v in violations {
        eprintln!("violation: {v}");
    }
    // SAFETY: ends the process at once, as a failed exit handler must (no more handlers).
    unsafe { libc::_exit(97) };
}

/// What a child process made of a script.
#[derive(Debug)]
pub struct Outcome {
    /// Whether it passed.
    pub passed: bool,
    /// Its output (stdout, then stderr), or why it did not finish.
    pub output: String,
    /// How long it ran.
    pub took: Duration,
}

/// Runs `script` in a child process (this test binary, its [`CHILD_TEST`]).
pub fn run_child(script: &Script) -> Outcome {
    let dir = failure_dir().join("scratch");
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!(
        "script-{}-{}.txt",
        std::process::id(),
        script_counter()
    ));
    if let Err(e) = std::fs::write(&file, script.to_string()) {
        return Outcome {
            passed: false,
            output: format!("cannot write {}: {e}", file.display()),
            took: Duration::ZERO,
        };
    }
    let exe = std::env::current_exe().expect("the running test binary");
    let mut command = Command::new(exe);
    command
        .args([
            CHILD_TEST,
            "--exact",
            "--nocapture",
            "--test-threads=1",
            "--include-ignored",
        ])
        .stdin(Stdio::null());
    for (name, _) in std::env::vars_os().filter(|(name, _)| super::driver_variable(name)) {
        command.env_remove(name);
    }
    // The fake's trace of unknown event calls (their thread and stack), to find which call.
    if let Some(trace) = std::env::var_os("FAKE_CUDA_TRACE_UNKNOWN_EVENTS") {
        command.env("FAKE_CUDA_TRACE_UNKNOWN_EVENTS", trace);
    }
    command
        .env(SCRIPT_ENV, &file)
        .env("CUDA_DL_SYS_LIBRARY", fake_driver_path())
        .env("FAKE_CUDA_DEVICES", script::DEVICES.to_string())
        .env(
            cuda_host_launch::CLEANUP_MODE_ENV,
            if script.settings.manual_cleanup {
                "manual"
            } else {
                "reaper"
            },
        );
    let started = Instant::now();
    let result = super::run_with_timeout(command, Duration::from_secs(90));
    let took = started.elapsed();
    let _ = std::fs::remove_file(&file);
    match result {
        Err(why) => Outcome {
            passed: false,
            output: why,
            took,
        },
        Ok((status, stdout, stderr)) => {
            let ran = stdout.contains(" 1 passed") || script.settings.exit;
            Outcome {
                passed: status.success() && ran,
                output: format!("{stdout}\n{stderr}"),
                took,
            }
        }
    }
}

fn script_counter() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// Where failing scripts are written: `target/torture-failures/` beside the test binary's
/// target folder (or `TORTURE_FAILURES`).
pub fn failure_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("TORTURE_FAILURES") {
        return PathBuf::from(dir);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<binary> → target/torture-failures
    exe.ancestors().nth(3).map_or_else(
        || PathBuf::from("torture-failures"),
        |t| t.join("torture-failures"),
    )
}

/// Writes a failing script where [`failure_dir`] says, and returns the message for the test's
/// failure: the script's file, the commands to replay and shrink it, and what the child printed.
pub fn report_failure(script: &Script, outcome: &Outcome) -> String {
    let dir = failure_dir();
    let _ = std::fs::create_dir_all(&dir);
    let file = dir.join(format!("seed-{}.txt", script.settings.seed));
    let _ = std::fs::write(&file, script.to_string());
    // The child's whole output beside it (a trace the lines below leave out, say).
    let full = dir.join(format!("seed-{}.output.txt", script.settings.seed));
    let _ = std::fs::write(&full, &outcome.output);
    let interesting: Vec<&str> = outcome
        .output
        .lines()
        .filter(|l| l.contains("violation") || l.contains("TORTURE") || l.contains("panicked"))
        .take(160)
        .collect();
    format!(
        "torture run of seed {} failed ({:?}); script: {}\n  output: {}\n  replay: scripts/torture \
         --replay {}\n  shrink: scripts/torture --shrink {}\n{}\n--- script ---\n{}",
        script.settings.seed,
        outcome.took,
        file.display(),
        full.display(),
        file.display(),
        file.display(),
        if interesting.is_empty() {
            outcome
                .output
                .as_str()
                .chars()
                .rev()
                .take(4000)
                .collect::<String>()
                .chars()
                .rev()
                .collect()
        } else {
            interesting.join("\n")
        },
        shorten(&script.to_string()),
    )
}

fn shorten(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    if lines.len() <= 60 {
        return text.to_string();
    }
    format!(
        "{}\n... ({} lines in all: see the file)",
        lines[..60].join("\n"),
        lines.len()
    )
}

/// Whether `script` fails in at least one of `attempts` runs (with `TORTURE_SHRINK_MATCH` set, with
/// a failure whose output contains that text: a shrink keeps the failure it started from).
fn fails(script: &Script, attempts: usize) -> bool {
    let wanted = std::env::var("TORTURE_SHRINK_MATCH").ok();
    (0..attempts).any(|_| {
        let outcome = run_child(script);
        !outcome.passed
            && wanted
                .as_deref()
                .is_none_or(|text| outcome.output.contains(text))
    })
}

/// Cuts `script` down to what still fails (in at least one of `attempts` runs of each candidate;
/// see [`fails`] for `TORTURE_SHRINK_MATCH`):
/// whole threads first, then chunks of each thread's operations, halving the chunk size down to
/// single operations. Returns the smallest failing script found.
pub fn shrink(script: &Script, attempts: usize, log: &mut dyn FnMut(&str)) -> Script {
    let mut best = script.clone();
    // Whole threads.
    let mut t = 0;
    while t < best.threads.len() && best.threads.len() > 1 {
        let mut candidate = best.clone();
        candidate.threads.remove(t);
        if fails(&candidate, attempts) {
            log(&format!("without thread {t}: still fails"));
            best = candidate;
        } else {
            t += 1;
        }
    }
    // Chunks of operations.
    for t in 0..best.threads.len() {
        let mut chunk = best.threads[t].len().div_ceil(2).max(1);
        loop {
            let mut start = 0;
            while start < best.threads[t].len() {
                let mut candidate = best.clone();
                let end = (start + chunk).min(candidate.threads[t].len());
                candidate.threads[t].drain(start..end);
                if fails(&candidate, attempts) {
                    log(&format!(
                        "thread {t}: without ops {start}..{end}: still fails ({} left)",
                        candidate.threads[t].len()
                    ));
                    best = candidate;
                } else {
                    start += chunk;
                }
            }
            if chunk == 1 {
                break;
            }
            chunk = chunk.div_ceil(2);
        }
    }
    best
}

/// Reads a script file.
///
/// # Errors
/// If the file cannot be read or is not a script.
pub fn read_script(path: &Path) -> Result<Script, String> {
    std::fs::read_to_string(path)
        .map_err(|e| format!("{}: {e}", path.display()))?
        .parse()
}
