//! The cleanup queue and the reaper: where the owners of host functions that have run are dropped.
//!
//! - **Queue** (`queue.rs`). Process-wide, lock-free, intrusive (a stack of launch records): the
//!   trampoline pushes the record it just ran, from the driver's thread, without allocating,
//!   locking or calling CUDA.
//! - **Reaper** (`thread.rs`; the default, [`CleanupMode::Reaper`](crate::CleanupMode::Reaper)).
//!   One thread, started on first use, parked while the queue is empty. The push that finds the
//!   queue empty wakes it (`Thread::unpark`, a futex wake on Linux; no lock a launcher could
//!   hold); pushes onto a non-empty queue do not, so a burst of host functions costs one wake-up
//!   per batch.
//! - **Manual** (`mode.rs`, [`CleanupMode::Manual`](crate::CleanupMode::Manual)): no thread. The
//!   queue is drained at each launch and by [`drain`](crate::drain) and [`flush`](crate::flush).
//! - **Releasing** (`release.rs`) drops a record's owners inside `catch_unwind`: a panicking `Drop`
//!   is reported through the panic handler and the next record is released as usual. A record
//!   that never reached the driver is released by its `OwnedRecord` (`owned_record.rs`).
//!
//! The reaper puts itself in relaxed stream-capture interaction mode before it runs any owner's
//! `Drop`, so that a `Drop` that frees device memory never breaks another thread's graph capture
//! (see `support::relaxed_capture`).
//!
//! **At process exit** the reaper stops before the driver is torn down: the release in progress
//! finishes (the exit waits for it, at most a second) and no other starts (see
//! `support::exit_gate`). Records still queued, and those of host functions that have not run yet
//! (the driver runs or discards them as the process and its contexts go down), are not released:
//! their owners' `Drop` does not run, as for any value alive at `exit`. Call
//! [`flush`](crate::flush) before exiting where that matters.
//!
//! **In a child forked** after the first launch, launches, completions and [`flush`](crate::flush)
//! fail with [`Error::ForkedChild`](crate::Error::ForkedChild) and [`drain`](crate::drain)
//! releases nothing (see `support::forked_child`).

#[cfg(not(loom))]
pub(crate) mod batches;
#[cfg(not(loom))]
pub(crate) mod defer_drop;
#[cfg(not(loom))]
pub(crate) mod lane;
#[cfg(not(loom))]
pub(crate) mod mode;
#[cfg(not(loom))]
pub(crate) mod owned_record;
pub(crate) mod queue;
#[cfg(not(loom))]
pub(crate) mod release;
#[cfg(not(loom))]
pub(crate) mod thread;
