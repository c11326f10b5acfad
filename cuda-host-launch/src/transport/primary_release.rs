//! Letting go of a retain of a device's primary context (and finding its reset). The last release destroys the context,
//! and the driver then never runs the host functions pending in it (after a sticky error), nor
//! completes its events: [`reclaim_if_destroyed`] releases what was waiting for them. Both
//! holders of a retain use it: a [`PrimaryContext`](crate::PrimaryContext) and an event pool.

use cuda_sys::ChosenFunction;
use cuda_sys::types::{CUcontext, CUdevice, CUresult};

/// A device-only primary-context call (`fn(CUdevice) -> CUresult`).
pub(crate) type PrimaryCall = unsafe extern "C" fn(CUdevice) -> CUresult;

/// `cuDevicePrimaryCtxRelease`, or on drivers before 11.0 (which lack the table's `_v2` ABI) its
/// 7.0 variant, which has the same signature: the newest the driver has.
pub(crate) fn release_function(
    driver: &cuda_sys::Driver,
) -> Result<ChosenFunction<PrimaryCall>, cuda_sys::Error> {
    driver.newest_variant(cuda_sys::functions::cuDevicePrimaryCtxRelease)
}

/// `cuDevicePrimaryCtxReset`, with the same fallback as [`release_function`]; its checked call's
/// error names the variant chosen.
pub(crate) fn reset_function(
    driver: &cuda_sys::Driver,
) -> Result<ChosenFunction<PrimaryCall>, cuda_sys::Error> {
    driver.newest_variant(cuda_sys::functions::cuDevicePrimaryCtxReset)
}

/// Releases one retain of `device`'s primary context; `true` if the driver took it.
///
/// # Safety
/// The caller holds a retain of `device`'s primary context, which this gives up.
pub(crate) unsafe fn release(driver: &cuda_sys::Driver, device: CUdevice) -> bool {
    let Ok(release) = release_function(driver) else {
        return false;
    };
    // SAFETY: the caller's retain.
    unsafe { release.call((device,)) }.is_ok()
}

/// After a [`release`] that the driver took, with no lock of this crate held: if it was the last
/// retain, `context` (the primary context's handle) is destroyed, and work pending in it will never
/// run or complete: reclaim it, so that its owners are dropped.
pub(crate) fn reclaim_if_destroyed(
    driver: &cuda_sys::Driver,
    device: CUdevice,
    context: CUcontext,
) {
    let (mut flags, mut active) = (0, 0);
    // SAFETY: a valid device handle and out-pointers.
    let state = unsafe { driver.cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) };
    if state.is_ok() && active == 0 {
        // SAFETY: the context is inactive (destroyed by the last release): the driver will not run
        // its host functions any more.
        unsafe { super::reclaim(context) };
    }
}
