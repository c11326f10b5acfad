//! The errors of host launches.

use std::time::Duration;

/// A checked driver call's small error, made rich ([`cuda_dl_sys::Error`]) on the way up.
impl From<cuda_dl_sys::CallError> for Error {
    fn from(error: cuda_dl_sys::CallError) -> Error {
        Error::Cuda(error.into())
    }
}

/// Why a launch, a flush or a resource call failed. Each says what happened and what to do.
///
/// A call that was handed owners or a closure (a launch, `release_after`, `spawn_after`, a graph
/// host node) returns it inside a [`LaunchError`](crate::LaunchError), which hands them back where
/// nothing was enqueued: the crate never drops them on an error path, since earlier work on the
/// stream may still use them. `?` turns a `LaunchError` into this type, dropping them (off the
/// driver's thread).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The driver could not be loaded, a function could not be resolved, or a driver call failed.
    #[error(transparent)]
    Cuda(#[from] cuda_dl_sys::Error),

    /// `launch_host_function` was given a null function pointer.
    #[error("the host function pointer is null: pass Some(function)")]
    NullFunction,

    /// The stream is capturing a CUDA graph, so the host function would become a graph node that
    /// runs on every replay, long after this launch's owners were released.
    #[error(
        "stream {stream:#x} is capturing a CUDA graph (capture id {capture_id}): a host function \
         launched now would run on every replay of the graph, after its owners were released. \
         Launch it before cuStreamBeginCapture or after cuStreamEndCapture"
    )]
    CaptureActive {
        /// The stream handle.
        stream: usize,
        /// The capture's id (0 if the driver gave none).
        capture_id: u64,
    },

    /// [`release_after`](crate::release_after) on a stream that is capturing a graph: the work
    /// enqueued on the stream before the capture began is not in the graph, and the crate cannot
    /// know when it completes, so it could not release the owners after it.
    #[error(
        "release_after on stream {stream:#x}, which is capturing a CUDA graph (capture id \
         {capture_id}): work enqueued on it before the capture began is not in the graph, and \
         nothing tells when it completes, so the owners could not be released after it. Call \
         release_after before cuStreamBeginCapture (for what earlier work uses) or after \
         cuStreamEndCapture; to keep values alive as long as the graph, move them into a closure \
         of LaunchOptions::host_launch_repeatable on the capturing stream (the graph owns it)"
    )]
    ReleaseDuringCapture {
        /// The stream handle.
        stream: usize,
        /// The capture's id (0 if the driver gave none).
        capture_id: u64,
    },

    /// Called inside a host function, on a driver thread, where CUDA calls are not allowed (the
    /// driver may fail them or deadlock).
    #[error(
        "{operation} was called inside a host function, on the driver's thread, where CUDA calls \
         are not allowed (the driver may fail them or deadlock); do it from another thread"
    )]
    InsideHostFunction {
        /// What was attempted.
        operation: &'static str,
    },

    /// A dependency given to [`add_host_node`](crate::add_host_node) is a node of another graph.
    #[error(
        "graph node {node:#x} belongs to graph {node_graph:#x}, not to graph {graph:#x} that the \
         host node is being added to: pass nodes of the same graph (returned for it by \
         add_host_node or Graph::nodes) as dependencies"
    )]
    NodeOfAnotherGraph {
        /// The dependency's node handle.
        node: usize,
        /// The handle of the graph it belongs to.
        node_graph: usize,
        /// The handle of the graph the node was to be added to.
        graph: usize,
    },

    /// Every ticket a launch needs is in use: 16,777,215 launches of this crate are pending at once.
    #[error(
        "too many launches pending at once (16,777,215 host functions launched and not yet run): \
         synchronize streams, or find the context whose host functions never run (a sticky error \
         needs a reset)"
    )]
    TooManyPendingLaunches,

    /// `flush` gave up before every owner was dropped.
    #[error(
        "flush timed out after {timeout:?}: {waiting} releases or callbacks of completed work are \
         not done yet. Is an owner's Drop or a callback blocking the reaper, or a waker the \
         crate's watcher?"
    )]
    FlushTimedOut {
        /// Records still waiting to be released.
        waiting: u64,
        /// The timeout given.
        timeout: Duration,
    },

    /// `flush` was called by the thread that is releasing the cleanup queue's records: inside an
    /// owner's `Drop` or the panic handler. It would wait for itself (the records it waits for
    /// include the one being released, and those after it in the same batch), so it returns at once.
    #[error(
        "flush was called by the thread that is releasing the cleanup queue's records (inside an \
         owner's Drop or the panic handler): it would wait for itself. Call flush from another \
         thread"
    )]
    FlushOnReleasingThread,

    /// `flush` was called on one of the crate's own threads outside a release: in a start hook
    /// ([`ThreadSettings::on_start`](crate::ThreadSettings::on_start)) or in a waker the crate's
    /// poller called. The thread would wait for itself, so it returns at once.
    #[cfg(not(loom))]
    #[error(
        "flush was called on the crate's own thread {thread:?} (in its start hook, or in a waker \
         it called): it would wait for itself. Call flush from another thread"
    )]
    FlushOnCrateThread {
        /// The crate thread that called it.
        thread: crate::CrateThread,
    },

    /// [`Completion::wait`](crate::Completion::wait) or
    /// [`HostLaunchFuture::wait`](crate::HostLaunchFuture::wait) was called on the crate's
    /// watcher (in its start hook, or in a waker it called), which is the thread that completes
    /// the future: it would wait for itself, and every future and release of the process with it.
    #[error(
        "{operation} was called on the crate's watcher thread (in its start hook, or in a waker it \
         called), which completes the future: it would wait for itself. Wait from another thread, \
         or await the future in a task"
    )]
    WaitOnWatcher {
        /// The call: `Completion::wait` or `HostLaunchFuture::wait`.
        operation: &'static str,
    },

    /// `flush` was called after the process began to exit (the crate's exit handler ran): nothing
    /// is released or completed any more, so there is nothing to wait for.
    #[error(
        "flush was called after the process began to exit: the crate's threads have stopped and \
         release nothing more; flush before calling exit"
    )]
    ProcessExiting,

    /// One of the crate's threads could not be started (the operating system refused a thread).
    /// The launch or release that needed it was not made.
    #[cfg(not(loom))]
    #[error(
        "the crate's thread {thread:?} could not be started ({reason}); free thread resources \
         (for the reaper, CleanupMode::Manual needs no thread)"
    )]
    ThreadSpawn {
        /// Which thread.
        thread: crate::CrateThread,
        /// The operating system's answer.
        reason: String,
    },

    /// [`Config::install`](crate::Config::install) after a configuration was already in force.
    #[error(
        "the crate's configuration is already in force (installed before, or fixed by the crate's \
         first use: a launch, a future, a flush, or `config()`): install the Config once, before \
         any other call of this crate"
    )]
    AlreadyConfigured,

    /// An environment variable that overrides the configuration holds a value this crate does not
    /// understand (see [`Config`](crate::Config)).
    #[error("{variable}={value:?} is not understood; set it to {expected}, or unset it")]
    InvalidEnvironment {
        /// The variable.
        variable: &'static str,
        /// Its value.
        value: String,
        /// What it may hold.
        expected: &'static str,
    },

    /// The future's context was lost (a sticky error, then a reset or destroy): its host function or
    /// flag write will never happen.
    #[error(
        "the stream's context was reset or destroyed after a sticky error (such as a trapped \
         kernel, CUDA_ERROR_LAUNCH_FAILED): the work this future waited for will never complete"
    )]
    ContextLost,

    /// The stream's context has a sticky error (a trapped kernel, an illegal address): the work
    /// this future waited for will never complete. The values the work used are kept until the
    /// context is reset or its last retain is released (see
    /// [`PrimaryContext::reset`](crate::PrimaryContext::reset)).
    #[error(
        "the stream's context failed with {name} ({code}): the work this future waited for will \
         never complete. Reset the device's primary context (PrimaryContext::reset) or release it \
         to free what the work held"
    )]
    DeviceFault {
        /// The driver's error code (`CUresult`), as the driver answered it.
        code: u32,
        /// Its name (`CUDA_ERROR_ILLEGAL_ADDRESS`, ...).
        name: &'static str,
    },

    /// The host closure of `host_launch_async` panicked.
    #[error("the host function panicked: {message}")]
    HostFunctionPanicked {
        /// The panic's message.
        message: String,
    },

    /// The future was polled again after it had returned its result.
    #[error("a completed future was polled again")]
    PolledAfterCompletion,

    /// This process was forked from one that had used this crate, after that: the child has
    /// neither the parent's reaper nor a CUDA driver it may use.
    #[error(
        "this process was forked from one that had already launched host functions: CUDA cannot \
         be used in a child forked after its parent initialised it (and the parent's cleanup \
         thread does not exist here). Start the child with exec (std::process::Command), or fork \
         before the first launch"
    )]
    ForkedChild,

    /// Stream-ordered releases and callbacks through events ([`release_after`](crate::release_after),
    /// [`spawn_after`](crate::spawn_after), [`CompletionMode::Event`](crate::CompletionMode::Event))
    /// work on streams of a device's primary context only: the crate retains that context while
    /// its events are in use, so that no other binding's release can destroy them under its poller.
    #[error(
        "releases and callbacks through events need a stream of a primary context (the one \
         cuDevicePrimaryCtxRetain gives, which cudarc and the CUDA runtime use); this stream's \
         context {context:#x} was created with cuCtxCreate. Use a host-function launch (host_launch, \
         launch_host_function) on it instead"
    )]
    NotPrimaryContext {
        /// The stream's context.
        context: usize,
    },

    /// The bytes to copy are too large for one allocation.
    #[error("{len} bytes of user data cannot be allocated in one block")]
    UserDataTooLarge {
        /// The length asked for.
        len: usize,
    },

    /// The driver found no usable context for the stream (`CUDA_ERROR_INVALID_CONTEXT`): a
    /// special handle (`RawStream::LEGACY`, `RawStream::PER_THREAD`, the null stream) means "the
    /// default stream of the context current on this thread", and none is current (or the current
    /// one was destroyed). [`cuda_code`](Error::cuda_code) is `CUDA_ERROR_INVALID_CONTEXT`.
    #[error(
        "stream {stream:#x} has no usable context ({function} returned CUDA_ERROR_INVALID_CONTEXT): \
         the default-stream handles (RawStream::LEGACY, RawStream::PER_THREAD, null) name the \
         default stream of the context current on the calling thread, and none is current here, or \
         it was destroyed. Make a context current on this thread first \
         (PrimaryContext::set_current, or cuCtxSetCurrent), or pass a Stream (or another binding's \
         stream handle), which carries its context"
    )]
    NoCurrentContext {
        /// The stream handle passed.
        stream: usize,
        /// The driver call that found no context.
        function: &'static str,
    },

    /// The operation needs a newer driver than the loaded one: stream-ordered releases and
    /// callbacks through events ([`release_after`](crate::release_after),
    /// [`spawn_after`](crate::spawn_after), [`CompletionMode::Event`](crate::CompletionMode::Event))
    /// need CUDA 12.0, where streams have ids (`cuStreamGetId`). Nothing was enqueued.
    #[error(
        "{operation} needs CUDA {required} (for {function}); the loaded driver supports CUDA \
         {found}. On this driver use a host-function launch instead (host_launch, \
         launch_host_function, or CompletionMode::HostFunction), or upgrade the driver"
    )]
    NeedsNewerDriver {
        /// What was asked for.
        operation: &'static str,
        /// The driver function it needs (its table name).
        function: &'static str,
        /// The version that function needs.
        required: cuda_dl_sys::DriverVersion,
        /// The loaded driver's version.
        found: cuda_dl_sys::DriverVersion,
    },

    /// [`quiesce`](crate::quiesce) gave up before the watcher gave its events back.
    #[error(
        "quiesce timed out after {timeout:?}: the watcher still has events out (work still \
         pending on a stream, or a callback still running). Synchronize the streams first, and \
         stop other threads' enqueues"
    )]
    QuiesceTimedOut {
        /// The timeout given.
        timeout: Duration,
    },
}

impl Error {
    /// The driver's result code, when the error is one.
    pub fn cuda_code(&self) -> Option<cuda_dl_sys::types::CUresult> {
        match self {
            Error::Cuda(e) => e.code(),
            Error::NoCurrentContext { .. } => {
                Some(cuda_dl_sys::types::CUresult::CUDA_ERROR_INVALID_CONTEXT)
            }
            _ => None,
        }
    }
}
