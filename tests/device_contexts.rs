//! Two devices in one process, on the fake driver (`FAKE_CUDA_DEVICES=2`): one primary context and
//! one driver thread per device. Launches of every kind from 8 threads on streams of both devices;
//! an owner of one device released after a host function of the other; a lost context on device 1
//! while device 0 goes on; a global-mode capture on device 0 while device 1's owners are released.
//! Each test runs in a process of its own (two devices, holds and faults are process-wide).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_dl_sys::types::CUstreamCaptureMode;
use cuda_host_launch::{
    CompletionMode, Device, Error, Graph, PrimaryContext, Stream, add_host_node, flush,
    host_launch, launch_host_function, pending_launches, release_after, spawn_after,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    DropCounts, Drops, ThreadSet, fake, fake_driver_path, load_fake_driver, thread_id,
};

const PATIENCE: Duration = Duration::from_secs(10);
const THREADS: usize = 8;
const PER_DEVICE: usize = 20_000;

/// Polls `future` once, with a waker that does nothing.
fn poll_once<F: std::future::Future + Unpin>(future: &mut F) -> std::task::Poll<F::Output> {
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    std::pin::Pin::new(future).poll(&mut cx)
}

/// Polls `future` until it resolves (bounded by `PATIENCE`).
fn resolve<F: std::future::Future + Unpin>(future: &mut F) -> F::Output {
    let deadline = std::time::Instant::now() + PATIENCE;
    loop {
        if let std::task::Poll::Ready(out) = poll_once(future) {
            return out;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "a future never resolved"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
}

/// Both devices' primary contexts.
fn contexts() -> [Arc<PrimaryContext>; 2] {
    load_fake_driver();
    [0, 1].map(|d| PrimaryContext::retain(Device::get(d).unwrap()).unwrap())
}

/// What an owner's `Drop` saw when it freed its buffer: the result and its thread.
type Freed = Arc<Mutex<Option<(Result<(), String>, u64)>>>;

/// Threads that ran host functions (the driver's), and threads that dropped owners.
static RAN_ON: ThreadSet = ThreadSet::new();
static DROPPED_ON: ThreadSet = ThreadSet::new();

/// An owner that notes its dropping thread and counts its drop.
struct Noted(
    #[allow(dead_code, reason = "dropped for its count")] cuda_workspace::testing::CountedOwner,
);

impl Drop for Noted {
    fn drop(&mut self) {
        DROPPED_ON.insert_current();
    }
}

unsafe extern "C" fn note_run(_: *mut std::ffi::c_void) {
    RAN_ON.insert_current();
}

isolated_test! {
    /// Each device knows the ordinal it was opened with and the driver's name for it. (Mutation
    /// testing: with the ordinal a constant, or the name cut at its first character that is not
    /// a NUL, every test passed.)
    fn a_device_knows_its_ordinal_and_its_name(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        for ordinal in 0..2 {
            let device = Device::get(ordinal).unwrap();
            assert_eq!(device.ordinal(), ordinal);
            assert_eq!(device.name().unwrap(), "Fake CUDA Device");
        }
        assert!(Device::get(2).is_err(), "a third device on a driver of two");
    }

    /// 8 threads, each with a stream on each device, launch C functions with owners, closures and
    /// releases through events, and each device gets a graph of host nodes launched many times:
    /// every function ran, in order per stream; every owner dropped once; no owner dropped on a
    /// thread that ran host functions.
    fn launches_of_every_kind_on_two_devices_from_8_threads(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let per_thread = PER_DEVICE / THREADS;
        let counts = DropCounts::new(2 * THREADS * per_thread);
        let out_of_order = Arc::new(AtomicUsize::new(0));
        std::thread::scope(|s| {
            for t in 0..THREADS {
                let (contexts, out_of_order) = (&contexts, Arc::clone(&out_of_order));
                s.spawn(move || {
                    let streams = [0, 1].map(|d| Stream::new(&contexts[d]).unwrap());
                    let next = [0, 1].map(|_| Arc::new(AtomicUsize::new(0)));
                    for i in 0..per_thread {
                        for d in 0..2 {
                            let index = (d * THREADS + t) * per_thread + i;
                            let owner = Noted(counts.owner(index));
                            match i % 3 {
                                // SAFETY: `note_run` touches a static set only.
                                0 => unsafe {
                                    launch_host_function(&streams[d], Some(note_run), std::ptr::null_mut(), owner)
                                }
                                .unwrap(),
                                1 => {
                                    let (next, late) = (Arc::clone(&next[d]), Arc::clone(&out_of_order));
                                    host_launch(&streams[d], move || {
                                        let _keep = &owner;
                                        RAN_ON.insert_current();
                                        // Closures of a stream run in their launch order.
                                        if next.fetch_add(1, Ordering::SeqCst) != i / 3 {
                                            late.fetch_add(1, Ordering::SeqCst);
                                        }
                                    })
                                    .unwrap();
                                }
                                _ => release_after(&streams[d], owner).unwrap(),
                            }
                        }
                    }
                    for stream in &streams {
                        stream.synchronize().unwrap();
                    }
                });
            }
        });
        // A graph of host nodes per device, launched 100 times.
        let node_runs = Arc::new(AtomicUsize::new(0));
        for context in &contexts {
            let stream = Stream::new(context).unwrap();
            let graph = Graph::new().unwrap();
            let runs = Arc::clone(&node_runs);
            let first = add_host_node(&graph, &[], move || {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
            let runs = Arc::clone(&node_runs);
            add_host_node(&graph, &[first], move || {
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
            let exec = graph.instantiate().unwrap();
            for _ in 0..100 {
                exec.launch(&stream).unwrap();
            }
            stream.synchronize().unwrap();
        }
        let deadline = std::time::Instant::now() + PATIENCE;
        while pending_launches(None) > 0 {
            assert!(std::time::Instant::now() < deadline, "releases still pending");
            std::thread::sleep(Duration::from_millis(1));
        }
        flush(PATIENCE).unwrap();
        assert_eq!(node_runs.load(Ordering::SeqCst), 2 * 2 * 100);
        assert_eq!((counts.never(), counts.more_than_once()), (0, 0));
        assert_eq!(out_of_order.load(Ordering::SeqCst), 0, "closures in stream order");
        let driver_threads = RAN_ON.ids();
        assert_eq!(driver_threads.len(), 2, "one driver thread per device's context");
        assert!(DROPPED_ON.common(&RAN_ON).is_empty(), "an owner dropped on a driver thread");
        for context in &contexts {
            assert_eq!(context.pending_launches(), 0);
        }
    }

    /// A host function on device 0 owns device 1's memory: the owner's `Drop` frees it (binding
    /// device 1's context itself, as a binding's buffer does) off the driver's thread, with no error.
    fn an_owner_of_device_1_memory_after_a_host_function_of_device_0(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let driver = cuda_dl_sys::driver().unwrap();
        contexts[1].set_current().unwrap();
        let mut buffer = 0;
        // SAFETY: a valid out-pointer; device 1's context is current.
        unsafe { driver.cuMemAlloc(&mut buffer, 4096) }.unwrap();
        contexts[0].set_current().unwrap();
        let freed: Freed = Arc::default();
        struct Device1Buffer {
            context: Arc<PrimaryContext>,
            buffer: cuda_dl_sys::types::CUdeviceptr,
            freed: Freed,
        }
        impl Drop for Device1Buffer {
            fn drop(&mut self) {
                let driver = cuda_dl_sys::driver().unwrap();
                let result = self.context.set_current().map_err(|e| e.to_string()).and_then(|()| {
                    // SAFETY: device 1's allocation, freed once, its context current.
                    unsafe { driver.cuMemFree(self.buffer) }.map_err(|e| e.to_string())
                });
                *self.freed.lock().unwrap() = Some((result, thread_id()));
            }
        }
        let stream = Stream::new(&contexts[0]).unwrap();
        let owner = Device1Buffer {
            context: Arc::clone(&contexts[1]),
            buffer,
            freed: Arc::clone(&freed),
        };
        let ran = Arc::new(ThreadSet::new());
        let on = Arc::clone(&ran);
        host_launch(&stream, move || {
            let _keep = &owner;
            on.insert_current();
        })
        .unwrap();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        let (result, thread) = freed.lock().unwrap().clone().expect("the owner was dropped");
        assert_eq!(result, Ok(()));
        assert!(!ran.ids().contains(&thread), "freed on the driver's thread");
    }

    /// A sticky error on device 1 with launches pending on both devices: device 0's run and are
    /// released throughout; device 1's stay pending (counted per context) until its reset, which
    /// releases each once.
    fn a_lost_context_on_device_1_leaves_device_0_untouched(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let streams = [0, 1].map(|d| Stream::new(&contexts[d]).unwrap());
        let drops = [Drops::new(), Drops::new()];
        let holds = [0, 1].map(|d| {
            fake().hold_stream(streams[d].raw()).expect("the fake could not hold the stream")
        });
        for d in 0..2 {
            for _ in 0..50 {
                let owner = drops[d].owner();
                host_launch(&streams[d], move || {
                    let _keep = &owner;
                })
                .unwrap();
                release_after(&streams[d], drops[d].owner()).unwrap();
            }
        }
        assert_eq!(contexts[0].pending_launches(), 100);
        assert_eq!(contexts[1].pending_launches(), 100);
        assert_eq!(fake().poison_context(contexts[1].raw()), Ok(()));
        for hold in holds {
            hold.release();
        }
        drops[0].wait_dropped(100);
        assert_eq!(contexts[0].pending_launches(), 0);
        std::thread::sleep(Duration::from_millis(50));
        flush(PATIENCE).unwrap();
        assert_eq!(drops[1].dropped(), 0, "device 1's work never completes");
        assert_eq!(contexts[1].pending_launches(), 100);
        // Device 0 goes on meanwhile.
        let more = Drops::new();
        for _ in 0..10 {
            release_after(&streams[0], more.owner()).unwrap();
        }
        more.wait_dropped(10);
        let [stream0, stream1] = streams;
        drop(stream1);
        // SAFETY: device 1's only stream is dropped; nothing made in its context is used after.
        let reclaimed = unsafe { contexts[1].reset() }.unwrap();
        assert_eq!(reclaimed, 100);
        drops[1].wait_dropped(100);
        assert_eq!(pending_launches(None), 0);
        stream0.synchronize().unwrap();
    }

    /// A context whose event pool sits idle is given back while another device's event work
    /// stays pending: the user's last release of device 0's context, after a sticky error there,
    /// then destroys it and reclaims its pending launch, though device 1's release waits behind a
    /// held stream all along. (Before: idle pools went back only once no context had work
    /// pending; device 0's pool kept its context, and its owner waited for device 1's stream.)
    fn an_idle_pool_goes_back_while_another_contexts_work_is_pending(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let [context0, context1] = contexts();
        let stream0 = Stream::new(&context0).unwrap();
        let stream1 = Stream::new(&context1).unwrap();
        let drops0 = Drops::new();
        // Device 0's pool is made, and idle once this release is done.
        release_after(&stream0, drops0.owner()).unwrap();
        drops0.wait_dropped(1);
        // Device 1's work stays pending until the end.
        let hold1 = fake().hold_stream(stream1.raw()).expect("the fake could not hold the stream");
        let drops1 = Drops::new();
        release_after(&stream1, drops1.owner()).unwrap();
        // A launch on device 0 that will never run: its context fails.
        let hold0 = fake().hold_stream(stream0.raw()).expect("the fake could not hold the stream");
        let owner = drops0.owner();
        host_launch(&stream0, move || {
            let _keep = &owner;
        })
        .unwrap();
        assert_eq!(fake().poison_context(context0.raw()), Ok(()));
        hold0.release();
        drop(stream0);
        // The user's last release of device 0's context.
        drop(Arc::into_inner(context0).expect("the only reference"));
        drops0.wait_dropped(2);
        assert_eq!(drops1.dropped(), 0, "device 1's release still waits");
        hold1.release();
        drops1.wait_dropped(1);
        drop(stream1);
        assert_eq!(pending_launches(None), 0);
    }

    /// A lost context fails only its own low-latency futures: with a future waiting on each
    /// device, device 1's context is poisoned and reset; once the low-latency poller has seen the
    /// loss, device 0's future is still pending (its stream held), and it resolves `Ok` when its
    /// stream gets there; device 1's resolves to an error (`ContextLost`, or `DeviceFault` if the
    /// watcher's fault look saw the poisoning first).
    fn a_lost_context_fails_only_its_own_low_latency_futures(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let [stream0, stream1] = [0, 1].map(|d| Stream::new(&contexts[d]).unwrap());
        let hold0 = fake().hold_stream(stream0.raw()).expect("the fake could not hold the stream");
        let hold1 = fake().hold_stream(stream1.raw()).expect("the fake could not hold the stream");
        let mut alive = CompletionMode::LowLatency.completion(&stream0).unwrap();
        let mut lost = CompletionMode::LowLatency.completion(&stream1).unwrap();
        assert_eq!(fake().poison_context(contexts[1].raw()), Ok(()));
        hold1.release();
        drop(stream1);
        // SAFETY: device 1's only stream is dropped; nothing made in its context is used after.
        unsafe { contexts[1].reset() }.unwrap();
        // The poller has finished a round since the reset told it of the loss.
        flush(PATIENCE).unwrap();
        assert!(
            poll_once(&mut alive).is_pending(),
            "device 0's future resolved while its stream is held: {:?}",
            poll_once(&mut alive)
        );
        // `ContextLost`, or `DeviceFault` where the watcher's fault look (every 2 ms) came between
        // the poisoning and the reset.
        assert!(matches!(
            resolve(&mut lost),
            Err(Error::ContextLost | Error::DeviceFault { code: 719, .. })
        ));
        hold0.release();
        assert!(matches!(resolve(&mut alive), Ok(())), "device 0's future failed");
    }

    /// A global-mode capture on device 0 while device 1's owners are released (dropped by the
    /// reaper, completed by the poller): the capture survives.
    fn a_global_capture_on_device_0_survives_device_1_releases(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let driver = cuda_dl_sys::driver().unwrap();
        let captured = Stream::new(&contexts[0]).unwrap();
        let work = Stream::new(&contexts[1]).unwrap();
        let drops = Drops::new();
        let hold = fake().hold_stream(work.raw()).expect("the fake could not hold the stream");
        for _ in 0..20 {
            let owner = drops.owner();
            host_launch(&work, move || {
                let _keep = &owner;
            })
            .unwrap();
            release_after(&work, drops.owner()).unwrap();
        }
        // SAFETY: a live stream of device 0.
        unsafe {
            driver.cuStreamBeginCapture(
                captured.raw(),
                CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL,
            )
        }
        .unwrap();
        host_launch(&captured, || {}).expect_err("a run-once launch is refused on a capturing stream");
        hold.release();
        drops.wait_dropped(40);
        let mut graph = std::ptr::null_mut();
        // SAFETY: the capturing stream; a valid out-pointer.
        let ended = unsafe { driver.cuStreamEndCapture(captured.raw(), &mut graph) };
        assert!(ended.is_ok(), "the capture on device 0 survived: {ended:?}");
        // SAFETY: the graph the capture made, destroyed once.
        unsafe { driver.cuGraphDestroy(graph) }.unwrap();
    }

    /// On the reaper thread, each launch's owners are dropped with no context current, whatever
    /// the owner dropped before it left current (a binding's buffer binds its own and leaves it):
    /// owners of both devices' launches, interleaved, each checking the current context in its
    /// `Drop`, every other one switching to the other device's context after.
    fn owners_are_dropped_with_no_context_left_current_by_an_earlier_owner(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let streams = [0, 1].map(|d| Stream::new(&contexts[d]).unwrap());
        let holds = [0, 1].map(|d| {
            fake().hold_stream(streams[d].raw()).expect("the fake could not hold the stream")
        });
        let seen: Arc<Mutex<Vec<(usize, usize, bool)>>> = Arc::default();
        for i in 0..40 {
            for d in 0..2 {
                let owner = ContextCheck {
                    own: contexts[d].raw().addr(),
                    other: Arc::clone(&contexts[1 - d]),
                    switch: i % 2 == 0,
                    seen: Arc::clone(&seen),
                };
                host_launch(&streams[d], move || {
                    let _keep = &owner;
                })
                .unwrap();
            }
        }
        for hold in holds {
            hold.release();
        }
        for stream in &streams {
            stream.synchronize().unwrap();
        }
        flush(PATIENCE).unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 80);
        assert!(seen.iter().all(|e| e.2), "dropped by the reaper");
        let wrong: Vec<_> = seen.iter().filter(|e| e.1 != 0).collect();
        assert!(wrong.is_empty(), "{} of 80 owners dropped with a context current: {wrong:?}", wrong.len());
    }

    /// The same for owners of launches that never ran: reclaimed after a sticky error by the
    /// context's reset, each is dropped by the reaper with no context current, though the one
    /// before it made device 1's context current.
    fn reclaimed_owners_are_dropped_with_no_context_left_current_by_an_earlier_owner(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let seen: Arc<Mutex<Vec<(usize, usize, bool)>>> = Arc::default();
        for _ in 0..20 {
            let owner = ContextCheck {
                own: contexts[0].raw().addr(),
                other: Arc::clone(&contexts[1]),
                switch: true,
                seen: Arc::clone(&seen),
            };
            host_launch(&stream, move || {
                let _keep = &owner;
            })
            .unwrap();
        }
        fake().poison_context(contexts[0].raw()).expect("the fake could not poison the context");
        hold.release();
        drop(stream);
        // SAFETY: the context's only stream is dropped; nothing made in it is used afterwards.
        let reclaimed = unsafe { contexts[0].reset() }.unwrap();
        assert_eq!(reclaimed, 20);
        flush(PATIENCE).unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 20);
        assert!(seen.iter().all(|e| e.2), "dropped by the reaper");
        let wrong: Vec<_> = seen.iter().filter(|e| e.1 != 0).collect();
        assert!(wrong.is_empty(), "{} of 20 reclaimed owners dropped with a context current: {wrong:?}", wrong.len());
    }

    /// A `spawn_after` callback runs on the event poller with its stream's context current, and
    /// what its closure captured is dropped as the call returns, in that context (part of its
    /// run, as documented); the `release_after` owners the poller drops between callbacks see no
    /// context current. (Mutation testing: with the poller not clearing the context it set for a
    /// callback, every release's owner saw it.)
    fn release_after_owners_between_callbacks_are_dropped_with_no_context_current(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let own = contexts[0].raw().addr();
        let stream = Stream::new(&contexts[0]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let captured: Seen = Arc::default();
        let released: Seen = Arc::default();
        let check = |seen: &Seen| ContextCheck {
            own,
            other: Arc::clone(&contexts[1]),
            switch: false,
            seen: Arc::clone(seen),
        };
        for _ in 0..10 {
            let capture = check(&captured);
            spawn_after(&stream, move || {
                let _keep = &capture;
            })
            .unwrap();
            release_after(&stream, check(&released)).unwrap();
        }
        hold.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        let captured = captured.lock().unwrap();
        assert_eq!(captured.len(), 10);
        assert!(captured.iter().all(|e| e.1 == own), "captures dropped in the callback's context: {captured:?}");
        let released = released.lock().unwrap();
        assert_eq!(released.len(), 10);
        let wrong: Vec<_> = released.iter().filter(|e| e.1 != 0).collect();
        assert!(wrong.is_empty(), "{} of 10 owners dropped with a context current: {wrong:?}", wrong.len());
    }

    /// The waker of an event-mode future dropped before its work completed goes with the
    /// completion's record, which the poller releases after waking it: with no context current,
    /// though the poller made the stream's context current for the wake. (Mutation testing: with
    /// the poller not clearing that context before the release, the waker's drop saw it.)
    fn a_waker_the_poller_drops_sees_no_context_current(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        struct CheckingWaker(#[allow(dead_code)] ContextCheck);
        impl std::task::Wake for CheckingWaker {
            fn wake(self: Arc<Self>) {}
        }
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let seen: Arc<Mutex<Vec<(usize, usize, bool)>>> = Arc::default();
        for _ in 0..5 {
            let mut future = Box::pin(CompletionMode::Event.completion(&stream).unwrap());
            let waker = std::task::Waker::from(Arc::new(CheckingWaker(ContextCheck {
                own: contexts[0].raw().addr(),
                other: Arc::clone(&contexts[1]),
                switch: false,
                seen: Arc::clone(&seen),
            })));
            let poll = future.as_mut().poll(&mut std::task::Context::from_waker(&waker));
            assert!(poll.is_pending(), "{poll:?} while the stream is held");
            // Only the completion's record keeps the waker now.
            drop((future, waker));
        }
        assert!(seen.lock().unwrap().is_empty(), "a waker dropped before its work completed");
        hold.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        let seen = seen.lock().unwrap();
        assert_eq!(seen.len(), 5, "each waker dropped once");
        let wrong: Vec<_> = seen.iter().filter(|e| e.1 != 0).collect();
        assert!(wrong.is_empty(), "{} of 5 wakers dropped with a context current: {wrong:?}", wrong.len());
    }

    /// Device 1's primary context, last released by another binding after a sticky error: the
    /// crate did not make that release, so a `flush` finds the context gone (by device 1's own
    /// state, while device 0's stays active) and releases its pending launch. (Mutation testing:
    /// with every handle taken for device 0's, the flush asked device 0's state, found it
    /// active, and the owner was never dropped.)
    fn a_flush_releases_the_work_of_device_1s_context_another_binding_let_go(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let driver = cuda_dl_sys::driver().unwrap();
        let device = contexts[1].device().raw();
        // Another binding's retain of device 1.
        let mut foreign = std::ptr::null_mut();
        // SAFETY: a valid out-pointer and device.
        unsafe { driver.cuDevicePrimaryCtxRetain(&mut foreign, device) }.unwrap();
        assert_eq!(foreign, contexts[1].raw());
        let stream = Stream::new(&contexts[1]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let drops = Drops::new();
        let owner = drops.owner();
        host_launch(&stream, move || {
            let _keep = &owner;
        })
        .unwrap();
        fake().poison_context(contexts[1].raw()).expect("the fake could not poison the context");
        hold.release();
        drop(stream);
        let [zero, one] = contexts;
        drop(one);
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 0, "device 1's context still lives (the other binding's retain)");
        // SAFETY: the retain above; the last one of device 1's context.
        unsafe { driver.cuDevicePrimaryCtxRelease(device) }.unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 1, "the owner of the gone context's launch");
        assert_eq!(pending_launches(None), 0);
        drop(zero);
    }

    /// A reset of device 0's context forgets the event work of that context only: device 1's
    /// release, pending behind a held stream, completes once the stream runs, whether the reset
    /// came at once (the entry may still be in the poller's hand-over) or after the poller had
    /// queried it (in its queues). (Mutation testing: with the forgetting's filters inverted, the
    /// reset dropped every other context's entries, and device 1's owner was never dropped.)
    fn a_reset_forgets_the_event_work_of_its_own_context_only(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        for queried_first in [false, true] {
            let streams = [0, 1].map(|d| Stream::new(&contexts[d]).unwrap());
            let holds = [0, 1].map(|d| {
                fake().hold_stream(streams[d].raw()).expect("the fake could not hold the stream")
            });
            let drops = [Drops::new(), Drops::new()];
            // Not queried first: the poller is kept busy in a callback, so that device 1's entry
            // is still in its hand-over when the reset comes.
            let busy = Stream::new(&contexts[1]).unwrap();
            let (started_tx, started) = std::sync::mpsc::channel();
            let (go, go_rx) = std::sync::mpsc::channel::<()>();
            if queried_first {
                drop(go_rx);
            } else {
                spawn_after(&busy, move || {
                    started_tx.send(()).unwrap();
                    go_rx.recv().unwrap();
                })
                .unwrap();
                started.recv_timeout(PATIENCE).expect("the callback never started");
            }
            release_after(&streams[1], drops[1].owner()).unwrap();
            if queried_first {
                let queries = fake().call_count("cuEventQuery");
                cuda_workspace::testing::wait_until("the poller to query device 1's event", PATIENCE, || {
                    fake().call_count("cuEventQuery") >= queries + 3
                });
            }
            release_after(&streams[0], drops[0].owner()).unwrap();
            // Device 0's release is never to run: a sticky error, then the reset.
            fake().poison_context(contexts[0].raw()).expect("the fake could not poison the context");
            let [hold0, hold1] = holds;
            hold0.release();
            let [stream0, stream1] = streams;
            drop(stream0);
            // SAFETY: device 0's context's only stream is dropped; nothing made in it is used
            // after.
            let reclaimed = unsafe { contexts[0].reset() }.unwrap();
            cuda_workspace::testing::assert_reset_released(&contexts[0], reclaimed, 1);
            let _ = go.send(());
            drops[0].wait_dropped(1);
            assert_eq!(drops[1].dropped(), 0, "device 1's stream is still held");
            hold1.release();
            drops[1].wait_dropped(1);
            drop((stream1, busy));
        }
    }

    /// The reaper clears the context an owner's `Drop` left current even when it cannot ask
    /// what is current (`cuCtxGetCurrent` failing: an injected fault here, a sticky error on the
    /// GPU): the next launch's owner sees none. (Found by the torture harness under ASan, seed
    /// 1796206488: with the question failing, the reaper left the context current.)
    fn the_reaper_clears_the_context_when_it_cannot_ask_which_is_current(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        /// Makes its context current, then makes every `cuCtxGetCurrent` fail.
        struct LeavesCurrentAndBreaksTheQuestion(Arc<PrimaryContext>);
        impl Drop for LeavesCurrentAndBreaksTheQuestion {
            fn drop(&mut self) {
                self.0.set_current().unwrap();
                fake().set_fault("cuCtxGetCurrent", 0, 201);
            }
        }
        /// Lets the question work again, then records the current context.
        struct Sees(Arc<Mutex<Vec<usize>>>);
        impl Drop for Sees {
            fn drop(&mut self) {
                fake().clear_faults();
                self.0.lock().unwrap().push(current_context());
            }
        }
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
        for _ in 0..5 {
            let first = LeavesCurrentAndBreaksTheQuestion(Arc::clone(&contexts[1]));
            host_launch(&stream, move || {
                let _keep = &first;
            })
            .unwrap();
            let second = Sees(Arc::clone(&seen));
            host_launch(&stream, move || {
                let _keep = &second;
            })
            .unwrap();
        }
        hold.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        fake().clear_faults();
        assert_eq!(*seen.lock().unwrap(), [0; 5], "contexts current as the owners were dropped");
    }

    /// While `cuCtxGetCurrent` fails (an injected fault here, a sticky error on the GPU), the
    /// reaper clears once per record and asks again at the next, rather than pop its stack level
    /// by level up to its bound for every record: a failing question costs a call or two per
    /// record, not 64. (Mutation testing: the early return on a failed question.)
    fn while_the_question_fails_the_reaper_clears_once_per_record(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        /// Makes its context current, breaks the question, and starts the count.
        struct BreaksTheQuestion(Arc<PrimaryContext>);
        impl Drop for BreaksTheQuestion {
            fn drop(&mut self) {
                self.0.set_current().unwrap();
                fake().set_fault("cuCtxGetCurrent", 0, 201);
                fake().reset_call_counts();
            }
        }
        /// Records how many clears the records before it cost, and lets the question work again.
        struct Counts(Arc<Mutex<Option<u64>>>);
        impl Drop for Counts {
            fn drop(&mut self) {
                *self.0.lock().unwrap() = Some(fake().call_count("cuCtxSetCurrent"));
                fake().clear_faults();
            }
        }
        const RECORDS: u64 = 10;
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let first = BreaksTheQuestion(Arc::clone(&contexts[1]));
        host_launch(&stream, move || {
            let _keep = &first;
        })
        .unwrap();
        for _ in 0..RECORDS {
            host_launch(&stream, || {}).unwrap();
        }
        let counted: Arc<Mutex<Option<u64>>> = Arc::default();
        let last = Counts(Arc::clone(&counted));
        host_launch(&stream, move || {
            let _keep = &last;
        })
        .unwrap();
        hold.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        fake().clear_faults();
        let clears = counted.lock().unwrap().expect("the last owner was dropped");
        // After the first owner's drop and around each record after it: a clear or two each.
        assert!(
            clears <= 2 * (RECORDS + 2),
            "{clears} cuCtxSetCurrent calls for {} records while the question failed",
            RECORDS + 2
        );
    }

    /// The report of a host function's panic (the panic handler, the payload's `Drop`) is user
    /// code on the reaper too: a context it makes current is not current as that same record's
    /// owners are dropped. (Found by a review: the reaper cleared before the report, not after.)
    fn a_panic_handler_that_makes_a_context_current_leaves_the_records_owners_none(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        /// Records the context current when it is dropped.
        struct Sees(Arc<Mutex<Vec<usize>>>);
        impl Drop for Sees {
            fn drop(&mut self) {
                self.0.lock().unwrap().push(current_context());
            }
        }
        cuda_workspace::testing::quiet_expected_panics(|message| {
            message.contains("expected: a host function's panic")
        });
        let contexts = contexts();
        let binds = Arc::clone(&contexts[1]);
        let reports = Arc::new(AtomicUsize::new(0));
        let counted = Arc::clone(&reports);
        cuda_host_launch::set_panic_handler(move |_| {
            binds.set_current().unwrap();
            counted.fetch_add(1, Ordering::SeqCst);
        });
        let stream = Stream::new(&contexts[0]).unwrap();
        let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
        for _ in 0..5 {
            let owner = Sees(Arc::clone(&seen));
            host_launch(&stream, move || {
                let _keep = &owner;
                panic!("expected: a host function's panic");
            })
            .unwrap();
        }
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        cuda_host_launch::reset_panic_handler();
        assert_eq!(reports.load(Ordering::SeqCst), 5, "every panic reported");
        assert_eq!(*seen.lock().unwrap(), [0; 5], "contexts current as the owners were dropped");
    }

    /// The reaper clears every context an owner's `Drop` left on its stack, not just the top one:
    /// `cuCtxSetCurrent(NULL)` pops one context, and one pushed under it is current after it. An
    /// owner that makes device 0's context current and pushes device 1's over it leaves the next
    /// launch's owner with none current.
    fn the_reaper_clears_every_context_an_owner_left_on_its_stack(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        /// Makes device 0's context current, then pushes device 1's over it.
        struct LeavesTwo([Arc<PrimaryContext>; 2]);
        impl Drop for LeavesTwo {
            fn drop(&mut self) {
                self.0[0].set_current().unwrap();
                let driver = cuda_dl_sys::driver().unwrap();
                // SAFETY: a retained, live context.
                unsafe { driver.cuCtxPushCurrent(self.0[1].raw()) }.unwrap();
            }
        }
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
        for _ in 0..5 {
            let first = LeavesTwo(contexts.clone());
            host_launch(&stream, move || {
                let _keep = &first;
            })
            .unwrap();
            let second = Sees(Arc::clone(&seen));
            host_launch(&stream, move || {
                let _keep = &second;
            })
            .unwrap();
        }
        hold.release();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(*seen.lock().unwrap(), [0; 5], "contexts current as the owners were dropped");
    }

    /// The same when the context is left on the stack by an event enqueue in an owner's `Drop`
    /// (user code on the reaper awaiting a completion, as the torture harness's owners do) whose
    /// pool was dry and whose pop, after making the batch of events, failed: the context it set
    /// and the one the failed pop left under it are both cleared before the next owner. (Found by
    /// the torture harness under ASan, seed 1796624384: the reaper popped one, found the
    /// question answered by the `cuCtxSetCurrent(NULL)` alone, and the next launch's owner saw
    /// the other.)
    fn the_reaper_clears_the_context_a_failed_pop_of_an_event_batch_left(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let (enqueued, seen) = owner_enqueues_while_pops_fail_then_next_owner_sees(1);
        assert_eq!(enqueued, [false], "the enqueue whose pop failed is refused");
        assert_eq!(seen, [0], "a context current as the next owner was dropped");
    }

    /// As above, but with every pop failing while the owner enqueues (the retry in `with_pushed`
    /// fails too), so the event batch's context really is left pushed over device 1's: the reaper
    /// must clear two levels before the next owner. (Review: the test above no longer reaches
    /// two levels since the retry; it passes with a one-level `clear_now`. This one does not.)
    fn the_reaper_clears_both_contexts_when_every_pop_of_an_event_enqueue_fails(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let (enqueued, seen) = owner_enqueues_while_pops_fail_then_next_owner_sees(0);
        assert_eq!(enqueued, [false], "the enqueue whose pops failed is refused");
        assert_eq!(seen, [0], "a context current as the next owner was dropped");
    }

    /// An event enqueue on a user's thread whose pop of the context it pushed fails leaves the
    /// thread's context stack as it was: the failed pop is tried once more. Here a
    /// `release_after`, the first event work of device 0's context, with device 1's context
    /// current: the pop after the new pool's `cuCtxGetDevice` fails, and the enqueue is refused
    /// (the first pop's error) with its owner handed back. (Before: device 0's context was left
    /// pushed, current over the user's.)
    fn a_release_whose_pop_fails_leaves_the_callers_context_stack_as_it_was(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        release_with_faults_leaves_the_users_context_on_top(&[("cuCtxPopCurrent", 1, 2)]);
    }

    /// The same when `cuCtxGetCurrent` fails too: the retry cannot tell whether the failed pop
    /// popped, and tries the pop (a context of ours left pushed is the likelier case; on the H100
    /// a pop fails only on an empty stack). (Mutation testing: the retry's condition.)
    fn a_release_whose_pop_and_question_fail_leaves_the_callers_context_stack_as_it_was(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        release_with_faults_leaves_the_users_context_on_top(&[
            ("cuCtxPopCurrent", 1, 2),
            ("cuCtxGetCurrent", 0, 201),
        ]);
    }

    /// The same for an event-mode `completion` with no context current, whose dry pool's batch
    /// of events is made with the context pushed, and whose pop after the batch (the second pop:
    /// the first is the new pool's) fails: refused, and none current after. (Before: device 0's
    /// context was left current.)
    fn an_event_completion_whose_pop_fails_leaves_no_context_current(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        assert_eq!(current_context(), 0);
        let created = fake().call_count("cuEventCreate");
        fake().set_fault("cuCtxPopCurrent", 2, 2);
        let refused = CompletionMode::Event.completion(&stream);
        fake().clear_faults();
        assert!(refused.is_err(), "the enqueue whose pop failed is refused");
        assert!(fake().call_count("cuEventCreate") > created, "the batch was made");
        assert_eq!(current_context(), 0, "a context left current");
    }

    /// The same for a low-latency completion, whose first in its context registers a flag page
    /// with the context pushed: the completion is accepted (the page was made; the pop's error
    /// is not the registration's), and the user's context stack is as it was. (Before: the
    /// stream's context was left pushed over the user's.)
    fn a_flag_page_whose_pop_fails_leaves_the_callers_context_stack_as_it_was(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        contexts[1].set_current().unwrap();
        fake().set_fault("cuCtxPopCurrent", 1, 2);
        let completion = CompletionMode::LowLatency.completion(&stream);
        fake().clear_faults();
        let mut completion = completion.expect("the page was made");
        assert_eq!(current_context(), contexts[1].raw().addr(), "the user's context current");
        let driver = cuda_dl_sys::driver().unwrap();
        let mut popped = std::ptr::null_mut();
        // SAFETY: a valid out-pointer; the context set above is on the stack.
        unsafe { driver.cuCtxPopCurrent(&mut popped) }.unwrap();
        assert_eq!(popped, contexts[1].raw());
        assert_eq!(current_context(), 0, "a context under the user's");
        resolve(&mut completion).unwrap();
    }

    /// The poller's look for a sticky error (it pushes each waiting context and pops it) leaves
    /// no context current on the poller when its pop fails: a waker it then wakes, user code on
    /// the poller's thread, sees none. (Before: the context stayed on the poller's stack.)
    fn the_pollers_sticky_error_look_whose_pop_fails_leaves_no_context_current(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        struct SeesOnWake(Arc<Mutex<Vec<usize>>>);
        impl std::task::Wake for SeesOnWake {
            fn wake(self: Arc<Self>) {
                self.0.lock().unwrap().push(current_context());
            }
        }
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
        let mut completion = Box::pin(CompletionMode::LowLatency.completion(&stream).unwrap());
        let waker = std::task::Waker::from(Arc::new(SeesOnWake(Arc::clone(&seen))));
        let poll = completion.as_mut().poll(&mut std::task::Context::from_waker(&waker));
        assert!(poll.is_pending(), "{poll:?} while the stream is held");
        // The poller looks every 2 ms; nothing else pops now.
        let pops = fake().call_count("cuCtxPopCurrent");
        fake().set_fault("cuCtxPopCurrent", 1, 2);
        cuda_workspace::testing::wait_until("the poller's look", PATIENCE, || {
            fake().call_count("cuCtxPopCurrent") >= pops + 3
        });
        fake().clear_faults();
        hold.release();
        cuda_workspace::testing::wait_until("the waker's wake", PATIENCE, || {
            !seen.lock().unwrap().is_empty()
        });
        resolve(&mut completion).unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(*seen.lock().unwrap(), [0], "a context current as the poller woke the waker");
    }

    /// Callbacks run with their stream's context current, even after a callback made another
    /// context current (as one that frees a device-1 buffer does): the next device-0 callback sees
    /// device 0's, and a release it makes on the legacy stream lands on device 0's.
    fn a_callback_binding_another_context_leaves_the_next_callback_in_its_own(
        FAKE_CUDA_DEVICES = "2",
        CUDA_DL_SYS_LIBRARY = fake_driver_path()
    ) {
        let contexts = contexts();
        let stream = Stream::new(&contexts[0]).unwrap();
        let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
        let (other, out) = (Arc::clone(&contexts[1]), Arc::clone(&seen));
        spawn_after(&stream, move || {
            out.lock().unwrap().push(current_context());
            other.set_current().unwrap();
        })
        .unwrap();
        // Device 0's legacy stream is held: a release there must wait.
        contexts[0].set_current().unwrap();
        let hold = fake()
            .hold_stream(cuda_dl_sys::CU_STREAM_LEGACY)
            .expect("the fake could not hold the stream");
        let drops = Drops::new();
        let (out, owner) = (Arc::clone(&seen), drops.owner());
        spawn_after(&stream, move || {
            out.lock().unwrap().push(current_context());
            release_after(cuda_host_launch::RawStream::LEGACY, owner).unwrap();
        })
        .unwrap();
        let deadline = std::time::Instant::now() + PATIENCE;
        while seen.lock().unwrap().len() < 2 {
            assert!(std::time::Instant::now() < deadline, "the callbacks did not run");
            std::thread::sleep(Duration::from_millis(1));
        }
        std::thread::sleep(Duration::from_millis(50));
        flush(PATIENCE).unwrap();
        let device0 = contexts[0].raw().addr();
        assert_eq!(*seen.lock().unwrap(), [device0, device0], "each callback in its stream's context");
        assert_eq!(drops.dropped(), 0, "released while device 0's legacy stream was held");
        hold.release();
        drops.wait_dropped(1);
    }
}

/// An owner that notes, in its `Drop`, its context, the context current then and whether the
/// reaper drops it; with `switch`, it then makes `other` current and leaves it so (as a binding's
/// buffer that binds its own context does).
/// What each [`ContextCheck`] saw as it was dropped.
type Seen = Arc<Mutex<Vec<(usize, usize, bool)>>>;

struct ContextCheck {
    own: usize,
    other: Arc<PrimaryContext>,
    switch: bool,
    seen: Arc<Mutex<Vec<(usize, usize, bool)>>>,
}

impl Drop for ContextCheck {
    fn drop(&mut self) {
        let reaper = std::thread::current().name() == Some("cuda-hl-reaper");
        self.seen
            .lock()
            .unwrap()
            .push((self.own, current_context(), reaper));
        if self.switch {
            self.other.set_current().unwrap();
        }
    }
}

/// The calling thread's current context (0 for none).
fn current_context() -> usize {
    let driver = cuda_dl_sys::driver().unwrap();
    let mut current = std::ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { driver.cuCtxGetCurrent(&mut current) }.unwrap();
    current.addr()
}

/// An owner that records, in its `Drop`, the context current then (0 for none).
struct Sees(Arc<Mutex<Vec<usize>>>);

impl Drop for Sees {
    fn drop(&mut self) {
        self.0.lock().unwrap().push(current_context());
    }
}

/// On device 0's held stream: a launch whose owner, on the reaper, makes device 1's context
/// current and awaits an event-mode completion of its per-thread stream (the context's first, its
/// pool dry) while `cuCtxPopCurrent` fails (its `nth` call from then; 0: every call); then a
/// launch whose owner notes the context current as it is dropped. Returns whether the first
/// owner's enqueue was accepted, and what the second saw.
fn owner_enqueues_while_pops_fail_then_next_owner_sees(nth: u64) -> (Vec<bool>, Vec<usize>) {
    struct AwaitsWhilePopsFail(Arc<PrimaryContext>, u64, Arc<Mutex<Vec<bool>>>);
    impl Drop for AwaitsWhilePopsFail {
        fn drop(&mut self) {
            self.0.set_current().unwrap();
            fake().set_fault("cuCtxPopCurrent", self.1, 2);
            let enqueued = CompletionMode::Event
                .completion(cuda_host_launch::RawStream::PER_THREAD)
                .is_ok();
            fake().clear_faults();
            self.2.lock().unwrap().push(enqueued);
        }
    }
    let contexts = contexts();
    let stream = Stream::new(&contexts[0]).unwrap();
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    let seen: Arc<Mutex<Vec<usize>>> = Arc::default();
    let enqueued: Arc<Mutex<Vec<bool>>> = Arc::default();
    let first = AwaitsWhilePopsFail(Arc::clone(&contexts[1]), nth, Arc::clone(&enqueued));
    host_launch(&stream, move || {
        let _keep = &first;
    })
    .unwrap();
    let second = Sees(Arc::clone(&seen));
    host_launch(&stream, move || {
        let _keep = &second;
    })
    .unwrap();
    hold.release();
    stream.synchronize().unwrap();
    flush(PATIENCE).unwrap();
    let enqueued = enqueued.lock().unwrap().clone();
    let seen = seen.lock().unwrap().clone();
    (enqueued, seen)
}

/// With device 1's context current on this thread, a `release_after` on device 0's stream (the
/// first event work of its context) while `faults` (name, nth call, code) are set: refused, its
/// owner handed back, and the thread's stack as it was (device 1's context on top, none under it).
fn release_with_faults_leaves_the_users_context_on_top(faults: &[(&str, u64, u32)]) {
    let contexts = contexts();
    let stream = Stream::new(&contexts[0]).unwrap();
    contexts[1].set_current().unwrap();
    let drops = Drops::new();
    for &(name, nth, code) in faults {
        fake().set_fault(name, nth, code);
    }
    let refused = release_after(&stream, drops.owner());
    fake().clear_faults();
    let refused = refused.expect_err("the enqueue whose pop failed is refused");
    assert!(refused.into_inner().is_some(), "the owner is handed back");
    assert_eq!(
        current_context(),
        contexts[1].raw().addr(),
        "the user's context current"
    );
    let driver = cuda_dl_sys::driver().unwrap();
    let mut popped = std::ptr::null_mut();
    // SAFETY: a valid out-pointer; the context set above is on the stack.
    unsafe { driver.cuCtxPopCurrent(&mut popped) }.unwrap();
    assert_eq!(popped, contexts[1].raw());
    assert_eq!(current_context(), 0, "a context under the user's");
}
