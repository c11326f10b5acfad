//! Every driver call the crates make, failing in turn, at each of its positions in an operation.
//!
//! For each operation (every launch form on a plain stream and on the special streams, the futures
//! of `completion`/`completion_with` (the default, an event where the driver has the event
//! transport; a host function; the low-latency flags, and a first low-latency completion in a new
//! context, which registers its page of flags; the default on a created context's stream, which
//! finds it is not primary and falls back) and `host_launch_async`, `release_after` and
//! `spawn_after`, repeatable launches and a
//! refused run-once launch on a capturing stream, graph host nodes, graph, stream, event, context
//! and device calls, and the `Drop`s that destroy driver objects), the test first
//! learns which driver functions one successful run calls, from the fake's call counters (reset,
//! run, read what moved: nothing is listed by hand). Then, for each function `f` and each call
//! position `n` of it, it injects a fault (`CUDA_ERROR_OUT_OF_MEMORY`) on exactly the `n`th call of
//! `f` and checks:
//!
//! - the operation returns `Error::Cuda(Driver)` with that code, naming `f`; or, for the `Drop`s,
//!   whose driver calls are cleanup the crate deliberately does not report, that nothing panics
//!   (what leaks then is listed in [`TOLERATED`]);
//! - the owners of the launch are dropped exactly once (a run-once launch: on the caller's thread,
//!   before the error returns), and the function never runs;
//! - nothing is left pending (`pending_launches`, the fake's pending host functions), except the
//!   record of an event-based operation whose look after the record failed (see
//!   [`CAPTURE_QUERIES`]): it stays pending, and a reset of the context drops its owners once; no
//!   node is
//!   left in the graph or capture (the capture can still be ended, and replaying the graph runs only
//!   the node added before), no driver object, user object or context-stack entry is left behind;
//! - nothing was called on a driver thread;
//! - with the fault cleared, the same operation works again, calling the same functions.
//!
//! Then, for each failing case, the calls that only its error path makes (the rollback:
//! `cuGraphReleaseUserObject`, `cuUserObjectRelease`, and the error description's
//! `cuGetErrorName`/`cuGetErrorString`) fail too, at each position, and the same holds: the error
//! still names `f` with its code (the description falls back to the built-in table), and the owners
//! are dropped exactly once (if the graph keeps them, when it is destroyed), except in the one case
//! the crate deliberately leaks (see [`DELIBERATE_LEAK`]).
//!
//! Each driver version that changes the calls made (12.0+ `cuGetProcAddress_v2` with the 12.3
//! capture query and the 13.2 sync mode; 12.2 with `cuStreamIsCapturing` and the 11.3 capture
//! query found through `cuGetProcAddress_v2`; 11.4 through `cuGetProcAddress`; 10.2 through the
//! exports, with no user objects) runs the matrix in a process of its own. Each prints how many
//! (function, position) cases it covered.
//!
//! `PrimaryContext::reset` and the last release of a primary context, with launches pending after
//! a sticky error, have tests of their own below.
//!
//! Found by this matrix, and fixed (see the two tests at the end): `Stream::new`,
//! `Stream::new_non_blocking` and `Event::new` leaked the object they created when
//! `cuCtxPopCurrent` failed after it; a low-latency completion freed its new page of flags without
//! unregistering it when `cuMemHostGetDevicePointer` failed; the event pools ignored a failed
//! `cuCtxPopCurrent`, so a completion on a created context's stream succeeded with that context
//! left pushed on the caller's thread.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::c_void;
use std::future::Future;
use std::pin::Pin;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{
    CUcontext, CUgraph, CUgraphNodeType, CUresult, CUstream, CUstreamCaptureMode,
};
use cuda_host_launch::{
    CompletionMode, Device, Error, Event, Graph, GraphExec, GraphNode, HostTaskSyncMode,
    LaunchError, LaunchOptions, PrimaryContext, RawStream, Stream, add_host_node, completion,
    host_launch, host_launch_async, launch_host_function, launch_host_function_with_bytes,
    pending_launches, reclaim_pending, release_after, spawn_after,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::Probe;
use cuda_workspace::testing::bump;
use cuda_workspace::testing::{
    Drops, ExportCalls, ThreadInfo, fake, fake_driver_path, fake_primary_context, load_fake_driver,
};

/// The code every injected fault returns.
const FAULT: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
const FAULT_NAME: &str = "CUDA_ERROR_OUT_OF_MEMORY";

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// Failures the crate tolerates on purpose: cleanup calls in `Drop`, which cannot report an error.
/// Each such fault leaves the object (or the retain) to the driver: the listed effect is what the
/// test observes, then undoes through the raw handle.
///
/// `*` stands for every operation: when `cuCtxPopCurrent` fails (after a `cuCtxPushCurrent` of the
/// crate's), the driver did not pop, so the context stays pushed on the calling thread; the crate
/// returns the error (or, in a `Drop`, ignores it) and cannot do more.
const TOLERATED: &[(&str, &str, &str)] = &[
    (
        "*",
        "cuCtxPopCurrent",
        "the context stays pushed on the calling thread",
    ),
    (
        "drop(Stream)",
        "cuCtxPushCurrent",
        "the stream is not destroyed (leaked)",
    ),
    ("drop(Stream)", "cuStreamDestroy", "the stream is leaked"),
    (
        "drop(Event)",
        "cuCtxPushCurrent",
        "the event is not destroyed (leaked)",
    ),
    ("drop(Event)", "cuEventDestroy", "the event is leaked"),
    (
        "drop(Graph)",
        "cuGraphDestroy",
        "the graph is leaked, and with it the owners of its host node until it is destroyed",
    ),
    (
        "drop(GraphExec)",
        "cuGraphExecDestroy",
        "the executable graph is leaked",
    ),
    (
        "drop(PrimaryContext)",
        "cuDevicePrimaryCtxRelease",
        "the retain is leaked",
    ),
    (
        "drop(PrimaryContext)",
        "cuDevicePrimaryCtxGetState",
        "nothing (not the last release, so no reclaim was due)",
    ),
    (
        "completion_with(LowLatency, a new context)",
        "cuCtxPopCurrent",
        "the completion works; the context that registered its flags stays pushed",
    ),
    (
        "completion (Auto: a created context, a host function)",
        "cuDevicePrimaryCtxRelease",
        "the completion works; the retain taken to compare the contexts is leaked",
    ),
];

/// The one failure the crate resolves by leaking: the graph refused the user object
/// (`cuGraphRetainUserObject`) and dropping our reference failed too (`cuUserObjectRelease`). The
/// user object still holds the record and the driver might still call its destructor, so freeing
/// the record would risk a use after free: the owners are never dropped. [`kept_for_good`] lists
/// the others of its kind.
const DELIBERATE_LEAK: (&str, &str) = ("cuGraphRetainUserObject", "cuUserObjectRelease");

/// Whether the crate keeps a graph-owned record for good after these failures (its owners never
/// dropped, its user object left referenced), the operation succeeding: the caller's own reference
/// of the user object (`transport::user_object`) cannot be let go (`cuUserObjectRelease`), or, for
/// a repeatable launch on a capturing stream, the look after the launch (the last capture query,
/// the first being the look before) cannot tell that the capture went on throughout the launch, so
/// the host function may be a plain one on the stream, whose call no one can time; and the
/// [`DELIBERATE_LEAK`]. (A second failure in the error's description changes none of these.)
fn kept_for_good(op: Op, fault: Option<&Fault>, rollback: Option<&Fault>) -> bool {
    let is = |f: Option<&Fault>, base: &str| f.is_some_and(|f| f.base == base);
    let captured_repeatable = matches!(
        op,
        Op::CapturedHostLaunchRepeatable | Op::CapturedLaunchRepeatable | Op::CapturedWithSyncMode
    );
    (is(fault, DELIBERATE_LEAK.0) && is(rollback, DELIBERATE_LEAK.1))
        || (matches!(op.family(), Family::Capture | Family::Node)
            && is(fault, "cuUserObjectRelease"))
        || (captured_repeatable
            && fault.is_some_and(|f| {
                f.last && f.nth >= 2 && CAPTURE_QUERIES.contains(&f.base.as_str())
            }))
}

/// The capture queries: their last call in an event-based operation is the look after the
/// event's record, whose failure leaves the record pending until the context's reset (it is then
/// reclaimed: the test resets the context and checks that its owners are dropped once).
const CAPTURE_QUERIES: &[&str] = &["cuStreamIsCapturing", "cuStreamGetCaptureInfo"];

/// Leaks this test finds and reports as a bug (see the module docs): (operation, failing call).
const KNOWN_LEAKS: &[(&str, &str)] = &[];

/// A failure, then the failure of the call that would clean up after it: what it would have
/// destroyed stays (there is nothing else to do), and is leaked on purpose.
const UNDESTROYABLE: &[(&str, &str, &str)] = &[
    (
        "cuStreamGetCaptureInfo",
        "cuDevicePrimaryCtxRelease",
        "an event pool's retain, given back once a failed look after the record stranded its \
         event, when the release fails too",
    ),
    (
        "cuStreamIsCapturing",
        "cuDevicePrimaryCtxRelease",
        "the same on drivers before 12.3 (the look is cuStreamIsCapturing)",
    ),
    (
        "cuStreamGetId",
        "cuStreamDestroy",
        "a stream made before its id could not be read, when destroying it fails too",
    ),
    (
        "cuCtxGetId",
        "cuStreamDestroy",
        "a stream made before its context's id could not be read, when destroying it fails too",
    ),
    (
        "cuCtxPopCurrent",
        "cuStreamDestroy",
        "a stream made before a failed pop, when destroying it fails too",
    ),
    (
        "cuCtxPopCurrent",
        "cuEventDestroy",
        "an event made before a failed pop, when destroying it fails too",
    ),
    (
        "cuMemHostGetDevicePointer",
        "cuMemHostUnregister",
        "a registered page of flags (kept, not freed, so its address is never reused)",
    ),
];

unsafe extern "C" fn bump_from_bytes(data: *mut c_void) {
    // SAFETY: the copied bytes are the exposed address of an `AtomicUsize` the probe keeps alive.
    let address = unsafe { data.cast::<usize>().read_unaligned() };
    // SAFETY: as above: the address of a live `AtomicUsize`, exposed by `Probe::address_bytes`.
    unsafe { &*ptr::with_exposed_provenance::<AtomicUsize>(address) }
        .fetch_add(1, Ordering::SeqCst);
}

/// The operations under test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    HostLaunch,
    HostLaunchWithSyncMode,
    LaunchHostFunction,
    LaunchWithBytes,
    HostLaunchRepeatable,
    LaunchRepeatable,
    HostLaunchOnRawStream,
    HostLaunchOnLegacyStream,
    Completion,
    CompletionInCreatedContext,
    CompletionHostFunction,
    CompletionLowLatency,
    CompletionLowLatencyNewContext,
    HostLaunchAsync,
    ReleaseAfter,
    SpawnAfter,
    CapturedHostLaunchRepeatable,
    CapturedLaunchRepeatable,
    CapturedWithSyncMode,
    CapturedRunOnceRefused,
    AddHostNode,
    AddHostNodeAfterDependency,
    AddHostNodeWithSyncMode,
    AddHostNodeRaw,
    DeviceGet,
    DeviceCount,
    DeviceName,
    ContextRetain,
    ContextSetCurrent,
    ContextSynchronize,
    StreamNew,
    StreamNewNonBlocking,
    StreamSynchronize,
    StreamIsIdle,
    EventNew,
    EventRecord,
    EventMakeWait,
    EventSynchronize,
    EventIsComplete,
    GraphNew,
    GraphClone,
    GraphInstantiate,
    GraphLaunch,
    GraphNodeTypes,
    DropStream,
    DropEvent,
    DropGraph,
    DropGraphExec,
    DropContext,
}

const OPS: &[Op] = &[
    Op::HostLaunch,
    Op::HostLaunchWithSyncMode,
    Op::LaunchHostFunction,
    Op::LaunchWithBytes,
    Op::HostLaunchRepeatable,
    Op::LaunchRepeatable,
    Op::HostLaunchOnRawStream,
    Op::HostLaunchOnLegacyStream,
    Op::Completion,
    Op::CompletionInCreatedContext,
    Op::CompletionHostFunction,
    Op::CompletionLowLatency,
    Op::CompletionLowLatencyNewContext,
    Op::HostLaunchAsync,
    Op::ReleaseAfter,
    Op::SpawnAfter,
    Op::CapturedHostLaunchRepeatable,
    Op::CapturedLaunchRepeatable,
    Op::CapturedWithSyncMode,
    Op::CapturedRunOnceRefused,
    Op::AddHostNode,
    Op::AddHostNodeAfterDependency,
    Op::AddHostNodeWithSyncMode,
    Op::AddHostNodeRaw,
    Op::DeviceGet,
    Op::DeviceCount,
    Op::DeviceName,
    Op::ContextRetain,
    Op::ContextSetCurrent,
    Op::ContextSynchronize,
    Op::StreamNew,
    Op::StreamNewNonBlocking,
    Op::StreamSynchronize,
    Op::StreamIsIdle,
    Op::EventNew,
    Op::EventRecord,
    Op::EventMakeWait,
    Op::EventSynchronize,
    Op::EventIsComplete,
    Op::GraphNew,
    Op::GraphClone,
    Op::GraphInstantiate,
    Op::GraphLaunch,
    Op::GraphNodeTypes,
    Op::DropStream,
    Op::DropEvent,
    Op::DropGraph,
    Op::DropGraphExec,
    Op::DropContext,
];

/// How an operation's outcome is checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    /// A launch on a stream that is not capturing: runs once.
    Launch,
    /// A launch on a capturing stream (one repeatable node is captured before it).
    Capture,
    /// A host node added to a graph (which has one node already).
    Node,
    /// A resource or query call; owns no host function.
    Resource,
    /// A `Drop` that destroys a driver object: its failures are tolerated.
    Drop,
}

impl Op {
    /// Whether it records an event for the event poller (`completion`'s `Auto` does where the
    /// driver has the event transport: `events`).
    fn by_event(self, events: bool) -> bool {
        matches!(self, Op::ReleaseAfter | Op::SpawnAfter) || (self == Op::Completion && events)
    }

    fn family(self) -> Family {
        use Op::*;
        match self {
            HostLaunch
            | HostLaunchWithSyncMode
            | LaunchHostFunction
            | LaunchWithBytes
            | HostLaunchRepeatable
            | LaunchRepeatable
            | HostLaunchOnRawStream
            | HostLaunchOnLegacyStream
            | Completion
            | CompletionInCreatedContext
            | CompletionHostFunction
            | CompletionLowLatency
            | CompletionLowLatencyNewContext
            | HostLaunchAsync
            | ReleaseAfter
            | SpawnAfter => Family::Launch,
            CapturedHostLaunchRepeatable
            | CapturedLaunchRepeatable
            | CapturedWithSyncMode
            | CapturedRunOnceRefused => Family::Capture,
            AddHostNode | AddHostNodeAfterDependency | AddHostNodeWithSyncMode | AddHostNodeRaw => {
                Family::Node
            }
            DropStream | DropEvent | DropGraph | DropGraphExec | DropContext => Family::Drop,
            _ => Family::Resource,
        }
    }

    fn name(self) -> &'static str {
        use Op::*;
        match self {
            HostLaunch => "host_launch",
            HostLaunchWithSyncMode => "host_launch_with(sync mode)",
            LaunchHostFunction => "launch_host_function",
            LaunchWithBytes => "launch_host_function_with_bytes",
            HostLaunchRepeatable => "host_launch_repeatable (not capturing)",
            LaunchRepeatable => "launch_host_function_repeatable (not capturing)",
            HostLaunchOnRawStream => "host_launch(RawStream)",
            HostLaunchOnLegacyStream => "host_launch(RawStream::LEGACY)",
            Completion => "completion (Auto: an event)",
            CompletionInCreatedContext => "completion (Auto: a created context, a host function)",
            CompletionHostFunction => "completion_with(HostFunction)",
            CompletionLowLatency => "completion_with(LowLatency)",
            CompletionLowLatencyNewContext => "completion_with(LowLatency, a new context)",
            HostLaunchAsync => "host_launch_async",
            ReleaseAfter => "release_after",
            SpawnAfter => "spawn_after",
            CapturedHostLaunchRepeatable => "host_launch_repeatable (capturing)",
            CapturedLaunchRepeatable => "launch_host_function_repeatable (capturing)",
            CapturedWithSyncMode => "host_launch_repeatable(sync mode, capturing)",
            CapturedRunOnceRefused => "host_launch (capturing: refused)",
            AddHostNode => "add_host_node",
            AddHostNodeAfterDependency => "add_host_node(after a node)",
            AddHostNodeWithSyncMode => "add_host_node_with(sync mode)",
            AddHostNodeRaw => "add_host_node_raw",
            DeviceGet => "Device::get",
            DeviceCount => "Device::count",
            DeviceName => "Device::name",
            ContextRetain => "PrimaryContext::retain",
            ContextSetCurrent => "PrimaryContext::set_current",
            ContextSynchronize => "PrimaryContext::synchronize",
            StreamNew => "Stream::new",
            StreamNewNonBlocking => "Stream::new_non_blocking",
            StreamSynchronize => "Stream::synchronize",
            StreamIsIdle => "Stream::is_idle",
            EventNew => "Event::new",
            EventRecord => "Event::record",
            EventMakeWait => "Event::make_wait",
            EventSynchronize => "Event::synchronize",
            EventIsComplete => "Event::is_complete",
            GraphNew => "Graph::new",
            GraphClone => "Graph::try_clone",
            GraphInstantiate => "Graph::instantiate",
            GraphLaunch => "GraphExec::launch",
            GraphNodeTypes => "Graph::node_types",
            DropStream => "drop(Stream)",
            DropEvent => "drop(Event)",
            DropGraph => "drop(Graph)",
            DropGraphExec => "drop(GraphExec)",
            DropContext => "drop(PrimaryContext)",
        }
    }
}

/// What every operation shares.
struct Env {
    driver: &'static Driver,
    context: Arc<PrimaryContext>,
    /// For launches and graph launches (`None` only while the context is reset).
    stream: Option<Stream>,
    /// Captured by the capture family (as `stream`).
    capture: Option<Stream>,
    spin: LaunchOptions,
    /// User objects deliberately left referenced so far (see [`DELIBERATE_LEAK`]).
    stranded: u64,
    /// Event-based operations whose record waited for a reset (see [`CAPTURE_QUERIES`]).
    strands: usize,
    /// Whether the driver has the event transport (12.0+).
    events: bool,
}

impl Env {
    fn stream(&self) -> &Stream {
        self.stream.as_ref().expect("the stream")
    }

    fn capture(&self) -> &Stream {
        self.capture.as_ref().expect("the capture stream")
    }

    /// Resets the primary context (its streams dropped first, then made again), which reclaims
    /// what an event-based operation left pending, then gives the event poller its pool again (as
    /// every case before found it).
    fn reset_context(&mut self) {
        drop(self.stream.take());
        drop(self.capture.take());
        // SAFETY: every stream of the context is dropped, and nothing made in it is used after
        // the reset.
        unsafe { self.context.reset() }.expect("the reset");
        self.context.set_current().unwrap();
        self.stream = Some(Stream::new_non_blocking(&self.context).unwrap());
        self.capture = Some(Stream::new_non_blocking(&self.context).unwrap());
        self.events = warm_event_pool(self.stream());
    }
}

/// Makes the event poller's pool of the stream's context (one release through it), where the
/// driver has the event transport (12.0+); returns whether it has.
fn warm_event_pool(stream: &Stream) -> bool {
    match release_after(stream, ()).map_err(|e| e.into_error()) {
        Ok(()) => {}
        Err(Error::NeedsNewerDriver { .. }) => return false,
        Err(e) => panic!("release_after: {e}"),
    }
    cuda_workspace::testing::wait_until(
        "the warming release",
        cuda_workspace::testing::PATIENCE,
        || pending_launches(None) == 0,
    );
    true
}

/// The future a completion or `host_launch_async` returned, with its output as a number.
type PendingValue = Pin<Box<dyn Future<Output = Result<usize, Error>> + Send>>;

/// What one run of an operation made and uses.
struct Run {
    probe: Probe,
    /// The host node added before the operation (capture and node families).
    baseline: Option<Probe>,
    baseline_node: Option<cuda_dl_sys::types::CUgraphNode>,
    graph: Option<Graph>,
    /// A graph the operation made from `graph` (`try_clone`).
    copy: Option<Graph>,
    exec: Option<GraphExec>,
    event: Option<Event>,
    stream: Option<Stream>,
    context: Option<Arc<PrimaryContext>>,
    /// The raw handle a `Drop` destroys, to undo a tolerated leak.
    raw: usize,
    /// The future a completion or `host_launch_async` returned.
    future: Option<PendingValue>,
    /// A context of the test's own (`cuCtxCreate`) and a stream of it.
    own_context: Option<(CUcontext, CUstream)>,
}

impl Run {
    fn new() -> Run {
        Run {
            probe: Probe::new(),
            baseline: None,
            baseline_node: None,
            graph: None,
            copy: None,
            exec: None,
            event: None,
            stream: None,
            context: None,
            raw: 0,
            future: None,
            own_context: None,
        }
    }
}

/// Counters of everything a failed operation could leave behind.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Snapshot {
    objects: BTreeMap<&'static str, u64>,
    user_objects: u64,
    stack_depth: u64,
    pending_launches: usize,
    pending_host_functions: u64,
}

const KINDS: &[&str] = &[
    "streams",
    "events",
    "graphs",
    "graph_execs",
    "graph_nodes",
    "contexts",
    "primary_retains",
    "holds",
    "host_registrations",
];

impl Snapshot {
    fn take() -> Snapshot {
        Snapshot {
            objects: KINDS.iter().map(|k| (*k, fake().live_objects(k))).collect(),
            user_objects: fake().referenced_user_objects(),
            stack_depth: fake().context_stack_depth(),
            pending_launches: pending_launches(None),
            pending_host_functions: fake().pending_host_functions(ptr::null_mut()),
        }
    }

    /// What grew since `before`, as `kind +n`.
    fn grown_since(&self, before: &Snapshot) -> Vec<String> {
        let mut grown: Vec<String> = KINDS
            .iter()
            .filter(|k| self.objects[**k] > before.objects[**k])
            .map(|k| format!("{k} +{}", self.objects[*k] - before.objects[*k]))
            .collect();
        if self.stack_depth > before.stack_depth {
            grown.push(format!(
                "context stack +{}",
                self.stack_depth - before.stack_depth
            ));
        }
        if self.user_objects > before.user_objects {
            grown.push(format!(
                "user objects +{}",
                self.user_objects - before.user_objects
            ));
        }
        grown
    }
}

type Counts = BTreeMap<String, ExportCalls>;

/// Runs `f` with the fake's counters reset, and returns what it called.
fn counted<R>(f: impl FnOnce() -> R) -> (R, Counts) {
    fake().reset_call_counts();
    let result = f();
    (result, fake().export_calls())
}

/// Calls of `name` in `counts`, the way a fault set on `name` counts them (a base name matches
/// every variant).
fn matched(counts: &Counts, name: &str) -> u64 {
    counts
        .iter()
        .filter(|(export, calls)| *export == name || calls.base == name)
        .map(|(_, calls)| calls.count)
        .sum()
}

fn describe(counts: &Counts) -> String {
    counts
        .iter()
        .map(|(export, calls)| format!("{export}×{}", calls.count))
        .collect::<Vec<_>>()
        .join(", ")
}

/// An injected fault: the `nth` call of the export `export` (whose base symbol is `base`).
#[derive(Debug, Clone)]
struct Fault {
    export: String,
    base: String,
    nth: u64,
    /// Whether it is the last call of the export in a successful run.
    last: bool,
}

impl Fault {
    fn set(&self) {
        fake().set_fault(&self.export, self.nth, FAULT.0);
    }
}

/// Begins a capture on `env.capture()`.
fn begin_capture(env: &Env) {
    // SAFETY: a live stream.
    unsafe {
        env.driver
            .cuStreamBeginCapture(env.capture().raw(), RELAXED)
    }
    .expect("cuStreamBeginCapture");
}

/// Prepares a run of `op` (nothing here is counted). `Err` if the driver cannot do it at all.
fn prepare(env: &Env, op: Op) -> Result<Run, Error> {
    let mut run = Run::new();
    match op.family() {
        Family::Capture => {
            begin_capture(env);
            let baseline = Probe::new();
            let options = LaunchOptions::default();
            let added = options.host_launch_repeatable(env.capture(), baseline.closure());
            match added.map_err(LaunchError::into_error) {
                Ok(()) => run.baseline = Some(baseline),
                // Without user objects (before 11.3) nothing repeatable can be captured, but a
                // run-once launch is still refused: test that on an empty capture.
                Err(_) if op == Op::CapturedRunOnceRefused => {}
                Err(e) => {
                    end_capture(env).expect("the capture can be ended");
                    return Err(e);
                }
            }
        }
        Family::Node => {
            let graph = Graph::new()?;
            let baseline = Probe::new();
            run.baseline_node = Some(add_host_node(&graph, &[], baseline.closure())?.raw());
            run.baseline = Some(baseline);
            run.graph = Some(graph);
        }
        Family::Launch | Family::Resource | Family::Drop => {}
    }
    match op {
        Op::EventRecord | Op::EventIsComplete => run.event = Some(Event::new(&env.context)?),
        Op::EventMakeWait | Op::EventSynchronize => {
            let event = Event::new(&env.context)?;
            event.record(env.stream())?;
            run.event = Some(event);
        }
        Op::GraphClone | Op::GraphInstantiate | Op::GraphLaunch | Op::GraphNodeTypes => {
            let graph = Graph::new()?;
            let baseline = Probe::new();
            let first = add_host_node(&graph, &[], baseline.closure())?;
            if op == Op::GraphNodeTypes {
                add_host_node(&graph, &[first], run.probe.closure())?;
            }
            if op == Op::GraphLaunch {
                run.exec = Some(graph.instantiate()?);
            }
            run.baseline = Some(baseline);
            run.graph = Some(graph);
        }
        Op::DropStream => {
            let stream = Stream::new(&env.context)?;
            run.raw = stream.raw().addr();
            run.stream = Some(stream);
        }
        Op::DropEvent => {
            let event = Event::new(&env.context)?;
            run.raw = event.raw().addr();
            run.event = Some(event);
        }
        Op::DropGraph => {
            let graph = Graph::new()?;
            let baseline = Probe::new();
            add_host_node(&graph, &[], baseline.closure())?;
            run.raw = graph.raw().addr();
            run.baseline = Some(baseline);
            run.graph = Some(graph);
        }
        Op::DropGraphExec => {
            let graph = Graph::new()?;
            let exec = graph.instantiate()?;
            run.raw = exec.raw().addr();
            run.exec = Some(exec);
            run.graph = Some(graph);
        }
        Op::DropContext => run.context = Some(PrimaryContext::retain(Device::get(0)?)?),
        Op::CompletionLowLatencyNewContext | Op::CompletionInCreatedContext => {
            // A fresh context, so that the completion registers a page of flags in it (or finds
            // out afresh that it is not primary, and falls back to a host function).
            let (mut context, mut stream, mut popped) =
                (ptr::null_mut(), ptr::null_mut(), ptr::null_mut());
            // SAFETY: valid out-pointers; `cuCtxCreate` pushes the new context, which is popped
            // once the stream is made.
            unsafe {
                let device = env.context.device().raw();
                env.driver
                    .cuCtxCreate(&mut context, ptr::null_mut(), 0, device)?;
                env.driver.cuStreamCreate(&mut stream, 0)?;
                env.driver.cuCtxPopCurrent(&mut popped)?;
            }
            run.own_context = Some((context, stream));
        }
        _ => {}
    }
    Ok(run)
}

/// A failed operation: its error, and what it handed back (the owners or closure of a refused
/// launch, dropped by [`case`] once it has looked at them).
struct Refused {
    error: Error,
    handed_back: Option<Box<dyn Send>>,
}

impl From<Error> for Refused {
    fn from(error: Error) -> Refused {
        Refused {
            error,
            handed_back: None,
        }
    }
}

impl<T: Send + 'static> From<LaunchError<T>> for Refused {
    fn from(error: LaunchError<T>) -> Refused {
        let (error, value) = error.into_parts();
        Refused {
            error,
            handed_back: value.map(|v| Box::new(v) as Box<dyn Send>),
        }
    }
}

/// The operation itself: the only part whose driver calls are counted and faulted.
fn operate(env: &Env, op: Op, run: &mut Run) -> Result<(), Refused> {
    let probe = &run.probe;
    let default = LaunchOptions::default();
    match op {
        Op::HostLaunch => host_launch(env.stream(), probe.closure()).map_err(Into::into),
        Op::HostLaunchWithSyncMode => env
            .spin
            .host_launch(env.stream(), probe.closure())
            .map_err(Into::into),
        // SAFETY: `bump` only touches the counter, which the owners keep alive; it does not unwind.
        Op::LaunchHostFunction => unsafe {
            launch_host_function(env.stream(), Some(bump), probe.data(), probe.owners())
                .map_err(Into::into)
        },
        // SAFETY: the bytes are the address of the probe's counter, alive until after the run.
        Op::LaunchWithBytes => unsafe {
            launch_host_function_with_bytes(
                env.stream(),
                Some(bump_from_bytes),
                &probe.address_bytes(),
            )
            .map_err(Into::into)
        },
        Op::HostLaunchRepeatable => default
            .host_launch_repeatable(env.stream(), probe.closure())
            .map_err(Into::into),
        // SAFETY: as for `LaunchHostFunction`; `bump` may run any number of times.
        Op::LaunchRepeatable => unsafe {
            default
                .launch_host_function_repeatable(
                    env.stream(),
                    Some(bump),
                    probe.data(),
                    probe.owners(),
                )
                .map_err(Into::into)
        },
        Op::HostLaunchOnRawStream => {
            // SAFETY: `env.stream()` outlives the launch.
            let raw = unsafe { RawStream::from_raw(env.stream().raw()) };
            host_launch(raw, probe.closure()).map_err(Into::into)
        }
        Op::HostLaunchOnLegacyStream => {
            host_launch(RawStream::LEGACY, probe.closure()).map_err(Into::into)
        }
        Op::Completion => {
            let done = completion(env.stream())?;
            run.future = Some(Box::pin(async move { done.await.map(|()| 0) }));
            Ok(())
        }
        Op::CompletionInCreatedContext => {
            let (_, stream) = run.own_context.expect("a context of our own");
            // SAFETY: the stream lives until `settle` destroys it, after the completion.
            let stream = unsafe { RawStream::from_raw(stream) };
            let done = completion(stream)?;
            run.future = Some(Box::pin(async move { done.await.map(|()| 0) }));
            Ok(())
        }
        Op::CompletionHostFunction => {
            let done = CompletionMode::HostFunction.completion(env.stream())?;
            run.future = Some(Box::pin(async move { done.await.map(|()| 0) }));
            Ok(())
        }
        Op::ReleaseAfter => release_after(env.stream(), probe.owners()).map_err(Into::into),
        Op::SpawnAfter => spawn_after(env.stream(), probe.closure()).map_err(Into::into),
        Op::CompletionLowLatency => {
            let done = CompletionMode::LowLatency.completion(env.stream())?;
            run.future = Some(Box::pin(async move { done.await.map(|()| 0) }));
            Ok(())
        }
        Op::CompletionLowLatencyNewContext => {
            let (_, stream) = run.own_context.expect("a context of our own");
            // SAFETY: the stream lives until `settle` destroys it, after the completion.
            let stream = unsafe { RawStream::from_raw(stream) };
            let done = CompletionMode::LowLatency.completion(stream)?;
            run.future = Some(Box::pin(async move { done.await.map(|()| 0) }));
            Ok(())
        }
        Op::HostLaunchAsync => {
            let (runs, owner) = (probe.counter(), probe.drops.owner());
            let value = host_launch_async(env.stream(), move || {
                let _keep = &owner;
                runs.fetch_add(1, Ordering::SeqCst) + 7
            })?;
            run.future = Some(Box::pin(value));
            Ok(())
        }
        Op::CapturedHostLaunchRepeatable => default
            .host_launch_repeatable(env.capture(), probe.closure())
            .map_err(Into::into),
        // SAFETY: as for `LaunchRepeatable`.
        Op::CapturedLaunchRepeatable => unsafe {
            default
                .launch_host_function_repeatable(
                    env.capture(),
                    Some(bump),
                    probe.data(),
                    probe.owners(),
                )
                .map_err(Into::into)
        },
        Op::CapturedWithSyncMode => env
            .spin
            .host_launch_repeatable(env.capture(), probe.closure())
            .map_err(Into::into),
        Op::CapturedRunOnceRefused => match host_launch(env.capture(), probe.closure()) {
            Err(refused) if matches!(refused.error(), Error::CaptureActive { .. }) => {
                // Handed back, alive until the caller drops it (here).
                assert!(
                    probe.drops.records().is_empty(),
                    "refused: the crate dropped it"
                );
                assert!(refused.is_handed_back(), "refused, but not handed back");
                drop(refused);
                let records = probe.drops.records();
                assert_eq!(records.len(), 1, "handed back, dropped here");
                assert!(records[0].thread.same_as(&ThreadInfo::current()));
                Ok(())
            }
            Ok(()) => panic!("a run-once launch on a capturing stream was accepted"),
            Err(e) => Err(e.into()),
        },
        Op::AddHostNode => add_host_node(graph(run), &[], probe.closure())
            .map(drop)
            .map_err(Into::into),
        Op::AddHostNodeAfterDependency => {
            let graph = graph(run);
            // SAFETY: the baseline node was added to this run's graph, which still holds it.
            let after = [unsafe {
                GraphNode::from_raw(graph, run.baseline_node.expect("the baseline node"))
            }];
            add_host_node(graph, &after, probe.closure())
                .map(drop)
                .map_err(Into::into)
        }
        Op::AddHostNodeWithSyncMode => env
            .spin
            .add_host_node(graph(run), &[], probe.closure())
            .map(drop)
            .map_err(Into::into),
        // SAFETY: a live graph of this thread; `bump` as above.
        Op::AddHostNodeRaw => unsafe {
            default
                .add_host_node_raw(
                    graph(run).raw(),
                    &[],
                    Some(bump),
                    probe.data(),
                    probe.owners(),
                )
                .map(drop)
                .map_err(Into::into)
        },
        _ => operate_resource(env, op, run).map_err(Into::into),
    }
}

/// The operations that take no owners: resources, graphs, drops.
fn operate_resource(env: &Env, op: Op, run: &mut Run) -> Result<(), Error> {
    match op {
        Op::DeviceGet => Device::get(0).map(drop),
        Op::DeviceCount => Device::count().map(|n| assert_eq!(n, 1)),
        Op::DeviceName => env.context.device().name().map(drop),
        Op::ContextRetain => {
            run.context = Some(PrimaryContext::retain(Device::get(0)?)?);
            Ok(())
        }
        Op::ContextSetCurrent => env.context.set_current(),
        Op::ContextSynchronize => env.context.synchronize(),
        Op::StreamNew => {
            run.stream = Some(Stream::new(&env.context)?);
            Ok(())
        }
        Op::StreamNewNonBlocking => {
            run.stream = Some(Stream::new_non_blocking(&env.context)?);
            Ok(())
        }
        Op::StreamSynchronize => env.stream().synchronize(),
        Op::StreamIsIdle => env.stream().is_idle().map(|idle| assert!(idle)),
        Op::EventNew => {
            run.event = Some(Event::new(&env.context)?);
            Ok(())
        }
        Op::EventRecord => event(run).record(env.stream()),
        Op::EventMakeWait => event(run).make_wait(env.stream()),
        Op::EventSynchronize => event(run).synchronize(),
        Op::EventIsComplete => event(run).is_complete().map(drop),
        Op::GraphNew => {
            run.graph = Some(Graph::new()?);
            Ok(())
        }
        Op::GraphClone => {
            run.copy = Some(graph(run).try_clone()?);
            Ok(())
        }
        Op::GraphInstantiate => {
            run.exec = Some(graph(run).instantiate()?);
            Ok(())
        }
        Op::GraphLaunch => run.exec.as_ref().expect("an exec").launch(env.stream()),
        Op::GraphNodeTypes => {
            let types = graph(run).node_types()?;
            assert_eq!(types.len(), 2);
            assert!(
                types
                    .iter()
                    .all(|(_, t)| *t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST)
            );
            Ok(())
        }
        Op::DropStream => {
            drop(run.stream.take());
            Ok(())
        }
        Op::DropEvent => {
            drop(run.event.take());
            Ok(())
        }
        Op::DropGraph => {
            drop(run.graph.take());
            Ok(())
        }
        Op::DropGraphExec => {
            drop(run.exec.take());
            Ok(())
        }
        Op::DropContext => {
            drop(run.context.take());
            Ok(())
        }
        _ => unreachable!("{} takes owners: see operate", op.name()),
    }
}

/// Wakes the thread that waits in [`block_on`].
struct ThreadWaker(std::thread::Thread);

impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// Polls `future` to its end on this thread (bounded: panics after a while).
fn block_on<T>(mut future: Pin<Box<dyn Future<Output = T> + Send>>) -> T {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + cuda_workspace::testing::PATIENCE;
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future never resolved");
        std::thread::park_timeout(Duration::from_millis(10));
    }
}

fn graph(run: &Run) -> &Graph {
    run.graph.as_ref().expect("a graph")
}

fn event(run: &Run) -> &Event {
    run.event.as_ref().expect("an event")
}

fn end_capture(env: &Env) -> Result<Graph, cuda_dl_sys::Error> {
    let mut raw: CUgraph = ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    unsafe {
        env.driver
            .cuStreamEndCapture(env.capture().raw(), &mut raw)?
    };
    // SAFETY: the graph the capture made, owned by nobody else.
    Ok(unsafe { Graph::from_raw(raw) })
}

fn host_nodes(graph: &Graph) -> usize {
    graph
        .node_types()
        .expect("node types")
        .iter()
        .filter(|(_, t)| *t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST)
        .count()
}

/// How a run went, as [`settle`] checks it.
struct Outcome<'a> {
    result: Result<(), Error>,
    /// Whether the error handed the owners back (dropped by [`case`] after they were counted).
    handed_back: bool,
    /// The fault that should have made it fail (`None`: it must succeed).
    fault: Option<&'a Fault>,
    /// A second fault in its error path.
    rollback: Option<&'a Fault>,
    /// Owners dropped before the operation returned (before what it handed back was dropped).
    dropped_while_held: usize,
    /// Owners dropped once the caller dropped what the operation handed back, and whether all on
    /// this thread.
    dropped_at_once: usize,
    dropped_here: bool,
    /// Pending launches right after the operation returned.
    pending_at_once: usize,
    /// Host memory registrations right after the operation returned.
    registrations_at_once: u64,
}

/// What a case showed beyond the checks: a tolerated effect, or a leak.
#[derive(Default)]
struct Effects {
    tolerated: Vec<String>,
    leaked: Vec<String>,
}

/// Checks the outcome of a run and tears its state down (nothing here is counted).
fn settle(env: &mut Env, op: Op, mut run: Run, outcome: Outcome<'_>, before: &Snapshot) -> Effects {
    let me = ThreadInfo::current();
    let label = format!(
        "{} with {:?} then {:?}",
        op.name(),
        outcome.fault.map(|f| (&f.export, f.nth)),
        outcome.rollback.map(|f| (&f.export, f.nth))
    );
    let failed = outcome.result.is_err();
    // The second look of an event-based enqueue (after the record) that cannot tell whether a
    // capture began meanwhile: a capture may hold the event, so the record is never queried and
    // waits for the context's reset (never early), as `release_after` documents.
    let stranded = failed
        && op.by_event(env.events)
        && outcome
            .fault
            .is_some_and(|f| f.last && CAPTURE_QUERIES.contains(&f.base.as_str()));
    let tolerated = op.family() == Family::Drop
        || outcome.fault.is_some_and(|f| {
            TOLERATED
                .iter()
                .any(|(o, c, _)| *o == op.name() && *c == f.base)
        });
    match (outcome.fault, &outcome.result) {
        (None, Ok(())) => {}
        (None, Err(e)) => panic!("{label}: failed without a fault: {e:?}"),
        (Some(_), Ok(())) if tolerated || kept_for_good(op, outcome.fault, outcome.rollback) => {}
        (Some(fault), result) => assert_names(result, fault, &label),
    }
    let leak_expected = kept_for_good(op, outcome.fault, outcome.rollback);
    // A failure whose clean-up call fails too leaves the object it would have destroyed.
    let undestroyable = outcome.fault.zip(outcome.rollback).is_some_and(|(f, r)| {
        UNDESTROYABLE
            .iter()
            .any(|(a, b, _)| *a == f.base && *b == r.base)
    });
    let made = run.probe.drops.made();
    if failed && !stranded && op.family() == Family::Launch {
        // Handed back, alive until the caller dropped them (never dropped by the crate: earlier
        // work on the stream may still use them), then gone.
        assert_eq!(
            (outcome.handed_back, outcome.dropped_while_held),
            (made > 0, 0),
            "{label}: a refused launch's owners were not handed back"
        );
        assert_eq!(
            outcome.dropped_at_once, made,
            "{label}: the owners handed back outlived their caller's drop"
        );
        assert!(
            outcome.dropped_here,
            "{label}: owners dropped on another thread"
        );
    }
    if stranded {
        assert!(
            !outcome.handed_back,
            "{label}: handed back what a capture may hold"
        );
    }
    let mut effects = Effects::default();
    if stranded {
        assert_eq!(
            (outcome.pending_at_once, outcome.dropped_at_once),
            (1, 0),
            "{label}: the record waits for the context's reset"
        );
        env.reset_context();
        run.probe.drops.wait_dropped(made);
        env.strands += 1;
    } else if failed {
        assert_eq!(
            outcome.pending_at_once, 0,
            "{label}: a failed launch is still pending"
        );
        // Host memory registered by a failed completion must be kept (as a page of flags for the
        // next completion in that context) or unregistered. Checked now, since destroying the
        // context drops the registration anyway: if the next completion registers a page again,
        // the failed one's page was not kept.
        let registered = before.objects["host_registrations"];
        if let Some((_, stream)) = run.own_context
            && outcome.registrations_at_once > registered
        {
            // SAFETY: the context's stream, alive until destroyed below.
            let stream = unsafe { RawStream::from_raw(stream) };
            let (next, calls) = counted(|| CompletionMode::LowLatency.completion(stream));
            let next = match next {
                Ok(next) => block_on(Box::pin(next)).map_err(|e| e.to_string()),
                Err(e) => Err(e.to_string()),
            };
            // A page that stays registered must not be handed back to the allocator: the next
            // completion registering a page at the same address would fail.
            if matched(&calls, "cuMemHostRegister") > 0 && next.is_err() {
                effects.leaked.push(format!(
                    "{label}: its page of flags was freed but stays registered (host \
                     registrations +{}); the next completion registers a page again: {next:?}",
                    outcome.registrations_at_once - registered
                ));
            }
        }
    }

    // Let everything run, then check what ran and what is left.
    let launched = !failed
        && !matches!(
            op,
            Op::CapturedRunOnceRefused | Op::DropContext | Op::DropGraph
        );
    match op.family() {
        Family::Launch => {
            if op == Op::HostLaunchOnLegacyStream {
                env.context.synchronize().expect("synchronize");
            } else {
                env.stream().synchronize().expect("synchronize");
            }
            if let Some(future) = run.future.take() {
                let value = block_on(future).unwrap_or_else(|e| panic!("{label}: {e}"));
                assert_eq!(value, if op == Op::HostLaunchAsync { 7 } else { 0 });
            }
            if let Some((context, stream)) = run.own_context.take() {
                // SAFETY: our own context and its stream, destroyed once; the destroy runs what is
                // pending first, and nobody launches into the context any more.
                unsafe {
                    env.driver.cuStreamDestroy(stream).expect("cuStreamDestroy");
                    env.driver.cuCtxDestroy(context).expect("cuCtxDestroy");
                    assert_eq!(reclaim_pending(context), 0, "{label}: reclaimed");
                }
            }
            if op.by_event(env.events) {
                // The poller completes it after the stream got there; the flush waits for the
                // round that runs its callback (a claimed launch is not pending any more, but its
                // callback may still be running).
                cuda_workspace::testing::wait_until(
                    &label,
                    cuda_workspace::testing::PATIENCE,
                    || pending_launches(None) == 0,
                );
                cuda_host_launch::flush(cuda_workspace::testing::PATIENCE).unwrap();
            }
            // A completion's host function (or flag write, or event) is the crate's, not the
            // probe's; a release runs nothing.
            let completion_only = matches!(
                op,
                Op::Completion
                    | Op::CompletionInCreatedContext
                    | Op::CompletionHostFunction
                    | Op::CompletionLowLatency
                    | Op::CompletionLowLatencyNewContext
                    | Op::ReleaseAfter
            );
            let runs = launched && !completion_only;
            assert_eq!(run.probe.runs(), usize::from(runs), "{label}: runs");
        }
        Family::Capture => {
            let graph = end_capture(env)
                .unwrap_or_else(|e| panic!("{label}: the capture cannot be ended: {e}"));
            let baseline = usize::from(run.baseline.is_some());
            assert_eq!(
                host_nodes(&graph),
                baseline + usize::from(launched),
                "{label}: nodes in the captured graph"
            );
            if baseline > 0 {
                replay(env, &graph, &run, launched, &label);
            }
        }
        Family::Node => {
            let graph = run.graph.take().expect("the graph");
            assert_eq!(
                host_nodes(&graph),
                1 + usize::from(launched),
                "{label}: nodes in the graph"
            );
            replay(env, &graph, &run, launched, &label);
        }
        Family::Resource => match op {
            Op::GraphClone => {
                let copies = run.copy.as_ref().map_or(0, host_nodes);
                assert_eq!(copies, usize::from(launched), "{label}: the copy's nodes");
            }
            Op::GraphLaunch => {
                env.stream().synchronize().expect("synchronize");
                let baseline = run.baseline.as_ref().expect("baseline").runs();
                assert_eq!(baseline, usize::from(launched), "{label}: graph runs");
            }
            Op::EventRecord | Op::EventMakeWait => env.stream().synchronize().expect("sync"),
            _ => {}
        },
        Family::Drop => {}
    }
    drop(run.exec.take());
    drop(run.copy.take());
    drop(run.graph.take());
    drop(run.event.take());
    drop(run.stream.take());
    drop(run.context.take());

    // Undo what a tolerated failure left to the driver: through the raw handle what a `Drop`
    // could not destroy, and the context a failed pop left pushed.
    let popped_failed = outcome.fault.is_some_and(|f| f.base == "cuCtxPopCurrent");
    if (tolerated && outcome.fault.is_some()) || popped_failed {
        let grown = Snapshot::take().grown_since(before);
        let (stack, objects): (Vec<String>, Vec<String>) = grown
            .into_iter()
            .partition(|g| g.starts_with("context stack"));
        let shown = if tolerated {
            [stack, objects].concat()
        } else {
            stack
        };
        if !shown.is_empty() {
            effects.tolerated.push(shown.join(", "));
        }
        undo_leak(env, op, run.raw, before);
    }
    // Owners: exactly once, unless deliberately leaked.
    let expected = if leak_expected { 0 } else { made };
    if expected > 0 {
        run.probe.drops.wait_dropped(expected);
    }
    cuda_host_launch::flush(cuda_workspace::testing::PATIENCE).expect("flush");
    assert_eq!(
        run.probe.drops.dropped(),
        expected,
        "{label}: owners dropped"
    );
    for record in run.probe.drops.records() {
        // Event work is released by the event poller itself: a `spawn_after` closure's captures
        // go when it returns, a `release_after`'s owners once the event completed.
        let poller = op.by_event(env.events) && record.thread.os_name == "cuda-hl-watch";
        assert!(
            record.thread.same_as(&me) || record.thread.is_reaper() || poller,
            "{label}: owners dropped on {:?}, neither the caller's thread nor the reaper",
            record.thread
        );
    }
    if let Some(baseline) = &run.baseline {
        baseline.drops.wait_dropped(baseline.drops.made());
    }
    if leak_expected {
        env.stranded += 1;
        assert_eq!(
            fake().referenced_user_objects(),
            env.stranded,
            "{label}: the stranded user object"
        );
    }
    let after = Snapshot::take();
    let grown = after.grown_since(before);
    let leak = !grown.is_empty() && !leak_expected && !undestroyable;
    if leak {
        effects
            .leaked
            .push(format!("{label}: {}", grown.join(", ")));
    }
    assert_eq!(after.pending_launches, 0, "{label}: pending launches");
    assert_eq!(
        after.pending_host_functions, 0,
        "{label}: pending host functions"
    );
    assert!(
        me.same_as(&ThreadInfo::current()),
        "settle runs on the test's thread"
    );
    assert_eq!(
        fake().driver_thread_call_count(""),
        0,
        "{label}: a driver call on a driver thread"
    );
    effects
}

/// Instantiates and launches `graph` once: the baseline node runs, the probe's node only if it
/// was added.
fn replay(env: &Env, graph: &Graph, run: &Run, added: bool, label: &str) {
    let exec = graph.instantiate().expect("instantiate");
    exec.launch(env.stream()).expect("launch");
    env.stream().synchronize().expect("synchronize");
    let baseline = run.baseline.as_ref().expect("baseline").runs();
    assert_eq!(baseline, 1, "{label}: the node added before did not run");
    assert_eq!(
        run.probe.runs(),
        usize::from(added),
        "{label}: the node's runs"
    );
}

/// Destroys, through its raw handle, what a tolerated `Drop` failure left behind; pops what it
/// left on the context stack.
fn undo_leak(env: &Env, op: Op, raw: usize, before: &Snapshot) {
    let d = env.driver;
    fn handle<T>(raw: usize) -> *mut T {
        ptr::with_exposed_provenance_mut(raw)
    }
    let grew = |kind: &str| fake().live_objects(kind) > before.objects[kind];
    // SAFETY: each handle is the live object the failed `Drop` left behind, destroyed once here;
    // the retain is the one the failed release kept.
    unsafe {
        match op {
            Op::DropStream if grew("streams") => d.cuStreamDestroy(handle(raw)).expect("destroy"),
            Op::DropEvent if grew("events") => d.cuEventDestroy(handle(raw)).expect("destroy"),
            Op::DropGraph if grew("graphs") => d.cuGraphDestroy(handle(raw)).expect("destroy"),
            Op::DropGraphExec if grew("graph_execs") => {
                d.cuGraphExecDestroy(handle(raw)).expect("destroy")
            }
            Op::DropContext | Op::CompletionInCreatedContext if grew("primary_retains") => {
                release_primary(d, env.context.device().raw())
            }
            _ => {}
        }
    }
    while fake().context_stack_depth() > before.stack_depth {
        let mut popped = ptr::null_mut();
        // SAFETY: a valid out-pointer; the stack holds an entry more than before.
        unsafe { d.cuCtxPopCurrent(&mut popped) }.expect("cuCtxPopCurrent");
    }
}

/// `result` is the injected fault, named after `fault`'s function.
#[track_caller]
fn assert_names(result: &Result<(), Error>, fault: &Fault, label: &str) {
    match result {
        Err(Error::Cuda(cuda_dl_sys::Error::Driver(e))) => {
            assert_eq!(e.code(), FAULT, "{label}: {e}");
            let function = e.function().unwrap_or("");
            assert!(
                function.starts_with(&fault.base) || function == fault.export,
                "{label}: the error names {function:?}, not {} ({})",
                fault.export,
                fault.base
            );
            assert_eq!(e.name(), FAULT_NAME, "{label}: {e}");
        }
        other => panic!(
            "{label}: expected {FAULT:?} from {}, got {other:?}",
            fault.export
        ),
    }
}

/// Runs `op` once (with `fault` and `rollback` set, if any) and checks it; returns the calls the
/// operation made and what it left.
fn case(
    env: &mut Env,
    op: Op,
    fault: Option<&Fault>,
    rollback: Option<&Fault>,
) -> (Counts, Effects) {
    let before = Snapshot::take();
    let mut run = prepare(env, op).unwrap_or_else(|e| panic!("{}: prepare: {e}", op.name()));
    for f in [fault, rollback].into_iter().flatten() {
        f.set();
    }
    let (result, counts) = counted(|| operate(env, op, &mut run));
    fake().clear_faults();
    // What a refused launch handed back is counted as alive first, then dropped here, by its
    // caller.
    let dropped_while_held = run.probe.drops.records().len();
    let (result, handed_back) = match result {
        Ok(()) => (Ok(()), None),
        Err(Refused { error, handed_back }) => (Err(error), handed_back),
    };
    let was_handed_back = handed_back.is_some();
    drop(handed_back);
    if let Some(f) = fault {
        assert!(
            matched(&counts, &f.export) >= f.nth,
            "{}: the fault {f:?} was never reached ({})",
            op.name(),
            describe(&counts)
        );
    }
    // A rollback call seen in an earlier failure may not happen again (a one-time symbol lookup):
    // then this run tested the single fault only, and the caller does not count it.
    let rollback = rollback.filter(|r| matched(&counts, &r.export) >= r.nth);
    let records = run.probe.drops.records();
    let me = ThreadInfo::current();
    let outcome = Outcome {
        result,
        handed_back: was_handed_back,
        fault,
        rollback,
        dropped_while_held,
        dropped_at_once: records.len(),
        dropped_here: records.iter().all(|r| r.thread.same_as(&me)),
        pending_at_once: pending_launches(None),
        registrations_at_once: fake().live_objects("host_registrations"),
    };
    let effects = settle(env, op, run, outcome, &before);
    (counts, effects)
}

/// What the matrix covered.
#[derive(Default)]
struct Report {
    cases: usize,
    rollback_cases: usize,
    lines: Vec<String>,
    tolerated: BTreeSet<(String, String, String)>,
    leaks: BTreeSet<(String, String)>,
    leak_details: Vec<String>,
    skipped: Vec<String>,
}

impl Report {
    /// Files a case's effects under its operation and failing call.
    fn note(&mut self, op: Op, fault: &Fault, effects: Effects) {
        for t in effects.tolerated {
            self.tolerated
                .insert((op.name().to_string(), fault.base.clone(), t));
        }
        if !effects.leaked.is_empty() {
            self.leak_details.extend(effects.leaked);
            self.leaks
                .insert((op.name().to_string(), fault.base.clone()));
        }
    }
}

/// The whole matrix for `op`.
fn matrix(env: &mut Env, op: Op, report: &mut Report) {
    // Warm up (resolve every entry the operation uses), or find it unsupported on this driver.
    let before = Snapshot::take();
    let warm = prepare(env, op).and_then(|mut run| {
        let result = operate(env, op, &mut run);
        let records = run.probe.drops.records();
        let outcome = Outcome {
            handed_back: false,
            dropped_while_held: records.len(),
            dropped_at_once: records.len(),
            dropped_here: true,
            pending_at_once: pending_launches(None),
            registrations_at_once: 0,
            result: Ok(()),
            fault: None,
            rollback: None,
        };
        match result {
            Ok(()) => {
                settle(env, op, run, outcome, &before);
                Ok(())
            }
            Err(refused) => {
                drop(refused.handed_back);
                drop(run);
                if op.family() == Family::Capture {
                    end_capture(env).expect("the capture can be ended");
                }
                cuda_host_launch::flush(cuda_workspace::testing::PATIENCE).expect("flush");
                Err(refused.error)
            }
        }
    });
    match warm {
        Ok(()) => {}
        Err(Error::Cuda(
            e
            @ (cuda_dl_sys::Error::DriverTooOld { .. } | cuda_dl_sys::Error::SymbolMissing { .. }),
        )) => {
            report.skipped.push(format!("{}: {e}", op.name()));
            return;
        }
        Err(e @ Error::NeedsNewerDriver { .. }) => {
            report.skipped.push(format!("{}: {e}", op.name()));
            return;
        }
        Err(e) => panic!("{}: fails without a fault: {e:?}", op.name()),
    }

    let (success, _) = case(env, op, None, None);
    if success.is_empty() {
        // Only a `Drop` may call nothing (it swallows `DriverTooOld`): nothing to fail.
        assert_eq!(op.family(), Family::Drop, "{}: no driver call", op.name());
        report.skipped.push(format!(
            "{}: makes no driver call on this driver",
            op.name()
        ));
        return;
    }
    let mut cases = 0;
    let mut rollback_cases = 0;
    let mut rollback_names = BTreeSet::new();
    for (export, calls) in &success {
        let count = matched(&success, export);
        for nth in 1..=count {
            let fault = Fault {
                export: export.clone(),
                base: calls.base.clone(),
                nth,
                last: nth == count,
            };
            let (failing, effects) = case(env, op, Some(&fault), None);
            report.note(op, &fault, effects);
            cases += 1;
            // The error path's own calls, failing too.
            for (r_export, r_calls) in failing.iter().filter(|(e, _)| !success.contains_key(*e)) {
                let r_count = matched(&failing, r_export);
                for r_nth in 1..=r_count {
                    let rollback = Fault {
                        export: r_export.clone(),
                        base: r_calls.base.clone(),
                        nth: r_nth,
                        last: r_nth == r_count,
                    };
                    let (counts, effects) = case(env, op, Some(&fault), Some(&rollback));
                    report.note(op, &fault, effects);
                    if matched(&counts, r_export) >= r_nth {
                        rollback_cases += 1;
                        rollback_names.insert(r_export.clone());
                    }
                }
            }
            // The fault is gone: the same operation works again, calling the same functions.
            let (again, _) = case(env, op, None, None);
            assert_eq!(
                describe(&again),
                describe(&success),
                "{}: calls after a failure",
                op.name()
            );
        }
    }
    report.cases += cases;
    report.rollback_cases += rollback_cases;
    report.lines.push(format!(
        "  {:<48} {:<80} {cases} cases, {rollback_cases} with a failing rollback ({})",
        op.name(),
        describe(&success),
        rollback_names.into_iter().collect::<Vec<_>>().join(", ")
    ));
}

/// Runs the matrix on this process's driver; returns the number of (function, position) cases.
fn fault_matrix(version: i32) -> usize {
    let started = Instant::now();
    let context = fake_primary_context();
    let driver = load_fake_driver();
    assert_eq!(driver.version().0, version);
    context.set_current().unwrap();
    let mut env = Env {
        driver,
        stream: Some(Stream::new_non_blocking(&context).unwrap()),
        capture: Some(Stream::new_non_blocking(&context).unwrap()),
        context,
        spin: LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait),
        stranded: 0,
        strands: 0,
        events: false,
    };
    // The event poller keeps its pool for the whole run (a pool made or given back during a case
    // would count as events made or destroyed by it), made now.
    cuda_host_launch::Config::new()
        .event_poller(cuda_host_launch::PollerSettings {
            idle_exit: Duration::from_secs(3600),
            ..cuda_host_launch::PollerSettings::DEFAULT
        })
        .install()
        .unwrap();
    env.events = warm_event_pool(env.stream());
    // Only this thread's calls are counted and faulted: the reaper's own (the context it makes
    // current for each launch's owners) come at moments of their own.
    fake().focus_calls_on_this_thread(true);
    let mut report = Report::default();
    for op in OPS {
        matrix(&mut env, *op, &mut report);
    }
    println!(
        "fault matrix on a {version} driver: {} (function, position) cases and {} more with a \
         failing rollback call, over {} operations, in {:?}",
        report.cases,
        report.rollback_cases,
        report.lines.len(),
        started.elapsed()
    );
    for line in &report.lines {
        println!("{line}");
    }
    for skipped in &report.skipped {
        println!("  skipped: {skipped}");
    }
    for (op, call, effect) in &report.tolerated {
        let documented = TOLERATED
            .iter()
            .find(|(o, c, _)| (*o == op || *o == "*") && c == call)
            .map_or("UNDOCUMENTED", |t| t.2);
        println!("  tolerated: {op} with {call} failing: {documented} ({effect})");
    }
    for (op, call) in &report.leaks {
        println!("  BUG (leak): {op} with {call} failing");
    }
    for detail in &report.leak_details {
        println!("    {detail}");
    }
    if env.strands > 0 {
        println!(
            "  {} event-based records left pending by a failed look after the record, each \
             reclaimed by a reset of the context",
            env.strands
        );
    }
    if env.stranded > 0 {
        println!(
            "  deliberate leaks: {} user objects (with their owners) kept for good (see \
             kept_for_good)",
            env.stranded
        );
    }

    // Every tolerated effect is one of the documented ones.
    for (op, call, _) in &report.tolerated {
        assert!(
            TOLERATED
                .iter()
                .any(|(o, c, _)| (*o == op || *o == "*") && c == call),
            "an undocumented tolerated failure: {op} with {call}"
        );
    }
    let leaks: BTreeSet<(&str, &str)> = report
        .leaks
        .iter()
        .map(|(o, c)| (o.as_str(), c.as_str()))
        .collect();
    let known: BTreeSet<(&str, &str)> = KNOWN_LEAKS
        .iter()
        .filter(|(op, _)| {
            !report
                .skipped
                .iter()
                .any(|s| s.starts_with(&format!("{op}:")))
        })
        .copied()
        .collect();
    assert_eq!(leaks, known, "leaks other than the known ones");
    report.cases
}

isolated_test! {
    /// 13.2 (`cuGetProcAddress_v2`, the 12.3 capture query, the 13.2 sync mode).
    fn every_call_failing_at_every_position_on_a_13_2_driver(
        FAKE_CUDA_VERSION = "13020",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let cases = fault_matrix(13020);
        assert!(cases >= 80, "only {cases} cases");
    }

    /// 12.2: `cuStreamIsCapturing`, and a repeatable launch's graph through the 11.3
    /// `cuStreamGetCaptureInfo`, looked up with `cuGetProcAddress_v2` at every capture.
    fn every_call_failing_at_every_position_on_a_12_2_driver(
        FAKE_CUDA_VERSION = "12020",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let cases = fault_matrix(12020);
        assert!(cases >= 70, "only {cases} cases");
    }

    /// 11.4: functions found through `cuGetProcAddress` (v1).
    fn every_call_failing_at_every_position_on_an_11_4_driver(
        FAKE_CUDA_VERSION = "11040",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let cases = fault_matrix(11040);
        assert!(cases >= 70, "only {cases} cases");
    }

    /// 10.2: functions found by export name; no user objects, so no captured launches or graph
    /// host nodes (skipped: `DriverTooOld`).
    fn every_call_failing_at_every_position_on_a_10_2_driver(
        FAKE_CUDA_VERSION = "10020",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let cases = fault_matrix(10020);
        assert!(cases >= 30, "only {cases} cases");
    }
}

/// How many launches each reset case leaves pending.
const PENDING: usize = 4;

/// Makes `PENDING` launches into `context` that will never run (half closures, half raw), each
/// with an owner of `drops`: the stream is held, the context poisoned, the stream dropped.
fn pending_on_a_poisoned_context(context: &Arc<PrimaryContext>, drops: &Arc<Drops>) {
    let stream = Stream::new(context).unwrap();
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    let probe = Probe::new();
    for i in 0..PENDING {
        if i % 2 == 0 {
            let owner = drops.owner();
            host_launch(&stream, move || {
                let _keep = &owner;
            })
            .unwrap();
        } else {
            // SAFETY: `bump` only touches the counter the owners keep alive.
            unsafe {
                launch_host_function(
                    &stream,
                    Some(bump),
                    probe.data(),
                    (drops.owner(), probe.counter()),
                )
            }
            .unwrap();
        }
    }
    assert_eq!(fake().poison_context(context.raw()), Ok(()));
    hold.release();
    drop(stream);
    assert_eq!(context.pending_launches(), PENDING);
}

/// Every (function, position) of `counts`, as faults.
fn faults_of(counts: &Counts) -> Vec<Fault> {
    counts
        .iter()
        .flat_map(|(export, calls)| {
            let count = matched(counts, export);
            (1..=count).map(move |nth| Fault {
                export: export.clone(),
                base: calls.base.clone(),
                nth,
                last: nth == count,
            })
        })
        .collect()
}

isolated_test! {
    /// `PrimaryContext::reset` after a sticky error, with each of its calls failing in turn (and
    /// each call of the error path too). Whatever fails, every pending owner is dropped exactly
    /// once, and never before the driver reset the context: if `cuDevicePrimaryCtxReset` itself
    /// fails, nothing is reclaimed (the error names it, the owners stay pending) and the next
    /// reset reclaims them all; a failure after the reset (re-activating the context) is reported,
    /// the owners having been reclaimed; a failure the reset ignores (clearing the current
    /// context) leaves it `Ok`. Afterwards the context works: a launch on a new stream runs.
    fn a_reset_with_any_call_failing_reclaims_every_pending_owner_exactly_once(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        load_fake_driver();
        // Only this thread's calls are counted and faulted: the reaper's (it clears the current
        // context around each record it releases) come at moments of their own, and a fault
        // meant for the reset could meet one of them (CI saw it: "reclaimed anyway").
        fake().focus_calls_on_this_thread(true);
        let context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        context.set_current().unwrap();
        // The first cycle warms up (resolves every entry); the second learns what a reset calls.
        let mut counts = Counts::new();
        for _ in 0..2 {
            let drops = Drops::new();
            pending_on_a_poisoned_context(&context, &drops);
            // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
            let (reclaimed, calls) = counted(|| unsafe { context.reset() });
            assert_eq!(reclaimed.unwrap(), PENDING);
            drops.wait_dropped(PENDING);
            context.set_current().unwrap();
            counts = calls;
        }
        let mut behaviours = BTreeSet::new();
        let mut cases = 0;
        let mut reset_case = |fault: &Fault, rollback: Option<&Fault>| -> Counts {
            let label = format!("reset with {fault:?} then {rollback:?}");
            let drops = Drops::new();
            pending_on_a_poisoned_context(&context, &drops);
            let old = context.raw();
            fault.set();
            if let Some(r) = rollback {
                r.set();
            }
            // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
            let (result, calls) = counted(|| unsafe { context.reset() });
            fake().clear_faults();
            cuda_host_launch::flush(cuda_workspace::testing::PATIENCE).unwrap();
            let behaviour = match &result {
                Err(_) if fault.base == "cuDevicePrimaryCtxReset" => {
                    assert_names(&result.map(drop), fault, &label);
                    assert_eq!(drops.dropped(), 0, "{label}: reclaimed without a reset");
                    assert_eq!(pending_launches(Some(old)), PENDING, "{label}");
                    // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
                    assert_eq!(unsafe { context.reset() }.unwrap(), PENDING, "{label}: the next reset");
                    "an error naming it; nothing reclaimed; the next reset reclaims everything"
                }
                Err(_) => {
                    assert_names(&result.map(drop), fault, &label);
                    "an error naming it, after the reset: the owners are reclaimed anyway"
                }
                Ok(reclaimed) => {
                    assert_eq!(*reclaimed, PENDING, "{label}");
                    "ignored: Ok, everything reclaimed"
                }
            };
            behaviours.insert(format!("{}: {behaviour}", fault.base));
            drops.wait_dropped(PENDING);
            assert_eq!(pending_launches(None), 0, "{label}");
            // The context works again.
            context.set_current().unwrap();
            let stream = Stream::new(&context).unwrap();
            let probe = Probe::new();
            host_launch(&stream, probe.closure()).unwrap();
            stream.synchronize().unwrap();
            probe.drops.wait_dropped(1);
            assert_eq!(probe.runs(), 1, "{label}: the context does not work");
            cases += 1;
            calls
        };
        for fault in faults_of(&counts) {
            let failing = reset_case(&fault, None);
            let rollbacks = faults_of(&failing);
            for rollback in rollbacks.iter().filter(|f| !counts.contains_key(&f.export)) {
                reset_case(&fault, Some(rollback));
            }
        }
        println!("PrimaryContext::reset: {cases} cases ({})", describe(&counts));
        for behaviour in &behaviours {
            println!("  {behaviour}");
        }
        assert!(cases >= 3);
        assert_eq!(fake().driver_thread_call_count(""), 0);
    }

    /// The last release of a poisoned primary context (dropping the last `PrimaryContext`) with
    /// each of its calls failing: a `Drop` cannot report, so the failure is tolerated, and the
    /// owners of the pending launches are then not reclaimed at once (the crate cannot know the
    /// context is gone, and reclaiming a live context's launches would be unsound). They are still
    /// dropped exactly once later: by a reset if the release failed (the context is still
    /// retained), by the next `flush` (which looks again) if only the state query failed.
    fn a_failed_last_release_leaves_the_pending_owners_to_a_later_reclaim(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let driver = load_fake_driver();
        // Only this thread's calls are counted and faulted (the reaper's come at moments of
        // their own; see the reset's case above).
        fake().focus_calls_on_this_thread(true);
        let device = Device::get(0).unwrap();
        // The first cycle warms up (resolves every entry); the second learns what a release calls.
        let mut counts = Counts::new();
        for _ in 0..2 {
            let drops = Drops::new();
            let context = PrimaryContext::retain(device).unwrap();
            pending_on_a_poisoned_context(&context, &drops);
            let ((), calls) = counted(|| drop(context));
            drops.wait_dropped(PENDING);
            assert_eq!(fake().live_objects("primary_retains"), 0);
            counts = calls;
        }
        let mut tolerated = Vec::new();
        for fault in faults_of(&counts) {
            let drops = Drops::new();
            let context = PrimaryContext::retain(device).unwrap();
            let raw = context.raw();
            pending_on_a_poisoned_context(&context, &drops);
            fault.set();
            drop(context);
            fake().clear_faults();
            assert_eq!(drops.dropped(), 0, "{fault:?}: reclaimed anyway");
            assert_eq!(pending_launches(Some(raw)), PENDING);
            if fake().live_objects("primary_retains") > 0 {
                // A flush looks again: the context lives (retained), so nothing is reclaimed.
                cuda_host_launch::flush(cuda_workspace::testing::PATIENCE).unwrap();
                assert_eq!(drops.dropped(), 0, "{fault:?}: reclaimed while retained");
                // The release failed: the context is still retained (and poisoned).
                let again = PrimaryContext::retain(device).unwrap();
                // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
                assert_eq!(unsafe { again.reset() }.unwrap(), PENDING, "{fault:?}: the reset");
                drop(again);
                // SAFETY: the retain the failed release kept, released once.
                unsafe { driver.cuDevicePrimaryCtxRelease(device.raw()) }.unwrap();
                tolerated.push(format!("{}: the retain is kept", fault.export));
            } else {
                // Released, but its state could not be read: not reclaimed then. The next flush
                // looks again and finds the context gone.
                cuda_host_launch::flush(cuda_workspace::testing::PATIENCE).unwrap();
                assert_eq!(pending_launches(Some(raw)), 0, "{fault:?}: the flush reclaims");
                tolerated.push(format!("{}: released, reclaimed by the next flush", fault.export));
            }
            drops.wait_dropped(PENDING);
            assert_eq!(fake().live_objects("primary_retains"), 0);
            assert_eq!(pending_launches(None), 0);
        }
        println!("last release of a poisoned PrimaryContext: {} cases: {}", tolerated.len(), tolerated.join("; "));
        assert_eq!(tolerated.len(), 2, "{counts:?}");
    }

    /// BUG: `Stream::new`, `Stream::new_non_blocking` and `Event::new` create the object inside
    /// `PrimaryContext::scoped`, which returns the pop's error after `f` succeeded and drops the
    /// handle `f` returned: when `cuCtxPopCurrent` fails, the stream or event exists in the driver
    /// and nobody can destroy it.
    fn creating_a_stream_or_event_leaks_nothing_when_cu_ctx_pop_current_fails(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let before = (fake().live_objects("streams"), fake().live_objects("events"));
        fake().set_fault("cuCtxPopCurrent", 1, FAULT.0);
        let stream = Stream::new(&context);
        fake().set_fault("cuCtxPopCurrent", 1, FAULT.0);
        let event = Event::new(&context);
        fake().clear_faults();
        assert!(stream.is_err() && event.is_err());
        drop((stream, event));
        assert_eq!(
            (fake().live_objects("streams"), fake().live_objects("events")),
            before,
            "a stream or event was created and is now unreachable"
        );
    }
}

isolated_test! {
    /// BUG: a low-latency completion makes a page of flags in a context the first time
    /// (`cuMemHostRegister`, then `cuMemHostGetDevicePointer`). If the second call fails,
    /// `new_page` frees the page's memory without `cuMemHostUnregister`: the driver keeps a
    /// registration of freed memory, and when the allocator hands the same page out again, the next
    /// completion's `cuMemHostRegister` fails (already registered) in that context.
    fn a_failed_low_latency_completion_leaves_no_host_memory_registered(
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let before = fake().live_objects("host_registrations");
        fake().set_fault("cuMemHostGetDevicePointer", 1, FAULT.0);
        let failed = CompletionMode::LowLatency.completion(&stream);
        fake().clear_faults();
        assert!(failed.is_err());
        let after = fake().live_objects("host_registrations");
        let next = CompletionMode::LowLatency.completion(&stream)
            .map(|done| block_on(Box::pin(done)));
        assert_eq!(after, before, "the page of flags was freed but is still registered");
        assert!(matches!(next, Ok(Ok(()))), "the next completion: {next:?}");
    }
}

/// `cuDevicePrimaryCtxRelease` through the table, or its 7.0 variant on drivers before 11.0 (as
/// `PrimaryContext` does).
fn release_primary(d: &Driver, device: cuda_dl_sys::types::CUdevice) {
    match d.raw().cuDevicePrimaryCtxRelease() {
        // SAFETY: a retained primary context of `device`, released once.
        Ok(release) => assert_eq!(
            unsafe { release(device) },
            cuda_dl_sys::types::CUresult::CUDA_SUCCESS
        ),
        Err(_) => {
            let p = d
                .get_proc_address("cuDevicePrimaryCtxRelease", 7000, d.default_stream())
                .expect("the 7.0 release");
            // SAFETY: PFN_cuDevicePrimaryCtxRelease_v7000 takes a CUdevice, returns a CUresult.
            let release: unsafe extern "C" fn(
                cuda_dl_sys::types::CUdevice,
            ) -> cuda_dl_sys::types::CUresult = unsafe { std::mem::transmute(p.as_ptr()) };
            // SAFETY: as above.
            assert_eq!(
                unsafe { release(device) },
                cuda_dl_sys::types::CUresult::CUDA_SUCCESS
            );
        }
    }
}
