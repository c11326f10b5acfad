//! Inside a host function (on the driver's thread) no CUDA call may be made: this crate's
//! launches, `add_host_node` and `flush` return `InsideHostFunction`, and the owners of a launch
//! refused there are not dropped on the driver's thread but go through the cleanup queue.
//! Resources (`Stream`, `Event`, `PrimaryContext`, `Graph`) dropped inside a host function are
//! destroyed later, off the driver's thread. The fake counts driver calls made on its driver
//! threads: none may be.
//!
//! Call counts are process-wide, so each test has a process of its own.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use cuda_host_launch::{
    Device, Error, Event, Graph, LaunchOptions, PrimaryContext, RawStream, Stream, add_host_node,
    drain, flush, host_launch, in_host_function, launch_host_function,
    launch_host_function_with_bytes,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    Drops, PATIENCE, RanOn, ThreadInfo, fake, fake_primary_context, wait_until,
};

unsafe extern "C" fn nothing(_: *mut c_void) {}

/// What a closure saw right after dropping resources: its thread, and the destroy calls made on a
/// driver thread so far.
type During = (ThreadInfo, Vec<u64>);

/// What one attempt inside the host function returned.
type Outcomes = Arc<Mutex<Vec<(&'static str, Result<(), Error>)>>>;

isolated_test! {
    /// Inside a host closure, every launch, `add_host_node` and `flush` is refused with
    /// `InsideHostFunction` (saying what was attempted), `drain` releases nothing, no driver call
    /// is made there. The refused launches' owners are dropped once, by the reaper, not on the
    /// driver's thread. Outside, `in_host_function` is false again and launches work.
    fn launches_inside_a_host_function_are_refused_and_their_owners_leave_the_driver_thread() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let refused = Drops::new();
        let outcomes: Outcomes = Arc::default();
        let ran_on = RanOn::new();
        let inside = Arc::new(AtomicBool::new(false));
        let drained = Arc::new(AtomicU64::new(u64::MAX));
        // SAFETY: `stream` lives until after the synchronize below, after the closure's last use.
        let raw = unsafe { RawStream::from_raw(stream.raw()) };
        let graph = Graph::new().unwrap();
        {
            let (refused, outcomes, ran_on, inside, drained) = (
                Arc::clone(&refused),
                Arc::clone(&outcomes),
                Arc::clone(&ran_on),
                Arc::clone(&inside),
                Arc::clone(&drained),
            );
            let mut graph = Some(graph);
            host_launch(&stream, move || {
                ran_on.here();
                inside.store(in_host_function(), Ordering::SeqCst);
                let mut out = outcomes.lock().unwrap();
                let owner = refused.owner();
                // Each error hands its owner back; taken for an `Error` here (`?` would do the
                // same), it drops the owner off this driver thread, through the cleanup queue.
                out.push(("host_launch", host_launch(raw, move || {
                    let _keep = &owner;
                }).map_err(Into::into)));
                // SAFETY: `nothing` does nothing (and is refused anyway).
                out.push(("launch_host_function", unsafe {
                    launch_host_function(raw, Some(nothing), ptr::null_mut(), refused.owner())
                        .map_err(Into::into)
                }));
                // SAFETY: as above.
                out.push(("launch_host_function_with_bytes", unsafe {
                    launch_host_function_with_bytes(raw, Some(nothing), &[1, 2, 3])
                }));
                let owner = refused.owner();
                let repeatable = LaunchOptions::default().host_launch_repeatable(raw, move || {
                    let _keep = &owner;
                });
                out.push(("host_launch_repeatable", repeatable.map_err(Into::into)));
                let owner = refused.owner();
                let added = add_host_node(graph.as_ref().unwrap(), &[], move || {
                    let _keep = &owner;
                });
                out.push(("add_host_node", added.map(|_| ()).map_err(Into::into)));
                out.push(("flush", flush(PATIENCE)));
                drained.store(drain(), Ordering::SeqCst);
                // The graph, dropped here, is destroyed later, off this thread.
                drop(graph.take());
            })
            .unwrap();
        }
        assert!(!in_host_function());
        stream.synchronize().unwrap();
        assert!(inside.load(Ordering::SeqCst), "in_host_function was false inside");
        let drained = drained.load(Ordering::SeqCst);
        assert_eq!(drained, 0, "drain released something on the driver's thread");

        let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
        let expected = [
            ("host_launch", "launching a host function"),
            ("launch_host_function", "launching a host function"),
            ("launch_host_function_with_bytes", "launching a host function"),
            ("host_launch_repeatable", "launching a host function"),
            ("add_host_node", "adding a graph host node"),
            ("flush", "flush"),
        ];
        assert_eq!(outcomes.len(), expected.len());
        for ((what, outcome), (name, operation)) in outcomes.into_iter().zip(expected) {
            assert_eq!(what, name);
            match outcome {
                Err(Error::InsideHostFunction { operation: got }) => {
                    assert_eq!(got, operation, "{what}");
                }
                other => panic!("{what}: expected InsideHostFunction, got {other:?}"),
            }
        }

        let records = refused.wait_dropped(4);
        assert_eq!(refused.live(), 0);
        let driver = ran_on.only();
        for record in &records {
            assert!(!record.thread.same_as(&driver), "dropped on the driver's thread: {record:?}");
            assert!(record.thread.is_reaper(), "{record:?}");
        }
        assert_eq!(fake().call_count("cuGraphDestroy"), 1, "the graph was not destroyed");
        assert_eq!(fake().driver_thread_call_count(""), 0, "a driver call on the driver's thread");

        // Outside a host function everything works again.
        let drops = Drops::new();
        let owner = drops.owner();
        host_launch(&stream, move || {
            let _keep = &owner;
        })
        .unwrap();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        drops.wait_dropped(1);
    }

    /// A `Stream`, an `Event` and the last handle of a retained `PrimaryContext` dropped inside a
    /// host closure are not destroyed by the drop but later, by the reaper: when the drop returns
    /// no destroy call has been made on the driver's thread, and `cuStreamDestroy`,
    /// `cuEventDestroy` and `cuDevicePrimaryCtxRelease` are each called once, by the reaper, none
    /// of them on a driver thread.
    fn resources_dropped_inside_a_host_function_are_destroyed_off_the_driver_thread() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let doomed_stream = Stream::new(&context).unwrap();
        let doomed_event = Event::new(&context).unwrap();
        let doomed_context = PrimaryContext::retain(Device::get(0).unwrap()).unwrap();
        let names = ["cuStreamDestroy", "cuEventDestroy", "cuDevicePrimaryCtxRelease"];
        let before: Vec<u64> = names.iter().map(|n| fake().call_count(n)).collect();
        assert_eq!(before, [0, 0, 0]);
        // Who destroys each: the fake runs a hook on the calling thread at the start of the call.
        let destroyers: Arc<Mutex<Vec<(&str, ThreadInfo)>>> = Arc::default();
        for name in names {
            let destroyers = Arc::clone(&destroyers);
            fake().set_hook(name, 1, move || {
                destroyers.lock().unwrap().push((name, ThreadInfo::current()));
            });
        }
        // What the closure saw right after its drop: its thread, and the destroy calls made on a
        // driver thread so far.
        let during: Arc<Mutex<Option<During>>> = Arc::default();
        {
            let during = Arc::clone(&during);
            let mut doomed = Some((doomed_stream, doomed_event, doomed_context));
            host_launch(&stream, move || {
                drop(doomed.take());
                let on_driver = names.iter().map(|n| fake().driver_thread_call_count(n)).collect();
                *during.lock().unwrap() = Some((ThreadInfo::current(), on_driver));
            })
            .unwrap();
        }
        stream.synchronize().unwrap();
        let (closure_thread, on_driver) = during.lock().unwrap().take().expect("the closure ran");
        // The drop returned without destroying anything on this, the driver's, thread. (The reaper
        // may already have destroyed them meanwhile, on its own thread.)
        assert_eq!(on_driver, [0, 0, 0], "destroyed by the drop, on the driver's thread");
        wait_until("the deferred destructions", PATIENCE, || {
            flush(PATIENCE).unwrap();
            names.iter().all(|n| fake().call_count(n) == 1)
        });
        let destroyers = destroyers.lock().unwrap().clone();
        assert_eq!(destroyers.len(), names.len(), "{destroyers:?}");
        for (name, thread) in &destroyers {
            assert!(!thread.same_as(&closure_thread), "{name} on the closure's thread");
            assert!(thread.is_reaper(), "{name} not by the reaper: {thread:?}");
        }
        for name in names {
            assert_eq!(fake().driver_thread_call_count(name), 0, "{name} on a driver thread");
        }
        assert_eq!(fake().driver_thread_call_count(""), 0);
        // The context handle retained for the test is still fine.
        let after = Stream::new(&context).unwrap();
        after.synchronize().unwrap();
    }

    /// A value dropped inside a host closure (`defer_drop`) is dropped later by the reaper; a
    /// `Drop` there that makes a context current (as a binding's buffer does) leaves none current
    /// for the owners of the launch released after it. (Mutation testing: with the reaper not
    /// clearing the current context before a launch's owners, they saw the deferred drop's.)
    fn a_deferred_drop_that_makes_a_context_current_leaves_none_for_the_next_owners() {
        struct MakesCurrent(Arc<PrimaryContext>);
        impl Drop for MakesCurrent {
            fn drop(&mut self) {
                self.0.set_current().unwrap();
            }
        }
        /// Records the current context, and whether the reaper dropped it.
        struct SeesCurrent(Arc<Mutex<Vec<(usize, bool)>>>);
        impl Drop for SeesCurrent {
            fn drop(&mut self) {
                let mut current = ptr::null_mut();
                // SAFETY: a valid out-pointer.
                unsafe { cuda_dl_sys::driver().unwrap().cuCtxGetCurrent(&mut current) }.unwrap();
                let reaper = std::thread::current().name() == Some("cuda-hl-reaper");
                self.0.lock().unwrap().push((current.addr(), reaper));
            }
        }
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let seen: Arc<Mutex<Vec<(usize, bool)>>> = Arc::default();
        let mut deferred = Some(MakesCurrent(Arc::clone(&context)));
        let owner = SeesCurrent(Arc::clone(&seen));
        // The deferred value reaches the queue during the host function, the launch's record (its
        // owner) after it: the reaper releases them in that order.
        host_launch(&stream, move || {
            let _keep = &owner;
            if let Some(value) = deferred.take() {
                cuda_host_launch::defer_drop(value);
            }
        })
        .unwrap();
        stream.synchronize().unwrap();
        flush(PATIENCE).unwrap();
        assert_eq!(*seen.lock().unwrap(), [(0, true)], "(current context, on the reaper)");
    }
}
