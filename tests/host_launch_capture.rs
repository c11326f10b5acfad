//! Run-once launches on a capturing stream, or on a stream forked into a capture, are refused with
//! `CaptureActive` (a captured host function would run on every replay, after its owners were
//! released): the owners are handed back in the error, alive until the caller drops them (work
//! enqueued before the capture began may still use them), nothing is added to the graph, and the
//! capture stays valid, so `cuStreamEndCapture` succeeds.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::Driver;
use cuda_dl_sys::types::{
    CUgraph, CUgraphNodeType, CUstream, CUstreamCaptureMode, CUstreamCaptureStatus,
};
use cuda_host_launch::{
    Error, Event, Graph, LaunchError, PrimaryContext, Stream, host_launch, launch_host_function,
    launch_host_function_with_bytes,
};
use cuda_workspace::testing::bump;
use cuda_workspace::testing::{Drops, ThreadInfo, fake_primary_context, load_fake_driver};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// The status and id of `stream`'s capture.
fn capture_info(driver: &Driver, stream: CUstream) -> (CUstreamCaptureStatus, u64) {
    let mut status = CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    let mut id = 0;
    // SAFETY: `status` and `id` are valid out-pointers; the other outputs are optional.
    unsafe {
        driver
            .cuStreamGetCaptureInfo(
                stream,
                &mut status,
                &mut id,
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
                ptr::null_mut(),
            )
            .unwrap();
    }
    (status, id)
}

/// A launch's result, and what its error handed back.
fn split<T: Send + 'static>(
    result: Result<(), LaunchError<T>>,
) -> (Result<(), Error>, Option<Box<dyn Send>>) {
    match result {
        Ok(()) => (Ok(()), None),
        Err(e) => {
            let (error, value) = e.into_parts();
            (Err(error), value.map(|v| Box::new(v) as Box<dyn Send>))
        }
    }
}

/// Tries every run-once launch on `stream` (capturing, with capture id `id`): each is refused with
/// `CaptureActive` naming the stream and the capture, its owners handed back, alive until this
/// thread drops them, and none ran.
fn assert_run_once_launches_are_refused(stream: &Stream, id: u64) {
    let me = ThreadInfo::current();
    let ran = Arc::new(AtomicUsize::new(0));
    let check = |(result, handed_back): (Result<(), Error>, Option<Box<dyn Send>>),
                 drops: &Drops,
                 owners: usize| {
        match result {
            Err(Error::CaptureActive {
                stream: s,
                capture_id,
            }) => {
                assert_eq!(s, stream.raw().addr());
                assert_eq!(capture_id, id);
            }
            other => panic!("expected CaptureActive, got {other:?}"),
        }
        assert_eq!(handed_back.is_some(), owners > 0, "not handed back");
        assert_eq!(drops.dropped(), 0, "the crate dropped what it refused");
        drop(handed_back);
        let records = drops.records();
        assert_eq!(
            records.len(),
            owners,
            "not dropped with what was handed back"
        );
        assert_eq!(drops.live(), 0);
        assert!(records.iter().all(|r| r.thread.same_as(&me)), "{records:?}");
    };

    let drops = Drops::new();
    let (owner, counter) = (drops.owner(), Arc::clone(&ran));
    let refused = host_launch(stream, move || {
        let _keep = &owner;
        counter.fetch_add(1, Ordering::SeqCst);
    });
    check(split(refused), &drops, 1);

    let drops = Drops::new();
    let data = Arc::as_ptr(&ran).cast_mut().cast::<c_void>();
    // SAFETY: `bump` only touches the counter the Arc owner keeps alive (it is refused anyway).
    let refused = unsafe {
        launch_host_function(stream, Some(bump), data, (Arc::clone(&ran), drops.owner()))
    };
    check(split(refused), &drops, 1);

    // SAFETY: `bump` would read the copy, which is 8 bytes, as an AtomicUsize (refused anyway).
    let refused = unsafe { launch_host_function_with_bytes(stream, Some(bump), &[0; 8]) };
    check((refused, None), &Drops::new(), 0);

    assert_eq!(ran.load(Ordering::SeqCst), 0);
    assert_eq!(Arc::strong_count(&ran), 1, "the Arc owner leaked");
}

/// Ends the capture on `origin` (it must succeed), and checks the graph has no host node.
fn end_capture_with_no_host_node(driver: &Driver, origin: &Stream) -> Graph {
    let mut raw: CUgraph = ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(origin.raw(), &mut raw) }
        .expect("the capture is still valid after the refused launches");
    assert!(!raw.is_null());
    // SAFETY: the graph the capture made, owned by nobody else.
    let graph = unsafe { Graph::from_raw(raw) };
    let hosts = graph
        .node_types()
        .unwrap()
        .into_iter()
        .filter(|(_, t)| *t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST)
        .count();
    assert_eq!(hosts, 0);
    graph
}

fn streams(context: &Arc<PrimaryContext>) -> (Stream, Stream) {
    (
        Stream::new_non_blocking(context).unwrap(),
        Stream::new_non_blocking(context).unwrap(),
    )
}

#[test]
fn run_once_launches_on_a_capturing_stream_are_refused_and_the_capture_stays_valid() {
    let context = fake_primary_context();
    let driver = load_fake_driver();
    let (origin, _) = streams(&context);
    // SAFETY: a live stream.
    unsafe { driver.cuStreamBeginCapture(origin.raw(), RELAXED) }.unwrap();
    let (status, id) = capture_info(driver, origin.raw());
    assert_eq!(
        status,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
    );

    assert_run_once_launches_are_refused(&origin, id);

    assert_eq!(
        capture_info(driver, origin.raw()),
        (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, id),
        "the refusals disturbed the capture"
    );
    let graph = end_capture_with_no_host_node(driver, &origin);
    assert!(graph.nodes().unwrap().is_empty());

    // After the capture, the same stream takes run-once launches again.
    let ran = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&ran);
    host_launch(&origin, move || {
        counter.fetch_add(1, Ordering::SeqCst);
    })
    .unwrap();
    origin.synchronize().unwrap();
    assert_eq!(ran.load(Ordering::SeqCst), 1);
}

#[test]
fn run_once_launches_on_a_stream_forked_into_a_capture_are_refused() {
    let context = fake_primary_context();
    let driver = load_fake_driver();
    let (origin, forked) = streams(&context);
    let (fork, join) = (Event::new(&context).unwrap(), Event::new(&context).unwrap());
    // SAFETY: a live stream.
    unsafe { driver.cuStreamBeginCapture(origin.raw(), RELAXED) }.unwrap();
    let (_, id) = capture_info(driver, origin.raw());
    fork.record(&origin).unwrap();
    fork.make_wait(&forked).unwrap();
    assert_eq!(
        capture_info(driver, forked.raw()),
        (CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE, id),
        "the forked stream did not join the capture"
    );

    assert_run_once_launches_are_refused(&forked, id);
    assert_run_once_launches_are_refused(&origin, id);

    join.record(&forked).unwrap();
    join.make_wait(&origin).unwrap();
    end_capture_with_no_host_node(driver, &origin);
    assert_eq!(
        capture_info(driver, forked.raw()).0,
        CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE
    );
}
