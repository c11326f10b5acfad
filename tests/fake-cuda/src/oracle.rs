//! What the fake knows that a test's oracle needs and the code under test cannot see: how far
//! each stream got (operations enqueued and completed, by stream id, kept after the stream is
//! gone), whether a context (by `cuCtxGetId`) still lives, and which threads invalidated captures.
//!
//! A torture test reads a stream's position before it asks the code under test to enqueue work
//! there; whatever that work releases or runs later must find the stream's completed count at
//! least that far (or the work's context gone).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::state::{State, relock};

/// Operations of one stream (by its `cuStreamGetId`): enqueued in stream order (not captured),
/// and completed by the context's driver thread.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Progress {
    pub(crate) enqueued: u64,
    pub(crate) completed: u64,
}

/// One capture invalidated by a prohibited call (see `capture_mode.rs`).
pub(crate) struct Invalidation {
    /// The calling thread's name, as the operating system knows it (15 bytes on Linux).
    pub(crate) thread: String,
}

static INVALIDATIONS: Mutex<Vec<Invalidation>> = Mutex::new(Vec::new());

/// An operation was appended to the stream with id `stream_id`.
pub(crate) fn enqueued(st: &mut State, stream_id: u64) {
    st.progress.entry(stream_id).or_default().enqueued += 1;
}

/// The driver thread finished an operation of the stream with id `stream_id`.
pub(crate) fn completed(st: &mut State, stream_id: u64) {
    st.progress.entry(stream_id).or_default().completed += 1;
}

/// The progress of the stream with id `stream_id`, if it ever had work.
pub(crate) fn progress(st: &State, stream_id: u64) -> Option<Progress> {
    st.progress.get(&stream_id).copied()
}

/// Whether a usable context has the id `id` (a context's id changes when it is destroyed and made
/// again, a primary context's included).
pub(crate) fn context_alive(st: &State, id: u64) -> bool {
    st.contexts.values().any(|c| c.id == id && c.usable())
}

/// Whether the context with id `id` has had a sticky error: it lives on with it (running nothing),
/// or died with it (ids are never reused, so the answer never goes back to `false`: a judgement
/// that looks at it after the context's death sees what it would have seen before).
pub(crate) fn context_poisoned(st: &State, id: u64) -> bool {
    st.died_poisoned.contains(&id) || st.contexts.values().any(|c| c.id == id && c.is_poisoned())
}

/// A prohibited call on the calling thread invalidated a capture.
pub(crate) fn invalidated_by_this_thread() {
    relock(&INVALIDATIONS).push(Invalidation {
        thread: this_thread_name(),
    });
}

/// Captures invalidated by threads whose name starts with `prefix`.
pub(crate) fn invalidations_by(prefix: &str) -> u64 {
    relock(&INVALIDATIONS)
        .iter()
        .filter(|i| i.thread.starts_with(prefix))
        .count() as u64
}

/// The calling thread's name as the operating system knows it (threads of other Rust copies in the
/// process, the library under test's among them, are unknown to this copy's `std::thread`).
pub(crate) fn this_thread_name() -> String {
    #[cfg(target_os = "linux")]
    {
        std::fs::read_to_string("/proc/thread-self/comm")
            .map(|name| name.trim_end().to_string())
            .unwrap_or_default()
    }
    #[cfg(not(target_os = "linux"))]
    {
        std::thread::current().name().unwrap_or("").to_string()
    }
}

/// For [`State`]: the progress of every stream that ever had work.
pub(crate) type ProgressMap = BTreeMap<u64, Progress>;

/// Calls that named an event the fake does not know: destroyed (with its context too, by a
/// destroy, last release or reset), or never made. On the real driver such a handle may name
/// another event made since, so a library must never pass one.
static UNKNOWN_EVENT_CALLS: AtomicU64 = AtomicU64::new(0);

/// An event call named an unknown event: counted, and the call's answer. With
/// `FAKE_CUDA_TRACE_UNKNOWN_EVENTS` set, the calling thread and its stack are printed (to find
/// which call of a library made it).
pub(crate) fn unknown_event() -> cuda_dl_sys::types::CUresult {
    UNKNOWN_EVENT_CALLS.fetch_add(1, Ordering::Relaxed);
    if std::env::var_os("FAKE_CUDA_TRACE_UNKNOWN_EVENTS").is_some() {
        eprintln!(
            "fake-cuda: an unknown event named on thread {:?}:\n{}",
            std::thread::current().name(),
            std::backtrace::Backtrace::force_capture()
        );
    }
    crate::errors::INVALID_HANDLE
}

/// How many calls named an event the fake does not know, since the fake was loaded.
pub(crate) fn unknown_event_calls() -> u64 {
    UNKNOWN_EVENT_CALLS.load(Ordering::Relaxed)
}
