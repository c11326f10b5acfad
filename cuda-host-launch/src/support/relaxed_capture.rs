//! Relaxed stream-capture interaction for this crate's own threads.
//!
//! While any thread captures a stream in `CU_STREAM_CAPTURE_MODE_GLOBAL` (the default of most
//! frameworks), a "potentially unsafe" driver call (freeing or allocating memory, querying or
//! synchronizing an event, a stream or a context) made by a thread whose own interaction mode is
//! the default fails with `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` **and invalidates that other
//! thread's capture**. The reaper runs owners' `Drop` (which may free device memory) and the
//! low-latency poller wakes users' wakers, at moments nobody chooses: so each puts itself in
//! `CU_STREAM_CAPTURE_MODE_RELAXED` (`cuThreadExchangeStreamCaptureMode`) before it runs any user
//! code. A thread of ours never captures, so relaxing it loses no check of its own.
//!
//! If that is impossible (a driver older than 10.1 has no interaction modes; the call failed), the
//! thread works as before, in the default mode: nothing else depends on it.

use cuda_dl_sys::types::CUstreamCaptureMode;

use crate::support::exit_gate;

/// Whether the calling thread is in relaxed mode yet, for a thread that calls it before each batch
/// (the reaper: the attempt is made again while it could not be made).
pub(crate) struct RelaxedCaptureMode {
    settled: bool,
}

impl RelaxedCaptureMode {
    /// Not relaxed yet.
    pub(crate) const fn pending() -> RelaxedCaptureMode {
        RelaxedCaptureMode { settled: false }
    }

    /// Puts the calling thread in relaxed mode once the driver is loaded (this never loads it:
    /// which driver a process uses is its own choice, made by its first driver call). After the
    /// first attempt, succeeded or not, a check of one flag.
    #[inline]
    pub(crate) fn enter_once_loaded(&mut self) {
        if !self.settled {
            self.settled = enter_relaxed_mode().is_some();
        }
    }
}

/// Puts the calling thread in relaxed capture-interaction mode. `None` if the driver is not
/// loaded yet, or the process is exiting (no driver call once the exit gate is closed: see
/// `exit_gate`); `Some(false)` if the driver cannot (too old, or the call failed): the thread then
/// stays in its mode (the default, for a thread of ours).
pub(crate) fn enter_relaxed_mode() -> Option<bool> {
    let driver = cuda_dl_sys::Driver::get()?;
    let _work = exit_gate::begin_driver_work()?;
    let mut mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a valid place for the mode, read and overwritten with the thread's previous mode.
    // The mode only affects the calling thread.
    Some(unsafe { driver.cuThreadExchangeStreamCaptureMode(&mut mode) }.is_ok())
}
