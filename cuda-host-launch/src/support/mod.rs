//! What every layer above may use: errors, the synchronisation primitives (std's or loom's), the
//! lock-free stack, thread marks, process events (exit, fork), panic reporting, and the small
//! driver helpers (stream handles, capture queries, the capture interaction mode, a context pushed
//! for a few calls).

#[cfg(not(loom))]
pub(crate) mod block_on;
#[cfg(not(loom))]
pub(crate) mod capture;
#[cfg(not(loom))]
pub(crate) mod config;
#[cfg(not(loom))]
pub(crate) mod context_key;
#[cfg(not(loom))]
pub(crate) mod crate_threads;
pub(crate) mod error;
#[cfg(not(loom))]
pub(crate) mod exit_gate;
#[cfg(not(loom))]
pub(crate) mod fast_hash;
#[cfg(not(loom))]
pub(crate) mod forked_child;
pub(crate) mod host_thread;
pub(crate) mod intrusive_stack;
pub(crate) mod own_line;
#[cfg(not(loom))]
pub(crate) mod panic_report;
#[cfg(not(loom))]
pub(crate) mod precise_sleeps;
#[cfg(not(loom))]
pub(crate) mod pushed_context;
#[cfg(not(loom))]
pub(crate) mod raw_stream;
#[cfg(not(loom))]
pub(crate) mod relaxed_capture;
#[cfg(not(loom))]
pub(crate) mod sticky_error;
pub(crate) mod sync;
#[cfg(not(loom))]
pub(crate) mod thread_settings;
pub(crate) mod thread_slots;
