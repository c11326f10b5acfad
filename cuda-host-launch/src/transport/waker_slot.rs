//! A waker slot that can be woken from a driver thread without dropping the waker there.
//!
//! The usual `AtomicWaker` takes the waker out to wake it, which drops it on the waking thread. A
//! waker's `Drop` may run arbitrary task code, so a driver thread must not drop one: here the
//! waker stays in the slot, is woken with `wake_by_ref`, and is dropped with the slot, by whoever
//! drops the last reference to the shared state (the task, or the cleanup queue's thread).
//!
//! The protocol is `AtomicWaker`'s (futures-rs): `register` takes the REGISTERING bit, stores the
//! waker, then gives the bit back; a `wake` that finds the slot being registered only sets WAKING,
//! and the registering thread, seeing it, wakes the new waker itself.
//!
//! A waker is user code and may panic. [`WakerSlot::wake`] runs on a driver thread (inside the
//! `extern "C"` trampoline, where an unwind would abort the process) or on the watcher:
//! it catches the panic and hands it back, for the caller to carry to a thread that reports it.
//! [`WakerSlot::register`] runs on the polling task's thread, where the waker's `clone` and the
//! old waker's `drop` run too: a panic there is caught until the slot is consistent again (not
//! left registering, so later wake-ups still come), then goes on up to the poll.

use std::cell::UnsafeCell;
use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::Waker;

use crate::record::layout::PanicPayload;

const WAITING: usize = 0;
const REGISTERING: usize = 0b01;
const WAKING: usize = 0b10;

/// See the module documentation.
pub(crate) struct WakerSlot {
    state: AtomicUsize,
    waker: UnsafeCell<Option<Waker>>,
}

// SAFETY: the waker cell is only touched by the thread that owns the REGISTERING or WAKING bit (the
// state machine below gives it to one thread at a time); `Waker` is `Send + Sync`.
unsafe impl Send for WakerSlot {}
// SAFETY: as above.
unsafe impl Sync for WakerSlot {}

impl WakerSlot {
    pub(crate) const fn new() -> Self {
        WakerSlot {
            state: AtomicUsize::new(WAITING),
            waker: UnsafeCell::new(None),
        }
    }

    /// Stores `waker` (a clone, unless the stored one would wake the same task) to be woken.
    /// Called by the task polling the future: one thread at a time.
    pub(crate) fn register(&self, waker: &Waker) {
        match self.state.compare_exchange(
            WAITING,
            REGISTERING,
            Ordering::Acquire,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                // Cloning the new waker and dropping the old one run the wakers' code, which may
                // panic: caught, so that the bit is always given back below (a slot left
                // REGISTERING would never be woken again), then passed on to the poll.
                let stored = catch_unwind(AssertUnwindSafe(|| {
                    // SAFETY: we hold the REGISTERING bit: no one else touches the cell.
                    let slot = unsafe { &mut *self.waker.get() };
                    if !slot.as_ref().is_some_and(|old| old.will_wake(waker)) {
                        // A panicking clone leaves the old waker in place.
                        let old = slot.replace(waker.clone());
                        // Dropped here, on the polling thread; a panic leaves the new one stored.
                        drop(old);
                    }
                }));
                let woken = if self
                    .state
                    .compare_exchange(REGISTERING, WAITING, Ordering::AcqRel, Ordering::Acquire)
                    .is_err()
                {
                    // A wake came while we registered (state is REGISTERING | WAKING): it left the
                    // waking to us.
                    // SAFETY: we still hold the REGISTERING bit.
                    let woken = match unsafe { &*self.waker.get() } {
                        Some(w) => catch_unwind(AssertUnwindSafe(|| w.wake_by_ref())),
                        None => Ok(()),
                    };
                    // Given back before a panic of the waker goes on up to the poll.
                    self.state.swap(WAITING, Ordering::AcqRel);
                    woken
                } else {
                    Ok(())
                };
                if let Err(panic) = stored.and(woken) {
                    resume_unwind(panic);
                }
            }
            Err(WAKING) => {
                // A wake is in progress with the old waker: make sure this task polls again.
                waker.wake_by_ref();
            }
            Err(_) => {
                // Another registration is in progress: the future is being polled concurrently,
                // which `Future` rules out; nothing to do.
            }
        }
    }

    /// Wakes the stored waker, if any, without taking or dropping it. Safe on a driver thread: a
    /// panic of the waker is caught and returned (not dropped: its payload is user data), for the
    /// caller to hand to a thread that reports and drops it.
    #[must_use = "a waker's panic must be reported and dropped off the driver's thread"]
    pub(crate) fn wake(&self) -> Option<PanicPayload> {
        let mut panicked = None;
        if self.state.fetch_or(WAKING, Ordering::AcqRel) == WAITING {
            // SAFETY: we own the WAKING bit and no registration is in progress.
            if let Some(w) = unsafe { &*self.waker.get() } {
                panicked = catch_unwind(AssertUnwindSafe(|| w.wake_by_ref())).err();
            }
            self.state.fetch_and(!WAKING, Ordering::Release);
        }
        // Otherwise a registration is in progress and will wake its new waker (see `register`),
        // or another wake is in progress.
        panicked
    }
}
