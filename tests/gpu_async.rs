//! Futures of stream work on the real GPU, in every completion mode. Opt-in: `--ignored
//! --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::future::Future;
use std::pin::{Pin, pin};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cuda_host_launch::{
    CompletionMode, Error, Stream, flush, host_launch, host_launch_async, launch_ticket_bytes,
    poller_cpu_time,
};
use cuda_workspace::gpu::{Gpu, MappedU32s, heap_in_use};
use cuda_workspace::isolated_test;

const MODES: [CompletionMode; 4] = [
    CompletionMode::Auto,
    CompletionMode::Event,
    CompletionMode::HostFunction,
    CompletionMode::LowLatency,
];

struct ThreadWaker(std::thread::Thread);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(future: F) -> F::Output {
    let mut future = pin!(future);
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Poll::Ready(out) = future.as_mut().poll(&mut cx) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future never resolved");
        std::thread::park_timeout(Duration::from_millis(50));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn futures_resolve_in_stream_order_after_the_kernels_before_them() {
    let gpu = Gpu::open();
    for mode in MODES {
        let stream = Stream::new(&gpu.context).unwrap();
        let m = MappedU32s::new(gpu.driver, 4);
        let mut futures = Vec::new();
        for i in 0..4 {
            gpu.kernels
                .spin_then_write(stream.raw(), m.device(i), i as u32 + 1, 5_000_000);
            futures.push((i, mode.completion(&stream).unwrap()));
        }
        for (i, f) in futures {
            block_on(f).unwrap();
            for j in 0..=i {
                assert_eq!(
                    m.get(j),
                    j as u32 + 1,
                    "{mode:?}: kernel {j} done before future {i}"
                );
            }
        }
        let value = host_launch_async(&stream, || 42).unwrap();
        assert_eq!(block_on(value).unwrap(), 42);
        println!("{mode:?}: 4 futures resolved in stream order, each after its kernel");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn ten_thousand_concurrent_futures_over_8_streams_all_resolve() {
    let gpu = Gpu::open();
    for mode in MODES {
        let streams: Vec<Stream> = (0..8).map(|_| Stream::new(&gpu.context).unwrap()).collect();
        let cpu_before = poller_cpu_time();
        let started = Instant::now();
        let futures: Vec<_> = (0..10_000)
            .map(|i| mode.completion(&streams[i % 8]).unwrap())
            .collect();
        let resolved = futures
            .into_iter()
            .map(block_on)
            .filter(Result::is_ok)
            .count();
        println!(
            "{mode:?}: {resolved} of 10000 futures over 8 streams resolved in {:?}; poller CPU \
             {:?}",
            started.elapsed(),
            poller_cpu_time() - cpu_before
        );
        assert_eq!(resolved, 10_000);
    }
}

/// A host function that holds its stream until opened (or 30 s).
struct StreamGate(Arc<AtomicBool>);

impl StreamGate {
    /// Enqueues the holding host function on `stream` and returns once it runs.
    fn close(stream: &Stream) -> StreamGate {
        let (started, open) = (
            Arc::new(AtomicBool::new(false)),
            Arc::new(AtomicBool::new(false)),
        );
        let (started_in, open_in) = (Arc::clone(&started), Arc::clone(&open));
        host_launch(stream, move || {
            started_in.store(true, Ordering::Release);
            let deadline = Instant::now() + Duration::from_secs(30);
            while !open_in.load(Ordering::Acquire) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_micros(50));
            }
        })
        .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !started.load(Ordering::Acquire) {
            assert!(Instant::now() < deadline, "the gate never started");
            std::thread::sleep(Duration::from_micros(50));
        }
        StreamGate(open)
    }

    fn open(self) {
        self.0.store(true, Ordering::Release);
    }
}

/// A waker that does nothing: the futures' shared states hold its clones, so the count of
/// clones alive (`Arc::strong_count` less the test's own) is the count of shared states alive.
struct CountedWaker;
impl Wake for CountedWaker {
    fn wake(self: Arc<Self>) {}
}

/// Futures dropped before the stream gets there leak nothing. "Nothing" is counted where the
/// mechanisms bound it, not in heap bytes (how many futures are pending at once varies with the
/// kernel's timing, and what is kept for the most ever pending grows in steps): every future is
/// polled once with a counted waker, which its shared state keeps until it is freed, so once the
/// stream got there and `flush` returned, no clone of it is alive (every shared state freed), no
/// launch is pending and the cleanup queue released all it queued. (The tickets, event pools and
/// flag pages are counted by the fake-driver version of this test,
/// `async_completion::futures_dropped_early_leak_nothing_and_wakers_are_never_dropped_on_a_driver_thread`.)
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn dropping_futures_early_leaks_nothing() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    let flag = MappedU32s::new(gpu.driver, 1);
    // A low-latency flag page registered before any stream is held below (a completion behind the
    // gate then takes a free slot of it rather than registering host memory).
    block_on(CompletionMode::LowLatency.completion(&stream).unwrap()).unwrap();
    let counted = Arc::new(CountedWaker);
    let waker = Waker::from(Arc::clone(&counted));
    let alive = || Arc::strong_count(&counted) - 2; // less `counted` and `waker`
    let poll_and_drop = |mut future: cuda_host_launch::Completion| -> bool {
        let pending = Pin::new(&mut future)
            .poll(&mut Context::from_waker(&waker))
            .is_pending();
        drop(future);
        pending
    };
    let (heap_before, tickets_before) = (heap_in_use(), launch_ticket_bytes());
    let mut dropped_pending = 0;
    for round in 0..30 {
        // One future of each mode behind a host function that holds the stream until released:
        // certainly pending when polled and when dropped, and its launch still pending after.
        let gate = StreamGate::close(&stream);
        for mode in MODES {
            let future = mode.completion(&stream).unwrap();
            assert!(
                poll_and_drop(future),
                "{mode:?}: pending while the stream is held"
            );
        }
        // The gate has started (no longer pending): what is pending is the dropped host-function
        // completion's launch.
        let pending = gpu.context.pending_launches();
        assert!(
            pending >= 1,
            "the dropped host-function completion is still a pending launch: {pending}"
        );
        assert!(
            alive() >= MODES.len(),
            "the dropped futures' shared states keep their wakers"
        );
        gate.open();

        // A short kernel ahead, so most of these futures are still pending when they are dropped.
        // (Not behind a held host function: with 2,000 completions of each mode behind one, each
        // run on the H200 stalled until the gate's 30 s deadline; which call waited was not
        // looked into.)
        gpu.kernels
            .spin_then_write(stream.raw(), flag.device(0), 1, 2_000_000);
        for mode in MODES {
            let count = if round == 0 { 2_000 } else { 500 };
            for _ in 0..count {
                dropped_pending += usize::from(poll_and_drop(mode.completion(&stream).unwrap()));
            }
        }
        stream.synchronize().unwrap();
        // The shared states go once the stream got there: with the record (its release), or with
        // the low-latency poller's entry.
        let deadline = Instant::now() + Duration::from_secs(30);
        while alive() != 0 {
            assert!(
                Instant::now() < deadline,
                "round {round}: {} shared states of dropped futures still alive",
                alive()
            );
            std::thread::sleep(Duration::from_millis(1));
        }
        flush(Duration::from_secs(30)).unwrap();
        assert_eq!(
            gpu.context.pending_launches(),
            0,
            "round {round}: launches pending"
        );
        let stats = cuda_host_launch::cleanup_stats();
        assert_eq!(
            stats.queued, stats.released,
            "round {round}: records never released"
        );
    }
    println!(
        "{dropped_pending} futures dropped while pending (and 120 behind a gate); heap in use {} B \
         before, {} B after; launch tickets {} B before, {} B after",
        heap_before,
        heap_in_use(),
        tickets_before,
        launch_ticket_bytes()
    );
}

isolated_test! {
    /// In a process of its own: a trap leaves the primary context unusable in the process.
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn a_trapping_kernel_makes_pending_futures_resolve_to_an_error_after_the_reset() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    gpu.kernels.trap(stream.raw());
    let host = CompletionMode::HostFunction.completion(&stream).unwrap();
    let low = CompletionMode::LowLatency.completion(&stream).unwrap();
    let auto = CompletionMode::Auto.completion(&stream).unwrap();
    let value = host_launch_async(&stream, || 7).unwrap();
    assert!(stream.synchronize().is_err());
    drop(stream);
    // SAFETY: every stream of the context is dropped, and nothing made in it is used after the reset.
    let reclaimed = unsafe { gpu.context.reset() }.unwrap();
    let results = (block_on(host), block_on(low), block_on(value), block_on(auto));
    println!("after a trap and the reset ({reclaimed} launches reclaimed): {results:?}");
    // Each future resolves to an error: the poller that watches it sees the fault (usually before
    // the reset: `DeviceFault`), or the reset's reclaim comes first (`ContextLost`).
    let failed = |error: Option<&Error>| {
        matches!(
            error,
            Some(Error::ContextLost | Error::DeviceFault { code: 719, .. })
        )
    };
    assert!(failed(results.0.as_ref().err()));
    assert!(failed(results.1.as_ref().err()));
    assert!(failed(results.2.as_ref().err()));
    assert!(failed(results.3.as_ref().err()));
}
}
