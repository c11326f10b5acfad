//! Launching host functions: the raw call, copied bytes, and closures, run once or (through
//! [`LaunchOptions`]' methods) with options or repeatable. Each builds one record and hands it to
//! the host-function transport.

use std::ffi::c_void;

use cuda_dl_sys::types::CUhostFn;

use crate::launch_error::LaunchError;
use crate::reaper::owned_record::OwnedRecord;
use crate::record::payload::{ClosurePayload, RawPayload};
use crate::support::error::Error;
use crate::support::raw_stream::AsRawStream;
use crate::transport::host_function::{RepeatableClosure, Runs, enqueue};
use crate::transport::options::LaunchOptions;

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
/// A [`LaunchError`] that hands `owners` back (earlier work on the stream may still use them: the
/// caller decides when to drop them): [`Error::NullFunction`] for a null `f`;
/// [`Error::CaptureActive`] if `stream` is capturing a graph; [`Error::InsideHostFunction`] if
/// called from a host function; [`Error::Cuda`] if the driver cannot be loaded or refuses the
/// launch (`cuLaunchHostFunc` failed); [`Error::TooManyPendingLaunches`]; [`Error::ForkedChild`]
/// in a child process forked after the first launch. None of these keeps the owners: the driver
/// never had them. (`?` into an [`Error`] drops them at once, or through the cleanup queue inside
/// a host function.)
///
/// # Examples
/// ```
/// use std::ffi::c_void;
/// use std::sync::atomic::{AtomicU32, Ordering};
/// use std::sync::Arc;
/// use cuda_host_launch::{launch_host_function, Device, PrimaryContext, Stream};
///
/// unsafe extern "C" fn bump(data: *mut c_void) {
///     // SAFETY: `data` points into the Arc kept alive by the owners below.
///     unsafe { &*data.cast::<AtomicU32>() }.fetch_add(1, Ordering::Relaxed);
/// }
///
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// let counter = Arc::new(AtomicU32::new(0));
/// let data = Arc::as_ptr(&counter).cast_mut().cast::<c_void>();
/// // SAFETY: `bump` only touches the AtomicU32, which the owner (a clone of the Arc) keeps alive.
/// unsafe { launch_host_function(&stream, Some(bump), data, counter.clone())? };
/// # Ok(()) }
/// ```
pub unsafe fn launch_host_function<S, O>(
    stream: S,
    f: CUhostFn,
    user_data: *mut c_void,
    owners: O,
) -> Result<(), LaunchError<O>>
where
    S: AsRawStream,
    O: Send + 'static,
{
    // SAFETY: forwarded: the caller's contract is the same.
    unsafe { LaunchOptions::default().launch_host_function(stream, f, user_data, owners) }
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
/// As [`launch_host_function`], and [`Error::UserDataTooLarge`]. Nothing is handed back: `bytes`
/// stay the caller's, and the launch's copy of them, which nothing else ever saw, is freed.
///
/// # Examples
/// ```
/// use std::ffi::c_void;
/// use cuda_host_launch::{launch_host_function_with_bytes, Device, PrimaryContext, Stream};
///
/// #[repr(C)]
/// struct Progress {
///     step: u32,
///     of: u32,
/// }
///
/// unsafe extern "C" fn report(data: *mut c_void) {
///     // SAFETY: `data` points to the launch's own copy of a `Progress`, aligned to 16 bytes.
///     let progress = unsafe { &*data.cast::<Progress>() };
///     println!("step {} of {}", progress.step, progress.of);
/// }
///
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// let progress = Progress { step: 3, of: 10 };
/// // SAFETY: `Progress` has no padding, so its bytes are initialised.
/// let bytes = unsafe {
///     std::slice::from_raw_parts((&raw const progress).cast::<u8>(), size_of::<Progress>())
/// };
/// // SAFETY: `report` reads a `Progress` from the bytes it gets, and does not unwind.
/// unsafe { launch_host_function_with_bytes(&stream, Some(report), bytes)? };
/// # Ok(()) }
/// ```
pub unsafe fn launch_host_function_with_bytes<S: AsRawStream>(
    stream: S,
    f: CUhostFn,
    bytes: &[u8],
) -> Result<(), Error> {
    let f = f.ok_or(Error::NullFunction)?;
    let record =
        OwnedRecord::bytes(f, bytes).ok_or(Error::UserDataTooLarge { len: bytes.len() })?;
    // SAFETY: the caller's contract is this function's `# Safety`, which covers the payload's run.
    // A refused record holds only the copy, which is freed (released here, or queued inside a
    // host function).
    unsafe { enqueue(&stream, record, Runs::Once, &LaunchOptions::default()) }
        .map_err(|refusal| refusal.error)
}

/// Runs the closure `f` in stream order, on the driver's thread; its captures are its owners.
///
/// The closure lives inline in the launch record (one allocation). It is called once, through
/// `&mut`, so what it captures outlives the call and is dropped afterwards with the record, by the
/// cleanup queue, never on the driver's thread.
///
/// That is why the bound is `FnMut`, not `FnOnce` as for `std::thread::spawn`: an `FnOnce` drops
/// whatever it captures and does not give away as it returns, on the driver's thread, where a drop
/// that calls CUDA (a cudarc buffer's, say) may fail or deadlock. So `move || tx.send(value)` does
/// not compile here (E0507 or E0525: the closure moves `value` out); a closure that gives a
/// captured value away takes it out of an `Option` (the second example).
///
/// A panic inside `f` never unwinds into the driver: it is caught, reported through the panic
/// handler ([`set_panic_handler`](crate::set_panic_handler); by default one line on stderr) by the
/// thread that releases the record, and the stream continues.
///
/// The rules of [`launch_host_function`] apply: no CUDA calls inside `f`, one driver thread per
/// context, never run after a sticky error.
///
/// # Errors
/// As [`launch_host_function`]: the [`LaunchError`] hands `f` back, unrun.
///
/// # Examples
/// ```
/// use cuda_host_launch::{host_launch, Device, PrimaryContext, Stream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// let (tx, rx) = std::sync::mpsc::channel();
/// host_launch(&stream, move || {
///     let _ = tx.send(std::thread::current().id());
/// })?;
/// let driver_thread = rx.recv().expect("the host function ran");
/// # let _ = driver_thread; Ok(()) }
/// ```
///
/// Giving a captured value away: the closure takes it out of an `Option`, and the `Sender` it
/// captured is dropped later, off the driver's thread.
/// ```
/// use cuda_host_launch::{host_launch, Device, PrimaryContext, Stream};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// let (tx, rx) = std::sync::mpsc::channel();
/// let mut value = Some(vec![1u8, 2, 3]);
/// host_launch(&stream, move || {
///     if let Some(value) = value.take() {
///         let _ = tx.send(value);
///     }
/// })?;
/// assert_eq!(rx.recv().expect("the host function ran"), [1, 2, 3]);
/// # Ok(()) }
/// ```
pub fn host_launch<S, F>(stream: S, f: F) -> Result<(), LaunchError<F>>
where
    S: AsRawStream,
    F: FnMut() + Send + 'static,
{
    LaunchOptions::default().host_launch(stream, f)
}

impl LaunchOptions {
    /// [`launch_host_function`] with these options.
    ///
    /// # Safety
    /// As [`launch_host_function`].
    ///
    /// # Errors
    /// As [`launch_host_function`]; `DriverTooOld` if the options need a newer driver.
    ///
    /// # Examples
    /// Compiled, not run (the doc tests' fake driver reports CUDA 13.0; this needs 13.2):
    /// ```no_run
    /// use std::ffi::c_void;
    /// use cuda_host_launch::{HostTaskSyncMode, LaunchOptions, Device, PrimaryContext, Stream};
    ///
    /// unsafe extern "C" fn tick(_: *mut c_void) {}
    ///
    /// # fn main() -> Result<(), cuda_host_launch::Error> {
    /// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
    /// let context = PrimaryContext::retain(Device::get(0)?)?;
    /// let stream = Stream::new(&context)?;
    /// let spin = LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait);
    /// // SAFETY: `tick` ignores its argument and does not unwind.
    /// unsafe { spin.launch_host_function(&stream, Some(tick), std::ptr::null_mut(), ())? };
    /// # Ok(()) }
    /// ```
    pub unsafe fn launch_host_function<S, O>(
        &self,
        stream: S,
        f: CUhostFn,
        user_data: *mut c_void,
        owners: O,
    ) -> Result<(), LaunchError<O>>
    where
        S: AsRawStream,
        O: Send + 'static,
    {
        let record = OwnedRecord::new(raw_payload(f, user_data, owners)?);
        // SAFETY: the caller's contract is this function's `# Safety`, which covers the payload's
        // run.
        unsafe { enqueue(&stream, record, Runs::Once, self) }.map_err(|refusal| {
            // SAFETY: the record was made just above with a `RawPayload<O>`.
            unsafe { LaunchError::unpack(refusal, |p: RawPayload<O>| Some(p.owners)) }
        })
    }

    /// Like [`launch_host_function`], but `f` may run many times: on a stream whose capture is
    /// active (also a stream joined into a capture through an event), the launch is captured as a
    /// host node and `f` runs on every launch of every executable graph made from the captured
    /// graph. The owners are then tied to that graph through a CUDA user object and dropped, off
    /// the driver's thread, only once the graph and all its executable graphs are destroyed. On a
    /// stream that is not capturing it runs once, like [`launch_host_function`].
    ///
    /// # Safety
    /// - `f(user_data)` must be sound to call any number of times, from driver threads, possibly
    ///   concurrently (executable graphs of different contexts), and must not unwind;
    /// - whatever `user_data` points to must stay valid while the owners are alive.
    ///
    /// # Errors
    /// As [`launch_host_function`] (but never `CaptureActive`): the owners are handed back, also
    /// on a capturing stream after the graph's user object took them (a failed
    /// `cuGraphRetainUserObject`, or the launch refused after it: they are taken back out of it).
    pub unsafe fn launch_host_function_repeatable<S, O>(
        &self,
        stream: S,
        f: CUhostFn,
        user_data: *mut c_void,
        owners: O,
    ) -> Result<(), LaunchError<O>>
    where
        S: AsRawStream,
        O: Send + Sync + 'static,
    {
        let record = OwnedRecord::repeatable(raw_payload(f, user_data, owners)?);
        // SAFETY: the caller's contract covers any number of runs.
        unsafe { enqueue(&stream, record, Runs::Repeatable, self) }.map_err(|refusal| {
            // SAFETY: the record was made just above with a `RawPayload<O>`.
            unsafe { LaunchError::unpack(refusal, |p: RawPayload<O>| Some(p.owners)) }
        })
    }

    /// [`host_launch`] with these options.
    ///
    /// # Errors
    /// As [`host_launch`]; `DriverTooOld` if the options need a newer driver.
    ///
    /// # Examples
    /// Compiled, not run (the doc tests' fake driver reports CUDA 13.0; this needs 13.2):
    /// ```no_run
    /// use cuda_host_launch::{HostTaskSyncMode, LaunchOptions, Device, PrimaryContext, Stream};
    /// # fn main() -> Result<(), cuda_host_launch::Error> {
    /// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
    /// let context = PrimaryContext::retain(Device::get(0)?)?;
    /// let stream = Stream::new(&context)?;
    /// LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait)
    ///     .host_launch(&stream, || println!("in stream order"))?;
    /// # Ok(()) }
    /// ```
    pub fn host_launch<S, F>(&self, stream: S, f: F) -> Result<(), LaunchError<F>>
    where
        S: AsRawStream,
        F: FnMut() + Send + 'static,
    {
        let record = OwnedRecord::new(ClosurePayload { f, panic: None });
        // SAFETY: a closure record's run is safe (a `Send` closure, called once, panics caught).
        unsafe { enqueue(&stream, record, Runs::Once, self) }.map_err(|refusal| {
            // SAFETY: the record was made just above with a `ClosurePayload<F>`.
            unsafe { LaunchError::unpack(refusal, |p: ClosurePayload<F>| Some(p.f)) }
        })
    }

    /// Runs `f` in stream order like [`host_launch`], but `f` may run many times, so it also works
    /// on a capturing stream: there the launch becomes a host node of the captured graph, `f` runs
    /// on every launch of every executable graph made from it, and `f` (with its captures) is
    /// dropped, off the driver's thread, once the graph and all its executable graphs are
    /// destroyed. If another thread begins a capture of the stream while this call runs, after
    /// its look at the stream, the launch is captured as a run-once one: `f` runs on the first
    /// launch of the graph only and is released after that run (later launches find its ticket
    /// retired and touch nothing).
    ///
    /// A panic in `f` is caught on every run and reported; the graph goes on.
    ///
    /// # Errors
    /// As [`host_launch`] (never `CaptureActive`); on drivers older than 11.3 (no user objects) a
    /// launch on a capturing stream returns `DriverTooOld`. `f` is handed back, unrun, also on a
    /// capturing stream after the graph's user object took it (a failed
    /// `cuGraphRetainUserObject`, or the launch refused after it: it is taken back out of it).
    ///
    /// # Examples
    /// ```
    /// use std::sync::Arc;
    /// use std::sync::atomic::{AtomicUsize, Ordering};
    /// use cuda_host_launch::{LaunchOptions, Device, PrimaryContext, Stream};
    /// # fn main() -> Result<(), cuda_host_launch::Error> {
    /// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
    /// let context = PrimaryContext::retain(Device::get(0)?)?;
    /// let stream = Stream::new(&context)?;
    /// let replays = Arc::new(AtomicUsize::new(0));
    /// let counter = Arc::clone(&replays);
    /// // Captured, this runs on every replay of the graph; `counter` lives as long as the graph.
    /// LaunchOptions::default().host_launch_repeatable(&stream, move || {
    ///     counter.fetch_add(1, Ordering::Relaxed);
    /// })?;
    /// # Ok(()) }
    /// ```
    pub fn host_launch_repeatable<S, F>(&self, stream: S, f: F) -> Result<(), LaunchError<F>>
    where
        S: AsRawStream,
        F: Fn() + Send + Sync + 'static,
    {
        let record = OwnedRecord::repeatable(RepeatableClosure(f));
        // SAFETY: a repeatable closure may run any number of times, concurrently (`Fn + Sync`),
        // with panics caught.
        unsafe { enqueue(&stream, record, Runs::Repeatable, self) }.map_err(|refusal| {
            // SAFETY: the record was made just above with a `RepeatableClosure<F>`.
            unsafe { LaunchError::unpack(refusal, |p: RepeatableClosure<F>| Some(p.0)) }
        })
    }
}

/// The payload of a raw launch or node; for a null `f`, [`Error::NullFunction`] with the owners
/// handed back.
pub(crate) fn raw_payload<O: Send + 'static>(
    f: CUhostFn,
    user_data: *mut c_void,
    owners: O,
) -> Result<RawPayload<O>, LaunchError<O>> {
    let Some(f) = f else {
        return Err(LaunchError::new(Error::NullFunction, Some(owners)));
    };
    Ok(RawPayload {
        f,
        user_data,
        owners,
    })
}
