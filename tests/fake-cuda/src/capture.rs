//! Stream capture: while a stream captures, its work becomes nodes of the capture's graph instead
//! of running.

use std::sync::atomic::{AtomicU64, Ordering};

use cuda_dl_sys::types::{
    CUgraph, CUgraphEdgeData, CUgraphNode, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
    cuuint64_t,
};

use crate::errors::{
    CAPTURE_INVALIDATED, CAPTURE_UNMATCHED, CAPTURE_UNSUPPORTED, ILLEGAL_STATE, INVALID_VALUE, Res,
    ensure,
};
use crate::graph;
use crate::state::{Capture, NodeKind, State, StreamCapture, StreamKind, as_ptr, lock};
use crate::stream::resolve;

/// Capture queries of a capturing stream still to answer "not capturing" (see
/// [`crate::control::fake_cuda_hide_capture`]).
pub(crate) static HIDDEN_QUERIES: AtomicU64 = AtomicU64::new(0);

/// `status` as a query reports it: "not capturing" while queries are to be hidden.
fn reported(status: (CUstreamCaptureStatus, u64, usize)) -> (CUstreamCaptureStatus, u64, usize) {
    let active = status.0 == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    let hide = active
        && HIDDEN_QUERIES
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1))
            .is_ok();
    if hide {
        (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, 0, 0)
    } else {
        status
    }
}

pub(crate) fn is_capturing(st: &State, stream: usize) -> bool {
    st.streams.get(&stream).is_some_and(|s| s.capture.is_some())
}

/// Invalidates the capture `stream` takes part in, if any.
pub(crate) fn invalidate(st: &mut State, stream: usize) {
    let id = st
        .streams
        .get(&stream)
        .and_then(|s| s.capture.as_ref())
        .map(|c| c.id);
    if let Some(c) = id.and_then(|id| st.captures.get_mut(&id)) {
        c.invalidated = true;
    }
}

/// If `stream` is capturing, adds a node of `kind` after the stream's current dependencies, which
/// then become that node; `None` if it is not capturing (the caller enqueues the work instead).
pub(crate) fn add_node(st: &mut State, stream: usize, kind: NodeKind) -> Option<Res> {
    let s = st.streams.get(&stream)?;
    let cap = s.capture.as_ref()?;
    let (id, deps) = (cap.id, cap.deps.clone());
    let Some(capture) = st.captures.get(&id) else {
        // The capture ended without this stream (it was forked into it and never rejoined).
        if let Some(s) = st.streams.get_mut(&stream) {
            s.capture = None;
        }
        return None;
    };
    if capture.invalidated || !st.graphs.contains_key(&capture.graph) {
        return Some(Err(CAPTURE_INVALIDATED));
    }
    let node = graph::add_node(st, capture.graph, kind, deps);
    if let Some(cap) = st.streams.get_mut(&stream).and_then(|s| s.capture.as_mut()) {
        cap.set_deps(vec![node]);
    }
    Some(Ok(()))
}

/// The capture status of a stream, with its capture's id and graph.
fn status(st: &State, stream: usize) -> (CUstreamCaptureStatus, u64, usize) {
    let capture = st
        .streams
        .get(&stream)
        .and_then(|s| s.capture.as_ref())
        .and_then(|cap| Some((cap.id, st.captures.get(&cap.id)?)));
    match capture {
        None => (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE, 0, 0),
        Some((id, c)) if c.invalidated => (
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_INVALIDATED,
            id,
            0,
        ),
        Some((id, c)) => (
            CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE,
            id,
            c.graph,
        ),
    }
}

unsafe fn begin_capture(handle: CUstream, mode: CUstreamCaptureMode, per_thread: bool) -> Res {
    ensure(mode.0 <= 2, INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let stream = &st.streams[&s];
    // The legacy default stream cannot be captured.
    ensure(stream.kind != StreamKind::Legacy, CAPTURE_UNSUPPORTED)?;
    // (A capture state whose capture has ended is stale: a forked stream that never rejoined.)
    if let Some(cap) = &stream.capture {
        ensure(!st.captures.contains_key(&cap.id), ILLEGAL_STATE)?;
    }
    let graph = graph::new_graph(&mut st);
    let id = st.next_id();
    st.captures.insert(
        id,
        Capture {
            origin: s,
            graph,
            invalidated: false,
            mode,
            thread: crate::state::thread_number(),
            streams: vec![s],
        },
    );
    if let Some(stream) = st.streams.get_mut(&s) {
        stream.capture = Some(StreamCapture::new(id, Vec::new()));
    }
    Ok(())
}

stream_export!("cuStreamBeginCapture", cuStreamBeginCapture_v2 / cuStreamBeginCapture_v2_ptsz => begin_capture(hStream: CUstream, mode: CUstreamCaptureMode));

stream_export!("cuStreamBeginCapture", cuStreamBeginCapture / cuStreamBeginCapture_ptsz => begin_capture_v1(hStream: CUstream));
unsafe fn begin_capture_v1(handle: CUstream, per_thread: bool) -> Res {
    let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_GLOBAL;
    // SAFETY: the same contract.
    unsafe { begin_capture(handle, mode, per_thread) }
}

stream_export!("cuStreamEndCapture", cuStreamEndCapture / cuStreamEndCapture_ptsz => end_capture(hStream: CUstream, phGraph: *mut CUgraph));
unsafe fn end_capture(handle: CUstream, ph_graph: *mut CUgraph, per_thread: bool) -> Res {
    ensure(!ph_graph.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let id = st.streams[&s]
        .capture
        .as_ref()
        .map(|c| c.id)
        .ok_or(ILLEGAL_STATE)?;
    let capture = st.captures.get_mut(&id).ok_or(ILLEGAL_STATE)?;
    if capture.origin != s {
        // Refused, and the capture is invalidated (as the 13.0 driver does: measured by the
        // conformance suite).
        capture.invalidated = true;
        return Err(CAPTURE_UNMATCHED);
    }
    let Some(capture) = st.captures.remove(&id) else {
        return Err(ILLEGAL_STATE);
    };
    for stream in &capture.streams {
        if let Some(stream) = st.streams.get_mut(stream) {
            stream.capture = None;
        }
    }
    let (graph, code) = if capture.invalidated {
        graph::destroy_graph(&mut st, capture.graph);
        (0, Err(CAPTURE_INVALIDATED))
    } else {
        (capture.graph, Ok(()))
    };
    // SAFETY: non-null, and the caller passes a valid place for a graph handle.
    unsafe { ph_graph.write(as_ptr(graph)) };
    code
}

stream_export!("cuStreamIsCapturing", cuStreamIsCapturing / cuStreamIsCapturing_ptsz => is_capturing_export(hStream: CUstream, captureStatus: *mut CUstreamCaptureStatus));
unsafe fn is_capturing_export(
    handle: CUstream,
    status_out: *mut CUstreamCaptureStatus,
    per_thread: bool,
) -> Res {
    ensure(!status_out.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    // SAFETY: non-null, and the caller passes a valid place for the status.
    unsafe { status_out.write(reported(status(&st, s)).0) };
    Ok(())
}

/// Every version of `cuStreamGetCaptureInfo`; the status output is required (null:
/// `CUDA_ERROR_INVALID_VALUE`, as on the real driver), the others may be null. The dependency and
/// edge arrays stay valid until the stream's next capture operation, as the real driver's do.
#[allow(clippy::too_many_arguments)]
unsafe fn capture_info(
    handle: CUstream,
    status_out: *mut CUstreamCaptureStatus,
    id_out: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    deps_out: *mut *const CUgraphNode,
    edges_out: *mut *const CUgraphEdgeData,
    num_out: *mut usize,
    per_thread: bool,
) -> Res {
    ensure(!status_out.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let (status, id, graph) = reported(status(&st, s));
    let active = status == CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE;
    let (deps, edges, n) = match st.streams[&s].capture.as_ref().filter(|_| active) {
        Some(cap) => (
            cap.deps.as_ptr().cast::<CUgraphNode>(),
            cap.edges.as_ptr(),
            cap.deps.len(),
        ),
        None => (std::ptr::null(), std::ptr::null(), 0),
    };
    // SAFETY: the status output is non-null (checked), each other output is written only when non-null;
    // the caller passes valid places for them.
    // The node array is `usize` handles, the same size and layout as `CUgraphNode` pointers.
    unsafe {
        status_out.write(status);
        if !id_out.is_null() {
            id_out.write(id);
        }
        if !graph_out.is_null() {
            graph_out.write(as_ptr(graph));
        }
        if !deps_out.is_null() {
            deps_out.write(if n == 0 { std::ptr::null() } else { deps });
        }
        if !edges_out.is_null() {
            edges_out.write(if n == 0 { std::ptr::null() } else { edges });
        }
        if !num_out.is_null() {
            num_out.write(n);
        }
    }
    Ok(())
}

stream_export!("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo / cuStreamGetCaptureInfo_ptsz => capture_info_v1(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t));
unsafe fn capture_info_v1(
    handle: CUstream,
    status_out: *mut CUstreamCaptureStatus,
    id_out: *mut cuuint64_t,
    per_thread: bool,
) -> Res {
    let (graph, deps, edges, num) = (
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
        std::ptr::null_mut(),
    );
    // SAFETY: the caller's contract covers the two outputs; the rest are null.
    unsafe {
        capture_info(
            handle, status_out, id_out, graph, deps, edges, num, per_thread,
        )
    }
}

stream_export!("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v2 / cuStreamGetCaptureInfo_v2_ptsz => capture_info_v2(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, numDependencies_out: *mut usize));
unsafe fn capture_info_v2(
    handle: CUstream,
    status_out: *mut CUstreamCaptureStatus,
    id_out: *mut cuuint64_t,
    graph_out: *mut CUgraph,
    deps_out: *mut *const CUgraphNode,
    num_out: *mut usize,
    per_thread: bool,
) -> Res {
    let edges = std::ptr::null_mut();
    // SAFETY: the caller's contract covers every output but the edge data, which is null.
    unsafe {
        capture_info(
            handle, status_out, id_out, graph_out, deps_out, edges, num_out, per_thread,
        )
    }
}

stream_export!("cuStreamGetCaptureInfo", cuStreamGetCaptureInfo_v3 / cuStreamGetCaptureInfo_v3_ptsz => capture_info(hStream: CUstream, captureStatus_out: *mut CUstreamCaptureStatus, id_out: *mut cuuint64_t, graph_out: *mut CUgraph, dependencies_out: *mut *const CUgraphNode, edgeData_out: *mut *const CUgraphEdgeData, numDependencies_out: *mut usize));

/// Makes `stream` wait for the captured event record `(capture, deps)`: it joins the capture, or
/// merges the dependencies if it is already in it.
pub(crate) fn join(st: &mut State, stream: usize, capture: u64, deps: &[usize]) -> Res {
    let invalidated = st.captures.get(&capture).map(|c| c.invalidated);
    let Some(invalidated) = invalidated else {
        return Ok(());
    };
    let s = st.streams.get_mut(&stream).ok_or(INVALID_VALUE)?;
    match &mut s.capture {
        Some(cap) if cap.id == capture => {
            let mut merged = cap.deps.clone();
            merged.extend(deps.iter().filter(|d| !cap.deps.contains(d)));
            cap.set_deps(merged);
        }
        Some(_) => return Err(crate::errors::CAPTURE_MERGE),
        None => {
            ensure(!invalidated, CAPTURE_INVALIDATED)?;
            s.capture = Some(StreamCapture::new(capture, deps.to_vec()));
            if let Some(c) = st.captures.get_mut(&capture) {
                c.streams.push(stream);
            }
        }
    }
    ensure(!invalidated, CAPTURE_INVALIDATED)
}
