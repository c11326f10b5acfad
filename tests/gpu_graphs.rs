//! Capture-aware host launches, graph host nodes and the sync-mode option on the real GPU. Opt-in:
//! `--ignored --test-threads=1`, or the bundle of `scripts/gpu-bundle`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cuda_dl_sys::types::{CUgraphNodeType, CUstreamCaptureMode};
use cuda_host_launch::{
    Error, Event, Graph, GraphNode, HostTaskSyncMode, LaunchError, LaunchOptions, Stream,
    add_host_node, flush,
};
use cuda_workspace::gpu::{Gpu, MappedU32s};
use cuda_workspace::testing::Drops;

const FLUSH: Duration = Duration::from_secs(30);
const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

fn capture(gpu: &Gpu, stream: &Stream, body: impl FnOnce()) -> Graph {
    // SAFETY: live stream.
    unsafe { gpu.driver.cuStreamBeginCapture(stream.raw(), RELAXED) }.unwrap();
    body();
    let mut raw = std::ptr::null_mut();
    // SAFETY: live stream, valid out-pointer.
    unsafe { gpu.driver.cuStreamEndCapture(stream.raw(), &mut raw) }.unwrap();
    // SAFETY: the graph the capture made, owned by nobody else.
    unsafe { Graph::from_raw(raw) }
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_captured_host_launch_is_one_host_node_that_runs_on_every_launch_of_the_executable() {
    let gpu = Gpu::open();
    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&runs);
    let graph = capture(&gpu, &stream, || {
        LaunchOptions::default()
            .host_launch_repeatable(&stream, move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    });
    let nodes = graph.node_types().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].1, CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "capturing does not run it");
    let exec = graph.instantiate().unwrap();
    for _ in 0..3 {
        exec.launch(&stream).unwrap();
    }
    stream.synchronize().unwrap();
    println!(
        "captured: {} node(s) of type {:?}; 3 launches ran it {} times",
        nodes.len(),
        nodes[0].1,
        runs.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn owners_outlive_clones_executables_and_the_source_graph_and_drop_after_the_last_executable() {
    let gpu = Gpu::open();
    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
    let drops = Drops::new();
    let owner = drops.owner();
    let runs = Arc::new(AtomicUsize::new(0));
    let driver_thread = Arc::new(Mutex::new(None));
    let (counter, seen) = (Arc::clone(&runs), Arc::clone(&driver_thread));
    let graph = capture(&gpu, &stream, || {
        LaunchOptions::default()
            .host_launch_repeatable(&stream, move || {
                let _keep = &owner;
                *seen.lock().unwrap() = Some(std::thread::current().id());
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    });
    let clone = graph.try_clone().unwrap();
    let first = graph.instantiate().unwrap();
    let second = clone.instantiate().unwrap();
    drop(graph);
    drop(clone);
    first.launch(&stream).unwrap();
    second.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    flush(FLUSH).unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 2, "each executable ran it");
    assert_eq!(drops.dropped(), 0, "alive while two executables exist");
    drop(first);
    // The released executable's work is done and the cleanup queue empty: still alive.
    stream.synchronize().unwrap();
    flush(FLUSH).unwrap();
    assert_eq!(drops.dropped(), 0, "alive while one executable exists");
    second.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    flush(FLUSH).unwrap();
    assert_eq!(
        runs.load(Ordering::SeqCst),
        3,
        "the last executable still runs it"
    );
    assert_eq!(
        drops.dropped(),
        0,
        "alive until the last executable is dropped"
    );
    drop(second);
    // Dropped once the last executable is destroyed (the driver destroys user objects
    // asynchronously: wait_dropped flushes and waits).
    let dropped_on = drops.wait_dropped(1)[0].thread.clone();
    let driver_thread = driver_thread.lock().unwrap().unwrap();
    println!(
        "ran {} times; owner dropped once, after the last executable, on {dropped_on:?}; driver \
         thread {driver_thread:?}",
        runs.load(Ordering::SeqCst)
    );
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    assert_ne!(dropped_on.id, driver_thread);
    assert!(
        dropped_on.is_reaper(),
        "dropped by the reaper: {dropped_on:?}"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn a_host_launch_on_a_stream_forked_into_a_capture_is_captured_and_tied_to_that_graph() {
    let gpu = Gpu::open();
    let origin = Stream::new_non_blocking(&gpu.context).unwrap();
    let forked = Stream::new_non_blocking(&gpu.context).unwrap();
    let (fork, join) = (
        Event::new(&gpu.context).unwrap(),
        Event::new(&gpu.context).unwrap(),
    );
    let drops = Drops::new();
    let owner = drops.owner();
    let ran = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&ran);
    let graph = capture(&gpu, &origin, || {
        fork.record(&origin).unwrap();
        fork.make_wait(&forked).unwrap();
        LaunchOptions::default()
            .host_launch_repeatable(&forked, move || {
                let _keep = &owner;
                flag.store(true, Ordering::SeqCst);
            })
            .unwrap();
        join.record(&forked).unwrap();
        join.make_wait(&origin).unwrap();
    });
    let hosts = graph
        .node_types()
        .unwrap()
        .into_iter()
        .filter(|(_, t)| *t == CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST)
        .count();
    assert_eq!(hosts, 1);
    assert!(!ran.load(Ordering::SeqCst));
    let exec = graph.instantiate().unwrap();
    exec.launch(&origin).unwrap();
    origin.synchronize().unwrap();
    flush(FLUSH).unwrap();
    assert!(ran.load(Ordering::SeqCst));
    assert_eq!(
        drops.dropped(),
        0,
        "alive while the graph and its executable live"
    );
    drop(exec);
    drop(graph);
    let dropped_on = drops.wait_dropped(1)[0].thread.clone();
    assert!(
        dropped_on.is_reaper(),
        "dropped by the reaper: {dropped_on:?}"
    );
    println!(
        "forked-stream launch captured as 1 host node; ran on replay; owner dropped with the graph"
    );
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn graph_host_nodes_run_in_dependency_order_with_a_kernel_node() {
    let gpu = Gpu::open();
    let stream = Stream::new_non_blocking(&gpu.context).unwrap();
    // 0: the kernel's value; 1: what the second host node saw; 2: the order of events.
    let m = Arc::new(MappedU32s::new(gpu.driver, 3));
    let graph = Graph::new().unwrap();
    let (a, b) = (Arc::clone(&m), Arc::clone(&m));
    let first = add_host_node(&graph, &[], move || {
        // Runs before the kernel: the kernel's value is not there yet.
        a.set(2, if a.get(0) == 0 { 1 } else { 99 });
    })
    .unwrap();
    // SAFETY: a live graph and one of its nodes.
    let kernel = unsafe {
        gpu.kernels.add_spin_then_write_node(
            graph.raw(),
            &[first.raw()],
            m.device(0),
            7,
            20_000_000,
        )
    };
    // SAFETY: the kernel node was just added to `graph`, and nothing removes it.
    let kernel = unsafe { GraphNode::from_raw(&graph, kernel) };
    add_host_node(&graph, &[kernel], move || {
        b.set(1, b.get(0));
        b.set(2, b.get(2) * 10 + 2);
    })
    .unwrap();
    let exec = graph.instantiate().unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    println!(
        "order code {} (12 = host, kernel, host); second host node saw {}",
        m.get(2),
        m.get(1)
    );
    assert_eq!(m.get(1), 7, "the second host node ran after the kernel");
    assert_eq!(m.get(2), 12, "the first host node ran before the kernel");
}

#[test]
#[ignore = "needs an NVIDIA GPU and driver: run with --ignored"]
fn the_sync_mode_option_is_gated_on_the_driver_version() {
    let gpu = Gpu::open();
    let stream = Stream::new(&gpu.context).unwrap();
    let options = LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait);
    let drops = Drops::new();
    // How many times the launched closure and the node's closure ran.
    let launch_runs = Arc::new(AtomicUsize::new(0));
    let node_runs = Arc::new(AtomicUsize::new(0));
    let (owner, counter) = (drops.owner(), Arc::clone(&launch_runs));
    let launched = options.host_launch(&stream, move || {
        let _keep = &owner;
        counter.fetch_add(1, Ordering::SeqCst);
    });
    // A refusal hands its owners back (alive until the caller drops them, here).
    let handed_back = launched.as_ref().err().map(|e| e.is_handed_back());
    let launched = launched.map_err(LaunchError::into_error);
    let graph = Graph::new().unwrap();
    let (owner, counter) = (drops.owner(), Arc::clone(&node_runs));
    let node = options
        .add_host_node(&graph, &[], move || {
            let _keep = &owner;
            counter.fetch_add(1, Ordering::SeqCst);
        })
        .map(|_| ());
    let node_handed_back = node.as_ref().err().map(|e| e.is_handed_back());
    let node = node.map_err(LaunchError::into_error);
    let version = gpu.driver.version().0;
    println!("driver {version}: sync-mode launch -> {launched:?}; node -> {node:?}");
    if version < 13020 {
        // Below 13.2 (options.rs): a sync mode needs cuLaunchHostFunc_v2, so both are refused
        // with DriverTooOld, before anything is enqueued or added, owners handed back.
        assert_eq!((handed_back, node_handed_back), (Some(true), Some(true)));
        for result in [launched, node] {
            match result {
                Err(Error::Cuda(cuda_dl_sys::Error::DriverTooOld {
                    function,
                    required,
                    found,
                    ..
                })) => {
                    assert_eq!(function, "cuLaunchHostFunc_v2");
                    assert_eq!(required, 13020);
                    assert_eq!(found.0, version);
                }
                other => panic!("expected DriverTooOld, got {other:?}"),
            }
        }
        assert_eq!(
            drops.dropped(),
            2,
            "the refused launch and node's owners, handed back, were dropped by the caller"
        );
        assert_eq!(
            graph.node_types().unwrap().len(),
            0,
            "the refused node was not added"
        );
        // The default options (no sync mode: cuLaunchHostFunc, cuGraphAddHostNode) work here.
        let default = LaunchOptions::default();
        let counter = Arc::clone(&launch_runs);
        default
            .host_launch(&stream, move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        let counter = Arc::clone(&node_runs);
        default
            .add_host_node(&graph, &[], move || {
                counter.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    } else {
        launched.unwrap();
        node.unwrap();
    }
    let nodes = graph.node_types().unwrap();
    assert_eq!(nodes.len(), 1);
    assert_eq!(nodes[0].1, CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST);
    let exec = graph.instantiate().unwrap();
    exec.launch(&stream).unwrap();
    stream.synchronize().unwrap();
    assert_eq!(launch_runs.load(Ordering::SeqCst), 1, "the launch ran once");
    assert_eq!(node_runs.load(Ordering::SeqCst), 1, "the node ran once");
    drop(exec);
    drop(graph);
    // Every owner is dropped: the refused ones at once (below 13.2), the others once their
    // launch ran and the graph and its executable were destroyed.
    drops.wait_dropped(2);
}
