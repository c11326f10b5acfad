//! Rollback of repeatable launches and graph host nodes when a driver call fails part-way, each
//! step in turn (fault injection): `cuUserObjectCreate`, `cuGraphRetainUserObject`, the captured
//! `cuLaunchHostFunc`, `cuGraphAddHostNode`. Each time the error surfaces and the owners are
//! handed back (nothing uses them: before, where a user object owned them, they were released soon
//! instead, while earlier stream work might still use what they hold); no node is left
//! referencing them (the node count is unchanged, and launching the graph does not run the
//! function), and a capture can still be ended.
//!
//! Faults and the fake's user-object counts are process-wide: each test has a process of its own.

use std::ptr;

use cuda_dl_sys::types::{CUgraph, CUresult, CUstreamCaptureMode};
use cuda_host_launch::{Error, Graph, LaunchOptions, Stream, add_host_node, flush};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::{
    PATIENCE, Probe, ThreadInfo, fake, fake_primary_context, load_fake_driver, wait_until,
};

const OOM: CUresult = CUresult::CUDA_ERROR_OUT_OF_MEMORY;

/// Where the failing launch goes.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Via {
    /// `host_launch_repeatable` on a capturing stream.
    Capture,
    /// `add_host_node` on a graph.
    AddNode,
}

/// Adds a working node, then one whose `fault` call fails, then checks the rollback: the error
/// names `fault`, the failed node's owners are handed back (the caller drops them), it left no
/// node, and the graph (with the capture ended, if any) runs the working node only.
fn rollback(via: Via, fault: &str) {
    let context = fake_primary_context();
    let driver = load_fake_driver();
    let stream = Stream::new_non_blocking(&context).unwrap();
    let (good, bad) = (Probe::new(), Probe::new());
    let options = LaunchOptions::default();

    let mut graph = None;
    match via {
        Via::Capture => {
            let mode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
            // SAFETY: a live stream.
            unsafe { driver.cuStreamBeginCapture(stream.raw(), mode) }.unwrap();
            options
                .host_launch_repeatable(&stream, good.closure())
                .unwrap();
        }
        Via::AddNode => {
            let g = Graph::new().unwrap();
            add_host_node(&g, &[], good.closure()).unwrap();
            graph = Some(g);
        }
    }
    assert_eq!(fake().referenced_user_objects(), 1);
    let created = fake().call_count("cuUserObjectCreate");

    fake().set_fault(fault, 1, OOM.0);
    let failed = match via {
        Via::Capture => options.host_launch_repeatable(&stream, bad.closure()),
        Via::AddNode => add_host_node(graph.as_ref().unwrap(), &[], bad.closure()).map(|_| ()),
    };
    fake().clear_faults();
    let (error, handed_back) = failed.expect_err("the fault surfaces").into_parts();
    match error {
        Error::Cuda(cuda_dl_sys::Error::Driver(e)) => {
            assert_eq!(e.code(), OOM, "{e}");
            assert_eq!(e.function(), Some(fault), "{e}");
        }
        other => panic!("expected {fault} to fail with {OOM:?}, got {other:?}"),
    }
    // Nothing uses them: handed back, alive until this thread drops them.
    assert!(handed_back.is_some(), "not handed back");
    assert_eq!(
        bad.drops.dropped(),
        0,
        "the crate dropped what it handed back"
    );
    drop(handed_back);
    let records = bad.drops.records();
    assert_eq!(records.len(), 1, "not dropped with what was handed back");
    assert!(records[0].thread.same_as(&ThreadInfo::current()));
    assert_eq!(bad.drops.live(), 0);
    assert_eq!(
        fake().referenced_user_objects(),
        1,
        "the failed node's user object lives on"
    );
    assert!(fake().call_count("cuUserObjectCreate") > created);

    let graph = match via {
        Via::Capture => {
            let mut raw: CUgraph = ptr::null_mut();
            // SAFETY: a live stream; a valid out-pointer.
            unsafe { driver.cuStreamEndCapture(stream.raw(), &mut raw) }
                .expect("the capture can still be ended");
            // SAFETY: the graph the capture made, owned by nobody else.
            unsafe { Graph::from_raw(raw) }
        }
        Via::AddNode => graph.unwrap(),
    };
    assert_eq!(graph.nodes().unwrap().len(), 1, "a node was left behind");
    let exec = graph.instantiate().unwrap();
    exec.launch(&stream).unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!((good.runs(), bad.runs()), (2, 0));

    drop(exec);
    drop(graph);
    good.drops.wait_dropped(1);
    flush(PATIENCE).unwrap();
    assert_eq!(bad.drops.dropped(), 1, "released more than once");
    assert_eq!(fake().referenced_user_objects(), 0);
    wait_until("every user object's destructor", PATIENCE, || {
        fake().live_user_objects() == 0
    });
    assert_eq!(fake().driver_thread_call_count(""), 0);
}

isolated_test! {
    /// `cuUserObjectCreate` fails: no user object, so the owners are handed back to the caller,
    /// and no node is added.
    fn a_failed_user_object_create_hands_the_owners_back_and_adds_no_node() {
        rollback(Via::Capture, "cuUserObjectCreate");
    }

    /// `cuGraphRetainUserObject` fails: the owners are taken back out of the user object, which
    /// is released; no node is added.
    fn a_failed_graph_retain_user_object_hands_the_owners_back_and_adds_no_node() {
        rollback(Via::Capture, "cuGraphRetainUserObject");
    }

    /// The captured `cuLaunchHostFunc` fails after the owners were tied to the graph: they are
    /// taken back, the graph lets the user object go, and no node is left.
    fn a_failed_captured_launch_hands_the_owners_back_and_leaves_no_node() {
        rollback(Via::Capture, "cuLaunchHostFunc");
    }

    /// `cuGraphAddHostNode` fails in `add_host_node`: handed back, the user object let go.
    fn a_failed_graph_add_host_node_hands_the_owners_back_and_leaves_no_node() {
        rollback(Via::AddNode, "cuGraphAddHostNode");
    }

    /// `cuUserObjectCreate` fails in `add_host_node`: handed back.
    fn a_failed_user_object_create_in_add_host_node_hands_the_owners_back() {
        rollback(Via::AddNode, "cuUserObjectCreate");
    }

    /// Adding the node fails and so does letting the graph's reference go
    /// (`cuGraphReleaseUserObject`): the owners are handed back all the same (no node uses them),
    /// and the user object, empty, goes with the graph and its executable graph.
    fn if_the_rollback_itself_fails_the_owners_are_still_handed_back() {
        let context = fake_primary_context();
        let stream = Stream::new_non_blocking(&context).unwrap();
        let graph = Graph::new().unwrap();
        let bad = Probe::new();
        fake().set_fault("cuGraphAddHostNode", 1, OOM.0);
        fake().set_fault("cuGraphReleaseUserObject", 1, OOM.0);
        let failed = add_host_node(&graph, &[], bad.closure());
        fake().clear_faults();
        assert!(
            matches!(&failed, Err(e) if e.error().cuda_code() == Some(OOM) && e.is_handed_back()),
            "{failed:?}"
        );
        assert_eq!(bad.drops.dropped(), 0, "the crate dropped what it handed back");
        drop(failed);
        assert_eq!(bad.drops.dropped(), 1, "not dropped with what was handed back");
        assert!(graph.nodes().unwrap().is_empty(), "a node was left behind");
        assert_eq!(fake().referenced_user_objects(), 1);
        let exec = graph.instantiate().unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(bad.runs(), 0);

        drop(graph);
        assert_eq!(fake().referenced_user_objects(), 1, "the executable graph holds it too");
        drop(exec);
        wait_until("the empty user object's destructor", PATIENCE, || {
            fake().live_user_objects() == 0
        });
        flush(PATIENCE).unwrap();
        assert_eq!(bad.drops.dropped(), 1, "released twice");
        assert_eq!(fake().referenced_user_objects(), 0);
    }
}
