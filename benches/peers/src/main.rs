//! Issue 39's peers benchmark: our crates, cudarc 0.19 and NVIDIA's cuda-core/cuda-async 0.5 in
//! one process on the same streams (made by `cuda_host_launch::Stream` in device 0's primary
//! context and borrowed by the others): wake latency at three holds with the CPU each library's
//! threads spend per wait, throughput with many streams in flight, and host functions.
//!
//! Knobs: `PEERS_SAMPLES` (2000 per row at the 50 µs and 2 ms holds, over all repetitions),
//! `PEERS_SAMPLES_LONG` (60 at 20 ms), `PEERS_REPS` (5), `PEERS_ITEMS` (1000 per stream),
//! `PEERS_THREAD_ITEMS` (25,000 per thread), `PEERS_HOST_N` (200,000), `PEERS_HOLDS_US`
//! (50,2000,20000), `PEERS_ONLY=latency,throughput,host`, `PEERS_WAITS=1` (sample where the
//! 8 × 8 row's enqueuing threads wait, and which threads are busy in the host-function rows:
//! `waits.rs`), `PEERS_POLLER` (our watcher's pace for
//! the process: `ours::install_poller_from_env`), `PEERS_ALLOW_SKIP=1` (a library that
//! cannot run here does not fail the run: for the fake driver). Exit status: 0 when every row ran;
//! 1 when a row failed; 2 with no driver; 3 when a library's rows were skipped.

mod cpu;
mod cuda_async_lib;
mod cudarc_lib;
mod gpu;
mod host_functions;
mod knobs;
mod latency;
mod ours;
mod raw;
mod report;
mod stats;
mod throughput;
mod waits;
mod wake;

use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use cuda_host_launch::{CompletionMode, Stream};

use crate::cuda_async_lib::NvidiaContext;
use crate::gpu::{Gpu, Hold, MappedWords};
use crate::knobs::{Knobs, Section};
use crate::latency::Method;
use crate::report::Report;
use crate::throughput::MakeFuture;

fn main() -> ExitCode {
    let knobs = match Knobs::from_env() {
        Ok(knobs) => knobs,
        Err(e) => {
            eprintln!("peers: {e}");
            return ExitCode::from(1);
        }
    };
    let poller = match ours::install_poller_from_env() {
        Ok(poller) => poller,
        Err(e) => {
            eprintln!("peers: {e}");
            return ExitCode::from(1);
        }
    };
    let gpu = match Gpu::open() {
        Ok(gpu) => Arc::new(gpu),
        Err(e) => {
            eprintln!(
                "peers: {e}\npeers: this benchmark needs an NVIDIA GPU and its driver \
                 (libcuda.so.1); CUDA_DL_SYS_LIBRARY names another library for our crates"
            );
            return ExitCode::from(2);
        }
    };
    let mut report = Report::default();
    println!("# Peers benchmark (issue 39)\n");
    println!("- {}", gpu.describe());
    println!(
        "- knobs: {knobs:?}; CUDA_ASYNC_SPIN_BUDGET_US={}, CUDA_ASYNC_HOST_SYNC={}",
        env_or_unset("CUDA_ASYNC_SPIN_BUDGET_US"),
        env_or_unset("CUDA_ASYNC_HOST_SYNC")
    );
    println!("- ours: the watcher's pace (PEERS_POLLER): {poller:?}");
    let nvidia = NvidiaContext::borrow(&gpu).map(Arc::new);
    let cudarc = cudarc_lib::available();
    for (name, status) in [
        ("cuda-async/cuda-core 0.5", &nvidia.as_ref().map(|_| ())),
        ("cudarc 0.19", &cudarc.as_ref().map(|_| ())),
    ] {
        match status {
            Ok(()) => println!("- {name}: loaded"),
            Err(e) => {
                println!("- {name}: skipped: {e}");
                report.skipped.push(format!("{name}: {e}"));
            }
        }
    }
    println!(
        "- CPU per wait: per-thread run time from /proc/self/task/*/schedstat (the library's own \
         threads, by name), and getrusage(RUSAGE_SELF) minus the measuring thread's \
         getrusage(RUSAGE_THREAD) (everything else: driver threads, helper threads)\n"
    );
    let result = (|| -> Result<(), String> {
        if knobs.runs(Section::Latency) {
            latency_section(&knobs, &gpu, nvidia.as_ref().ok(), &mut report)?;
        }
        if knobs.runs(Section::Throughput) {
            throughput_section(&knobs, &gpu, nvidia.as_ref().ok(), &mut report)?;
        }
        if knobs.runs(Section::Host) {
            host_section(
                &knobs,
                &gpu,
                nvidia.as_ref().ok(),
                cudarc.is_ok(),
                &mut report,
            )?;
        }
        Ok(())
    })();
    report.print();
    if let Err(e) = result {
        eprintln!("peers: {e}");
        return ExitCode::from(1);
    }
    if let Err(e) = cuda_host_launch::flush(Duration::from_secs(10)) {
        eprintln!("peers: flush at exit: {e}");
    }
    if report.failed() {
        return ExitCode::from(1);
    }
    if !report.skipped.is_empty() && std::env::var("PEERS_ALLOW_SKIP").as_deref() != Ok("1") {
        eprintln!("peers: some libraries' rows were skipped (PEERS_ALLOW_SKIP=1 accepts that)");
        return ExitCode::from(3);
    }
    ExitCode::SUCCESS
}

fn env_or_unset(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| "(unset)".into())
}

fn latency_section(
    knobs: &Knobs,
    gpu: &Arc<Gpu>,
    nvidia: Option<&Arc<NvidiaContext>>,
    report: &mut Report,
) -> Result<(), String> {
    let stream = Arc::new(gpu.stream()?);
    let mut hold = Hold::new(gpu)?;
    let floor = Arc::new(raw::Floor::new(gpu)?);
    let first_hold = knobs.holds.first().copied().into_iter().collect::<Vec<_>>();
    let mut methods: Vec<Method> = Vec::new();
    {
        let (floor, stream) = (Arc::clone(&floor), Arc::clone(&stream));
        methods.push(Method {
            name: "raw floor: cuEventQuery spin on an event recorded after the wait".into(),
            library: "raw",
            threads: raw::THREADS,
            parked: false,
            holds: None,
            waiter_setup: None,
            arm: Box::new(move || floor.arm(stream.raw())),
        });
    }
    for parked in [false, true] {
        let (floor, stream) = (Arc::clone(&floor), Arc::clone(&stream));
        methods.push(Method {
            name: if parked {
                "raw flag floor, parked block_on".into()
            } else {
                "raw flag floor: a word the stream writes after the wait, spun on".into()
            },
            library: "raw",
            threads: raw::THREADS,
            parked,
            holds: parked.then(|| first_hold.clone()),
            waiter_setup: None,
            arm: Box::new(move || floor.arm_word(stream.raw())),
        });
    }
    if let Some(nvidia) = nvidia {
        let theirs = nvidia.stream(&stream);
        for parked in [false, true] {
            let theirs = Arc::clone(&theirs);
            let setup = Arc::clone(nvidia);
            methods.push(Method {
                name: if parked {
                    "cuda-async 0.5 future, parked block_on".into()
                } else {
                    "cuda-async 0.5 future (reactor)".into()
                },
                library: "cuda-async",
                threads: cuda_async_lib::THREADS,
                parked,
                holds: parked.then(|| first_hold.clone()),
                waiter_setup: Some(Arc::new(move || setup.bind())),
                arm: Box::new(move || cuda_async_lib::future(&theirs)),
            });
        }
    }
    let ours_modes = [
        (CompletionMode::LowLatency, false),
        (CompletionMode::Auto, false),
        (CompletionMode::Event, false),
        (CompletionMode::HostFunction, false),
        (CompletionMode::Auto, true),
        (CompletionMode::LowLatency, true),
    ];
    for (mode, parked) in ours_modes {
        let stream = Arc::clone(&stream);
        let bind = Arc::clone(gpu);
        methods.push(Method {
            name: format!(
                "ours: CompletionMode::{mode:?}.completion(&stream){}",
                if parked { ", parked block_on" } else { "" }
            ),
            library: "ours",
            threads: ours::THREADS,
            parked,
            holds: parked.then(|| first_hold.clone()),
            waiter_setup: Some(Arc::new(move || {
                bind.bind();
                Ok(())
            })),
            arm: Box::new(move || ours::completion(&stream, mode)),
        });
    }
    let sync_stream = Arc::clone(&stream);
    let rows = latency::run(
        &methods,
        &knobs.holds,
        |h| knobs.samples_per_rep(h),
        knobs.reps,
        &mut hold,
        stream.raw(),
        &move || {
            sync_stream
                .synchronize()
                .map_err(|e| format!("cuStreamSynchronize: {e}"))
        },
    );
    report.latency(&methods, &rows);
    Ok(())
}

/// One library's side of a throughput row.
struct Side {
    name: String,
    run: Box<dyn Fn() -> Result<throughput::Rate, String>>,
}

/// One of our enqueues whose completion counts one on the counter.
type OursEnqueue = fn(&cuda_host_launch::Stream, &Arc<AtomicU64>) -> Result<(), String>;

/// One record of a raw ring: (rings, lane, stream).
type RawRecord = fn(&raw::EventRings, usize, cuda_dl_sys::types::CUstream) -> Result<(), String>;

fn throughput_section(
    knobs: &Knobs,
    gpu: &Arc<Gpu>,
    nvidia: Option<&Arc<NvidiaContext>>,
    report: &mut Report,
) -> Result<(), String> {
    const STREAMS: usize = 64;
    let streams: Arc<Vec<Arc<Stream>>> = Arc::new(
        (0..STREAMS)
            .map(|_| gpu.stream().map(Arc::new))
            .collect::<Result<_, _>>()?,
    );
    let words = Arc::new(MappedWords::new(gpu, STREAMS)?);
    let theirs: Option<Arc<Vec<Arc<cuda_core::Stream>>>> =
        nvidia.map(|n| Arc::new(streams.iter().map(|s| n.stream(s)).collect()));
    let items = knobs.items_per_stream;
    let mut rows: Vec<(String, Vec<Side>)> = Vec::new();

    let ours_auto: MakeFuture = {
        let streams = Arc::clone(&streams);
        Arc::new(move |i| ours::completion(&streams[i], CompletionMode::Auto))
    };
    let ours_after: MakeFuture = {
        let streams = Arc::clone(&streams);
        Arc::new(move |i| ours::spawn_after(&streams[i]))
    };
    let theirs_future: Option<MakeFuture> = theirs.as_ref().map(|t| {
        let t = Arc::clone(t);
        Arc::new(move |i: usize| cuda_async_lib::future(&t[i])) as MakeFuture
    });
    for (title, per_stream, ours_make, ours_name) in [
        (
            "64 streams, one item each in flight: completions/s",
            1,
            &ours_auto,
            "ours: completion(&stream) (Auto)",
        ),
        (
            "64 streams × 8 in flight: completions/s",
            8,
            &ours_after,
            "ours: spawn_after",
        ),
    ] {
        let n = (items / per_stream).max(1);
        let mut sides = vec![Side {
            name: ours_name.into(),
            run: {
                let (streams, words, make) = (
                    Arc::clone(&streams),
                    Arc::clone(&words),
                    Arc::clone(ours_make),
                );
                Box::new(move || {
                    throughput::futures_in_flight(
                        &streams,
                        &words,
                        per_stream,
                        n,
                        &make,
                        ours::THREADS,
                    )
                })
            },
        }];
        if let Some(make) = &theirs_future {
            let (streams, words, make) =
                (Arc::clone(&streams), Arc::clone(&words), Arc::clone(make));
            sides.push(Side {
                name: "cuda-async 0.5 futures".into(),
                run: Box::new(move || {
                    throughput::futures_in_flight(
                        &streams,
                        &words,
                        per_stream,
                        n,
                        &make,
                        cuda_async_lib::THREADS,
                    )
                }),
            });
        }
        rows.push((title.into(), sides));
    }
    {
        const THREADS: usize = 8;
        let per_thread = knobs.items_per_thread;
        let sample = knobs.waits;
        let done = Arc::new(AtomicU64::new(0));
        let rings = Arc::new(raw::EventRings::new(gpu, STREAMS)?);
        let shape = throughput::Shape {
            threads: THREADS,
            streams_each: STREAMS / THREADS,
            items: per_thread,
        };
        // Our sides count their completions on `done`; `clocked` says whether the clock waits for
        // them (else only for the enqueues; the completions are awaited after it stops).
        let ours = |name: &str, enqueue: OursEnqueue, clocked: bool| {
            let (gpu, streams, done) = (Arc::clone(gpu), Arc::clone(&streams), Arc::clone(&done));
            let all = (THREADS * per_thread) as u64;
            Side {
                name: name.into(),
                run: Box::new(move || {
                    done.store(0, Ordering::SeqCst);
                    let counter = Arc::clone(&done);
                    let completed = || {
                        while done.load(Ordering::Acquire) < all {
                            std::thread::yield_now();
                        }
                    };
                    let rate = throughput::threads_by_streams(
                        &gpu,
                        &streams,
                        shape,
                        Arc::new(move |_, _, stream| enqueue(stream, &counter)),
                        &|| {
                            if clocked {
                                completed();
                            }
                        },
                        ours::THREADS,
                        sample,
                    );
                    completed();
                    rate
                }),
            }
        };
        // The raw rings; `record` records one item of lane `s`.
        let raw_rings = |name: &str, record: RawRecord| {
            let (gpu, streams, rings) = (Arc::clone(gpu), Arc::clone(&streams), Arc::clone(&rings));
            Side {
                name: name.into(),
                run: Box::new(move || {
                    rings.start()?;
                    let recorder = Arc::clone(&rings);
                    let rate = throughput::threads_by_streams(
                        &gpu,
                        &streams,
                        shape,
                        Arc::new(move |_, s, stream| record(&recorder, s, stream.raw())),
                        &|| rings.wait_all(),
                        raw::THREADS,
                        sample,
                    );
                    rings.stop();
                    rate
                }),
            }
        };
        // The first two are the comparison; the rest say where the time goes: our release (no
        // callback), our enqueues alone, and the raw ring with the driver calls our enqueue adds.
        let sides = vec![
            ours("ours: spawn_after", ours::spawn_counted, true),
            raw_rings(
                "raw: cuEventRecord rings, one polling thread",
                raw::EventRings::record,
            ),
            ours("ours: release_after(owner)", ours::release_counted, true),
            ours(
                "ours: spawn_after, the enqueues alone (completions awaited after)",
                ours::spawn_counted,
                false,
            ),
            raw_rings(
                "raw: the rings, each record between two capture queries (as ours)",
                raw::EventRings::record_with_capture_queries,
            ),
        ];
        rows.push((
            "8 threads × 8 streams (the aggregate): items/s".into(),
            sides,
        ));
    }
    let mut results: Vec<Vec<Vec<Result<throughput::Rate, String>>>> = rows
        .iter()
        .map(|(_, sides)| sides.iter().map(|_| Vec::new()).collect())
        .collect();
    for rep in 0..knobs.reps {
        for (r, (_, sides)) in rows.iter().enumerate() {
            for j in 0..sides.len() {
                let s = (rep + j) % sides.len();
                let rate = (sides[s].run)();
                for stream in streams.iter() {
                    stream
                        .synchronize()
                        .map_err(|e| format!("cuStreamSynchronize: {e}"))?;
                }
                cuda_host_launch::flush(Duration::from_secs(30))
                    .map_err(|e| format!("flush: {e}"))?;
                results[r][s].push(rate);
            }
        }
    }
    for ((title, sides), results) in rows.iter().zip(results) {
        let names: Vec<String> = sides.iter().map(|s| s.name.clone()).collect();
        report.throughput(title, &names, results);
    }
    if theirs.is_none() {
        report.note("throughput: cuda-async's sides skipped (see the header)");
    }
    Ok(())
}

fn host_section(
    knobs: &Knobs,
    gpu: &Arc<Gpu>,
    nvidia: Option<&Arc<NvidiaContext>>,
    cudarc: bool,
    report: &mut Report,
) -> Result<(), String> {
    let stream = Arc::new(gpu.stream()?);
    type Enqueue = Box<dyn Fn(usize) -> Result<(), String>>;
    let mut methods: Vec<(String, Enqueue, &'static [&'static str])> = Vec::new();
    {
        let (driver, raw) = (gpu.driver, stream.raw().expose_provenance());
        methods.push((
            "raw: cuLaunchHostFunc, static C function (the floor)".into(),
            Box::new(move |n| {
                raw::host_function_noops(driver, std::ptr::with_exposed_provenance_mut(raw), n)
            }),
            &[],
        ));
    }
    {
        let stream = Arc::clone(&stream);
        methods.push((
            "ours: host_launch(&stream, || {})".into(),
            Box::new(move |n| ours::host_launch_noops(&stream, n)),
            ours::THREADS,
        ));
    }
    if let Some(nvidia) = nvidia {
        let theirs = nvidia.stream(&stream);
        methods.push((
            "cuda-core 0.5: Stream::launch_host_function(|| {})".into(),
            Box::new(move |n| cuda_async_lib::host_function_noops(&theirs, n)),
            &[],
        ));
    }
    if cudarc {
        let raw = stream.raw().expose_provenance();
        methods.push((
            "cudarc 0.19: result::stream::launch_host_function, static C function".into(),
            Box::new(move |n| {
                cudarc_lib::host_function_noops(std::ptr::with_exposed_provenance_mut(raw), n)
            }),
            &[],
        ));
    }
    let mut results: Vec<Vec<Result<host_functions::HostRate, String>>> =
        methods.iter().map(|_| Vec::new()).collect();
    let sync = || {
        stream
            .synchronize()
            .map_err(|e| format!("cuStreamSynchronize: {e}"))
    };
    for rep in 0..knobs.reps {
        for j in 0..methods.len() {
            let m = (rep + j) % methods.len();
            let (_, enqueue, threads) = &methods[m];
            let rate = host_functions::measure(
                knobs.host_functions,
                enqueue.as_ref(),
                &sync,
                threads,
                knobs.waits,
            );
            sync()?;
            cuda_host_launch::flush(Duration::from_secs(30)).map_err(|e| format!("flush: {e}"))?;
            results[m].push(rate);
        }
    }
    let names: Vec<String> = methods.iter().map(|(n, _, _)| n.clone()).collect();
    report.host(knobs.host_functions, &names, results);
    Ok(())
}
