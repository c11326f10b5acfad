//! Stream-ordered releases and callbacks through events (`release_after`, `spawn_after`,
//! `CompletionMode::Event`) on the real GPU. Opt-in: `--ignored --test-threads=1`, or the bundle of
//! `scripts/gpu-bundle`.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::CUstreamCaptureMode;
use cuda_host_launch::{
    CompletionMode, Error, Stream, flush, pending_launches, poller_cpu_time, release_after,
    spawn_after,
};
use cuda_workspace::gpu::{Gpu, Kernels, MappedU32s};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{CountedOwner, DropCounts, REAPER_NAME};

const PATIENCE: Duration = Duration::from_secs(60);

/// Waits until `done` holds, or fails after [`PATIENCE`].
#[track_caller]
fn wait_for(what: &str, done: impl FnMut() -> bool) {
    cuda_workspace::testing::wait_until(what, PATIENCE, done);
}

/// Drops not made by the crate's threads (the event poller, which releases what it completes, or
/// the reaper): a driver thread's or a caller's. Must stay 0.
static OFF_CRATE_THREADS: AtomicU64 = AtomicU64::new(0);

/// A counted owner that also notes a drop made anywhere but on a thread of the crate.
struct ReaperOwner(#[allow(dead_code, reason = "dropped for its count")] CountedOwner);

impl Drop for ReaperOwner {
    fn drop(&mut self) {
        let name = std::thread::current().name().map(str::to_owned);
        if name.as_deref() != Some(REAPER_NAME) && name.as_deref() != Some("cuda-hl-watch") {
            OFF_CRATE_THREADS.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// What a callback saw: its stream, its index, whether its kernel's write was visible, its thread.
type Seen = (usize, usize, bool, Option<String>);

/// Kernels of different lengths, each followed by a callback and a release that check the
/// kernel's write is visible: on 1 stream, then on 4.
fn order_against_kernels(streams: usize) {
    let gpu = Gpu::open();
    let n = 400;
    let flags = Arc::new(MappedU32s::new(gpu.driver, n * streams));
    let streams: Vec<Stream> = (0..streams)
        .map(|_| Stream::new_non_blocking(&gpu.context).unwrap())
        .collect();
    let seen: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let late_drops = Arc::new(AtomicUsize::new(0));
    for i in 0..n {
        for (s, stream) in streams.iter().enumerate() {
            let slot = s * n + i;
            // 0 to about 60 µs of spinning: later kernels may be shorter than earlier ones.
            let cycles = ((i * 7919 + s * 104_729) % 7) as u64 * 15_000;
            gpu.kernels
                .spin_then_write(stream.raw(), flags.device(slot), 1, cycles);
            let (seen, flags_cb) = (Arc::clone(&seen), Arc::clone(&flags));
            spawn_after(stream, move || {
                let written = flags_cb.get(slot) == 1;
                let thread = std::thread::current().name().map(String::from);
                seen.lock().unwrap().push((s, i, written, thread));
            })
            .unwrap();
            let owner = CheckOnDrop {
                flags: Arc::clone(&flags),
                slot,
                late: Arc::clone(&late_drops),
            };
            release_after(stream, owner).unwrap();
        }
    }
    for stream in &streams {
        stream.synchronize().unwrap();
    }
    wait_for("every callback", || {
        seen.lock().unwrap().len() == n * streams.len()
    });
    flush(PATIENCE).unwrap();
    wait_for("every release", || pending_launches(None) == 0);
    flush(PATIENCE).unwrap();
    let seen = seen.lock().unwrap();
    for s in 0..streams.len() {
        let order: Vec<usize> = seen.iter().filter(|e| e.0 == s).map(|e| e.1).collect();
        assert_eq!(
            order,
            (0..n).collect::<Vec<_>>(),
            "stream {s}: callbacks in stream order"
        );
    }
    assert!(
        seen.iter().all(|e| e.2),
        "every callback saw its kernel's write"
    );
    assert!(
        seen.iter().all(|e| e.3.as_deref() == Some(REAPER_NAME)),
        "callbacks on the reaper (the poller runs no user code)"
    );
    assert_eq!(
        late_drops.load(Ordering::SeqCst),
        0,
        "no owner dropped before its kernel ended"
    );
    println!(
        "{} kernels on {} stream(s): callbacks and releases in order; poller CPU so far {:?}",
        n * streams.len(),
        streams.len(),
        poller_cpu_time()
    );
}

/// An owner that notes if it is dropped before its kernel's write.
struct CheckOnDrop {
    flags: Arc<MappedU32s>,
    slot: usize,
    late: Arc<AtomicUsize>,
}

impl Drop for CheckOnDrop {
    fn drop(&mut self) {
        if self.flags.get(self.slot) != 1 {
            self.late.fetch_add(1, Ordering::SeqCst);
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn callbacks_and_releases_follow_kernels_of_different_lengths_on_one_stream() {
    order_against_kernels(1);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn callbacks_and_releases_follow_kernels_of_different_lengths_on_four_streams() {
    order_against_kernels(4);
}

isolated_test! {
    /// 16 threads × 1,000,000 releases (`AFTER_N` per thread overrides), each thread on a stream
    /// of its own, with counted owners: none lost, none dropped twice, none off the crate's threads (the poller releases them).
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn sixteen_threads_release_a_million_owners_each_exactly_once_on_the_crates_threads() {
        const THREADS: usize = 16;
        let per_thread: usize = std::env::var("AFTER_N")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        let gpu = Gpu::open();
        let counts = DropCounts::new(THREADS * per_thread);
        let started = Instant::now();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let gpu = &gpu;
                s.spawn(move || {
                    gpu.bind_thread();
                    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
                    for i in 0..per_thread {
                        let owner = ReaperOwner(counts.owner(t * per_thread + i));
                        release_after(&stream, owner).unwrap();
                    }
                    stream.synchronize().unwrap();
                });
            }
        });
        let enqueued = started.elapsed();
        wait_for("every release", || pending_launches(None) == 0);
        flush(PATIENCE).unwrap();
        let elapsed = started.elapsed();
        let total = THREADS * per_thread;
        println!(
            "{total} releases from {THREADS} threads: enqueued in {enqueued:?}, all dropped after \
             {elapsed:?} ({:.2} M/s); never dropped {}, twice {}, off the crate's threads {}; poller CPU \
             {:?}",
            total as f64 / elapsed.as_secs_f64() / 1e6,
            counts.never(),
            counts.more_than_once(),
            OFF_CRATE_THREADS.load(Ordering::Relaxed),
            poller_cpu_time()
        );
        assert_eq!((counts.never(), counts.more_than_once()), (0, 0));
        assert_eq!(OFF_CRATE_THREADS.load(Ordering::Relaxed), 0);
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_callback_enqueues_a_kernel_and_frees_a_device_buffer() {
    let gpu = Gpu::open();
    let stream = Arc::new(Stream::new_non_blocking(&gpu.context).unwrap());
    let mapped = Arc::new(MappedU32s::new(gpu.driver, 2));
    let kernels = Arc::new(Kernels::load_current(gpu.driver));
    let mut buffer = 0;
    // SAFETY: a valid out-pointer; the context is current.
    unsafe { gpu.driver.cuMemAlloc(&mut buffer, 1 << 20) }.unwrap();
    mapped.set(0, 42);
    gpu.kernels
        .spin_then_write(stream.raw(), mapped.device(1), 7, 100_000);
    let results: Arc<Mutex<Vec<String>>> = Arc::default();
    let (inner, out, m, k) = (
        Arc::clone(&stream),
        Arc::clone(&results),
        Arc::clone(&mapped),
        Arc::clone(&kernels),
    );
    let driver = gpu.driver;
    spawn_after(&*stream, move || {
        let mut out = out.lock().unwrap();
        out.push(format!("saw the kernel's write: {}", m.get(1) == 7));
        // CUDA calls on the poller thread: enqueue a kernel, free device memory.
        k.copy_u32(inner.raw(), m.device(0), m.device(1));
        // SAFETY: the buffer was allocated above and is used by nothing.
        out.push(format!("cuMemFree: {:?}", unsafe {
            driver.cuMemFree(buffer)
        }));
    })
    .unwrap();
    wait_for("the callback", || results.lock().unwrap().len() == 2);
    stream.synchronize().unwrap();
    assert_eq!(
        *results.lock().unwrap(),
        ["saw the kernel's write: true", "cuMemFree: Ok(())"]
    );
    assert_eq!(mapped.get(1), 42, "the callback's kernel ran");
}

isolated_test! {
    /// A trapping kernel with releases, callbacks and futures of every completion mode pending
    /// behind it. Every future (`Event`, `Auto`, `LowLatency`, `HostFunction`) resolves to
    /// `DeviceFault` with the driver's code within 10 ms of the fault surfacing (the stream's
    /// synchronize answering it), before any reset; callbacks are dropped unrun (counted), never
    /// run; owners are kept until the reset, which reclaims them (dropped once). Prints when each
    /// future resolved.
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn after_a_trap_event_futures_fail_at_once_and_releases_wait_for_the_reset() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        const N: usize = 500;
        let gpu = Gpu::open();
        let stream = Stream::new(&gpu.context).unwrap();
        let counts = DropCounts::new(N);
        let ran = Arc::new(AtomicUsize::new(0));
        let unrun = cuda_host_launch::cleanup_stats().callbacks_dropped_unrun;
        gpu.kernels.trap(stream.raw());
        for i in 0..N {
            release_after(&stream, counts.owner(i)).expect("the driver still records events");
            let ran = Arc::clone(&ran);
            spawn_after(&stream, move || {
                ran.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        }
        type Boxed = std::pin::Pin<Box<dyn Future<Output = Result<(), Error>>>>;
        /// A future, when it resolved after the fault surfaced, and what it resolved to.
        type Watched = (&'static str, Boxed, Option<Duration>, Option<Result<(), Error>>);
        let mut futures: Vec<Watched> = vec![
            ("Event", Box::pin(CompletionMode::Event.completion(&stream).unwrap()), None, None),
            ("Auto", Box::pin(CompletionMode::Auto.completion(&stream).unwrap()), None, None),
            ("LowLatency", Box::pin(CompletionMode::LowLatency.completion(&stream).unwrap()), None, None),
            ("HostFunction", Box::pin(CompletionMode::HostFunction.completion(&stream).unwrap()), None, None),
        ];
        let mut cx = Context::from_waker(Waker::noop());
        assert!(stream.synchronize().is_err(), "the trap is a sticky error");
        let surfaced = Instant::now();
        // Look for 200 ms: every future must have resolved by then (within 10 ms, checked below).
        while surfaced.elapsed() < Duration::from_millis(200) {
            for (_, future, at, result) in &mut futures {
                if result.is_none()
                    && let Poll::Ready(out) = future.as_mut().poll(&mut cx)
                {
                    *at = Some(surfaced.elapsed());
                    *result = Some(out);
                }
            }
            std::thread::sleep(Duration::from_micros(50));
        }
        for (name, _, at, result) in &futures {
            println!("after the fault surfaced: {name}: {result:?} after {at:?}");
        }
        for (name, _, at, result) in &futures {
            assert!(
                matches!(result, Some(Err(Error::DeviceFault { code: 719, .. }))),
                "{name}: {result:?}"
            );
            assert!(at.is_some_and(|at| at <= Duration::from_millis(10)), "{name}: after {at:?}");
        }
        // The callbacks are dropped unrun, before any reset (counted); the owners stay.
        wait_for("the callbacks dropped unrun", || {
            cuda_host_launch::cleanup_stats().callbacks_dropped_unrun - unrun == N as u64
        });
        flush(PATIENCE).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(counts.never(), N, "nothing released before the reset");
        // The releases, the two event futures' and the host-function future's records.
        assert_eq!(gpu.context.pending_launches(), N + 3);
        drop(stream);
        // SAFETY: every stream of the context is dropped; nothing made in it is used afterwards.
        let reclaimed = unsafe { gpu.context.reset() }.expect("cuDevicePrimaryCtxReset");
        cuda_workspace::testing::assert_reset_released(&gpu.context, reclaimed, N + 3);
        flush(PATIENCE).unwrap();
        assert_eq!((counts.never(), counts.more_than_once()), (0, 0));
        assert_eq!(ran.load(Ordering::SeqCst), 0, "callbacks never run after a sticky error");
    }

    /// Another binding resets the primary context (`cuDevicePrimaryCtxReset`, as
    /// `cudaDeviceReset` does) while the event pool keeps free events of it, then makes events of
    /// its own in the context made again (the driver may give them the destroyed events' handles).
    /// When the crate lets the old pool go, the other binding's events survive: the pool
    /// destroys nothing of a context that is gone. The poller is kept from giving the pool back
    /// before the reset by a long idle exit (the configuration is fixed for the process); a
    /// release in the new context, then a `flush`, which forgets the pool of the context that
    /// is gone. (The fake's twin, `release_after`, covers the idle poller's give-back.)
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn a_reset_by_another_binding_leaves_the_events_made_after_it_alone() {
        use cuda_dl_sys::types::CUevent;
        use cuda_host_launch::{Config, PollerSettings};
        Config::new()
            .event_poller(PollerSettings {
                idle_exit: Duration::from_secs(3600),
                ..PollerSettings::DEFAULT
            })
            .install()
            .unwrap();
        let gpu = Gpu::open();
        let stream = Stream::new(&gpu.context).unwrap();
        let counts = DropCounts::new(1);
        release_after(&stream, counts.owner(0)).unwrap();
        flush(PATIENCE).unwrap();
        wait_for("the release", || counts.never() == 0);
        drop(stream);
        // Events of the context before the reset, to compare handles with (made after the pool's).
        let make = |n: usize| -> Vec<CUevent> {
            (0..n)
                .map(|_| {
                    let mut event: CUevent = std::ptr::null_mut();
                    // SAFETY: a valid out-pointer; the context is current on this thread.
                    unsafe { gpu.driver.cuEventCreate(&mut event, 0) }.unwrap();
                    event
                })
                .collect()
        };
        let before = make(32);
        let device = gpu.context.device().raw();
        // SAFETY: nothing made in the context before is used after the reset (the stream is
        // dropped; `before` is only compared, never passed to the driver again).
        unsafe { gpu.driver.cuDevicePrimaryCtxReset_v2(device) }.unwrap();
        // The other binding retains the device again (as the runtime does at its next call) and
        // makes events in the context made again.
        let mut again: cuda_dl_sys::types::CUcontext = std::ptr::null_mut();
        // SAFETY: valid out-pointer; released at the end.
        unsafe { gpu.driver.cuDevicePrimaryCtxRetain(&mut again, device) }.unwrap();
        assert_eq!(again, gpu.context.raw(), "the primary context keeps its handle");
        gpu.context.set_current().unwrap();
        let after = make(256);
        let reused = after.iter().filter(|e| before.contains(e)).count();
        let stream = Stream::new(&gpu.context).unwrap();
        let woken = DropCounts::new(1);
        release_after(&stream, woken.owner(0)).unwrap();
        wait_for("the release in the new context", || woken.never() == 0);
        drop(stream);
        flush(PATIENCE).unwrap();
        for (i, &event) in after.iter().enumerate() {
            // SAFETY: an event made above in the live context, not yet destroyed.
            let query = unsafe { gpu.driver.cuEventQuery(event) };
            assert!(query.is_ok(), "event {i} of {}: {query:?}", after.len());
            // SAFETY: made above, destroyed once.
            unsafe { gpu.driver.cuEventDestroy_v2(event) }.unwrap();
        }
        // SAFETY: retained above.
        unsafe { gpu.driver.cuDevicePrimaryCtxRelease_v2(device) }.unwrap();
        eprintln!(
            "gpu_after: {reused} of {} events made after the reset got the handle of one of {} \
             destroyed by it",
            after.len(),
            before.len()
        );
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn the_poller_never_breaks_a_global_capture_of_another_stream() {
    let gpu = Gpu::open();
    let captured = Stream::new_non_blocking(&gpu.context).unwrap();
    let work = Stream::new_non_blocking(&gpu.context).unwrap();
    let flags = MappedU32s::new(gpu.driver, 2);
    let counts = DropCounts::new(1000);
    // SAFETY: a live stream.
    unsafe {
        gpu.driver.cuStreamBeginCapture(
            captured.raw(),
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
    }
    .unwrap();
    gpu.kernels
        .spin_then_write(captured.raw(), flags.device(0), 1, 1_000);
    for i in 0..1000 {
        gpu.kernels
            .spin_then_write(work.raw(), flags.device(1), 1, 1_000);
        release_after(&work, counts.owner(i)).unwrap();
    }
    // No synchronize: this thread's global capture forbids it (CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED).
    // The poller's queries see the work finish.
    wait_for("the releases", || pending_launches(None) == 0);
    flush(PATIENCE).unwrap();
    assert_eq!(counts.never(), 0);
    let mut graph = std::ptr::null_mut();
    // SAFETY: the capturing stream; a valid out-pointer.
    let ended = unsafe { gpu.driver.cuStreamEndCapture(captured.raw(), &mut graph) };
    assert!(
        ended.is_ok(),
        "the global capture survived the poller: {ended:?}"
    );
    // SAFETY: the graph the capture made, destroyed once.
    unsafe { gpu.driver.cuGraphDestroy(graph) }.unwrap();
}

/// On a capturing stream the real driver's answer matches the fake's: `release_after` is refused
/// (`ReleaseDuringCapture`), its owner handed back in the error (alive until the caller drops it),
/// and the capture survives (it ends, instantiates and replays).
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_release_on_a_capturing_stream_is_refused_and_the_capture_survives() {
    let gpu = Gpu::open();
    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
    let flags = MappedU32s::new(gpu.driver, 1);
    let counts = DropCounts::new(1);
    // SAFETY: a live stream.
    unsafe {
        gpu.driver.cuStreamBeginCapture(
            stream.raw(),
            CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
        )
    }
    .unwrap();
    gpu.kernels
        .spin_then_write(stream.raw(), flags.device(0), 1, 1_000);
    let refused = release_after(&stream, counts.owner(0));
    assert_eq!(counts.never(), 1, "the crate dropped what it refused");
    assert!(
        matches!(
            &refused,
            Err(e) if matches!(e.error(), cuda_host_launch::Error::ReleaseDuringCapture { .. })
                && e.is_handed_back()
        ),
        "{refused:?}"
    );
    drop(refused);
    assert_eq!(counts.never(), 0, "handed back, then dropped by the caller");
    let mut graph = std::ptr::null_mut();
    // SAFETY: the capturing stream; a valid out-pointer.
    unsafe { gpu.driver.cuStreamEndCapture(stream.raw(), &mut graph) }.unwrap();
    let mut exec = std::ptr::null_mut();
    // SAFETY: the graph just made; a valid out-pointer.
    unsafe { gpu.driver.cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.unwrap();
    // SAFETY: a live executable graph and stream.
    unsafe { gpu.driver.cuGraphLaunch(exec, stream.raw()) }.unwrap();
    stream.synchronize().unwrap();
    assert_eq!(flags.get(0), 1, "the captured kernel ran in the replay");
    // SAFETY: destroyed once each, after the stream finished with them.
    unsafe {
        gpu.driver.cuGraphExecDestroy(exec).unwrap();
        gpu.driver.cuGraphDestroy(graph).unwrap();
    }
    assert_eq!(counts.more_than_once(), 0);
}

/// Checks, when dropped, that the kernel's write it stands behind is visible.
struct SeesTheWrite(Arc<MappedU32s>, u32, Arc<AtomicUsize>);

impl Drop for SeesTheWrite {
    fn drop(&mut self) {
        if self.0.get(0) == self.1 {
            self.2.fetch_add(1, Ordering::SeqCst);
        }
    }
}

/// The special stream handles (the legacy and per-thread default streams, and the null stream) are
/// told apart by their ids as other streams are: a release, a callback and a default completion
/// on each come after the kernel enqueued there before them.
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn releases_callbacks_and_completions_on_the_special_streams_follow_their_kernels() {
    use cuda_host_launch::{AsRawStream, RawStream};
    let gpu = Gpu::open();
    let flags = Arc::new(MappedU32s::new(gpu.driver, 1));
    let seen = Arc::new(AtomicUsize::new(0));
    let mut value = 0;
    for stream in [RawStream::LEGACY, RawStream::PER_THREAD, RawStream::DEFAULT] {
        value += 1;
        // About 2 ms of kernel: still running when the calls below are made.
        gpu.kernels
            .spin_then_write(stream.as_raw_stream(), flags.device(0), value, 4_000_000);
        release_after(
            stream,
            SeesTheWrite(Arc::clone(&flags), value, Arc::clone(&seen)),
        )
        .unwrap();
        let (flags_in, seen_in) = (Arc::clone(&flags), Arc::clone(&seen));
        spawn_after(stream, move || {
            if flags_in.get(0) == value {
                seen_in.fetch_add(1, Ordering::SeqCst);
            }
        })
        .unwrap();
        let done = cuda_host_launch::completion(stream).unwrap();
        futures_block_on(done).unwrap();
        assert_eq!(
            flags.get(0),
            value,
            "{stream:?}: the completion came after the kernel"
        );
        wait_for("the release and the callback", || {
            pending_launches(None) == 0
        });
        flush(PATIENCE).unwrap();
        assert_eq!(
            seen.load(Ordering::SeqCst),
            2 * value as usize,
            "{stream:?}"
        );
        println!("{stream:?}: a release, a callback and a completion after the kernel");
    }
}

/// Polls `future` to its end on this thread.
fn futures_block_on<F: std::future::Future>(future: F) -> F::Output {
    let mut future = std::pin::pin!(future);
    let thread = std::thread::current();
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = std::task::Waker::from(Arc::new(Unpark(thread)));
    let mut cx = std::task::Context::from_waker(&waker);
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let std::task::Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future never resolved");
        std::thread::park_timeout(Duration::from_millis(10));
    }
}
