//! Soundness of the futures on the real GPU: a low-latency completion on a capturing stream is
//! refused, and a waker that panics is reported, in both completion modes, without aborting the
//! process. Opt-in: `--ignored --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::future::Future;
use std::pin::Pin;
use std::ptr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::{Duration, Instant};

use cuda_dl_sys::types::CUstreamCaptureMode;
use cuda_host_launch::{
    CompletionMode, Error, Graph, PanicOrigin, Stream, flush, set_panic_handler,
};
use cuda_workspace::gpu::{Gpu, MappedU32s};
use cuda_workspace::isolated_test;

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
const PATIENCE: Duration = Duration::from_secs(30);

struct ThreadWaker(std::thread::Thread);
impl Wake for ThreadWaker {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

/// A waker whose every wake panics.
struct PanickingWaker;
impl Wake for PanickingWaker {
    fn wake(self: Arc<Self>) {
        panic!("the waker panicked");
    }
    fn wake_by_ref(self: &Arc<Self>) {
        panic!("the waker panicked");
    }
}

fn poll_with<F: Future + Unpin>(future: &mut F, waker: &Waker) -> Poll<F::Output> {
    Pin::new(future).poll(&mut Context::from_waker(waker))
}

fn wait_for<F: Future + Unpin>(future: &mut F) -> F::Output {
    let waker = Waker::from(Arc::new(ThreadWaker(std::thread::current())));
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Poll::Ready(out) = poll_with(future, &waker) {
            return out;
        }
        assert!(Instant::now() < deadline, "a future never resolved");
        std::thread::park_timeout(Duration::from_millis(5));
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_low_latency_completion_on_a_capturing_stream_is_refused() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    // SAFETY: a live stream of the context current on this thread.
    unsafe { gpu.driver.cuStreamBeginCapture(stream.raw(), RELAXED) }.unwrap();
    let refused = CompletionMode::LowLatency.completion(&stream);
    let mut raw = ptr::null_mut();
    // SAFETY: the capture began above; a valid out-pointer.
    unsafe { gpu.driver.cuStreamEndCapture(stream.raw(), &mut raw) }.unwrap();
    // SAFETY: the graph the driver just made, owned by nobody else.
    let graph = unsafe { Graph::from_raw(raw) };
    assert!(
        matches!(refused, Err(Error::CaptureActive { stream: s, .. }) if s == stream.raw().addr()),
        "expected CaptureActive, got {refused:?}"
    );
    assert_eq!(
        graph.nodes().unwrap().len(),
        0,
        "the refused write left a node"
    );
    // The stream works as before once the capture ended.
    let mut after = CompletionMode::LowLatency.completion(&stream).unwrap();
    wait_for(&mut after).unwrap();
}

isolated_test! {
    /// In a process of its own (an abort would end the whole test binary): in both modes, a waker
    /// that panics when the stream gets there (woken on the driver's thread, or by the poller) is
    /// reported as `PanicOrigin::Waker`; the futures resolve and the process goes on.
    #[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
    fn a_panicking_waker_is_reported_not_aborting() {
        cuda_workspace::testing::quiet_expected_panics(|m| m == "the waker panicked");
        let reports = Arc::new(Mutex::new(Vec::new()));
        let sink = Arc::clone(&reports);
        set_panic_handler(move |report| {
            sink.lock().unwrap().push((report.origin, report.message.to_string()));
        });
        let gpu = Gpu::open();
        let panicking = Waker::from(Arc::new(PanickingWaker));
        for mode in [CompletionMode::HostFunction, CompletionMode::LowLatency] {
            let stream = Stream::new(&gpu.context).unwrap();
            let m = MappedU32s::new(gpu.driver, 1);
            gpu.kernels.spin_then_write(stream.raw(), m.device(0), 1, 20_000_000);
            let mut first = mode.completion(&stream).unwrap();
            let mut second = mode.completion(&stream).unwrap();
            assert!(poll_with(&mut first, &panicking).is_pending(), "{mode:?}: resolved early");
            wait_for(&mut second).unwrap();
            wait_for(&mut first).unwrap();
            assert_eq!(m.get(0), 1, "{mode:?}: the kernel ran first");
        }
        // The host-function mode reports when its record is released (which `flush` waits for);
        // the poller reports just after it resolved the future.
        flush(PATIENCE).unwrap();
        let deadline = Instant::now() + PATIENCE;
        loop {
            let wakers = reports
                .lock()
                .unwrap()
                .iter()
                .filter(|(origin, message)| {
                    *origin == PanicOrigin::Waker && message == "the waker panicked"
                })
                .count();
            if wakers >= 2 {
                assert_eq!(wakers, 2, "one report per mode: {:?}", reports.lock().unwrap());
                break;
            }
            assert!(Instant::now() < deadline, "{wakers} of 2 reports: {:?}", reports.lock().unwrap());
            std::thread::sleep(Duration::from_millis(2));
        }
    }
}
