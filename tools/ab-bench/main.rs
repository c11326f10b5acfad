//! Two builds of `cuda-host-launch` in one process: `new` (this checkout) and `old` (another commit,
//! built by `scripts/ab-bench`), launched interleaved against the raw floor on the same streams.
//!
//! Between processes the H200's one-stream figures vary by far more than most changes (the
//! floor's own enqueue cost moved between 2.0 and 3.4 µs per launch from one process to the next in
//! our runs), so comparing two builds run in two processes says little. Here every repetition
//! measures the floor, `new` and `old` back to back, and each ratio is paired within the
//! repetition, so what the process is like cancels out.
//!
//! Threads are pinned as in `benches/host_launch.rs`: the launching thread, the driver's thread and
//! each build's reaper on CPUs of their own (1, 2, 3 and 4). `AB_REPS` sets the repetitions
//! (default 15), `AB_N` the launches per run (default 200,000). CI runs it with a few launches
//! against the fake driver, to know it runs end to end before it costs device time.

use std::ffi::c_void;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cuda_dl_sys::types::{CUcontext, CUresult, CUstream};

/// Launches per run unless `AB_N` says otherwise.
const N: usize = 200_000;

/// One stream, known to both builds (each has its own `AsRawStream` trait), with its context as a
/// hint, so neither build asks the driver for it (as with this crate's `Stream`).
#[derive(Clone, Copy)]
struct Handle {
    stream: CUstream,
    context: CUcontext,
}

// SAFETY: the handle is a stream of `main`'s, alive until every launch on it has run (main
// synchronizes and drops the streams last); the context is the stream's.
unsafe impl new::AsRawStream for Handle {
    fn as_raw_stream(&self) -> CUstream {
        self.stream
    }
    fn context_hint(&self) -> Option<CUcontext> {
        Some(self.context)
    }
}

// SAFETY: as above. The old build's cuda-dl-sys has its own (identical) C types: the handles are the
// same pointers.
unsafe impl old::AsRawStream for Handle {
    fn as_raw_stream(&self) -> old_sys::types::CUstream {
        self.stream.cast()
    }
    fn context_hint(&self) -> Option<old_sys::types::CUcontext> {
        Some(self.context.cast())
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Method {
    Raw,
    OwnerNew,
    OwnerOld,
    ClosureNew,
    ClosureOld,
}

const METHODS: [Method; 5] = [
    Method::Raw,
    Method::OwnerNew,
    Method::OwnerOld,
    Method::ClosureNew,
    Method::ClosureOld,
];

impl Method {
    fn name(self) -> &'static str {
        match self {
            Method::Raw => "raw cuLaunchHostFunc (floor)",
            Method::OwnerNew => "launch_host_function + owner, new",
            Method::OwnerOld => "launch_host_function + owner, old",
            Method::ClosureNew => "host_launch closure, new",
            Method::ClosureOld => "host_launch closure, old",
        }
    }
}

unsafe extern "C" fn noop(_: *mut c_void) {}

fn launch(driver: &cuda_dl_sys::Driver, method: Method, stream: Handle, value: u64) {
    match method {
        Method::Raw => {
            let f = driver.raw().cuLaunchHostFunc().unwrap();
            // SAFETY: live stream; `noop` ignores its argument.
            let code = unsafe { f(stream.stream, Some(noop), std::ptr::null_mut()) };
            assert_eq!(code, CUresult::CUDA_SUCCESS);
        }
        // SAFETY: `noop` ignores its argument.
        Method::OwnerNew => unsafe {
            new::launch_host_function(stream, Some(noop), std::ptr::null_mut(), [value; 2]).unwrap()
        },
        // SAFETY: as above.
        Method::OwnerOld => unsafe {
            old::launch_host_function(stream, Some(noop), std::ptr::null_mut(), [value; 2]).unwrap()
        },
        Method::ClosureNew => new::host_launch(stream, move || {
            std::hint::black_box(value);
        })
        .unwrap(),
        Method::ClosureOld => old::host_launch(stream, move || {
            std::hint::black_box(value);
        })
        .unwrap(),
    }
}

fn synchronize(driver: &cuda_dl_sys::Driver, streams: &[Handle]) {
    for s in streams {
        // SAFETY: a live stream.
        unsafe { driver.cuStreamSynchronize(s.stream) }.unwrap();
    }
}

/// Waits until both builds have released every owner queued so far.
fn flush_both() {
    new::flush(Duration::from_secs(30)).unwrap();
    old::flush(Duration::from_secs(30)).unwrap();
}

/// (enqueue ns per launch, host functions per second).
fn run(driver: &cuda_dl_sys::Driver, method: Method, streams: &[Handle], n: usize) -> (f64, f64) {
    let started = Instant::now();
    for i in 0..n {
        launch(driver, method, streams[i % streams.len()], i as u64);
    }
    let enqueued = started.elapsed();
    synchronize(driver, streams);
    let total = started.elapsed();
    flush_both();
    (
        enqueued.as_nanos() as f64 / n as f64,
        n as f64 / total.as_secs_f64(),
    )
}

fn pin_current_thread(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is a valid empty set; CPU_SET writes within it (cpu < 1024).
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    unsafe { libc::CPU_SET(cpu, &mut set) };
    // SAFETY: a valid set of the size given; 0 is the calling thread.
    unsafe { libc::sched_setaffinity(0, size_of::<libc::cpu_set_t>(), &set) == 0 }
}

unsafe extern "C" fn pin_driver_thread(cpu: *mut c_void) {
    pin_current_thread(cpu as usize);
}

/// Pins the thread that drops it: each build's reaper.
struct PinOnDrop(usize);
impl Drop for PinOnDrop {
    fn drop(&mut self) {
        pin_current_thread(self.0);
    }
}

fn quartiles(values: &[f64]) -> (f64, f64, f64) {
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    (at(0.5), at(0.25), at(0.75))
}

fn main() {
    let env = |name: &str, default: usize| {
        std::env::var(name)
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default)
    };
    let reps = env("AB_REPS", 15);
    let n = env("AB_N", N);
    let driver = cuda_dl_sys::driver().unwrap();
    let context = new::PrimaryContext::retain(new::Device::get(0).unwrap()).unwrap();
    let streams: Vec<new::Stream> = (0..4)
        .map(|_| new::Stream::new(&context).unwrap())
        .collect();
    let handle = |s: &new::Stream| Handle {
        stream: s.raw(),
        context: context.raw(),
    };
    let one = [handle(&streams[0])];
    let four: Vec<Handle> = streams.iter().map(handle).collect();

    // Pinning: the driver's thread (a host function pins it), then each build's reaper (an owner
    // pins the thread that drops it), then this thread.
    let f = driver.raw().cuLaunchHostFunc().unwrap();
    // SAFETY: live stream; the function takes its CPU by value.
    let code = unsafe { f(one[0].stream, Some(pin_driver_thread), 2 as *mut c_void) };
    assert_eq!(code, CUresult::CUDA_SUCCESS);
    // SAFETY: `noop` ignores its argument; the owners pin the reapers.
    unsafe {
        new::launch_host_function(one[0], Some(noop), std::ptr::null_mut(), PinOnDrop(3)).unwrap();
        old::launch_host_function(one[0], Some(noop), std::ptr::null_mut(), PinOnDrop(4)).unwrap();
    }
    synchronize(driver, &four);
    flush_both();
    let pinned = pin_current_thread(1);
    let _keep = Arc::clone(&context);

    println!(
        "A/B in one process: N = {n} launches per run, {reps} repetitions, methods in rotating order;\n\
         ratios paired within each repetition (median, quartiles). Threads pinned: {pinned} \
         (launcher 1, driver thread 2, reaper new 3, reaper old 4)."
    );
    for m in METHODS {
        run(driver, m, &one, n / 10);
        run(driver, m, &four, n / 10);
    }
    for (label, set) in [("1 stream", &one[..]), ("4 streams", &four[..])] {
        let mut enqueue = vec![Vec::new(); METHODS.len()];
        let mut rate = vec![Vec::new(); METHODS.len()];
        for rep in 0..reps {
            for j in 0..METHODS.len() {
                let k = (rep + j) % METHODS.len();
                let (e, r) = run(driver, METHODS[k], set, n);
                enqueue[k].push(e);
                rate[k].push(r);
            }
        }
        let ratio = |v: &[Vec<f64>], a: usize, b: usize| {
            quartiles(
                &v[a]
                    .iter()
                    .zip(&v[b])
                    .map(|(x, y)| x / y)
                    .collect::<Vec<_>>(),
            )
        };
        println!("\n{label}:");
        println!(
            "  {:<40} {:>10} {:>8} {:>13} {:>11} {:>8} {:>13}",
            "method",
            "enqueue ns",
            "x floor",
            "(quartiles)",
            "host fns/s",
            "x floor",
            "(quartiles)"
        );
        for (k, m) in METHODS.iter().enumerate() {
            let (e, _, _) = quartiles(&enqueue[k]);
            let (r, _, _) = quartiles(&rate[k]);
            let (er, e25, e75) = ratio(&enqueue, k, 0);
            let (rr, r25, r75) = ratio(&rate, k, 0);
            println!(
                "  {:<40} {e:>10.0} {er:>8.3} {:>13} {r:>11.0} {rr:>8.3} {:>13}",
                m.name(),
                format!("{e25:.3}-{e75:.3}"),
                format!("{r25:.3}-{r75:.3}")
            );
        }
        for (what, a, b) in [("owner", 1, 2), ("closure", 3, 4)] {
            let (er, e25, e75) = ratio(&enqueue, a, b);
            let (rr, r25, r75) = ratio(&rate, a, b);
            let new_faster_enqueue = enqueue[a]
                .iter()
                .zip(&enqueue[b])
                .filter(|(x, y)| x < y)
                .count();
            let new_faster_rate = rate[a].iter().zip(&rate[b]).filter(|(x, y)| x > y).count();
            println!(
                "  {what}: new / old enqueue {er:.3} ({e25:.3}-{e75:.3}), new faster in {new_faster_enqueue} of {reps}; \
                 throughput {rr:.3} ({r25:.3}-{r75:.3}), new faster in {new_faster_rate} of {reps}"
            );
        }
    }
    drop(streams);
}
