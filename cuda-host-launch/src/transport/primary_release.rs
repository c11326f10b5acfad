//! Letting go of a retain of a device's primary context (and finding its reset). The last release
//! destroys the context, and the driver then never runs the host functions pending in it (after a
//! sticky error), nor completes its events: `transport::reclaim_after_release` releases what was
//! waiting for them. Both holders of a retain use it: a [`PrimaryContext`](crate::PrimaryContext)
//! and an event pool.

use cuda_dl_sys::ChosenFunction;
use std::sync::Mutex;

use cuda_dl_sys::types::{CUdevice, CUresult};

use crate::support::sync::lock;

/// A device-only primary-context call (`fn(CUdevice) -> CUresult`).
pub(crate) type PrimaryCall = unsafe extern "C" fn(CUdevice) -> CUresult;

/// `cuDevicePrimaryCtxRelease`, or on drivers before 11.0 (which lack the table's `_v2` ABI) its
/// 7.0 variant, which has the same signature: the newest the driver has.
pub(crate) fn release_function(
    driver: &cuda_dl_sys::Driver,
) -> Result<ChosenFunction<PrimaryCall>, cuda_dl_sys::Error> {
    driver.newest_variant(cuda_dl_sys::functions::cuDevicePrimaryCtxRelease)
}

/// `cuDevicePrimaryCtxReset`, with the same fallback as [`release_function`]; its checked call's
/// error names the variant chosen.
pub(crate) fn reset_function(
    driver: &cuda_dl_sys::Driver,
) -> Result<ChosenFunction<PrimaryCall>, cuda_dl_sys::Error> {
    driver.newest_variant(cuda_dl_sys::functions::cuDevicePrimaryCtxReset)
}

/// Releases one retain of `device`'s primary context; `true` if the driver took it.
///
/// # Safety
/// The caller holds a retain of `device`'s primary context, which this gives up.
pub(crate) unsafe fn release(driver: &cuda_dl_sys::Driver, device: CUdevice) -> bool {
    let Ok(release) = release_function(driver) else {
        return false;
    };
    // SAFETY: the caller's retain.
    unsafe { release.call((device,)) }.is_ok()
}

/// The primary contexts this crate has retained: handle and device. A primary context keeps its
/// handle for the process's life, so a reclaim can ask for its device's state
/// (`support::context_key::Liveness::of_primary`), which holds whatever the driver answers for the
/// handle of an inactive primary context.
static PRIMARY: Mutex<Vec<(usize, CUdevice)>> = Mutex::new(Vec::new());

/// Remembers that `handle` is `device`'s primary context.
pub(crate) fn remember(handle: usize, device: CUdevice) {
    let mut known = lock(&PRIMARY);
    if !known.contains(&(handle, device)) {
        known.push((handle, device));
    }
}

/// The device whose primary context has the handle `handle`, if this crate retained it.
pub(crate) fn device_of(handle: usize) -> Option<CUdevice> {
    lock(&PRIMARY)
        .iter()
        .find(|(h, _)| *h == handle)
        .map(|(_, device)| *device)
}
