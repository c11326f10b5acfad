//! The GPU torture run's oracle: sequence numbers that kernels write into host-mapped memory.
//!
//! Every stream of the run (a *lane*) has a slot of host-mapped memory and a counter. Each
//! *position* on a lane is a `spin_then_write` kernel that writes the lane's next sequence number
//! into the slot; the operation enqueued after position `n` is [`Tracked`], and whatever it does
//! (its callback runs, its owners are dropped, its future resolves) must see the slot at `n` or
//! beyond. A lane's kernels run in stream order and the lane is locked from the position to the
//! end of the operation's enqueue, so its slot only grows: a judgement made when something
//! happens is never a false alarm.
//!
//! The other promises judged here: a run-once callback runs once, on a driver thread (a
//! `spawn_after` callback on the crate's event poller), never after its owners were dropped and
//! never for a call that failed; owners are dropped exactly once, never on a driver thread,
//! graph-owned ones only once their graph is gone; a launch's owners dropped by the crate's
//! releasing threads find no context current; futures resolve after their position and wake
//! their waker.
//!
//! User code of the test's (an owner's `Drop`, a `spawn_after` callback) sometimes does more than
//! its work, on the crate's reaper ([`Antics`]): blocks, awaits a completion of this crate, calls
//! `flush`, or panics. None of it may stall the watching of completions: the awaited future must
//! resolve, the flush must not time out, and every other promise above must still hold.

use std::collections::VecDeque;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU32, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{CUresult, CUstream};
use cuda_host_launch::{
    Completion, CompletionMode, Device, Error, HostLaunchFuture, PrimaryContext, RawStream,
};
use cuda_workspace::gpu::{Gpu, Kernels, MappedU32s};
use cuda_workspace::testing::{PATIENCE, REAPER_NAME, ThreadSet, load_fake_driver, thread_id};

use crate::Rng;

/// The crate's watcher thread (queries events and flags, wakes futures; runs no owner's `Drop`
/// and no callback).
pub const WATCHER: &str = "cuda-hl-watch";

/// Host-mapped slots (4 MiB): one per lane, a fresh one for every stream made during the run
/// (a slot is never reused: a destroyed stream's kernels may still write to it).
pub const SLOTS: usize = 1 << 20;

/// Slots kept for the lanes each round starts with: the streams made during a round stop being
/// made (those operations are skipped) when only these are left.
const RESERVED_SLOTS: usize = 4096;

/// The most violations kept (the count goes on).
const KEPT_VIOLATIONS: usize = 200;

/// Operations remembered per thread, for the report.
const LOG_LINES: usize = 48;

/// What the whole test shares, for the life of the process: owners and callbacks may outlive the
/// test's stack frame (dropped by the reaper after a failure).
pub struct Run {
    /// The driver.
    pub driver: &'static Driver,
    /// Device 0's primary context, retained for the life of the process.
    pub context: Arc<PrimaryContext>,
    positions: Positions,
    /// The lanes' slots.
    pub slots: MappedU32s,
    next_slot: AtomicUsize,
    /// The seed, for messages.
    pub seed: u64,
    /// The round under way, for messages.
    pub round: AtomicU32,
    violations: Mutex<Vec<String>>,
    violation_count: AtomicUsize,
    /// Threads that ran host functions (driver threads).
    pub driver_threads: ThreadSet,
    /// Threads without a name (foreign to this binary, as the driver's are) that dropped owners.
    pub drop_threads: ThreadSet,
    next_id: AtomicU64,
    logs: Mutex<Vec<(Arc<str>, Arc<Log>)>>,
    /// Counts by kind of what was enqueued and done, for the summary.
    pub stats: Stats,
}

static RUN: OnceLock<Run> = OnceLock::new();

/// The run (set up by [`Run::open`]).
pub fn run() -> &'static Run {
    RUN.get()
        .expect("the GPU torture run is set up before any work is enqueued")
}

/// How a position is written.
enum Positions {
    /// On the GPU: a `spin_then_write` kernel.
    Kernels(Kernels),
    /// On the fake driver, which runs no kernels: `cuStreamWriteValue32` (the length is ignored).
    ValueWrites,
}

impl Run {
    /// Opens the GPU (panics without a driver: a GPU test fails, never skips) and sets the run up.
    pub fn open(seed: u64) -> &'static Run {
        let Gpu {
            driver,
            context,
            kernels,
        } = Gpu::open();
        Run::set_up(seed, driver, context, Positions::Kernels(kernels))
    }

    /// Loads the fake driver and sets the run up, with value writes for kernels: checks the
    /// harness itself where no GPU is.
    pub fn open_on_fake(seed: u64) -> &'static Run {
        let driver = load_fake_driver();
        let context = PrimaryContext::retain(Device::get(0).expect("the fake's device 0"))
            .expect("the fake's primary context");
        context.set_current().expect("cuCtxSetCurrent");
        Run::set_up(seed, driver, context, Positions::ValueWrites)
    }

    fn set_up(
        seed: u64,
        driver: &'static Driver,
        context: Arc<PrimaryContext>,
        positions: Positions,
    ) -> &'static Run {
        let slots = MappedU32s::new(driver, SLOTS);
        let made = RUN.set(Run {
            driver,
            context,
            positions,
            slots,
            next_slot: AtomicUsize::new(0),
            seed,
            round: AtomicU32::new(0),
            violations: Mutex::new(Vec::new()),
            violation_count: AtomicUsize::new(0),
            driver_threads: ThreadSet::new(),
            drop_threads: ThreadSet::new(),
            next_id: AtomicU64::new(1),
            logs: Mutex::new(Vec::new()),
            stats: Stats::default(),
        });
        assert!(made.is_ok(), "one GPU torture run per process");
        run()
    }

    /// Makes the context current on the calling thread.
    pub fn bind_thread(&self) {
        self.context
            .set_current()
            .unwrap_or_else(|e| panic!("cuCtxSetCurrent: {e}"));
    }

    /// Enqueues a position on `stream`: once the work before it is done, `slot` becomes `value`
    /// (on the GPU after `cycles` clocks of spinning, about 2 GHz).
    ///
    /// # Errors
    /// The driver's, as text.
    pub fn write_position(
        &self,
        stream: CUstream,
        slot: usize,
        value: u32,
        cycles: u64,
    ) -> Result<(), String> {
        let address = self.slots.device(slot);
        match &self.positions {
            // The kernels' launch panics on an error (test support): caught, as text.
            Positions::Kernels(kernels) => std::panic::catch_unwind(AssertUnwindSafe(|| {
                kernels.spin_then_write(stream, address, value, cycles)
            }))
            .map_err(|panic| panic_text(&*panic)),
            // SAFETY: a live stream (the caller's); a mapped, 4-byte aligned address of ours.
            Positions::ValueWrites => unsafe {
                self.driver
                    .cuStreamWriteValue32_v2(stream, address, value, 0)
            }
            .map_err(|e| e.to_string()),
        }
    }

    /// A slot no lane used before, or `None` when all are used (the caller skips the operation).
    /// `reserved`: for a lane a round starts with, which may use the last [`RESERVED_SLOTS`].
    pub fn fresh_slot(&self, reserved: bool) -> Option<usize> {
        let limit = if reserved {
            SLOTS
        } else {
            SLOTS - RESERVED_SLOTS
        };
        self.next_slot
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |next| {
                (next < limit).then_some(next + 1)
            })
            .ok()
    }

    /// Waits (bounded: [`PATIENCE`]) until `stream` has nothing left to do, host functions
    /// included.
    ///
    /// # Errors
    /// What went wrong, as text: still busy after [`PATIENCE`], or the driver's error.
    pub fn wait_idle(&self, stream: CUstream) -> Result<(), String> {
        let deadline = Instant::now() + PATIENCE;
        loop {
            // SAFETY: a live stream (or the calling thread's per-thread default stream).
            match unsafe { self.driver.cuStreamQuery(stream) } {
                Ok(()) => return Ok(()),
                Err(e) if e.code() == Some(CUresult::CUDA_ERROR_NOT_READY) => {
                    if Instant::now() >= deadline {
                        return Err(format!("the stream was still busy after {PATIENCE:?}"));
                    }
                    std::thread::sleep(Duration::from_micros(100));
                }
                Err(e) => return Err(format!("cuStreamQuery: {e}")),
            }
        }
    }

    /// Records a violation.
    pub fn violation(&self, text: String) {
        let round = self.round.load(Ordering::Relaxed);
        self.violation_count.fetch_add(1, Ordering::AcqRel);
        let mut kept = lock(&self.violations);
        if kept.len() < KEPT_VIOLATIONS {
            kept.push(format!("[seed {} round {round}] {text}", self.seed));
        }
    }

    /// Whether any violation was seen (the threads then stop).
    pub fn failed(&self) -> bool {
        self.violation_count.load(Ordering::Acquire) > 0
    }

    /// The violations kept, and how many there were in all.
    pub fn violations(&self) -> (Vec<String>, usize) {
        (
            lock(&self.violations).clone(),
            self.violation_count.load(Ordering::Acquire),
        )
    }

    /// A number for a new tracked operation.
    pub fn next_id(&self) -> u64 {
        self.next_id.fetch_add(1, Ordering::Relaxed)
    }

    /// A new operation log for thread `name`, shown in the report.
    pub fn new_log(&self, name: &str) -> Arc<Log> {
        let log = Arc::new(Log::default());
        lock(&self.logs).push((name.into(), Arc::clone(&log)));
        log
    }

    /// Forgets the logs of the threads of the last round.
    pub fn clear_logs(&self) {
        lock(&self.logs).clear();
    }

    /// The last `lines` operations of every thread of this round (without waiting for a lock a
    /// stuck thread may hold).
    pub fn log_tails(&self, lines: usize) -> String {
        let Ok(logs) = self.logs.try_lock() else {
            return "(the logs are locked)".into();
        };
        let mut text = String::new();
        for (name, log) in logs.iter() {
            text.push_str(&format!("--- {name}: last operations, oldest first ---\n"));
            match log.0.try_lock() {
                Ok(entries) => {
                    let skip = entries.len().saturating_sub(lines);
                    for line in entries.iter().skip(skip) {
                        text.push_str(line);
                        text.push('\n');
                    }
                }
                Err(_) => text.push_str("(locked)\n"),
            }
        }
        text
    }
}

/// One thread's last operations.
#[derive(Default)]
pub struct Log(Mutex<VecDeque<String>>);

impl Log {
    /// Appends a line, forgetting the oldest beyond [`LOG_LINES`].
    pub fn note(&self, line: String) {
        let mut entries = lock(&self.0);
        if entries.len() == LOG_LINES {
            entries.pop_front();
        }
        entries.push_back(line);
    }
}

/// What was done, by kind.
#[derive(Default)]
pub struct Stats {
    counts: [AtomicU64; STAT_NAMES.len()],
}

/// The names of [`Stats`]'s counters.
pub const STAT_NAMES: [&str; 25] = [
    "host_launch",
    "launch_host_function",
    "launch_host_function_with_bytes",
    "host_launch_repeatable",
    "host_launch_async",
    "release_after",
    "spawn_after",
    "completion(Auto)",
    "completion(HostFunction)",
    "completion(LowLatency)",
    "completion(Event)",
    "graph host node",
    "capture ended valid",
    "captured repeatable launch",
    "refused on a capturing stream",
    "raw stream destroyed with work pending",
    "crate stream replaced",
    "flush",
    "drain",
    "raw primary retain/release",
    "antics: blocked",
    "antics: awaited",
    "antics: flushed",
    "antics: panicked",
    "antics: panic reported",
];

impl Stats {
    /// Adds one to counter `name` (one of [`STAT_NAMES`]).
    pub fn add(&self, name: &str) {
        if let Some(i) = STAT_NAMES.iter().position(|n| *n == name) {
            self.counts[i].fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counter `name` (one of [`STAT_NAMES`]; 0 for another).
    pub fn get(&self, name: &str) -> u64 {
        STAT_NAMES
            .iter()
            .position(|n| *n == name)
            .map_or(0, |i| self.counts[i].load(Ordering::Relaxed))
    }

    /// The counters, one `name: count` per entry.
    pub fn summary(&self) -> String {
        STAT_NAMES
            .iter()
            .zip(&self.counts)
            .map(|(name, count)| format!("{name}: {}", count.load(Ordering::Relaxed)))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// What a tracked operation is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `host_launch`.
    Closure,
    /// `launch_host_function` with a C function and owners.
    Raw,
    /// `launch_host_function_with_bytes` (no owners).
    Bytes,
    /// `LaunchOptions::host_launch_repeatable` on a stream that does not capture (runs once).
    Repeatable,
    /// `host_launch_async`, its future watched.
    Async,
    /// `release_after`.
    ReleaseAfter,
    /// `spawn_after`.
    SpawnAfter,
    /// A completion future in this mode (no owners, no callback).
    Completion(CompletionMode),
    /// `add_host_node` on a graph launched on the lane after its position.
    GraphNode,
    /// `host_launch_repeatable` on a capturing stream: a node of the capture's graph.
    CapturedRepeatable,
}

impl Kind {
    /// The name in [`STAT_NAMES`] and messages.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Closure => "host_launch",
            Kind::Raw => "launch_host_function",
            Kind::Bytes => "launch_host_function_with_bytes",
            Kind::Repeatable => "host_launch_repeatable",
            Kind::Async => "host_launch_async",
            Kind::ReleaseAfter => "release_after",
            Kind::SpawnAfter => "spawn_after",
            Kind::Completion(CompletionMode::Auto) => "completion(Auto)",
            Kind::Completion(CompletionMode::HostFunction) => "completion(HostFunction)",
            Kind::Completion(CompletionMode::LowLatency) => "completion(LowLatency)",
            Kind::Completion(CompletionMode::Event) => "completion(Event)",
            Kind::GraphNode => "graph host node",
            Kind::CapturedRepeatable => "captured repeatable launch",
        }
    }

    /// Whether it hands owners to the crate.
    pub fn owned(self) -> bool {
        !matches!(self, Kind::Bytes | Kind::Completion(_))
    }

    /// Whether it has a callback of the test's.
    pub fn has_callback(self) -> bool {
        !matches!(self, Kind::ReleaseAfter | Kind::Completion(_))
    }

    /// Whether its callback runs on a driver thread (a host function or a graph host node).
    fn on_driver_thread(self) -> bool {
        self.has_callback() && self != Kind::SpawnAfter
    }

    /// Whether its owners belong to a graph.
    pub fn graph_owned(self) -> bool {
        matches!(self, Kind::GraphNode | Kind::CapturedRepeatable)
    }

    /// Whether it is a launch whose owners the crate's releasing threads drop with no context
    /// current (DESIGN.md: a launch that ran; graphs' records and `spawn_after` captures are not).
    fn released_with_no_context(self) -> bool {
        matches!(
            self,
            Kind::Closure | Kind::Raw | Kind::Async | Kind::ReleaseAfter
        )
    }
}

const IN_CALL: u8 = 0;
const OK: u8 = 1;
const FAILED: u8 = 2;

/// What an owner saw when it was dropped, judged once its enqueuing call's result is known.
#[derive(Debug, Clone, Copy)]
struct DropSeen {
    slot: u32,
    ran: u32,
    graph_gone: bool,
}

/// One operation enqueued after a position, and what has happened to it.
pub struct Tracked {
    /// A number for messages (and the value an async launch returns).
    pub id: u64,
    /// The enqueuing thread.
    pub thread: Arc<str>,
    /// What it is.
    pub kind: Kind,
    /// The lane, for messages.
    pub lane: Arc<str>,
    /// The lane's slot.
    pub slot: usize,
    /// The sequence number the slot must have reached.
    pub after: u32,
    /// How many times its callback must run (graphs: the launches that succeeded).
    pub expected_runs: AtomicU32,
    ran: AtomicU32,
    dropped: AtomicU32,
    /// Set for a future once it resolved (or was judged never to).
    pub resolved: AtomicBool,
    /// Set once its graph (and every executable graph) is being destroyed.
    pub graph_gone: AtomicBool,
    returned: AtomicU8,
    drop_seen: Mutex<Option<DropSeen>>,
}

impl Tracked {
    /// A new operation of `kind` on `lane` after position `after`, its call in progress.
    pub fn new(
        thread: &Arc<str>,
        kind: Kind,
        lane: &Arc<str>,
        slot: usize,
        after: u32,
    ) -> Arc<Self> {
        run().stats.add(kind.name());
        Arc::new(Tracked {
            id: run().next_id(),
            thread: Arc::clone(thread),
            kind,
            lane: Arc::clone(lane),
            slot,
            after,
            expected_runs: AtomicU32::new(u32::from(kind.has_callback())),
            ran: AtomicU32::new(0),
            dropped: AtomicU32::new(0),
            resolved: AtomicBool::new(false),
            graph_gone: AtomicBool::new(false),
            returned: AtomicU8::new(IN_CALL),
            drop_seen: Mutex::new(None),
        })
    }

    /// The operation in a message.
    pub fn describe(&self) -> String {
        format!(
            "#{} ({} by {} on {} after {}, slot {} reads {})",
            self.id,
            self.kind.name(),
            self.thread,
            self.lane,
            self.after,
            self.slot,
            run().slots.get(self.slot)
        )
    }

    fn violation(&self, what: &str) {
        run().violation(format!("{}: {what}", self.describe()));
    }

    /// Its enqueuing call returned (`ok`: successfully).
    pub fn returned(&self, ok: bool) {
        let mut seen = lock(&self.drop_seen);
        self.returned
            .store(if ok { OK } else { FAILED }, Ordering::Release);
        if let Some(seen) = seen.take() {
            self.judge_drop(seen, ok);
        }
    }

    /// Whether its call returned successfully.
    pub fn accepted(&self) -> bool {
        self.returned.load(Ordering::Acquire) == OK
    }

    /// How many times its callback ran so far.
    pub fn runs(&self) -> u32 {
        self.ran.load(Ordering::Acquire)
    }

    /// Its callback runs now: judged, then counted (the count is the last thing it does, so a
    /// count reached means every run so far is over).
    pub fn callback(&self) {
        let run = run();
        let name = std::thread::current().name().map(str::to_owned);
        if self.kind.on_driver_thread() {
            run.driver_threads.insert_current();
            if let Some(name) = &name {
                self.violation(&format!(
                    "its host function ran on {name:?}, not on a driver thread"
                ));
            }
        } else if matches!(name.as_deref(), Some(WATCHER) | None) {
            // User code never runs on a thread that watches completions (nor a driver's): a
            // callback runs on the cleanup queue's thread (the reaper, or a drainer).
            self.violation(&format!(
                "its spawn_after callback ran on {name:?}, not on the cleanup queue's thread"
            ));
        }
        let slot = run.slots.get(self.slot);
        if slot < self.after {
            self.violation(&format!(
                "its callback ran before its stream got there (slot {slot}, needed {})",
                self.after
            ));
        }
        if self.kind.owned() && self.dropped.load(Ordering::Acquire) > 0 {
            self.violation("its callback ran after its owners were dropped");
        }
        if self.returned.load(Ordering::Acquire) == FAILED {
            self.violation("its callback ran although its enqueuing call failed");
        }
        if self.kind.graph_owned() && self.graph_gone.load(Ordering::Acquire) {
            self.violation("its graph node ran after its graph was destroyed");
        }
        let before = self.ran.fetch_add(1, Ordering::AcqRel);
        if before > 0 && !self.kind.graph_owned() {
            self.violation(&format!("its callback ran {} times", before + 1));
        }
    }

    /// Its owners are dropped now, on this thread.
    fn owners_dropped(&self) {
        let run = run();
        let name = std::thread::current().name().map(str::to_owned);
        if name.is_none() {
            // Every thread of this binary has a name (the test's, the crate's); the driver's have
            // none. Only these are counted, so the set stays small however many rounds run.
            run.drop_threads.insert_current();
        }
        if name.is_none() || run.driver_threads.ids().contains(&thread_id()) {
            self.violation(&format!(
                "its owners were dropped on a driver thread ({name:?})"
            ));
        }
        if matches!(name.as_deref(), Some(WATCHER)) {
            self.violation(&format!(
                "its owners were dropped on {name:?}, a thread that watches completions"
            ));
        }
        let before = self.dropped.fetch_add(1, Ordering::AcqRel);
        if before > 0 {
            self.violation(&format!("its owners were dropped {} times", before + 1));
            return;
        }
        let releasing = name.as_deref() == Some(REAPER_NAME);
        if releasing && self.kind.released_with_no_context() && self.accepted() {
            let mut current = std::ptr::null_mut();
            // SAFETY: a valid out-pointer.
            let asked = unsafe { run.driver.cuCtxGetCurrent(&mut current) };
            if asked.is_ok() && !current.is_null() {
                self.violation(&format!(
                    "its owners were dropped on {name:?} with a context current ({current:?})"
                ));
            }
        }
        let seen = DropSeen {
            slot: run.slots.get(self.slot),
            ran: self.ran.load(Ordering::Acquire),
            graph_gone: self.graph_gone.load(Ordering::Acquire),
        };
        let mut waiting = lock(&self.drop_seen);
        match self.returned.load(Ordering::Acquire) {
            IN_CALL => *waiting = Some(seen),
            result => self.judge_drop(seen, result == OK),
        }
    }

    fn judge_drop(&self, seen: DropSeen, accepted: bool) {
        if !accepted {
            // A refused call's owners may go at any time (once, off the driver threads).
            return;
        }
        if self.kind.graph_owned() {
            if !seen.graph_gone {
                self.violation("its owners were dropped while its graph lives");
            }
            return;
        }
        if seen.slot < self.after {
            self.violation(&format!(
                "its owners were dropped before its stream got there (slot {}, needed {})",
                seen.slot, self.after
            ));
        } else if self.kind.has_callback() && seen.ran == 0 {
            self.violation("its owners were dropped before its callback ran");
        }
    }

    /// Whether everything it must do has happened (it can be forgotten: what could still go
    /// wrong, a second run or drop, is judged when it happens).
    pub fn settled(&self) -> bool {
        let returned = self.returned.load(Ordering::Acquire);
        if returned == IN_CALL {
            return false;
        }
        if self.kind.owned() && self.dropped.load(Ordering::Acquire) == 0 {
            return false;
        }
        if returned == OK && self.runs() < self.expected_runs.load(Ordering::Acquire) {
            return false;
        }
        !matches!(self.kind, Kind::Async | Kind::Completion(_))
            || returned != OK
            || self.resolved.load(Ordering::Acquire)
    }

    /// Why it is not settled, or ran more often than it should have, once nothing more will
    /// happen; `None` if all is well.
    pub fn final_verdict(&self) -> Option<String> {
        let returned = self.returned.load(Ordering::Acquire);
        let runs = self.runs();
        let expected = self.expected_runs.load(Ordering::Acquire);
        let dropped = self.dropped.load(Ordering::Acquire);
        let mut wrong = Vec::new();
        if returned == FAILED && runs > 0 {
            wrong.push(format!("its call failed but its callback ran {runs} times"));
        }
        if returned == OK && runs < expected {
            wrong.push(format!("its callback ran {runs} of {expected} times"));
        }
        if returned == OK && runs > expected {
            wrong.push(format!(
                "its callback ran {runs} times, {expected} expected"
            ));
        }
        if self.kind.owned() && dropped == 0 {
            wrong.push("its owners were never dropped".into());
        }
        if matches!(self.kind, Kind::Async | Kind::Completion(_))
            && returned == OK
            && !self.resolved.load(Ordering::Acquire)
        {
            wrong.push("its future never resolved".into());
        }
        (!wrong.is_empty()).then(|| format!("{}: {}", self.describe(), wrong.join("; ")))
    }
}

/// The owners handed to the crate: their `Drop` reports to the oracle. Some make the primary
/// context current in their `Drop`, as a binding's device buffer does (the crate must clear it
/// before the next launch's owners on its releasing threads); some do more ([`Antics`]).
pub struct Owner {
    tracked: Arc<Tracked>,
    binds: bool,
    antics: Antics,
}

impl Owner {
    /// An owner of `tracked`'s operation, whose `Drop` also does `antics`.
    pub fn new(tracked: &Arc<Tracked>, binds: bool, antics: Antics) -> Owner {
        Owner {
            tracked: Arc::clone(tracked),
            binds,
            antics,
        }
    }
}

impl Drop for Owner {
    fn drop(&mut self) {
        self.tracked.owners_dropped();
        self.antics.act(&self.tracked);
        if self.binds {
            let run = run();
            // SAFETY: the test's primary context, retained for the life of the process.
            let _ = unsafe { run.driver.cuCtxSetCurrent(run.context.raw()) };
        }
    }
}

/// What user code (an owner's `Drop`, a `spawn_after` callback) does beside its work: the classes
/// of code that must never stall the watching of completions (the crate runs it on its reaper,
/// never on the watcher). As the fake-driver harness's (`testing::torture::oracle::Antics`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Antics {
    /// Nothing more.
    None,
    /// Blocks for a while (a lock, a slow free).
    Blocks,
    /// Awaits a completion of the reaper's per-thread default stream in the run's context (made
    /// current first): only the watcher can resolve it, and it must, within [`AWAIT_LIMIT`].
    Awaits,
    /// Calls `flush`, which must return at once (never wait for its own thread), not time out.
    Flushes,
    /// Panics with [`ANTICS_PANIC`] (the crate catches and reports it).
    Panics,
}

/// The panic message of [`Antics::Panics`] (the only panic the run expects).
pub const ANTICS_PANIC: &str = "gpu torture: user code panicked on purpose";

/// How long an [`Antics::Awaits`] waits for its future, and an [`Antics::Flushes`] flushes.
pub const AWAIT_LIMIT: Duration = Duration::from_secs(20);

impl Antics {
    /// Mostly (80 %) nothing; else each of the others about as often.
    pub fn pick(rng: &mut Rng) -> Antics {
        if !rng.percent(20) {
            return Antics::None;
        }
        match rng.below(4) {
            0 => Antics::Blocks,
            1 => Antics::Awaits,
            2 => Antics::Flushes,
            _ => Antics::Panics,
        }
    }

    /// The antics of an operation of `kind`: its owner's, and its callback's if that runs on
    /// the reaper (`spawn_after`; the others' run on driver threads, where none are done).
    pub fn pick_for(kind: Kind, rng: &mut Rng) -> (Antics, Antics) {
        let owner = Antics::pick(rng);
        let callback = if kind == Kind::SpawnAfter {
            Antics::pick(rng)
        } else {
            Antics::None
        };
        (owner, callback)
    }

    /// Does it, on the calling thread, if that is the crate's reaper (where the crate runs user
    /// code; on a user's thread, dropping owners a failed call handed back or draining, the
    /// antics would be the user's own business and would disturb the test's thread); counted in
    /// [`Stats`]; a violation of `t`'s if what must return does not.
    pub fn act(self, t: &Tracked) {
        if self == Antics::None || std::thread::current().name() != Some(REAPER_NAME) {
            return;
        }
        let run = run();
        match self {
            Antics::None => {}
            Antics::Blocks => {
                run.stats.add("antics: blocked");
                std::thread::sleep(Duration::from_micros(300));
            }
            Antics::Awaits => {
                run.stats.add("antics: awaited");
                // SAFETY: the test's primary context, retained for the life of the process.
                if let Err(e) = unsafe { run.driver.cuCtxSetCurrent(run.context.raw()) } {
                    t.violation(&format!("user code on the reaper: cuCtxSetCurrent: {e}"));
                    return;
                }
                match CompletionMode::Event.completion(RawStream::PER_THREAD) {
                    Err(e) => t.violation(&format!(
                        "user code on the reaper could not make an Event completion: {e}"
                    )),
                    Ok(future) => {
                        match cuda_workspace::testing::resolves_within(future, AWAIT_LIMIT) {
                            Some(Ok(())) => {}
                            Some(Err(e)) => t.violation(&format!(
                                "user code on the reaper awaiting an Event completion of its own \
                             per-thread stream saw it resolve to an error: {e}"
                            )),
                            None => t.violation(&format!(
                                "user code on the reaper awaiting an Event completion of its own \
                             per-thread stream never saw it resolve in {AWAIT_LIMIT:?}"
                            )),
                        }
                    }
                }
            }
            Antics::Flushes => {
                run.stats.add("antics: flushed");
                let began = Instant::now();
                if let Err(e @ Error::FlushTimedOut { .. }) = cuda_host_launch::flush(AWAIT_LIMIT) {
                    t.violation(&format!(
                        "a flush in user code on the reaper timed out after {:?}: {e}",
                        began.elapsed()
                    ));
                }
            }
            Antics::Panics => {
                run.stats.add("antics: panicked");
                panic!("{ANTICS_PANIC}");
            }
        }
    }
}

/// A future of the crate: a completion, or an async launch's value.
pub enum Pending {
    /// A completion in some mode.
    Done(Completion),
    /// `host_launch_async`'s future, which gives the operation's id back.
    Value(HostLaunchFuture<u64>),
}

/// A waker that counts its wakes.
#[derive(Default)]
struct WakeFlag(AtomicU32);

impl Wake for WakeFlag {
    fn wake(self: Arc<Self>) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }

    fn wake_by_ref(self: &Arc<Self>) {
        self.0.fetch_add(1, Ordering::AcqRel);
    }
}

/// A future being watched: polled when woken, judged when it resolves.
pub struct Watched {
    tracked: Arc<Tracked>,
    future: Pending,
    woken: Arc<WakeFlag>,
}

impl Watched {
    /// Watches `future`, polling it once now (which registers the waker).
    pub fn new(tracked: &Arc<Tracked>, future: Pending) -> Watched {
        let mut watched = Watched {
            tracked: Arc::clone(tracked),
            future,
            woken: Arc::default(),
        };
        watched.poll();
        watched
    }

    /// Whether it resolved (and was judged).
    pub fn done(&self) -> bool {
        self.tracked.resolved.load(Ordering::Acquire)
    }

    /// Whether its waker was woken since the last poll.
    pub fn woken(&self) -> bool {
        self.woken.0.load(Ordering::Acquire) > 0
    }

    /// Polls it once; judges it if it resolved. Returns whether it is done.
    pub fn poll(&mut self) -> bool {
        if self.done() {
            return true;
        }
        self.woken.0.store(0, Ordering::Release);
        let waker = Waker::from(Arc::clone(&self.woken));
        let mut cx = Context::from_waker(&waker);
        let outcome = match &mut self.future {
            Pending::Done(f) => match Pin::new(f).poll(&mut cx) {
                Poll::Ready(r) => Some(r.map(|()| None)),
                Poll::Pending => None,
            },
            Pending::Value(f) => match Pin::new(f).poll(&mut cx) {
                Poll::Ready(r) => Some(r.map(Some)),
                Poll::Pending => None,
            },
        };
        match outcome {
            Some(result) => {
                self.judge(result);
                true
            }
            None => false,
        }
    }

    fn judge(&self, result: Result<Option<u64>, Error>) {
        let t = &self.tracked;
        t.resolved.store(true, Ordering::Release);
        match result {
            Err(e) => t.violation(&format!("its future resolved to an error: {e}")),
            Ok(value) => {
                let slot = run().slots.get(t.slot);
                if slot < t.after {
                    t.violation(&format!(
                        "its future resolved before its stream got there (slot {slot}, needed {})",
                        t.after
                    ));
                }
                if let Some(value) = value {
                    if value != t.id {
                        t.violation(&format!("its future gave {value}, not {}", t.id));
                    }
                    if t.runs() == 0 {
                        t.violation("its future resolved before its closure ran");
                    }
                }
            }
        }
    }
}

/// Waits for `futures` to resolve, polling each when its waker is woken, until `deadline`; then
/// judges what is left: resolved without a wake (a task would hang), or never resolved.
pub fn finish_futures(futures: &mut Vec<Watched>, deadline: Instant) {
    loop {
        for watched in futures.iter_mut() {
            if watched.woken() {
                watched.poll();
            }
        }
        futures.retain(|w| !w.done());
        if futures.is_empty() || Instant::now() >= deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
    for mut watched in futures.drain(..) {
        if watched.poll() {
            watched
                .tracked
                .violation("its future had resolved, but its waker was never woken");
        } else {
            watched.tracked.resolved.store(true, Ordering::Release);
            watched
                .tracked
                .violation("its future never resolved (nor woke its waker)");
        }
    }
}

/// A panic's message.
pub fn panic_text(panic: &(dyn std::any::Any + Send)) -> String {
    panic
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_string()))
        .unwrap_or_else(|| "(not a string)".into())
}

/// Locks `mutex`, poisoned or not (a thread that panicked is reported apart).
pub fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}
