//! Whether a stream is capturing a graph, and which graph.

use std::ffi::c_void;
use std::ptr;

use cuda_sys::types::{
    CUgraph, CUresult, CUstream, CUstreamCaptureStatus, PFN_cuStreamGetCaptureInfo_v11030,
};

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
pub(crate) fn capture_of(driver: &cuda_sys::Driver, stream: CUstream) -> Result<Capture, Error> {
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
            driver.check(code, "cuStreamGetCaptureInfo")?;
        }
        Err(cuda_sys::Error::DriverTooOld { .. } | cuda_sys::Error::SymbolMissing { .. }) => {
            let is_capturing = driver.raw().cuStreamIsCapturing()?;
            // SAFETY: valid stream; `status` is a valid place to write.
            let code = unsafe { is_capturing(stream, &mut status) };
            driver.check(code, "cuStreamIsCapturing")?;
        }
        Err(e) => return Err(e.into()),
    }
    if status != CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Ok(Capture::None);
    }
    Ok(Capture::Active { id, graph })
}

/// The graph `stream` captures into, on drivers 11.3–12.2 where the table's (12.3) signature of
/// `cuStreamGetCaptureInfo` is not available: asks for the 11.3 variant directly.
pub(crate) fn capture_graph_legacy(
    driver: &cuda_sys::Driver,
    stream: CUstream,
) -> Result<CUgraph, Error> {
    // Below 11.3 the lookup would fall back to the 10.1 export, which has another signature.
    if driver.version().0 < 11030 {
        return Err(Error::Cuda(cuda_sys::Error::DriverTooOld {
            function: "cuStreamGetCaptureInfo (11.3 signature)",
            required: 11030,
            found: driver.version(),
        }));
    }
    let p: *mut c_void = driver
        .get_proc_address("cuStreamGetCaptureInfo", 11030, driver.default_stream())?
        .as_ptr();
    // SAFETY: the driver returned the address of `cuStreamGetCaptureInfo` at ABI 11030, whose C
    // signature is PFN_cuStreamGetCaptureInfo_v11030; an Option of a fn pointer has its layout.
    let info: PFN_cuStreamGetCaptureInfo_v11030 = unsafe { std::mem::transmute(p) };
    let Some(info) = info else {
        return Err(Error::Cuda(cuda_sys::Error::Driver(
            cuda_sys::DriverError::from_code(CUresult::CUDA_ERROR_NOT_FOUND),
        )));
    };
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut graph: CUgraph = ptr::null_mut();
    // SAFETY: valid stream; `status` and `graph` are valid places to write; the rest optional.
    let code = unsafe {
        info(
            stream,
            &mut status,
            ptr::null_mut(),
            &mut graph,
            ptr::null_mut(),
            ptr::null_mut(),
        )
    };
    driver.check(code, "cuStreamGetCaptureInfo (11.3)")?;
    Ok(graph)
}
