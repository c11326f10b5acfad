//! Stream-ordered host functions for CUDA whose owners are released off the driver's thread.
//!
//! A host function (`cuLaunchHostFunc`) runs on a thread of the CUDA driver once the work enqueued
//! before it on its stream has completed. Whatever it uses must stay alive until then, and must be
//! released afterwards, but **not on the driver's thread**: releasing a device buffer calls CUDA,
//! which a host function must not do. This crate keeps that promise:
//!
//! - [`launch_host_function`]`(stream, f, user_data, owners)`: the owners (any `Send + 'static`
//!   values, a tuple for several) stay alive until `f` has returned, then are dropped exactly once
//!   by the cleanup queue: never on the driver's thread, never before `f` ran, and on the caller's
//!   thread if the launch fails.
//! - [`host_launch`]`(stream, closure)`: the same for a closure, whose captures are its owners.
//! - [`launch_host_function_with_bytes`]: a C host function with a private copy of its user data.
//! - [`add_host_node`]: a graph host node running a closure, which the graph owns (through a CUDA
//!   user object) until it and every executable graph made from it are destroyed.
//! - [`completion`] / [`host_launch_async`]: futures of stream work, runtime-agnostic.
//! - Feature `cudarc`: cudarc's `CudaStream` is a launch target like this crate's [`Stream`] (module
//!   `cudarc_stream`).
//!
//! Their variants are methods of the value that chooses them:
//!
//! - [`LaunchOptions`]: the driver thread's sync mode (`cuLaunchHostFunc_v2`, CUDA 13.1+), for
//!   [`LaunchOptions::launch_host_function`], [`LaunchOptions::host_launch`] and
//!   [`LaunchOptions::add_host_node`] (and [`LaunchOptions::add_host_node_raw`] for raw graph
//!   handles); and the repeatable launches, [`LaunchOptions::host_launch_repeatable`] and
//!   [`LaunchOptions::launch_host_function_repeatable`]: host functions that may run many times,
//!   so they also work on a capturing stream, where they become a graph host node owned by the
//!   graph.
//! - [`CompletionMode`]: with [`CompletionMode::LowLatency`]`.`[`completion`](CompletionMode::completion)
//!   the stream writes a flag that a poller thread watches, without a host function.
//! - [`pending_launches`], [`reclaim_pending`], [`PrimaryContext::reset`]: launches whose host
//!   function will never run (a sticky error) have their owners released once the context is reset
//!   or destroyed.
//!
//! One heap allocation per launch (the launch record holds the function, its data and its owners);
//! the driver's thread only runs the function and pushes the record onto a lock-free queue. A
//! reaper thread (or, in [`CleanupMode::Manual`], the next launch, [`drain`] or [`flush`]) drops the
//! owners. The workspace's `DESIGN.md` tells which thread drops what.
//!
//! # Features
//! - `unpooled-records` (off by default): every launch record is a `Box` of its own instead of a
//!   slot of the record pool. Slower; for memory checkers such as AddressSanitizer, which then see
//!   each record's release as a `free`.
//!
//! # Rules for host functions
//! - **No CUDA calls inside a host function.** The driver may fail them or deadlock. This crate's
//!   own launches, [`flush`] and the driver calls of its resource and graph types return
//!   [`Error::InsideHostFunction`] there. This crate knows its own host functions; one launched
//!   by other code that may call into this crate marks its thread with a [`HostFunctionScope`]
//!   first.
//! - **One driver thread runs every host function of a context**: a slow one delays the host
//!   functions of every stream of that context (device work is not delayed).
//! - **A host function never runs after a sticky context error** (a kernel trapped, error 719),
//!   although the launch succeeded. This crate tracks the launches still pending in each context;
//!   once the context is reset ([`PrimaryContext::reset`], or the last release of a
//!   [`PrimaryContext`]) or destroyed ([`reclaim_pending`]), their owners are released.
//!   [`pending_launches`] counts them.
//! - **`cuCtxDestroy` waits for pending host functions**, running them first.
//! - **Run-once launches on a capturing stream are refused** with [`Error::CaptureActive`]: a
//!   captured host function runs on every replay of the graph, long after a run-once launch would
//!   have released its owners. Use the repeatable forms there. (If another thread begins a capture
//!   of the stream while a run-once launch is in progress, the host function may become a node of
//!   that graph: it then runs on the first call only, and later replays do nothing.)
//!
//! # Example
//! ```no_run
//! use std::sync::Arc;
//! use cuda_host_launch::{host_launch, Device, PrimaryContext, Stream};
//!
//! fn main() -> Result<(), cuda_host_launch::Error> {
//!     let context = PrimaryContext::retain(Device::get(0)?)?;
//!     let stream = Stream::new(&context)?;
//!     let results = Arc::new(std::sync::Mutex::new(Vec::new()));
//!     for i in 0..3 {
//!         let results = Arc::clone(&results);
//!         // Runs on the driver's thread, in stream order; `results` (an owner) is dropped later,
//!         // by the cleanup queue.
//!         host_launch(&stream, move || results.lock().unwrap().push(i))?;
//!     }
//!     stream.synchronize()?;
//!     cuda_host_launch::flush(std::time::Duration::from_secs(1))?;
//!     assert_eq!(*results.lock().unwrap(), [0, 1, 2]);
//!     Ok(())
//! }
//! ```

#![warn(
    missing_docs,
    unsafe_op_in_unsafe_fn,
    clippy::undocumented_unsafe_blocks
)]
// Under loom only the lock-free core is compiled, for its models, which do not use all of it.
#![cfg_attr(loom, allow(dead_code, unused_imports))]

// The layers, lowest first: support, record, reaper, tracking, transport, resources, then the
// public API (completion, graph, launch, cudarc_stream); a module uses only the layers below it
// (and its own), as `scripts/check-layers` checks and `DESIGN.md` draws. Under `--cfg loom` (model checking: see
// `loom_models`) only the lock-free core and its models are compiled: the rest uses `static`
// atomics (loom's are not `const`), `std::thread` and the driver.
#[cfg(not(loom))]
mod after;
#[cfg(not(loom))]
mod completion;
#[cfg(all(feature = "cudarc", not(loom)))]
pub mod cudarc_stream;
#[cfg(not(loom))]
mod flush;
#[cfg(not(loom))]
mod graph;
#[cfg(not(loom))]
mod launch;
mod reaper;
mod record;
#[cfg(not(loom))]
mod resources;
mod support;
#[cfg(not(loom))]
mod tracking;
#[cfg(not(loom))]
mod transport;

#[cfg(all(test, loom))]
mod loom_models;

#[cfg(not(loom))]
pub use after::{PollerSettings, poller_settings, release_after, set_poller_settings, spawn_after};
#[cfg(not(loom))]
pub use completion::{Completion, CompletionMode, HostLaunchFuture, completion, host_launch_async};
#[cfg(not(loom))]
pub use flush::flush;
#[cfg(not(loom))]
pub use graph::{Graph, GraphExec, GraphNode, add_host_node};
#[cfg(not(loom))]
pub use launch::{host_launch, launch_host_function, launch_host_function_with_bytes};
#[cfg(not(loom))]
pub use reaper::defer_drop::defer_drop;
#[cfg(not(loom))]
pub use reaper::mode::{CLEANUP_MODE_ENV, CleanupMode, cleanup_mode, set_cleanup_mode};
#[cfg(not(loom))]
pub use reaper::release::{CleanupStats, cleanup_stats, drain};
#[cfg(not(loom))]
pub use reaper::thread::{REAPER_LINGER_ENV, REAPER_POLL_ENV};
#[cfg(not(loom))]
pub use resources::{Device, Event, PrimaryContext, Stream};
#[cfg(not(loom))]
pub use support::crate_threads::{
    Affinity, CrateThread, StartHook, ThreadSettings, set_thread_settings, thread_settings,
};
#[cfg(not(loom))]
pub use support::error::Error;
#[cfg(not(loom))]
pub use support::host_thread::{HostFunctionScope, in_host_function};
#[cfg(not(loom))]
pub use support::panic_report::{PanicOrigin, PanicReport, reset_panic_handler, set_panic_handler};
#[cfg(not(loom))]
pub use support::raw_stream::{AsRawStream, RawStream, StreamIds};
#[cfg(not(loom))]
pub use tracking::pending::{launch_ticket_bytes, pending_launches};
#[cfg(not(loom))]
pub use transport::options::{HostTaskSyncMode, LaunchOptions};
#[cfg(not(loom))]
pub use transport::poller_pace::poller_cpu_time;
#[cfg(not(loom))]
pub use transport::reclaim_pending;

/// The `cuda-dl-sys` this crate is built on, for raw driver calls.
pub use cuda_dl_sys;
