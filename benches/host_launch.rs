//! Host-launch overhead against the raw driver call, measured in one run on a real GPU.
//!
//! `cargo bench --bench host_launch` on a GPU machine, or `BENCH=1 gpu-bundle/run` from the bundle
//! of `scripts/gpu-bundle`. Prints a table and writes the same figures to `bench-results.json` in the
//! working directory. Every figure of a wrapper is also given as a ratio to the floor (the raw
//! `cuLaunchHostFunc` through the cuda-sys pointer) measured in the same run, interleaved with it.
//!
//! Methods (see BENCHMARKS.md): 1 raw floor; 2 `launch_host_function` with one small owner;
//! 3 `host_launch` with a closure capturing a small value; 4 the cust/CCCL way
//! (`cuStreamAddCallback`, a boxed closure freed on the driver thread).

use std::ffi::c_void;
use std::fmt::Write as _;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_host_launch::{Stream, flush, host_launch, launch_host_function};
use cuda_sys::types::{CUresult, CUstream};
use cuda_workspace::gpu::{Gpu, MappedU32s, heap_in_use};

const N: usize = 200_000;
const REPS: usize = 11;
/// Repetitions in each cleanup-variant child process.
const VARIANT_REPS: usize = 5;
const LATENCY_SAMPLES: usize = 2_000;
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
}

const METHODS: [Method; 7] = [
    Method::Raw,
    Method::Owner,
    Method::Closure,
    Method::Callback,
    Method::RawWithCaptureQuery,
    Method::RawWithAllocation,
    Method::RawWithUserData,
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

/// The peer approach: cust's `add_callback` / CCCL's closure path.
unsafe extern "C" fn boxed_callback(_: CUstream, _: CUresult, data: *mut c_void) {
    // SAFETY: `data` is the Box leaked by `launch_callback`, taken back once, here.
    let f = unsafe { Box::from_raw(data.cast::<Box<dyn FnOnce() + Send>>()) };
    f();
}

struct Bench {
    gpu: Gpu,
}

impl Bench {
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
                let info = self.gpu.driver.raw().cuStreamGetCaptureInfo().unwrap();
                let launch = self.gpu.driver.raw().cuLaunchHostFunc().unwrap();
                let mut status =
                    cuda_sys::types::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
                let (mut id, mut graph) = (0, std::ptr::null_mut());
                use std::ptr::null_mut as null;
                // SAFETY: live stream; valid out-pointers; `noop` ignores its argument.
                let code = unsafe {
                    info(
                        stream.raw(),
                        &mut status,
                        &mut id,
                        &mut graph,
                        null(),
                        null(),
                        null(),
                    );
                    launch(stream.raw(), Some(noop), std::ptr::null_mut())
                };
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
            Method::Callback => {
                let f: Box<Box<dyn FnOnce() + Send>> = Box::new(Box::new(move || {
                    std::hint::black_box(value);
                }));
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
        }
    }

    /// ns per enqueue of `n` launches spread round-robin over `streams`; and the end-to-end rate
    /// (host functions per second, enqueue through synchronize).
    fn enqueue_and_throughput(&self, method: Method, streams: &[Stream], n: usize) -> (f64, f64) {
        let started = Instant::now();
        for i in 0..n {
            self.launch(method, &streams[i % streams.len()], i as u64);
        }
        let enqueued = started.elapsed();
        for s in streams {
            s.synchronize().unwrap();
        }
        let total = started.elapsed();
        flush(Duration::from_secs(30)).unwrap();
        (
            enqueued.as_nanos() as f64 / n as f64,
            n as f64 / total.as_secs_f64(),
        )
    }
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
        let started = STAMP.lock().unwrap().expect("the host function ran");
        out.push(started.saturating_duration_since(seen).as_nanos() as f64 / 1000.0);
    }
    flush(Duration::from_secs(10)).unwrap();
    out.sort_by(|a, b| a.total_cmp(b));
    out
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
/// woken, in µs; and the low-latency poller's CPU time over the run, and the run's wall time.
fn async_latency(
    bench: &Bench,
    mode: cuda_host_launch::CompletionMode,
    stream: &Stream,
    samples: usize,
) -> (Vec<f64>, Duration, Duration) {
    use std::future::Future;
    let flag = MappedU32s::new(bench.gpu.driver, 1);
    let mut out = Vec::with_capacity(samples);
    let cpu_before = cuda_host_launch::poller_cpu_time();
    let started = Instant::now();
    for i in 1..=samples as u32 {
        // About 100 µs of kernel: the future is still pending when first polled.
        bench
            .gpu
            .kernels
            .spin_then_write(stream.raw(), flag.device(0), i, 200_000);
        let mut future = cuda_host_launch::completion_with(stream, mode).unwrap();
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

/// Heap bytes per pending launch: launches held behind a stream that waits on mapped memory.
fn heap_per_pending(bench: &Bench, method: Method, stream: &Stream) -> f64 {
    let gate = MappedU32s::new(bench.gpu.driver, 1);
    // SAFETY: live stream; the gate is mapped memory that outlives the wait (released below).
    unsafe {
        bench
            .gpu
            .driver
            .cuStreamWaitValue32(stream.raw(), gate.device(0), 1, 0)
    }
    .unwrap();
    let before = heap_in_use();
    for i in 0..PENDING {
        bench.launch(method, stream, i as u64);
    }
    let after = heap_in_use();
    gate.set(0, 1);
    stream.synchronize().unwrap();
    flush(Duration::from_secs(30)).unwrap();
    (after as f64 - before as f64) / PENDING as f64
}

/// Cold start, in a fresh process: opening the driver (dlopen + cuInit + version) and the first
/// resolution of a table entry.
fn cold_start_child() {
    // The system loader alone, as a separate number: the driver() call below then finds the
    // library mapped and pays for cuInit and the version query.
    let t = Instant::now();
    let library = cuda_sys::DEFAULT_NAMES.iter().find_map(|name| {
        // SAFETY: opening the NVIDIA driver library, as cuda-sys does.
        unsafe { libloading::Library::new(*name) }.ok()
    });
    let dlopen = t.elapsed();
    let t0 = Instant::now();
    let driver = cuda_sys::driver().unwrap();
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
    for _ in 0..REPS {
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

/// One variant's 1-stream enqueue cost and throughput for the floor, owner and closure methods,
/// measured in this (child) process with whatever cleanup settings its environment gives.
fn variant_child() {
    let bench = Bench { gpu: Gpu::open() };
    let streams = vec![Stream::new(&bench.gpu.context).unwrap()];
    let methods = [Method::Raw, Method::Owner, Method::Closure];
    for m in methods {
        bench.enqueue_and_throughput(m, &streams, 20_000);
    }
    let mut e = [const { Vec::new() }; 3];
    let mut r = [const { Vec::new() }; 3];
    for rep in 0..VARIANT_REPS {
        for j in 0..methods.len() {
            let k = (rep + j) % methods.len();
            let (ns, per_s) = bench.enqueue_and_throughput(methods[k], &streams, N / 2);
            e[k].push(ns);
            r[k].push(per_s);
        }
    }
    let e: Vec<f64> = e.iter_mut().map(|v| median(v)).collect();
    let r: Vec<f64> = r.iter_mut().map(|v| median(v)).collect();
    println!("{} {} {} {} {} {}", e[0], e[1], e[2], r[0], r[1], r[2]);
}

/// The cleanup settings compared, each in a fresh process.
const VARIANTS: [(&str, &[(&str, &str)]); 4] = [
    (
        "reaper parks after every batch (poll 0)",
        &[("CUDA_HOST_LAUNCH_REAPER_POLL_US", "0")],
    ),
    ("reaper lingers, poll 50 us (default)", &[]),
    (
        "reaper lingers, poll 200 us",
        &[("CUDA_HOST_LAUNCH_REAPER_POLL_US", "200")],
    ),
    (
        "manual mode: drained at each launch",
        &[("CUDA_HOST_LAUNCH_CLEANUP", "manual")],
    ),
];

fn variants() -> Vec<(&'static str, [f64; 6])> {
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
                6,
                "variant {label}: {text} {}",
                String::from_utf8_lossy(&out.stderr)
            );
            (*label, [v[0], v[1], v[2], v[3], v[4], v[5]])
        })
        .collect()
}

fn main() {
    if std::env::args().any(|a| a == "--cold-start-child") {
        cold_start_child();
        return;
    }
    if std::env::args().any(|a| a == "--variant-child") {
        variant_child();
        return;
    }
    let bench = Bench { gpu: Gpu::open() };
    let device = cuda_host_launch::Device::get(0).unwrap().name().unwrap();
    let version = bench.gpu.driver.version();
    let one = vec![Stream::new(&bench.gpu.context).unwrap()];
    let four: Vec<Stream> = (0..4)
        .map(|_| Stream::new(&bench.gpu.context).unwrap())
        .collect();
    let mut json = String::new();
    let mut table = String::new();
    let _ = writeln!(
        table,
        "host-launch benchmark: {device}, driver CUDA {version} ({})",
        version.0
    );
    let _ = writeln!(
        table,
        "N = {N} launches per repetition, {REPS} repetitions (median), methods interleaved in rotating order\n"
    );
    json.push_str(&format!(
        "{{\n  \"device\": {device:?},\n  \"driver_version\": {},\n  \"n\": {N},\n  \"reps\": {REPS},\n  \"throughput\": {{",
        version.0
    ));

    // Warm-up: every method, both stream sets.
    for m in METHODS {
        bench.enqueue_and_throughput(m, &one, 20_000);
        bench.enqueue_and_throughput(m, &four, 20_000);
    }

    for (label, streams) in [("1 stream", &one), ("4 streams", &four)] {
        let mut enqueue = [const { Vec::new() }; METHODS.len()];
        let mut rate = [const { Vec::new() }; METHODS.len()];
        for rep in 0..REPS {
            // The order rotates from one repetition to the next, so no method always runs first
            // (after the previous repetition's synchronize and flush) or last.
            for j in 0..METHODS.len() {
                let k = (rep + j) % METHODS.len();
                let (ns, per_s) = bench.enqueue_and_throughput(METHODS[k], streams, N);
                enqueue[k].push(ns);
                rate[k].push(per_s);
            }
        }
        let spread = |v: &[f64]| {
            let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = v.iter().copied().fold(0.0, f64::max);
            (lo, hi)
        };
        let e_spread: Vec<(f64, f64)> = enqueue.iter().map(|v| spread(v)).collect();
        let r_spread: Vec<(f64, f64)> = rate.iter().map(|v| spread(v)).collect();
        let e: Vec<f64> = enqueue.iter_mut().map(|v| median(v)).collect();
        let r: Vec<f64> = rate.iter_mut().map(|v| median(v)).collect();
        let _ = writeln!(table, "{label}:");
        let _ = writeln!(
            table,
            "  {:<52} {:>10} {:>8} {:>14} {:>8}   range over reps (ns; /s)",
            "method", "enqueue ns", "x floor", "host fns/s", "x floor"
        );
        json.push_str(&format!("\n    {label:?}: {{"));
        for (k, m) in METHODS.iter().enumerate() {
            let _ = writeln!(
                table,
                "  {:<52} {:>10.0} {:>8.3} {:>14.0} {:>8.3}   {:.0}-{:.0}; {:.0}-{:.0}",
                m.name(),
                e[k],
                e[k] / e[0],
                r[k],
                r[k] / r[0],
                e_spread[k].0,
                e_spread[k].1,
                r_spread[k].0,
                r_spread[k].1
            );
            json.push_str(&format!(
                "\n      {:?}: {{\"enqueue_ns\": {:.1}, \"enqueue_ratio\": {:.4}, \"per_second\": {:.0}, \"throughput_ratio\": {:.4}, \"enqueue_ns_range\": [{:.1}, {:.1}], \"per_second_range\": [{:.0}, {:.0}]}}{}",
                m.key(),
                e[k],
                e[k] / e[0],
                r[k],
                r[k] / r[0],
                e_spread[k].0,
                e_spread[k].1,
                r_spread[k].0,
                r_spread[k].1,
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

    let raw_latency = latency(&bench, Method::Raw, &one[0], LATENCY_SAMPLES);
    let closure_latency = latency(&bench, Method::Closure, &one[0], LATENCY_SAMPLES);
    let _ = writeln!(
        table,
        "latency, kernel's write seen by a host spinner -> host function starts ({LATENCY_SAMPLES} samples, µs):"
    );
    json.push_str("\n  \"latency_us\": {");
    for (name, v, key, last) in [
        (Method::Raw.name(), &raw_latency, "raw", false),
        (Method::Closure.name(), &closure_latency, "closure", true),
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
    for (k, mode) in [
        cuda_host_launch::CompletionMode::HostFunction,
        cuda_host_launch::CompletionMode::LowLatency,
    ]
    .into_iter()
    .enumerate()
    {
        let (v, cpu, wall) = async_latency(&bench, mode, &one[0], LATENCY_SAMPLES);
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
            if k == 0 { "," } else { "" }
        ));
    }
    json.push_str("\n  },");

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
    for (k, m) in METHODS[..4].iter().enumerate() {
        let bytes = heap_per_pending(&bench, *m, &one[0]);
        let _ = writeln!(table, "  {:<52} {bytes:>8.1}", m.name());
        json.push_str(&format!(
            "\n    {:?}: {bytes:.1}{}",
            m.key(),
            if k + 1 < 4 { "," } else { "" }
        ));
    }
    json.push_str("\n  },");

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
    let variant_rows = variants();
    let _ = writeln!(
        table,
        "\ncleanup settings, each in a fresh process (1 stream, N/2 launches, ratios to that process's floor):"
    );
    let _ = writeln!(
        table,
        "  {:<44} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "setting", "floor ns", "owner x", "closure x", "floor/s", "owner x"
    );
    json.truncate(json.trim_end().len() - 1);
    json.push_str(",\n  \"cleanup_variants\": {");
    for (k, (label, v)) in variant_rows.iter().enumerate() {
        let _ = writeln!(
            table,
            "  {label:<44} {:>9.0} {:>9.3} {:>9.3} {:>9.0} {:>9.3}   (closure x {:.3})",
            v[0],
            v[1] / v[0],
            v[2] / v[0],
            v[3],
            v[4] / v[3],
            v[5] / v[3]
        );
        json.push_str(&format!(
            "\n    {label:?}: {{\"floor_enqueue_ns\": {:.1}, \"owner_enqueue_ratio\": {:.4}, \"closure_enqueue_ratio\": {:.4}, \"floor_per_second\": {:.0}, \"owner_throughput_ratio\": {:.4}, \"closure_throughput_ratio\": {:.4}}}{}",
            v[0],
            v[1] / v[0],
            v[2] / v[0],
            v[3],
            v[4] / v[3],
            v[5] / v[3],
            if k + 1 < variant_rows.len() { "," } else { "" }
        ));
    }
    json.push_str("\n  }\n}\n");

    let costs = ingredient_costs(&bench, &one[0]);
    let _ = writeln!(
        table,
        "\ningredients of a launch (ns per call, median of {REPS}):"
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
        let mut v: Vec<f64> = (0..REPS)
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
    let none = cuda_sys::types::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
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
