//! What every exported driver function does first: count the call, answer as the stub would,
//! inject a configured fault, insist on `cuInit`, and keep panics from crossing the C boundary.

use std::cell::Cell;
use std::collections::BTreeMap;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use cuda_dl_sys::types::CUresult;

use crate::config::config;
use crate::errors::{DEINITIALIZED, NOT_INITIALIZED, STUB_LIBRARY, UNKNOWN};
use crate::state::{relock, thread_number};

/// An injected failure: the `nth` call (1-based, counted from when the fault was set; 0 = every
/// call) of a function returns `code` and does nothing else.
struct Fault {
    nth: u64,
    code: u32,
    seen: u64,
}

#[derive(Default)]
struct Calls {
    /// Per export name: its base name and how often it was called.
    counts: BTreeMap<&'static str, (&'static str, u64)>,
    /// The same, for calls made on a driver thread (see [`mark_driver_thread`]).
    on_driver_threads: BTreeMap<&'static str, (&'static str, u64)>,
    /// Per base (or export) name.
    faults: BTreeMap<String, Fault>,
}

static CALLS: LazyLock<Mutex<Calls>> = LazyLock::new(|| {
    let mut calls = Calls::default();
    arm(&mut calls, &ENV_FAULTS);
    Mutex::new(calls)
});

/// The faults `FAKE_CUDA_FAIL` asked for at load: `(name, nth, code)`.
static ENV_FAULTS: LazyLock<Vec<(String, u64, u32)>> = LazyLock::new(|| {
    let Ok(spec) = std::env::var("FAKE_CUDA_FAIL") else {
        return Vec::new();
    };
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .filter_map(|item| {
            let fault = parse_fault(item);
            if fault.is_none() {
                eprintln!("fake-cuda: ignoring FAKE_CUDA_FAIL item {item:?}");
            }
            fault.map(|(name, nth, code)| (name.to_owned(), nth, code))
        })
        .collect()
});

/// Sets `faults` in `calls` (counted from now).
fn arm(calls: &mut Calls, faults: &[(String, u64, u32)]) {
    for (name, nth, code) in faults {
        calls.faults.insert(
            name.clone(),
            Fault {
                nth: *nth,
                code: *code,
                seen: 0,
            },
        );
    }
}

static INITIALIZED: AtomicBool = AtomicBool::new(false);

/// When not 0: the number of the only thread whose calls are counted and may meet a fault (see
/// [`focus_on_this_thread`]).
static FOCUS: AtomicU64 = AtomicU64::new(0);

thread_local! {
    /// Whether this thread is one of the driver's own: a context's worker (which runs host
    /// functions) or the user-object destructor thread. A const-initialised `Cell` needs no
    /// destructor, so it is cheap on every thread.
    static DRIVER_THREAD: Cell<bool> = const { Cell::new(false) };
}

/// From now on, only the calling thread's calls are counted and may meet an injected fault
/// (`on`), or every thread's again. For tests that count one thread's calls while the library's
/// own threads (its reaper, its poller) call the driver at moments of their own.
pub(crate) fn focus_on_this_thread(on: bool) {
    FOCUS.store(if on { thread_number() } else { 0 }, Ordering::Release);
}

/// Marks the calling thread as a driver thread: the driver calls it makes from now on are also
/// counted apart (the real driver forbids CUDA calls from host functions and user-object
/// destructors; tests use the count to check that nobody makes them).
pub(crate) fn mark_driver_thread() {
    DRIVER_THREAD.with(|d| d.set(true));
}

/// `name[@n][=code]` → (name, n or 0, code or 999).
fn parse_fault(item: &str) -> Option<(&str, u64, u32)> {
    let (rest, code) = match item.split_once('=') {
        Some((rest, code)) => (rest, code.trim().parse().ok()?),
        None => (item, UNKNOWN.0),
    };
    let (name, nth) = match rest.split_once('@') {
        Some((name, nth)) => (name, nth.trim().parse().ok()?),
        None => (rest, 0),
    };
    let name = name.trim();
    (!name.is_empty()).then_some((name, nth, code))
}

/// Functions that answer before `cuInit`, as the real driver's do.
fn works_uninitialized(base: &str) -> bool {
    matches!(
        base,
        "cuInit"
            | "cuDriverGetVersion"
            | "cuGetErrorName"
            | "cuGetErrorString"
            | "cuGetProcAddress"
    )
}

/// Runs the body of the export `export` (a variant of `base`) after the common checks.
pub(crate) fn call(
    export: &'static str,
    base: &'static str,
    body: impl FnOnce() -> CUresult,
) -> CUresult {
    crate::hooks::run(export, base, false);
    if let Some(code) = count_and_fault(export, base) {
        return code;
    }
    if crate::teardown::refuse_call(export) {
        return DEINITIALIZED;
    }
    if !works_uninitialized(base) && !INITIALIZED.load(Ordering::Acquire) {
        return NOT_INITIALIZED;
    }
    // cuEventQuery makes its own check: an event recorded in a capture answers before it.
    if base != "cuEventQuery"
        && let Err(code) = crate::capture_mode::check(base)
    {
        return code;
    }
    // A panic must not unwind into C (it would abort the process); report it as an unknown error.
    let code = catch_unwind(AssertUnwindSafe(body)).unwrap_or(UNKNOWN);
    crate::hooks::run(export, base, true);
    code
}

fn count_and_fault(export: &'static str, base: &'static str) -> Option<CUresult> {
    let focus = FOCUS.load(Ordering::Acquire);
    if focus != 0 && focus != thread_number() {
        return config().stub().then_some(STUB_LIBRARY);
    }
    let mut calls = relock(&CALLS);
    calls.counts.entry(export).or_insert((base, 0)).1 += 1;
    if DRIVER_THREAD.with(Cell::get) {
        calls.on_driver_threads.entry(export).or_insert((base, 0)).1 += 1;
    }
    if config().stub() {
        return Some(STUB_LIBRARY);
    }
    for name in [base, export] {
        if let Some(fault) = calls.faults.get_mut(name) {
            fault.seen += 1;
            if fault.nth == 0 || fault.seen == fault.nth {
                return Some(CUresult(fault.code));
            }
        }
        if base == export {
            break;
        }
    }
    None
}

pub(crate) fn set_initialized() {
    INITIALIZED.store(true, Ordering::Release);
}

fn count_in(counts: &BTreeMap<&'static str, (&'static str, u64)>, name: &str) -> u64 {
    counts
        .iter()
        .filter(|(export, (base, _))| **export == name || *base == name)
        .map(|(_, (_, n))| n)
        .sum()
}

/// Calls of `name`: a base name counts every variant, any other export name only itself.
pub(crate) fn count(name: &str) -> u64 {
    count_in(&relock(&CALLS).counts, name)
}

/// Calls of `name` (as for [`count`]) made on a driver thread.
pub(crate) fn count_on_driver_threads(name: &str) -> u64 {
    let calls = relock(&CALLS);
    if name.is_empty() {
        return calls.on_driver_threads.values().map(|(_, n)| n).sum();
    }
    count_in(&calls.on_driver_threads, name)
}

/// Every counter, one line each: `export base count` (export names in order).
pub(crate) fn counts_text() -> String {
    use std::fmt::Write;
    let calls = relock(&CALLS);
    let mut text = String::new();
    for (export, (base, n)) in &calls.counts {
        let _ = writeln!(text, "{export} {base} {n}");
    }
    text
}

pub(crate) fn reset_counts() {
    let mut calls = relock(&CALLS);
    calls.counts.clear();
    calls.on_driver_threads.clear();
}

pub(crate) fn set_fault(name: &str, nth: u64, code: u32) {
    relock(&CALLS)
        .faults
        .insert(name.to_owned(), Fault { nth, code, seen: 0 });
}

pub(crate) fn clear_faults() {
    relock(&CALLS).faults.clear();
}

/// Replaces every fault with those `FAKE_CUDA_FAIL` asked for at load, counted from now.
pub(crate) fn reset_faults() {
    let mut calls = relock(&CALLS);
    calls.faults.clear();
    arm(&mut calls, &ENV_FAULTS);
}

#[cfg(test)]
mod tests {
    use super::parse_fault;

    #[test]
    fn fault_specs_parse() {
        assert_eq!(parse_fault("cuInit"), Some(("cuInit", 0, 999)));
        assert_eq!(parse_fault("cuInit=100"), Some(("cuInit", 0, 100)));
        assert_eq!(parse_fault("cuInit@3"), Some(("cuInit", 3, 999)));
        assert_eq!(parse_fault("cuInit@2=34"), Some(("cuInit", 2, 34)));
        assert_eq!(parse_fault("cuInit@x"), None);
        assert_eq!(parse_fault("=4"), None);
    }
}
