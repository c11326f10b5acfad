//! Stream capture: host functions as host nodes, callbacks refused, forked streams, and the
//! capture-interaction modes (another thread's potentially unsafe call and a global capture).

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{
    CUDA_HOST_NODE_PARAMS, CUevent, CUgraph, CUgraphEdgeData, CUgraphExec, CUgraphNode,
    CUgraphNodeType, CUresult, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus, cuuint64_t,
};
use cuda_workspace::testing::bump;

use super::harness::{Cx, Log, Shared, Tagged, cases, code, data, leak, log_tag};

const GLOBAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
const THREAD_LOCAL: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL;
const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
const ACTIVE: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
const NONE: CUstreamCaptureStatus = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
const INVALIDATED: CUstreamCaptureStatus =
    CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED;

fn capture_status(driver: &Driver, stream: CUstream) -> CUstreamCaptureStatus {
    let mut status = NONE;
    // SAFETY: a valid out-pointer; a live stream.
    unsafe { driver.cuStreamIsCapturing(stream, &mut status) }.unwrap();
    status
}

fn capture_id(driver: &Driver, stream: CUstream) -> cuuint64_t {
    let (mut status, mut id) = (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, 0);
    let null: *mut c_void = ptr::null_mut();
    // SAFETY: `status` and `id` are valid out-pointers (the status is required: a null one is
    // `CUDA_ERROR_INVALID_VALUE`); the others are null (optional).
    unsafe {
        driver.cuStreamGetCaptureInfo(
            stream,
            &mut status,
            &mut id,
            null.cast(),
            null.cast(),
            null.cast(),
            null.cast(),
        )
    }
    .unwrap();
    id
}

fn node_count(driver: &Driver, graph: CUgraph) -> usize {
    let mut n = 0;
    // SAFETY: a null array asks for the count.
    unsafe { driver.cuGraphGetNodes(graph, ptr::null_mut(), &mut n) }.unwrap();
    n
}

fn instantiate(driver: &Driver, graph: CUgraph) -> CUgraphExec {
    let mut exec = ptr::null_mut();
    // SAFETY: a valid out-pointer; a live graph.
    unsafe { driver.cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.unwrap();
    exec
}

unsafe extern "C" fn callback(_: CUstream, _: CUresult, data: *mut c_void) {
    // SAFETY: as for `bump`: a live `AtomicUsize`.
    unsafe { bump(data) };
}

/// Thread A (the case's) captures a fresh stream in `mode`; thread B, in `b_mode` (its
/// interaction mode, exchanged first unless GLOBAL), calls `cuStreamQuery` on another, idle,
/// stream. Returns B's result and A's `cuStreamEndCapture` result.
fn another_thread_queries_during_a_capture(
    cx: &Cx,
    mode: CUstreamCaptureMode,
    b_mode: CUstreamCaptureMode,
) -> (Option<CUresult>, Option<CUresult>) {
    let (captured, other) = (cx.stream(), Shared(cx.stream()));
    let count = leak(AtomicUsize::new(0));
    // SAFETY: a live stream; `count` is leaked.
    unsafe {
        cx.driver.cuStreamBeginCapture(captured, mode).unwrap();
        cx.driver
            .cuLaunchHostFunc(captured, Some(bump), data(count))
            .unwrap();
    }
    let (driver, context) = (cx.driver, Shared(cx.context));
    let queried = std::thread::spawn(move || {
        let (other, context) = (other, context);
        // SAFETY: a live context and stream; a valid in/out mode.
        unsafe {
            driver.cuCtxSetCurrent(context.0).unwrap();
            if b_mode != GLOBAL {
                let mut exchanged = b_mode;
                driver
                    .cuThreadExchangeStreamCaptureMode(&mut exchanged)
                    .unwrap();
                assert_eq!(exchanged, GLOBAL, "a thread's mode starts GLOBAL");
            }
            code(driver.cuStreamQuery(other.0))
        }
    })
    .join()
    .unwrap();
    let mut graph: CUgraph = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    let ended = code(unsafe { cx.driver.cuStreamEndCapture(captured, &mut graph) });
    if ended.is_none() {
        assert_eq!(node_count(cx.driver, graph), 1);
        // SAFETY: the graph the capture made.
        unsafe { cx.driver.cuGraphDestroy(graph) }.unwrap();
    } else {
        assert!(graph.is_null());
    }
    (queried, ended)
}

cases! {
    /// `cuStreamGetCaptureInfo`'s status output is required: a null one is
    /// `CUDA_ERROR_INVALID_VALUE`, capturing or not; the other outputs are optional.
    fn the_capture_info_status_output_is_required(cx) {
        let stream = cx.stream();
        let null: *mut c_void = ptr::null_mut();
        let info = |status: *mut CUstreamCaptureStatus| {
            let mut id = 0;
            // SAFETY: a live stream; `id` is a valid out-pointer, `status` one or null.
            code(unsafe { cx.driver.cuStreamGetCaptureInfo(stream, status, &mut id, null.cast(), null.cast(), null.cast(), null.cast()) })
        };
        let mut status = ACTIVE;
        assert_eq!(info(ptr::null_mut()), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(info(&mut status), None);
        assert_eq!(status, NONE);
        // SAFETY: a live stream.
        unsafe { cx.driver.cuStreamBeginCapture(stream, GLOBAL) }.unwrap();
        assert_eq!(info(ptr::null_mut()), Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        assert_eq!(info(&mut status), None);
        assert_eq!(status, ACTIVE);
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: a valid out-pointer; the empty graph the capture made, destroyed once.
        unsafe {
            cx.driver.cuStreamEndCapture(stream, &mut graph).unwrap();
            cx.driver.cuGraphDestroy(graph).unwrap();
        }
    }

    /// Under capture `cuLaunchHostFunc` adds one host node with the function and data (and runs
    /// nothing); the capture info names the capture, its graph and that node; every launch of the
    /// executable graph runs the function.
    fn a_captured_host_function_is_a_host_node_run_by_every_launch(cx) {
        let stream = cx.stream();
        let count = leak(AtomicUsize::new(0));
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: valid out-pointers; `count` is leaked.
        unsafe {
            cx.driver.cuStreamBeginCapture(stream, GLOBAL).unwrap();
            cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count)).unwrap();
            assert_eq!(capture_status(cx.driver, stream), ACTIVE);
            let mut status = NONE;
            let (mut id, mut capturing_graph) = (0, ptr::null_mut());
            let mut deps: *const CUgraphNode = ptr::null();
            let mut edges: *const CUgraphEdgeData = ptr::null();
            let mut n = 0;
            cx.driver
                .cuStreamGetCaptureInfo(stream, &mut status, &mut id, &mut capturing_graph, &mut deps, &mut edges, &mut n)
                .unwrap();
            assert_eq!(status, ACTIVE);
            assert!(id != 0 && !capturing_graph.is_null());
            assert_eq!(n, 1);
            let mut node_type = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            cx.driver.cuGraphNodeGetType(*deps, &mut node_type).unwrap();
            assert_eq!(node_type, CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST);
            let mut params = CUDA_HOST_NODE_PARAMS { fn_: None, userData: ptr::null_mut() };
            cx.driver.cuGraphHostNodeGetParams(*deps, &mut params).unwrap();
            assert_eq!(params.fn_.map(|f| f as usize), Some(bump as unsafe extern "C" fn(*mut c_void) as usize));
            assert_eq!(params.userData, data(count));
            cx.driver.cuStreamEndCapture(stream, &mut graph).unwrap();
            assert_eq!(graph, capturing_graph);
            assert_eq!(capture_status(cx.driver, stream), NONE);
        }
        assert_eq!(node_count(cx.driver, graph), 1);
        assert_eq!(count.load(Ordering::SeqCst), 0);
        let exec = instantiate(cx.driver, graph);
        // SAFETY: handles from the driver.
        unsafe {
            for _ in 0..3 {
                cx.driver.cuGraphLaunch(exec, stream).unwrap();
            }
            cx.driver.cuStreamSynchronize(stream).unwrap();
            cx.driver.cuGraphExecDestroy(exec).unwrap();
            cx.driver.cuGraphDestroy(graph).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 3);
    }

    /// `cuStreamAddCallback` cannot be captured: `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, the
    /// capture is invalidated (later work: `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED`), and ending it
    /// gives `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and no graph. Outside a capture it works.
    fn a_stream_callback_invalidates_a_capture(cx) {
        let stream = cx.stream();
        let count = leak(AtomicUsize::new(0));
        let mut graph: CUgraph = ptr::dangling_mut();
        // SAFETY: valid out-pointers; `count` is leaked.
        unsafe {
            cx.driver.cuStreamBeginCapture(stream, GLOBAL).unwrap();
            assert_eq!(
                code(cx.driver.cuStreamAddCallback(stream, Some(callback), data(count), 0)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)
            );
            assert_eq!(capture_status(cx.driver, stream), INVALIDATED);
            assert_eq!(
                code(cx.driver.cuLaunchHostFunc(stream, Some(bump), data(count))),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            );
            assert_eq!(
                code(cx.driver.cuStreamEndCapture(stream, &mut graph)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            );
            assert!(graph.is_null());
            assert_eq!(capture_status(cx.driver, stream), NONE);
            cx.driver.cuStreamAddCallback(stream, Some(callback), data(count), 0).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
        }
        assert_eq!(count.load(Ordering::SeqCst), 1);
    }

    /// A stream that waits on an event recorded in a capture joins it (same id); its work depends
    /// on the origin's; ending the capture on the origin ends it for both.
    fn a_stream_forked_into_a_capture_joins_it(cx) {
        let (origin, fork) = (cx.stream(), cx.stream());
        let log = leak(Log::default());
        let (mut forked, mut joined): (CUevent, CUevent) = (ptr::null_mut(), ptr::null_mut());
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: valid out-pointers; the tags are leaked.
        unsafe {
            cx.driver.cuEventCreate(&mut forked, 0).unwrap();
            cx.driver.cuEventCreate(&mut joined, 0).unwrap();
            cx.driver.cuStreamBeginCapture(origin, GLOBAL).unwrap();
            cx.driver.cuLaunchHostFunc(origin, Some(log_tag), Tagged::data(log, b'A')).unwrap();
            cx.driver.cuEventRecord(forked, origin).unwrap();
            cx.driver.cuStreamWaitEvent(fork, forked, 0).unwrap();
            assert_eq!(capture_status(cx.driver, fork), ACTIVE);
            assert_eq!(capture_id(cx.driver, fork), capture_id(cx.driver, origin));
            cx.driver.cuLaunchHostFunc(fork, Some(log_tag), Tagged::data(log, b'B')).unwrap();
            cx.driver.cuEventRecord(joined, fork).unwrap();
            cx.driver.cuStreamWaitEvent(origin, joined, 0).unwrap();
            cx.driver.cuLaunchHostFunc(origin, Some(log_tag), Tagged::data(log, b'C')).unwrap();
            cx.driver.cuStreamEndCapture(origin, &mut graph).unwrap();
            assert_eq!(capture_status(cx.driver, fork), NONE);
        }
        assert_eq!(node_count(cx.driver, graph), 3);
        assert!(log.tags().is_empty());
        let exec = instantiate(cx.driver, graph);
        // SAFETY: handles from the driver.
        unsafe {
            cx.driver.cuGraphLaunch(exec, origin).unwrap();
            cx.driver.cuStreamSynchronize(origin).unwrap();
        }
        assert_eq!(log.tags(), b"ABC");
    }

    /// Ending a capture on a stream that joined it, not its origin, is refused
    /// (`CUDA_ERROR_STREAM_CAPTURE_UNMATCHED`) and invalidates the capture: ending it on the
    /// origin then returns `CUDA_ERROR_STREAM_CAPTURE_INVALIDATED` and no graph.
    fn ending_a_capture_on_a_joined_stream_is_refused_and_invalidates_it(cx) {
        let (origin, fork) = (cx.stream(), cx.stream());
        let (mut forked, mut joined): (CUevent, CUevent) = (ptr::null_mut(), ptr::null_mut());
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: valid out-pointers and live streams.
        unsafe {
            cx.driver.cuEventCreate(&mut forked, 0).unwrap();
            cx.driver.cuEventCreate(&mut joined, 0).unwrap();
            cx.driver.cuStreamBeginCapture(origin, GLOBAL).unwrap();
            cx.driver.cuEventRecord(forked, origin).unwrap();
            cx.driver.cuStreamWaitEvent(fork, forked, 0).unwrap();
            cx.driver.cuEventRecord(joined, fork).unwrap();
            cx.driver.cuStreamWaitEvent(origin, joined, 0).unwrap();
            assert_eq!(
                code(cx.driver.cuStreamEndCapture(fork, &mut graph)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNMATCHED)
            );
            assert_eq!(
                code(cx.driver.cuStreamEndCapture(origin, &mut graph)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            );
            assert!(graph.is_null());
            assert_eq!(capture_status(cx.driver, fork), NONE);
            assert_eq!(capture_status(cx.driver, origin), NONE);
        }
    }

    /// While thread A captures in `GLOBAL` mode, thread B (in its default, `GLOBAL`, interaction
    /// mode) calling `cuStreamQuery` on an unrelated stream gets
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`, and A's capture is invalidated.
    fn another_threads_unsafe_call_invalidates_a_global_capture(cx) {
        let unsupported = Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        let invalidated = Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
        assert_eq!(another_thread_queries_during_a_capture(cx, GLOBAL, GLOBAL), (unsupported, invalidated));
    }

    /// With A capturing in `THREAD_LOCAL` or `RELAXED` mode, B's call works and the capture
    /// survives.
    fn thread_local_and_relaxed_captures_ignore_other_threads(cx) {
        assert_eq!(another_thread_queries_during_a_capture(cx, THREAD_LOCAL, GLOBAL), (None, None));
        assert_eq!(another_thread_queries_during_a_capture(cx, RELAXED, GLOBAL), (None, None));
    }

    /// A thread that put itself in `RELAXED` mode (`cuThreadExchangeStreamCaptureMode`) may make
    /// the call during another thread's `GLOBAL` capture, which survives.
    fn a_relaxed_thread_does_not_break_a_global_capture(cx) {
        assert_eq!(another_thread_queries_during_a_capture(cx, GLOBAL, RELAXED), (None, None));
    }

    /// The capturing thread itself, in `GLOBAL` mode, may not make a potentially unsafe call
    /// (`cuStreamQuery` of another stream) while its `GLOBAL` capture runs: the call fails with
    /// `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` and the capture is invalidated.
    fn the_capturing_thread_is_prohibited_from_unsafe_calls(cx) {
        let (captured, other) = (cx.stream(), cx.stream());
        let mut graph: CUgraph = ptr::null_mut();
        // SAFETY: live streams; a valid out-pointer.
        unsafe {
            cx.driver.cuStreamBeginCapture(captured, GLOBAL).unwrap();
            assert_eq!(code(cx.driver.cuStreamQuery(other)), Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED));
            assert_eq!(
                code(cx.driver.cuStreamEndCapture(captured, &mut graph)),
                Some(CUresult::CUDA_ERROR_STREAM_CAPTURE_INVALIDATED)
            );
        }
    }
}
