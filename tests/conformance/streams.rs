//! Stream order, the one host-function thread of a context, host functions and stream callbacks,
//! and stream destruction with work pending.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicUsize, Ordering};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{CUresult, CUstream};
use cuda_workspace::testing::{bump, os_thread};

use super::harness::{Log, SETTLE, Tagged, cases, code, data, leak, log_tag, wait_until};

/// A stream callback: bumps the counter at `data` if the status is success, else adds 1000.
unsafe extern "C" fn callback(_: CUstream, status: CUresult, data: *mut c_void) {
    // SAFETY: every use passes a live `AtomicUsize`.
    let count = unsafe { &*data.cast::<AtomicUsize>() };
    let step = if status == CUresult::CUDA_SUCCESS {
        1
    } else {
        1000
    };
    count.fetch_add(step, Ordering::SeqCst);
}

/// A host function that blocks until its [`Gate`] opens, noting that it started.
struct Gate {
    started: AtomicBool,
    open: AtomicBool,
}

unsafe extern "C" fn wait_at_gate(data: *mut c_void) {
    // SAFETY: every use passes a leaked `Gate`.
    let gate = unsafe { &*data.cast::<Gate>() };
    gate.started.store(true, Ordering::SeqCst);
    while !gate.open.load(Ordering::SeqCst) {
        std::thread::yield_now();
    }
}

cases! {
    /// Host functions on one stream run one after another in the order they were enqueued, and
    /// `cuStreamSynchronize` returns after the last.
    fn host_functions_on_one_stream_run_in_enqueue_order(cx) {
        let stream = cx.stream();
        let log = leak(Log::default());
        for tag in 0..50 {
            // SAFETY: the tag is leaked.
            unsafe { cx.driver.cuLaunchHostFunc(stream, Some(log_tag), Tagged::data(log, tag)) }
                .unwrap();
        }
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
        assert_eq!(log.tags(), (0..50).collect::<Vec<u8>>());
    }

    /// Every host function of a context, on any of its streams, runs on one thread, and not on
    /// the thread that enqueued it.
    fn one_thread_runs_every_host_function_of_a_context(cx) {
        let streams: Vec<CUstream> = (0..4).map(|_| cx.stream()).collect();
        let log = leak(Log::default());
        for round in 0..8u8 {
            for (i, &stream) in streams.iter().enumerate() {
                let tag = round * 4 + i as u8;
                // SAFETY: the tag is leaked.
                unsafe { cx.driver.cuLaunchHostFunc(stream, Some(log_tag), Tagged::data(log, tag)) }
                    .unwrap();
            }
        }
        // SAFETY: no arguments.
        unsafe { cx.driver.cuCtxSynchronize() }.unwrap();
        let entries = log.entries();
        assert_eq!(entries.len(), 32);
        let first = &entries[0].1;
        assert!(entries.iter().all(|(_, thread)| thread == first), "{entries:?}");
        assert_ne!(*first, os_thread().0, "ran on the caller's thread");
    }

    /// While a host function of stream A runs, a host function of stream B (same context) waits
    /// for it: the one thread is busy.
    fn a_running_host_function_delays_host_functions_on_other_streams(cx) {
        let (a, b) = (cx.stream(), cx.stream());
        let gate = leak(Gate { started: AtomicBool::new(false), open: AtomicBool::new(false) });
        let count = leak(AtomicUsize::new(0));
        // SAFETY: `gate` and `count` are leaked.
        unsafe {
            cx.driver.cuLaunchHostFunc(a, Some(wait_at_gate), data(gate)).unwrap();
            wait_until("the gate's host function", || gate.started.load(Ordering::SeqCst));
            cx.driver.cuLaunchHostFunc(b, Some(bump), data(count)).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!(count.load(Ordering::SeqCst), 0, "ran beside a running host function");
        // SAFETY: a live stream.
        assert_eq!(code(unsafe { cx.driver.cuStreamQuery(b) }), Some(CUresult::CUDA_ERROR_NOT_READY));
        gate.open.store(true, Ordering::SeqCst);
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(b) }.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// A stream waiting on device work (a held stream) runs none of its later host functions
    /// until the work is done; other streams' host functions run meanwhile.
    fn a_held_stream_runs_nothing_until_released_and_other_streams_go_on(cx) {
        let (held, free) = (cx.stream(), cx.stream());
        let (behind, beside) = (leak(AtomicUsize::new(0)), leak(AtomicUsize::new(0)));
        let hold = cx.hold(held);
        // SAFETY: the counters are leaked.
        unsafe {
            cx.driver.cuLaunchHostFunc(held, Some(bump), data(behind)).unwrap();
            cx.driver.cuLaunchHostFunc(free, Some(bump), data(beside)).unwrap();
            cx.driver.cuStreamSynchronize(free).unwrap();
        }
        assert_eq!(beside.load(Ordering::SeqCst), 1);
        std::thread::sleep(SETTLE);
        assert_eq!(behind.load(Ordering::SeqCst), 0);
        // SAFETY: a live stream.
        assert_eq!(code(unsafe { cx.driver.cuStreamQuery(held) }), Some(CUresult::CUDA_ERROR_NOT_READY));
        hold.release();
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(held) }.unwrap();
        assert_eq!(behind.load(Ordering::SeqCst), 1);
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamQuery(held) }.unwrap();
    }

    /// `cuStreamAddCallback` runs its callback in stream order with `CUDA_SUCCESS`, between the
    /// host functions enqueued before and after it.
    fn stream_callbacks_run_in_stream_order_with_success(cx) {
        let stream = cx.stream();
        let log = leak(Log::default());
        let count = leak(AtomicUsize::new(0));
        let hold = cx.hold(stream);
        // SAFETY: everything passed is leaked.
        unsafe {
            cx.driver.cuLaunchHostFunc(stream, Some(log_tag), Tagged::data(log, 1)).unwrap();
            cx.driver.cuStreamAddCallback(stream, Some(callback), data(count), 0).unwrap();
            cx.driver.cuLaunchHostFunc(stream, Some(log_tag), Tagged::data(log, 2)).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!(count.load(Ordering::SeqCst), 0);
        hold.release();
        log.wait_for(1);
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamSynchronize(stream) }.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 1, "once, with CUDA_SUCCESS");
        assert_eq!(log.tags(), [1, 2]);
    }

    /// `cuStreamDestroy` returns at once with work pending; the pending host function still runs.
    fn stream_destroy_returns_at_once_and_pending_work_still_runs(cx) {
        let stream = cx.stream();
        let count = leak(AtomicUsize::new(0));
        let hold = cx.hold(stream);
        // SAFETY: `count` is leaked; the stream is not used after its destruction.
        unsafe {
            cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count)).unwrap();
            cx.driver.cuStreamDestroy(stream).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!(count.load(Ordering::SeqCst), 0);
        hold.release();
        wait_until("the destroyed stream's host function", || count.load(Ordering::SeqCst) == 1);
        // SAFETY: no arguments.
        unsafe { cx.driver.cuCtxSynchronize() }.unwrap();
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// A host function may enqueue more work on its stream (it runs after it); synchronizing its
    /// own stream from the host function is refused with `CUDA_ERROR_NOT_PERMITTED`.
    fn a_host_function_can_enqueue_but_not_synchronize(cx) {
        struct Chain {
            driver: &'static Driver,
            stream: CUstream,
            count: AtomicUsize,
            synchronize: AtomicU32,
        }
        unsafe extern "C" fn first(data: *mut c_void) {
            // SAFETY: the launch passes a leaked `Chain`.
            let chain = unsafe { &*data.cast::<Chain>() };
            // SAFETY: a live stream; `count` is leaked with the chain.
            unsafe {
                let count = ptr::from_ref(&chain.count).cast_mut().cast();
                chain.driver.cuLaunchHostFunc(chain.stream, Some(bump), count).unwrap();
                let code = chain.driver.cuStreamSynchronize(chain.stream).err().and_then(|e| e.code());
                chain.synchronize.store(code.map_or(0, |c| c.0), Ordering::SeqCst);
            }
        }
        // The real driver "may return CUDA_ERROR_NOT_PERMITTED or may deadlock" (CUDA-FACTS.md):
        // not tried there, where a deadlock would hang the driver's thread for good.
        let chain = leak(Chain {
            driver: cx.driver,
            stream: cx.stream(),
            count: AtomicUsize::new(0),
            synchronize: AtomicU32::new(u32::MAX),
        });
        // SAFETY: `chain` is leaked.
        unsafe {
            cx.driver.cuLaunchHostFunc(chain.stream, Some(first), data(chain)).unwrap();
            cx.driver.cuStreamSynchronize(chain.stream).unwrap();
        }
        assert_eq!(chain.count.load(Ordering::SeqCst), 1);
        assert_eq!(chain.synchronize.load(Ordering::SeqCst), CUresult::CUDA_ERROR_NOT_PERMITTED.0);
    }
}
