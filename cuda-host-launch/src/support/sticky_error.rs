//! A context's sticky error: the device faults after which the context runs no more work (a
//! trapped kernel, an illegal address), so that a watcher can fail the futures that wait on it
//! instead of letting them wait until the user resets the context.
//!
//! Which codes are sticky: those `cuda.h` documents as leaving "the process in an inconsistent
//! state" where "any further CUDA work will return the same error", a context that "cannot be used
//! anymore" (a device-side assert), or a process that "must be terminated and relaunched"
//! ([`is_sticky`]; a test reads the descriptions of the pinned header). Other errors
//! of a query (a context destroyed, a handle refused, a capture) say something else, and are left
//! to the mechanisms that handle them (the reclaim, the capture rules).
//!
//! How it is seen without waiting: after a trap, a query in the context answers the error as
//! soon as the driver has noticed it, for every query alike (`cuStreamQuery` of an idle stream,
//! `cuEventQuery` of a never-recorded event, ...), while `cuCtxGetId` and
//! `cuDevicePrimaryCtxGetState` go on answering (`tools/probes/sticky_error_probes.cu`, run on an
//! H100). [`probe`] asks the context's legacy stream.

use cuda_dl_sys::types::CUresult;

use super::context_key::ContextKey;
use super::pushed_context::with_pushed;

/// Whether `code` is a sticky error: the context that answered it runs no more work.
pub(crate) fn is_sticky(code: CUresult) -> bool {
    matches!(
        code,
        CUresult::CUDA_ERROR_CONTAINED
            | CUresult::CUDA_ERROR_ILLEGAL_ADDRESS
            | CUresult::CUDA_ERROR_LAUNCH_TIMEOUT
            | CUresult::CUDA_ERROR_ASSERT
            | CUresult::CUDA_ERROR_HARDWARE_STACK_ERROR
            | CUresult::CUDA_ERROR_ILLEGAL_INSTRUCTION
            | CUresult::CUDA_ERROR_MISALIGNED_ADDRESS
            | CUresult::CUDA_ERROR_INVALID_ADDRESS_SPACE
            | CUresult::CUDA_ERROR_INVALID_PC
            | CUresult::CUDA_ERROR_LAUNCH_FAILED
            | CUresult::CUDA_ERROR_TENSOR_MEMORY_LEAK
            | CUresult::CUDA_ERROR_MPS_CLIENT_TERMINATED
            | CUresult::CUDA_ERROR_EXTERNAL_DEVICE
    )
}

/// The sticky error of the context `key`, if it has one that has surfaced: pushes the context,
/// queries its legacy stream (a busy stream answers "not ready", which is no error), pops it. A
/// context the handle no longer names (another id: made again) answers nothing, nor does a look
/// that fails for another reason.
///
/// # Safety
/// `key.handle` must be a handle the driver keeps valid for the process's life whatever happens
/// to its context: a primary context's. (A `cuCtxCreate` context's handle may dangle once the
/// context is destroyed.)
pub(crate) unsafe fn probe(driver: &cuda_dl_sys::Driver, key: ContextKey) -> Option<u32> {
    let get_id = driver.raw().cuCtxGetId().ok()?;
    let mut id = 0;
    // SAFETY: a primary context's handle (the caller's promise); a valid out-pointer.
    if unsafe { get_id(key.raw(), &mut id) } != CUresult::CUDA_SUCCESS || id != key.id {
        return None;
    }
    let query = || {
        let query = driver.raw().cuStreamQuery();
        // SAFETY: the legacy stream's handle, in the context pushed for this call.
        query.map(|query| unsafe { query(cuda_dl_sys::CU_STREAM_LEGACY) })
    };
    // SAFETY: as above: the handle stays the driver's. A failed pop is tried once more; its error
    // says nothing of the context's.
    let (code, _pop) = unsafe { with_pushed(driver, key.raw(), query) }.ok()?;
    match code {
        Ok(code) if is_sticky(code) => Some(code.0),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::is_sticky;
    use cuda_dl_sys::types::CUresult;

    /// The sticky codes are exactly those whose description in the pinned `cuda.h` says the
    /// context or the process can do no more work (before: the device-side assert, the MPS
    /// client's end and the external device's error were missing, so the watcher queried such a
    /// stream for ever instead of failing its futures).
    #[test]
    fn the_sticky_codes_are_those_the_header_says_end_the_context() {
        let says_so = |description: &str| {
            [
                "inconsistent state",
                "cannot be used anymore",
                "must be terminated and relaunched",
            ]
            .iter()
            .any(|words| description.contains(words))
        };
        let mut sticky = 0;
        for code in 0..=1000 {
            let description = cuda_dl_sys::DriverError::from_code(CUresult(code)).description();
            assert_eq!(
                is_sticky(CUresult(code)),
                says_so(description),
                "{code}: {description}"
            );
            sticky += usize::from(is_sticky(CUresult(code)));
        }
        assert_eq!(sticky, 13);
    }
}
