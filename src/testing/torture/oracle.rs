//! The oracle: what each owner, callback and future of a torture run must obey, judged against what
//! the fake driver knows (how far each stream got, which contexts still live) at the moment it
//! happens.
//!
//! Both facts only ever grow (a stream's completed count, a context's death), so a judgement made
//! when a value is dropped or a callback runs is never a false alarm: if the stream had not got
//! there and the context still lived at that moment, the crate released or ran it early.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::task::{Context, Poll, Wake, Waker};
use std::thread::ThreadId;

use cuda_host_launch::Error;

use super::super::fake;
use super::script::{HookAntics, Op, WorkKind};

/// Where a piece of work was enqueued: the stream (by id) and how many operations the stream had
/// before it, and the context (by id) it went to.
#[derive(Debug, Clone, Copy)]
pub struct Position {
    /// The stream's `cuStreamGetId`.
    pub stream: u64,
    /// The stream's enqueued count when the call began: everything before it must have completed
    /// before the work's owners go or its callback runs.
    pub before: u64,
    /// The context's `cuCtxGetId`.
    pub context: u64,
}

impl Position {
    /// Whether everything enqueued on the stream before the work has completed.
    pub fn reached(&self) -> bool {
        fake()
            .stream_progress(self.stream)
            .is_some_and(|p| p.completed >= self.before)
            || self.before == 0
    }

    /// Whether the work's context is gone (destroyed, or a primary context released for the last
    /// time or reset): then its work never completes, and a reclaim may release it.
    pub fn context_dead(&self) -> bool {
        !fake().context_alive(self.context)
    }
}

/// A capture the world began, shared with the work enqueued into it.
#[derive(Debug, Default)]
pub struct CaptureRecord {
    /// Set once the graph made from it (and every executable graph) is being destroyed.
    pub graph_gone: AtomicBool,
    /// The replays' stream position: owners of the graph must outlive its last replay.
    pub replayed_before: AtomicU64,
    /// The stream the replays ran on (its id), if any.
    pub replay_stream: AtomicU64,
}

/// What one piece of work carries for the oracle: its owners (an [`Owner`]) and, if it has one, its
/// callback report to the same record.
#[derive(Debug)]
pub struct Tracked {
    /// A number for messages.
    pub id: u64,
    /// The operation, for messages.
    pub op: Op,
    /// The thread that made it.
    pub thread: usize,
    /// Where its stream was.
    pub at: Position,
    /// Whether it has a callback that runs once (a run-once host function, a `spawn_after`).
    pub runs_once: bool,
    /// Whether it has a callback at all.
    pub has_callback: bool,
    /// The capture its stream was in when it was enqueued (the world knew for sure).
    pub capture: Option<Arc<CaptureRecord>>,
    /// Whether a capture may have been hidden from the crate's look during its call: a repeatable
    /// launch is then made as a run-once one, which a capture may take (it runs on the first
    /// replay only, and is released after it).
    pub capture_maybe_hidden: AtomicBool,
    /// The callback's runs.
    pub ran: AtomicU32,
    /// The owners' drops.
    pub dropped: AtomicU32,
    /// Whether it has owners at all (bytes launches and completions have none).
    pub owned: AtomicBool,
    /// Whether the enqueuing call is still in progress, and on which thread.
    pub in_call: Mutex<Option<ThreadId>>,
    /// The owners were dropped by the enqueuing thread during the call: judged when it returns.
    pub dropped_in_call: AtomicBool,
    /// The enqueuing call returned an error.
    pub failed: AtomicBool,
    /// The enqueuing call failed and handed the owners back: their drop is the caller's (the
    /// harness's), not the crate's, and is not judged.
    pub handed_back: AtomicBool,
}

/// The run's verdicts so far.
#[derive(Debug, Default)]
pub struct Oracle {
    /// What went wrong, in the order seen.
    pub violations: Mutex<Vec<String>>,
    /// Every tracked piece of work.
    pub tracked: Mutex<Vec<Arc<Tracked>>>,
    next: AtomicU64,
}

impl Oracle {
    /// Records a violation.
    pub fn violation(&self, text: String) {
        let mut v = self.violations.lock().unwrap_or_else(|p| p.into_inner());
        if v.len() < 200 {
            v.push(text);
        }
    }

    /// A new tracked piece of work, its enqueuing call in progress on this thread.
    pub fn track(
        &self,
        op: Op,
        thread: usize,
        at: Position,
        has_callback: bool,
        runs_once: bool,
        capture: Option<Arc<CaptureRecord>>,
    ) -> Arc<Tracked> {
        let tracked = Arc::new(Tracked {
            id: self.next.fetch_add(1, Ordering::Relaxed),
            op,
            thread,
            at,
            runs_once,
            has_callback,
            capture,
            capture_maybe_hidden: AtomicBool::new(false),
            ran: AtomicU32::new(0),
            dropped: AtomicU32::new(0),
            owned: AtomicBool::new(true),
            in_call: Mutex::new(Some(std::thread::current().id())),
            dropped_in_call: AtomicBool::new(false),
            failed: AtomicBool::new(false),
            handed_back: AtomicBool::new(false),
        });
        self.tracked
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(Arc::clone(&tracked));
        tracked
    }

    /// The enqueuing call of `tracked` returned (`ok` or an error, `error`). `handed_back`: the
    /// error gave the owners back (the caller drops them after this). `capture_hidden`: whether a
    /// capture may have been hidden from the crate's look since the call began (a run-once launch
    /// may then be captured).
    pub fn call_returned(
        &self,
        tracked: &Tracked,
        result: Result<(), &Error>,
        handed_back: bool,
        capture_hidden: bool,
    ) {
        // Under the lock a drop during the call looks at: it is judged here, or after this.
        let mut in_call = tracked.in_call.lock().unwrap_or_else(|p| p.into_inner());
        *in_call = None;
        if result.is_err() {
            tracked.failed.store(true, Ordering::Release);
        }
        if handed_back {
            tracked.handed_back.store(true, Ordering::Release);
        }
        drop(in_call);
        if capture_hidden {
            tracked.capture_maybe_hidden.store(true, Ordering::Release);
        }
        match result {
            Ok(()) => {
                if tracked.capture.is_some() && tracked.runs_once && !capture_hidden {
                    // A run-once launch accepted on a stream that was capturing for sure: the
                    // crate must refuse those (its host function would run on every replay).
                    self.violation(format!(
                        "{}: a run-once operation was accepted on a capturing stream",
                        describe(tracked)
                    ));
                }
                if tracked.dropped_in_call.load(Ordering::Acquire) {
                    self.judge_drop(tracked, "during its (successful) enqueuing call");
                }
            }
            Err(error) => {
                tracked.failed.store(true, Ordering::Release);
                // The rule: a refused call hands its owners back (earlier work on the stream may
                // still use them), and the crate never drops them itself. It may keep them only
                // where what was enqueued may still be used: a capture may hold it (or the second
                // look at the stream failed, which counts as that): pending until the context is
                // gone; the work was accepted and a later step failed (the watcher's start). A
                // graph's failed step (a user object, a node, a captured launch) hands back too:
                // the record is taken back out of the user object.
                let text = error.to_string();
                // (A failed look at the stream after the record counts as a capture.)
                let keep_allowed = matches!(
                    error,
                    Error::CaptureActive { .. } | Error::ThreadSpawn { .. }
                ) || text.contains("cuStreamGetCaptureInfo")
                    || text.contains("cuStreamIsCapturing");
                let owned = tracked.owned.load(Ordering::Acquire);
                // (A reclaim of a context that died meanwhile may release what the crate kept.)
                if owned
                    && tracked.dropped_in_call.load(Ordering::Acquire)
                    && !tracked.at.context_dead()
                {
                    self.violation(format!(
                        "{}: failed with {error}, and the crate dropped its owners during the call \
                         instead of handing them back",
                        describe(tracked)
                    ));
                }
                if owned && !handed_back && !keep_allowed {
                    self.violation(format!(
                        "{}: failed with {error} without handing its owners back (nothing may \
                         hold them: the crate must not keep them)",
                        describe(tracked)
                    ));
                }
            }
        }
    }

    /// The work on the stream with `cuStreamGetId` `stream` that a `synchronize` begun now
    /// completes, and whose owners a later `flush` must then have dropped: host functions
    /// (closures, raw launches, `host_launch_async`), `release_after` and `spawn_after`, whose
    /// enqueuing call returned `Ok` with the stream not capturing (the world begins a capture under
    /// the stream slot's write lock, so none began during the call; a hidden capture hides only
    /// one that was there).
    pub fn completed_by_a_sync(&self, stream: u64) -> Vec<Arc<Tracked>> {
        let tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
        tracked
            .iter()
            .filter(|t| {
                let kind = match t.op {
                    Op::Work { kind, .. } | Op::Special { kind, .. } => kind,
                    _ => return false,
                };
                let released_by_flush = matches!(
                    kind,
                    WorkKind::Raw
                        | WorkKind::Closure
                        | WorkKind::Async
                        | WorkKind::ReleaseAfter
                        | WorkKind::SpawnAfter
                );
                released_by_flush
                    && t.at.stream == stream
                    && t.owned.load(Ordering::Acquire)
                    && t.in_call
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .is_none()
                    && !t.failed.load(Ordering::Acquire)
                    && t.capture.is_none()
            })
            .cloned()
            .collect()
    }

    /// A `flush` returned `Ok` after a `synchronize` of the same thread completed `synced` (see
    /// [`Oracle::completed_by_a_sync`]; a host function counts only if it ran): their owners must
    /// be dropped by now, except where their context failed or is gone (the watcher may then
    /// strand what completed just before; owners wait for the reset).
    pub fn check_flushed(&self, synced: &[Arc<Tracked>]) {
        for t in synced {
            let failed = t.at.context_dead() || fake().context_poisoned(t.at.context);
            if t.dropped.load(Ordering::Acquire) == 0 && !failed {
                self.violation(format!(
                    "{}: flush returned Ok after a synchronize that completed it, with its owners \
                     alive",
                    describe(t)
                ));
            }
        }
    }

    /// The callback of `tracked` runs now.
    pub fn callback_runs(&self, tracked: &Tracked) {
        let before = tracked.ran.fetch_add(1, Ordering::AcqRel);
        if before > 0 && tracked.runs_once {
            self.violation(format!("{}: its callback ran twice", describe(tracked)));
        }
        if tracked.owned.load(Ordering::Acquire) && tracked.dropped.load(Ordering::Acquire) > 0 {
            self.violation(format!(
                "{}: its callback ran after its owners were dropped",
                describe(tracked)
            ));
        }
        if tracked.capture.is_none() && !tracked.at.reached() {
            self.violation(format!(
                "{}: its callback ran before the work enqueued before it completed",
                describe(tracked)
            ));
        }
    }

    /// `tracked` has no owners (a bytes launch, a completion): only its callback or future is
    /// judged.
    pub fn owners_dropped_none(&self, tracked: &Tracked) {
        tracked.owned.store(false, Ordering::Release);
    }

    /// The owners of `tracked` are dropped now, on this thread.
    pub fn owners_dropped(&self, tracked: &Tracked) {
        let before = tracked.dropped.fetch_add(1, Ordering::AcqRel);
        if before > 0 {
            self.violation(format!(
                "{}: its owners were dropped twice",
                describe(tracked)
            ));
            return;
        }
        if std::thread::current().name().is_none() {
            // This binary's threads all have names (the test's, the crate's); the fake driver's
            // threads are foreign to it.
            self.violation(format!(
                "{}: its owners were dropped on a driver thread ({})",
                describe(tracked),
                super::super::os_thread().1
            ));
        }
        let in_call = tracked.in_call.lock().unwrap_or_else(|p| p.into_inner());
        if tracked.handed_back.load(Ordering::Acquire) {
            // Handed back by a refused call: the caller's drop, whenever it likes.
            return;
        }
        if in_call.is_some() {
            // Judged once the call returns (fine if it failed): whether on the calling thread (a
            // refused call) or another (a graph's user object let go on an error path).
            tracked.dropped_in_call.store(true, Ordering::Release);
            return;
        }
        drop(in_call);
        if tracked.failed.load(Ordering::Acquire)
            && !tracked.at.context_dead()
            && tracked.capture.is_none()
        {
            // Refused with CaptureActive (a capture may hold its event): pending until its
            // context is gone.
            self.judge_drop(tracked, "after its call failed");
            return;
        }
        self.judge_drop(tracked, "");
    }

    fn judge_drop(&self, tracked: &Tracked, when: &str) {
        let at = tracked.at;
        if at.context_dead() {
            return;
        }
        let ran = tracked.ran.load(Ordering::Acquire) > 0;
        let failed = tracked.failed.load(Ordering::Acquire);
        match &tracked.capture {
            // A failed call gave the graph nothing: its owners go at once, or (when the graph
            // already owned the record) with the user object the crate let go.
            Some(_) if failed => {}
            // After a sticky error the driver drops a graph's launches and lets go of what they
            // held: its owners may go with the graph. (The fake's answer stays `true` once the
            // context has died with the error, so a reset since the look above changes nothing:
            // a launch it dropped left its stream's progress untouched.)
            Some(_) if fake().context_poisoned(at.context) => {}
            // Owned by a graph: it must outlive the graph and the graph's last replay (the work
            // enqueued before the capture is not the node's to wait for: it only runs in
            // replays).
            // A run-once launch a capture took (its capture hidden from the crate's look) runs
            // on the first replay only and is released after that run.
            // The same for a repeatable launch the crate took for run-once (the capture hidden).
            Some(_)
                if ran
                    && (tracked.runs_once
                        || tracked.capture_maybe_hidden.load(Ordering::Acquire)) => {}
            Some(capture) => {
                if !ran && !capture.graph_gone.load(Ordering::Acquire) {
                    self.violation(format!(
                        "{}: owned by a capture's graph, its owners were dropped {when} while the \
                         graph lives",
                        describe(tracked)
                    ));
                }
                let replays = capture.replayed_before.load(Ordering::Acquire);
                let stream = capture.replay_stream.load(Ordering::Acquire);
                if replays > 0 {
                    let replayed = Position {
                        stream,
                        before: replays,
                        context: at.context,
                    };
                    if !replayed.reached() {
                        self.violation(format!(
                            "{}: owned by a graph, its owners were dropped {when} before the \
                             graph's last replay completed (replay stream {stream} at {:?}, \
                             needed {replays}; context alive {}, poisoned {})",
                            describe(tracked),
                            fake().stream_progress(stream),
                            !at.context_dead(),
                            fake().context_poisoned(at.context),
                        ));
                    }
                }
            }
            // A `spawn_after` callback whose context failed with a sticky error is dropped unrun
            // at once (the stream never gets there); a release's owners and a host function's
            // stay until the reset.
            None if is_spawn_after(tracked) && !ran && fake().context_poisoned(at.context) => {}
            None => {
                if !at.reached() {
                    self.violation(format!(
                        "{}: its owners were dropped {when} before the work enqueued before it \
                         completed (stream {} at {:?}, needed {}), its context alive",
                        describe(tracked),
                        at.stream,
                        fake().stream_progress(at.stream),
                        at.before
                    ));
                } else if tracked.has_callback && !ran && !failed {
                    self.violation(format!(
                        "{}: its owners were dropped {when} without its callback having run, its \
                         context alive (a reclaim of a live context?)",
                        describe(tracked)
                    ));
                }
            }
        }
    }

    /// What still holds its owners and must not: every tracked piece of work whose owners were
    /// not dropped, but for a repeatable launch on a capturing stream while a capture may have
    /// been hidden from the crate's looks. A look after such a launch that sees no capture (or
    /// another) cannot tell that the launch went into the graph, and the crate keeps its record
    /// for good (`GraphOwnedRecord::settle`), as it must when another thread really ended the
    /// capture during the call. The finish's wait and its verdict both ask this, so that the wait
    /// does not wait for what is kept for good.
    pub fn owed(&self) -> Vec<Arc<Tracked>> {
        let tracked = self.tracked.lock().unwrap_or_else(|p| p.into_inner());
        let kept_for_good = |t: &Tracked| {
            !t.runs_once && t.capture.is_some() && t.capture_maybe_hidden.load(Ordering::Acquire)
        };
        tracked
            .iter()
            .filter(|t| t.owned.load(Ordering::Acquire) && t.dropped.load(Ordering::Acquire) == 0)
            .filter(|t| !kept_for_good(t))
            .cloned()
            .collect()
    }

    /// After the run, with every context gone: what was never released ([`Oracle::owed`]).
    pub fn check_all_released(&self) {
        let never = self.owed();
        for t in never.iter().take(20) {
            self.violation(format!(
                "{}: its owners were never dropped (every context is gone; failed call: {})",
                describe(t),
                t.failed.load(Ordering::Acquire)
            ));
        }
        if never.len() > 20 {
            self.violation(format!("... {} never dropped in all", never.len()));
        }
    }
}

/// A tracked piece of work in a message.
pub fn describe(tracked: &Tracked) -> String {
    format!(
        "#{} (t{} `{}`, stream {} after {}, context {})",
        tracked.id,
        tracked.thread,
        tracked.op,
        tracked.at.stream,
        tracked.at.before,
        tracked.at.context
    )
}

/// The owners handed to the crate: their `Drop` reports to the oracle.
pub struct Owner {
    /// The work.
    pub tracked: Arc<Tracked>,
    /// The oracle.
    pub oracle: Arc<Oracle>,
    /// Makes a context current in its `Drop` (what a binding's buffer does), so that the crate
    /// must clear it before the next owner.
    pub binds: Option<usize>,
    /// What else its `Drop` does: user code that must stall no completion (see [`Antics`]).
    pub antics: Antics,
}

/// What user code in an owner's `Drop` or a callback does beside its work: the classes of code
/// that must never stall the watching of completions (the crate runs it on the cleanup queue's
/// thread, never on a poller).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Antics {
    /// Nothing more.
    None,
    /// Blocks for a while (a lock, a slow free).
    Blocks,
    /// Awaits a completion of its thread's default stream in the context (made current first):
    /// only the poller can resolve it, which must not be the thread running this.
    Awaits(usize),
    /// Calls `flush`, which must return (never wait for its own thread).
    Flushes,
    /// Panics (the crate catches and reports it).
    Panics,
}

/// Held (shared) by user code that uses a context from the crate's reaper ([`Antics::Awaits`]),
/// and exclusively by a foreign reset: the driver's contract for `cuDevicePrimaryCtxReset` is that
/// nothing else uses the context meanwhile, and the reaper is not one of the harness's threads,
/// which the reset's own lock keeps out. (Without it, such an enqueue could take an event of its
/// pool just before the reset destroyed it, and record it after: the rare "event that no longer
/// exists" of seeds 990348, 6261473 and 1796567646.)
pub static USER_CODE_USES_A_CONTEXT: RwLock<()> = RwLock::new(());

/// The panic message of [`Antics::Panics`].
pub const ANTICS_PANIC: &str = "torture: user code panicked on purpose";

/// How the harness's panic hook names the payload of [`HookAntics::PanicsTwice`] (not a string).
pub const ANTICS_PAYLOAD_PANIC: &str = "<non-string panic>";

/// Whether the crate's panic report is of a panic the harness made on purpose: user code's, or a
/// start hook's payload that is not a string ([`HookAntics::PanicsTwice`]).
pub fn expected_report(report: &cuda_host_launch::PanicReport<'_>) -> bool {
    report.message == ANTICS_PANIC
        || (report.origin == cuda_host_launch::PanicOrigin::StartHook
            && report.message == "<non-string panic payload>")
}

/// A context a start hook may wait in ([`HookAntics::Waits`]): the last one a thread of the world
/// retained (its handle; a dead one is refused by the driver, and the fake never reuses one).
pub static HOOK_CONTEXT: AtomicUsize = AtomicUsize::new(0);

/// On the reaper, makes [`HOOK_CONTEXT`] current and leaves it so, as a panic handler that binds a
/// binding's context would (a dead handle is refused by the driver: then nothing changes).
pub fn handler_binds_a_context() {
    if std::thread::current().name() != Some(super::super::REAPER_NAME) {
        return;
    }
    let context = HOOK_CONTEXT.load(Ordering::Acquire);
    if let (Some(driver), true) = (cuda_dl_sys::Driver::get(), context != 0) {
        // SAFETY: any handle: a dead one is refused by the driver (the fake never reuses one).
        let _ = unsafe { driver.cuCtxSetCurrent(std::ptr::with_exposed_provenance_mut(context)) };
    }
}

/// A panic payload whose `Drop` panics too.
struct PanicsOnDrop;

impl Drop for PanicsOnDrop {
    fn drop(&mut self) {
        panic!("{ANTICS_PANIC}");
    }
}

/// What a start hook does on the crate thread `thread` as it starts; a violation if what must
/// return at once does not (it would stall the thread it starts).
pub fn hook_acts(hooks: HookAntics, thread: cuda_host_launch::CrateThread, oracle: &Oracle) {
    /// Clears [`IN_START_HOOK`] when the hook returns or panics.
    struct Inside;
    impl Drop for Inside {
        fn drop(&mut self) {
            IN_START_HOOK.with(|inside| inside.set(false));
        }
    }
    HOOKS_RUN[kind(thread)].fetch_add(1, Ordering::SeqCst);
    IN_START_HOOK.with(|inside| inside.set(true));
    let _inside = Inside;
    hook_acts_inside(hooks, thread, oracle);
}

thread_local! {
    /// The calling thread runs a start hook ([`hook_acts`]): user code the crate runs on its own
    /// thread, which may call the crate, and the crate then the name function, there.
    static IN_START_HOOK: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// What [`hook_acts`] does, inside the hook.
fn hook_acts_inside(hooks: HookAntics, thread: cuda_host_launch::CrateThread, oracle: &Oracle) {
    use cuda_host_launch::CrateThread;
    match hooks {
        HookAntics::Off => {}
        HookAntics::Blocks => std::thread::sleep(std::time::Duration::from_micros(300)),
        HookAntics::Flushes => {
            let result = cuda_host_launch::flush(std::time::Duration::from_secs(20));
            if !matches!(result, Err(Error::FlushOnCrateThread { .. })) {
                oracle.violation(format!(
                    "a flush in the start hook of {thread:?} returned {result:?}, not \
                     FlushOnCrateThread"
                ));
            }
        }
        HookAntics::Waits => {
            let context = HOOK_CONTEXT.load(Ordering::Acquire);
            if context == 0 {
                return;
            }
            // Not waited for: a reset waiting for the lock keeps new readers out, and the reaper's
            // hook may hold it while it awaits what the watcher (whose hook this may be) must
            // resolve. (Waiting for it deadlocked the two hooks and a reset: seed 4600359.)
            let Ok(_no_reset) = USER_CODE_USES_A_CONTEXT.try_read() else {
                return;
            };
            let Some(driver) = cuda_dl_sys::Driver::get() else {
                return;
            };
            // SAFETY: any handle: a dead one is refused (the fake never reuses one).
            if unsafe { driver.cuCtxSetCurrent(std::ptr::with_exposed_provenance_mut(context)) }
                .is_err()
            {
                return;
            }
            let made = cuda_host_launch::CompletionMode::Event
                .completion(cuda_host_launch::RawStream::PER_THREAD);
            if let Ok(future) = made {
                if thread == CrateThread::Watcher {
                    let result = future.wait();
                    if !matches!(result, Err(Error::WaitOnWatcher { .. })) {
                        oracle.violation(format!(
                            "a wait in the watcher's start hook returned {result:?}, not \
                             WaitOnWatcher"
                        ));
                    }
                } else if super::super::resolves_within(future, std::time::Duration::from_secs(20))
                    .is_none()
                {
                    oracle.violation(format!(
                        "a completion awaited in the start hook of {thread:?} never resolved"
                    ));
                }
            }
            // SAFETY: clearing the current context is always allowed.
            let _ = unsafe { driver.cuCtxSetCurrent(std::ptr::null_mut()) };
        }
        HookAntics::Panics => panic!("{ANTICS_PANIC}"),
        HookAntics::PanicsTwice => std::panic::panic_any(PanicsOnDrop),
    }
}

/// How many times the crate called the thread-name function of a run with hooks ([`name_acts`]),
/// for the reaper and for the watcher.
pub static NAMES_ASKED: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// How many start hooks ran ([`hook_acts`]), for the reaper and for the watcher: each thread
/// started was named first (a name may be asked for a thread another caller started meanwhile),
/// so never more than [`NAMES_ASKED`] of the same kind. Read after it ([`names_missing`]): a
/// thread started between the two reads adds its name before its hook.
pub static HOOKS_RUN: [AtomicU64; 2] = [AtomicU64::new(0), AtomicU64::new(0)];

/// The index of `thread` in [`NAMES_ASKED`] and [`HOOKS_RUN`].
fn kind(thread: cuda_host_launch::CrateThread) -> usize {
    usize::from(thread == cuda_host_launch::CrateThread::Watcher)
}

/// A violation for each kind of crate thread that ran more start hooks than names were asked.
pub fn names_missing() -> Vec<String> {
    use cuda_host_launch::CrateThread;
    [CrateThread::Reaper, CrateThread::Watcher]
        .into_iter()
        .filter_map(|thread| {
            let hooked = HOOKS_RUN[kind(thread)].load(Ordering::SeqCst);
            let named = NAMES_ASKED[kind(thread)].load(Ordering::SeqCst);
            (named < hooked).then(|| {
                format!(
                    "{hooked} start hooks of {thread:?} threads ran but the name function was \
                     asked for only {named}"
                )
            })
        })
        .collect()
}

/// The thread-name function of a run with start hooks (`ThreadSettings::name`): user code the
/// crate calls on the thread that starts one of its threads, with no lock of its own held. It
/// calls into the crate (`config`, and a `flush` that returns at once: either would wait for
/// ever if the crate held a lock they take), blocks for `Blocks`, and names the thread as the
/// default does (the harness knows the reaper by name). A violation if it runs on the watcher
/// (user code there stalls every stream) other than inside the watcher's own start hook (the
/// `waits` hook enqueues there, which may start the watcher: seed 7200086), or the crate's
/// configuration cannot be read in it.
pub fn name_acts(
    hooks: HookAntics,
    which: cuda_host_launch::CrateThread,
    oracle: &Oracle,
) -> String {
    NAMES_ASKED[kind(which)].fetch_add(1, Ordering::SeqCst);
    let watcher = cuda_host_launch::CrateThread::Watcher.default_name();
    if std::thread::current().name() == Some(watcher) && !IN_START_HOOK.with(|inside| inside.get())
    {
        oracle.violation(format!(
            "the name function for {which:?} ran on the watcher"
        ));
    }
    if let Err(error) = cuda_host_launch::config() {
        oracle.violation(format!("config() in the name function failed: {error}"));
    }
    // On the reaper (user code there starting a thread) it refuses at once; elsewhere it times
    // out at once or finds nothing pending.
    let _ = cuda_host_launch::flush(std::time::Duration::ZERO);
    if hooks == HookAntics::Blocks {
        std::thread::sleep(std::time::Duration::from_micros(300));
    }
    // The default names: the harness knows the reaper by its name, and the watcher check above
    // by the watcher's (another name here would turn that check off).
    which.default_name().to_string()
}

impl Antics {
    /// Does it, on the calling thread, if that is the crate's reaper (where the crate runs user
    /// code; on a user's thread, dropping owners of a failed enqueue, the antics would be the
    /// user's own business and would disturb the harness's thread); a violation if something
    /// that must return does not.
    pub fn act(self, oracle: &Oracle, what: &dyn Fn() -> String) {
        if std::thread::current().name() != Some(super::super::REAPER_NAME) {
            return;
        }
        match self {
            Antics::None => {}
            Antics::Blocks => std::thread::sleep(std::time::Duration::from_micros(300)),
            Antics::Awaits(context) => {
                let _no_reset = USER_CODE_USES_A_CONTEXT
                    .read()
                    .unwrap_or_else(|p| p.into_inner());
                let Some(driver) = cuda_dl_sys::Driver::get() else {
                    return;
                };
                // SAFETY: any handle: a dead one is refused (the fake never reuses one).
                if unsafe { driver.cuCtxSetCurrent(std::ptr::with_exposed_provenance_mut(context)) }
                    .is_err()
                {
                    return;
                }
                let Ok(future) = cuda_host_launch::CompletionMode::Event
                    .completion(cuda_host_launch::RawStream::PER_THREAD)
                else {
                    return;
                };
                if super::super::resolves_within(future, std::time::Duration::from_secs(20))
                    .is_none()
                {
                    oracle.violation(format!(
                        "{}: user code awaiting a completion never saw it resolve",
                        what()
                    ));
                }
            }
            Antics::Flushes => {
                let began = std::time::Instant::now();
                let result = cuda_host_launch::flush(std::time::Duration::from_secs(20));
                if matches!(result, Err(Error::FlushTimedOut { .. })) {
                    oracle.violation(format!(
                        "{}: a flush in user code timed out after {:?}",
                        what(),
                        began.elapsed()
                    ));
                }
            }
            Antics::Panics => panic!("{ANTICS_PANIC}"),
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        // The crate's releasing thread is the reaper; the threads that watch completions (the
        // pollers) never drop owners (user code). A `spawn_after` closure's captures go inside
        // the callback, in the stream's context.
        let name = std::thread::current().name().map(str::to_owned);
        if matches!(name.as_deref(), Some("cuda-hl-watch")) {
            self.oracle.violation(format!(
                "{}: its owners were dropped on {name:?}, a thread that watches completions",
                describe(&self.tracked)
            ));
        }
        let releasing = name.as_deref() == Some(super::super::REAPER_NAME);
        let in_callback = is_spawn_after(&self.tracked);
        let released = self.tracked.capture.is_none()
            && !in_callback
            && (self.tracked.ran.load(Ordering::Acquire) > 0 || !self.tracked.has_callback)
            && !self.tracked.failed.load(Ordering::Acquire);
        // (A record reclaimed after its context was lost makes no driver call: what is current
        // then is not promised.)
        let launch_that_ran = released
            && (self.tracked.runs_once || !self.tracked.has_callback)
            && !self.tracked.at.context_dead();
        if releasing && launch_that_ran {
            // A launch that ran: its owners are dropped with no context current (a graph's
            // records are not launches: the crate leaves the context as their `Drop` found it).
            if let Some(driver) = cuda_dl_sys::Driver::get() {
                let mut current = std::ptr::null_mut();
                // SAFETY: a valid out-pointer.
                if unsafe { driver.cuCtxGetCurrent(&mut current) }.is_ok() && !current.is_null() {
                    self.oracle.violation(format!(
                        "{}: its owners were dropped on {name:?} with a context current",
                        describe(&self.tracked)
                    ));
                }
            }
        }
        self.oracle.owners_dropped(&self.tracked);
        self.antics.act(&self.oracle, &|| describe(&self.tracked));
        if let (Some(context), Some(driver)) = (self.binds, cuda_dl_sys::Driver::get()) {
            // SAFETY: any handle: a dead one is refused by the driver (the fake never reuses one).
            let _ =
                unsafe { driver.cuCtxSetCurrent(std::ptr::with_exposed_provenance_mut(context)) };
        }
    }
}

/// A watched future: polled when woken, judged when it resolves.
pub struct Watched {
    /// The work it stands for.
    pub tracked: Arc<Tracked>,
    /// The future.
    pub future: Pin<Box<dyn Future<Output = Result<(), Error>> + Send>>,
    /// Set by its waker.
    pub woken: Arc<WakeFlag>,
    /// Whether it resolved.
    pub done: bool,
}

/// A waker that only counts.
#[derive(Debug, Default)]
pub struct WakeFlag {
    /// Wakes since the last poll.
    pub wakes: AtomicU32,
}

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::AcqRel);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.wakes.fetch_add(1, Ordering::AcqRel);
    }
}

impl Watched {
    /// Polls it (once); judges it if it resolved. `woken`: whether a wake came since the last poll
    /// (a future that resolves without having been woken would hang its task).
    pub fn poll(&mut self, oracle: &Oracle, last_look: bool) {
        if self.done {
            return;
        }
        let woken = self.woken.wakes.swap(0, Ordering::AcqRel) > 0;
        let waker = Waker::from(Arc::clone(&self.woken));
        let mut cx = Context::from_waker(&waker);
        match self.future.as_mut().poll(&mut cx) {
            Poll::Pending => {}
            Poll::Ready(result) => {
                self.done = true;
                if last_look && !woken {
                    oracle.violation(format!(
                        "{}: the future resolved but its waker was never woken",
                        describe(&self.tracked)
                    ));
                }
                self.judge(oracle, result);
            }
        }
    }

    fn judge(&self, oracle: &Oracle, result: Result<(), Error>) {
        let at = self.tracked.at;
        match result {
            Ok(()) => {
                if !at.reached() && !at.context_dead() {
                    oracle.violation(format!(
                        "{}: the future resolved before the work enqueued before it completed",
                        describe(&self.tracked)
                    ));
                }
            }
            Err(Error::ContextLost) => {
                if !at.context_dead() {
                    oracle.violation(format!(
                        "{}: the future resolved to ContextLost, its context alive",
                        describe(&self.tracked)
                    ));
                }
            }
            Err(Error::HostFunctionPanicked { .. }) => {}
            // A device fault is told only by a context that had one (`poison`), with the code
            // the driver answers for it (the fake's sticky error is always 719).
            Err(Error::DeviceFault { code, name }) => {
                if !fake().context_poisoned(at.context) {
                    oracle.violation(format!(
                        "{}: the future resolved to a device fault ({code}), its context never had one",
                        describe(&self.tracked)
                    ));
                }
                if (code, name) != (719, "CUDA_ERROR_LAUNCH_FAILED") {
                    oracle.violation(format!(
                        "{}: the device fault names {code} ({name}), not the driver's 719 \
                         (CUDA_ERROR_LAUNCH_FAILED)",
                        describe(&self.tracked)
                    ));
                }
            }
            Err(e) => oracle.violation(format!(
                "{}: the future resolved to an unexpected error: {e}",
                describe(&self.tracked)
            )),
        }
    }
}

/// Whether `tracked` is a `spawn_after` callback.
fn is_spawn_after(tracked: &Tracked) -> bool {
    matches!(
        tracked.op,
        super::script::Op::Work {
            kind: super::script::WorkKind::SpawnAfter,
            ..
        } | super::script::Op::Special {
            kind: super::script::WorkKind::SpawnAfter,
            ..
        }
    )
}
