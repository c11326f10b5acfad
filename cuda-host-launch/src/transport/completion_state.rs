//! What a future of stream work shares with the transport that completes it: a state word, the
//! value, and the task's waker. A transport calls [`CompletionState::complete`] when the stream got
//! there, or [`CompletionState::fail`] when it never will (the context was lost).

use std::any::Any;
use std::cell::UnsafeCell;
use std::sync::atomic::{AtomicU8, AtomicU32, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use super::waker_slot::WakerSlot;
use crate::reaper::lane;
use crate::record::layout::PanicPayload;
use crate::support::error::Error;

const PENDING: u8 = 0;
const READY: u8 = 1;
const PANICKED: u8 = 2;
const LOST: u8 = 3;
const FAULTED: u8 = 4;

/// What a future and its record share.
pub(crate) struct CompletionState<T> {
    state: AtomicU8,
    /// The sticky error's code once `state` is FAULTED (written before it).
    fault: AtomicU32,
    /// Written once, before `state` becomes READY (or PANICKED); read once, by the future, after.
    value: UnsafeCell<Option<Result<T, PanicPayload>>>,
    waker: WakerSlot,
}

// SAFETY: `value` is written by one thread before the Release store of `state` and read by the
// future's thread after an Acquire load sees it; `T: Send` moves across. The waker slot is Sync.
unsafe impl<T: Send> Send for CompletionState<T> {}
// SAFETY: as above: no two threads touch `value` at once.
unsafe impl<T: Send> Sync for CompletionState<T> {}

impl<T> CompletionState<T> {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(CompletionState {
            state: AtomicU8::new(PENDING),
            fault: AtomicU32::new(0),
            value: UnsafeCell::new(None),
            waker: WakerSlot::new(),
        })
    }

    /// Completes with `value` and wakes the task. Called once (host function or poller). Returns
    /// the waker's panic, if it panicked: see [`WakerSlot::wake`].
    #[must_use = "a waker's panic must be reported and dropped off the driver's thread"]
    pub(crate) fn complete(&self, value: Result<T, PanicPayload>) -> Option<PanicPayload> {
        let state = if value.is_ok() { READY } else { PANICKED };
        // SAFETY: the one writer, before publishing with the Release exchange below. A future
        // resolved by a fault already reads no value: this one is dropped with the state.
        unsafe { *self.value.get() = Some(value) };
        if self
            .state
            .compare_exchange(PENDING, state, Ordering::AcqRel, Ordering::Acquire)
            .is_err()
        {
            return None;
        }
        self.waker.wake()
    }

    /// Resolves to [`Error::DeviceFault`] if still pending, and wakes the task: the stream's
    /// context has the sticky error `code`, so the work will never complete (the record, and what
    /// it holds, stay for the context's reclaim). Returns the waker's panic, as
    /// [`CompletionState::complete`].
    #[must_use = "a waker's panic must be reported and dropped"]
    pub(crate) fn fault(&self, code: u32) -> Option<PanicPayload> {
        // Before the state that publishes it (a resolved future never reads it again).
        self.fault.store(code, Ordering::Relaxed);
        self.end_if_pending(FAULTED)
    }

    /// Resolves to `ContextLost` if still pending, and wakes the task. Returns the waker's panic,
    /// as [`CompletionState::complete`].
    #[must_use = "a waker's panic must be reported and dropped"]
    pub(crate) fn fail(&self) -> Option<PanicPayload> {
        self.end_if_pending(LOST)
    }

    /// Moves a pending future to `state` (an error with no value) and wakes its task; nothing if
    /// it resolved already. Returns the waker's panic.
    fn end_if_pending(&self, state: u8) -> Option<PanicPayload> {
        if self
            .state
            .compare_exchange(PENDING, state, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            self.waker.wake()
        } else {
            None
        }
    }

    pub(crate) fn is_pending(&self) -> bool {
        self.state.load(Ordering::Acquire) == PENDING
    }

    pub(crate) fn poll_result(&self, cx: &mut Context<'_>) -> Poll<Result<T, Error>> {
        let mut state = self.state.load(Ordering::Acquire);
        if state == PENDING {
            self.waker.register(cx.waker());
            state = self.state.load(Ordering::Acquire);
        }
        match state {
            PENDING => Poll::Pending,
            LOST => Poll::Ready(Err(Error::ContextLost)),
            FAULTED => {
                let code = self.fault.load(Ordering::Relaxed);
                Poll::Ready(Err(device_fault(code)))
            }
            _ => {
                // SAFETY: READY/PANICKED were published after the one write; only the future reads
                // (and takes) the value, once.
                match unsafe { (*self.value.get()).take() } {
                    Some(Ok(value)) => Poll::Ready(Ok(value)),
                    Some(Err(panic)) => Poll::Ready(Err(Error::HostFunctionPanicked {
                        message: panic_message(&*panic),
                    })),
                    None => Poll::Ready(Err(Error::PolledAfterCompletion)),
                }
            }
        }
    }
}

fn panic_message(payload: &(dyn Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_string())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "<non-string panic payload>".to_string())
}

/// The error of a future whose context failed with `code`.
pub(crate) fn device_fault(code: u32) -> Error {
    Error::DeviceFault {
        code,
        name: cuda_dl_sys::DriverError::from_code(cuda_dl_sys::types::CUresult(code)).name(),
    }
}

/// A future that a fault watch holds, whatever its value type: a weak reference to its state, so
/// that the watch keeps nothing alive.
pub(crate) trait Faultable: Send {
    /// See [`CompletionState::fault`] (nothing if the future is gone).
    fn fault(&self, code: u32) -> Option<PanicPayload>;
    /// Whether it still waits (not resolved, not dropped).
    fn waits(&self) -> bool;
}

/// The [`Faultable`] of a `CompletionState<T>`.
pub(crate) struct WatchedFuture<T>(pub(crate) Weak<CompletionState<T>>);

impl<T: Send + 'static> WatchedFuture<T> {
    /// Runs `f` on the state if it still lives. If the future and its record went meanwhile, the
    /// reference taken here is the last: the state (its value and waker, user code) is dropped on
    /// the lane, never on the watching thread.
    fn with<R>(&self, f: impl FnOnce(&CompletionState<T>) -> R) -> Option<R> {
        let state = self.0.upgrade()?;
        let result = f(&state);
        if let Some(last) = Arc::into_inner(state) {
            lane::drop_there(last);
        }
        Some(result)
    }
}

impl<T: Send + 'static> Faultable for WatchedFuture<T> {
    fn fault(&self, code: u32) -> Option<PanicPayload> {
        self.with(|state| state.fault(code)).flatten()
    }

    fn waits(&self) -> bool {
        self.with(CompletionState::is_pending).unwrap_or(false)
    }
}
