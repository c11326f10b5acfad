//! The world a torture run's threads share: slots of contexts and streams (this crate's, another
//! binding's, created contexts'), captures, holds; and how each operation is carried out on it,
//! through the crate's public API or, for what other code does to the same driver, through raw
//! `cuda-dl-sys` calls.
//!
//! Every slot is a lock: an operation that uses a stream holds its slot's read lock for the whole
//! call (a raw handle stays valid while the crate uses it, as `AsRawStream` requires), and whatever
//! replaces, drops or captures a stream takes the write lock. A foreign reset takes the world's
//! own write lock, so nothing else runs while it tears the device's streams down.

use std::collections::VecDeque;
use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{
    CUcontext, CUdevice, CUgraph, CUgraphExec, CUstream, CUstreamCaptureMode,
};
use cuda_host_launch::{
    AsRawStream, CompletionMode, Device, Error, Graph, LaunchError, LaunchOptions, PrimaryContext,
    RawStream, Stream,
};

use super::super::fake;
use super::oracle::{Antics, CaptureRecord, Oracle, Owner, Position, Tracked, WakeFlag, Watched};
use super::script::{CONTEXT_SLOTS, DEVICES, FAULT_CALLS, Op, STREAM_SLOTS, Special, WorkKind};

/// What a stream slot holds.
enum Kind {
    /// This crate's `Stream`.
    Crate(Arc<Stream>),
    /// Another binding's stream of a primary context, with its own retain of it.
    Foreign { device: CUdevice },
    /// A stream of a context made with `cuCtxCreate`, which goes with it.
    Created { context: CUcontext },
}

struct Slot {
    kind: Kind,
    raw: CUstream,
    /// `cuStreamGetId`.
    id: u64,
    /// The stream's context: its handle and `cuCtxGetId`.
    context: CUcontext,
    context_id: u64,
    /// The capture the world began on it, if one runs.
    capture: Option<Arc<CaptureRecord>>,
}

// SAFETY: handles, which the driver accepts from any thread; the world serialises their use.
unsafe impl Send for Slot {}
// SAFETY: as above.
unsafe impl Sync for Slot {}

/// A capture a thread of the run began.
struct Capture {
    stream: u8,
    raw: CUstream,
    thread: usize,
    record: Arc<CaptureRecord>,
}

// SAFETY: as for `Slot`.
unsafe impl Send for Capture {}

/// What a callback checks when it runs.
struct Callback {
    tracked: Arc<Tracked>,
    oracle: Arc<Oracle>,
    /// For `spawn_after`: the context that must be current (its handle), on the cleanup queue's
    /// thread.
    poller_context: Option<usize>,
    /// What else a `spawn_after` callback does (user code on the lane: see [`Antics`]).
    antics: Antics,
}

impl Callback {
    fn run(&self) {
        self.oracle.callback_runs(&self.tracked);
        if let Some(context) = self.poller_context {
            let name = std::thread::current().name().map(str::to_owned);
            // User code never runs on a thread that watches completions: a callback runs on the
            // cleanup queue's thread (the reaper, or a drainer).
            if matches!(name.as_deref(), Some("cuda-hl-watch") | None) {
                self.oracle.violation(format!(
                    "{}: a spawn_after callback ran on {name:?}, not on the cleanup queue's thread",
                    super::oracle::describe(&self.tracked)
                ));
            }
            let driver = driver();
            let mut current = ptr::null_mut();
            // SAFETY: a valid out-pointer.
            if unsafe { driver.cuCtxGetCurrent(&mut current) }.is_ok()
                && current.addr() != context
                && !self.tracked.at.context_dead()
            {
                self.oracle.violation(format!(
                    "{}: a spawn_after callback ran without its stream's context current \
                     ({current:?} current, {context:#x} expected)",
                    super::oracle::describe(&self.tracked)
                ));
            }
            self.antics
                .act(&self.oracle, &|| super::oracle::describe(&self.tracked));
        }
    }
}

/// The C host function of `Raw` and `Bytes` work: `data` is a `Callback`.
unsafe extern "C" fn raw_callback(data: *mut c_void) {
    // SAFETY: the launch's owners (or, for bytes, the registry) keep the `Callback` alive.
    let callback = unsafe { &*data.cast::<Callback>() };
    callback.run();
}

/// The C host function of `Bytes` work: the bytes hold the address of a `Callback`.
unsafe extern "C" fn bytes_callback(data: *mut c_void) {
    let mut address = [0u8; size_of::<usize>()];
    // SAFETY: the crate's copy of the bytes, `size_of::<usize>()` long.
    unsafe { ptr::copy_nonoverlapping(data.cast::<u8>(), address.as_mut_ptr(), address.len()) };
    let callback = ptr::with_exposed_provenance::<Callback>(usize::from_ne_bytes(address));
    // SAFETY: a `Callback` kept alive in `World::kept` for the whole run.
    unsafe { (*callback).run() };
}

fn driver() -> &'static Driver {
    Driver::get().unwrap_or_else(|| super::super::load_fake_driver())
}

/// The world.
pub struct World {
    /// The verdicts.
    pub oracle: Arc<Oracle>,
    exclusive: RwLock<()>,
    contexts: Vec<RwLock<Option<Arc<PrimaryContext>>>>,
    streams: Vec<RwLock<Option<Slot>>>,
    /// Foreign retains of each device's primary context (beside those of foreign streams).
    foreign_retains: Vec<Mutex<u32>>,
    /// Held streams (stand-ins for long kernels) and when each ends on its own.
    holds: Mutex<VecDeque<(u64, Instant)>>,
    /// Set when the run is over: the hold keeper stops.
    over: AtomicBool,
    captures: Mutex<Vec<Capture>>,
    /// Whether a capture was ever hidden from a query (a run-once launch may then be captured).
    capture_hidden: AtomicBool,
    /// Callbacks of bytes launches, kept alive for the run (their bytes name them).
    kept: Mutex<Vec<Arc<Callback>>>,
    /// Futures handed over by threads that finished.
    futures: Mutex<Vec<Watched>>,
}

/// One thread's own state.
pub struct ThreadState {
    /// The thread's number in the script.
    pub index: usize,
    futures: Vec<Watched>,
    rng: super::script::Rng,
    /// The work this thread's last successful synchronize completed: a later `flush` that
    /// returns `Ok` must have dropped its owners.
    synced: Vec<Arc<Tracked>>,
}

impl ThreadState {
    /// The state of thread `index` of a run of `seed`.
    pub fn new(index: usize, seed: u64) -> ThreadState {
        ThreadState {
            index,
            futures: Vec::new(),
            synced: Vec::new(),
            rng: super::script::Rng::new(seed ^ (index as u64).wrapping_mul(0x5851_F42D_4C95_7F2D)),
        }
    }
}

/// Whether `tracked` is a `spawn_after`: its callback runs on the lane after the watcher saw its
/// event, so it need not have run when the sync returns.
fn is_spawn(tracked: &Tracked) -> bool {
    matches!(
        tracked.op,
        Op::Work {
            kind: WorkKind::SpawnAfter,
            ..
        } | Op::Special {
            kind: WorkKind::SpawnAfter,
            ..
        }
    )
}

fn stream_id(driver: &Driver, stream: CUstream) -> Option<u64> {
    let mut id = 0;
    // SAFETY: a valid stream (the caller holds its slot) and out-pointer.
    unsafe { driver.cuStreamGetId(stream, &mut id) }
        .ok()
        .map(|()| id)
}

fn context_id(driver: &Driver, context: CUcontext) -> Option<u64> {
    let mut id = 0;
    // SAFETY: a context handle; a valid out-pointer (a dead handle is refused).
    unsafe { driver.cuCtxGetId(context, &mut id) }
        .ok()
        .map(|()| id)
}

fn enqueued(stream: u64) -> u64 {
    fake().stream_progress(stream).map_or(0, |p| p.enqueued)
}

impl World {
    /// An empty world.
    pub fn new() -> World {
        World {
            oracle: Arc::new(Oracle::default()),
            exclusive: RwLock::new(()),
            contexts: (0..CONTEXT_SLOTS).map(|_| RwLock::new(None)).collect(),
            streams: (0..STREAM_SLOTS).map(|_| RwLock::new(None)).collect(),
            foreign_retains: (0..DEVICES).map(|_| Mutex::new(0)).collect(),
            holds: Mutex::new(VecDeque::new()),
            over: AtomicBool::new(false),
            captures: Mutex::new(Vec::new()),
            capture_hidden: AtomicBool::new(false),
            kept: Mutex::new(Vec::new()),
            futures: Mutex::new(Vec::new()),
        }
    }

    /// Carries out `op` for thread `me`.
    pub fn run(&self, op: Op, me: &mut ThreadState) {
        if let Op::ForeignReset { device } = op {
            let _all = self.exclusive.write().unwrap_or_else(|p| p.into_inner());
            self.foreign_reset(device);
            return;
        }
        let _shared = self.exclusive.read().unwrap_or_else(|p| p.into_inner());
        let driver = driver();
        match op {
            Op::Retain { device, ctx } => {
                let Ok(device) = Device::get(i32::from(device)) else {
                    return;
                };
                if let Ok(context) = PrimaryContext::retain(device) {
                    super::oracle::HOOK_CONTEXT.store(context.raw().addr(), Ordering::Release);
                    let old = lock_w(&self.contexts[usize::from(ctx)]).replace(context);
                    drop(old);
                }
            }
            Op::Release { ctx } => {
                let old = lock_w(&self.contexts[usize::from(ctx)]).take();
                drop(old);
            }
            Op::NewStream {
                ctx,
                stream,
                non_blocking,
            } => {
                let Some(context) = lock_r(&self.contexts[usize::from(ctx)]).clone() else {
                    return;
                };
                let made = if non_blocking {
                    Stream::new_non_blocking(&context)
                } else {
                    Stream::new(&context)
                };
                let Ok(made) = made else { return };
                let raw = made.raw();
                let (Some(id), Some(context_id)) =
                    (stream_id(driver, raw), context_id(driver, context.raw()))
                else {
                    return;
                };
                let slot = Slot {
                    kind: Kind::Crate(Arc::new(made)),
                    raw,
                    id,
                    context: context.raw(),
                    context_id,
                    capture: None,
                };
                self.replace_stream(stream, slot);
            }
            Op::DropStream { stream } => {
                let mut slot = lock_w(&self.streams[usize::from(stream)]);
                if slot.as_ref().is_some_and(|s| s.capture.is_some()) {
                    return;
                }
                if let Some(old) = slot.take() {
                    destroy(old);
                }
            }
            Op::ForeignRetain { device } => {
                let mut context = ptr::null_mut();
                // SAFETY: a valid out-pointer; a device ordinal the fake has.
                if unsafe { driver.cuDevicePrimaryCtxRetain(&mut context, CUdevice::from(device)) }
                    .is_ok()
                {
                    *lock(&self.foreign_retains[usize::from(device)]) += 1;
                }
            }
            Op::ForeignRelease { device } => {
                let mut count = lock(&self.foreign_retains[usize::from(device)]);
                if *count > 0 {
                    *count -= 1;
                    // SAFETY: a retain this world took.
                    let _ = unsafe { driver.cuDevicePrimaryCtxRelease_v2(CUdevice::from(device)) };
                }
            }
            Op::ForeignReset { .. } => {}
            Op::ForeignStream { device, stream } => {
                if let Some(slot) = foreign_stream(driver, CUdevice::from(device)) {
                    self.replace_stream(stream, slot);
                }
            }
            Op::CreatedStream { device, stream } => {
                if let Some(slot) = created_stream(driver, CUdevice::from(device)) {
                    self.replace_stream(stream, slot);
                }
            }
            Op::Work { kind, stream } => {
                let slot = lock_r(&self.streams[usize::from(stream)]);
                let Some(slot) = slot.as_ref() else { return };
                let at = Position {
                    stream: slot.id,
                    before: enqueued(slot.id),
                    context: slot.context_id,
                };
                let capture = slot.capture.clone();
                match &slot.kind {
                    Kind::Crate(s) => self.work(op, kind, &**s, at, slot.context, capture, me),
                    _ => {
                        // SAFETY: the slot's read lock keeps the stream alive during the call.
                        let raw = unsafe { RawStream::from_raw(slot.raw) };
                        self.work(op, kind, raw, at, slot.context, capture, me);
                    }
                }
            }
            Op::Special { kind, which, ctx } => {
                let Some(context) = lock_r(&self.contexts[usize::from(ctx)]).clone() else {
                    return;
                };
                if context.set_current().is_err() {
                    return;
                }
                let raw = match which {
                    Special::Legacy => RawStream::LEGACY,
                    Special::PerThread => RawStream::PER_THREAD,
                    Special::Null => RawStream::DEFAULT,
                };
                let (Some(id), Some(context_id)) = (
                    stream_id(driver, raw.raw()),
                    context_id(driver, context.raw()),
                ) else {
                    return;
                };
                let at = Position {
                    stream: id,
                    before: enqueued(id),
                    context: context_id,
                };
                self.work(op, kind, raw, at, context.raw(), None, me);
            }
            Op::Graph { stream, replays } => self.graph(op, stream, replays, me),
            Op::Sync { stream } => {
                let slot = lock_r(&self.streams[usize::from(stream)]);
                if let Some(slot) = slot.as_ref() {
                    let before = self.oracle.completed_by_a_sync(slot.id);
                    let synced = match &slot.kind {
                        Kind::Crate(s) => s.synchronize().is_ok(),
                        _ => {
                            // SAFETY: a live stream (the slot's read lock).
                            unsafe { driver.cuStreamSynchronize(slot.raw) }.is_ok()
                        }
                    };
                    // A host function counts once it ran (the sync saw it return).
                    me.synced = if synced {
                        before
                            .into_iter()
                            .filter(|t| {
                                !t.has_callback || t.ran.load(Ordering::Acquire) > 0 || is_spawn(t)
                            })
                            .collect()
                    } else {
                        Vec::new()
                    };
                }
            }
            Op::Flush => {
                if cuda_host_launch::flush(Duration::from_millis(100)).is_ok() {
                    self.oracle.check_flushed(&me.synced);
                }
            }
            Op::Drain => {
                cuda_host_launch::drain();
            }
            Op::Hold { stream } => {
                let slot = lock_r(&self.streams[usize::from(stream)]);
                if let Some(slot) = slot.as_ref()
                    && slot.capture.is_none()
                    && let Some(hold) = fake().hold_stream(slot.raw)
                {
                    // A kernel of up to 20 ms: it ends on its own (the hold keeper), or earlier.
                    let ends = Instant::now() + Duration::from_micros(me.rng.below(20_000));
                    lock(&self.holds).push_back((hold.into_token(), ends));
                }
            }
            Op::Unhold => {
                if let Some((token, _)) = lock(&self.holds).pop_front() {
                    fake().release_hold(token);
                }
            }
            Op::BeginCapture { stream, mode } => self.begin_capture(stream, mode, me.index),
            Op::EndCapture { replays } => self.end_capture(me.index, replays, false),
            Op::Poison { stream } => {
                let slot = lock_r(&self.streams[usize::from(stream)]);
                if let Some(slot) = slot.as_ref() {
                    let _ = fake().poison_context(slot.context);
                }
            }
            Op::Fault { call, nth } => {
                if let Some(name) = FAULT_CALLS.get(usize::from(call)) {
                    // CUDA_ERROR_OUT_OF_MEMORY.
                    fake().set_fault(name, u64::from(nth), 2);
                }
            }
            Op::HideCapture => {
                self.capture_hidden.store(true, Ordering::Release);
                fake().hide_capture(1);
            }
            Op::Poll => {
                for watched in &mut me.futures {
                    if watched.woken.wakes.load(Ordering::Acquire) > 0 {
                        watched.poll(&self.oracle, false);
                    }
                }
                me.futures.retain(|w| !w.done);
            }
            Op::Pause { micros } => std::thread::sleep(Duration::from_micros(u64::from(micros))),
            Op::Exit => std::process::exit(0),
        }
    }

    fn replace_stream(&self, stream: u8, slot: Slot) {
        let mut place = lock_w(&self.streams[usize::from(stream)]);
        if place.as_ref().is_some_and(|s| s.capture.is_some()) {
            // The old stream captures: keep it, drop the new one.
            destroy(slot);
            return;
        }
        if let Some(old) = place.replace(slot) {
            destroy(old);
        }
    }

    /// Makes the owners (and callback) of one piece of work.
    fn tracked(
        &self,
        op: Op,
        me: &ThreadState,
        at: Position,
        has_callback: bool,
        runs_once: bool,
        capture: Option<Arc<CaptureRecord>>,
    ) -> Arc<Tracked> {
        self.oracle
            .track(op, me.index, at, has_callback, runs_once, capture)
    }

    fn owner(&self, tracked: &Arc<Tracked>, me: &mut ThreadState, context: CUcontext) -> Owner {
        Owner {
            tracked: Arc::clone(tracked),
            oracle: Arc::clone(&self.oracle),
            binds: me.rng.percent(20).then_some(context.addr()),
            antics: antics(me, context),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn work<S: AsRawStream + Copy>(
        &self,
        op: Op,
        kind: WorkKind,
        stream: S,
        at: Position,
        context: CUcontext,
        capture: Option<Arc<CaptureRecord>>,
        me: &mut ThreadState,
    ) {
        let runs_once = !matches!(kind, WorkKind::Repeatable | WorkKind::ReleaseAfter);
        let has_callback = !matches!(kind, WorkKind::ReleaseAfter)
            && !matches!(
                kind,
                WorkKind::Auto | WorkKind::HostFunction | WorkKind::LowLatency | WorkKind::Event
            );
        let tracked = self.tracked(op, me, at, has_callback, runs_once, capture.clone());
        let callback = Arc::new(Callback {
            tracked: Arc::clone(&tracked),
            oracle: Arc::clone(&self.oracle),
            poller_context: (kind == WorkKind::SpawnAfter).then_some(context.addr()),
            antics: antics(me, context),
        });
        let result: Result<(), Refused> = match kind {
            WorkKind::Raw => {
                let owner = self.owner(&tracked, me, context);
                let data = Arc::as_ptr(&callback).cast_mut().cast::<c_void>();
                let keep = Arc::clone(&callback);
                // SAFETY: `raw_callback` reads the `Callback`, which the owners keep alive.
                unsafe {
                    cuda_host_launch::launch_host_function(
                        stream,
                        Some(raw_callback),
                        data,
                        (owner, keep),
                    )
                }
                .map_err(refused)
            }
            WorkKind::Bytes => {
                let address = Arc::as_ptr(&callback).expose_provenance().to_ne_bytes();
                lock(&self.kept).push(Arc::clone(&callback));
                // No owners: the callback is all there is to judge.
                self.oracle.owners_dropped_none(&tracked);
                // SAFETY: `bytes_callback` reads a `Callback` kept for the whole run.
                unsafe {
                    cuda_host_launch::launch_host_function_with_bytes(
                        stream,
                        Some(bytes_callback),
                        &address,
                    )
                }
                .map_err(|e| (e, None))
            }
            WorkKind::Closure => {
                let owner = self.owner(&tracked, me, context);
                // An owner that panics in its `Drop` makes its closure panic too: the crate
                // reports the host function's panic on the reaper before the owners are dropped.
                let panics = owner.antics == Antics::Panics;
                let callback = Arc::clone(&callback);
                cuda_host_launch::host_launch(stream, move || {
                    let _owner = &owner;
                    callback.run();
                    if panics {
                        panic!("{}", super::oracle::ANTICS_PANIC);
                    }
                })
                .map_err(refused)
            }
            WorkKind::Repeatable => {
                let owner = self.owner(&tracked, me, context);
                let callback = Arc::clone(&callback);
                LaunchOptions::default()
                    .host_launch_repeatable(stream, move || {
                        let _owner = &owner;
                        callback.run();
                    })
                    .map_err(refused)
            }
            WorkKind::Async => {
                let owner = self.owner(&tracked, me, context);
                let callback = Arc::clone(&callback);
                match cuda_host_launch::host_launch_async(stream, move || {
                    let _owner = &owner;
                    callback.run();
                }) {
                    Ok(future) => {
                        self.watch(me, &tracked, Box::pin(future));
                        Ok(())
                    }
                    Err(e) => Err(refused(e)),
                }
            }
            WorkKind::ReleaseAfter => {
                let owner = self.owner(&tracked, me, context);
                cuda_host_launch::release_after(stream, owner).map_err(refused)
            }
            WorkKind::SpawnAfter => {
                let mut owner = self.owner(&tracked, me, context);
                // Dropped as the callback unwinds if the callback panics: a second panic there
                // would abort the process (Rust's rule, not the crate's).
                if owner.antics == Antics::Panics {
                    owner.antics = Antics::None;
                }
                let callback = Arc::clone(&callback);
                cuda_host_launch::spawn_after(stream, move || {
                    callback.run();
                    drop(owner);
                })
                .map_err(refused)
            }
            WorkKind::Auto | WorkKind::HostFunction | WorkKind::LowLatency | WorkKind::Event => {
                let mode = match kind {
                    WorkKind::Auto => CompletionMode::Auto,
                    WorkKind::HostFunction => CompletionMode::HostFunction,
                    WorkKind::LowLatency => CompletionMode::LowLatency,
                    _ => CompletionMode::Event,
                };
                self.oracle.owners_dropped_none(&tracked);
                match mode.completion(stream) {
                    Ok(future) => {
                        self.watch(me, &tracked, Box::pin(future));
                        Ok(())
                    }
                    Err(e) => Err((e, None)),
                }
            }
        };
        let hidden = self.capture_hidden.load(Ordering::Acquire);
        let (result, handed_back) = split(result);
        self.oracle.call_returned(
            &tracked,
            result.as_ref().map(|_| ()),
            handed_back.is_some(),
            hidden,
        );
        // What a refused call handed back is the caller's: dropped here, after the verdict.
        drop(handed_back);
    }

    fn watch(
        &self,
        me: &mut ThreadState,
        tracked: &Arc<Tracked>,
        future: std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), Error>> + Send>>,
    ) {
        let mut watched = Watched {
            tracked: Arc::clone(tracked),
            future,
            woken: Arc::new(WakeFlag::default()),
            done: false,
        };
        watched.poll(&self.oracle, false);
        if !watched.done {
            me.futures.push(watched);
        }
    }

    fn graph(&self, op: Op, stream: u8, replays: u8, me: &mut ThreadState) {
        let slot = lock_r(&self.streams[usize::from(stream)]);
        let Some(slot) = slot.as_ref() else { return };
        if slot.capture.is_some() {
            return;
        }
        let Ok(graph) = Graph::new() else { return };
        let record = Arc::new(CaptureRecord::default());
        // Nothing enqueued before matters to a graph's node: its replays do (`replayed_before`).
        let at = Position {
            stream: slot.id,
            before: 0,
            context: slot.context_id,
        };
        let tracked = self.tracked(op, me, at, true, false, Some(Arc::clone(&record)));
        let owner = self.owner(&tracked, me, slot.context);
        let callback = Arc::new(Callback {
            tracked: Arc::clone(&tracked),
            oracle: Arc::clone(&self.oracle),
            poller_context: None,
            antics: Antics::None,
        });
        let added = cuda_host_launch::add_host_node(&graph, &[], move || {
            let _owner = &owner;
            callback.run();
        });
        let (added, handed_back) = split(added.map(|_| ()).map_err(refused));
        self.oracle.call_returned(
            &tracked,
            added.as_ref().map(|_| ()),
            handed_back.is_some(),
            false,
        );
        drop(handed_back);
        if added.is_err() {
            return;
        }
        if let Ok(exec) = graph.instantiate() {
            for _ in 0..replays {
                // A lower bound of the launch's place (other threads may enqueue meanwhile).
                let before = enqueued(slot.id);
                let launched = match &slot.kind {
                    Kind::Crate(s) => exec.launch(&**s),
                    // SAFETY: the slot's read lock keeps the stream alive.
                    _ => exec.launch(unsafe { RawStream::from_raw(slot.raw) }),
                };
                if launched.is_ok() {
                    record.replayed_before.store(before + 1, Ordering::Release);
                    record.replay_stream.store(slot.id, Ordering::Release);
                }
            }
            record.graph_gone.store(true, Ordering::Release);
            drop(exec);
        }
        record.graph_gone.store(true, Ordering::Release);
        drop(graph);
    }

    fn begin_capture(&self, stream: u8, mode: u8, me: usize) {
        let mut slot = lock_w(&self.streams[usize::from(stream)]);
        let Some(s) = slot.as_mut() else { return };
        if s.capture.is_some() {
            return;
        }
        let driver = driver();
        // SAFETY: a live stream (the slot's write lock); a valid mode.
        let begun = unsafe {
            driver.cuStreamBeginCapture_v2(s.raw, CUstreamCaptureMode(u32::from(mode % 3)))
        };
        if begun.is_err() {
            return;
        }
        let record = Arc::new(CaptureRecord::default());
        s.capture = Some(Arc::clone(&record));
        lock(&self.captures).push(Capture {
            stream,
            raw: s.raw,
            thread: me,
            record,
        });
    }

    /// Ends the oldest capture thread `me` began (`all`: every capture of `me`).
    pub fn end_capture(&self, me: usize, replays: u8, all: bool) {
        loop {
            let capture = {
                let mut captures = lock(&self.captures);
                let Some(i) = captures.iter().position(|c| c.thread == me) else {
                    return;
                };
                captures.remove(i)
            };
            let mut slot = lock_w(&self.streams[usize::from(capture.stream)]);
            let driver = driver();
            let mut graph: CUgraph = ptr::null_mut();
            // An invalidated capture's end destroys its graph (and lets go of what it owned)
            // inside the call: gone from here, unless the end succeeds.
            capture.record.graph_gone.store(true, Ordering::Release);
            // SAFETY: the stream this capture began on, still in its slot (a capturing stream is
            // never dropped); a valid out-pointer.
            let ended = unsafe { driver.cuStreamEndCapture(capture.raw, &mut graph) };
            if let Some(s) = slot.as_mut() {
                s.capture = None;
            }
            if ended.is_ok() && !graph.is_null() {
                capture.record.graph_gone.store(false, Ordering::Release);
                let mut exec: CUgraphExec = ptr::null_mut();
                // SAFETY: a graph the capture made; a valid out-pointer.
                let made = unsafe { driver.cuGraphInstantiateWithFlags(&mut exec, graph, 0) };
                if made.is_ok() {
                    if let Some(s) = slot.as_ref() {
                        for _ in 0..replays {
                            let before = enqueued(s.id);
                            // SAFETY: a live executable graph and stream.
                            if unsafe { driver.cuGraphLaunch(exec, s.raw) }.is_ok() {
                                capture
                                    .record
                                    .replayed_before
                                    .store(before + 1, Ordering::Release);
                                capture.record.replay_stream.store(s.id, Ordering::Release);
                            }
                        }
                    }
                    capture.record.graph_gone.store(true, Ordering::Release);
                    // SAFETY: made above, destroyed once.
                    let _ = unsafe { driver.cuGraphExecDestroy(exec) };
                }
                capture.record.graph_gone.store(true, Ordering::Release);
                // SAFETY: the capture's graph, destroyed once.
                let _ = unsafe { driver.cuGraphDestroy(graph) };
            } else {
                capture.record.graph_gone.store(true, Ordering::Release);
            }
            if !all {
                return;
            }
        }
    }

    fn foreign_reset(&self, device: u8) {
        let driver = driver();
        let dev = CUdevice::from(device);
        // The driver's contract: nothing of the context is used after the reset. Every stream of
        // the device goes first (unless one captures: then no reset).
        let mut slots: Vec<_> = self.streams.iter().map(lock_w).collect();
        let of_device = |s: &Slot| match &s.kind {
            Kind::Crate(stream) => stream.context().device().raw() == dev,
            Kind::Foreign { device } => *device == dev,
            Kind::Created { .. } => false,
        };
        if slots.iter().any(|s| {
            s.as_ref()
                .is_some_and(|s| of_device(s) && s.capture.is_some())
        }) {
            return;
        }
        for slot in &mut slots {
            if slot.as_ref().is_some_and(of_device)
                && let Some(old) = slot.take()
            {
                destroy(old);
            }
        }
        drop(slots);
        // A held stream stands for a kernel that runs until released: the reset would wait for
        // it, and the thread that releases it waits for this one.
        for (token, _) in lock(&self.holds).drain(..) {
            fake().release_hold(token);
        }
        // User code on the reaper that uses a context finishes first, and starts no more until
        // the reset is done (see the lock's docs); with the holds gone, what it awaits completes.
        let _alone = super::oracle::USER_CODE_USES_A_CONTEXT
            .write()
            .unwrap_or_else(|p| p.into_inner());
        // The crate's contract: no event of its in flight in the context (a raw reset destroys
        // them). Wait for its pending work of the context, unless that never completes. A look
        // that fails (an injected fault) tells nothing: no reset then, as a binding that cannot
        // tell whether the crate's work is done must not destroy it. (Resetting regardless
        // destroyed events the watcher still queried: CI seed 1796579363.)
        let mut state = (0, 0);
        // SAFETY: valid out-pointers.
        if unsafe { driver.cuDevicePrimaryCtxGetState(dev, &mut state.0, &mut state.1) }.is_err() {
            return;
        }
        if state.1 != 0 {
            let mut context = ptr::null_mut();
            // SAFETY: a valid out-pointer.
            if unsafe { driver.cuDevicePrimaryCtxRetain(&mut context, dev) }.is_err() {
                return;
            }
            let deadline = Instant::now() + Duration::from_millis(300);
            while cuda_host_launch::pending_launches(Some(context)) > 0 && Instant::now() < deadline
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            // SAFETY: retained just above.
            let _ = unsafe { driver.cuDevicePrimaryCtxRelease_v2(dev) };
        }
        // SAFETY: a device ordinal; the streams of the context are gone.
        let _ = unsafe { driver.cuDevicePrimaryCtxReset_v2(dev) };
    }

    /// Ends holds whose time is up, until the run is over: a held stream stands for a kernel,
    /// which ends on its own (and a context's destruction waits for it).
    pub fn keep_holds(&self) {
        while !self.over.load(Ordering::Acquire) {
            let now = Instant::now();
            let ended: Vec<u64> = {
                let mut holds = lock(&self.holds);
                let (done, kept): (Vec<_>, Vec<_>) =
                    holds.drain(..).partition(|(_, end)| *end <= now);
                holds.extend(kept);
                done.into_iter().map(|(token, _)| token).collect()
            };
            for token in ended {
                fake().release_hold(token);
            }
            std::thread::sleep(Duration::from_micros(500));
        }
    }

    /// A thread is done: its captures end, its futures go to the world for the final look.
    pub fn thread_done(&self, mut me: ThreadState) {
        self.end_capture(me.index, 0, true);
        lock(&self.futures).append(&mut me.futures);
    }

    /// After every thread is done: everything is let go (holds, streams, contexts, retains), and
    /// what must have happened by then is checked. Returns the violations.
    pub fn finish(&self, settings: &super::script::Settings) -> Vec<String> {
        let fake = fake();
        let driver = driver();
        fake.clear_faults();
        fake.hide_capture(0);
        self.over.store(true, Ordering::Release);
        for (token, _) in lock(&self.holds).drain(..) {
            fake.release_hold(token);
        }
        for slot in &self.streams {
            if let Some(s) = lock_r(slot).as_ref() {
                // SAFETY: a live stream.
                let _ = unsafe { driver.cuStreamSynchronize(s.raw) };
            }
        }
        let _ = cuda_host_launch::flush(Duration::from_secs(5));
        for slot in &self.streams {
            if let Some(old) = lock_w(slot).take() {
                destroy(old);
            }
        }
        for (device, count) in self.foreign_retains.iter().enumerate() {
            let mut count = lock(count);
            while *count > 0 {
                *count -= 1;
                // SAFETY: a retain this world took.
                let _ = unsafe { driver.cuDevicePrimaryCtxRelease_v2(device as CUdevice) };
            }
        }
        for slot in &self.contexts {
            let old = lock_w(slot).take();
            drop(old);
        }
        let mut futures = std::mem::take(&mut *lock(&self.futures));
        // Everything is gone: every owner must be dropped, every future resolved, and the crate
        // must hold no retain (its event pools gave theirs back). Bounded waits: the reaper and
        // the pollers work on their own.
        // With faults, what a failed call kept may never go: look briefly.
        let patience = if settings.faults { 1 } else { 10 };
        let deadline = Instant::now() + Duration::from_secs(patience);
        loop {
            let _ = cuda_host_launch::flush(Duration::from_millis(50));
            for watched in &mut futures {
                if watched.woken.wakes.load(Ordering::Acquire) > 0 {
                    watched.poll(&self.oracle, false);
                }
            }
            futures.retain(|w| !w.done);
            let released = self.oracle.owed().is_empty();
            let no_retains = (0..DEVICES).all(|d| !primary_active(driver, CUdevice::from(d)));
            // The crate reclaims a context's pending launches just after it lets go of its last
            // retain (the watcher's pool give-back, then its reclaim): not at the same instant.
            let none_pending = settings.faults || cuda_host_launch::pending_launches(None) == 0;
            if (released && futures.is_empty() && no_retains && none_pending)
                || Instant::now() >= deadline
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        if std::env::var_os("TORTURE_DEBUG").is_some() {
            eprintln!(
                "TORTURE DEBUG finish: live owners {}, futures {}, pending {}, active {:?}, retains(d0) {}, events {}",
                self.oracle.owed().len(),
                futures.len(),
                cuda_host_launch::pending_launches(None),
                (0..DEVICES)
                    .map(|d| primary_active(driver, CUdevice::from(d)))
                    .collect::<Vec<_>>(),
                fake.live_objects("primary_retains"),
                fake.live_objects("events"),
            );
            if std::env::var("TORTURE_DEBUG").as_deref() == Ok("stop")
                && !self.oracle.owed().is_empty()
            {
                eprintln!("TORTURE DEBUG stopped: pid {}", std::process::id());
                std::thread::sleep(Duration::from_secs(120));
            }
        }
        for watched in &mut futures {
            watched.poll(&self.oracle, true);
            if !watched.done && !settings.faults {
                self.oracle.violation(format!(
                    "{}: the future never resolved (every context is gone)",
                    super::oracle::describe(&watched.tracked)
                ));
            }
        }
        if !settings.faults {
            self.oracle.check_all_released();
            let pending = cuda_host_launch::pending_launches(None);
            if pending != 0 {
                // What the fake still has queued tells a host function stuck in its stream from
                // a launch the crate lost count of.
                self.oracle.violation(format!(
                    "{pending} launches still pending with every context gone (the fake: {} host \
                     functions not yet finished, {} events, {} primary retains)",
                    fake.pending_host_functions(std::ptr::null_mut()),
                    fake.live_objects("events"),
                    fake.live_objects("primary_retains"),
                ));
            }
            for d in 0..DEVICES {
                if primary_active(driver, CUdevice::from(d)) {
                    self.oracle.violation(format!(
                        "device {d}'s primary context is still retained (by the crate) with every \
                         user's retain released"
                    ));
                }
            }
        }
        // Each run is a process of its own, so the fake's count is this run's. The world makes no
        // event of its own: every event call is the crate's.
        let unknown = fake.unknown_event_calls();
        if unknown != 0 {
            self.oracle.violation(format!(
                "{unknown} event calls named an event that no longer exists (destroyed, or gone \
                 with its context): on the real driver the handle may name another event"
            ));
        }
        let invalidations = fake.invalidations_by("cuda-h");
        if invalidations != 0 {
            self.oracle.violation(format!(
                "{invalidations} captures invalidated by a thread of the crate"
            ));
        }
        self.oracle
            .violations
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

fn primary_active(driver: &Driver, device: CUdevice) -> bool {
    let (mut flags, mut active) = (0, 0);
    // SAFETY: valid out-pointers.
    unsafe { driver.cuDevicePrimaryCtxGetState(device, &mut flags, &mut active) }.is_ok()
        && active != 0
}

/// Destroys what a slot held: drops this crate's stream, or destroys a raw one (with its foreign
/// retain, or its created context, then reclaims that context's pending launches).
fn destroy(slot: Slot) {
    let driver = driver();
    match slot.kind {
        Kind::Crate(stream) => drop(stream),
        Kind::Foreign { device } => {
            // SAFETY: the slot's stream, destroyed once; then the retain it took.
            unsafe {
                let _ = driver.cuStreamDestroy_v2(slot.raw);
                let _ = driver.cuDevicePrimaryCtxRelease_v2(device);
            }
        }
        Kind::Created { context } => {
            // SAFETY: the slot's stream and context, destroyed once; the context is gone, so
            // none of its host functions can run any more.
            unsafe {
                let _ = driver.cuStreamDestroy_v2(slot.raw);
                if driver.cuCtxDestroy_v2(context).is_ok() {
                    cuda_host_launch::reclaim_pending(context);
                }
            }
        }
    }
}

fn foreign_stream(driver: &Driver, device: CUdevice) -> Option<Slot> {
    let mut context = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.cuDevicePrimaryCtxRetain(&mut context, device) }.ok()?;
    let release = || {
        // SAFETY: retained above.
        let _ = unsafe { driver.cuDevicePrimaryCtxRelease_v2(device) };
    };
    let Some(raw) = stream_in(driver, context) else {
        release();
        return None;
    };
    let (Some(id), Some(context_id)) = (stream_id(driver, raw), context_id(driver, context)) else {
        // SAFETY: made above.
        let _ = unsafe { driver.cuStreamDestroy_v2(raw) };
        release();
        return None;
    };
    Some(Slot {
        kind: Kind::Foreign { device },
        raw,
        id,
        context,
        context_id,
        capture: None,
    })
}

fn created_stream(driver: &Driver, device: CUdevice) -> Option<Slot> {
    let mut context = ptr::null_mut();
    // SAFETY: a valid out-pointer; the new context is pushed on this thread, popped below.
    unsafe { driver.cuCtxCreate_v2(&mut context, 0, device) }.ok()?;
    let mut popped = ptr::null_mut();
    // SAFETY: pushed by the create.
    let _ = unsafe { driver.cuCtxPopCurrent_v2(&mut popped) };
    let made = stream_in(driver, context)
        .and_then(|raw| Some((raw, stream_id(driver, raw)?, context_id(driver, context)?)));
    let Some((raw, id, context_id)) = made else {
        // SAFETY: made above, destroyed once.
        let _ = unsafe { driver.cuCtxDestroy_v2(context) };
        return None;
    };
    Some(Slot {
        kind: Kind::Created { context },
        raw,
        id,
        context,
        context_id,
        capture: None,
    })
}

/// A raw non-blocking stream of `context`.
fn stream_in(driver: &Driver, context: CUcontext) -> Option<CUstream> {
    // SAFETY: a live context (retained or created by the caller).
    unsafe { driver.cuCtxPushCurrent_v2(context) }.ok()?;
    let mut raw = ptr::null_mut();
    // SAFETY: a context is current; a valid out-pointer.
    let made = unsafe { driver.cuStreamCreate(&mut raw, 1) };
    let mut popped = ptr::null_mut();
    // SAFETY: pushed above.
    let _ = unsafe { driver.cuCtxPopCurrent_v2(&mut popped) };
    made.ok().map(|()| raw)
}

/// A refused call's error, with what it handed back (boxed: the caller drops it after the
/// oracle's verdict), if it did.
type Refused = (Error, Option<Box<dyn Send>>);

/// A [`LaunchError`] as the harness keeps it.
fn refused<T: Send + 'static>(error: LaunchError<T>) -> Refused {
    let (error, value) = error.into_parts();
    (error, value.map(|v| Box::new(v) as Box<dyn Send>))
}

/// A call's result, and what its error handed back.
fn split(result: Result<(), Refused>) -> (Result<(), Error>, Option<Box<dyn Send>>) {
    match result {
        Ok(()) => (Ok(()), None),
        Err((error, value)) => (Err(error), value),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn lock_r<T>(m: &RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(|p| p.into_inner())
}

fn lock_w<T>(m: &RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(|p| p.into_inner())
}

/// What user code (an owner's `Drop`, a callback) does beside its work: mostly nothing; else
/// each class of [`Antics`] about as often.
fn antics(me: &mut ThreadState, context: CUcontext) -> Antics {
    if !me.rng.percent(20) {
        return Antics::None;
    }
    match me.rng.below(4) {
        0 => Antics::Blocks,
        1 => Antics::Awaits(context.addr()),
        2 => Antics::Flushes,
        _ => Antics::Panics,
    }
}
