//! Launches that fail: the driver refuses the enqueue (fault injection), or the function pointer is
//! null. The error says what happened and hands the owners back (`LaunchError`): the crate never
//! drops them itself (earlier work on the stream may still use them), and they are dropped exactly
//! once, when the caller drops them; nothing leaks and nothing runs.
//!
//! Injected faults are process-wide, so each test runs in a process of its own.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::types::CUresult;
use cuda_host_launch::{
    Error, Graph, LaunchError, LaunchOptions, Stream, host_launch, launch_host_function,
    launch_host_function_with_bytes,
};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{Drops, ThreadInfo, fake, fake_primary_context};

/// How often `count_run` ran.
static RUNS: AtomicUsize = AtomicUsize::new(0);

unsafe extern "C" fn count_run(_: *mut c_void) {
    RUNS.fetch_add(1, Ordering::SeqCst);
}

/// `result` is the driver's `code` from `function`.
#[track_caller]
fn assert_driver_error(result: Result<(), Error>, code: CUresult, function: &str) {
    match result {
        Err(Error::Cuda(cuda_dl_sys::Error::Driver(e))) => {
            assert_eq!(e.code(), code, "{e}");
            assert_eq!(e.function(), Some(function), "{e}");
        }
        other => panic!("expected {code:?} from {function}, got {other:?}"),
    }
}

/// `refused` is an error that handed its owners (`n` of `drops`) back, all alive; the caller
/// then drops them, here. Returns the error.
#[track_caller]
fn handed_back<T: Send + 'static>(
    refused: Result<(), LaunchError<T>>,
    drops: &Drops,
    n: usize,
) -> Result<(), Error> {
    let Err(refused) = refused else {
        panic!("the launch did not fail");
    };
    assert_eq!(
        drops.dropped(),
        0,
        "the crate dropped what it refused: {refused}"
    );
    assert!(refused.is_handed_back(), "not handed back: {refused:?}");
    let (error, owners) = refused.into_parts();
    assert_eq!(
        drops.live(),
        n as isize,
        "handed back, alive until the caller drops them"
    );
    drop(owners);
    assert_dropped_here(drops, n);
    Err(error)
}

/// Every owner of `drops` has been dropped exactly once, on the calling thread.
#[track_caller]
fn assert_dropped_here(drops: &Drops, n: usize) {
    let me = ThreadInfo::current();
    let records = drops.records();
    assert_eq!(records.len(), n, "not dropped: {records:?}");
    assert_eq!(drops.live(), 0);
    for record in records {
        assert!(
            record.thread.same_as(&me),
            "dropped elsewhere than on the caller's thread: {record:?}"
        );
    }
}

isolated_test! {
    /// With `cuLaunchHostFunc` failing (out of memory), each kind of launch returns that error and
    /// hands its owners back, alive, to be dropped by the caller; nothing runs, nothing is
    /// pending, and a launch after the fault works as usual.
    fn a_launch_the_driver_refuses_returns_its_error_and_hands_the_owners_back() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let oom = CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        let ran = Arc::new(AtomicUsize::new(0));

        let drops = Drops::new();
        fake().set_fault("cuLaunchHostFunc", 1, oom.0);
        let (owner, counter) = (drops.owner(), Arc::clone(&ran));
        let refused = host_launch(&stream, move || {
            let _keep = &owner;
            counter.fetch_add(1, Ordering::SeqCst);
        });
        assert_driver_error(handed_back(refused, &drops, 1), oom, "cuLaunchHostFunc");

        let drops = Drops::new();
        fake().set_fault("cuLaunchHostFunc", 1, oom.0);
        // SAFETY: `count_run` ignores its argument and does not unwind.
        let refused = unsafe {
            let owners = (drops.owner(), drops.owner());
            launch_host_function(&stream, Some(count_run), ptr::null_mut(), owners)
        };
        assert_driver_error(handed_back(refused, &drops, 2), oom, "cuLaunchHostFunc");

        let drops = Drops::new();
        fake().set_fault("cuLaunchHostFunc", 1, oom.0);
        // SAFETY: as above; it may run any number of times.
        let refused = unsafe {
            LaunchOptions::default().launch_host_function_repeatable(
                &stream,
                Some(count_run),
                ptr::null_mut(),
                drops.owner())
        };
        assert_driver_error(handed_back(refused, &drops, 1), oom, "cuLaunchHostFunc");

        fake().set_fault("cuLaunchHostFunc", 1, oom.0);
        // SAFETY: as above.
        let refused =
            unsafe { launch_host_function_with_bytes(&stream, Some(count_run), &[1, 2, 3]) };
        assert_driver_error(refused, oom, "cuLaunchHostFunc");

        assert_eq!(fake().pending_host_functions(context.raw()), 0);
        assert_eq!(fake().call_count("cuLaunchHostFunc"), 4);

        // The fault was for one call each time: the next launch works.
        let drops = Drops::new();
        let (owner, counter) = (drops.owner(), Arc::clone(&ran));
        host_launch(&stream, move || {
            let _keep = &owner;
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
        stream.synchronize().unwrap();
        drops.wait_dropped(1);
        assert_eq!(ran.load(Ordering::SeqCst), 1, "a refused closure ran");
        assert_eq!(RUNS.load(Ordering::SeqCst), 0, "a refused function ran");
        assert_eq!(fake().driver_thread_call_count(""), 0);
    }

    /// `FAKE_CUDA_FAIL=cuLaunchHostFunc@2=2`: only the second launch of the process fails, and
    /// only its owners are handed back (alive while the launch before it is held, until the caller
    /// drops them); the others run and are released as usual.
    fn only_the_launch_the_driver_refuses_fails(FAKE_CUDA_FAIL = "cuLaunchHostFunc@2=2") {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let ran = Arc::new(AtomicUsize::new(0));
        let all = Drops::new();
        let mut results = Vec::new();
        for _ in 0..3 {
            let (owner, counter) = (all.owner(), Arc::clone(&ran));
            let result = host_launch(&stream, move || {
                let _keep = &owner;
                counter.fetch_add(1, Ordering::SeqCst);
            });
            results.push((result, all.dropped()));
        }
        let mut results = results.into_iter();
        let (first, dropped) = results.next().unwrap();
        assert!(first.is_ok() && dropped == 0, "{first:?}");
        let (second, dropped) = results.next().unwrap();
        assert_eq!(dropped, 0, "the refused launch's owner was dropped by the crate");
        let (third, dropped) = results.next().unwrap();
        assert!(third.is_ok() && dropped == 0, "{third:?}");
        // Handed back: alive, with the first launch still held, until this thread drops it.
        let (second, owner) = second.expect_err("the second launch fails").into_parts();
        assert!(owner.is_some(), "not handed back");
        assert_eq!(all.dropped(), 0);
        drop(owner);
        assert_driver_error(Err(second), CUresult::CUDA_ERROR_OUT_OF_MEMORY, "cuLaunchHostFunc");
        assert_eq!(all.dropped(), 1);
        assert!(all.records()[0].thread.same_as(&ThreadInfo::current()));

        hold.release();
        stream.synchronize().unwrap();
        all.wait_dropped(3);
        assert_eq!(ran.load(Ordering::SeqCst), 2);
        assert_eq!(all.live(), 0);
    }

    /// After a sticky error (a trapped kernel), launches still succeed but their functions never
    /// run, as the driver does; synchronizing reports the error, and `flush` does not wait for
    /// the host functions that will never run. Their owners are never released: a documented
    /// limit (DESIGN.md, "Limits that follow from the driver"), pinned here so that lifting it
    /// updates this test.
    fn after_a_sticky_error_functions_never_run_and_flush_does_not_wait_for_them() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        let drops = Drops::new();
        let ran = Arc::new(AtomicUsize::new(0));
        let launch = |drops: &Arc<Drops>| {
            let (owner, counter) = (drops.owner(), Arc::clone(&ran));
            host_launch(&stream, move || {
                let _keep = &owner;
                counter.fetch_add(1, Ordering::SeqCst);
            })
        };
        launch(&drops).unwrap();
        assert_eq!(fake().poison_context(context.raw()), Ok(()));
        launch(&drops).unwrap();
        hold.release();
        let err = stream.synchronize().unwrap_err();
        assert_eq!(err.cuda_code(), Some(CUresult::CUDA_ERROR_LAUNCH_FAILED));
        cuda_host_launch::flush(std::time::Duration::from_secs(1)).unwrap();
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        assert_eq!(fake().pending_host_functions(context.raw()), 0);
        assert_eq!(drops.dropped(), 0, "the limit was lifted: update this test and DESIGN.md");
    }

    /// A null function pointer is refused before anything reaches the driver, by every raw entry
    /// point, with the owners handed back.
    fn a_null_function_is_refused_without_a_driver_call_and_its_owners_are_handed_back() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        let graph = Graph::new().unwrap();
        let options = LaunchOptions::default();
        let drops = Drops::new();
        let calls_before = fake().call_count("cuLaunchHostFunc");
        let null = ptr::null_mut();

        // SAFETY: a null function is refused before anything could call it.
        let results = unsafe {
            [
                launch_host_function(&stream, None, null, drops.owner()),
                options.launch_host_function(&stream, None, null, drops.owner()),
                options.launch_host_function_repeatable(&stream, None, null, drops.owner()),
                options.add_host_node_raw(graph.raw(), &[], None, null, drops.owner()).map(|_| ()),
            ]
        };
        assert_eq!(drops.dropped(), 0, "the crate dropped what it refused");
        for result in results {
            let error = result.expect_err("refused");
            assert!(error.is_handed_back(), "{error:?}");
            assert!(matches!(error.error(), Error::NullFunction), "{error:?}");
        }
        assert_dropped_here(&drops, 4);
        // SAFETY: as above.
        let bytes = unsafe { launch_host_function_with_bytes(&stream, None, &[1, 2, 3]) };
        assert!(matches!(bytes, Err(Error::NullFunction)), "{bytes:?}");
        assert_eq!(fake().call_count("cuLaunchHostFunc"), calls_before);
        assert_eq!(fake().call_count("cuUserObjectCreate"), 0);
        assert_eq!(fake().call_count("cuGraphAddHostNode"), 0);
        assert!(graph.nodes().unwrap().is_empty());
    }

    /// A default-stream handle on a thread with no current context: every launch, release and
    /// completion says so and what to do (not "cuStreamGetCaptureInfo failed"), with the owners
    /// dropped on the caller's thread; the same calls on a `Stream` from that thread work.
    fn a_default_stream_handle_with_no_current_context_says_to_make_one_current() {
        let context = fake_primary_context();
        let stream = Stream::new(&context).unwrap();
        std::thread::scope(|scope| {
            scope.spawn(|| {
                let drops = Drops::new();
                let legacy = cuda_host_launch::RawStream::LEGACY;
                let owner = drops.owner();
                // SAFETY: `count_run` ignores its argument and does not unwind.
                let raw = unsafe {
                    launch_host_function(legacy, Some(count_run), ptr::null_mut(), drops.owner())
                };
                // Each hands its value back; converted to `Error`, the value is dropped here.
                let results: [Result<(), Error>; 6] = [
                    host_launch(legacy, move || {
                        let _keep = &owner;
                    })
                    .map_err(Error::from),
                    raw.map_err(Error::from),
                    cuda_host_launch::release_after(legacy, drops.owner()).map_err(Error::from),
                    cuda_host_launch::spawn_after(legacy, || ()).map_err(Error::from),
                    cuda_host_launch::completion(legacy).map(drop),
                    cuda_host_launch::host_launch_async(legacy, || ())
                        .map(drop)
                        .map_err(Error::from),
                ];
                for result in results {
                    let error = result.expect_err("no context is current");
                    assert!(
                        matches!(error, Error::NoCurrentContext { stream: 1, .. }),
                        "{error:?}"
                    );
                    assert_eq!(error.cuda_code(), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
                    let message = error.to_string();
                    assert!(message.contains("Make a context current"), "{message}");
                    assert!(message.contains("pass a Stream"), "{message}");
                }
                assert_dropped_here(&drops, 3);
                // The same thread, still with no context current, with a `Stream`.
                cuda_host_launch::release_after(&stream, drops.owner()).unwrap();
                cuda_host_launch::spawn_after(&stream, || ()).unwrap();
                stream.synchronize().unwrap();
                cuda_host_launch::flush(std::time::Duration::from_secs(10)).unwrap();
                drops.wait_dropped(4);
            });
        });
    }
}
