//! Whether a stream is capturing a graph, and which graph.

use std::ptr;

use cuda_dl_sys::types::{CUgraph, CUresult, CUstream, CUstreamCaptureStatus};

use crate::support::error::Error;

/// A stream's capture state.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Capture {
    /// Not capturing (or its capture is invalidated: the driver refuses launches on it itself).
    None,
    /// Capturing into `graph` (null if the driver could not say, on drivers older than 11.3).
    Active { id: u64, graph: CUgraph },
}

/// The error of a run-once operation refused on `stream`, which capture `capture_id` is capturing.
pub(crate) fn capture_active(stream: CUstream, capture_id: u64) -> Error {
    Error::CaptureActive {
        stream: stream.addr(),
        capture_id,
    }
}

/// The capture state of `stream`: `cuStreamGetCaptureInfo` (12.3+), which also sees a stream joined
/// into another stream's capture through an event; on older drivers `cuStreamIsCapturing`.
pub(crate) fn capture_of(driver: &cuda_dl_sys::Driver, stream: CUstream) -> Result<Capture, Error> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    let mut graph: CUgraph = ptr::null_mut();
    match driver.raw().cuStreamGetCaptureInfo() {
        Ok(info) => {
            // SAFETY: the stream handle is valid (the caller's `AsRawStream` guarantee); `status`,
            // `id` and `graph` are valid places to write; the dependency outputs are optional.
            let code = unsafe {
                info(
                    stream,
                    &mut status,
                    &mut id,
                    &mut graph,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            };
            no_context(code, stream, "cuStreamGetCaptureInfo")?;
            driver.check(code, "cuStreamGetCaptureInfo")?;
        }
        Err(cuda_dl_sys::Error::DriverTooOld { .. } | cuda_dl_sys::Error::SymbolMissing { .. }) => {
            let is_capturing = driver.raw().cuStreamIsCapturing()?;
            // SAFETY: valid stream; `status` is a valid place to write.
            let code = unsafe { is_capturing(stream, &mut status) };
            no_context(code, stream, "cuStreamIsCapturing")?;
            driver.check(code, "cuStreamIsCapturing")?;
        }
        Err(e) => return Err(e.into()),
    }
    if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Ok(Capture::None);
    }
    Ok(Capture::Active { id, graph })
}

/// [`Error::NoCurrentContext`] for `CUDA_ERROR_INVALID_CONTEXT` from `function` on `stream`: the
/// first driver call of every launch, release and completion, so the error that says what to do.
fn no_context(code: CUresult, stream: CUstream, function: &'static str) -> Result<(), Error> {
    if code == CUresult::CUDA_ERROR_INVALID_CONTEXT {
        return Err(Error::NoCurrentContext {
            stream: stream.addr(),
            function,
        });
    }
    Ok(())
}

/// The second look of an enqueue that the driver cannot make atomic with its first (a flag write,
/// an event record): whether a capture another thread began since the first look may have taken
/// what was just enqueued on `stream`. `Some` with the error to return if so; an unknown state
/// (the query failed) counts as captured.
pub(crate) fn captured_since(driver: &cuda_dl_sys::Driver, stream: CUstream) -> Option<Error> {
    match capture_of(driver, stream) {
        Ok(Capture::None) => None,
        Ok(Capture::Active { id, .. }) => Some(capture_active(stream, id)),
        Err(e) => Some(e),
    }
}

/// The graph and id of the capture `stream` is in, on drivers 11.3–12.2 where the table's (12.3)
/// signature of `cuStreamGetCaptureInfo` is not available: the table's 11.3 variant,
/// `cuStreamGetCaptureInfo_v2` (gated: `DriverTooOld` below 11.3, where only the 10.1 signature
/// exists). `None` if it is capturing no more (another thread ended the capture since a look).
pub(crate) fn capture_graph_legacy(
    driver: &cuda_dl_sys::Driver,
    stream: CUstream,
) -> Result<Option<(CUgraph, u64)>, Error> {
    let info = driver.raw().cuStreamGetCaptureInfo_v2()?;
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    let mut graph: CUgraph = ptr::null_mut();
    // SAFETY: valid stream; `status`, `id` and `graph` are valid places to write; the rest
    // optional.
    let code = unsafe {
        info(
            stream,
            &mut status,
            &mut id,
            &mut graph,
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    driver.check(code, "cuStreamGetCaptureInfo_v2")?;
    Ok((status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE).then_some((graph, id)))
}

/// The id of the capture `stream` is in now, active or invalidated (its graph lives until the
/// capture is ended either way); `None` if it is in none, or if the look fails (then nobody can
/// tell). With the 12.3 query where the driver has it, else the 11.3 one (both give the id).
pub(crate) fn capture_id_now(driver: &cuda_dl_sys::Driver, stream: CUstream) -> Option<u64> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    let code = if let Ok(info) = driver.raw().cuStreamGetCaptureInfo() {
        // SAFETY: valid stream; `status` and `id` are valid places to write; the rest optional.
        unsafe {
            info(
                stream,
                &mut status,
                &mut id,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        }
    } else {
        let info = driver.raw().cuStreamGetCaptureInfo_v2().ok()?;
        // SAFETY: as above.
        unsafe {
            info(
                stream,
                &mut status,
                &mut id,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
        }
    };
    let in_one = matches!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
            | CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED
    );
    (code == CUresult::CUDA_SUCCESS && in_one).then_some(id)
}
