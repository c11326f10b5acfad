//! Every public call of `cuda-host-launch`, and a sample of `cuda-dl-sys` (with every entry of its
//! table resolved), against drivers of every version from 9.2 to 13.2, against a driver missing
//! each symbol the crate uses, and against the toolkit's stub library.
//!
//! Each call must return `Ok` or a typed error (`DriverTooOld`, `SymbolMissing`, `Driver`, the
//! stub's `StubLibrary`, or `CaptureActive` for a run-once launch on a capturing stream); none may
//! panic; the owners of every launch are dropped exactly once (with a graph-destroying symbol
//! hidden, those in graphs at most once); a launch that worked ran exactly once per run of what it
//! went into (its stream, or each launch of its graph), and one that failed never ran.
//!
//! On the version runs every call must work except where `cuda-dl-sys`'s generated table gates a
//! function it needs above the driver's version: the only errors allowed are `DriverTooOld` for
//! such a function (stating the table's gate and the driver's version), and the `CaptureActive`
//! of the run-once launch on a capturing stream. At the end nothing is left in the driver (no
//! pending launch, user object, graph, executable graph, event, stream, created context or hold).
//! The features also appear exactly where the crate says (host functions from 10.0, user
//! objects from 11.3, `cuGraphInstantiateWithFlags` from 11.4, stream memory operations from
//! 11.7, `cuCtxCreate_v4` from 12.5, the sync mode from 13.2).
//!
//! The driver reads its version and symbol list once per process: each version, each missing
//! symbol and the stub run in a process of their own, every call in one process.
//!
//! Found: on drivers before 11.0, dropping the last `PrimaryContext` never releases it (see the
//! ignored test `the_last_primary_context_is_released_on_a_10_2_driver`).

use std::ffi::c_void;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUdevice_attribute, CUgraph, CUstreamCaptureMode};
use cuda_dl_sys::{Driver, Function};
use cuda_host_launch::{
    AsRawStream, CleanupMode, CompletionMode, Device, Error, Event, Graph, HostTaskSyncMode,
    LaunchOptions, PrimaryContext, RawStream, Stream, add_host_node, cleanup_stats, completion,
    defer_drop, drain, flush, host_launch, host_launch_async, in_host_function,
    launch_host_function, launch_host_function_with_bytes, pending_launches, poller_cpu_time,
    reclaim_pending, release_after, reset_panic_handler, set_panic_handler, spawn_after,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::bump;
use cuda_workspace::testing::{
    Drops, ISOLATED_TEST_ENV, Owner, PATIENCE, ThreadInfo, fake, fake_driver_path, in_own_process,
    panic_text, test_path, wait_until,
};

/// How a call ended.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Outcome {
    Ok,
    TooOld(&'static str),
    Missing(&'static str),
    Driver(String),
    Stub,
    /// A run-once launch on a capturing stream (`CaptureActive`).
    Refused,
    /// Not called: what it needs failed before.
    Skipped,
    /// Anything else: a test failure.
    Untyped(String),
    Panicked(String),
}

fn classify(e: &Error) -> Outcome {
    match e {
        Error::Cuda(cuda_dl_sys::Error::DriverTooOld {
            function,
            required,
            found,
            ..
        }) => {
            // The error must state the table's gate and the driver's version.
            assert_eq!(Some(*required), gate(function), "{e}");
            assert_eq!(found.0, driver_version(), "{e}");
            Outcome::TooOld(function)
        }
        // The same, named after the crate's operation that needs the function.
        Error::NeedsNewerDriver {
            operation,
            function,
            required,
            found,
        } => {
            assert_eq!(Some(required.0 as u32), gate(function), "{e}");
            assert_eq!(found.0, driver_version(), "{e}");
            let text = e.to_string();
            assert!(text.starts_with(operation), "{text}");
            assert!(text.contains(&format!("needs CUDA {required}")), "{text}");
            Outcome::TooOld(function)
        }
        Error::Cuda(cuda_dl_sys::Error::SymbolMissing { function, .. }) => {
            Outcome::Missing(function)
        }
        Error::Cuda(cuda_dl_sys::Error::Driver(d)) => Outcome::Driver(d.to_string()),
        // The driver's CUDA_ERROR_INVALID_CONTEXT for a default-stream handle, typed: no context
        // could be made current without the missing symbol.
        Error::NoCurrentContext { .. } => Outcome::Driver(e.to_string()),
        Error::Cuda(cuda_dl_sys::Error::StubLibrary { .. }) => Outcome::Stub,
        Error::CaptureActive { .. } => Outcome::Refused,
        other => Outcome::Untyped(format!("{other:?}")),
    }
}

/// The version gate of the table entry named `function` in `cuda-dl-sys`'s generated table.
fn gate(function: &str) -> Option<u32> {
    Function::ALL
        .iter()
        .map(|f| f.info())
        .find(|info| info.name == function)
        .map(|info| info.version)
}

/// Whether a driver of `version` lacks the table entry `function` (its gate is above it).
fn too_old_on(function: &str, version: i32) -> bool {
    gate(function).is_some_and(|gate| gate as i32 > version)
}

/// The loaded driver's version.
fn driver_version() -> i32 {
    Driver::get().map_or(0, |d| d.version().0)
}

/// The runs and owners of one launch.
struct Probe {
    name: &'static str,
    runs: Arc<AtomicUsize>,
    drops: Arc<Drops>,
    failed: bool,
    /// The graph a repeatable launch or node went into (an index into `Tally::graph_launches`);
    /// `None` for a launch on a stream, which runs once.
    graph: Option<usize>,
}

/// Every call made, with how it ended, and the probes of every launch.
#[derive(Default)]
struct Tally {
    rows: Vec<(&'static str, Outcome)>,
    probes: Vec<Probe>,
    /// Successful launches of each graph made so far (see [`Tally::new_graph`]).
    graph_launches: Vec<usize>,
}

impl Tally {
    /// Calls `f`, catching a panic, and records how it ended.
    /// `f`'s error may hand values back (`LaunchError`): they are dropped here, as the error is
    /// taken for an `Error`.
    fn call<T, E: Into<Error>>(
        &mut self,
        name: &'static str,
        f: impl FnOnce() -> Result<T, E>,
    ) -> Option<T> {
        match catch_unwind(AssertUnwindSafe(|| f().map_err(Into::into))) {
            Ok(Ok(value)) => {
                self.rows.push((name, Outcome::Ok));
                Some(value)
            }
            Ok(Err(e)) => {
                self.rows.push((name, classify(&e)));
                None
            }
            Err(panic) => {
                self.rows
                    .push((name, Outcome::Panicked(panic_text(&*panic))));
                None
            }
        }
    }

    /// A `cuda-dl-sys` call.
    fn sys<E: Into<cuda_dl_sys::Error>>(
        &mut self,
        name: &'static str,
        f: impl FnOnce() -> Result<(), E>,
    ) -> bool {
        self.call(name, || f().map_err(|e| Error::from(e.into())))
            .is_some()
    }

    fn skip(&mut self, name: &'static str) {
        self.rows.push((name, Outcome::Skipped));
    }

    /// A new graph: the repeatable launches and nodes made until the next one go into it, and
    /// run once per successful launch of it ([`Tally::graph_launched`]).
    fn new_graph(&mut self) -> usize {
        self.graph_launches.push(0);
        self.graph_launches.len() - 1
    }

    fn graph_launched(&mut self, graph: usize) {
        self.graph_launches[graph] += 1;
    }

    /// A launch: `f` gets a counter and an owner. If it fails, its owners must already be gone,
    /// on this thread (a run-once launch) or through the cleanup queue (a repeatable one tied to
    /// a graph: checked at the end).
    fn launch<E: Into<Error>>(
        &mut self,
        name: &'static str,
        run_once: bool,
        f: impl FnOnce(Arc<AtomicUsize>, Owner) -> Result<(), E>,
    ) -> bool {
        let (runs, drops) = (Arc::new(AtomicUsize::new(0)), Drops::new());
        let owner = drops.owner();
        let ok = self.call(name, || f(Arc::clone(&runs), owner)).is_some();
        if !ok && run_once {
            let records = drops.records();
            let me = ThreadInfo::current();
            assert_eq!(records.len(), 1, "{name}: the owner outlived the error");
            assert!(records[0].thread.same_as(&me), "{name}: {records:?}");
        }
        let graph = if run_once {
            None
        } else {
            Some(self.graph_launches.len().checked_sub(1).expect("a graph"))
        };
        self.probes.push(Probe {
            name,
            runs,
            drops,
            failed: !ok,
            graph,
        });
        ok
    }

    fn outcome(&self, name: &str) -> Option<&Outcome> {
        self.rows
            .iter()
            .rev()
            .find(|(n, _)| *n == name)
            .map(|(_, o)| o)
    }

    /// Every row typed, none panicked.
    #[track_caller]
    fn assert_typed(&self) {
        let bad: Vec<_> = self
            .rows
            .iter()
            .filter(|(_, o)| matches!(o, Outcome::Untyped(_) | Outcome::Panicked(_)))
            .collect();
        assert!(bad.is_empty(), "untyped errors or panics: {bad:?}");
    }

    /// Waits until every launch's owners are dropped exactly once; with `graphs_kept` (where the
    /// driver cannot destroy a graph or an executable graph), the owners of a launch or node that
    /// went into a graph only at most once. Then every launch that worked must have
    /// run exactly once per run of what it went into (once for a stream, once per launch of its
    /// graph), and every launch that failed never.
    fn assert_owners_dropped_once(&self, graphs_kept: bool) {
        for probe in &self.probes {
            if probe.failed || !graphs_kept || probe.graph.is_none() {
                probe.drops.wait_dropped(probe.drops.made());
            } else {
                flush(PATIENCE).expect("flush");
                assert!(
                    probe.drops.dropped() <= probe.drops.made(),
                    "{}: dropped twice",
                    probe.name
                );
            }
            let expected = match (probe.failed, probe.graph) {
                (true, _) => 0,
                (false, None) => 1,
                (false, Some(graph)) => self.graph_launches[graph],
            };
            assert_eq!(
                probe.runs.load(Ordering::SeqCst),
                expected,
                "{}: runs (failed: {}, graph: {:?})",
                probe.name,
                probe.failed,
                probe.graph
            );
        }
    }

    /// On a driver of `version`: every call worked, except those that report `DriverTooOld` for
    /// a function whose version gate in `cuda-dl-sys`'s generated table is above `version` (with the
    /// table's version and this driver's), the run-once launch on a capturing stream
    /// (`CaptureActive`), and calls skipped because such a call failed before them.
    #[track_caller]
    fn assert_supported_calls_work(&self, version: i32) {
        let bad: Vec<String> = self
            .rows
            .iter()
            .filter(|(name, outcome)| match outcome {
                Outcome::Ok | Outcome::Skipped => false,
                Outcome::Refused => *name != "host_launch (capturing)",
                Outcome::TooOld(function) => !too_old_on(function, version),
                _ => true,
            })
            .map(|(name, outcome)| format!("{name}: {outcome:?}"))
            .collect();
        assert!(
            bad.is_empty(),
            "calls that failed on a {version} driver though it supports what they need: {bad:#?}"
        );
    }
    fn summary(&self) -> String {
        let count = |f: fn(&Outcome) -> bool| self.rows.iter().filter(|(_, o)| f(o)).count();
        let names = |f: fn(&Outcome) -> bool| {
            let mut names: Vec<&str> = self
                .rows
                .iter()
                .filter(|(_, o)| f(o))
                .map(|(n, _)| *n)
                .collect();
            names.dedup();
            names.join(", ")
        };
        format!(
            "{} calls: {} Ok, {} DriverTooOld [{}], {} SymbolMissing [{}], {} Driver [{}], {} \
             StubLibrary, {} CaptureActive, {} skipped",
            self.rows.len(),
            count(|o| *o == Outcome::Ok),
            count(|o| matches!(o, Outcome::TooOld(_))),
            names(|o| matches!(o, Outcome::TooOld(_))),
            count(|o| matches!(o, Outcome::Missing(_))),
            names(|o| matches!(o, Outcome::Missing(_))),
            count(|o| matches!(o, Outcome::Driver(_))),
            names(|o| matches!(o, Outcome::Driver(_))),
            count(|o| *o == Outcome::Stub),
            count(|o| *o == Outcome::Refused),
            count(|o| *o == Outcome::Skipped),
        )
    }
}

struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` to its end on this thread (bounded).
fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = Box::pin(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Poll::Ready(out) = Pin::as_mut(&mut future).poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future never resolved");
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

/// Every launch form on `stream` (not capturing).
fn launches<S: AsRawStream + Copy>(t: &mut Tally, stream: S) {
    let spin = LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait);
    let default = LaunchOptions::default();
    let closure = |runs: Arc<AtomicUsize>, owner: Owner| {
        move || {
            let _keep = &owner;
            runs.fetch_add(1, Ordering::SeqCst);
        }
    };
    t.launch("host_launch", true, |r, o| {
        host_launch(stream, closure(r, o))
    });
    t.launch("host_launch_with(default)", true, |r, o| {
        default.host_launch(stream, closure(r, o))
    });
    t.launch("host_launch_with(sync mode)", true, |r, o| {
        spin.host_launch(stream, closure(r, o))
    });
    // SAFETY: `bump` only touches the counter the owners keep alive.
    t.launch("launch_host_function", true, |r, o| unsafe {
        let data = Arc::as_ptr(&r).cast_mut().cast();
        launch_host_function(stream, Some(bump), data, (o, r))
    });
    // SAFETY: as above.
    t.launch(
        "launch_host_function_with(sync mode)",
        true,
        |r, o| unsafe {
            let data = Arc::as_ptr(&r).cast_mut().cast();
            spin.launch_host_function(stream, Some(bump), data, (o, r))
        },
    );
    // SAFETY: as above; `bump` may run any number of times.
    t.launch("launch_host_function_repeatable", true, |r, o| unsafe {
        let data = Arc::as_ptr(&r).cast_mut().cast();
        default.launch_host_function_repeatable(stream, Some(bump), data, (o, r))
    });
    t.launch("host_launch_repeatable", true, |r, o| {
        default.host_launch_repeatable(stream, closure(r, o))
    });
    // SAFETY: a function that ignores its copied bytes.
    t.call("launch_host_function_with_bytes", || unsafe {
        launch_host_function_with_bytes(stream, Some(ignore), &[1, 2, 3])
    });
    t.launch("host_launch_async", true, |r, o| {
        let future = host_launch_async(stream, move || {
            let _keep = &o;
            r.fetch_add(1, Ordering::SeqCst) + 40
        })?;
        assert_eq!(block_on(future)?, 40);
        Ok::<_, Error>(())
    });
    t.call("completion", || block_on(completion(stream)?));
    t.call("completion_with(LowLatency)", || {
        block_on(CompletionMode::LowLatency.completion(stream)?)
    });
    t.call("completion_with(Event)", || {
        block_on(CompletionMode::Event.completion(stream)?)
    });
    t.call("completion_with(HostFunction)", || {
        block_on(CompletionMode::HostFunction.completion(stream)?)
    });
    t.launch("spawn_after", true, |r, o| {
        spawn_after(stream, closure(r, o))
    });
    // Nothing runs at completion: the owner is dropped once, whether the call worked or not.
    let drops = Drops::new();
    t.call("release_after", || release_after(stream, drops.owner()));
    drops.wait_dropped(1);
    assert_eq!(drops.dropped(), 1, "release_after: the owner dropped once");
}

unsafe extern "C" fn ignore(_: *mut c_void) {}

/// Calls every public call of `cuda-host-launch` and a sample of `cuda-dl-sys`, recording each.
fn exercise(t: &mut Tally) {
    // The cleanup API needs no driver.
    t.call("config", || cuda_host_launch::config().map(|c| c.cleanup()));
    // Refused (the read above fixed the configuration), and typed: no driver needed either way.
    t.call("Config::install", || {
        match cuda_host_launch::Config::new()
            .cleanup_mode(CleanupMode::Reaper)
            .install()
        {
            Err(cuda_host_launch::Error::AlreadyConfigured) => Ok(()),
            other => other,
        }
    });
    t.call("in_host_function", || {
        assert!(!in_host_function());
        Ok::<_, Error>(())
    });
    set_panic_handler(|_| {});
    reset_panic_handler();
    let _ = (cleanup_stats(), poller_cpu_time(), pending_launches(None));

    let driver = t.call("cuda_dl_sys::driver", || {
        Ok::<_, Error>(cuda_dl_sys::driver()?)
    });
    t.call("Device::count", Device::count);
    let device = t.call("Device::get", || Device::get(0));
    if let Some(device) = device {
        t.call("Device::name", || device.name());
    }
    let context = match device {
        Some(device) => t.call("PrimaryContext::retain", || PrimaryContext::retain(device)),
        None => {
            t.skip("PrimaryContext::retain");
            None
        }
    };
    if let Some(context) = &context {
        t.call("PrimaryContext::set_current", || context.set_current());
        t.call("PrimaryContext::synchronize", || context.synchronize());
        let _ = (context.pending_launches(), context.device(), context.raw());
    }
    let stream = context
        .as_ref()
        .and_then(|c| t.call("Stream::new", || Stream::new(c)));
    let side = context
        .as_ref()
        .and_then(|c| t.call("Stream::new_non_blocking", || Stream::new_non_blocking(c)));

    // Launches on a stream of the crate, on a raw handle, and on the special handles.
    match &stream {
        Some(stream) => {
            launches(t, stream);
            // SAFETY: `stream` outlives these launches.
            launches(t, unsafe { RawStream::from_raw(stream.raw()) });
            t.call("Stream::synchronize", || stream.synchronize());
            t.call("Stream::is_idle", || stream.is_idle());
        }
        None => launches(t, RawStream::LEGACY),
    }
    for (name, special) in [
        ("host_launch(LEGACY)", RawStream::LEGACY),
        ("host_launch(PER_THREAD)", RawStream::PER_THREAD),
        ("host_launch(DEFAULT)", RawStream::DEFAULT),
    ] {
        t.launch(name, true, |r, o| {
            host_launch(special, move || {
                let _keep = &o;
                r.fetch_add(1, Ordering::SeqCst);
            })
        });
    }
    if let Some(context) = &context {
        t.call("PrimaryContext::synchronize (after launches)", || {
            context.synchronize()
        });
    }

    // Events.
    if let (Some(context), Some(stream), Some(side)) = (&context, &stream, &side)
        && let Some(event) = t.call("Event::new", || Event::new(context))
    {
        t.call("Event::record", || event.record(stream));
        t.call("Event::make_wait", || event.make_wait(side));
        t.call("Event::synchronize", || event.synchronize());
        t.call("Event::is_complete", || event.is_complete());
    }

    // Repeatable launches on a capturing stream, and the graph the capture made.
    if let (Some(driver), Some(side)) = (driver, &side) {
        capture(t, driver, side);
    } else {
        t.skip("capture");
    }

    // Graphs built with host nodes.
    if let Some(graph) = t.call("Graph::new", Graph::new) {
        let index = t.new_graph();
        let spin = LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait);
        let node = |r: Arc<AtomicUsize>, o: Owner| {
            move || {
                let _keep = &o;
                r.fetch_add(1, Ordering::SeqCst);
            }
        };
        t.launch("add_host_node", false, |r, o| {
            add_host_node(&graph, &[], node(r, o)).map(drop)
        });
        t.launch("add_host_node_with(sync mode)", false, |r, o| {
            spin.add_host_node(&graph, &[], node(r, o)).map(drop)
        });
        // SAFETY: a live graph; `bump` as above.
        t.launch("add_host_node_raw", false, |r, o| unsafe {
            let data = Arc::as_ptr(&r).cast_mut().cast();
            LaunchOptions::default()
                .add_host_node_raw(graph.raw(), &[], Some(bump), data, (o, r))
                .map(drop)
        });
        graph_ops(t, index, &graph, stream.as_ref());
    }

    // Own contexts (cuda-dl-sys) and reclaim_pending.
    if let Some(driver) = driver {
        sys_sample(t, driver, stream.as_ref());
    }

    // Tear down, then reset the primary context.
    if let Some(stream) = &stream {
        t.call("Stream::synchronize (end)", || stream.synchronize());
    }
    t.call("flush", || flush(PATIENCE));
    drain();
    defer_drop(Drops::new());
    drop((stream, side));
    if let Some(context) = &context {
        // SAFETY: the streams of the context were dropped just above; what is made after the
        // reset is new.
        t.call("PrimaryContext::reset", || unsafe { context.reset() });
        t.call("PrimaryContext::set_current (after reset)", || {
            context.set_current()
        });
        let after = t.call("Stream::new (after reset)", || Stream::new(context));
        if let Some(after) = after {
            t.launch("host_launch (after reset)", true, |r, o| {
                host_launch(&after, move || {
                    let _keep = &o;
                    r.fetch_add(1, Ordering::SeqCst);
                })
            });
            t.call("Stream::synchronize (after reset)", || after.synchronize());
        }
    }
    drop(context);
    t.call("flush (end)", || flush(PATIENCE));
}

/// The launches [`capture`] makes.
const CAPTURED: [&str; 4] = [
    "host_launch (capturing)",
    "host_launch_repeatable (capturing)",
    "host_launch_repeatable(sync mode, capturing)",
    "launch_host_function_repeatable (capturing)",
];

/// Begins a capture on `side`, launches into it, ends it and replays the graph.
fn capture(t: &mut Tally, driver: &'static Driver, side: &Stream) {
    let relaxed = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
    // SAFETY: a live stream.
    if !t.sys("cuStreamBeginCapture", || unsafe {
        driver.cuStreamBeginCapture(side.raw(), relaxed)
    }) {
        for name in CAPTURED {
            t.skip(name);
        }
        return;
    }
    let index = t.new_graph();
    let spin = LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait);
    let default = LaunchOptions::default();
    let closure = |r: Arc<AtomicUsize>, o: Owner| {
        move || {
            let _keep = &o;
            r.fetch_add(1, Ordering::SeqCst);
        }
    };
    t.launch("host_launch (capturing)", true, |r, o| {
        match host_launch(side, closure(r, o)) {
            Ok(()) => panic!("a run-once launch was captured"),
            Err(e) => Err(e),
        }
    });
    t.launch("host_launch_repeatable (capturing)", false, |r, o| {
        default.host_launch_repeatable(side, closure(r, o))
    });
    t.launch(
        "host_launch_repeatable(sync mode, capturing)",
        false,
        |r, o| spin.host_launch_repeatable(side, closure(r, o)),
    );
    // SAFETY: `bump` as above; it may run any number of times.
    t.launch(
        "launch_host_function_repeatable (capturing)",
        false,
        |r, o| unsafe {
            let data = Arc::as_ptr(&r).cast_mut().cast();
            default.launch_host_function_repeatable(side, Some(bump), data, (o, r))
        },
    );
    let mut raw: CUgraph = ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    if t.sys("cuStreamEndCapture", || unsafe {
        driver.cuStreamEndCapture(side.raw(), &mut raw)
    }) {
        // SAFETY: the graph the capture made, owned by nobody else.
        let graph = unsafe { Graph::from_raw(raw) };
        graph_ops(t, index, &graph, Some(side));
    }
}

/// The graph and executable-graph calls; the graph is dropped by the caller.
///
/// `index` is the graph's [`Tally::new_graph`]: a successful launch counts as a run of its nodes.
fn graph_ops(t: &mut Tally, index: usize, graph: &Graph, stream: Option<&Stream>) {
    t.call("Graph::nodes", || graph.nodes());
    t.call("Graph::node_types", || graph.node_types());
    if let Some(copy) = t.call("Graph::try_clone", || graph.try_clone()) {
        drop(copy);
    }
    if let Some(exec) = t.call("Graph::instantiate", || graph.instantiate()) {
        let _ = exec.raw();
        match stream {
            Some(stream) => {
                if t.call("GraphExec::launch", || exec.launch(stream))
                    .is_some()
                {
                    t.graph_launched(index);
                }
                t.call("Stream::synchronize (graph)", || stream.synchronize());
            }
            None => t.skip("GraphExec::launch"),
        }
    }
}

/// A sample of `cuda-dl-sys`: every table entry resolved, and direct calls.
fn sys_sample(t: &mut Tally, d: &'static Driver, stream: Option<&Stream>) {
    let (mut resolved, mut too_old, mut missing, mut failed) = (0, 0, 0, 0);
    for &function in Function::ALL {
        match catch_unwind(AssertUnwindSafe(|| d.resolve(function))) {
            Ok(Ok(_)) => resolved += 1,
            Ok(Err(cuda_dl_sys::Error::DriverTooOld { .. })) => too_old += 1,
            Ok(Err(cuda_dl_sys::Error::SymbolMissing { .. })) => missing += 1,
            Ok(Err(cuda_dl_sys::Error::Driver(_) | cuda_dl_sys::Error::StubLibrary { .. })) => {
                failed += 1
            }
            Ok(Err(e)) => t
                .rows
                .push(("Driver::resolve", Outcome::Untyped(e.to_string()))),
            Err(p) => t
                .rows
                .push(("Driver::resolve", Outcome::Panicked(panic_text(&*p)))),
        }
    }
    println!(
        "  cuda-dl-sys table: {} entries: {resolved} resolved, {too_old} DriverTooOld, {missing} \
         SymbolMissing, {failed} failed lookups",
        Function::ALL.len()
    );
    // SAFETY: every call below gets valid out-pointers and handles from the driver; memory lives
    // until it is freed here, after the last write to it.
    unsafe {
        let (mut n, mut device) = (0, 0);
        t.sys("cuDeviceGetCount", || d.cuDeviceGetCount(&mut n));
        t.sys("cuDeviceGet", || d.cuDeviceGet(&mut device, 0));
        let mut value = 0;
        let attribute = CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT;
        t.sys("cuDeviceGetAttribute", || {
            d.cuDeviceGetAttribute(&mut value, attribute, device)
        });
        let mut bytes = 0;
        t.sys("cuDeviceTotalMem", || {
            d.cuDeviceTotalMem(&mut bytes, device)
        });
        t.sys("cuCtxGetDevice", || d.cuCtxGetDevice(&mut device));
        let mut dptr = 0;
        if t.sys("cuMemAlloc", || d.cuMemAlloc(&mut dptr, 256)) {
            t.sys("cuMemsetD8", || d.cuMemsetD8(dptr, 7, 256));
            t.sys("cuMemFree", || d.cuMemFree(dptr));
        }
        let mut host = ptr::null_mut();
        if t.sys("cuMemHostAlloc", || d.cuMemHostAlloc(&mut host, 64, 0)) {
            // Freed only once nothing can write to it any more (else leaked: 64 bytes).
            let mut idle = true;
            if let Some(stream) = stream {
                let address = host.addr() as u64;
                if t.sys("cuStreamWriteValue32", || {
                    d.cuStreamWriteValue32(stream.raw(), address, 1, 0)
                }) {
                    idle = t.sys("cuStreamSynchronize", || {
                        d.cuStreamSynchronize(stream.raw())
                    }) || t.sys("cuCtxSynchronize", || d.cuCtxSynchronize());
                }
            }
            if idle {
                t.sys("cuMemFreeHost", || d.cuMemFreeHost(host));
            }
        }
        if let Some(stream) = stream {
            let (mut flags, mut priority, mut id, mut device) = (0, 0, 0, 0);
            t.sys("cuStreamGetFlags", || {
                d.cuStreamGetFlags(stream.raw(), &mut flags)
            });
            t.sys("cuStreamGetPriority", || {
                d.cuStreamGetPriority(stream.raw(), &mut priority)
            });
            t.sys("cuStreamGetId", || d.cuStreamGetId(stream.raw(), &mut id));
            t.sys("cuStreamGetDevice", || {
                d.cuStreamGetDevice(stream.raw(), &mut device)
            });
        }
        // A context of our own: a launch into it, a destroy (which runs it), and a reclaim that
        // finds nothing.
        let (mut own, mut popped, mut raw) = (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
        if t.sys("cuCtxCreate", || {
            d.cuCtxCreate(&mut own, ptr::null_mut(), 0, device)
        }) {
            if t.sys("cuStreamCreate", || d.cuStreamCreate(&mut raw, 0)) {
                let stream = RawStream::from_raw(raw);
                t.launch("host_launch (own context)", true, |r, o| {
                    host_launch(stream, move || {
                        let _keep = &o;
                        r.fetch_add(1, Ordering::SeqCst);
                    })
                });
            }
            t.sys("cuCtxPopCurrent", || d.cuCtxPopCurrent(&mut popped));
            t.sys("cuCtxDestroy", || d.cuCtxDestroy(own));
            t.call("reclaim_pending", || Ok::<_, Error>(reclaim_pending(own)));
        }
    }
}

/// The first driver version of each feature, as the crate documents it: from there on the call
/// must work, before it must fail as too old (or not be reached). Which calls may fail at all is
/// derived from `cuda-dl-sys`'s table ([`Tally::assert_supported_calls_work`]); this list adds where
/// each feature must appear, so that a launch asking for a newer function than it needs (the sync
/// mode's `cuLaunchHostFunc_v2` for default options, say) fails here.
const NEEDS: &[(&str, i32)] = &[
    ("host_launch", 10000),
    ("host_launch_with(default)", 10000),
    ("host_launch_repeatable", 10000),
    ("launch_host_function_repeatable", 10000),
    ("launch_host_function_with_bytes", 10000),
    ("launch_host_function", 10000),
    ("host_launch_async", 10000),
    ("completion", 10000),
    ("Graph::new", 10000),
    ("cuStreamBeginCapture", 10010),
    ("PrimaryContext::reset", 7000),
    ("host_launch_repeatable (capturing)", 11030),
    ("launch_host_function_repeatable (capturing)", 11030),
    ("add_host_node", 11030),
    ("add_host_node_raw", 11030),
    ("Graph::instantiate", 11040),
    ("completion_with(LowLatency)", 12000),
    ("completion_with(Event)", 12000),
    ("completion_with(HostFunction)", 10000),
    ("release_after", 12000),
    ("spawn_after", 12000),
    ("cuStreamWriteValue32", 11070),
    ("cuStreamGetId", 12000),
    ("cuCtxCreate", 12050),
    ("cuStreamGetDevice", 12080),
    ("host_launch_with(sync mode)", 13020),
    ("add_host_node_with(sync mode)", 13020),
    ("host_launch_repeatable(sync mode, capturing)", 13020),
];

/// After [`exercise`]: no launch pending, no user object, graph, executable graph, event or
/// stream left in the driver, nothing queued for cleanup.
#[track_caller]
fn assert_nothing_left(version: i32) {
    flush(PATIENCE).expect("flush");
    assert_eq!(pending_launches(None), 0, "launches pending on {version}");
    wait_until("user objects destroyed", PATIENCE, || {
        fake().live_user_objects() == 0
    });
    // The event poller gives its pool's events back once idle (100 ms).
    wait_until("the event pools given back", PATIENCE, || {
        fake().live_objects("events") == 0
    });
    for kind in ["graphs", "graph_execs", "streams", "contexts", "holds"] {
        assert_eq!(fake().live_objects(kind), 0, "{kind} left on {version}");
    }
}

/// Runs everything on a driver reporting `version` and checks where each feature appears.
fn on_version(version: i32) {
    let started = Instant::now();
    let _ = fake();
    let mut t = Tally::default();
    exercise(&mut t);
    let driver = cuda_dl_sys::driver().expect("the fake driver");
    assert_eq!(driver.version().0, version);
    t.assert_typed();
    t.assert_supported_calls_work(version);
    t.assert_owners_dropped_once(false);
    assert_nothing_left(version);
    for (name, needs) in NEEDS {
        let outcome = t.outcome(name);
        if version >= *needs {
            assert_eq!(outcome, Some(&Outcome::Ok), "{name} on {version}");
        } else {
            // Too old, or not reached because what it needs is too old.
            assert!(
                matches!(outcome, None | Some(Outcome::TooOld(_) | Outcome::Skipped)),
                "{name} on {version}: {outcome:?}"
            );
        }
    }
    let refused = t.outcome("host_launch (capturing)");
    if version >= 10010 {
        assert_eq!(
            refused,
            Some(&Outcome::Refused),
            "a run-once launch, capturing"
        );
    }
    println!(
        "driver {version}: {} in {:?}",
        t.summary(),
        started.elapsed()
    );
}

macro_rules! versions {
    ($($name:ident = $version:literal;)*) => {
        isolated_test! {$(
            /// Every call on a driver of this version.
            fn $name(
                FAKE_CUDA_VERSION = stringify!($version),
                CUDA_DL_SYS_LIBRARY = fake_driver_path()
            ) {
                on_version($version);
            }
        )*}
    };
}

versions! {
    every_call_on_a_9_2_driver = 9020;
    every_call_on_a_10_0_driver = 10000;
    every_call_on_a_10_1_driver = 10010;
    every_call_on_a_10_2_driver = 10020;
    every_call_on_an_11_0_driver = 11000;
    every_call_on_an_11_1_driver = 11010;
    every_call_on_an_11_2_driver = 11020;
    every_call_on_an_11_3_driver = 11030;
    every_call_on_an_11_4_driver = 11040;
    every_call_on_an_11_5_driver = 11050;
    every_call_on_an_11_6_driver = 11060;
    every_call_on_an_11_7_driver = 11070;
    every_call_on_an_11_8_driver = 11080;
    every_call_on_a_12_0_driver = 12000;
    every_call_on_a_12_1_driver = 12010;
    every_call_on_a_12_2_driver = 12020;
    every_call_on_a_12_3_driver = 12030;
    every_call_on_a_12_4_driver = 12040;
    every_call_on_a_12_5_driver = 12050;
    every_call_on_a_12_6_driver = 12060;
    every_call_on_a_12_8_driver = 12080;
    every_call_on_a_12_9_driver = 12090;
    every_call_on_a_13_0_driver = 13000;
    every_call_on_a_13_1_driver = 13010;
    every_call_on_a_13_2_driver = 13020;
}

/// Each symbol `cuda-host-launch` calls, the driver version to hide it on (where the crate uses
/// it), and whether hiding it must surface as a `SymbolMissing` somewhere (calls made only by a
/// `Drop` or an error path cannot report it).
const SYMBOLS: &[(&str, i32, bool)] = &[
    ("cuStreamGetCaptureInfo", 13020, true),
    ("cuStreamIsCapturing", 12020, true),
    ("cuLaunchHostFunc", 13020, true),
    ("cuUserObjectCreate", 13020, true),
    ("cuUserObjectRelease", 13020, true),
    ("cuGraphRetainUserObject", 13020, true),
    ("cuGraphReleaseUserObject", 13020, false),
    ("cuGraphAddHostNode", 13020, true),
    ("cuGraphAddNode", 13020, true),
    ("cuStreamGetCtx", 13020, true),
    ("cuCtxGetCurrent", 13020, true),
    ("cuCtxSetCurrent", 13020, true),
    ("cuCtxPushCurrent", 13020, true),
    ("cuCtxPopCurrent", 13020, true),
    ("cuCtxSynchronize", 13020, true),
    ("cuDeviceGet", 13020, true),
    ("cuDeviceGetCount", 13020, true),
    ("cuDeviceGetName", 13020, true),
    ("cuDevicePrimaryCtxRetain", 13020, true),
    ("cuDevicePrimaryCtxRelease", 13020, false),
    ("cuDevicePrimaryCtxGetState", 13020, false),
    ("cuDevicePrimaryCtxReset", 13020, true),
    ("cuStreamCreate", 13020, true),
    ("cuStreamDestroy", 13020, false),
    ("cuStreamSynchronize", 13020, true),
    ("cuStreamQuery", 13020, true),
    ("cuStreamWaitEvent", 13020, true),
    ("cuEventCreate", 13020, true),
    ("cuEventDestroy", 13020, false),
    ("cuEventRecord", 13020, true),
    ("cuEventSynchronize", 13020, true),
    ("cuEventQuery", 13020, true),
    ("cuGraphCreate", 13020, true),
    ("cuGraphDestroy", 13020, false),
    ("cuGraphClone", 13020, true),
    ("cuGraphInstantiateWithFlags", 13020, true),
    ("cuGraphGetNodes", 13020, true),
    ("cuGraphNodeGetType", 13020, true),
    ("cuGraphLaunch", 13020, true),
    ("cuGraphExecDestroy", 13020, false),
    ("cuStreamWriteValue32", 13020, true),
    ("cuMemHostRegister", 13020, true),
    ("cuMemHostGetDevicePointer", 13020, true),
];

/// The symbols without which a graph (or an executable graph) cannot be destroyed, so the owners
/// of what went into it are never dropped: right, since the driver may still run it.
const KEEP_GRAPHS: &[&str] = &["cuGraphDestroy", "cuGraphExecDestroy"];

/// In the child: everything with `symbol` hidden. Every call typed, nothing panics, every owner
/// dropped exactly once (at most once for what went into a graph, without [`KEEP_GRAPHS`]), every
/// launch that worked ran once per run.
fn without(symbol: &str, surfaces: bool) {
    let _ = fake();
    let mut t = Tally::default();
    exercise(&mut t);
    t.assert_typed();
    // Without a way to destroy graphs, what they hold stays; everything else goes exactly once.
    t.assert_owners_dropped_once(KEEP_GRAPHS.contains(&symbol));
    let missing: Vec<&str> = t
        .rows
        .iter()
        .filter(|(_, o)| matches!(o, Outcome::Missing(_)))
        .map(|(n, _)| *n)
        .collect();
    if surfaces {
        assert!(!missing.is_empty(), "hiding {symbol} surfaced nowhere");
    }
    println!("without {symbol}: {}", t.summary());
}

/// Each symbol hidden in turn, each in a process of its own (two at a time).
#[test]
fn every_call_without_each_symbol_the_crate_uses() {
    let name = test_path(
        module_path!(),
        "every_call_without_each_symbol_the_crate_uses",
    );
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| {
                while let Some(&(symbol, version, surfaces)) =
                    SYMBOLS.get(next.fetch_add(1, Ordering::SeqCst))
                {
                    let envs = [
                        ("FAKE_CUDA_MISSING", symbol.to_string()),
                        ("FAKE_CUDA_VERSION", version.to_string()),
                        (
                            "CUDA_DL_SYS_LIBRARY",
                            fake_driver_path().display().to_string(),
                        ),
                    ];
                    in_own_process(&name, &envs, || {
                        if std::env::var("FAKE_CUDA_MISSING").as_deref() == Ok(symbol) {
                            without(symbol, surfaces);
                        }
                    });
                }
            });
        }
    });
    if std::env::var_os(ISOLATED_TEST_ENV).is_none() {
        println!(
            "{} symbols hidden, one process each, in {:?}",
            SYMBOLS.len(),
            started.elapsed()
        );
    }
}

isolated_test! {
    /// The toolkit's stub library: every public call returns `StubLibrary` (or needs no driver),
    /// no owner outlives its failed launch, nothing panics.
    fn every_call_on_the_stub_library_is_stub_library(
        FAKE_CUDA_STUB = "1",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let _ = fake();
        let mut t = Tally::default();
        exercise(&mut t);
        t.assert_typed();
        t.assert_owners_dropped_once(false);
        let ok: Vec<&str> = t
            .rows
            .iter()
            .filter(|(_, o)| *o == Outcome::Ok)
            .map(|(n, _)| *n)
            .collect();
        assert_eq!(
            ok,
            [
                "config",
                "Config::install",
                "in_host_function",
                "flush",
                "flush (end)"
            ],
            "calls that worked on the stub"
        );
        assert!(
            t.rows.iter().all(|(_, o)| matches!(o, Outcome::Ok | Outcome::Stub | Outcome::Skipped)),
            "{:?}",
            t.rows
        );
        assert!(t.probes.iter().all(|p| p.failed));
        println!("stub: {}", t.summary());
    }

    /// BUG: the table binds `cuDevicePrimaryCtxRelease` at its `_v2` ABI (11.0), so on an older
    /// driver `Release::drop` gets `DriverTooOld` and returns: the primary context is never
    /// released (nor reset, nor its pending owners reclaimed). The 7.0 export has the same
    /// signature and semantics.
    fn the_last_primary_context_is_released_on_a_10_2_driver(
        FAKE_CUDA_VERSION = "10020",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        assert_eq!(fake().live_objects("primary_retains"), 1);
        drop(context);
        assert_eq!(fake().live_objects("primary_retains"), 0, "the retain was never released");
    }
}
