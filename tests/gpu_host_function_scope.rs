//! Typed graph nodes on the real driver, and what a capture keeps of an executable graph's host
//! nodes. Opt-in: `--ignored --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::types::CUstreamCaptureMode;
use cuda_host_launch::{Error, Graph, Stream, add_host_node, flush};
use cuda_workspace::gpu::Gpu;
use cuda_workspace::testing::{Drops, PATIENCE};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn nodes_listed_by_the_driver_are_dependencies_of_their_graph_and_refused_by_another() {
    let gpu = Gpu::open();
    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
    let order = Arc::new(AtomicUsize::new(0));
    let graph = Graph::new().unwrap();
    let first = Arc::clone(&order);
    add_host_node(&graph, &[], move || {
        first.store(1, Ordering::SeqCst);
    })
    .unwrap();
    let listed = graph.nodes().unwrap();
    assert_eq!(listed.len(), 1);
    let second = Arc::clone(&order);
    add_host_node(&graph, &listed, move || {
        let seen = second.load(Ordering::SeqCst);
        second.store(seen * 10 + 2, Ordering::SeqCst);
    })
    .unwrap();
    let other = Graph::new().unwrap();
    let refused = add_host_node(&other, &listed, || {});
    assert!(
        matches!(
            refused.as_ref().map_err(|e| e.error()),
            Err(Error::NodeOfAnotherGraph { .. })
        ),
        "{refused:?}"
    );
    assert!(
        refused.is_err_and(|e| e.is_handed_back()),
        "the closure was not handed back"
    );
    assert!(other.nodes().unwrap().is_empty());
    let exec = graph.instantiate().unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(
        order.load(Ordering::SeqCst),
        12,
        "the second node ran after the first"
    );
}

/// If the driver captures `cuGraphLaunch` (into the capture's graph, as a child graph node), the
/// captured graph must hold the user objects of the executable graph's host nodes: their owners
/// stay alive after the original graph and executable graph are dropped, until the captured graph
/// and its executable graph are gone. (If the driver refuses the launch under capture, there is
/// nothing to keep.)
#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn an_executable_graph_launched_into_a_capture_keeps_its_host_nodes_owners_until_the_capture_is_gone()
 {
    let gpu = Gpu::open();
    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
    let drops = Drops::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let graph = Graph::new().unwrap();
    {
        let (owner, runs) = (drops.owner(), Arc::clone(&runs));
        add_host_node(&graph, &[], move || {
            let _keep = &owner;
            runs.fetch_add(1, Ordering::SeqCst);
        })
        .unwrap();
    }
    let exec = graph.instantiate().unwrap();
    // SAFETY: a live stream.
    unsafe { gpu.driver.cuStreamBeginCapture(stream.raw(), RELAXED) }.unwrap();
    let launched = exec.launch(&stream);
    let mut raw = std::ptr::null_mut();
    // SAFETY: a live stream, a valid out-pointer.
    let ended = unsafe { gpu.driver.cuStreamEndCapture(stream.raw(), &mut raw) };
    drop(exec);
    drop(graph);
    flush(PATIENCE).unwrap();
    if launched.is_err() || ended.is_err() || raw.is_null() {
        // The driver did not capture the launch: the owner goes with the original graph.
        drops.wait_dropped(1);
        return;
    }
    // SAFETY: the graph the capture made, owned by nobody else.
    let captured = unsafe { Graph::from_raw(raw) };
    assert_eq!(
        drops.dropped(),
        0,
        "the owner was dropped while a captured graph still runs its host node"
    );
    let captured_exec = captured.instantiate().unwrap();
    captured_exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        1,
        "the captured copy ran the node"
    );
    drop(captured_exec);
    drop(captured);
    drops.wait_dropped(1);
}
