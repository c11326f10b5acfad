//! A worker thread of the GPU torture run: random operations of the crate's public API on lanes
//! (streams with a sequence slot), its own and shared ones, mixed with what other code does to the
//! same driver through raw calls (primary-context retains and releases, raw streams destroyed with
//! work pending, stream handles of other bindings), flushes and drains.

use std::ffi::c_void;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::CUstream;
use cuda_host_launch::{
    AsRawStream, CompletionMode, Error, Graph, GraphExec, LaunchOptions, PrimaryContext, RawStream,
    Stream,
};
use cuda_workspace::testing::PATIENCE;

use crate::Rng;
use crate::oracle::{
    Antics, Kind, Log, Owner, Pending, Tracked, Watched, finish_futures, lock, run,
};

/// How far a lane's enqueued positions may run ahead of its kernels before its thread waits.
const AHEAD: u32 = 256;

/// A stream with a sequence slot: each position is a kernel that writes the lane's next number.
pub struct Lane {
    /// For messages: the stream's kind and number.
    pub label: Arc<str>,
    stream: LaneStream,
    slot: usize,
    seq: u32,
}

enum LaneStream {
    /// This crate's stream.
    Crate(Stream),
    /// A raw handle: another binding's stream (`cuStreamCreate`), or a special handle.
    Raw(RawStream),
}

impl Lane {
    /// A new non-blocking stream of this crate, or `None` if no slot is left (`reserved`: see
    /// [`Run::fresh_slot`](crate::oracle::Run::fresh_slot)).
    pub fn new_crate(label: String, reserved: bool) -> Option<Lane> {
        let run = run();
        let slot = run.fresh_slot(reserved)?;
        let stream = Stream::new_non_blocking(&run.context)
            .unwrap_or_else(|e| panic!("Stream::new_non_blocking: {e}"));
        Some(Lane {
            label: label.into(),
            stream: LaneStream::Crate(stream),
            slot,
            seq: 0,
        })
    }

    /// A lane on a raw handle (valid for as long as the lane is used), or `None` if no slot is
    /// left (`reserved`: see [`Run::fresh_slot`](crate::oracle::Run::fresh_slot)).
    pub fn new_raw(label: String, stream: RawStream, reserved: bool) -> Option<Lane> {
        Some(Lane {
            label: label.into(),
            stream: LaneStream::Raw(stream),
            slot: run().fresh_slot(reserved)?,
            seq: 0,
        })
    }

    fn stream(&self) -> &dyn AsRawStream {
        match &self.stream {
            LaneStream::Crate(s) => s,
            LaneStream::Raw(s) => s,
        }
    }

    fn raw(&self) -> CUstream {
        self.stream().as_raw_stream()
    }

    /// Enqueues the next position (a kernel of `cycles` GPU clocks writing the next number) and
    /// returns its number. Waits first (bounded) if the lane's kernels are far behind.
    fn position(&mut self, cycles: u64) -> u32 {
        let run = run();
        let behind = |lane: &Lane| lane.seq.saturating_sub(run.slots.get(lane.slot));
        if behind(self) >= AHEAD {
            let deadline = Instant::now() + PATIENCE;
            while behind(self) > AHEAD / 4 {
                if Instant::now() >= deadline {
                    run.violation(format!(
                        "{}: its kernels are stuck (slot {} reads {}, {} enqueued) for {PATIENCE:?}",
                        self.label,
                        self.slot,
                        run.slots.get(self.slot),
                        self.seq
                    ));
                    break;
                }
                std::thread::sleep(Duration::from_micros(100));
            }
        }
        self.seq += 1;
        if let Err(e) = run.write_position(self.raw(), self.slot, self.seq, cycles) {
            // What follows would be judged against a number never written.
            panic!("{}: position {} not enqueued: {e}", self.label, self.seq);
        }
        self.seq
    }
}

/// A C host function: `data` is a `Tracked` that the launch's owners keep alive.
unsafe extern "C" fn raw_callback(data: *mut c_void) {
    // SAFETY: the owners of the launch hold an `Arc` of it until after this returns.
    let tracked = unsafe { &*data.cast::<Tracked>() };
    tracked.callback();
}

/// A C host function whose bytes hold the address of a `Tracked` kept for the whole process.
unsafe extern "C" fn bytes_callback(data: *mut c_void) {
    let mut address = [0u8; size_of::<usize>()];
    // SAFETY: the crate's copy of the bytes, `size_of::<usize>()` long.
    unsafe {
        std::ptr::copy_nonoverlapping(data.cast::<u8>(), address.as_mut_ptr(), address.len())
    };
    let tracked = std::ptr::with_exposed_provenance::<Tracked>(usize::from_ne_bytes(address));
    // SAFETY: a `Tracked` leaked (one `Arc` forgotten) when it was launched.
    unsafe { (*tracked).callback() };
}

/// A graph with a host node, launched, kept until its node ran as often as it was launched.
struct LiveGraph {
    /// Dropped with the entry, after `exec`.
    _graph: Graph,
    exec: Option<GraphExec>,
    tracked: Arc<Tracked>,
}

/// A worker's state.
pub struct Worker {
    name: Arc<str>,
    rng: Rng,
    log: Arc<Log>,
    own: Vec<Lane>,
    shared: Arc<Vec<Mutex<Lane>>>,
    /// A raw stream made through `cuda-dl-sys` (as another binding's), destroyed at the end.
    foreign: CUstream,
    tracked: Vec<Arc<Tracked>>,
    futures: Vec<Watched>,
    graphs: Vec<LiveGraph>,
    raw_retains: u32,
    crate_retains: Vec<Arc<PrimaryContext>>,
    made: u64,
    ops: u64,
}

impl Worker {
    /// Worker `index` of a round, with the round's shared lanes.
    pub fn new(index: usize, seed: u64, shared: Arc<Vec<Mutex<Lane>>>) -> Worker {
        let run = run();
        run.bind_thread();
        let name: Arc<str> = format!("w{index}").into();
        let mut foreign = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current. 1: CU_STREAM_NON_BLOCKING.
        unsafe { run.driver.cuStreamCreate(&mut foreign, 1) }
            .unwrap_or_else(|e| panic!("cuStreamCreate: {e}"));
        let mut own: Vec<Lane> = (0..2)
            .filter_map(|i| Lane::new_crate(format!("{name}.s{i} (crate)"), true))
            .collect();
        own.extend(Lane::new_raw(
            format!("{name}.foreign (raw)"),
            // SAFETY: destroyed only at the end of the worker, after its last use.
            unsafe { RawStream::from_raw(foreign) },
            true,
        ));
        own.extend(Lane::new_raw(
            format!("{name}.per-thread"),
            RawStream::PER_THREAD,
            true,
        ));
        assert_eq!(own.len(), 4, "slots for the first lanes");
        Worker {
            log: run.new_log(&name),
            name,
            rng: Rng::new(seed),
            own,
            shared,
            foreign,
            tracked: Vec::new(),
            futures: Vec::new(),
            graphs: Vec::new(),
            raw_retains: 0,
            crate_retains: Vec::new(),
            made: 0,
            ops: 0,
        }
    }

    /// Runs random operations until `until` (or a violation), then finishes its work: returns
    /// what is not settled yet.
    pub fn run(mut self, until: Instant) -> Vec<Arc<Tracked>> {
        let run = run();
        while Instant::now() < until && !run.failed() {
            self.step();
            self.ops += 1;
            if self.ops.is_multiple_of(512) {
                self.tracked.retain(|t| !t.settled());
            }
        }
        self.finish()
    }

    fn note(&self, line: String) {
        self.log.note(line);
    }

    fn step(&mut self) {
        let roll = self.rng.below(100);
        match roll {
            0..60 => self.on_some_lane(|me, lane| me.work(lane)),
            60..65 => self.on_some_lane(|me, lane| me.graph(lane)),
            65..70 => self.temporary_raw_stream(),
            70..72 => self.replace_own_stream(),
            72..78 => self.poll_futures(),
            78..81 => {
                let timeout = Duration::from_micros(self.rng.below(50_000));
                self.note(format!("flush({timeout:?})"));
                run().stats.add("flush");
                match cuda_host_launch::flush(timeout) {
                    Ok(()) | Err(Error::FlushTimedOut { .. }) => {}
                    Err(e) => run().violation(format!("{}: flush failed: {e}", self.name)),
                }
            }
            81..83 => {
                self.note("drain()".into());
                run().stats.add("drain");
                cuda_host_launch::drain();
            }
            83..88 => self.raw_retain_or_release(),
            88..91 => self.crate_retain_or_release(),
            91..93 => {
                let pause = Duration::from_micros(self.rng.below(300));
                self.note(format!("sleep {pause:?}"));
                std::thread::sleep(pause);
            }
            _ => self.retire_graphs(),
        }
        if self.futures.iter().any(Watched::woken) {
            self.poll_futures();
        }
    }

    /// Runs `f` on one of this worker's lanes or (30 % of the time) a shared one, locked.
    fn on_some_lane(&mut self, f: impl FnOnce(&mut Self, &mut Lane)) {
        if self.rng.percent(30) {
            let shared = Arc::clone(&self.shared);
            let i = self.rng.below(shared.len() as u64) as usize;
            let mut lane = lock(&shared[i]);
            f(self, &mut lane);
        } else {
            let i = self.rng.below(self.own.len() as u64) as usize;
            let mut lane = std::mem::replace(&mut self.own[i], placeholder());
            f(self, &mut lane);
            self.own[i] = lane;
        }
    }

    /// Cycles for a position's kernel: mostly a few microseconds, sometimes up to half a
    /// millisecond, now and then a few milliseconds (about 2 GHz).
    fn cycles(&mut self) -> u64 {
        match self.rng.below(100) {
            0..85 => self.rng.below(20_000),
            85..97 => 20_000 + self.rng.below(1_000_000),
            _ => 2_000_000 + self.rng.below(6_000_000),
        }
    }

    /// A position on `lane`, then one operation of the crate that must come after it.
    fn work(&mut self, lane: &mut Lane) {
        let cycles = self.cycles();
        let after = lane.position(cycles);
        let kind = match self.rng.below(11) {
            0 => Kind::Closure,
            1 => Kind::Raw,
            2 => Kind::Bytes,
            3 => Kind::Repeatable,
            4 => Kind::Async,
            5 => Kind::ReleaseAfter,
            6 => Kind::SpawnAfter,
            7 => Kind::Completion(CompletionMode::Auto),
            8 => Kind::Completion(CompletionMode::HostFunction),
            9 => Kind::Completion(CompletionMode::LowLatency),
            _ => Kind::Completion(CompletionMode::Event),
        };
        let binds = self.rng.percent(20);
        let antics = Antics::pick_for(kind, &mut self.rng);
        let t = Tracked::new(&self.name, kind, &lane.label, lane.slot, after);
        self.note(format!(
            "#{} {} on {} after {after} ({cycles} cycles){}{}",
            t.id,
            kind.name(),
            lane.label,
            if binds { ", owner binds" } else { "" },
            described(antics),
        ));
        let result = enqueue(&t, kind, lane.stream(), binds, antics);
        match result {
            Ok(future) => {
                t.returned(true);
                if let Some(future) = future {
                    self.futures.push(Watched::new(&t, future));
                }
            }
            Err(e) => {
                t.returned(false);
                run().violation(format!("{}: the call failed: {e}", t.describe()));
            }
        }
        self.tracked.push(t);
    }

    /// A position on `lane`, then a graph with one host node launched there one to three times.
    fn graph(&mut self, lane: &mut Lane) {
        let after = lane.position(self.rng.below(20_000));
        let t = Tracked::new(&self.name, Kind::GraphNode, &lane.label, lane.slot, after);
        let launches = 1 + self.rng.below(3) as u32;
        let binds = self.rng.percent(20);
        let antics = Antics::pick(&mut self.rng);
        self.note(format!(
            "#{} graph host node on {} after {after}, {launches} launches{}{}",
            t.id,
            lane.label,
            if binds { ", owner binds" } else { "" },
            described((antics, Antics::None)),
        ));
        let graph = match Graph::new() {
            Ok(graph) => graph,
            Err(e) => {
                t.returned(false);
                run().violation(format!("{}: Graph::new failed: {e}", t.describe()));
                return;
            }
        };
        let owner = Owner::new(&t, binds, antics);
        let node_t = Arc::clone(&t);
        let added = cuda_host_launch::add_host_node(&graph, &[], move || {
            let _owner = &owner;
            node_t.callback();
        });
        t.returned(added.is_ok());
        self.tracked.push(Arc::clone(&t));
        if let Err(e) = added {
            run().violation(format!("{}: add_host_node failed: {e}", t.describe()));
            return;
        }
        let exec = match graph.instantiate() {
            Ok(exec) => exec,
            Err(e) => {
                run().violation(format!("{}: instantiate failed: {e}", t.describe()));
                t.expected_runs
                    .store(0, std::sync::atomic::Ordering::Release);
                self.graphs.push(LiveGraph {
                    _graph: graph,
                    exec: None,
                    tracked: t,
                });
                return;
            }
        };
        let mut launched = 0;
        for _ in 0..launches {
            match exec.launch(lane.stream()) {
                Ok(()) => launched += 1,
                Err(e) => run().violation(format!("{}: graph launch failed: {e}", t.describe())),
            }
        }
        t.expected_runs
            .store(launched, std::sync::atomic::Ordering::Release);
        self.graphs.push(LiveGraph {
            _graph: graph,
            exec: Some(exec),
            tracked: t,
        });
    }

    /// Destroys the graphs whose node ran as often as it was launched (marked gone first).
    fn retire_graphs(&mut self) {
        self.graphs.retain_mut(|live| {
            let t = &live.tracked;
            if t.runs() < t.expected_runs.load(std::sync::atomic::Ordering::Acquire) {
                return true;
            }
            t.graph_gone
                .store(true, std::sync::atomic::Ordering::Release);
            drop(live.exec.take());
            false
        });
    }

    /// A raw stream of another binding (`cuStreamCreate`), a few positions and operations, then
    /// `cuStreamDestroy` with the work still pending: it must all run and be released as usual.
    fn temporary_raw_stream(&mut self) {
        let driver = run().driver;
        let mut raw = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context is current. 1: CU_STREAM_NON_BLOCKING.
        if let Err(e) = unsafe { driver.cuStreamCreate(&mut raw, 1) } {
            run().violation(format!("{}: cuStreamCreate failed: {e}", self.name));
            return;
        }
        self.made += 1;
        // SAFETY: destroyed below, after the lane's last use.
        let stream = unsafe { RawStream::from_raw(raw) };
        let label = format!("{}.temp{} (raw)", self.name, self.made);
        let Some(mut lane) = Lane::new_raw(label, stream, false) else {
            // SAFETY: made above, destroyed once.
            let _ = unsafe { driver.cuStreamDestroy_v2(raw) };
            return;
        };
        if self.rng.percent(50) {
            // A kernel of a millisecond or two first: the work behind it is surely pending.
            lane.position(2_000_000 + self.rng.below(2_000_000));
        }
        for _ in 0..1 + self.rng.below(4) {
            if self.rng.percent(80) {
                self.work(&mut lane);
            } else {
                self.graph(&mut lane);
            }
        }
        self.note(format!("cuStreamDestroy({}) with work pending", lane.label));
        run().stats.add("raw stream destroyed with work pending");
        // SAFETY: made above, destroyed once; the lane is not used again.
        if let Err(e) = unsafe { driver.cuStreamDestroy_v2(raw) } {
            run().violation(format!("{}: cuStreamDestroy failed: {e}", lane.label));
        }
    }

    /// Drops one of this worker's crate streams (its work still pending) for a new one.
    fn replace_own_stream(&mut self) {
        let i = self.rng.below(2) as usize;
        self.made += 1;
        let Some(lane) =
            Lane::new_crate(format!("{}.s{} (crate)", self.name, self.made + 1), false)
        else {
            return;
        };
        self.note(format!("drop {} for {}", self.own[i].label, lane.label));
        run().stats.add("crate stream replaced");
        self.own[i] = lane;
    }

    fn poll_futures(&mut self) {
        for watched in &mut self.futures {
            if watched.woken() {
                watched.poll();
            }
        }
        self.futures.retain(|w| !w.done());
        if self.futures.len() > 512 {
            // Too many pending: wait for the oldest (bounded).
            let mut oldest: Vec<Watched> = self.futures.drain(..128).collect();
            finish_futures(&mut oldest, Instant::now() + PATIENCE);
        }
    }

    /// As another binding would: `cuDevicePrimaryCtxRetain`, or the release of one of those
    /// (the test's own retain keeps the context alive throughout).
    fn raw_retain_or_release(&mut self) {
        let run = run();
        let device = run.context.device().raw();
        run.stats.add("raw primary retain/release");
        if self.raw_retains > 0 && (self.raw_retains >= 4 || self.rng.percent(50)) {
            self.note("cuDevicePrimaryCtxRelease".into());
            self.raw_retains -= 1;
            // SAFETY: a retain this worker took.
            if let Err(e) = unsafe { run.driver.cuDevicePrimaryCtxRelease_v2(device) } {
                run.violation(format!(
                    "{}: cuDevicePrimaryCtxRelease failed: {e}",
                    self.name
                ));
            }
        } else {
            self.note("cuDevicePrimaryCtxRetain".into());
            let mut context = std::ptr::null_mut();
            // SAFETY: a valid out-pointer and device.
            match unsafe { run.driver.cuDevicePrimaryCtxRetain(&mut context, device) } {
                Ok(()) => self.raw_retains += 1,
                Err(e) => run.violation(format!(
                    "{}: cuDevicePrimaryCtxRetain failed: {e}",
                    self.name
                )),
            }
        }
    }

    /// `PrimaryContext::retain`, or dropping one of those.
    fn crate_retain_or_release(&mut self) {
        if !self.crate_retains.is_empty() && (self.crate_retains.len() >= 4 || self.rng.percent(50))
        {
            self.note("drop a PrimaryContext".into());
            self.crate_retains.pop();
        } else {
            self.note("PrimaryContext::retain".into());
            match PrimaryContext::retain(run().context.device()) {
                Ok(context) => self.crate_retains.push(context),
                Err(e) => run().violation(format!("{}: PrimaryContext::retain: {e}", self.name)),
            }
        }
    }

    /// The end of the round for this worker: its graphs retired and its futures resolved
    /// (bounded), its retains given back, its streams destroyed. Returns what is not settled.
    fn finish(mut self) -> Vec<Arc<Tracked>> {
        let deadline = Instant::now() + PATIENCE;
        while !self.graphs.is_empty() && Instant::now() < deadline {
            self.retire_graphs();
            std::thread::sleep(Duration::from_millis(1));
        }
        for live in self.graphs.drain(..) {
            run().violation(format!(
                "{}: its node ran {} of {} times in {PATIENCE:?}",
                live.tracked.describe(),
                live.tracked.runs(),
                live.tracked
                    .expected_runs
                    .load(std::sync::atomic::Ordering::Acquire)
            ));
            live.tracked
                .graph_gone
                .store(true, std::sync::atomic::Ordering::Release);
        }
        finish_futures(&mut self.futures, Instant::now() + PATIENCE);
        let run = run();
        // The thread's per-thread default stream goes with the thread: its work is waited for
        // first (the other streams are destroyed with their work pending, as usual).
        if let Err(e) = run.wait_idle(RawStream::PER_THREAD.raw()) {
            run.violation(format!("{}.per-thread at the worker's end: {e}", self.name));
        }
        let device = run.context.device().raw();
        for _ in 0..self.raw_retains {
            // SAFETY: retains this worker took.
            let _ = unsafe { run.driver.cuDevicePrimaryCtxRelease_v2(device) };
        }
        self.crate_retains.clear();
        self.own.clear();
        // SAFETY: made in `new`, destroyed once; its lane is gone.
        let _ = unsafe { run.driver.cuStreamDestroy_v2(self.foreign) };
        self.tracked.retain(|t| !t.settled());
        self.tracked
    }
}

/// What stands in a worker's lane list while the lane is out (never used).
fn placeholder() -> Lane {
    Lane {
        label: "(out)".into(),
        stream: LaneStream::Raw(RawStream::LEGACY),
        slot: 0,
        seq: 0,
    }
}

/// The antics of an operation's owner and callback, for its log line.
pub fn described((owner, callback): (Antics, Antics)) -> String {
    let mut text = String::new();
    if owner != Antics::None {
        text.push_str(&format!(", owner antics {owner:?}"));
    }
    if callback != Antics::None {
        text.push_str(&format!(", callback antics {callback:?}"));
    }
    text
}

/// Enqueues `t`'s operation on `stream`; returns its future, if it has one. `binds`: its owner
/// makes the context current in its `Drop`; `antics`: what else its owner's `Drop` and its
/// callback do ([`Antics::pick_for`]).
pub fn enqueue(
    t: &Arc<Tracked>,
    kind: Kind,
    stream: &dyn AsRawStream,
    binds: bool,
    (owner_antics, callback_antics): (Antics, Antics),
) -> Result<Option<Pending>, Error> {
    let owner = || Owner::new(t, binds, owner_antics);
    let callback = Arc::clone(t);
    match kind {
        Kind::Closure => {
            let owner = owner();
            cuda_host_launch::host_launch(stream, move || {
                let _owner = &owner;
                callback.callback();
            })
            .map(|()| None)
            .map_err(Into::into)
        }
        Kind::Raw => {
            let data = Arc::as_ptr(t).cast_mut().cast::<c_void>();
            // SAFETY: `raw_callback` reads the `Tracked`, which the owners keep alive.
            unsafe {
                cuda_host_launch::launch_host_function(
                    stream,
                    Some(raw_callback),
                    data,
                    (owner(), callback),
                )
            }
            .map(|()| None)
            .map_err(Into::into)
        }
        Kind::Bytes => {
            let address = Arc::as_ptr(t).expose_provenance().to_ne_bytes();
            // Kept for the process: the bytes name it, and a late run must find it.
            std::mem::forget(callback);
            // SAFETY: `bytes_callback` reads a `Tracked` that is never freed.
            unsafe {
                cuda_host_launch::launch_host_function_with_bytes(
                    stream,
                    Some(bytes_callback),
                    &address,
                )
            }
            .map(|()| None)
        }
        Kind::Repeatable | Kind::CapturedRepeatable => {
            let owner = owner();
            LaunchOptions::default()
                .host_launch_repeatable(stream, move || {
                    let _owner = &owner;
                    callback.callback();
                })
                .map(|()| None)
                .map_err(Into::into)
        }
        Kind::Async => {
            let owner = owner();
            cuda_host_launch::host_launch_async(stream, move || {
                let _owner = &owner;
                callback.callback();
                callback.id
            })
            .map(|f| Some(Pending::Value(f)))
            .map_err(Into::into)
        }
        Kind::ReleaseAfter => cuda_host_launch::release_after(stream, owner())
            .map(|()| None)
            .map_err(Into::into),
        Kind::SpawnAfter => {
            // Dropped as the callback unwinds if the callback panics: a second panic there would
            // abort the process (Rust's rule, not the crate's). As the fake-driver harness does.
            let owner_antics = if owner_antics == Antics::Panics {
                Antics::None
            } else {
                owner_antics
            };
            let owner = Owner::new(t, binds, owner_antics);
            cuda_host_launch::spawn_after(stream, move || {
                callback.callback();
                callback_antics.act(&callback);
                drop(owner);
            })
            .map(|()| None)
            .map_err(Into::into)
        }
        Kind::Completion(mode) => mode.completion(stream).map(|f| Some(Pending::Done(f))),
        Kind::GraphNode => unreachable!("graph nodes are added by Worker::graph"),
    }
}
