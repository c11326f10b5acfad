//! Host-launch overhead against the raw driver call, measured in one run on a real GPU.
//!
//! `cargo bench --bench host_launch` on a GPU machine, or `BENCH=1 gpu-bundle/run` from the bundle
//! of `scripts/gpu-bundle`. Prints a table and writes the same figures to `bench-results.json` in the
//! working directory. Every figure of a wrapper is also given as a ratio to the floor (the raw
//! `cuLaunchHostFunc` through the cuda-dl-sys pointer) measured in the same run, interleaved with it.
//!
//! Methods (see BENCHMARKS.md): 1 raw floor; 2 `launch_host_function` with one small owner;
//! 3 `host_launch` with a closure capturing a small value; 4 the cust/CCCL way
//! (`cuStreamAddCallback`, a boxed closure freed on the driver thread).

use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUevent, CUevent_flags, CUresult, CUstream};
use cuda_host_launch::{
    PollerSettings, Stream, flush, host_launch, launch_host_function, pending_launches,
    release_after, spawn_after,
};
use cuda_workspace::gpu::{Gpu, MappedU32s, heap_in_use};

#[path = "host_launch/event_lanes.rs"]
mod event_lanes;
#[path = "host_launch/event_ring.rs"]
mod event_ring;
#[path = "host_launch/thread_costs.rs"]
mod thread_costs;

const N: usize = 200_000;
/// Repetitions of the throughput table (`BENCH_REPS` overrides, e.g. 1 for a quick run).
/// Other knobs: `BENCH_VARIANTS=0`, `BENCH_CALL_TIMES=0`, `BENCH_PIN=0`, `BENCH_TABLE_ONLY=1`.
fn reps() -> usize {
    std::env::var("BENCH_REPS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(15)
}
/// Repetitions in each variant child process.
const VARIANT_REPS: usize = 7;
const LATENCY_SAMPLES: usize = 2_000;
/// The event poller's settings for the default-poller rows: `PollerSettings::DEFAULT`, or with
/// `BENCH_POLLER_MAX_INTERVAL_US=N` its longest pause set to N µs (to compare settings).
fn default_poller() -> PollerSettings {
    let max = std::env::var("BENCH_POLLER_MAX_INTERVAL_US")
        .ok()
        .and_then(|v| v.trim().parse().ok());
    PollerSettings {
        max_interval: max.map_or(PollerSettings::DEFAULT.max_interval, Duration::from_micros),
        ..PollerSettings::DEFAULT
    }
}

/// Samples of a completion after a long kernel (about 20 ms each).
const LONG_WAIT_SAMPLES: usize = 50;
const PENDING: usize = 20_000;

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Method {
    Raw,
    Owner,
    Closure,
    Callback,
    /// The floor plus a `cuStreamGetCaptureInfo` before each launch: what the capture check costs
    /// under load.
    RawWithCaptureQuery,
    /// The floor plus a 32-byte allocation before and its free after each launch (same thread).
    RawWithAllocation,
    /// The floor with user data: the launcher writes 64 bytes, the host function reads them (what
    /// any launch that hands data to its host function pays in cache traffic).
    RawWithUserData,
    /// The floor whose host function spins for 150 ns, about what the trampoline takes on the
    /// driver's thread: does a longer host function make the launching thread's call slower?
    RawWithBusyHostFn150,
    /// The same with 500 ns, for the slope.
    RawWithBusyHostFn500,
    /// `release_after` with one small owner: an event, no host function.
    ReleaseAfter,
    /// `spawn_after` with a closure capturing a value: an event; the closure runs on the poller.
    SpawnAfter,
    /// The event transport's floor: `cuEventRecord` from a ring, a thread querying in order
    /// (`event_ring.rs`).
    RawEventRing,
}

/// The methods every table runs.
const METHODS: [Method; 12] = [
    Method::Raw,
    Method::Owner,
    Method::Closure,
    Method::Callback,
    Method::RawWithCaptureQuery,
    Method::RawWithAllocation,
    Method::RawWithUserData,
    Method::RawWithBusyHostFn150,
    Method::RawWithBusyHostFn500,
    Method::ReleaseAfter,
    Method::SpawnAfter,
    Method::RawEventRing,
];

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Raw => "raw cuLaunchHostFunc (floor)",
            Method::Owner => "launch_host_function + owner",
            Method::Closure => "host_launch closure",
            Method::Callback => "cuStreamAddCallback + Box<dyn FnOnce> (cust/CCCL)",
            Method::RawWithCaptureQuery => "  part: floor + cuStreamGetCaptureInfo",
            Method::RawWithAllocation => "  part: floor + 32-byte malloc/free",
            Method::RawWithUserData => "  part: floor + 64 bytes handed to the host fn",
            Method::RawWithBusyHostFn150 => "  part: floor, host fn busy 150 ns",
            Method::RawWithBusyHostFn500 => "  part: floor, host fn busy 500 ns",
            Method::ReleaseAfter => "release_after + owner (event, no host fn)",
            Method::SpawnAfter => "spawn_after closure (event, runs on the poller)",
            Method::RawEventRing => "  part: event floor: cuEventRecord ring + a poller",
        }
    }
    fn key(self) -> &'static str {
        match self {
            Method::Raw => "raw",
            Method::Owner => "owner",
            Method::Closure => "closure",
            Method::Callback => "callback",
            Method::RawWithCaptureQuery => "raw_with_capture_query",
            Method::RawWithAllocation => "raw_with_allocation",
            Method::RawWithUserData => "raw_with_user_data",
            Method::RawWithBusyHostFn150 => "raw_host_fn_busy_150ns",
            Method::RawWithBusyHostFn500 => "raw_host_fn_busy_500ns",
            Method::ReleaseAfter => "release_after",
            Method::SpawnAfter => "spawn_after",
            Method::RawEventRing => "raw_event_ring",
        }
    }
}

unsafe extern "C" fn noop(_: *mut c_void) {}

/// A ring of 64-byte blocks the "user data" floor hands to its host function.
static USER_DATA: [[std::sync::atomic::AtomicU64; 8]; 4096] =
    [const { [const { std::sync::atomic::AtomicU64::new(0) }; 8] }; 4096];

unsafe extern "C" fn read_block(data: *mut c_void) {
    // SAFETY: `data` points at one of USER_DATA's blocks.
    let block = unsafe { &*data.cast::<[std::sync::atomic::AtomicU64; 8]>() };
    let sum: u64 = block
        .iter()
        .map(|w| w.load(std::sync::atomic::Ordering::Relaxed))
        .sum();
    std::hint::black_box(sum);
}

/// Spins for `ns` nanoseconds (the user data, by value).
unsafe extern "C" fn busy(ns: *mut c_void) {
    let started = Instant::now();
    let wait = Duration::from_nanos(ns as u64);
    while started.elapsed() < wait {
        std::hint::spin_loop();
    }
}

/// The peer approach: cust's `add_callback` / CCCL's closure path.
unsafe extern "C" fn boxed_callback(_: CUstream, _: CUresult, data: *mut c_void) {
    // SAFETY: `data` is the Box leaked by `launch_callback`, taken back once, here.
    let f = unsafe { Box::from_raw(data.cast::<Box<dyn FnOnce() + Send>>()) };
    f();
}

/// The CPUs the benchmark pins its threads to: the launching thread, the driver's host-function
/// thread and the reaper, each on a core of its own (no two on sibling hyperthreads), so that the
/// scheduler moving them between repetitions does not add to the noise. `BENCH_PIN=0` turns it off.
struct Pinning {
    launcher: usize,
    driver: usize,
    reaper: usize,
    /// The pollers' (the crate's event poller, and the event floor's): a CPU of their own.
    poller: usize,
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; the size passed is its size.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: valid out-pointer of the size given; 0 is this thread.
    if unsafe { libc::sched_getaffinity(0, size_of::<libc::cpu_set_t>(), &mut set) } != 0 {
        return Vec::new();
    }
    // SAFETY: `set` is initialised; the index is below CPU_SETSIZE.
    (0..libc::CPU_SETSIZE as usize)
        .filter(|&c| unsafe { libc::CPU_ISSET(c, &set) })
        .collect()
}

/// (package, core) of a CPU, from sysfs; `None` where it cannot be read.
fn core_of(cpu: usize) -> Option<(String, String)> {
    let read = |what: &str| {
        std::fs::read_to_string(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{what}"))
            .ok()
            .map(|s| s.trim().to_string())
    };
    Some((read("physical_package_id")?, read("core_id")?))
}

fn choose_pinning() -> Option<Pinning> {
    if std::env::var("BENCH_PIN").is_ok_and(|v| v.trim() == "0") {
        return None;
    }
    let cpus = allowed_cpus();
    // CPU 0 takes most interrupts: start after it. One CPU per core, on CPU 1's package.
    let package = cpus.get(1).and_then(|&c| core_of(c)).map(|(p, _)| p);
    let mut cores_taken = Vec::new();
    let mut chosen = Vec::new();
    for &cpu in cpus.iter().skip(1) {
        let core = core_of(cpu);
        if let (Some((p, _)), Some(want)) = (&core, &package)
            && p != want
        {
            continue;
        }
        if core.is_some() && cores_taken.contains(&core) {
            continue;
        }
        cores_taken.push(core);
        chosen.push(cpu);
        if chosen.len() == 4 {
            return Some(Pinning {
                launcher: chosen[0],
                driver: chosen[1],
                reaper: chosen[2],
                poller: chosen[3],
            });
        }
    }
    None
}

/// Pins the calling thread to `cpu`; returns its thread id.
fn pin_current_thread(cpu: usize) -> i64 {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` is below CPU_SETSIZE (it came from sched_getaffinity).
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size given; 0 is the calling thread.
    let rc = unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    // A failure is reported as a negative thread id rather than a panic (which, on the driver's
    // thread, would abort the run).
    if rc == 0 { tid } else { -tid }
}

static PINNED_DRIVER_TID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
static PINNED_REAPER_TID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);
static SEEN_DRIVER_TID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// A host function that pins the driver's thread it runs on (`user_data` is the CPU). Benchmark
/// only: it makes a system call on the driver's thread, which no CUDA rule forbids.
unsafe extern "C" fn pin_driver_thread(cpu: *mut c_void) {
    let tid = pin_current_thread(cpu as usize);
    PINNED_DRIVER_TID.store(tid, std::sync::atomic::Ordering::SeqCst);
}

unsafe extern "C" fn note_driver_thread(_: *mut c_void) {
    // SAFETY: gettid has no preconditions.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) };
    SEEN_DRIVER_TID.store(tid, std::sync::atomic::Ordering::SeqCst);
}

/// An owner whose drop pins the thread that drops it: the reaper.
struct PinOnDrop(usize);
impl Drop for PinOnDrop {
    fn drop(&mut self) {
        let tid = pin_current_thread(self.0);
        PINNED_REAPER_TID.store(tid, std::sync::atomic::Ordering::SeqCst);
    }
}

/// Pins the three threads (see [`Pinning`]) and describes what was done.
fn pin_threads(bench: &Bench, streams: &[&Stream], plan: Option<&Pinning>) -> String {
    let Some(pin) = plan else {
        return "threads not pinned".into();
    };
    let launch = bench.gpu.driver.raw().cuLaunchHostFunc().unwrap();
    let stream = streams[0];
    // SAFETY: live stream; the function takes its CPU number by value.
    let code = unsafe {
        launch(
            stream.raw(),
            Some(pin_driver_thread),
            pin.driver as *mut c_void,
        )
    };
    assert_eq!(code, CUresult::CUDA_SUCCESS);
    stream.synchronize().unwrap();
    // SAFETY: `note_driver_thread` ignores its argument; the owner pins the reaper when dropped.
    unsafe {
        launch_host_function(
            streams[streams.len() - 1],
            Some(note_driver_thread),
            std::ptr::null_mut(),
            PinOnDrop(pin.reaper),
        )
    }
    .unwrap();
    streams[streams.len() - 1].synchronize().unwrap();
    flush(Duration::from_secs(10)).unwrap();
    // Last, so that the threads started above (the reaper) do not inherit this CPU.
    if pin_current_thread(pin.launcher) < 0 {
        return format!("pinning failed (sched_setaffinity to CPU {})", pin.launcher);
    }
    let ord = std::sync::atomic::Ordering::SeqCst;
    let (driver_tid, seen_tid) = (PINNED_DRIVER_TID.load(ord), SEEN_DRIVER_TID.load(ord));
    format!(
        "pinned: launching thread to CPU {}, the driver's host-function thread (tid {driver_tid}; \
         another stream's host function ran on tid {seen_tid}) to CPU {}, the reaper (tid {}) to CPU {} \
         (the launching thread for the throughput tables only)",
        pin.launcher,
        pin.driver,
        PINNED_REAPER_TID.load(ord),
        pin.reaper
    )
}

/// Lets the calling thread run on every CPU it was allowed at the start again, so that threads it
/// starts from now on (the low-latency poller) do not inherit its pinning.
fn unpin_current_thread(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    for &cpu in cpus {
        // SAFETY: `cpu` is below CPU_SETSIZE (it came from sched_getaffinity).
        unsafe { libc::CPU_SET(cpu, &mut set) };
    }
    // SAFETY: a valid set of the size given; 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) };
}

/// Median and quartiles of `values`.
fn quartiles(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    (
        percentile(&v, 0.5),
        percentile(&v, 0.25),
        percentile(&v, 0.75),
    )
}

/// Each repetition's figure of method `k` over the floor's figure in the same repetition.
fn paired_ratios(per_method: &[Vec<f64>], k: usize) -> Vec<f64> {
    per_method[k]
        .iter()
        .zip(&per_method[0])
        .map(|(x, floor)| x / floor)
        .collect()
}

struct Bench {
    gpu: Gpu,
    /// The event transport's floor ([`Method::RawEventRing`]).
    ring: event_ring::EventRing,
}

impl Bench {
    fn open() -> Bench {
        let gpu = Gpu::open();
        let ring = event_ring::EventRing::new(gpu.driver, gpu.context.raw());
        Bench { gpu, ring }
    }

    /// Asks the driver whether `stream` captures, as our launches do (`cuStreamGetCaptureInfo`,
    /// for the status, the capture's id and its graph): the parts that add this call to the floor.
    #[inline(always)]
    fn capture_query(&self, stream: &Stream) {
        let info = self.gpu.driver.raw().cuStreamGetCaptureInfo().unwrap();
        let mut status = cuda_dl_sys::types::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
        let (mut id, mut graph) = (0, std::ptr::null_mut());
        use std::ptr::null_mut as null;
        // SAFETY: live stream; valid out-pointers (the edge outputs are not asked for).
        let code = unsafe {
            info(
                stream.raw(),
                &mut status,
                &mut id,
                &mut graph,
                null(),
                null(),
                null(),
            )
        };
        assert_eq!(code, CUresult::CUDA_SUCCESS);
    }

    /// Enqueues one launch of `method` on `stream`.
    #[inline(always)]
    fn launch(&self, method: Method, stream: &Stream, value: u64) {
        match method {
            Method::Raw => {
                let launch = self.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                // SAFETY: live stream; `noop` ignores its argument.
                let code = unsafe { launch(stream.raw(), Some(noop), std::ptr::null_mut()) };
                assert_eq!(code, CUresult::CUDA_SUCCESS);
            }
            Method::Owner => {
                // SAFETY: `noop` ignores its argument.
                unsafe {
                    launch_host_function(stream, Some(noop), std::ptr::null_mut(), [value; 2])
                }
                .unwrap();
            }
            Method::Closure => {
                host_launch(stream, move || {
                    std::hint::black_box(value);
                })
                .unwrap();
            }
            Method::RawWithCaptureQuery => {
                self.capture_query(stream);
                let launch = self.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                // SAFETY: live stream; `noop` ignores its argument.
                let code = unsafe { launch(stream.raw(), Some(noop), std::ptr::null_mut()) };
                assert_eq!(code, CUresult::CUDA_SUCCESS);
            }
            Method::RawWithAllocation => {
                let record = std::hint::black_box(Box::new([value; 4]));
                let launch = self.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                // SAFETY: live stream; `noop` ignores its argument.
                let code = unsafe { launch(stream.raw(), Some(noop), std::ptr::null_mut()) };
                assert_eq!(code, CUresult::CUDA_SUCCESS);
                drop(record);
            }
            Method::RawWithUserData => {
                let block = &USER_DATA[value as usize % USER_DATA.len()];
                for (k, word) in block.iter().enumerate() {
                    word.store(value + k as u64, std::sync::atomic::Ordering::Relaxed);
                }
                let launch = self.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                let data = std::ptr::from_ref(block).cast_mut().cast();
                // SAFETY: live stream; `read_block` reads a static block of atomics.
                let code = unsafe { launch(stream.raw(), Some(read_block), data) };
                assert_eq!(code, CUresult::CUDA_SUCCESS);
            }
            Method::RawWithBusyHostFn150 | Method::RawWithBusyHostFn500 => {
                let ns: usize = if method == Method::RawWithBusyHostFn150 {
                    150
                } else {
                    500
                };
                let launch = self.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                // SAFETY: live stream; `busy` takes its argument by value.
                let code = unsafe { launch(stream.raw(), Some(busy), ns as *mut c_void) };
                assert_eq!(code, CUresult::CUDA_SUCCESS);
            }
            Method::ReleaseAfter => release_after(stream, [value; 2]).unwrap(),
            Method::RawEventRing => self.ring.record(stream.raw()),
            Method::SpawnAfter => spawn_after(stream, move || {
                std::hint::black_box(value);
            })
            .unwrap(),
            Method::Callback => self.add_boxed_callback(
                stream,
                Box::new(move || {
                    std::hint::black_box(value);
                }),
            ),
        }
    }

    /// The peer approach's launch: `f` boxed once more (a thin pointer for the driver) and handed
    /// to `cuStreamAddCallback`; [`boxed_callback`] takes it back and frees it on the driver thread.
    #[inline(always)]
    fn add_boxed_callback(&self, stream: &Stream, f: Box<dyn FnOnce() + Send>) {
        let f: Box<Box<dyn FnOnce() + Send>> = Box::new(f);
        let add = self.gpu.driver.raw().cuStreamAddCallback().unwrap();
        // SAFETY: live stream; the callback takes the box back once.
        let code = unsafe {
            add(
                stream.raw(),
                Some(boxed_callback),
                Box::into_raw(f).cast(),
                0,
            )
        };
        assert_eq!(code, CUresult::CUDA_SUCCESS);
    }

    /// `n` launches spread round-robin over `streams`, then a synchronize: see [`Run`].
    fn enqueue_and_throughput(&self, method: Method, streams: &[Stream], n: usize) -> Run {
        let driver = DRIVER_TID.load(std::sync::atomic::Ordering::Relaxed);
        let (launcher_before, driver_before) = (blocking_waits(0), blocking_waits(driver));
        if method == Method::RawEventRing {
            self.ring.start(streams.len() == 1);
        }
        let started = Instant::now();
        for i in 0..n {
            self.launch(method, &streams[i % streams.len()], i as u64);
        }
        let enqueued = started.elapsed();
        let launcher_after = blocking_waits(0);
        for s in streams {
            s.synchronize().unwrap();
        }
        if matches!(method, Method::ReleaseAfter | Method::SpawnAfter) {
            // End to end: until the poller has completed every one (the stream got there first).
            while pending_launches(None) > 0 {
                std::thread::yield_now();
            }
        }
        if method == Method::RawEventRing {
            self.ring.wait_all();
        }
        let total = started.elapsed();
        if method == Method::RawEventRing {
            self.ring.stop();
        }
        let driver_after = blocking_waits(driver);
        flush(Duration::from_secs(30)).unwrap();
        let per_launch = |before: Option<u64>, after: Option<u64>| match (before, after) {
            (Some(b), Some(a)) => a.saturating_sub(b) as f64 / n as f64,
            _ => f64::NAN,
        };
        Run {
            enqueue_ns: enqueued.as_nanos() as f64 / n as f64,
            per_second: n as f64 / total.as_secs_f64(),
            launcher_waits: per_launch(launcher_before, launcher_after),
            driver_waits: per_launch(driver_before, driver_after),
        }
    }
}

/// The figures of one run of N launches.
struct Run {
    /// ns per launch, enqueue only.
    enqueue_ns: f64,
    /// Host functions per second, from the first enqueue to the synchronize.
    per_second: f64,
    /// Times the launching thread blocked (voluntary context switches) per launch, while enqueuing.
    launcher_waits: f64,
    /// Times the driver's host-function thread blocked per launch, until the synchronize returned
    /// (NaN if its thread id is not known).
    driver_waits: f64,
}

/// The driver's host-function thread of the benchmark's context (0 until `main` asks).
static DRIVER_TID: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

/// How many times a thread of this process has blocked so far (`voluntary_ctxt_switches`: a
/// futex wait, a sleep, a blocking read; each one is also a wake-up someone paid for). `tid` 0 is
/// the calling thread. `None` if `/proc` does not say (not Linux, or the thread is gone).
fn blocking_waits(tid: i64) -> Option<u64> {
    let path = if tid == 0 {
        "/proc/thread-self/status".to_string()
    } else {
        format!("/proc/self/task/{tid}/status")
    };
    std::fs::read_to_string(path)
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("voluntary_ctxt_switches:"))?
        .trim()
        .parse()
        .ok()
}

/// A figure as JSON: `null` for NaN (unknown).
fn json_number(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.4}")
    } else {
        "null".into()
    }
}

/// The id of the driver thread that runs `stream`'s host functions.
fn driver_thread_of(bench: &Bench, stream: &Stream) -> i64 {
    SEEN_DRIVER_TID.store(0, std::sync::atomic::Ordering::SeqCst);
    let launch = bench.gpu.driver.raw().cuLaunchHostFunc().unwrap();
    // SAFETY: live stream; `note_driver_thread` ignores its argument.
    let code = unsafe { launch(stream.raw(), Some(note_driver_thread), std::ptr::null_mut()) };
    assert_eq!(code, CUresult::CUDA_SUCCESS);
    stream.synchronize().unwrap();
    SEEN_DRIVER_TID.load(std::sync::atomic::Ordering::SeqCst)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

static STAMP: Mutex<Option<Instant>> = Mutex::new(None);

unsafe extern "C" fn stamp_start(_: *mut c_void) {
    *STAMP.lock().unwrap() = Some(Instant::now());
}

/// Latency from a kernel's write (seen by a host thread spinning on mapped memory) to the host
/// function's first instruction, in µs, `samples` times.
fn latency(bench: &Bench, method: Method, stream: &Stream, samples: usize) -> Vec<f64> {
    let flag = Arc::new(MappedU32s::new(bench.gpu.driver, 1));
    let mut out = Vec::with_capacity(samples);
    for i in 1..=samples as u32 {
        *STAMP.lock().unwrap() = None;
        bench
            .gpu
            .kernels
            .spin_then_write(stream.raw(), flag.device(0), i, 20_000);
        match method {
            Method::Raw => {
                let launch = bench.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                // SAFETY: live stream; `stamp_start` ignores its argument.
                unsafe { launch(stream.raw(), Some(stamp_start), std::ptr::null_mut()) };
            }
            Method::SpawnAfter => {
                spawn_after(stream, || {
                    *STAMP.lock().unwrap() = Some(Instant::now());
                })
                .unwrap();
            }
            Method::ReleaseAfter => release_after(stream, StampOnDrop).unwrap(),
            _ => {
                host_launch(stream, || {
                    *STAMP.lock().unwrap() = Some(Instant::now());
                })
                .unwrap();
            }
        }
        while flag.get(0) != i {
            std::hint::spin_loop();
        }
        let seen = Instant::now();
        stream.synchronize().unwrap();
        let started = loop {
            // The poller's work (spawn_after, release_after) may come after the synchronize.
            if let Some(t) = *STAMP.lock().unwrap() {
                break t;
            }
            std::hint::spin_loop();
        };
        out.push(started.saturating_duration_since(seen).as_nanos() as f64 / 1000.0);
    }
    flush(Duration::from_secs(10)).unwrap();
    out.sort_by(|a, b| a.total_cmp(b));
    out
}

/// The raw event-query floor: latency from a kernel's write (seen by a host spinner) to a second
/// host thread, spinning on `cuEventQuery` of an event recorded after the kernel, seeing it
/// complete, in µs, `samples` times. What an event transport cannot beat.
fn event_query_latency(bench: &Bench, stream: &Stream, samples: usize) -> Vec<f64> {
    use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
    let driver = bench.gpu.driver;
    let flag = MappedU32s::new(driver, 1);
    let mut event: CUevent = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the benchmark's context is current on this thread.
    unsafe { driver.cuEventCreate(&mut event, CUevent_flags::CU_EVENT_DISABLE_TIMING.0) }.unwrap();
    let event_addr = event.expose_provenance();
    // The sample the spinner is to watch (0: none yet; u32::MAX: stop), and what it saw.
    let armed = AtomicU32::new(0);
    let seen_at: Mutex<Option<Instant>> = Mutex::new(None);
    let finished = AtomicUsize::new(0);
    let mut out = Vec::with_capacity(samples);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            bench.gpu.bind_thread();
            let query = driver.raw().cuEventQuery().unwrap();
            let event: CUevent = std::ptr::with_exposed_provenance_mut(event_addr);
            let mut last = 0;
            loop {
                let i = armed.load(Ordering::Acquire);
                if i == u32::MAX {
                    break;
                }
                if i == last {
                    std::hint::spin_loop();
                    continue;
                }
                // SAFETY: an event recorded (before `armed` was set) on the benchmark's stream.
                while unsafe { query(event) } != CUresult::CUDA_SUCCESS {
                    std::hint::spin_loop();
                }
                *seen_at.lock().unwrap() = Some(Instant::now());
                last = i;
                finished.store(i as usize, Ordering::Release);
            }
        });
        for i in 1..=samples as u32 {
            *seen_at.lock().unwrap() = None;
            bench
                .gpu
                .kernels
                .spin_then_write(stream.raw(), flag.device(0), i, 20_000);
            // SAFETY: the event and the stream are of the benchmark's context; the spinner queries
            // this event only after `armed` says so.
            unsafe { driver.cuEventRecord(event, stream.raw()) }.unwrap();
            armed.store(i, Ordering::Release);
            while flag.get(0) != i {
                std::hint::spin_loop();
            }
            let seen = Instant::now();
            while finished.load(Ordering::Acquire) != i as usize {
                std::hint::spin_loop();
            }
            let done = seen_at.lock().unwrap().unwrap();
            out.push(done.saturating_duration_since(seen).as_nanos() as f64 / 1000.0);
        }
        armed.store(u32::MAX, Ordering::Release);
    });
    stream.synchronize().unwrap();
    // SAFETY: no longer recorded or queried.
    let _ = unsafe { driver.cuEventDestroy(event) };
    out.sort_by(|a, b| a.total_cmp(b));
    out
}

/// An owner that stamps the time it is dropped (for `release_after`'s latency).
struct StampOnDrop;
impl Drop for StampOnDrop {
    fn drop(&mut self) {
        *STAMP.lock().unwrap() = Some(Instant::now());
    }
}

/// A waker that stamps the time it is first woken.
struct StampWaker(Mutex<Option<Instant>>);
impl std::task::Wake for StampWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }
    fn wake_by_ref(self: &Arc<Self>) {
        let now = Instant::now();
        self.0.lock().unwrap().get_or_insert(now);
    }
}

/// Latency from a kernel's write (seen by a host spinner) to a completion future's waker being
/// woken, in µs; and the pollers' CPU time over the run, and the run's wall time. Each kernel spins
/// `cycles` GPU clock cycles first (200,000: about 100 µs on the H200).
fn async_latency(
    bench: &Bench,
    mode: cuda_host_launch::CompletionMode,
    stream: &Stream,
    samples: usize,
    cycles: u64,
) -> (Vec<f64>, Duration, Duration) {
    use std::future::Future;
    let flag = MappedU32s::new(bench.gpu.driver, 1);
    let mut out = Vec::with_capacity(samples);
    let cpu_before = cuda_host_launch::poller_cpu_time();
    let started = Instant::now();
    for i in 1..=samples as u32 {
        // The future is still pending when first polled.
        bench
            .gpu
            .kernels
            .spin_then_write(stream.raw(), flag.device(0), i, cycles);
        let mut future = mode.completion(stream).unwrap();
        let stamp = Arc::new(StampWaker(Mutex::new(None)));
        let waker = std::task::Waker::from(Arc::clone(&stamp));
        let mut cx = std::task::Context::from_waker(&waker);
        if std::pin::Pin::new(&mut future).poll(&mut cx).is_ready() {
            continue; // the stream was already there: no wake to time
        }
        while flag.get(0) != i {
            std::hint::spin_loop();
        }
        let seen = Instant::now();
        let woken = loop {
            if let Some(t) = *stamp.0.lock().unwrap() {
                break t;
            }
            std::hint::spin_loop();
        };
        assert!(std::pin::Pin::new(&mut future).poll(&mut cx).is_ready());
        out.push(woken.saturating_duration_since(seen).as_nanos() as f64 / 1000.0);
    }
    let wall = started.elapsed();
    let cpu = cuda_host_launch::poller_cpu_time() - cpu_before;
    stream.synchronize().unwrap();
    flush(Duration::from_secs(10)).unwrap();
    out.sort_by(|a, b| a.total_cmp(b));
    (out, cpu, wall)
}

static RETURNED_AT: Mutex<Vec<Instant>> = Mutex::new(Vec::new());
static DROPPED_AT: Mutex<Vec<Instant>> = Mutex::new(Vec::new());

unsafe extern "C" fn stamp_return(_: *mut c_void) {
    RETURNED_AT.lock().unwrap().push(Instant::now());
}

struct StampDrop;
impl Drop for StampDrop {
    fn drop(&mut self) {
        DROPPED_AT.lock().unwrap().push(Instant::now());
    }
}

/// How long owners wait in the cleanup queue: from the host function's return to the owner's drop,
/// in µs (paired in order: one stream, FIFO queue).
fn cleanup_wait(stream: &Stream, n: usize) -> Vec<f64> {
    RETURNED_AT.lock().unwrap().clear();
    DROPPED_AT.lock().unwrap().clear();
    for _ in 0..n {
        // SAFETY: `stamp_return` ignores its argument.
        unsafe {
            launch_host_function(stream, Some(stamp_return), std::ptr::null_mut(), StampDrop)
        }
        .unwrap();
    }
    stream.synchronize().unwrap();
    flush(Duration::from_secs(30)).unwrap();
    let returned = RETURNED_AT.lock().unwrap();
    let dropped = DROPPED_AT.lock().unwrap();
    let mut waits: Vec<f64> = returned
        .iter()
        .zip(dropped.iter())
        .map(|(r, d)| d.saturating_duration_since(*r).as_nanos() as f64 / 1000.0)
        .collect();
    waits.sort_by(|a, b| a.total_cmp(b));
    waits
}

/// Runs `launches` while `stream` is held closed by `gate` (a `cuStreamWaitValue32` on a flag
/// nobody has set yet), so none of their host functions runs meanwhile; then opens it and waits
/// until every launch has run and been released.
fn with_stream_closed<T>(
    bench: &Bench,
    stream: &Stream,
    gate: &MappedU32s,
    launches: impl FnOnce() -> T,
) -> T {
    gate.set(0, 0);
    // SAFETY: live stream; the gate is mapped memory that outlives the wait (it is opened and the
    // stream synchronized below).
    unsafe {
        bench
            .gpu
            .driver
            .cuStreamWaitValue32(stream.raw(), gate.device(0), 1, 0)
    }
    .unwrap();
    let result = launches();
    gate.set(0, 1);
    stream.synchronize().unwrap();
    // Releases and callbacks through events complete on the poller, after the stream.
    while pending_launches(None) > 0 {
        std::thread::yield_now();
    }
    flush(Duration::from_secs(30)).unwrap();
    result
}

/// Heap bytes per pending launch: launches held behind a closed stream.
fn heap_per_pending(bench: &Bench, method: Method, stream: &Stream) -> f64 {
    let gate = MappedU32s::new(bench.gpu.driver, 1);
    with_stream_closed(bench, stream, &gate, || {
        let before = heap_in_use();
        for i in 0..PENDING {
            bench.launch(method, stream, i as u64);
        }
        (heap_in_use() as f64 - before as f64) / PENDING as f64
    })
}

/// Enqueue cost behind a closed stream: no host function runs while the launches are timed, so
/// the driver's thread, the reaper and the GPU pipeline stay out of it and what is left is the
/// launching thread's own cost. Returns, per method of `methods`, ns per launch in each
/// repetition (methods interleaved in rotating order).
fn blocked_enqueue(bench: &Bench, methods: &[Method], stream: &Stream) -> Vec<Vec<f64>> {
    let gate = MappedU32s::new(bench.gpu.driver, 1);
    let mut per_method = vec![Vec::new(); methods.len()];
    for rep in 0..reps() {
        for j in 0..methods.len() {
            let k = (rep + j) % methods.len();
            let ns = with_stream_closed(bench, stream, &gate, || {
                let started = Instant::now();
                for i in 0..PENDING {
                    bench.launch(methods[k], stream, i as u64);
                }
                started.elapsed().as_nanos() as f64 / PENDING as f64
            });
            per_method[k].push(ns);
        }
    }
    per_method
}

/// Cold start, in a fresh process: opening the driver (dlopen + cuInit + version) and the first
/// resolution of a table entry.
fn cold_start_child() {
    // The system loader alone, as a separate number: the driver() call below then finds the
    // library mapped and pays for cuInit and the version query.
    let t = Instant::now();
    let library = cuda_dl_sys::DEFAULT_NAMES.iter().find_map(|name| {
        // SAFETY: opening the NVIDIA driver library, as cuda-dl-sys does.
        unsafe { libloading::Library::new(*name) }.ok()
    });
    let dlopen = t.elapsed();
    let t0 = Instant::now();
    let driver = cuda_dl_sys::driver().unwrap();
    let opened = t0.elapsed();
    drop(library);
    let t1 = Instant::now();
    let mut v = 0;
    // SAFETY: valid out-pointer.
    unsafe { driver.cuDeviceGetCount(&mut v) }.unwrap();
    let first = t1.elapsed();
    let t2 = Instant::now();
    // SAFETY: valid out-pointer.
    unsafe { driver.cuDeviceGetCount(&mut v) }.unwrap();
    let second = t2.elapsed();
    println!(
        "{} {} {} {}",
        opened.as_nanos(),
        first.as_nanos(),
        second.as_nanos(),
        dlopen.as_nanos()
    );
}

/// Median over 5 fresh processes: (driver() with the library mapped: cuInit + version, ms; first
/// table call, µs; second call, µs; dlopen alone, ms).
fn cold_start() -> (f64, f64, f64, f64) {
    let mut runs: Vec<(f64, f64, f64, f64)> = (0..5)
        .map(|_| {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .arg("--cold-start-child")
                .output()
                .unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = text
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            (v[0] / 1e6, v[1] / 1e3, v[2] / 1e3, v[3] / 1e6)
        })
        .collect();
    runs.sort_by(|a, b| a.0.total_cmp(&b.0));
    runs[runs.len() / 2]
}

/// ns per call of a cheap function through the table, and through a cached raw pointer.
fn gated_call_cost(bench: &Bench) -> (f64, f64) {
    const CALLS: usize = 5_000_000;
    let d = bench.gpu.driver;
    let raw = d.raw().cuDriverGetVersion().unwrap();
    let mut through_table = Vec::new();
    let mut through_pointer = Vec::new();
    for _ in 0..reps() {
        let mut v = 0;
        let t = Instant::now();
        for _ in 0..CALLS {
            // SAFETY: valid out-pointer.
            unsafe { std::hint::black_box(d).cuDriverGetVersion(&mut v) }.unwrap();
        }
        through_table.push(t.elapsed().as_nanos() as f64 / CALLS as f64);
        let t = Instant::now();
        for _ in 0..CALLS {
            // SAFETY: valid out-pointer.
            let code = unsafe { std::hint::black_box(raw)(&mut v) };
            assert_eq!(code, CUresult::CUDA_SUCCESS);
        }
        through_pointer.push(t.elapsed().as_nanos() as f64 / CALLS as f64);
    }
    (median(&mut through_table), median(&mut through_pointer))
}

/// The crate's configuration for this process: the event poller as [`default_poller`] says, and,
/// where threads are pinned, the crate's event poller on a CPU of its own, as the event floor's
/// poller (a start hook). Before the crate's first use; the environment's overrides apply (the
/// variant children and the spinning poller's child set them).
fn install_config(plan: Option<&Pinning>) {
    let mut threads = cuda_host_launch::ThreadSettings::new();
    if let Some(pin) = plan {
        let cpu = pin.poller;
        threads = threads.on_start(move |thread| {
            if thread == cuda_host_launch::CrateThread::Watcher {
                pin_current_thread(cpu);
            }
        });
    }
    cuda_host_launch::Config::new()
        .event_poller(default_poller())
        .threads(threads)
        .install()
        .unwrap();
}

/// In a child process whose event poller spins (`CUDA_HOST_LAUNCH_POLLER=low-latency`): the
/// `spawn_after` and `release_after` latencies, one line of samples each.
fn spinning_latency_child() {
    let bench = Bench::open();
    let one = [Stream::new(&bench.gpu.context).unwrap()];
    let pinned = pin_threads(&bench, &[&one[0]], choose_pinning().as_ref());
    eprintln!("{pinned}");
    assert_eq!(
        cuda_host_launch::config().unwrap().event_poller_settings(),
        PollerSettings::LOW_LATENCY
    );
    for method in [Method::SpawnAfter, Method::ReleaseAfter] {
        let samples = latency(&bench, method, &one[0], LATENCY_SAMPLES);
        let line: Vec<String> = samples.iter().map(|x| x.to_string()).collect();
        println!("{}", line.join(" "));
    }
}

/// The spinning poller's `spawn_after` and `release_after` latencies, from a child process.
fn spinning_latency() -> (Vec<f64>, Vec<f64>) {
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .arg("--spinning-latency-child")
        .env(cuda_host_launch::POLLER_ENV, "low-latency")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let mut lines = text.lines().rev().take(2).map(|line| {
        line.split_whitespace()
            .filter_map(|x| x.parse().ok())
            .collect::<Vec<f64>>()
    });
    let (release, spawn) = (lines.next(), lines.next());
    match (spawn, release) {
        (Some(spawn), Some(release))
            if spawn.len() == LATENCY_SAMPLES && release.len() == LATENCY_SAMPLES =>
        {
            (spawn, release)
        }
        _ => panic!(
            "the spinning poller's child: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

/// One variant's figures for the floor, owner and closure methods on 1 and on 4 streams, measured
/// in this (child) process with whatever settings its environment gives. Prints, per stream set:
/// floor ns, owner and closure enqueue ratios, floor per second, owner and closure throughput
/// ratios (paired ratios, medians over the repetitions).
fn variant_child() {
    let bench = Bench::open();
    let one = vec![Stream::new(&bench.gpu.context).unwrap()];
    let four: Vec<Stream> = (0..4)
        .map(|_| Stream::new(&bench.gpu.context).unwrap())
        .collect();
    let pinned = pin_threads(&bench, &[&one[0], &four[3]], choose_pinning().as_ref());
    eprintln!("{pinned}");
    let methods = [Method::Raw, Method::Owner, Method::Closure];
    let mut out = Vec::new();
    for streams in [&one, &four] {
        for m in methods {
            bench.enqueue_and_throughput(m, streams, 20_000);
        }
        let mut e = [const { Vec::new() }; 3];
        let mut r = [const { Vec::new() }; 3];
        for rep in 0..VARIANT_REPS {
            for j in 0..methods.len() {
                let k = (rep + j) % methods.len();
                let run = bench.enqueue_and_throughput(methods[k], streams, N);
                e[k].push(run.enqueue_ns);
                r[k].push(run.per_second);
            }
        }
        out.push(quartiles(&e[0]).0);
        out.push(quartiles(&paired_ratios(&e, 1)).0);
        out.push(quartiles(&paired_ratios(&e, 2)).0);
        out.push(quartiles(&r[0]).0);
        out.push(quartiles(&paired_ratios(&r, 1)).0);
        out.push(quartiles(&paired_ratios(&r, 2)).0);
    }
    let line: Vec<String> = out.iter().map(|x| x.to_string()).collect();
    println!("{}", line.join(" "));
}

/// The settings compared, each in a fresh process.
const VARIANTS: [(&str, &[(&str, &str)]); 3] = [
    ("default (reaper lingers 2 ms, polls every 50 us)", &[]),
    (
        "reaper parks after every batch (poll 0)",
        &[("CUDA_HOST_LAUNCH_REAPER_POLL_US", "0")],
    ),
    (
        "manual mode: drained at each launch",
        &[("CUDA_HOST_LAUNCH_CLEANUP", "manual")],
    ),
];

fn variants() -> Vec<(&'static str, [f64; 12])> {
    VARIANTS
        .iter()
        .map(|(label, envs)| {
            let mut command = std::process::Command::new(std::env::current_exe().unwrap());
            command.arg("--variant-child");
            for (k, v) in envs.iter() {
                command.env(k, v);
            }
            let out = command.output().unwrap();
            let text = String::from_utf8_lossy(&out.stdout);
            let v: Vec<f64> = text
                .lines()
                .last()
                .unwrap_or("")
                .split_whitespace()
                .filter_map(|x| x.parse().ok())
                .collect();
            assert_eq!(
                v.len(),
                12,
                "variant {label}: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            let mut a = [0.0; 12];
            a.copy_from_slice(&v);
            (*label, a)
        })
        .collect()
}

/// Each call's enqueue time, in ns, for `n` launches of `method` on one stream (then synchronize
/// and flush).
fn per_call_times(bench: &Bench, method: Method, stream: &Stream, n: usize) -> Vec<f64> {
    let mut times = Vec::with_capacity(n);
    for i in 0..n {
        let t = Instant::now();
        bench.launch(method, stream, i as u64);
        times.push(t.elapsed().as_nanos() as f64);
    }
    stream.synchronize().unwrap();
    flush(Duration::from_secs(30)).unwrap();
    times
}

/// The distribution of single-call enqueue times: floor, owner, closure, one stream, interleaved.
/// Tells a constant cost per call (the median moves) from stalls (the tail moves).
fn call_time_distribution(bench: &Bench, stream: &Stream, table: &mut String, json: &mut String) {
    const METHODS3: [Method; 3] = [Method::Raw, Method::Owner, Method::Closure];
    const DIST_REPS: usize = 5;
    let mut all: [Vec<f64>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    for rep in 0..DIST_REPS {
        for j in 0..3 {
            let k = (rep + j) % 3;
            all[k].extend(per_call_times(bench, METHODS3[k], stream, N));
        }
    }
    let _ = writeln!(
        table,
        "\nsingle-call enqueue times, 1 stream ({DIST_REPS} x {N} calls each, interleaved; ns):"
    );
    let _ = writeln!(
        table,
        "  {:<52} {:>7} {:>7} {:>7} {:>7} {:>8} {:>8} {:>10}",
        "method", "mean", "p50", "p90", "p99", "p99.9", "max", "in >10us"
    );
    json.push_str("\n  \"single_call_ns\": {");
    for (k, v) in all.iter_mut().enumerate() {
        let mean = v.iter().sum::<f64>() / v.len() as f64;
        let slow: f64 = v.iter().filter(|&&x| x > 10_000.0).sum::<f64>() / v.iter().sum::<f64>();
        v.sort_by(|a, b| a.total_cmp(b));
        let p = |q| percentile(v, q);
        let max = v[v.len() - 1];
        let _ = writeln!(
            table,
            "  {:<52} {mean:>7.0} {:>7.0} {:>7.0} {:>7.0} {:>8.0} {max:>8.0} {:>9.1}%",
            METHODS3[k].name(),
            p(0.5),
            p(0.9),
            p(0.99),
            p(0.999),
            slow * 100.0
        );
        json.push_str(&format!(
            "\n    {:?}: {{\"mean\": {mean:.1}, \"p50\": {:.1}, \"p90\": {:.1}, \"p99\": {:.1}, \"p999\": {:.1}, \"max\": {max:.1}, \"share_in_calls_over_10us\": {slow:.4}}}{}",
            METHODS3[k].key(),
            p(0.5),
            p(0.9),
            p(0.99),
            p(0.999),
            if k < 2 { "," } else { "" }
        ));
    }
    json.push_str("\n  },");
}

/// Prints the table's lines so far (and forgets them): a run cut short still shows its sections.
fn print_so_far(table: &mut String) {
    use std::io::Write as _;
    print!("{table}");
    let _ = std::io::stdout().flush();
    table.clear();
}

fn main() {
    if std::env::args().any(|a| a == "--cold-start-child") {
        cold_start_child();
        return;
    }
    if std::env::args().any(|a| a == "--variant-child") {
        // As before the configuration was one: no start hook in the variants' children.
        install_config(None);
        variant_child();
        return;
    }
    if std::env::args().any(|a| a == "--spinning-latency-child") {
        install_config(choose_pinning().as_ref());
        spinning_latency_child();
        return;
    }
    let planned = choose_pinning();
    install_config(planned.as_ref());
    let bench = Bench::open();
    let device = cuda_host_launch::Device::get(0).unwrap().name().unwrap();
    let version = bench.gpu.driver.version();
    let one = vec![Stream::new(&bench.gpu.context).unwrap()];
    let four: Vec<Stream> = (0..4)
        .map(|_| Stream::new(&bench.gpu.context).unwrap())
        .collect();
    let all_cpus = allowed_cpus();
    let pinned = pin_threads(&bench, &[&one[0], &four[3]], planned.as_ref());
    DRIVER_TID.store(
        driver_thread_of(&bench, &one[0]),
        std::sync::atomic::Ordering::Relaxed,
    );
    // `BENCH_THREAD_COSTS=1`: only the thread-by-thread section (see thread_costs.rs).
    if std::env::var("BENCH_THREAD_COSTS").is_ok_and(|v| v.trim() == "1") {
        let ord = std::sync::atomic::Ordering::SeqCst;
        let (table, json) = thread_costs::run(
            &bench,
            &one[0],
            DRIVER_TID.load(ord),
            PINNED_REAPER_TID.load(ord),
            reps(),
            planned.as_ref(),
            &all_cpus,
        );
        println!("host-launch benchmark: {device}, driver CUDA {version}\n{pinned}{table}");
        std::fs::write(
            "bench-thread-costs.json",
            format!(
                "{{\n  \"device\": {device:?},\n  \"driver_version\": {},\n  \"pinning\": {pinned:?},\n  \"thread_costs\": {json}\n}}\n",
                version.0
            ),
        )
        .unwrap();
        return;
    }
    let mut json = String::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "host-launch benchmark: {device}, driver CUDA {version} ({})",
        version.0
    );
    let _ = writeln!(
        table,
        "N = {N} launches per repetition, {} repetitions, methods interleaved in rotating order.\n\
         Absolute figures: medians over the repetitions. Ratios: the median (and quartiles) over the\n\
         repetitions of each repetition's figure over the floor's in the same repetition.\n\
         L waits / D waits: times the launching thread (while enqueuing) and the driver's\n\
         host-function thread (until the synchronize) blocked, per launch (median).\n\
         Event poller (default rows): {:?}.\n{pinned}\n",
        reps(),
        default_poller()
    );
    json.push_str(&format!(
        "{{\n  \"device\": {device:?},\n  \"driver_version\": {},\n  \"n\": {N},\n  \"reps\": {},\n  \"pinning\": {pinned:?},\n  \"throughput\": {{",
        version.0,
        reps()
    ));

    // Warm-up: every method, both stream sets.
    for m in METHODS {
        bench.enqueue_and_throughput(m, &one, 20_000);
        bench.enqueue_and_throughput(m, &four, 20_000);
    }

    for (label, streams) in [("1 stream", &one), ("4 streams", &four)] {
        let mut enqueue = [const { Vec::new() }; METHODS.len()];
        let mut rate = [const { Vec::new() }; METHODS.len()];
        let mut launcher_waits = [const { Vec::new() }; METHODS.len()];
        let mut driver_waits = [const { Vec::new() }; METHODS.len()];
        for rep in 0..reps() {
            // The order rotates from one repetition to the next, so no method always runs first
            // (after the previous repetition's synchronize and flush) or last.
            for j in 0..METHODS.len() {
                let k = (rep + j) % METHODS.len();
                let run = bench.enqueue_and_throughput(METHODS[k], streams, N);
                enqueue[k].push(run.enqueue_ns);
                rate[k].push(run.per_second);
                launcher_waits[k].push(run.launcher_waits);
                driver_waits[k].push(run.driver_waits);
            }
        }
        let _ = writeln!(table, "{label}:");
        let _ = writeln!(
            table,
            "  {:<52} {:>10} {:>8} {:>13} {:>12} {:>8} {:>13} {:>9} {:>9}",
            "method",
            "enqueue ns",
            "x floor",
            "(quartiles)",
            "host fns/s",
            "x floor",
            "(quartiles)",
            "L waits",
            "D waits"
        );
        json.push_str(&format!("\n    {label:?}: {{"));
        for (k, m) in METHODS.iter().enumerate() {
            let (e, _, _) = quartiles(&enqueue[k]);
            let (r, _, _) = quartiles(&rate[k]);
            let (er, er25, er75) = quartiles(&paired_ratios(&enqueue, k));
            let (rr, rr25, rr75) = quartiles(&paired_ratios(&rate, k));
            let (lw, _, _) = quartiles(&launcher_waits[k]);
            let (dw, _, _) = quartiles(&driver_waits[k]);
            let _ = writeln!(
                table,
                "  {:<52} {:>10.0} {:>8.3} {:>13} {:>12.0} {:>8.3} {:>13} {lw:>9.3} {dw:>9.3}",
                m.name(),
                e,
                er,
                format!("{er25:.3}-{er75:.3}"),
                r,
                rr,
                format!("{rr25:.3}-{rr75:.3}"),
            );
            json.push_str(&format!(
                "\n      {:?}: {{\"enqueue_ns\": {e:.1}, \"enqueue_ratio\": {er:.4}, \"enqueue_ratio_quartiles\": [{er25:.4}, {er75:.4}], \"per_second\": {r:.0}, \"throughput_ratio\": {rr:.4}, \"throughput_ratio_quartiles\": [{rr25:.4}, {rr75:.4}], \"launcher_waits_per_launch\": {}, \"driver_waits_per_launch\": {}, \"enqueue_ns_per_rep\": {:?}, \"per_second_per_rep\": {:?}}}{}",
                m.key(),
                json_number(lw),
                json_number(dw),
                enqueue[k].iter().map(|x| x.round()).collect::<Vec<_>>(),
                rate[k].iter().map(|x| x.round()).collect::<Vec<_>>(),
                if k + 1 < METHODS.len() { "," } else { "" }
            ));
        }
        json.push_str(if label == "1 stream" {
            "\n    },"
        } else {
            "\n    }"
        });
        let _ = writeln!(table);
    }
    json.push_str("\n  },");

    print_so_far(&mut table);
    // After the table, before unpinning: a run of its own, so its clock reads do not touch the
    // table's figures.
    if std::env::var("BENCH_CALL_TIMES").map_or(true, |v| v.trim() != "0") {
        call_time_distribution(&bench, &one[0], &mut table, &mut json);
    }
    {
        let blocked_methods: Vec<Method> = METHODS
            .iter()
            .copied()
            .filter(|m| !m.name().starts_with("  part"))
            .collect();
        let per_method = blocked_enqueue(&bench, &blocked_methods, &one[0]);
        let _ = writeln!(
            table,
            "\nenqueue behind a closed stream (no host function runs meanwhile: the launching thread's own cost; \
             {PENDING} launches x {} repetitions, 1 stream):",
            reps()
        );
        let _ = writeln!(
            table,
            "  {:<52} {:>10} {:>8} {:>13} {:>12}",
            "method", "enqueue ns", "x floor", "(quartiles)", "ns - floor"
        );
        json.push_str("\n  \"enqueue_behind_closed_stream\": {");
        for (k, m) in blocked_methods.iter().enumerate() {
            let (e, _, _) = quartiles(&per_method[k]);
            let (r, r25, r75) = quartiles(&paired_ratios(&per_method, k));
            let over: Vec<f64> = per_method[k]
                .iter()
                .zip(&per_method[0])
                .map(|(x, floor)| x - floor)
                .collect();
            let (d, _, _) = quartiles(&over);
            let _ = writeln!(
                table,
                "  {:<52} {e:>10.0} {r:>8.3} {:>13} {d:>12.0}",
                m.name(),
                format!("{r25:.3}-{r75:.3}"),
            );
            json.push_str(&format!(
                "\n    {:?}: {{\"enqueue_ns\": {e:.1}, \"enqueue_ratio\": {r:.4}, \"enqueue_ratio_quartiles\": [{r25:.4}, {r75:.4}], \"ns_over_floor\": {d:.1}, \"enqueue_ns_per_rep\": {:?}}}{}",
                m.key(),
                per_method[k].iter().map(|x| x.round()).collect::<Vec<_>>(),
                if k + 1 < blocked_methods.len() { "," } else { "" }
            ));
        }
        json.push_str("\n  },");
    }
    // Issue 31's rows: the event transport next to its floor, on 1 stream and 8 threads x 8
    // streams.
    if std::env::var("BENCH_EVENTS").map_or(true, |v| v.trim() != "0") {
        event_section(&bench, planned.as_ref(), &all_cpus, &mut table, &mut json);
    }
    unpin_current_thread(&all_cpus);
    print_so_far(&mut table);
    // `BENCH_TABLE_ONLY=1`: the table (and the single-call times) only, for comparing builds over
    // many short processes.
    if std::env::var("BENCH_TABLE_ONLY").is_ok_and(|v| v.trim() == "1") {
        json.truncate(json.trim_end().len() - 1); // the last member's comma
        json.push_str("\n}\n");
        print!("{table}");
        std::fs::write("bench-results.json", json).unwrap();
        println!("\nwrote bench-results.json");
        return;
    }
    let event_query_floor = event_query_latency(&bench, &one[0], LATENCY_SAMPLES);
    let raw_latency = latency(&bench, Method::Raw, &one[0], LATENCY_SAMPLES);
    let closure_latency = latency(&bench, Method::Closure, &one[0], LATENCY_SAMPLES);
    let spawn_latency = latency(&bench, Method::SpawnAfter, &one[0], LATENCY_SAMPLES);
    let release_latency = latency(&bench, Method::ReleaseAfter, &one[0], LATENCY_SAMPLES);
    // The crate's configuration is the process's: the spinning poller's rows in a child process.
    let (spawn_spinning, release_spinning) = spinning_latency();
    let _ = writeln!(
        table,
        "latency, kernel's write seen by a host spinner -> host function or callback starts, owner dropped ({LATENCY_SAMPLES} samples, µs):"
    );
    json.push_str("\n  \"latency_us\": {");
    for (name, v, key, last) in [
        (
            "floor: cuEventQuery spinner sees the event done",
            &event_query_floor,
            "event_query_floor",
            false,
        ),
        (Method::Raw.name(), &raw_latency, "raw", false),
        (Method::Closure.name(), &closure_latency, "closure", false),
        (
            "spawn_after, default poller",
            &spawn_latency,
            "spawn_after",
            false,
        ),
        (
            "release_after, default poller (owner dropped)",
            &release_latency,
            "release_after",
            false,
        ),
        (
            "spawn_after, spinning poller",
            &spawn_spinning,
            "spawn_after_spinning",
            false,
        ),
        (
            "release_after, spinning poller (owner dropped)",
            &release_spinning,
            "release_after_spinning",
            true,
        ),
    ] {
        let (p50, p90, p99) = (percentile(v, 0.5), percentile(v, 0.9), percentile(v, 0.99));
        let _ = writeln!(
            table,
            "  {name:<52} p50 {p50:>7.1}  p90 {p90:>7.1}  p99 {p99:>7.1}"
        );
        json.push_str(&format!(
            "\n    {key:?}: {{\"p50\": {p50:.2}, \"p90\": {p90:.2}, \"p99\": {p99:.2}}}{}",
            if last { "" } else { "," }
        ));
    }
    json.push_str("\n  },");

    let _ = writeln!(
        table,
        "\nasync completion, kernel's write seen by a host spinner -> the future's waker woken ({LATENCY_SAMPLES} samples, µs):"
    );
    json.push_str("\n  \"completion_latency_us\": {");
    const MODES: [cuda_host_launch::CompletionMode; 4] = [
        cuda_host_launch::CompletionMode::Auto,
        cuda_host_launch::CompletionMode::HostFunction,
        cuda_host_launch::CompletionMode::LowLatency,
        cuda_host_launch::CompletionMode::Event,
    ];
    print_so_far(&mut table);
    // Short waits (a kernel of about 100 µs), then long ones (about 20 ms: the event poller's
    // pauses have grown to 250 µs), whose poller CPU per second of waiting is the figure to read.
    for (k, (kernel, samples, cycles)) in [
        ("100 µs", LATENCY_SAMPLES, 200_000),
        ("20 ms", LONG_WAIT_SAMPLES, 40_000_000),
    ]
    .into_iter()
    .enumerate()
    {
        if k == 1 {
            let _ = writeln!(
                table,
                "\nasync completion after a {kernel} kernel, as above ({samples} samples, µs):"
            );
            json.push_str("\n  \"completion_latency_long_wait_us\": {");
        }
        for (m, mode) in MODES.into_iter().enumerate() {
            let (v, cpu, wall) = async_latency(&bench, mode, &one[0], samples, cycles);
            let (p50, p90, p99) = (
                percentile(&v, 0.5),
                percentile(&v, 0.9),
                percentile(&v, 0.99),
            );
            let _ = writeln!(
                table,
                "  {:<52} p50 {p50:>7.1}  p90 {p90:>7.1}  p99 {p99:>7.1}   poller CPU {:.1} ms of {:.1} ms wall",
                format!("completion, {mode:?}"),
                cpu.as_secs_f64() * 1e3,
                wall.as_secs_f64() * 1e3
            );
            json.push_str(&format!(
                "\n    {:?}: {{\"p50\": {p50:.2}, \"p90\": {p90:.2}, \"p99\": {p99:.2}, \"poller_cpu_ms\": {:.2}, \"wall_ms\": {:.2}}}{}",
                format!("{mode:?}"),
                cpu.as_secs_f64() * 1e3,
                wall.as_secs_f64() * 1e3,
                if m + 1 < MODES.len() { "," } else { "" }
            ));
        }
        json.push_str("\n  },");
    }

    let waits = cleanup_wait(&one[0], 50_000);
    let (w50, w99) = (percentile(&waits, 0.5), percentile(&waits, 0.99));
    let _ = writeln!(
        table,
        "\nowners' wait in the cleanup queue (host function returns -> owner dropped, reaper mode, {} samples): p50 {w50:.1} µs, p99 {w99:.1} µs",
        waits.len()
    );
    json.push_str(&format!(
        "\n  \"cleanup_wait_us\": {{\"p50\": {w50:.2}, \"p99\": {w99:.2}}},"
    ));

    let _ = writeln!(
        table,
        "\nheap bytes per pending launch ({PENDING} launches held behind a stream wait; driver's own heap included):"
    );
    json.push_str("\n  \"heap_bytes_per_pending_launch\": {");
    const HEAP_METHODS: [Method; 5] = [
        Method::Raw,
        Method::Owner,
        Method::Closure,
        Method::Callback,
        Method::ReleaseAfter,
    ];
    for (k, m) in HEAP_METHODS.iter().enumerate() {
        let bytes = heap_per_pending(&bench, *m, &one[0]);
        let _ = writeln!(table, "  {:<52} {bytes:>8.1}", m.name());
        json.push_str(&format!(
            "\n    {:?}: {bytes:.1}{}",
            m.key(),
            if k + 1 < HEAP_METHODS.len() { "," } else { "" }
        ));
    }
    json.push_str("\n  },");

    print_so_far(&mut table);
    let (table_ns, pointer_ns) = gated_call_cost(&bench);
    let (open_ms, first_us, second_us, dlopen_ms) = cold_start();
    let _ = writeln!(
        table,
        "\ncuDriverGetVersion: {table_ns:.2} ns through the table, {pointer_ns:.2} ns through a cached pointer (difference {:.2} ns)",
        table_ns - pointer_ns
    );
    let _ = writeln!(
        table,
        "cold start (fresh process, median of 5): dlopen {dlopen_ms:.2} ms; then driver() (cuInit + cuDriverGetVersion + bootstrap lookups) {open_ms:.2} ms; first call of a table entry (resolve + call) {first_us:.1} µs; second call {second_us:.2} µs"
    );
    json.push_str(&format!(
        "\n  \"gated_call_ns\": {{\"table\": {table_ns:.3}, \"cached_pointer\": {pointer_ns:.3}}},\n  \"cold_start\": {{\"dlopen_ms\": {dlopen_ms:.3}, \"driver_after_dlopen_ms\": {open_ms:.3}, \"first_call_us\": {first_us:.2}, \"second_call_us\": {second_us:.3}}}\n}}\n"
    ));
    // `BENCH_VARIANTS=0` skips the fresh-process variants (about half the run).
    let variant_rows = if std::env::var("BENCH_VARIANTS").is_ok_and(|v| v.trim() == "0") {
        Vec::new()
    } else {
        variants()
    };
    let _ = writeln!(
        table,
        "\nsettings, each in a fresh process (N launches, {VARIANT_REPS} repetitions, paired ratios to that process's floor):"
    );
    let _ = writeln!(
        table,
        "  {:<64} {:>8} {:>8} {:>9} {:>9} {:>9} {:>9}",
        "setting / streams", "floor ns", "owner x", "closure x", "floor/s", "owner x", "closure x"
    );
    json.truncate(json.trim_end().len() - 1);
    json.push_str(",\n  \"variants\": {");
    for (k, (label, v)) in variant_rows.iter().enumerate() {
        json.push_str(&format!("\n    {label:?}: {{"));
        for (i, streams) in ["1 stream", "4 streams"].iter().enumerate() {
            let w = &v[i * 6..i * 6 + 6];
            let _ = writeln!(
                table,
                "  {:<64} {:>8.0} {:>8.3} {:>9.3} {:>9.0} {:>9.3} {:>9.3}",
                format!("{label}, {streams}"),
                w[0],
                w[1],
                w[2],
                w[3],
                w[4],
                w[5]
            );
            json.push_str(&format!(
                "\n      {streams:?}: {{\"floor_enqueue_ns\": {:.1}, \"owner_enqueue_ratio\": {:.4}, \"closure_enqueue_ratio\": {:.4}, \"floor_per_second\": {:.0}, \"owner_throughput_ratio\": {:.4}, \"closure_throughput_ratio\": {:.4}}}{}",
                w[0],
                w[1],
                w[2],
                w[3],
                w[4],
                w[5],
                if i == 0 { "," } else { "" }
            ));
        }
        json.push_str(if k + 1 < variant_rows.len() {
            "\n    },"
        } else {
            "\n    }"
        });
    }
    json.push_str("\n  }\n}\n");

    let costs = ingredient_costs(&bench, &one[0]);
    let _ = writeln!(
        table,
        "\ningredients of a launch (ns per call, median of {}):",
        reps()
    );
    for (name, ns) in &costs {
        let _ = writeln!(table, "  {name:<52} {ns:>8.1}");
    }
    json.truncate(json.trim_end().len() - 1); // reopen the object
    json.push_str(",\n  \"ingredients_ns\": {");
    for (k, (name, ns)) in costs.iter().enumerate() {
        json.push_str(&format!(
            "\n    {name:?}: {ns:.2}{}",
            if k + 1 < costs.len() { "," } else { "" }
        ));
    }
    json.push_str("\n  }\n}\n");
    print!("{table}");
    std::fs::write("bench-results.json", json).unwrap();
    println!("\nwrote bench-results.json");
}

/// What the pieces a wrapper adds to a launch cost on their own: the driver queries it makes and
/// the allocation of its record.
fn ingredient_costs(bench: &Bench, stream: &Stream) -> Vec<(&'static str, f64)> {
    const CALLS: usize = 1_000_000;
    let d = bench.gpu.driver;
    let s = stream.raw();
    let info = d.raw().cuStreamGetCaptureInfo().unwrap();
    let is_capturing = d.raw().cuStreamIsCapturing().unwrap();
    let get_ctx = d.raw().cuStreamGetCtx().unwrap();
    let current = d.raw().cuCtxGetCurrent().unwrap();
    let time = |f: &mut dyn FnMut()| {
        let mut v: Vec<f64> = (0..reps())
            .map(|_| {
                let t = Instant::now();
                for _ in 0..CALLS {
                    f();
                }
                t.elapsed().as_nanos() as f64 / CALLS as f64
            })
            .collect();
        median(&mut v)
    };
    use std::ptr::null_mut as null;
    let none = cuda_dl_sys::types::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    vec![
        (
            "cuStreamGetCaptureInfo (status, id, graph)",
            time(&mut || {
                let (mut st, mut id, mut g) = (none, 0, null());
                // SAFETY: live stream, valid out-pointers.
                unsafe { info(s, &mut st, &mut id, &mut g, null(), null(), null()) };
            }),
        ),
        (
            "cuStreamIsCapturing",
            time(&mut || {
                let mut st = none;
                // SAFETY: live stream, valid out-pointer.
                unsafe { is_capturing(s, &mut st) };
            }),
        ),
        (
            "cuStreamGetCtx",
            time(&mut || {
                let mut c = null();
                // SAFETY: live stream, valid out-pointer.
                unsafe { get_ctx(s, &mut c) };
            }),
        ),
        (
            "cuCtxGetCurrent",
            time(&mut || {
                let mut c = null();
                // SAFETY: valid out-pointer.
                unsafe { current(&mut c) };
            }),
        ),
        (
            "Box<[u64; 4]> allocate + free (same thread)",
            time(&mut || {
                std::hint::black_box(Box::new([0u64; 4]));
            }),
        ),
    ]
}

/// What one run of the event section measured: enqueue ns per item (the launching threads'
/// median), and items per second end to end (all enqueued, synchronized, and completed).
struct EventRun {
    enqueue_ns: f64,
    per_second: f64,
}

/// The event section's methods.
#[derive(Clone, Copy, PartialEq, Eq)]
enum EventMethod {
    /// `cuLaunchHostFunc` of a no-op: the host-function floor.
    HostFnFloor,
    /// `cuEventRecord` from a ring per thread, one poller on its own CPU: the event floor.
    EventFloor,
    /// `release_after` with a small owner.
    ReleaseAfter,
    /// `spawn_after` with a closure.
    SpawnAfter,
}

const EVENT_METHODS: [EventMethod; 4] = [
    EventMethod::HostFnFloor,
    EventMethod::EventFloor,
    EventMethod::ReleaseAfter,
    EventMethod::SpawnAfter,
];

impl EventMethod {
    fn name(self) -> &'static str {
        match self {
            EventMethod::HostFnFloor => "raw cuLaunchHostFunc (host-function floor)",
            EventMethod::EventFloor => "raw cuEventRecord ring + poller (event floor)",
            EventMethod::ReleaseAfter => "release_after + owner",
            EventMethod::SpawnAfter => "spawn_after closure",
        }
    }

    fn key(self) -> &'static str {
        match self {
            EventMethod::HostFnFloor => "host_fn_floor",
            EventMethod::EventFloor => "event_floor",
            EventMethod::ReleaseAfter => "release_after",
            EventMethod::SpawnAfter => "spawn_after",
        }
    }
}

/// `threads` threads (each pinned to a CPU of `cpus` when given), each enqueueing `n` items of
/// `method` on a stream of its own; the floor's poller on `poller_cpu`.
fn event_run(
    bench: &Bench,
    lanes: &event_lanes::EventLanes,
    method: EventMethod,
    streams: &[Stream],
    n: usize,
    cpus: Option<&[usize]>,
    poller_cpu: Option<usize>,
) -> EventRun {
    if method == EventMethod::EventFloor {
        lanes.start(poller_cpu);
    }
    let barrier = std::sync::Barrier::new(streams.len());
    let started = Mutex::new(None::<Instant>);
    let enqueue_ns: Vec<f64> = std::thread::scope(|s| {
        let handles: Vec<_> = streams
            .iter()
            .enumerate()
            .map(|(t, stream)| {
                let (barrier, started) = (&barrier, &started);
                s.spawn(move || {
                    if let Some(cpus) = cpus {
                        pin_current_thread(cpus[t % cpus.len()]);
                    }
                    bench.gpu.bind_thread();
                    let launch = bench.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                    barrier.wait();
                    let begun = Instant::now();
                    started.lock().unwrap().get_or_insert(begun);
                    for i in 0..n {
                        match method {
                            EventMethod::HostFnFloor => {
                                // SAFETY: live stream; `noop` ignores its argument.
                                let code = unsafe {
                                    launch(stream.raw(), Some(noop), std::ptr::null_mut())
                                };
                                assert_eq!(code, CUresult::CUDA_SUCCESS);
                            }
                            EventMethod::EventFloor => lanes.record(t, stream.raw()),
                            EventMethod::ReleaseAfter => {
                                release_after(stream, [i as u64; 2]).unwrap()
                            }
                            EventMethod::SpawnAfter => {
                                let value = i as u64;
                                spawn_after(stream, move || {
                                    std::hint::black_box(value);
                                })
                                .unwrap()
                            }
                        }
                    }
                    begun.elapsed().as_nanos() as f64 / n as f64
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for stream in streams {
        stream.synchronize().unwrap();
    }
    match method {
        EventMethod::EventFloor => lanes.wait_all(),
        EventMethod::ReleaseAfter | EventMethod::SpawnAfter => {
            while pending_launches(None) > 0 {
                std::thread::yield_now();
            }
        }
        EventMethod::HostFnFloor => {}
    }
    let total = started
        .lock()
        .unwrap()
        .map_or(Duration::ZERO, |t| t.elapsed());
    if method == EventMethod::EventFloor {
        lanes.stop();
    }
    flush(Duration::from_secs(30)).unwrap();
    let mut e = enqueue_ns;
    EventRun {
        enqueue_ns: median(&mut e),
        per_second: (n * streams.len()) as f64 / total.as_secs_f64(),
    }
}

/// Issue 31's table: the event transport (`release_after`, `spawn_after`) next to the
/// host-function floor and the event floor (`cuEventRecord` from a ring, a poller on a CPU of its
/// own), on 1 stream and on 8 threads x 8 streams, methods interleaved in rotating order; then the
/// targets' ratios (medians over the repetitions of each repetition's ratio).
fn event_section(
    bench: &Bench,
    pin: Option<&Pinning>,
    all_cpus: &[usize],
    table: &mut String,
    json: &mut String,
) {
    const THREADS: usize = 8;
    let poller_cpu = pin.map(|p| p.poller);
    // The 8 launching threads on CPUs of their own, after the pinned ones (CPU 0 skipped).
    let taken: Vec<usize> = pin.map_or(Vec::new(), |p| {
        vec![p.launcher, p.driver, p.reaper, p.poller]
    });
    let free: Vec<usize> = all_cpus
        .iter()
        .copied()
        .filter(|c| *c != 0 && !taken.contains(c))
        .collect();
    let eight_cpus = (pin.is_some() && free.len() >= THREADS).then(|| free[..THREADS].to_vec());
    let one_cpu = pin.map(|p| vec![p.launcher]);
    let one: Vec<Stream> = vec![Stream::new_non_blocking(&bench.gpu.context).unwrap()];
    let eight: Vec<Stream> = (0..THREADS)
        .map(|_| Stream::new_non_blocking(&bench.gpu.context).unwrap())
        .collect();
    let lanes_one = event_lanes::EventLanes::new(bench.gpu.driver, bench.gpu.context.raw(), 1);
    let lanes_eight =
        event_lanes::EventLanes::new(bench.gpu.driver, bench.gpu.context.raw(), THREADS);
    let per_thread = N / THREADS;
    let _ = writeln!(
        table,
        "\nevent transport (issue 31): 1 stream, {N} items; 8 threads x 8 streams, {per_thread} items per thread; \
         {} repetitions, interleaved. The event floor's poller and the crate's event poller on CPU {poller_cpu:?}; \
         the 8 threads on {eight_cpus:?}.",
        reps()
    );
    json.push_str("\n  \"event_transport\": {");
    let mut ratios_out = Vec::new();
    for (label, streams, lanes, n, cpus) in [
        ("1 stream", &one, &lanes_one, N, one_cpu.as_deref()),
        (
            "8 threads x 8 streams",
            &eight,
            &lanes_eight,
            per_thread,
            eight_cpus.as_deref(),
        ),
    ] {
        // Warm-up.
        for m in EVENT_METHODS {
            event_run(bench, lanes, m, streams, n / 10, cpus, poller_cpu);
        }
        let mut enqueue = [const { Vec::new() }; EVENT_METHODS.len()];
        let mut rate = [const { Vec::new() }; EVENT_METHODS.len()];
        for rep in 0..reps() {
            for j in 0..EVENT_METHODS.len() {
                let k = (rep + j) % EVENT_METHODS.len();
                let run = event_run(bench, lanes, EVENT_METHODS[k], streams, n, cpus, poller_cpu);
                enqueue[k].push(run.enqueue_ns);
                rate[k].push(run.per_second);
            }
        }
        let _ = writeln!(
            table,
            "{label}:\n  {:<48} {:>10} {:>12}",
            "method", "enqueue ns", "items/s"
        );
        json.push_str(&format!("\n    {label:?}: {{"));
        for (k, m) in EVENT_METHODS.iter().enumerate() {
            let (e, _, _) = quartiles(&enqueue[k]);
            let (r, _, _) = quartiles(&rate[k]);
            let _ = writeln!(table, "  {:<48} {e:>10.0} {r:>12.0}", m.name());
            json.push_str(&format!(
                "\n      {:?}: {{\"enqueue_ns\": {e:.1}, \"per_second\": {r:.0}, \"enqueue_ns_per_rep\": {:?}, \"per_second_per_rep\": {:?}}},",
                m.key(),
                enqueue[k].iter().map(|x| x.round()).collect::<Vec<_>>(),
                rate[k].iter().map(|x| x.round()).collect::<Vec<_>>(),
            ));
        }
        // Paired ratios (each repetition's figure over the same repetition's floor).
        let ratio = |a: &[f64], b: &[f64]| {
            let mut v: Vec<f64> = a.iter().zip(b).map(|(x, y)| x / y).collect();
            median(&mut v)
        };
        let (host, event, release, spawn) = (0, 1, 2, 3);
        let lines = [
            (
                "release_after enqueue / host-function floor's",
                ratio(&enqueue[release], &enqueue[host]),
            ),
            (
                "release_after enqueue / raw cuEventRecord's",
                ratio(&enqueue[release], &enqueue[event]),
            ),
            (
                "spawn_after enqueue / host-function floor's",
                ratio(&enqueue[spawn], &enqueue[host]),
            ),
            (
                "spawn_after enqueue / raw cuEventRecord's",
                ratio(&enqueue[spawn], &enqueue[event]),
            ),
            (
                "release_after end to end / host-function floor's",
                ratio(&rate[release], &rate[host]),
            ),
            (
                "release_after end to end / event floor's",
                ratio(&rate[release], &rate[event]),
            ),
            (
                "spawn_after end to end / host-function floor's",
                ratio(&rate[spawn], &rate[host]),
            ),
            (
                "spawn_after end to end / event floor's",
                ratio(&rate[spawn], &rate[event]),
            ),
        ];
        for (name, r) in lines {
            let _ = writeln!(table, "  {name:<60} {r:>7.3}");
            ratios_out.push(format!("\"{label}: {name}\": {r:.4}"));
        }
        json.push_str("\n      \"_\": 0\n    },");
    }
    json.push_str(&format!(
        "\n    \"ratios\": {{{}}}\n  }},",
        ratios_out.join(", ")
    ));
}
