//! Soundness of the public API: host functions launched by other libraries (they mark their
//! threads with `HostFunctionScope`, and a mark can never end another's), the driver calls of the
//! resource and graph types inside a host function (refused), and graph nodes given as dependencies
//! (a node of another graph is refused). That a node handle cannot outlive its graph, and that
//! `cuda_dl_sys::Driver::load` is `unsafe`, are compile-fail doctests of `Graph::nodes`,
//! `add_host_node` and `Driver::load`.
//!
//! Call counts are process-wide, so each test has a process of its own.

use std::cell::RefCell;
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_host_launch::{
    Device, Error, Event, Graph, HostFunctionScope, PrimaryContext, RawStream, Stream,
    add_host_node, flush, host_launch, in_host_function,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{Drops, Owner, PATIENCE, ThreadInfo, fake, fake_primary_context};

/// What a foreign host function (one launched with a raw `cuLaunchHostFunc`, not by this crate)
/// found and did, written by it on the driver's thread and read by the test afterwards.
struct Foreign {
    stream: RawStream,
    owner: Mutex<Option<Owner>>,
    victim: Mutex<Option<Stream>>,
    marked: Mutex<Option<bool>>,
    ran_on: Mutex<Option<ThreadInfo>>,
    outcomes: Mutex<Vec<(&'static str, Result<(), Error>)>>,
}

/// The host function of "another library": marks its thread as a driver thread, then calls into
/// this crate (a launch, a flush, a `Stream` dropped). It never panics (it runs on the driver's
/// thread): it only records what happened.
///
/// # Safety
/// `user_data` is a live `Foreign`.
unsafe extern "C" fn foreign_host_function(user_data: *mut c_void) {
    // SAFETY: the test keeps the `Foreign` alive until the stream has synchronized.
    let foreign = unsafe { &*user_data.cast::<Foreign>() };
    let _mark = HostFunctionScope::enter();
    *foreign.marked.lock().unwrap_or_else(|p| p.into_inner()) = Some(in_host_function());
    *foreign.ran_on.lock().unwrap_or_else(|p| p.into_inner()) = Some(ThreadInfo::current());
    let owner = foreign
        .owner
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .take();
    // Refused: the owner handed back is taken for an `Error` here (as `?` would), which drops it
    // off this driver thread, through the cleanup queue.
    let launched = host_launch(foreign.stream, move || {
        let _keep = &owner;
    })
    .map(drop)
    .map_err(Into::into);
    let flushed = flush(Duration::from_millis(1));
    drop(
        foreign
            .victim
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take(),
    );
    let mut outcomes = foreign.outcomes.lock().unwrap_or_else(|p| p.into_inner());
    outcomes.push(("host_launch", launched));
    outcomes.push(("flush", flushed));
}

isolated_test! {
    /// A host function launched by another library through a raw `cuLaunchHostFunc` marks its
    /// thread with `HostFunctionScope`: this crate then treats it as inside a host function (the
    /// launch and the flush are refused, the launch's owner and a `Stream` dropped there are
    /// released by the cleanup queue), and makes no driver call on the driver's thread.
    fn a_foreign_host_function_that_marks_its_thread_is_treated_as_inside_a_host_function() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let victim = Stream::new(&context).unwrap();
        let drops = Drops::new();
        let streams_before = fake().live_objects("streams");
        let foreign = Box::new(Foreign {
            // SAFETY: `stream` outlives the host function (synchronized below).
            stream: unsafe { RawStream::from_raw(stream.raw()) },
            owner: Mutex::new(Some(drops.owner())),
            victim: Mutex::new(Some(victim)),
            marked: Mutex::new(None),
            ran_on: Mutex::new(None),
            outcomes: Mutex::new(Vec::new()),
        });
        let user_data = std::ptr::from_ref::<Foreign>(&foreign).cast_mut().cast::<c_void>();
        let driver = cuda_dl_sys::driver().unwrap();
        // SAFETY: a live stream; the function's contract holds (the `Foreign` lives until the
        // synchronize below, after which the function has returned).
        unsafe {
            driver
                .cuLaunchHostFunc(stream.raw(), Some(foreign_host_function), user_data)
                .unwrap();
        }
        stream.synchronize().unwrap();
        assert_eq!(*foreign.marked.lock().unwrap(), Some(true), "the mark was not seen");
        for (what, outcome) in foreign.outcomes.lock().unwrap().drain(..) {
            assert!(
                matches!(outcome, Err(Error::InsideHostFunction { .. })),
                "{what} inside the foreign host function: {outcome:?}"
            );
        }
        assert_eq!(
            fake().driver_thread_call_count(""),
            0,
            "a driver call was made on the driver's thread: {:?}",
            fake().call_counts()
        );
        let records = drops.wait_dropped(1);
        let driver_thread = foreign.ran_on.lock().unwrap().clone().unwrap();
        assert!(
            !records[0].thread.same_as(&driver_thread),
            "the owner was dropped on the driver's thread: {:?}",
            records[0].thread
        );
        flush(PATIENCE).unwrap();
        assert_eq!(fake().live_objects("streams"), streams_before - 1, "the victim lives on");
        assert!(!in_host_function());
    }
}

thread_local! {
    /// Where a foreign host function leaves its mark behind on the driver's thread.
    static STASHED_MARK: RefCell<Option<HostFunctionScope>> = const { RefCell::new(None) };
}

/// A foreign host function that marks its thread and leaves the mark alive in a thread-local,
/// for whatever runs next on that thread to drop.
///
/// # Safety
/// None: it ignores its data (`unsafe` only as a host function's C type).
unsafe extern "C" fn stash_a_mark(_: *mut c_void) {
    STASHED_MARK.with(|slot| *slot.borrow_mut() = Some(HostFunctionScope::enter()));
}

isolated_test! {
    /// A mark made before this crate's host function ran on the same driver thread, and dropped
    /// inside it, does not unmark the thread while ours runs: the thread stays inside a host
    /// function (a launch there is refused, no driver call is made on the driver's thread).
    fn a_mark_dropped_inside_our_host_function_does_not_unmark_its_thread() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let driver = cuda_dl_sys::driver().unwrap();
        // SAFETY: a live stream; the function ignores its data.
        unsafe {
            driver
                .cuLaunchHostFunc(stream.raw(), Some(stash_a_mark), std::ptr::null_mut())
                .unwrap();
        }
        let still_inside = Arc::new(AtomicBool::new(false));
        let outcome: Arc<Mutex<Option<Result<(), Error>>>> = Arc::default();
        // SAFETY: `stream` outlives the host function (synchronized below).
        let raw = unsafe { RawStream::from_raw(stream.raw()) };
        {
            let (still_inside, outcome) = (Arc::clone(&still_inside), Arc::clone(&outcome));
            host_launch(&stream, move || {
                drop(STASHED_MARK.with(|slot| slot.borrow_mut().take()));
                still_inside.store(in_host_function(), Ordering::SeqCst);
                let launched = host_launch(raw, || {}).map(drop).map_err(Into::into);
                *outcome.lock().unwrap_or_else(|p| p.into_inner()) = Some(launched);
            })
            .unwrap();
        }
        stream.synchronize().unwrap();
        assert!(still_inside.load(Ordering::SeqCst), "the thread was unmarked inside ours");
        let outcome = outcome.lock().unwrap().take();
        assert!(
            matches!(outcome, Some(Err(Error::InsideHostFunction { .. }))),
            "a launch inside ours after the mark was dropped: {outcome:?}"
        );
        assert_eq!(fake().driver_thread_call_count(""), 0, "{:?}", fake().call_counts());
    }
}

/// Marks dropped in any order: the thread stays marked until the last one is gone.
#[test]
fn marks_dropped_out_of_order_keep_the_thread_marked_until_the_last_is_gone() {
    assert!(!in_host_function());
    let first = HostFunctionScope::enter();
    let second = HostFunctionScope::enter();
    drop(first);
    assert!(in_host_function(), "unmarked while a mark is alive");
    drop(second);
    assert!(!in_host_function());
}

isolated_test! {
    /// A dependency that is a node of another graph is refused with an error that says so, before
    /// any driver call; the closure is released once and the graph is left as it was.
    fn a_dependency_from_another_graph_is_refused_before_any_driver_call() {
        let _context = fake_primary_context();
        let (first, second) = (Graph::new().unwrap(), Graph::new().unwrap());
        let node_of_first = add_host_node(&first, &[], || {}).unwrap();
        let drops = Drops::new();
        let owner = drops.owner();
        fake().reset_call_counts();
        let result = add_host_node(&second, &[node_of_first], move || {
            let _keep = &owner;
        });
        let calls = fake().call_counts();
        assert_eq!(drops.dropped(), 0, "the crate dropped the closure it refused");
        let (result, handed_back) = match result {
            Ok(_) => (Ok(()), None),
            Err(e) => {
                let (error, closure) = e.into_parts();
                (Err(error), closure)
            }
        };
        assert!(handed_back.is_some(), "the closure was not handed back");
        drop(handed_back);
        assert!(
            matches!(result, Err(Error::NodeOfAnotherGraph { node, node_graph, graph })
                if node == node_of_first.raw().addr()
                    && node_graph == first.raw().addr()
                    && graph == second.raw().addr()),
            "{result:?}"
        );
        assert!(calls.is_empty(), "driver calls were made: {calls:?}");
        assert_eq!(drops.dropped(), 1, "the closure handed back outlived its drop");
        assert!(second.nodes().unwrap().is_empty(), "a node was left behind");
    }
}

/// What each resource call inside the host function returned.
type ResourceOutcomes = Arc<Mutex<Vec<(&'static str, Result<(), Error>)>>>;

isolated_test! {
    /// Inside a host function every driver call of the resource types (`Device`,
    /// `PrimaryContext`, `Stream`, `Event`, `Graph`, `GraphExec`) is refused with
    /// `InsideHostFunction`, and none reaches the driver on its thread.
    fn resource_calls_inside_a_host_function_are_refused_without_a_driver_call() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let other = Stream::new(&context).unwrap();
        let event = Event::new(&context).unwrap();
        let graph = Graph::new().unwrap();
        let exec = graph.instantiate().unwrap();
        let outcomes: ResourceOutcomes = Arc::default();
        {
            let outcomes = Arc::clone(&outcomes);
            let context = Arc::clone(&context);
            host_launch(&stream, move || {
                fn done<T>(result: Result<T, Error>) -> Result<(), Error> {
                    result.map(drop)
                }
                let device = context.device();
                let out = [
                    ("Device::count", done(Device::count())),
                    ("Device::get", done(Device::get(0))),
                    ("Device::name", done(device.name())),
                    ("PrimaryContext::retain", done(PrimaryContext::retain(device))),
                    ("PrimaryContext::set_current", context.set_current()),
                    ("PrimaryContext::synchronize", context.synchronize()),
                    // SAFETY: refused before it resets anything (what this test checks); were it
                    // not, the test would fail on the driver-thread call count below anyway.
                    ("PrimaryContext::reset", done(unsafe { context.reset() })),
                    ("Stream::new", done(Stream::new(&context))),
                    ("Stream::new_non_blocking", done(Stream::new_non_blocking(&context))),
                    ("Stream::synchronize", other.synchronize()),
                    ("Stream::is_idle", done(other.is_idle())),
                    ("Event::new", done(Event::new(&context))),
                    ("Event::record", event.record(&other)),
                    ("Event::make_wait", event.make_wait(&other)),
                    ("Event::synchronize", event.synchronize()),
                    ("Event::is_complete", done(event.is_complete())),
                    ("Graph::new", done(Graph::new())),
                    ("Graph::try_clone", done(graph.try_clone())),
                    ("Graph::instantiate", done(graph.instantiate())),
                    ("Graph::nodes", done(graph.nodes().map(|n| n.len()))),
                    ("Graph::node_types", done(graph.node_types().map(|n| n.len()))),
                    ("GraphExec::launch", exec.launch(&other)),
                ];
                outcomes.lock().unwrap_or_else(|p| p.into_inner()).extend(out);
            })
            .unwrap();
        }
        stream.synchronize().unwrap();
        let outcomes = std::mem::take(&mut *outcomes.lock().unwrap());
        assert_eq!(outcomes.len(), 22, "the host function did not finish");
        let accepted: Vec<_> = outcomes
            .iter()
            .filter(|(_, outcome)| !matches!(outcome, Err(Error::InsideHostFunction { .. })))
            .collect();
        assert!(accepted.is_empty(), "not refused inside a host function: {accepted:?}");
        assert_eq!(
            fake().driver_thread_call_count(""),
            0,
            "driver calls on the driver's thread: {:?}",
            fake().call_counts()
        );
    }
}
