//! Repeatable launches and graph host nodes on the fake driver: on a capturing stream (or one
//! forked into a capture) a repeatable launch becomes one host node that runs on every launch of
//! every executable graph; its owners live, through a CUDA user object, until the graph, its
//! clones and every executable graph are gone, and are then dropped once, off the driver's thread.
//! On a stream that is not capturing it runs once. `add_host_node` nodes run in dependency order.

use std::ffi::c_void;
use std::ptr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cuda_dl_sys::types::{CUgraph, CUgraphNodeType, CUstreamCaptureMode};
use cuda_host_launch::{Event, Graph, LaunchOptions, Stream, add_host_node, flush};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::bump;
use cuda_workspace::testing::{
    Drops, PATIENCE, RanOn, ThreadInfo, fake, fake_primary_context, load_fake_driver, wait_until,
};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;
const HOST: CUgraphNodeType = CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST;

/// Captures what `body` enqueues on `stream` into a graph.
fn capture(stream: &Stream, body: impl FnOnce()) -> Graph {
    let driver = load_fake_driver();
    // SAFETY: a live stream.
    unsafe { driver.cuStreamBeginCapture(stream.raw(), RELAXED) }.unwrap();
    body();
    let mut raw: CUgraph = ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(stream.raw(), &mut raw) }.unwrap();
    // SAFETY: the graph the capture made, owned by nobody else.
    unsafe { Graph::from_raw(raw) }
}

/// Captures on `stream` one repeatable closure that holds an owner of `drops` and counts its runs
/// and the thread they ran on.
fn capture_counted_closure(
    stream: &Stream,
    drops: &Arc<Drops>,
) -> (Graph, Arc<AtomicUsize>, Arc<RanOn>) {
    let (runs, ran_on) = (Arc::new(AtomicUsize::new(0)), RanOn::new());
    let graph = capture(stream, || {
        let (owner, runs, ran_on) = (drops.owner(), Arc::clone(&runs), Arc::clone(&ran_on));
        LaunchOptions::default()
            .host_launch_repeatable(stream, move || {
                let _keep = &owner;
                ran_on.here();
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    });
    (graph, runs, ran_on)
}

fn host_nodes(graph: &Graph) -> usize {
    let types = graph.node_types().unwrap();
    let hosts = types.iter().filter(|(_, t)| *t == HOST).count();
    assert_eq!(hosts, types.len(), "nodes other than host nodes: {types:?}");
    hosts
}

/// Instantiates `graph`, launches the executable `n` times on `stream` and waits for them.
fn replay(graph: &Graph, stream: &Stream, n: usize) {
    let exec = graph.instantiate().unwrap();
    for _ in 0..n {
        exec.launch(stream).unwrap();
    }
    stream.synchronize().unwrap();
}

/// Every record: dropped by the reaper, not on `driver` (where the function ran) nor here.
#[track_caller]
fn assert_dropped_by_the_reaper(drops: &Drops, n: usize, driver: &ThreadInfo) {
    let records = drops.wait_dropped(n);
    assert_eq!(drops.live(), 0);
    let me = ThreadInfo::current();
    for record in records {
        assert!(
            !record.thread.same_as(driver),
            "on the driver's thread: {record:?}"
        );
        assert!(
            !record.thread.same_as(&me),
            "on the test's thread: {record:?}"
        );
        assert!(record.thread.is_reaper(), "{record:?}");
    }
}

#[test]
fn a_repeatable_closure_on_a_capturing_stream_is_one_host_node_that_runs_on_every_launch() {
    let context = fake_primary_context();
    let stream = Stream::new_non_blocking(&context).unwrap();
    let drops = Drops::new();
    let (graph, runs, ran_on) = capture_counted_closure(&stream, &drops);
    assert_eq!(host_nodes(&graph), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0, "capturing ran it");
    replay(&graph, &stream, 3);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    flush(PATIENCE).unwrap();
    assert_eq!(drops.dropped(), 0, "dropped while the graph exists");
    drop(graph);
    assert_dropped_by_the_reaper(&drops, 1, &ran_on.only());
}

#[test]
fn a_repeatable_raw_launch_on_a_capturing_stream_is_one_host_node_that_runs_on_every_launch() {
    let context = fake_primary_context();
    let stream = Stream::new_non_blocking(&context).unwrap();
    let drops = Drops::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let data = Arc::as_ptr(&runs).cast_mut().cast::<c_void>();
    let graph = capture(&stream, || {
        // SAFETY: `bump` only touches the counter, which the owners keep alive; it may run any
        // number of times, from any thread.
        unsafe {
            LaunchOptions::default().launch_host_function_repeatable(
                &stream,
                Some(bump),
                data,
                (Arc::clone(&runs), drops.owner()),
            )
        }
        .unwrap();
    });
    assert_eq!(host_nodes(&graph), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    replay(&graph, &stream, 3);
    assert_eq!(runs.load(Ordering::SeqCst), 3);
    drop(graph);
    drops.wait_dropped(1);
    assert_eq!(Arc::strong_count(&runs), 1, "the Arc owner was not dropped");
}

#[test]
fn a_repeatable_launch_on_a_stream_forked_into_a_capture_is_captured_into_that_graph() {
    let context = fake_primary_context();
    let origin = Stream::new_non_blocking(&context).unwrap();
    let forked = Stream::new_non_blocking(&context).unwrap();
    let (fork, join) = (Event::new(&context).unwrap(), Event::new(&context).unwrap());
    let drops = Drops::new();
    let runs = Arc::new(AtomicUsize::new(0));
    let graph = capture(&origin, || {
        fork.record(&origin).unwrap();
        fork.make_wait(&forked).unwrap();
        let (owner, runs) = (drops.owner(), Arc::clone(&runs));
        LaunchOptions::default()
            .host_launch_repeatable(&forked, move || {
                let _keep = &owner;
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
        join.record(&forked).unwrap();
        join.make_wait(&origin).unwrap();
    });
    assert_eq!(host_nodes(&graph), 1);
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    replay(&graph, &origin, 2);
    assert_eq!(runs.load(Ordering::SeqCst), 2);
    assert_eq!(drops.dropped(), 0);
    drop(graph);
    drops.wait_dropped(1);
}

#[test]
fn a_repeatable_launch_on_a_stream_that_is_not_capturing_runs_once_and_drops_its_owners_after() {
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let drops = Drops::new();
    let (runs, ran_on) = (Arc::new(AtomicUsize::new(0)), RanOn::new());
    let hold = fake()
        .hold_stream(stream.raw())
        .expect("the fake could not hold the stream");
    {
        let (owner, runs, ran_on) = (drops.owner(), Arc::clone(&runs), Arc::clone(&ran_on));
        LaunchOptions::default()
            .host_launch_repeatable(&stream, move || {
                let _keep = &owner;
                ran_on.here();
                runs.fetch_add(1, Ordering::SeqCst);
            })
            .unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 0);
    assert_eq!(drops.dropped(), 0);
    hold.release();
    stream.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 1);
    assert_dropped_by_the_reaper(&drops, 1, &ran_on.only());
    assert_eq!(runs.load(Ordering::SeqCst), 1);
}

#[test]
fn graph_host_nodes_run_in_dependency_order() {
    let context = fake_primary_context();
    let stream = Stream::new_non_blocking(&context).unwrap();
    let log: Arc<Mutex<String>> = Arc::default();
    let drops = Drops::new();
    let graph = Graph::new().unwrap();
    let node = |deps: &[_], tag: char| {
        let (log, owner) = (Arc::clone(&log), drops.owner());
        add_host_node(&graph, deps, move || {
            let _keep = &owner;
            log.lock().unwrap().push(tag);
        })
        .unwrap()
    };
    let a = node(&[], 'A');
    let b = node(&[a], 'B');
    let c = node(&[b], 'C');
    // A second root and a join: D after both A and C.
    node(&[c, a], 'D');
    let nodes = graph.node_types().unwrap();
    assert_eq!(nodes.len(), 4);
    assert!(nodes.iter().all(|(_, t)| *t == HOST), "{nodes:?}");
    assert_eq!(
        &nodes[..3].iter().map(|(n, _)| *n).collect::<Vec<_>>(),
        &[a, b, c]
    );
    assert!(log.lock().unwrap().is_empty(), "adding a node ran it");

    replay(&graph, &stream, 2);
    assert_eq!(*log.lock().unwrap(), "ABCDABCD");
    drop(graph);
    drops.wait_dropped(4);
}

isolated_test! {
    /// The owners of a captured launch live through a clone of the graph, two executable graphs,
    /// the source graph's destruction and a launch in flight; they are dropped exactly once, by
    /// the reaper (not on the driver's thread), only once the last executable graph is gone.
    /// (In a process of its own: the fake's user-object counts are process-wide.)
    fn captured_owners_are_dropped_once_off_the_driver_thread_after_the_last_executable_graph() {
        let context = fake_primary_context();
        let stream = Stream::new_non_blocking(&context).unwrap();
        let drops = Drops::new();
        let (graph, runs, ran_on) = capture_counted_closure(&stream, &drops);
        assert_eq!(fake().referenced_user_objects(), 1);
        let clone = graph.try_clone().unwrap();
        assert_eq!(host_nodes(&clone), 1);
        let first = graph.instantiate().unwrap();
        let second = clone.instantiate().unwrap();
        drop(graph);
        drop(clone);
        first.launch(&stream).unwrap();
        second.launch(&stream).unwrap();
        stream.synchronize().unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 2);

        // Still referenced (so its destructor is not even queued), and not dropped.
        flush(PATIENCE).unwrap();
        assert_eq!(fake().referenced_user_objects(), 1);
        assert_eq!(drops.dropped(), 0, "dropped while two executable graphs exist");
        drop(first);
        flush(PATIENCE).unwrap();
        assert_eq!(fake().referenced_user_objects(), 1);
        assert_eq!(drops.dropped(), 0, "dropped while one executable graph exists");

        // The last executable graph goes while a launch of it waits behind a hold: the launch
        // keeps the owners alive until it has run.
        let hold = fake().hold_stream(stream.raw()).expect("the fake could not hold the stream");
        second.launch(&stream).unwrap();
        drop(second);
        flush(PATIENCE).unwrap();
        assert_eq!(fake().referenced_user_objects(), 1);
        assert_eq!(drops.dropped(), 0, "dropped while a launch was in flight");
        hold.release();
        stream.synchronize().unwrap();
        assert_eq!(runs.load(Ordering::SeqCst), 3);

        assert_dropped_by_the_reaper(&drops, 1, &ran_on.only());
        assert_eq!(fake().referenced_user_objects(), 0);
        let destroyed = || fake().live_user_objects() == 0;
        wait_until("the user object's destructor", PATIENCE, destroyed);
        // Still exactly once.
        flush(PATIENCE).unwrap();
        assert_eq!(drops.dropped(), 1);
        assert_eq!(fake().driver_thread_call_count(""), 0);
    }
}
