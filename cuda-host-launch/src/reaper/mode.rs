//! Who releases the records of the cleanup queue: the reaper thread, or the launching threads
//! (manual mode).

use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, Ordering};

use super::release::QUEUE;
use crate::support::error::Error;
use crate::support::sync::lock;

/// The environment variable that picks the cleanup mode before the first launch: `reaper` (the
/// default) or `manual`.
pub const CLEANUP_MODE_ENV: &str = "CUDA_HOST_LAUNCH_CLEANUP";

/// Who drops the owners of host functions that have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupMode {
    /// A background thread, started on first use, drops them as soon as they are queued.
    Reaper,
    /// No thread: they are dropped at the next launch, [`drain`](crate::drain) or [`flush`](crate::flush), on that caller's
    /// thread.
    ///
    /// That thread's stream-capture interaction mode applies to the owners' `Drop`: in the
    /// default (`CU_STREAM_CAPTURE_MODE_GLOBAL`), while any other thread captures a stream in
    /// global mode (or the thread itself captures), a `Drop` that frees or allocates memory, or
    /// queries or synchronizes an event, a stream or a context, fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates that capture. So drain (and launch)
    /// from a thread that no such capture affects, or that is in relaxed mode
    /// (`cuThreadExchangeStreamCaptureMode`), or release such owners in reaper mode, whose thread
    /// is relaxed.
    Manual,
}

/// Taken to start the reaper, and to choose the mode (manual mode only before it started).
pub(crate) static REAPER_START: Mutex<()> = Mutex::new(());

const MODE_UNSET: u8 = 0;
const MODE_REAPER: u8 = 1;
const MODE_MANUAL: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(MODE_UNSET);

/// The current cleanup mode (from [`CLEANUP_MODE_ENV`] until [`set_cleanup_mode`] is called).
///
/// # Errors
/// [`Error::InvalidEnvironment`] if the variable holds neither `reaper` nor `manual`.
pub fn cleanup_mode() -> Result<CleanupMode, Error> {
    match MODE.load(Ordering::Acquire) {
        MODE_REAPER => Ok(CleanupMode::Reaper),
        MODE_MANUAL => Ok(CleanupMode::Manual),
        _ => {
            let mode = mode_from_env()?;
            let value = if mode == CleanupMode::Manual {
                MODE_MANUAL
            } else {
                MODE_REAPER
            };
            let _ = MODE.compare_exchange(MODE_UNSET, value, Ordering::AcqRel, Ordering::Acquire);
            cleanup_mode()
        }
    }
}

fn mode_from_env() -> Result<CleanupMode, Error> {
    match std::env::var(CLEANUP_MODE_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(CleanupMode::Reaper),
        Ok(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("reaper") => {
            Ok(CleanupMode::Reaper)
        }
        Ok(v) if v.trim().eq_ignore_ascii_case("manual") => Ok(CleanupMode::Manual),
        Ok(v) => Err(Error::InvalidEnvironment {
            variable: CLEANUP_MODE_ENV,
            value: v,
        }),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::InvalidEnvironment {
            variable: CLEANUP_MODE_ENV,
            value: v.to_string_lossy().into_owned(),
        }),
    }
}

/// Chooses the cleanup mode. `Manual` can be chosen only before the reaper has started (before the
/// first launch in reaper mode); `Reaper` can be chosen at any time.
///
/// # Errors
/// [`Error::ReaperAlreadyRunning`] when asking for `Manual` after the reaper started.
pub fn set_cleanup_mode(mode: CleanupMode) -> Result<(), Error> {
    let _guard = lock(&REAPER_START);
    match mode {
        CleanupMode::Manual if QUEUE.has_reaper() => Err(Error::ReaperAlreadyRunning),
        CleanupMode::Manual => {
            MODE.store(MODE_MANUAL, Ordering::Release);
            Ok(())
        }
        CleanupMode::Reaper => {
            MODE.store(MODE_REAPER, Ordering::Release);
            Ok(())
        }
    }
}
