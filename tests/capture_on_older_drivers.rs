//! Capture detection on drivers older than the table's `cuStreamGetCaptureInfo` (12.3): there
//! `cuStreamIsCapturing` says whether a stream captures (run-once launches are still refused,
//! with capture id 0), and a repeatable launch finds its graph through the 11.3
//! `cuStreamGetCaptureInfo`.
//! Before 11.3 there are no user objects, so a repeatable launch on a capturing stream is
//! `DriverTooOld`. The driver version is read once per process: each test has a process of its own.

use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::DriverVersion;
use cuda_dl_sys::types::{CUgraph, CUgraphNodeType, CUstreamCaptureMode};
use cuda_host_launch::{Error, Event, Graph, LaunchOptions, Stream, host_launch};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{Drops, ThreadInfo, fake, fake_primary_context, load_fake_driver};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

fn begin_capture(stream: &Stream) {
    // SAFETY: a live stream.
    unsafe { load_fake_driver().cuStreamBeginCapture(stream.raw(), RELAXED) }.unwrap();
}

fn end_capture(stream: &Stream) -> Graph {
    let mut raw: CUgraph = ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    unsafe { load_fake_driver().cuStreamEndCapture(stream.raw(), &mut raw) }
        .expect("the capture is still valid");
    // SAFETY: the graph the capture made, owned by nobody else.
    unsafe { Graph::from_raw(raw) }
}

fn host_nodes(graph: &Graph) -> usize {
    graph
        .node_types()
        .unwrap()
        .iter()
        .filter(|(_, t)| *t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST)
        .count()
}

/// A run-once launch on `stream` is refused with `CaptureActive` (capture id 0: the driver could
/// not say), its owner dropped on this thread.
#[track_caller]
fn assert_run_once_refused(stream: &Stream) {
    let drops = Drops::new();
    let owner = drops.owner();
    let refused = host_launch(stream, move || {
        let _keep = &owner;
    });
    assert_eq!(drops.dropped(), 0, "the crate dropped what it refused");
    assert!(
        refused.as_ref().is_err_and(|e| e.is_handed_back()),
        "not handed back"
    );
    // Taken for an `Error` (what `?` does): the owner handed back is dropped here.
    match refused.map_err(cuda_host_launch::LaunchError::into_error) {
        Err(Error::CaptureActive {
            stream: s,
            capture_id,
        }) => {
            assert_eq!(s, stream.raw().addr());
            assert_eq!(capture_id, 0);
        }
        other => panic!("expected CaptureActive, got {other:?}"),
    }
    let records = drops.records();
    assert_eq!(records.len(), 1);
    assert!(records[0].thread.same_as(&ThreadInfo::current()));
}

isolated_test! {
    /// 12.2: run-once launches on a capturing stream and on a stream forked into the capture are
    /// refused; repeatable ones are captured into the capture's graph (found through the 11.3
    /// `cuStreamGetCaptureInfo`), run on every replay, and release their owners with the graph.
    fn on_a_12_2_driver_capture_is_detected_and_repeatable_launches_are_captured(
        FAKE_CUDA_VERSION = "12020"
    ) {
        let context = fake_primary_context();
        assert_eq!(load_fake_driver().version(), DriverVersion(12020));
        let origin = Stream::new_non_blocking(&context).unwrap();
        let forked = Stream::new_non_blocking(&context).unwrap();
        let (fork, join) = (Event::new(&context).unwrap(), Event::new(&context).unwrap());
        let drops = Drops::new();
        let runs = Arc::new(AtomicUsize::new(0));
        let repeatable = |stream: &Stream| {
            let (owner, runs) = (drops.owner(), Arc::clone(&runs));
            LaunchOptions::default().host_launch_repeatable(stream, move || {
                let _keep = &owner;
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        };

        begin_capture(&origin);
        assert_run_once_refused(&origin);
        repeatable(&origin);
        fork.record(&origin).unwrap();
        fork.make_wait(&forked).unwrap();
        assert_run_once_refused(&forked);
        repeatable(&forked);
        join.record(&forked).unwrap();
        join.make_wait(&origin).unwrap();
        let graph = end_capture(&origin);

        assert_eq!(fake().call_count("cuStreamGetCaptureInfo_v3"), 0, "the 12.3 entry on 12.2");
        assert!(fake().call_count("cuStreamIsCapturing") >= 4);
        assert_eq!(host_nodes(&graph), 2);
        assert_eq!(runs.load(Ordering::SeqCst), 0);
        let exec = graph.instantiate().unwrap();
        exec.launch(&origin).unwrap();
        exec.launch(&origin).unwrap();
        origin.synchronize().unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 4);
        assert_eq!(drops.dropped(), 0, "dropped while the graph exists");
        drop((exec, graph));
        drops.wait_dropped(2);
    }

    /// 11.2 has no user objects: a repeatable launch on a capturing stream returns
    /// `DriverTooOld` for `cuUserObjectCreate` (11.3), its owner dropped on this thread, and the
    /// capture stays valid with no node. Nothing is called through an entry of another ABI: the
    /// only `cuStreamGetCaptureInfo` export of an 11.2 driver is the 10.1 one, with three
    /// parameters.
    fn on_an_11_2_driver_a_repeatable_launch_on_a_capturing_stream_is_driver_too_old(
        FAKE_CUDA_VERSION = "11020"
    ) {
        let context = fake_primary_context();
        assert_eq!(load_fake_driver().version(), DriverVersion(11020));
        let stream = Stream::new_non_blocking(&context).unwrap();
        begin_capture(&stream);
        assert_run_once_refused(&stream);

        let drops = Drops::new();
        let owner = drops.owner();
        let refused = LaunchOptions::default().host_launch_repeatable(&stream, move || {
            let _keep = &owner;
        });
        let calls_to_v1 = fake().call_count("cuStreamGetCaptureInfo");
        assert_eq!(drops.dropped(), 0, "the crate dropped what it refused");
        assert!(refused.as_ref().is_err_and(|e| e.is_handed_back()), "not handed back");
        match refused.map_err(cuda_host_launch::LaunchError::into_error) {
            Err(Error::Cuda(cuda_dl_sys::Error::DriverTooOld { function, required, found, .. })) => {
                assert_eq!(function, "cuUserObjectCreate");
                assert_eq!(required, 11030);
                assert_eq!(found, DriverVersion(11020));
            }
            other => panic!("expected DriverTooOld for cuUserObjectCreate, got {other:?}"),
        }
        let records = drops.records();
        assert_eq!(records.len(), 1, "the owner outlived the error");
        assert!(records[0].thread.same_as(&ThreadInfo::current()));
        let graph = end_capture(&stream);
        assert!(graph.nodes().unwrap().is_empty());
        assert_eq!(
            calls_to_v1, 0,
            "cuStreamGetCaptureInfo (the 10.1 export, 3 parameters) was called as the 11.3 one (6)"
        );
    }
}
