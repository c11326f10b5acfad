//! What every enqueue checks before it hands anything anywhere, and what it does once the work is
//! handed over (see the module above for the order).

use crate::reaper::{self, release};
use crate::support::config::CleanupMode;
use crate::support::error::Error;
use crate::support::host_thread::refuse_inside_host_function;

/// An enqueue that passed the checks every transport makes first.
pub(crate) struct Admitted {
    /// Who drains the cleanup queue.
    pub(crate) mode: CleanupMode,
    /// The driver, loaded.
    pub(crate) driver: &'static cuda_dl_sys::Driver,
}

/// The checks every enqueue makes before anything is handed anywhere, so that an error here gives
/// everything back: not on a driver thread inside a host function (`operation` names the call in
/// the error), not in a forked child, the driver loaded and the exit handler armed, and whoever
/// drains the cleanup queue ready (in reaper mode the reaper started: a record may reach the queue,
/// and the watcher may send a waker's panic to the lane, from the hand-over on).
///
/// # Errors
/// [`Error::InsideHostFunction`], [`Error::ForkedChild`], the driver's loading error, an invalid
/// configuration, or [`Error::ThreadSpawn`] for the reaper.
#[inline]
pub(crate) fn admit(operation: &'static str) -> Result<Admitted, Error> {
    refuse_inside_host_function(operation)?;
    let mode = reaper::thread::prepare()?;
    let driver = cuda_dl_sys::driver()?;
    Ok(Admitted { mode, driver })
}

impl Admitted {
    /// After the hand-over: in [`CleanupMode::Manual`] the launching thread releases what the
    /// queue holds (there is no reaper).
    #[inline]
    pub(crate) fn finish(self) {
        if self.mode == CleanupMode::Manual {
            release::drain();
        }
    }
}
