//! The cleanup queue and the reaper: where the owners of host functions that have run are dropped.
//!
//! - **Queue.** Process-wide, lock-free, intrusive ([`IntrusiveStack`] of launch records): the
//!   trampoline pushes the record it just ran, from the driver's thread, without allocating, locking
//!   or calling CUDA.
//! - **Reaper** (the default, [`CleanupMode::Reaper`]). One thread, started on first use, parked
//!   while the queue is empty. The push that finds the queue empty wakes it (`Thread::unpark`, a
//!   futex wake on Linux; no lock a launcher could hold); pushes onto a non-empty queue do not, so a
//!   burst of host functions costs one wake-up per batch.
//! - **Manual** ([`CleanupMode::Manual`]): no thread. The queue is drained at each launch and by
//!   [`drain`] and [`flush`].
//!
//! Releasing a record drops its owners inside `catch_unwind`: a panicking `Drop` is reported through
//! the panic handler and the next record is released as usual.
//!
//! The reaper puts itself in relaxed stream-capture interaction mode before it runs any owner's
//! `Drop`, so that a `Drop` that frees device memory never breaks another thread's graph capture
//! (see `relaxed_capture`).
//!
//! **At process exit** the reaper stops before the driver is torn down: the release in progress
//! finishes (the exit waits for it, at most a second) and no other starts (see `exit_gate`).
//! Records still queued, and those of host functions that have not run yet (the driver runs or
//! discards them as the process and its contexts go down), are not released: their owners' `Drop`
//! does not run, as for any value alive at `exit`. Call [`flush`] before exiting where that
//! matters.
//!
//! **In a child forked** after the first launch, launches, completions and [`flush`] fail with
//! [`Error::ForkedChild`] and [`drain`] releases nothing (see `forked_child`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::ptr::NonNull;
use std::sync::atomic::AtomicU8;
use std::sync::{Condvar, Mutex, OnceLock};
use std::thread::Thread;
use std::time::{Duration, Instant};

use crate::error::Error;
use crate::host_thread::in_host_function;
use crate::intrusive_stack::{Batch, IntrusiveStack};
use crate::own_line::OwnLine;
use crate::panic_report::{PanicOrigin, report};
use crate::record::{DeferredDrop, Op, RecordHeader, new_record};
use crate::relaxed_capture::RelaxedCaptureMode;
use crate::sync::{AtomicU64, AtomicUsize, Ordering};

/// The environment variable that picks the cleanup mode before the first launch: `reaper` (the
/// default) or `manual`.
pub const CLEANUP_MODE_ENV: &str = "CUDA_HOST_LAUNCH_CLEANUP";

/// How often (µs) the reaper looks at the queue while it lingers after a batch (default 50; `0`
/// parks at once after every batch).
pub const REAPER_POLL_ENV: &str = "CUDA_HOST_LAUNCH_REAPER_POLL_US";

/// How long (µs) the reaper lingers, polling, after its last batch before it parks (default 2000).
pub const REAPER_LINGER_ENV: &str = "CUDA_HOST_LAUNCH_REAPER_LINGER_US";

const DEFAULT_POLL: Duration = Duration::from_micros(50);
const DEFAULT_LINGER: Duration = Duration::from_micros(2000);
/// The longest single wait of `flush` before it looks again.
const FLUSH_SLICE: Duration = Duration::from_millis(2);

/// Who drops the owners of host functions that have run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CleanupMode {
    /// A background thread, started on first use, drops them as soon as they are queued.
    Reaper,
    /// No thread: they are dropped at the next launch, [`drain`] or [`flush`], on that caller's
    /// thread.
    ///
    /// That thread's stream-capture interaction mode applies to the owners' `Drop`: in the
    /// default (`CU_STREAM_CAPTURE_MODE_GLOBAL`), while any other thread captures a stream in
    /// global mode (or the thread itself captures), a `Drop` that frees or allocates memory, or
    /// queries or synchronizes an event, a stream or a context, fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and invalidates that capture. So drain (and launch)
    /// from a thread that no such capture affects, or that is in relaxed mode
    /// (`cuThreadExchangeStreamCaptureMode`), or release such owners in reaper mode, whose thread
    /// is relaxed.
    Manual,
}

struct CleanupQueue {
    /// Pushed by driver threads, taken by consumers.
    stack: OwnLine<IntrusiveStack<RecordHeader>>,
    /// Records pushed so far: those of host functions that have run, of graphs destroyed, and
    /// deferred drops. Written by driver threads only.
    queued: OwnLine<AtomicU64>,
    /// Records released from the queue. Written by consumers only.
    released: OwnLine<AtomicU64>,
    /// Threads waiting in `flush`.
    flush_waiters: OwnLine<AtomicUsize>,
}

static QUEUE: CleanupQueue = CleanupQueue {
    stack: OwnLine(IntrusiveStack::new()),
    queued: OwnLine(AtomicU64::new(0)),
    released: OwnLine(AtomicU64::new(0)),
    flush_waiters: OwnLine(AtomicUsize::new(0)),
};

static REAPER: OnceLock<Thread> = OnceLock::new();
static REAPER_START: Mutex<()> = Mutex::new(());
static FLUSH_LOCK: Mutex<()> = Mutex::new(());
static FLUSHED: Condvar = Condvar::new();

const MODE_UNSET: u8 = 0;
const MODE_REAPER: u8 = 1;
const MODE_MANUAL: u8 = 2;
static MODE: AtomicU8 = AtomicU8::new(MODE_UNSET);

/// Pushes a record to be released: one whose host function has run (from the trampoline), one
/// whose graph is gone (from a user object's destructor), or a deferred drop.
///
/// May be called on a driver thread: no allocation, no lock, no CUDA call, no drop.
///
/// # Safety
/// `header` must be a live record that nobody else owns.
#[inline]
pub(crate) unsafe fn push(header: NonNull<RecordHeader>) {
    // Counted before it is pushed, so a `flush` that sees the count also finds the record (or finds
    // it released).
    QUEUE.queued.fetch_add(1, Ordering::SeqCst);
    // SAFETY: the caller hands over a live record that is in no queue.
    let was_empty = unsafe { QUEUE.stack.push(header) };
    if was_empty {
        // Orders the push before the look at REAPER, against the reaper's own fence between
        // reading REAPER's start and its emptiness check: either this push sees the reaper, or the
        // reaper sees this push (found by the loom model of a push racing the reaper's start).
        std::sync::atomic::fence(Ordering::SeqCst);
        if let Some(reaper) = REAPER.get() {
            reaper.unpark();
        }
    }
}

/// Releases a record that was never handed to the driver: here, unless this is a driver thread, in
/// which case the record goes to the cleanup queue instead.
pub(crate) fn release_here_or_defer(header: NonNull<RecordHeader>) {
    if in_host_function() {
        // SAFETY: the record is ours and in no queue.
        unsafe { push(header) };
    } else {
        release_one(header);
    }
}

/// Drops `value` off the driver's thread: at once if the caller is not on one, else through the
/// cleanup queue.
///
/// For `Drop` implementations of types that may be dropped inside a host function and whose
/// destruction calls CUDA: this crate's own [`Stream`](crate::Stream), [`Event`](crate::Event) and
/// [`PrimaryContext`](crate::PrimaryContext) use it.
pub fn defer_drop<T: Send + 'static>(value: T) {
    if in_host_function() {
        drop(new_record(DeferredDrop(value)));
    } else {
        drop(value);
    }
}

/// Releases one record: takes it out of the pending launches (gives its ticket back), reports the
/// panic its host function had, then drops its owners and frees it, catching a panic from an
/// owner's `Drop`.
fn release_one(header: NonNull<RecordHeader>) {
    crate::pending::forget(header);
    // SAFETY: the caller owns the live record.
    if let Some(panic) = unsafe { RecordHeader::dispatch(header, Op::TakePanic) } {
        report(PanicOrigin::HostFunction, &*panic);
        // The payload's own Drop is user code too.
        let _ = catch_unwind(AssertUnwindSafe(move || drop(panic)));
    }
    // SAFETY: as above; this is the record's one release. If an owner's Drop panics, unwinding still
    // drops the remaining owners and frees the memory, so the record is gone either way.
    let released = catch_unwind(AssertUnwindSafe(|| unsafe {
        RecordHeader::dispatch(header, Op::Release)
    }));
    if let Err(panic) = released {
        report(PanicOrigin::OwnerDrop, &*panic);
        let _ = catch_unwind(AssertUnwindSafe(move || drop(panic)));
    }
}

/// Vectors a releasing thread reuses from batch to batch (the reaper keeps one; `drain` makes one
/// per call), so that the reaper's heap stays quiet while host functions flow.
#[derive(Default)]
struct Scratch {
    headers: Vec<NonNull<RecordHeader>>,
}

/// The most entries a reused vector keeps between batches (a larger batch's capacity is let go).
const SCRATCH_KEEP: usize = 4096;

fn release_batch(batch: Batch<RecordHeader>, scratch: &mut Scratch) -> u64 {
    // Once the process is exiting, nothing more is released (see `exit_gate`).
    // The release also marks this thread as releasing (`flush` refuses to wait for itself).
    let Some(releasing) = crate::exit_gate::begin_releasing() else {
        return 0;
    };
    let headers = &mut scratch.headers;
    headers.clear();
    headers.extend(batch);
    let count = headers.len() as u64;
    for (released, &header) in headers.iter().enumerate() {
        if releasing.exit_began() {
            // The rest stay here, unreleased, as the process ends.
            return released as u64;
        }
        release_one(header);
    }
    headers.clear();
    headers.shrink_to(SCRATCH_KEEP);
    if count > 0 {
        QUEUE.released.fetch_add(count, Ordering::SeqCst);
        if QUEUE.flush_waiters.load(Ordering::SeqCst) > 0 {
            let _guard = FLUSH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
            FLUSHED.notify_all();
        }
    }
    count
}

/// Releases, on the calling thread, every record queued so far; returns how many.
///
/// Works in either mode (in reaper mode it just does the reaper's work sooner). Inside a host
/// function it does nothing and returns 0: owners are never dropped on a driver thread. It also
/// returns 0 in a child forked after the first launch (the queue holds copies of the parent's
/// records) and once the process is exiting.
///
/// The owners' `Drop` runs in the calling thread's stream-capture interaction mode: see
/// [`CleanupMode::Manual`] for what that means while a graph is captured.
pub fn drain() -> u64 {
    if in_host_function() || crate::forked_child::is_forked_child() {
        return 0;
    }
    release_batch(QUEUE.stack.take_all(), &mut Scratch::default())
}

/// Waits until every record queued so far is released, or `timeout` passes: the owners of every
/// host function that has run, and of every graph whose user object the driver has destroyed. In
/// manual mode it drains the queue itself.
///
/// Once everything is released it also gives the record pool's surplus memory back to the system
/// (free 4 KiB segments of slots, beyond 512 KiB of them), as the reaper does when it goes idle.
///
/// Host functions still pending on their streams are not waited for: synchronize the stream first
/// to include them. The driver destroys a graph's user objects asynchronously, so owners tied to a
/// graph may reach the queue a little after `cuGraphDestroy` returns.
///
/// A `timeout` too long to add to the clock (`Duration::MAX`) waits as long as it takes.
///
/// Called by the thread that is releasing records (inside an owner's `Drop`, or the panic
/// handler, whether on the reaper or on a thread that drains), it returns
/// [`Error::FlushOnReleasingThread`] at once: the records it would wait for include the one that
/// thread is releasing, so it would only wait out its timeout while all cleanup stopped.
///
/// # Errors
/// [`Error::FlushTimedOut`] with the number still waiting; [`Error::InsideHostFunction`] if called
/// from a host function (the reaper cannot be waited for there);
/// [`Error::FlushOnReleasingThread`] if called by the releasing thread; [`Error::ForkedChild`] in a
/// child forked after the first launch.
pub fn flush(timeout: Duration) -> Result<(), Error> {
    crate::host_thread::refuse_inside_host_function("flush")?;
    if crate::exit_gate::releasing_here() {
        return Err(Error::FlushOnReleasingThread);
    }
    crate::forked_child::check()?;
    let target = QUEUE.queued.load(Ordering::SeqCst);
    // None: beyond what the clock can represent, so never reached.
    let deadline = Instant::now().checked_add(timeout);
    QUEUE.flush_waiters.fetch_add(1, Ordering::SeqCst);
    let result = loop {
        if !reaper_running() {
            drain();
        }
        let released = QUEUE.released.load(Ordering::SeqCst);
        if released >= target {
            break Ok(());
        }
        let now = Instant::now();
        if deadline.is_some_and(|deadline| now >= deadline) {
            break Err(Error::FlushTimedOut {
                waiting: target - released,
                timeout,
            });
        }
        let guard = FLUSH_LOCK.lock().unwrap_or_else(|p| p.into_inner());
        if QUEUE.released.load(Ordering::SeqCst) >= target {
            break Ok(());
        }
        // Bounded waits: in manual mode nobody notifies, and a host function may be pushing as we
        // look; a short slice keeps both cheap and correct.
        let slice = deadline.map_or(FLUSH_SLICE, |deadline| (deadline - now).min(FLUSH_SLICE));
        let _ = FLUSHED
            .wait_timeout(guard, slice)
            .unwrap_or_else(|p| p.into_inner());
    };
    QUEUE.flush_waiters.fetch_sub(1, Ordering::SeqCst);
    if result.is_ok() {
        // Everything released so far is back in the record pool: give its surplus segments back.
        crate::record_pool::trim();
    }
    result
}

/// The current cleanup mode (from [`CLEANUP_MODE_ENV`] until [`set_cleanup_mode`] is called).
///
/// # Errors
/// [`Error::InvalidEnvironment`] if the variable holds neither `reaper` nor `manual`.
pub fn cleanup_mode() -> Result<CleanupMode, Error> {
    match MODE.load(Ordering::Acquire) {
        MODE_REAPER => Ok(CleanupMode::Reaper),
        MODE_MANUAL => Ok(CleanupMode::Manual),
        _ => {
            let mode = mode_from_env()?;
            let value = if mode == CleanupMode::Manual {
                MODE_MANUAL
            } else {
                MODE_REAPER
            };
            let _ = MODE.compare_exchange(MODE_UNSET, value, Ordering::AcqRel, Ordering::Acquire);
            cleanup_mode()
        }
    }
}

fn mode_from_env() -> Result<CleanupMode, Error> {
    match std::env::var(CLEANUP_MODE_ENV) {
        Err(std::env::VarError::NotPresent) => Ok(CleanupMode::Reaper),
        Ok(v) if v.trim().is_empty() || v.trim().eq_ignore_ascii_case("reaper") => {
            Ok(CleanupMode::Reaper)
        }
        Ok(v) if v.trim().eq_ignore_ascii_case("manual") => Ok(CleanupMode::Manual),
        Ok(v) => Err(Error::InvalidEnvironment {
            variable: CLEANUP_MODE_ENV,
            value: v,
        }),
        Err(std::env::VarError::NotUnicode(v)) => Err(Error::InvalidEnvironment {
            variable: CLEANUP_MODE_ENV,
            value: v.to_string_lossy().into_owned(),
        }),
    }
}

/// Chooses the cleanup mode. `Manual` can be chosen only before the reaper has started (before the
/// first launch in reaper mode); `Reaper` can be chosen at any time.
///
/// # Errors
/// [`Error::ReaperAlreadyRunning`] when asking for `Manual` after the reaper started.
pub fn set_cleanup_mode(mode: CleanupMode) -> Result<(), Error> {
    let _guard = REAPER_START.lock().unwrap_or_else(|p| p.into_inner());
    match mode {
        CleanupMode::Manual if REAPER.get().is_some() => Err(Error::ReaperAlreadyRunning),
        CleanupMode::Manual => {
            MODE.store(MODE_MANUAL, Ordering::Release);
            Ok(())
        }
        CleanupMode::Reaper => {
            MODE.store(MODE_REAPER, Ordering::Release);
            Ok(())
        }
    }
}

fn reaper_running() -> bool {
    REAPER.get().is_some()
}

/// Makes sure whoever must drain is ready before a record can reach the queue: in reaper mode, that
/// the reaper thread exists (so the first push can wake it). Returns the mode.
#[inline]
pub(crate) fn prepare() -> Result<CleanupMode, Error> {
    crate::forked_child::check()?;
    let mode = cleanup_mode()?;
    if mode == CleanupMode::Reaper && REAPER.get().is_none() {
        start_reaper()?;
    }
    Ok(mode)
}

#[cold]
fn start_reaper() -> Result<(), Error> {
    let _guard = REAPER_START.lock().unwrap_or_else(|p| p.into_inner());
    if REAPER.get().is_some() {
        return Ok(());
    }
    let handle = std::thread::Builder::new()
        .name("cuda-host-launch-reaper".into())
        .spawn(reaper_loop)
        .map_err(|e| Error::ReaperSpawn(e.to_string()))?;
    let _ = REAPER.set(handle.thread().clone());
    // A push that ran before REAPER was set woke no one; wake the reaper once, so it looks.
    handle.thread().unpark();
    // The handle is dropped: the reaper is detached and runs until the process exits.
    Ok(())
}

/// The reaper: releases batches as they come.
///
/// Waking a parked thread costs the waker a futex system call, and the waker is a driver thread,
/// whose time every host function of its context shares. So after a batch the reaper does not park
/// at once: it lingers, looking at the queue every `poll` (sleeping in between, on its own core),
/// for `linger`. While it lingers, a push's `unpark` is one atomic swap, no system call, and
/// batches grow to everything pushed within a poll interval. Once idle for `linger`, it parks; the
/// next push that finds the queue empty wakes it.
fn reaper_loop() {
    precise_sleeps();
    let mut relaxed = RelaxedCaptureMode::pending();
    let poll = env_micros(REAPER_POLL_ENV).unwrap_or(DEFAULT_POLL);
    let linger = env_micros(REAPER_LINGER_ENV).unwrap_or(DEFAULT_LINGER);
    let mut idle_since: Option<Instant> = None;
    let mut scratch = Scratch::default();
    loop {
        // Pairs with the fence in `push` (see there).
        std::sync::atomic::fence(Ordering::SeqCst);
        if QUEUE.stack.is_empty() {
            let now = Instant::now();
            let since = *idle_since.get_or_insert(now);
            if !poll.is_zero() && now.duration_since(since) < linger {
                std::thread::sleep(poll);
                continue;
            }
            idle_since = None;
            // Idle: give the record pool's surplus back to the system before sleeping.
            crate::record_pool::trim();
            // Wait for the push that finds the queue empty. Spurious wake-ups just loop.
            std::thread::park();
            continue;
        }
        idle_since = None;
        // The driver is loaded by now (a record is queued only after a launch): relax this
        // thread's capture interaction before it runs owners' `Drop`, and stop it at exit.
        relaxed.enter_once_loaded();
        crate::exit_gate::arm_or_stop();
        release_batch(QUEUE.stack.take_all(), &mut scratch);
    }
}

/// Asks Linux to wake this thread's sleeps within 1 µs of their deadline rather than the default
/// 50 µs slack, so the reaper's poll interval is what it says. Elsewhere a no-op.
fn precise_sleeps() {
    #[cfg(target_os = "linux")]
    // SAFETY: PR_SET_TIMERSLACK takes an integer (nanoseconds) and only affects this thread.
    unsafe {
        libc::prctl(libc::PR_SET_TIMERSLACK, 1000 as libc::c_ulong);
    }
}

/// A duration in microseconds from the environment; `None` if unset or not a number.
fn env_micros(variable: &str) -> Option<Duration> {
    std::env::var(variable)
        .ok()?
        .trim()
        .parse()
        .ok()
        .map(Duration::from_micros)
}

/// Counters of the cleanup queue, for tests and benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CleanupStats {
    /// Records queued for release: host functions of this crate that have run, graphs whose owners
    /// the driver let go, deferred drops.
    pub queued: u64,
    /// Records released from the queue (their owners dropped).
    pub released: u64,
}

/// A snapshot of the cleanup queue's counters.
pub fn cleanup_stats() -> CleanupStats {
    CleanupStats {
        queued: QUEUE.queued.load(Ordering::SeqCst),
        released: QUEUE.released.load(Ordering::SeqCst),
    }
}
