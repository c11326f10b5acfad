//! Stream-ordered host functions for CUDA whose owners are released off the driver's thread.
//!
//! A host function (`cuLaunchHostFunc`) runs on a thread of the CUDA driver once the work enqueued
//! before it on its stream has completed. Whatever it uses must stay alive until then, and must be
//! released afterwards, but **not on the driver's thread**: releasing a device buffer calls CUDA,
//! which a host function must not do. This crate keeps that promise, and offers ways to act on
//! stream order that need no host function at all.
//!
//! # Which call for what
//!
//! | you want | call | how |
//! | --- | --- | --- |
//! | code run in stream order, with **later work on the stream waiting for it** | [`host_launch`]`(stream, closure)`; [`launch_host_function`]`(stream, f, user_data, owners)` for a C function (its `owners` kept alive with it); [`launch_host_function_with_bytes`] for a C function with a private copy of its user data | a host function on the driver's thread: no CUDA calls inside; the captures or owners are dropped after it returned, by the cleanup queue |
//! | values kept alive until the stream's **earlier work is done**, then dropped (a staging buffer, a device buffer the kernels used) | [`release_after`]`(stream, owners)` | one `cuEventRecord`; the stream does not wait; the crate's watcher sees it done and the reaper drops them (CUDA 12.0, a primary context's stream) |
//! | a closure run once the stream's earlier work is done, **which may call CUDA** (free memory, enqueue more work) | [`spawn_after`]`(stream, closure)` | as `release_after`; the closure runs on the reaper with the stream's context current |
//! | a future of the stream's work so far, for async code | [`completion`]`(stream)`, or [`CompletionMode`]`::…`[`.completion(stream)`](CompletionMode::completion) | see "Completion modes" below; runtime-agnostic (a `std::task::Waker`) |
//! | a future of a closure's result, in stream order | [`host_launch_async`] | always a host function (the result exists once it ran) |
//! | host code in a **graph**: a node, or a launch on a capturing stream | [`add_host_node`] on a [`Graph`]; [`LaunchOptions::host_launch_repeatable`] / [`LaunchOptions::launch_host_function_repeatable`] | the owners live as long as the graph and every executable graph made from it |
//! | the driver thread's sync mode (CUDA 13.2+) | [`LaunchOptions`] | the same launches as methods of the options |
//! | a **barrier** before a check or an exit: every owner of completed work dropped, every callback returned | [`flush`]`(timeout)` after `stream.synchronize()` | waits for a round of the watcher, then the cleanup queue; pending work is not waited for |
//! | **configure** the crate: who drops the owners ([`CleanupMode`]), its threads' names, CPUs and start hook ([`ThreadSettings`], [`Affinity`]), the watcher's latency against its CPU time for events ([`PollerSettings`]), the reaper's pace | [`Config`]`::new()…`[`.install()`](Config::install), once, before the first launch; environment variables override it ([`CLEANUP_MODE_ENV`], [`POLLER_ENV`], [`REAPER_POLL_ENV`], [`REAPER_LINGER_ENV`]) | a second install, or one after the first use, is refused ([`Error::AlreadyConfigured`]); [`config`] reads what is in force; [`cleanup_stats`] counts the releases, [`poller_cpu_time`] what the watcher used |
//! | a **leak check** in a test: the crate's own events and context retains given back too | [`quiesce`]`(timeout)` after `stream.synchronize()` | a `flush`, then the watcher gives back its pooled events and retains at once (else 100 ms after its last work) |
//! | the owners of launches that will never run (a sticky error) | [`pending_launches`]; [`PrimaryContext::reset`] or the last [`PrimaryContext`] dropped; [`reclaim_pending`] after a `cuCtxDestroy` of your own | released once through the cleanup queue; futures resolve to [`Error::ContextLost`] |
//!
//! **On an error, what you handed over comes back.** Work enqueued on the stream before a call may
//! still use what the call was given (a staging buffer a copy reads, a buffer a kernel writes), so
//! no error path of this crate drops it. Every call that takes owners or a closure returns a
//! [`LaunchError`]`<T>`, as `std::sync::mpsc::SendError<T>` does: where nothing was enqueued (a
//! capturing stream, a driver error, a call inside a host function, ...),
//! [`into_inner`](LaunchError::into_inner) gives them back, and the caller decides (synchronize,
//! then drop; or try another stream). Where a capture may hold what was enqueued, or a graph
//! already owns it, the crate keeps them (`into_inner` is `None`) and releases them once nothing
//! can use them; each call's `# Errors` section says which is which. `?` into [`Error`] drops them
//! (off the driver's thread); `.unwrap()` works whatever they are.
//!
//! **Host function or event?** A host function makes the stream wait until it has run: use it
//! when later work on the stream depends on it, or inside a graph. When nothing on the stream waits
//! for the host side, [`release_after`] and [`spawn_after`] cost a fraction of a host function to
//! enqueue and do not pass through the context's one driver thread (`BENCHMARKS.md` in the
//! workspace gives the figures).
//!
//! A stream is this crate's [`Stream`] (made from a [`PrimaryContext`]), a [`RawStream`], anything
//! else that implements [`AsRawStream`], or, with the feature `cudarc`, cudarc's `CudaStream`
//! (module `cudarc_stream`).
//!
//! # Completion modes
//!
//! [`CompletionMode`] chooses how a [`Completion`] learns that the stream got there:
//! - `Auto` (the default, [`completion`]): `Event` where it can (a primary context's stream,
//!   CUDA 12.0+), else `HostFunction`.
//! - `Event`: the stream records an event that the crate's watcher queries; no host function,
//!   the cheapest enqueue, some CPU while futures wait (paced by [`PollerSettings`]).
//! - `HostFunction`: a host function wakes the task; no CPU at all while the future waits, and
//!   the wake-up waits for the driver's thread.
//! - `LowLatency`: the stream writes a flag into host memory that the same watcher
//!   watches; the soonest wake-up, a busy core meanwhile (CUDA 12.0).
//!
//! `BENCHMARKS.md` ("Choosing a completion mode and the poller's pace") gives each mode's latency
//! and CPU time. The watcher spins briefly after news, then looks at pauses that grow with
//! the wait, between [`PollerSettings::interval`] and [`PollerSettings::max_interval`], and exits
//! after [`PollerSettings::idle_exit`] with nothing pending; for repeated work it spins near the
//! time each stream's work is expected to complete ([`PollerSettings::learned_spin`]);
//! [`PollerSettings::LOW_LATENCY`] spins while anything is pending ([`Config::event_poller`]).
//!
//! # Cleanup and the crate's threads
//!
//! One heap allocation per launch (the launch record holds the function, its data and its owners,
//! usually in a pooled slot); the driver's thread only runs the function and pushes the record onto
//! a lock-free queue. A reaper thread (or, in [`CleanupMode::Manual`], the next launch, [`drain`] or
//! [`flush`]) drops the owners, with no context current, and runs [`spawn_after`] callbacks: all
//! user code the crate holds runs there. The watcher (one thread, for events and flags) only
//! watches for completions and wakes futures (a device fault fails the futures of its context at
//! once, and drops its callbacks unrun). Both run in relaxed stream-capture mode, so a `Drop` that frees
//! memory never breaks another thread's capture; the reaper and the watcher stop before the
//! driver is torn down at exit ([`flush`] first where owners must be dropped).
//! The workspace's `DESIGN.md` tells which thread drops what; `RELIABILITY.md` lists what is
//! promised and the tests that check it.
//!
//! # Features
//! - `cudarc`: cudarc's `CudaStream` (and `Arc<CudaStream>`) is a launch target.
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
//! (The doc tests run on the workspace's fake driver, through a hidden line; `examples/quickstart`
//! runs the same on a GPU, or on the fake driver without one.)
//! ```
//! use std::sync::{Arc, Mutex};
//! use std::time::Duration;
//! use cuda_host_launch::{
//!     host_launch, release_after, spawn_after, Affinity, Config, Device, PrimaryContext, Stream,
//!     ThreadSettings,
//! };
//!
//! fn main() -> Result<(), cuda_host_launch::Error> {
//! #   let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
//!     // Optional, once, before the first launch: keep the crate's threads off CPU 0.
//!     Config::new()
//!         .threads(ThreadSettings::new().affinity(Affinity::Cpus(vec![1, 2, 3])))
//!         .install()?;
//!
//!     let context = PrimaryContext::retain(Device::get(0)?)?;
//!     let stream = Stream::new(&context)?;
//!
//!     // Later work on the stream waits for these: host functions, in stream order, on the
//!     // driver's thread. `results` (an owner) is dropped later, by the cleanup queue.
//!     let results = Arc::new(Mutex::new(Vec::new()));
//!     for i in 0..3 {
//!         let results = Arc::clone(&results);
//!         host_launch(&stream, move || results.lock().unwrap().push(i))?;
//!     }
//!
//!     // Nothing on the stream waits for these: one event each, watched by the crate's watcher.
//!     let staging = vec![0u8; 1 << 20]; // stands for what the stream's earlier work reads
//!     release_after(&stream, staging)?; // dropped once that work is done
//!     spawn_after(&stream, || println!("the stream got here; CUDA calls are allowed"))?;
//!
//!     stream.synchronize()?;
//!     // The barrier: every owner of the work above dropped, every callback returned.
//!     cuda_host_launch::flush(Duration::from_secs(1))?;
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

// The layers, lowest first: support, record, reaper, enqueue, transport, resources, then the
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
mod enqueue;
#[cfg(not(loom))]
mod flush;
#[cfg(not(loom))]
mod graph;
#[cfg(not(loom))]
mod launch;
#[cfg(not(loom))]
mod launch_error;
mod reaper;
mod record;
#[cfg(not(loom))]
mod resources;
mod support;
#[cfg(not(loom))]
mod transport;

#[cfg(all(test, loom))]
mod loom_models;

#[cfg(not(loom))]
pub use after::{release_after, spawn_after};
#[cfg(not(loom))]
pub use completion::{Completion, CompletionMode, HostLaunchFuture, completion, host_launch_async};
#[cfg(not(loom))]
pub use enqueue::pending::{launch_ticket_bytes, pending_launches};
#[cfg(not(loom))]
pub use flush::{flush, quiesce};
#[cfg(not(loom))]
pub use graph::{Graph, GraphExec, GraphNode, add_host_node};
#[cfg(not(loom))]
pub use launch::{host_launch, launch_host_function, launch_host_function_with_bytes};
#[cfg(not(loom))]
pub use launch_error::LaunchError;
#[cfg(not(loom))]
pub use reaper::defer_drop::defer_drop;
#[cfg(not(loom))]
pub use reaper::release::{CleanupStats, cleanup_stats, drain};
#[cfg(not(loom))]
pub use resources::{Device, Event, PrimaryContext, Stream};
#[cfg(not(loom))]
pub use support::config::{
    CLEANUP_MODE_ENV, CleanupMode, Config, POLLER_ENV, PollerSettings, REAPER_LINGER_ENV,
    REAPER_POLL_ENV, config,
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
pub use support::thread_settings::{Affinity, CrateThread, StartHook, ThreadSettings};
#[cfg(not(loom))]
pub use transport::options::{HostTaskSyncMode, LaunchOptions};
#[cfg(not(loom))]
pub use transport::poller_pace::poller_cpu_time;
#[cfg(not(loom))]
pub use transport::reclaim_pending;

/// The `cuda-dl-sys` this crate is built on, for raw driver calls.
pub use cuda_dl_sys;
