//! Capture-interaction modes: how a stream capture restricts "potentially unsafe" calls (calls
//! that are not stream-ordered and so cannot be captured: allocating and freeing memory, querying
//! or synchronizing events, streams and contexts) made while it runs, by its own thread and by
//! others.
//!
//! Each thread has an interaction mode, `CU_STREAM_CAPTURE_MODE_GLOBAL` until it calls
//! `cuThreadExchangeStreamCaptureMode`. A thread is prohibited from potentially unsafe calls when
//! - its mode is not `RELAXED` and it began a capture that is still running, not begun in
//!   `RELAXED` mode; or
//! - its mode is `GLOBAL` and another thread began a capture, in `GLOBAL` mode, that is still
//!   running.
//!
//! A prohibited call does nothing but return `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (900) and
//! invalidate the captures that prohibited it (their `cuStreamEndCapture` then returns 901 and no
//! graph). This is what the real driver does (measured on an H200 with `cuEventQuery`,
//! `cuStreamQuery` and `cuMemFree`: `/work/shared/CUDA-FACTS.md`); the real driver publishes no
//! list of the potentially unsafe calls, so [`POTENTIALLY_UNSAFE`] holds the ones measured and
//! their obvious kin.

use std::cell::Cell;

use cuda_dl_sys::types::CUstreamCaptureMode;

use crate::errors::{CAPTURE_UNSUPPORTED, INVALID_VALUE, Res, ensure};
use crate::state::{lock, thread_number};

const GLOBAL: u32 = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL.0;
const RELAXED: u32 = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED.0;

thread_local! {
    /// The calling thread's interaction mode (`GLOBAL`, the default, until it exchanges it).
    static MODE: Cell<u32> = const { Cell::new(GLOBAL) };
}

/// Base names of the calls a capture may prohibit.
const POTENTIALLY_UNSAFE: &[&str] = &[
    "cuMemAlloc",
    "cuMemFree",
    "cuMemHostAlloc",
    "cuMemAllocHost",
    "cuMemFreeHost",
    "cuEventQuery",
    "cuEventSynchronize",
    "cuStreamQuery",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
];

/// Whether the call `base` may go ahead on the calling thread; if a running capture prohibits it,
/// invalidates every capture that does and returns `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`.
pub(crate) fn check(base: &str) -> Res {
    if !POTENTIALLY_UNSAFE.contains(&base) {
        return Ok(());
    }
    let mode = MODE.with(Cell::get);
    if mode == RELAXED {
        return Ok(());
    }
    let me = thread_number();
    let mut st = lock();
    let mut prohibited = false;
    for capture in st.captures.values_mut() {
        let own = capture.thread == me && capture.mode.0 != RELAXED;
        let others = capture.thread != me && capture.mode.0 == GLOBAL && mode == GLOBAL;
        if own || others {
            capture.invalidated = true;
            prohibited = true;
        }
    }
    drop(st);
    if prohibited {
        crate::oracle::invalidated_by_this_thread();
    }
    ensure(!prohibited, CAPTURE_UNSUPPORTED)
}

export!("cuThreadExchangeStreamCaptureMode", cuThreadExchangeStreamCaptureMode => exchange(mode: *mut CUstreamCaptureMode));
unsafe fn exchange(mode: *mut CUstreamCaptureMode) -> Res {
    ensure(!mode.is_null(), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes a valid mode to read and overwrite.
    let wanted = unsafe { mode.read() };
    ensure(wanted.0 <= RELAXED, INVALID_VALUE)?;
    let previous = MODE.with(|m| m.replace(wanted.0));
    // SAFETY: as above.
    unsafe { mode.write(CUstreamCaptureMode(previous)) };
    Ok(())
}

/// The calling thread's interaction mode (for the control functions).
pub(crate) fn current() -> u32 {
    MODE.with(Cell::get)
}
