//! The fake's one internal lock and the registries of live handles it guards.
//!
//! Every handle the fake gives out is the address of a small heap cell that is never freed, so a
//! handle value is never reused: a stale handle is simply absent from its registry. Nothing is ever
//! read through a handle.

use std::collections::{BTreeMap, VecDeque};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUgraphEdgeData, CUhostFn, CUresult, CUstream, CUstreamCaptureMode};

/// A host function as the worker calls it.
pub(crate) type HostFn = unsafe extern "C" fn(*mut c_void);

/// The state of the whole fake driver.
pub(crate) struct State {
    pub(crate) contexts: BTreeMap<usize, Context>,
    /// Device ordinal → its primary context's handle (which stays the same for the process).
    pub(crate) primary: BTreeMap<i32, usize>,
    pub(crate) streams: BTreeMap<usize, Stream>,
    pub(crate) events: BTreeMap<usize, Event>,
    pub(crate) captures: BTreeMap<u64, Capture>,
    pub(crate) graphs: BTreeMap<usize, Graph>,
    pub(crate) nodes: BTreeMap<usize, Node>,
    pub(crate) execs: BTreeMap<usize, Exec>,
    pub(crate) user_objects: BTreeMap<usize, UserObject>,
    /// Hold token → released yet.
    pub(crate) holds: BTreeMap<u64, bool>,
    /// Start address → the allocation there (device, stream-ordered or page-locked host memory:
    /// see `memory.rs`).
    pub(crate) allocations: BTreeMap<usize, crate::memory::Allocation>,
    /// Feeds the thread that runs user-object destructors (started on first use).
    pub(crate) destructor: Option<Sender<(HostFn, usize)>>,
    /// Stream id → operations enqueued and completed (see `oracle.rs`).
    pub(crate) progress: crate::oracle::ProgressMap,
    /// Ids of contexts that died with a sticky error (see `oracle::context_poisoned`).
    pub(crate) died_poisoned: std::collections::BTreeSet<u64>,
    next_id: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    contexts: BTreeMap::new(),
    primary: BTreeMap::new(),
    streams: BTreeMap::new(),
    events: BTreeMap::new(),
    captures: BTreeMap::new(),
    graphs: BTreeMap::new(),
    nodes: BTreeMap::new(),
    execs: BTreeMap::new(),
    user_objects: BTreeMap::new(),
    holds: BTreeMap::new(),
    allocations: BTreeMap::new(),
    destructor: None,
    progress: BTreeMap::new(),
    died_poisoned: std::collections::BTreeSet::new(),
    next_id: 1,
});

/// Notified whenever anything a waiter might wait for changes (an operation finished or was
/// enqueued, a hold was released, a context was poisoned or is stopping).
static CHANGED: Condvar = Condvar::new();

/// Locks a mutex, ignoring poisoning: the fake's data stays consistent between statements, and a
/// panic must never turn into another panic inside an `extern "C"` function.
pub(crate) fn relock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Takes the fake's internal lock.
pub(crate) fn lock() -> MutexGuard<'static, State> {
    relock(&STATE)
}

/// Waits for the next change, with the lock released meanwhile.
pub(crate) fn wait(guard: MutexGuard<'static, State>) -> MutexGuard<'static, State> {
    CHANGED
        .wait(guard)
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// As [`wait`], but for at most `timeout` (for waits on memory that the host writes without
/// telling the fake).
pub(crate) fn wait_timeout(
    guard: MutexGuard<'static, State>,
    timeout: Duration,
) -> MutexGuard<'static, State> {
    CHANGED
        .wait_timeout(guard, timeout)
        .map_or_else(|poisoned| poisoned.into_inner().0, |(guard, _)| guard)
}

/// Wakes every waiter.
pub(crate) fn notify() {
    CHANGED.notify_all();
}

/// A new handle value: the address of a heap cell that is never freed.
pub(crate) fn new_handle() -> usize {
    Box::into_raw(Box::new(0u64)).expose_provenance()
}

/// A handle as the pointer type the C API passes around.
pub(crate) fn as_ptr<T>(handle: usize) -> *mut T {
    std::ptr::with_exposed_provenance_mut(handle)
}

impl State {
    /// A fresh number for contexts, streams, captures and hold tokens.
    pub(crate) fn next_id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }
}

/// A number for the calling thread, unique for the process (per-thread default streams key on it).
pub(crate) fn thread_number() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    thread_local! {
        static NUMBER: u64 = NEXT.fetch_add(1, Ordering::Relaxed);
    }
    NUMBER.with(|n| *n)
}

pub(crate) struct Context {
    pub(crate) id: u64,
    pub(crate) device: i32,
    /// A device's primary context: refcounted, and its handle outlives deactivation.
    pub(crate) primary: bool,
    /// Retains of a primary context; a primary context with none is inactive (unusable).
    pub(crate) refcount: u32,
    pub(crate) flags: u32,
    /// Destruction (or a primary context's deactivation) has begun: the handle is no longer usable,
    /// except by the context's own worker, whose host functions may still enqueue work.
    pub(crate) closing: bool,
    /// A sticky error: nothing of this context runs any more.
    pub(crate) poisoned: Arc<AtomicBool>,
    /// The sticky error has been reported (a synchronize or query returned it): from then on
    /// work enqueued in the context is refused with it, as the real driver refuses it once the
    /// error has surfaced (before, it accepts work and never runs it).
    pub(crate) surfaced: AtomicBool,
    pub(crate) legacy_stream: usize,
    /// Thread number → that thread's per-thread default stream.
    pub(crate) per_thread_streams: BTreeMap<u64, usize>,
    /// Every stream of the context that may still hold work, in creation order.
    pub(crate) streams: Vec<usize>,
    pub(crate) worker: Option<std::thread::JoinHandle<()>>,
    /// Tells the worker to exit once it finds nothing runnable.
    pub(crate) stop: bool,
    /// Where the worker's round-robin scan resumes.
    pub(crate) cursor: usize,
}

impl Context {
    pub(crate) fn usable(&self) -> bool {
        !self.closing && (!self.primary || self.refcount > 0)
    }

    pub(crate) fn is_poisoned(&self) -> bool {
        self.poisoned.load(Ordering::Acquire)
    }

    /// Whether the context has a sticky error, which the caller reports now (so later enqueues
    /// are refused: see [`Context::surfaced`]).
    pub(crate) fn reports_poison(&self) -> bool {
        let poisoned = self.is_poisoned();
        if poisoned {
            self.surfaced.store(true, Ordering::Release);
        }
        poisoned
    }

    /// Whether work enqueued now is refused (the sticky error has surfaced).
    pub(crate) fn refuses_work(&self) -> bool {
        self.is_poisoned() && self.surfaced.load(Ordering::Acquire)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamKind {
    Created,
    Legacy,
    PerThread,
}

pub(crate) struct Stream {
    pub(crate) ctx: usize,
    pub(crate) id: u64,
    pub(crate) kind: StreamKind,
    pub(crate) flags: u32,
    pub(crate) priority: i32,
    pub(crate) queue: VecDeque<Op>,
    /// Host functions (0 for other work) of the operation the worker is running now, if any.
    pub(crate) running: Option<u64>,
    /// Destroyed by the user: the handle is invalid, but queued work still runs.
    pub(crate) destroyed: bool,
    pub(crate) capture: Option<StreamCapture>,
}

impl Stream {
    pub(crate) fn idle(&self) -> bool {
        self.queue.is_empty() && self.running.is_none()
    }
}

/// The capture a stream takes part in, and its current dependencies in the capture's graph.
pub(crate) struct StreamCapture {
    pub(crate) id: u64,
    pub(crate) deps: Vec<usize>,
    /// All-default edge data, one per dependency (what `cuStreamGetCaptureInfo_v3` hands out).
    pub(crate) edges: Vec<CUgraphEdgeData>,
}

impl StreamCapture {
    pub(crate) fn new(id: u64, deps: Vec<usize>) -> StreamCapture {
        let edges = vec![CUgraphEdgeData::default(); deps.len()];
        StreamCapture { id, deps, edges }
    }

    pub(crate) fn set_deps(&mut self, deps: Vec<usize>) {
        self.edges = vec![CUgraphEdgeData::default(); deps.len()];
        self.deps = deps;
    }
}

/// One stream-ordered operation.
pub(crate) enum Op {
    HostFn {
        f: HostFn,
        data: usize,
    },
    Callback {
        f: unsafe extern "C" fn(CUstream, CUresult, *mut c_void),
        stream: usize,
        data: usize,
    },
    /// Device work that blocks its stream until released.
    Hold {
        token: u64,
    },
    Record {
        record: Arc<Record>,
    },
    /// `cuStreamWaitValue32/64`: the stream waits until the word at `addr` meets the condition.
    WaitValue {
        addr: usize,
        value: u64,
        /// `CU_STREAM_WAIT_VALUE_GEQ` 0, `EQ` 1, `AND` 2, `NOR` 3 (the flush bit removed).
        condition: u32,
        wide: bool,
    },
    Wait {
        record: Arc<Record>,
    },
    Write32 {
        addr: usize,
        value: u32,
    },
    Write64 {
        addr: usize,
        value: u64,
    },
    Launch {
        actions: Arc<[Action]>,
        /// References to user objects that this launch holds until it finishes.
        user_objects: Vec<(usize, u32)>,
    },
    /// A copy, a set or a stream-ordered free (`memory_op.rs`).
    Memory(crate::memory_op::MemoryOp),
}

impl Op {
    /// How many host functions this operation runs.
    pub(crate) fn host_functions(&self) -> u64 {
        match self {
            Op::HostFn { .. } | Op::Callback { .. } => 1,
            Op::Launch { actions, .. } => actions
                .iter()
                .filter(|a| matches!(a, Action::Host { .. }))
                .count() as u64,
            _ => 0,
        }
    }
}

/// One `cuEventRecord` outside a capture: whether the stream reached it, and when.
#[derive(Default)]
pub(crate) struct Record {
    at: OnceLock<Instant>,
}

impl Record {
    /// Whether the driver thread has completed it.
    pub(crate) fn done(&self) -> bool {
        self.at.get().is_some()
    }

    /// When it completed, if it has.
    pub(crate) fn completed_at(&self) -> Option<Instant> {
        self.at.get().copied()
    }

    /// Marks it completed, now (the driver thread, in stream order).
    pub(crate) fn complete(&self) {
        let _ = self.at.set(Instant::now());
    }
}

pub(crate) struct Event {
    pub(crate) ctx: usize,
    /// The most recent record, if it was ever recorded outside a capture.
    pub(crate) last_record: Option<Arc<Record>>,
    /// Whether it keeps timestamps (not created with `CU_EVENT_DISABLE_TIMING`).
    pub(crate) timing: bool,
    /// Recorded in a capture: the capture and the recording stream's dependencies then.
    pub(crate) capture: Option<(u64, Vec<usize>)>,
}

pub(crate) struct Capture {
    pub(crate) origin: usize,
    pub(crate) graph: usize,
    pub(crate) invalidated: bool,
    /// The mode given to `cuStreamBeginCapture` (how it interacts with other threads' calls).
    pub(crate) mode: CUstreamCaptureMode,
    /// The thread that began it ([`thread_number`]).
    pub(crate) thread: u64,
    /// Every stream that joined, the origin included.
    pub(crate) streams: Vec<usize>,
}

pub(crate) struct Graph {
    /// In creation order.
    pub(crate) nodes: Vec<usize>,
    /// User object → references this graph owns.
    pub(crate) user_objects: BTreeMap<usize, u32>,
}

#[derive(Clone, Copy)]
pub(crate) enum NodeKind {
    Host {
        f: CUhostFn,
        data: usize,
    },
    Empty,
    Kernel,
    Write32 {
        addr: usize,
        value: u32,
    },
    Write64 {
        addr: usize,
        value: u64,
    },
    /// A copy captured from an `Async` copy: `len` bytes from `src` to `dst`, both memory the
    /// device reaches, read and written at each launch.
    Memcpy {
        dst: usize,
        src: usize,
        len: usize,
    },
    /// A set captured from an `Async` set: `count` values of `width` bytes at `dst`.
    Memset {
        dst: usize,
        value: u32,
        width: usize,
        count: usize,
    },
}

pub(crate) struct Node {
    pub(crate) graph: usize,
    pub(crate) kind: NodeKind,
    pub(crate) deps: Vec<usize>,
}

/// What a graph launch does, node by node in a topological order.
pub(crate) enum Action {
    Host {
        f: HostFn,
        data: usize,
    },
    Write32 {
        addr: usize,
        value: u32,
    },
    Write64 {
        addr: usize,
        value: u64,
    },
    Memcpy {
        dst: usize,
        src: usize,
        len: usize,
    },
    Memset {
        dst: usize,
        value: u32,
        width: usize,
        count: usize,
    },
}

pub(crate) struct Exec {
    pub(crate) actions: Arc<[Action]>,
    pub(crate) user_objects: Vec<(usize, u32)>,
}

pub(crate) struct UserObject {
    pub(crate) data: usize,
    pub(crate) destroy: HostFn,
    pub(crate) refcount: u64,
}
