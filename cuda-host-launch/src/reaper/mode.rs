//! Who releases the records of the cleanup queue: the reaper thread, or the launching threads
//! (manual mode), as the crate's [`Config`](crate::Config) says.

use std::sync::Mutex;

use crate::support::config::{CleanupMode, config};
use crate::support::error::Error;

/// Taken to start the reaper.
pub(crate) static REAPER_START: Mutex<()> = Mutex::new(());

/// The cleanup mode in force.
///
/// # Errors
/// [`Error::InvalidEnvironment`] if [`CLEANUP_MODE_ENV`](crate::CLEANUP_MODE_ENV) (or another
/// override) holds a value that is not understood.
#[inline]
pub(crate) fn cleanup_mode() -> Result<CleanupMode, Error> {
    Ok(config()?.cleanup())
}
