//! The fake driver models what the host-function tests rely on, as measured on a real driver: one
//! driver thread per context, stream destruction and context teardown with pending work, sticky
//! errors, capture into graphs and replay, user objects, and `cuGetProcAddress`'s answers. These
//! pin the fake's behaviour down; they say nothing about `cuda-sys` beyond using it.

use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

use cuda_sys::types::{
    CUDA_HOST_NODE_PARAMS, CUcontext, CUdevice, CUdeviceptr, CUdriverProcAddressQueryResult,
    CUevent, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphNode, CUgraphNodeType, CUresult,
    CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, CUuserObject, cuuint64_t,
};
use cuda_sys::{DefaultStream, Driver, Error, Function, MissingReason};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::bump;
use cuda_workspace::testing::{current_primary_context, fake, load_fake_driver, os_thread};

const WAIT: Duration = Duration::from_secs(10);
const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;

fn data<T>(value: &T) -> *mut c_void {
    ptr::from_ref(value).cast_mut().cast()
}

/// Appends a tag to a shared log: `data` points at a `Tagged`.
struct Tagged {
    log: &'static Mutex<Vec<u8>>,
    tag: u8,
}

unsafe extern "C" fn log_tag(data: *mut c_void) {
    // SAFETY: every use passes a pointer to a `Tagged` that outlives the call.
    let tagged = unsafe { &*data.cast::<Tagged>() };
    tagged.log.lock().unwrap().push(tagged.tag);
}

fn new_stream(driver: &Driver) -> CUstream {
    let mut stream: CUstream = ptr::null_mut();
    // SAFETY: `stream` is a valid out-pointer.
    unsafe { driver.cuStreamCreate(&mut stream, 0).unwrap() };
    stream
}

fn code(result: Result<(), impl Into<Error>>) -> Option<CUresult> {
    result
        .err()
        .map(|e| e.into().code().expect("a driver error"))
}

fn capture_status(driver: &Driver, stream: CUstream) -> CUstreamCaptureStatus {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `status` is a valid out-pointer; `stream` is live.
    unsafe { driver.cuStreamIsCapturing(stream, &mut status).unwrap() };
    status
}

fn capture_id(driver: &Driver, stream: CUstream) -> cuuint64_t {
    let mut id = 0;
    let null = ptr::null_mut();
    // SAFETY: `id` is a valid out-pointer; the others are null (optional).
    unsafe {
        driver
            .cuStreamGetCaptureInfo(
                stream,
                null,
                &mut id,
                null.cast(),
                null.cast(),
                null.cast(),
                null.cast(),
            )
            .unwrap()
    };
    id
}

fn host_node_count(driver: &Driver, graph: CUgraph) -> usize {
    let mut n = 0;
    // SAFETY: `n` is a valid out-pointer; a null array asks for the count.
    unsafe {
        driver
            .cuGraphGetNodes(graph, ptr::null_mut(), &mut n)
            .unwrap()
    };
    n
}

fn instantiate(driver: &Driver, graph: CUgraph) -> CUgraphExec {
    let mut exec: CUgraphExec = ptr::null_mut();
    // SAFETY: `exec` is a valid out-pointer; `graph` is live.
    unsafe {
        driver
            .cuGraphInstantiateWithFlags(&mut exec, graph, 0)
            .unwrap()
    };
    exec
}

static DESTROYED_ON: Mutex<Vec<String>> = Mutex::new(Vec::new());

unsafe extern "C" fn record_destroy(data: *mut c_void) {
    // SAFETY: every user object below is created with a pointer to a live `AtomicUsize`.
    unsafe { &*data.cast::<AtomicUsize>() }.fetch_add(1, Ordering::SeqCst);
    DESTROYED_ON.lock().unwrap().push(os_thread().0);
}

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`.
const NO_DESTRUCTOR_SYNC: u32 = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const MOVE: u32 = 1;

isolated_test! {
    /// `cuStreamDestroy` returns at once; the stream's pending host function still runs.
    fn stream_destroy_returns_at_once_and_pending_work_still_runs() {
        let driver = load_fake_driver();
        let context = current_primary_context(driver);
        let stream = new_stream(driver);
        let count = AtomicUsize::new(0);
        let hold = fake().hold_stream(stream);
        assert_ne!(hold, 0);
        // SAFETY: `count` outlives the wait below.
        unsafe {
            driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap();
            driver.cuStreamDestroy(stream).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 0);
        assert_eq!(fake().pending_host_functions(context), 1);
        // SAFETY: a destroyed handle is reported, not used.
        assert_eq!(code(unsafe { driver.cuStreamQuery(stream) }), Some(CUresult::CUDA_ERROR_INVALID_HANDLE));

        fake().release_hold(hold);
        fake().wait_until("the host function", WAIT, || count.load(Ordering::SeqCst) == 1);
        fake().wait_until("nothing pending", WAIT, || fake().pending_host_functions(context) == 0);
    }

    /// `cuCtxDestroy` first runs the context's pending host functions, then returns; its driver
    /// thread is gone, and so are its streams.
    fn context_destroy_runs_pending_host_functions_first() {
        let driver = load_fake_driver();
        let mut context: CUcontext = ptr::null_mut();
        // SAFETY: valid out-pointer; the creation parameters are optional.
        unsafe { driver.cuCtxCreate(&mut context, ptr::null_mut(), 0, 0).unwrap() };
        let stream = new_stream(driver);
        let count = AtomicUsize::new(0);
        let hold = fake().hold_stream(stream);
        // SAFETY: `count` outlives the destroy below.
        unsafe { driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap() };
        assert_eq!(fake().driver_thread_count(), 1);
        let releaser = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            fake().release_hold(hold);
        });
        // SAFETY: `context` is live and not used afterwards.
        unsafe { driver.cuCtxDestroy(context).unwrap() };
        assert_eq!(count.load(Ordering::SeqCst), 1);
        assert_eq!(fake().driver_thread_count(), 0);
        releaser.join().unwrap();

        let mut current: CUcontext = ptr::null_mut();
        // SAFETY: valid out-pointer; the stale stream handle is reported, not used.
        unsafe {
            driver.cuCtxGetCurrent(&mut current).unwrap();
            assert!(current.is_null());
            assert_eq!(code(driver.cuCtxDestroy(context)), Some(CUresult::CUDA_ERROR_INVALID_CONTEXT));
            assert_eq!(code(driver.cuStreamQuery(stream)), Some(CUresult::CUDA_ERROR_INVALID_HANDLE));
        }
    }

    /// After a sticky error, pending and later host functions never run, launches still succeed,
    /// and synchronize/query report 719. The last release of the primary context clears it.
    fn a_sticky_error_stops_host_functions() {
        let driver = load_fake_driver();
        let context = current_primary_context(driver);
        let stream = new_stream(driver);
        let count = AtomicUsize::new(0);
        let hold = fake().hold_stream(stream);
        // SAFETY: `count` outlives every use below (the functions never run anyway).
        unsafe {
            driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap();
            driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap();
        }
        assert_eq!(fake().pending_host_functions(context), 2);
        assert_eq!(fake().poison_context(context), CUresult::CUDA_SUCCESS);
        assert_eq!(fake().pending_host_functions(context), 0);
        fake().release_hold(hold);
        // SAFETY: `stream` is live.
        unsafe {
            driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap();
            let err = driver.cuStreamSynchronize(stream).unwrap_err();
            assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_LAUNCH_FAILED));
            assert!(err.to_string().contains("CUDA_ERROR_LAUNCH_FAILED"), "{err}");
            assert_eq!(code(driver.cuStreamQuery(stream)), Some(CUresult::CUDA_ERROR_LAUNCH_FAILED));
            assert_eq!(code(driver.cuCtxSynchronize()), Some(CUresult::CUDA_ERROR_LAUNCH_FAILED));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(count.load(Ordering::SeqCst), 0);

        let mut device: CUdevice = 0;
        // SAFETY: valid out-pointers; the context was retained once.
        unsafe {
            driver.cuCtxGetDevice(&mut device).unwrap();
            driver.cuDevicePrimaryCtxRelease(device).unwrap();
        }
        let again = current_primary_context(driver);
        assert_eq!(again, context, "the primary context keeps its handle");
        let stream = new_stream(driver);
        // SAFETY: `count` outlives the synchronize.
        unsafe {
            driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap();
            driver.cuStreamSynchronize(stream).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// Under capture, `cuLaunchHostFunc` adds one host node (and runs nothing); the graph runs it
    /// on every launch.
    fn a_captured_host_function_runs_on_every_launch() {
        let driver = load_fake_driver();
        let context = current_primary_context(driver);
        let stream = new_stream(driver);
        let count = AtomicUsize::new(0);
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: valid out-pointers; `count` outlives every launch.
        unsafe {
            driver.cuStreamBeginCapture(stream, GLOBAL).unwrap();
            driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap();
            assert_eq!(capture_status(driver, stream), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE);

            let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
            let (mut id, mut capturing_graph) = (0, ptr::null_mut());
            let mut deps: *const CUgraphNode = ptr::null();
            let mut edges: *const CUgraphEdgeData = ptr::null();
            let mut n = 0;
            driver
                .cuStreamGetCaptureInfo(stream, &mut status, &mut id, &mut capturing_graph, &mut deps, &mut edges, &mut n)
                .unwrap();
            assert_eq!(status, CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE);
            assert!(id != 0 && !capturing_graph.is_null());
            assert_eq!(n, 1);
            let mut node_type = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            driver.cuGraphNodeGetType(*deps, &mut node_type).unwrap();
            assert_eq!(node_type, CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST);
            let mut params = CUDA_HOST_NODE_PARAMS { fn_: None, userData: ptr::null_mut() };
            driver.cuGraphHostNodeGetParams(*deps, &mut params).unwrap();
            assert_eq!(params.fn_.map(|f| f as usize), Some(bump as HostFn as usize));
            assert_eq!(params.userData, data(&count));
            assert_eq!(fake().pending_host_functions(context), 0);

            driver.cuStreamEndCapture(stream, &mut graph).unwrap();
            assert_eq!(graph, capturing_graph);
            assert_eq!(capture_status(driver, stream), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        }
        assert_eq!(host_node_count(driver, graph), 1);
        assert_eq!(count.load(Ordering::SeqCst), 0);
        let exec = instantiate(driver, graph);
        // SAFETY: handles from the driver; `count` outlives the synchronize.
        unsafe {
            for _ in 0..3 {
                driver.cuGraphLaunch(exec, stream).unwrap();
            }
            driver.cuStreamSynchronize(stream).unwrap();
            driver.cuGraphExecDestroy(exec).unwrap();
            driver.cuGraphDestroy(graph).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    /// `cuStreamAddCallback` cannot be captured: 900, the capture is invalidated, and ending it
    /// gives 901 and no graph.
    fn a_stream_callback_invalidates_a_capture() {
        let driver = load_fake_driver();
        let _context = current_primary_context(driver);
        let stream = new_stream(driver);
        let count = AtomicUsize::new(0);
        unsafe extern "C" fn callback(_: CUstream, _: CUresult, data: *mut c_void) {
            // SAFETY: as for `bump`.
            unsafe { bump(data) };
        }
        let mut graph: CUgraph = ptr::dangling_mut();
        // SAFETY: valid out-pointers; `count` outlives the synchronize.
        unsafe {
            driver.cuStreamBeginCapture(stream, GLOBAL).unwrap();
            let err = driver.cuStreamAddCallback(stream, Some(callback), data(&count), 0).unwrap_err();
            assert_eq!(err.code(), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
            assert_eq!(capture_status(driver, stream), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED);
            assert_eq!(
                code(driver.cuLaunchHostFunc(stream, Some(bump), data(&count))),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            );
            assert_eq!(
                code(driver.cuStreamEndCapture(stream, &mut graph)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            );
            assert!(graph.is_null());
            assert_eq!(capture_status(driver, stream), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);

            driver.cuStreamAddCallback(stream, Some(callback), data(&count), 0).unwrap();
            driver.cuStreamSynchronize(stream).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// A stream that waits on an event recorded in a capture joins it (same id); its work
    /// depends on the origin's, and ending the capture on the origin ends it for both.
    fn a_stream_forked_into_a_capture_joins_it() {
        static LOG: Mutex<Vec<u8>> = Mutex::new(Vec::new());
        let driver = load_fake_driver();
        let _context = current_primary_context(driver);
        let (origin, fork) = (new_stream(driver), new_stream(driver));
        let tags: Vec<Tagged> = (b'A'..=b'C').map(|tag| Tagged { log: &LOG, tag }).collect();
        let (mut forked, mut joined): (CUevent, CUevent) = (ptr::null_mut(), ptr::null_mut());
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: valid out-pointers; `tags` outlive the launch's synchronize.
        unsafe {
            driver.cuEventCreate(&mut forked, 0).unwrap();
            driver.cuEventCreate(&mut joined, 0).unwrap();
            driver.cuStreamBeginCapture(origin, GLOBAL).unwrap();
            driver.cuLaunchHostFunc(origin, Some(log_tag), data(&tags[0])).unwrap();
            driver.cuEventRecord(forked, origin).unwrap();
            driver.cuStreamWaitEvent(fork, forked, 0).unwrap();
            assert_eq!(capture_status(driver, fork), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE);
            assert_eq!(capture_id(driver, fork), capture_id(driver, origin));
            driver.cuLaunchHostFunc(fork, Some(log_tag), data(&tags[1])).unwrap();
            driver.cuEventRecord(joined, fork).unwrap();
            driver.cuStreamWaitEvent(origin, joined, 0).unwrap();
            driver.cuLaunchHostFunc(origin, Some(log_tag), data(&tags[2])).unwrap();
            assert_eq!(
                code(driver.cuStreamEndCapture(fork, &mut graph)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
            );
            driver.cuStreamEndCapture(origin, &mut graph).unwrap();
            assert_eq!(capture_status(driver, fork), CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE);
        }
        assert_eq!(host_node_count(driver, graph), 3);
        assert!(LOG.lock().unwrap().is_empty());
        let exec = instantiate(driver, graph);
        // SAFETY: handles from the driver.
        unsafe {
            driver.cuGraphLaunch(exec, origin).unwrap();
            driver.cuStreamSynchronize(origin).unwrap();
        }
        assert_eq!(*LOG.lock().unwrap(), b"ABC");
    }

    /// A user object's destructor runs once, on a thread that is not the caller's, after the
    /// last reference is gone: the graph's (moved from the caller), the executable graph's, and
    /// that of a launch still in flight. A clone holds references of its own.
    fn user_objects_are_destroyed_off_thread_after_the_last_reference() {
        let driver = load_fake_driver();
        let _context = current_primary_context(driver);
        let stream = new_stream(driver);
        let (ran, destroyed) = (AtomicUsize::new(0), AtomicUsize::new(0));
        let mut object: CUuserObject = ptr::null_mut();
        let mut graph: CUgraph = ptr::null_mut();
        let mut node: CUgraphNode = ptr::null_mut();
        let params = CUDA_HOST_NODE_PARAMS { fn_: Some(bump), userData: data(&ran) };
        // SAFETY: valid out-pointers; `ran` and `destroyed` outlive every wait below.
        unsafe {
            driver
                .cuUserObjectCreate(&mut object, data(&destroyed), Some(record_destroy), 1, NO_DESTRUCTOR_SYNC)
                .unwrap();
            driver.cuGraphCreate(&mut graph, 0).unwrap();
            driver.cuGraphAddHostNode(&mut node, graph, ptr::null(), 0, &params).unwrap();
            driver.cuGraphRetainUserObject(graph, object, 1, MOVE).unwrap();
        }
        assert_eq!(fake().live_user_objects(), 1);
        let exec = instantiate(driver, graph);
        let hold = fake().hold_stream(stream);
        // SAFETY: handles from the driver.
        unsafe {
            driver.cuGraphDestroy(graph).unwrap();
            driver.cuGraphLaunch(exec, stream).unwrap();
            driver.cuGraphExecDestroy(exec).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(destroyed.load(Ordering::SeqCst), 0, "destroyed while a launch was in flight");
        assert_eq!(fake().live_user_objects(), 1);
        fake().release_hold(hold);
        fake().wait_until("the destructor", WAIT, || fake().live_user_objects() == 0);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        assert_eq!(destroyed.load(Ordering::SeqCst), 1);
        let on = DESTROYED_ON.lock().unwrap()[0].clone();
        assert_ne!(on, os_thread().0, "the destructor ran on the caller's thread");

        // A clone retains the graph's references; each graph releases its own.
        let (mut original, mut clone): (CUgraph, CUgraph) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: valid out-pointers; handles from the driver.
        unsafe {
            driver
                .cuUserObjectCreate(&mut object, data(&destroyed), Some(record_destroy), 1, NO_DESTRUCTOR_SYNC)
                .unwrap();
            driver.cuGraphCreate(&mut original, 0).unwrap();
            driver.cuGraphRetainUserObject(original, object, 1, 0).unwrap();
            driver.cuUserObjectRelease(object, 1).unwrap();
            driver.cuGraphClone(&mut clone, original).unwrap();
            driver.cuGraphDestroy(original).unwrap();
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(fake().live_user_objects(), 1);
        // SAFETY: `clone` is live.
        unsafe { driver.cuGraphDestroy(clone).unwrap() };
        fake().wait_until("the second destructor", WAIT, || fake().live_user_objects() == 0);
        assert_eq!(destroyed.load(Ordering::SeqCst), 2);
    }

    /// One driver thread per context, started by its first work, ended by its destruction.
    fn each_context_has_one_driver_thread() {
        let driver = load_fake_driver();
        let count = AtomicUsize::new(0);
        let mut contexts = Vec::new();
        for _ in 0..2 {
            let mut context: CUcontext = ptr::null_mut();
            // SAFETY: valid out-pointer; the new context becomes current.
            unsafe { driver.cuCtxCreate(&mut context, ptr::null_mut(), 0, 0).unwrap() };
            assert_eq!(fake().driver_thread_count(), contexts.len() as u64);
            let stream = new_stream(driver);
            // SAFETY: `count` outlives the synchronize.
            unsafe {
                driver.cuLaunchHostFunc(stream, Some(bump), data(&count)).unwrap();
                driver.cuStreamSynchronize(stream).unwrap();
            }
            contexts.push(context);
        }
        assert_eq!(fake().driver_thread_count(), 2);
        for context in contexts {
            // SAFETY: each context is live and not used afterwards.
            unsafe { driver.cuCtxDestroy(context).unwrap() };
        }
        assert_eq!(fake().driver_thread_count(), 0);
        assert_eq!(count.load(Ordering::SeqCst), 2);
    }

    /// A host function may enqueue more work (it runs after it), but synchronizing its own
    /// context from the driver thread is refused (800) rather than deadlocking.
    fn a_host_function_can_enqueue_but_not_synchronize() {
        struct Chain {
            stream: CUstream,
            count: AtomicUsize,
            synchronize: AtomicU32,
        }
        unsafe extern "C" fn first(data: *mut c_void) {
            // SAFETY: the launch below passes a pointer to a `Chain` that outlives the synchronize.
            let chain = unsafe { &*data.cast::<Chain>() };
            let driver = Driver::get().unwrap();
            // SAFETY: `chain.stream` is live; `chain.count` outlives the synchronize.
            unsafe {
                driver
                    .cuLaunchHostFunc(chain.stream, Some(bump), ptr::from_ref(&chain.count).cast_mut().cast())
                    .unwrap();
                let code = driver.cuStreamSynchronize(chain.stream).err().and_then(|e| e.code());
                chain.synchronize.store(code.map_or(0, |c| c.0), Ordering::SeqCst);
            }
        }
        let driver = load_fake_driver();
        let _context = current_primary_context(driver);
        let chain = Chain {
            stream: new_stream(driver),
            count: AtomicUsize::new(0),
            synchronize: AtomicU32::new(u32::MAX),
        };
        // SAFETY: `chain` outlives the synchronize.
        unsafe {
            driver.cuLaunchHostFunc(chain.stream, Some(first), data(&chain)).unwrap();
            driver.cuStreamSynchronize(chain.stream).unwrap();
        }
        assert_eq!(chain.count.load(Ordering::SeqCst), 1);
        assert_eq!(chain.synchronize.load(Ordering::SeqCst), CUresult::CUDA_ERROR_NOT_PERMITTED.0);
    }

    /// Events order streams: a wait holds a stream until the record is reached, and a value
    /// write lands in host-mapped memory when its turn comes.
    fn events_and_value_writes_follow_stream_order() {
        let driver = load_fake_driver();
        let _context = current_primary_context(driver);
        let (first, second) = (new_stream(driver), new_stream(driver));
        let mut event: CUevent = ptr::null_mut();
        let mut host: *mut c_void = ptr::null_mut();
        let mut device: CUdeviceptr = 0;
        // SAFETY: valid out-pointers.
        unsafe {
            driver.cuEventCreate(&mut event, 0).unwrap();
            driver.cuMemHostAlloc(&mut host, 64, 0).unwrap();
            driver.cuMemHostGetDevicePointer(&mut device, host, 0).unwrap();
        }
        assert_eq!(device, host as CUdeviceptr);
        // SAFETY: `host` is 64 zeroed bytes, 4-aligned, alive until freed below.
        let flag = unsafe { AtomicU32::from_ptr(host.cast()) };
        let hold = fake().hold_stream(first);
        // SAFETY: handles and memory from the driver.
        unsafe {
            driver.cuEventRecord(event, first).unwrap();
            driver.cuStreamWaitEvent(second, event, 0).unwrap();
            driver.cuStreamWriteValue32(second, device, 7, 0).unwrap();
            assert_eq!(code(driver.cuEventQuery(event)), Some(CUresult::CUDA_ERROR_NOT_READY));
            assert_eq!(code(driver.cuStreamQuery(second)), Some(CUresult::CUDA_ERROR_NOT_READY));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(flag.load(Ordering::Acquire), 0);
        fake().release_hold(hold);
        // SAFETY: handles and memory from the driver; `flag` is not used after the free.
        unsafe {
            driver.cuStreamSynchronize(second).unwrap();
            assert_eq!(flag.load(Ordering::Acquire), 7);
            driver.cuEventSynchronize(event).unwrap();
            driver.cuEventQuery(event).unwrap();
            driver.cuEventDestroy(event).unwrap();
            driver.cuMemFreeHost(host).unwrap();
        }
    }

    /// Device memory is host memory: copies and sets round-trip; modules are not supported.
    fn memory_round_trips_and_modules_are_not_supported() {
        let driver = load_fake_driver();
        let _context = current_primary_context(driver);
        let mut device: CUdeviceptr = 0;
        let input: Vec<u8> = (0..32).collect();
        let mut output = vec![0u8; 32];
        // SAFETY: valid out-pointers and buffers of 32 bytes.
        unsafe {
            driver.cuMemAlloc(&mut device, 32).unwrap();
            driver.cuMemcpyHtoD(device, input.as_ptr().cast(), 32).unwrap();
            driver.cuMemsetD8(device + 8, 0xff, 4).unwrap();
            driver.cuMemcpyDtoH(output.as_mut_ptr().cast(), device, 32).unwrap();
            assert_eq!(code(driver.cuMemcpyDtoH(output.as_mut_ptr().cast(), device, 33)), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
            driver.cuMemFree(device).unwrap();
            let mut module = ptr::null_mut();
            assert_eq!(code(driver.cuModuleLoadData(&mut module, c"".as_ptr().cast())), Some(CUresult::CUDA_ERROR_NOT_SUPPORTED));
        }
        let mut expected = input.clone();
        expected[8..12].fill(0xff);
        assert_eq!(output, expected);
    }

    /// `cuGetProcAddress_v2` answers as the real driver does: a version above the driver's is
    /// rejected with nothing written; a symbol only in newer variants is "version not
    /// sufficient"; an unknown one "not found"; otherwise the newest variant at most the version
    /// asked for, per-thread where asked. `cuGetProcAddress` (v1) says `CUDA_ERROR_NOT_FOUND`.
    fn cu_get_proc_address_answers_like_the_real_driver() {
        let driver = load_fake_driver();
        let missing = |symbol: &str, version: u32| match driver.get_proc_address(symbol, version, DefaultStream::Legacy) {
            Err(Error::SymbolMissing { reason, .. }) => reason,
            other => panic!("{symbol} at {version}: {other:?}"),
        };
        assert_eq!(missing("cuLaunchHostFunc", 13010), MissingReason::Rejected);
        assert_eq!(missing("cuStreamGetCaptureInfo", 10000), MissingReason::VersionNotSufficient);
        assert_eq!(missing("cuNoSuchFunction", 2000), MissingReason::NotFound);

        let found = |symbol: &str, version: u32, mode| {
            driver.get_proc_address(symbol, version, mode).unwrap().addr().get()
        };
        let export = |name: &str| fake().export_address(name).unwrap();
        use DefaultStream::{Legacy, PerThread};
        assert_eq!(found("cuStreamGetCaptureInfo", 10010, Legacy), export("cuStreamGetCaptureInfo"));
        assert_eq!(found("cuStreamGetCaptureInfo", 11080, Legacy), export("cuStreamGetCaptureInfo_v2"));
        assert_eq!(found("cuStreamGetCaptureInfo", 13000, Legacy), export("cuStreamGetCaptureInfo_v3"));
        assert_eq!(found("cuStreamGetCaptureInfo", 12030, PerThread), export("cuStreamGetCaptureInfo_v3_ptsz"));
        assert_eq!(found("cuLaunchHostFunc", 13000, PerThread), export("cuLaunchHostFunc_ptsz"));
        assert_eq!(found("cuCtxCreate", 12000, Legacy), export("cuCtxCreate_v3"));
        assert_eq!(found("cuGraphAddNode", 12030, Legacy), export("cuGraphAddNode_v2"));

        type GetProcAddressV2 = unsafe extern "C" fn(
            *const std::ffi::c_char,
            *mut *mut c_void,
            c_int,
            cuuint64_t,
            *mut CUdriverProcAddressQueryResult,
        ) -> CUresult;
        type GetProcAddress =
            unsafe extern "C" fn(*const std::ffi::c_char, *mut *mut c_void, c_int, cuuint64_t) -> CUresult;
        // SAFETY: these exports have these signatures (PFN_cuGetProcAddress_v12000 / _v11030).
        let (v2, v1) = unsafe {
            (
                std::mem::transmute::<usize, GetProcAddressV2>(export("cuGetProcAddress_v2")),
                std::mem::transmute::<usize, GetProcAddress>(export("cuGetProcAddress")),
            )
        };
        let sentinel = ptr::dangling_mut::<c_void>();
        let mut pfn = sentinel;
        let mut status = CUdriverProcAddressQueryResult(77);
        // SAFETY: NUL-terminated names and valid out-pointers.
        unsafe {
            assert_eq!(v2(c"cuLaunchHostFunc".as_ptr(), &mut pfn, 13010, 1, &mut status), CUresult::CUDA_ERROR_INVALID_VALUE);
            assert_eq!((pfn, status), (sentinel, CUdriverProcAddressQueryResult(77)), "written on rejection");
            assert_eq!(v2(c"cuNoSuchFunction".as_ptr(), &mut pfn, 13000, 1, &mut status), CUresult::CUDA_SUCCESS);
            assert_eq!(status, CUdriverProcAddressQueryResult::CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
            assert!(pfn.is_null());
            assert_eq!(v1(c"cuNoSuchFunction".as_ptr(), &mut pfn, 13000, 1), CUresult::CUDA_ERROR_NOT_FOUND);
            assert_eq!(v1(c"cuStreamGetCaptureInfo".as_ptr(), &mut pfn, 10000, 1), CUresult::CUDA_ERROR_NOT_FOUND);
            assert_eq!(v1(c"cuMemAlloc".as_ptr(), &mut pfn, 11080, 1), CUresult::CUDA_SUCCESS);
            assert_eq!(pfn.addr(), export("cuMemAlloc_v2"));
        }
    }

    /// Every entry of cuda-sys's table that the fake implements resolves to the export the table
    /// names for it (and its per-thread twin), so the fake's variant table agrees with
    /// `functions.rs` on versions and export names.
    fn every_implemented_table_entry_resolves_to_its_export(FAKE_CUDA_VERSION = "13050") {
        let driver = load_fake_driver();
        let export = |name: &std::ffi::CStr| fake().export_address(name.to_str().unwrap());
        let mut implemented = 0;
        for &function in Function::ALL {
            let info = function.info();
            let symbol = info.symbol.to_str().unwrap();
            let legacy = match driver.get_proc_address(symbol, info.version, DefaultStream::Legacy) {
                Ok(p) => p.addr().get(),
                // Not implemented (an older ABI variant the fake lacks is VersionNotSufficient).
                Err(Error::SymbolMissing {
                    reason: MissingReason::NotFound | MissingReason::VersionNotSufficient,
                    ..
                }) => {
                    assert_eq!(export(info.export), None, "{function}: exported but not in the fake's table");
                    continue;
                }
                Err(e) => panic!("{function}: {e}"),
            };
            implemented += 1;
            assert_eq!(Some(legacy), export(info.export), "{function}");
            let per_thread_version = info.per_thread_version.unwrap_or(info.version);
            let per_thread = driver
                .get_proc_address(symbol, per_thread_version, DefaultStream::PerThread)
                .unwrap()
                .addr()
                .get();
            match info.per_thread_export {
                Some(name) => assert_eq!(Some(per_thread), export(name), "{function}"),
                None => assert_eq!(per_thread, legacy, "{function}"),
            }
        }
        assert!(implemented >= 80, "only {implemented} entries");
    }
}

/// `bump` as a plain function pointer.
type HostFn = unsafe extern "C" fn(*mut c_void);
