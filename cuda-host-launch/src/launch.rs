//! Launching host functions: the raw call, copied bytes, and closures. All three build one record and
//! go through [`enqueue`].

use std::ffi::c_void;
use std::ptr;

use cuda_sys::types::{CUhostFn, CUresult, CUstream, CUstreamCaptureStatus};

use crate::cleanup::{self, CleanupMode};
use crate::error::Error;
use crate::raw_stream::AsRawStream;
use crate::record::{ClosurePayload, OwnedRecord, RawPayload, new_bytes_record, new_record, trampoline};

/// Enqueues `f(user_data)` on `stream`, keeping `owners` alive until `f` has returned; the owners
/// are then dropped exactly once, by the cleanup queue, never on the driver's thread.
///
/// `f` runs on the driver's thread once all work enqueued on `stream` before this call has
/// completed; work enqueued on `stream` after this call waits until `f` returns. The call returns
/// once `f` is enqueued. For several owners, pass a tuple: `(buffer, event, guard)`.
///
/// Rules for host functions (the driver's, and so this crate's):
/// - **No CUDA calls inside `f`.** The driver may fail them (`CUDA_ERROR_NOT_PERMITTED`) or deadlock.
/// - **One driver thread runs every host function of a context**, across all its streams: a slow
///   `f` delays every other host function of the context. Device work is not delayed.
/// - **After a sticky context error** (a kernel trapped: error 719), the driver still accepts the
///   launch but never runs `f`; its owners are released only when the context is destroyed or
///   reset, or at process exit not at all.
/// - **`cuCtxDestroy` waits** for pending host functions and runs them first.
/// - `f` must not wait for anything that a thread launching work may hold (a lock, a GIL).
///
/// # Safety
/// - `f(user_data)` must be sound to call once, on another thread (the driver's), at any time until
///   the stream reaches it, and must not unwind;
/// - whatever `user_data` points to must stay valid until `f` returns: keep it alive in `owners`.
///
/// # Errors
/// [`Error::NullFunction`] for a null `f`; [`Error::CaptureActive`] if `stream` is capturing a
/// graph; [`Error::InsideHostFunction`] if called from a host function; [`Error::Cuda`] if the driver
/// cannot be loaded or refuses the launch. In every case `owners` has been dropped (on this thread,
/// or through the cleanup queue if this is a driver thread) before the error returns.
///
/// # Examples
/// ```no_run
/// use std::ffi::c_void;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use cuda_host_launch::{launch_host_function, RawStream};
///
/// unsafe extern "C" fn bump(data: *mut c_void) {
///     // SAFETY: `data` points into the Arc kept alive by the owners below.
///     unsafe { &*data.cast::<AtomicU32>() }.fetch_add(1, Ordering::Relaxed);
/// }
///
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// let counter = Arc::new(AtomicU32::new(0));
/// let data = Arc::as_ptr(&counter).cast_mut().cast::<c_void>();
/// // SAFETY: `bump` only touches the AtomicU32, which the owner (a clone of the Arc) keeps alive.
/// unsafe { launch_host_function(RawStream::LEGACY, Some(bump), data, counter.clone())? };
/// # Ok(()) }
/// ```
pub unsafe fn launch_host_function<S, O>(
    stream: S,
    f: CUhostFn,
    user_data: *mut c_void,
    owners: O,
) -> Result<(), Error>
where
    S: AsRawStream,
    O: Send + 'static,
{
    let Some(f) = f else {
        cleanup::defer_drop(owners);
        return Err(Error::NullFunction);
    };
    let record = new_record(RawPayload { f, user_data, owners });
    // SAFETY: the caller's contract is this function's `# Safety`, which covers the payload's run.
    unsafe { enqueue(stream.as_raw_stream(), record) }
}

/// Enqueues `f` with a private copy of `bytes` as its user data: `f` gets a pointer to the copy
/// (aligned to 16 bytes, like `malloc`), which lives until `f` has returned. One allocation.
///
/// Changing or freeing the caller's buffer after this call does not affect what `f` sees.
///
/// # Safety
/// `f` must be sound to call once, on the driver's thread, with a pointer to `bytes.len()` bytes
/// equal to `bytes`, and must not unwind. The rules of [`launch_host_function`] apply.
///
/// # Errors
/// As [`launch_host_function`], and [`Error::UserDataTooLarge`].
pub unsafe fn launch_host_function_with_bytes<S: AsRawStream>(
    stream: S,
    f: CUhostFn,
    bytes: &[u8],
) -> Result<(), Error> {
    let f = f.ok_or(Error::NullFunction)?;
    let record =
        new_bytes_record(f, bytes).ok_or(Error::UserDataTooLarge { len: bytes.len() })?;
    // SAFETY: the caller's contract is this function's `# Safety`, which covers the payload's run.
    unsafe { enqueue(stream.as_raw_stream(), record) }
}

/// Runs the closure `f` in stream order, on the driver's thread; its captures are its owners.
///
/// The closure lives inline in the launch record (one allocation). It is called once, through
/// `&mut`, so what it captures outlives the call and is dropped afterwards with the record, by the
/// cleanup queue, never on the driver's thread. (An `FnOnce` would drop its captures at the end of
/// the call, on the driver's thread; that is why the bound is `FnMut`. A closure that must give a
/// captured value away can take it out of an `Option`.)
///
/// A panic inside `f` never unwinds into the driver: it is caught, reported through the panic
/// handler ([`set_panic_handler`](crate::set_panic_handler); by default one line on stderr) by the
/// thread that releases the record, and the stream continues.
///
/// The rules of [`launch_host_function`] apply: no CUDA calls inside `f`, one driver thread per
/// context, never run after a sticky error.
///
/// # Errors
/// As [`launch_host_function`]; `f` has been dropped when an error returns.
///
/// # Examples
/// ```no_run
/// use cuda_host_launch::{host_launch, RawStream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// let (tx, rx) = std::sync::mpsc::channel();
/// host_launch(RawStream::LEGACY, move || {
///     let _ = tx.send(std::thread::current().id());
/// })?;
/// let driver_thread = rx.recv().expect("the host function ran");
/// # let _ = driver_thread; Ok(()) }
/// ```
pub fn host_launch<S, F>(stream: S, f: F) -> Result<(), Error>
where
    S: AsRawStream,
    F: FnMut() + Send + 'static,
{
    let record = new_record(ClosurePayload { f, panic: None });
    // SAFETY: a closure record's run is safe (a `Send` closure, called once, panics caught).
    unsafe { enqueue(stream.as_raw_stream(), record) }
}

/// Enqueues a built record on `stream`. On any error the record is released before returning.
///
/// # Safety
/// The record's payload must be sound to run once on the driver's thread (each launch form's
/// contract).
unsafe fn enqueue(stream: CUstream, record: OwnedRecord) -> Result<(), Error> {
    if crate::in_host_function() {
        // `record` is dropped here, which defers its owners to the cleanup queue.
        return Err(Error::InsideHostFunction { operation: "launching a host function" });
    }
    let mode = cleanup::prepare()?;
    let driver = cuda_sys::driver()?;
    reject_capture(driver, stream)?;
    let launch = driver.raw().cuLaunchHostFunc()?;
    let user_data = record.as_user_data();
    let header = record.into_raw();
    // SAFETY: `trampoline` is the host function for records; `user_data` is a live record that the
    // driver now owns until it calls `trampoline` with it. The stream handle's validity is the
    // caller's `AsRawStream` guarantee.
    let code = unsafe { launch(stream, Some(trampoline), user_data) };
    if code != CUresult::CUDA_SUCCESS {
        // The driver did not take it: it is ours again, released here.
        // SAFETY: `header` came from `into_raw` just above and the driver refused it.
        drop(unsafe { OwnedRecord::from_raw(header) });
        return Err(cuda_sys::Error::from(driver.describe(code, Some("cuLaunchHostFunc"))).into());
    }
    if mode == CleanupMode::Manual {
        cleanup::drain();
    }
    Ok(())
}

/// Fails with [`Error::CaptureActive`] if `stream` is capturing (itself, or joined into another
/// stream's capture through an event).
fn reject_capture(driver: &cuda_sys::Driver, stream: CUstream) -> Result<(), Error> {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    match driver.raw().cuStreamGetCaptureInfo() {
        Ok(info) => {
            // SAFETY: the stream handle is valid (caller's guarantee); `status` and `id` are valid
            // places to write; the other outputs are optional and passed as null.
            let code = unsafe {
                info(
                    stream,
                    &mut status,
                    &mut id,
                    ptr::null_mut(),
                    ptr::null_mut(),
                    ptr::null_mut(),
                    ptr::null_mut(),
                )
            };
            driver.check(code, "cuStreamGetCaptureInfo")?;
        }
        // Drivers older than 12.3 lack this signature; cuStreamIsCapturing (10.0) says as much.
        Err(cuda_sys::Error::DriverTooOld { .. } | cuda_sys::Error::SymbolMissing { .. }) => {
            let is_capturing = driver.raw().cuStreamIsCapturing()?;
            // SAFETY: the stream handle is valid; `status` is a valid place to write.
            let code = unsafe { is_capturing(stream, &mut status) };
            driver.check(code, "cuStreamIsCapturing")?;
        }
        Err(e) => return Err(e.into()),
    }
    if status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE {
        return Err(Error::CaptureActive { stream: stream.addr(), capture_id: id });
    }
    Ok(())
}
