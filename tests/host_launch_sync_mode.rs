//! The sync-mode option (`LaunchOptions::with_sync_mode`) needs `cuLaunchHostFunc_v2` (CUDA 13.2,
//! the version the driver registers it at; its typedef's 13010 is a placeholder). On 13.0 and 13.1
//! drivers every launch that asks for it returns `DriverTooOld`, with its owners dropped and no
//! call made; on 13.2 and newer launches go through `cuLaunchHostFunc_v2`, and
//! `add_host_node_with` through `cuGraphAddNode`. The driver version is read once per process, so
//! each version has a process of its own.

use std::ffi::c_void;
use std::ptr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::DriverVersion;
use cuda_dl_sys::types::{CUgraph, CUgraphNodeType, CUstreamCaptureMode};
use cuda_host_launch::{Error, Graph, HostTaskSyncMode, LaunchError, LaunchOptions, Stream};
use cuda_workspace::isolated_test;
use cuda_workspace::testing::bump;
use cuda_workspace::testing::{Drops, ThreadInfo, fake, fake_primary_context, load_fake_driver};

const RELAXED: CUstreamCaptureMode = CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_RELAXED;

/// A closure that counts its runs and owns an owner of `drops`.
fn counting(runs: &Arc<AtomicUsize>, drops: &Arc<Drops>) -> impl Fn() + Send + Sync + 'static {
    let (runs, owner) = (Arc::clone(runs), drops.owner());
    move || {
        let _keep = &owner;
        runs.fetch_add(1, Ordering::SeqCst);
    }
}

/// `result` is `DriverTooOld` for the sync mode, with what the call was given handed back (dropped
/// here, by the caller).
#[track_caller]
fn assert_too_old<T: std::fmt::Debug, V: Send + 'static>(
    result: Result<T, LaunchError<V>>,
    version: i32,
) {
    if let Err(e) = &result {
        assert!(e.is_handed_back(), "not handed back: {e:?}");
    }
    match result.map_err(LaunchError::into_error) {
        Err(Error::Cuda(cuda_dl_sys::Error::DriverTooOld {
            function,
            required,
            found,
            ..
        })) => {
            assert_eq!(function, "cuLaunchHostFunc_v2");
            assert_eq!(required, 13020);
            assert_eq!(found, DriverVersion(version));
        }
        other => {
            panic!("expected DriverTooOld (cuLaunchHostFunc_v2, 13020, {version}), got {other:?}")
        }
    }
}

/// With a sync mode, on a 13.2+ driver: launches (closure, raw, repeatable captured) call
/// `cuLaunchHostFunc_v2` and nothing else; graph nodes are added with `cuGraphAddNode`; all run.
/// The driver gets the mode asked for: `SpinWait` as `CU_HOST_TASK_SPINWAIT` (1), `Blocking` as
/// `CU_HOST_TASK_BLOCKING` (0), for launches and for host nodes. Without a sync mode,
/// `cuLaunchHostFunc` is still used.
fn sync_mode_launches_use_the_v2_calls(version: i32) {
    let context = fake_primary_context();
    assert_eq!(load_fake_driver().version(), DriverVersion(version));
    let stream = Stream::new(&context).unwrap();
    let spin = LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait);
    let blocking = LaunchOptions::with_sync_mode(HostTaskSyncMode::Blocking);
    let runs = Arc::new(AtomicUsize::new(0));
    let drops = Drops::new();

    assert_eq!(fake().last_launch_sync_mode(), None);
    // Each mode reaches the driver as its own value, through both launch forms.
    for (options, raw) in [(spin, 1), (blocking, 0)] {
        options
            .host_launch(&stream, counting(&runs, &drops))
            .unwrap();
        assert_eq!(fake().last_launch_sync_mode(), Some(raw), "{options:?}");
        let data = Arc::as_ptr(&runs).cast_mut().cast::<c_void>();
        // SAFETY: `bump` only touches the counter, which the owner keeps alive; it does not unwind.
        unsafe { options.launch_host_function(&stream, Some(bump), data, Arc::clone(&runs)) }
            .unwrap();
        assert_eq!(fake().last_launch_sync_mode(), Some(raw), "{options:?}");
    }
    stream.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 4);
    assert_eq!(fake().call_count("cuLaunchHostFunc_v2"), 4);
    assert_eq!(
        fake().call_count("cuLaunchHostFunc"),
        4,
        "the v1 entry was called"
    );

    // Default options: the v1 entry, on any driver.
    LaunchOptions::default()
        .host_launch(&stream, counting(&runs, &drops))
        .unwrap();
    stream.synchronize().unwrap();
    assert_eq!(fake().call_count("cuLaunchHostFunc"), 5);
    assert_eq!(fake().call_count("cuLaunchHostFunc_v2"), 4);

    // A captured repeatable launch with a sync mode is captured through cuLaunchHostFunc_v2.
    let capturing = Stream::new_non_blocking(&context).unwrap();
    let driver = load_fake_driver();
    // SAFETY: a live stream.
    unsafe { driver.cuStreamBeginCapture(capturing.raw(), RELAXED) }.unwrap();
    spin.host_launch_repeatable(&capturing, counting(&runs, &drops))
        .unwrap();
    assert_eq!(fake().last_launch_sync_mode(), Some(1));
    let mut raw: CUgraph = ptr::null_mut();
    // SAFETY: a live stream; a valid out-pointer.
    unsafe { driver.cuStreamEndCapture(capturing.raw(), &mut raw) }.unwrap();
    assert_eq!(fake().call_count("cuLaunchHostFunc_v2"), 5);
    // SAFETY: the graph the capture made, owned by nobody else.
    let captured = unsafe { Graph::from_raw(raw) };

    // A graph node with a sync mode goes through cuGraphAddNode (v2 host-node parameters), with
    // the mode's own value.
    assert_eq!(fake().last_host_node_sync_mode(), None);
    let graph = Graph::new().unwrap();
    spin.add_host_node(&graph, &[], counting(&runs, &drops))
        .unwrap();
    assert_eq!(fake().last_host_node_sync_mode(), Some(1));
    let blocking_graph = Graph::new().unwrap();
    blocking
        .add_host_node(&blocking_graph, &[], counting(&runs, &drops))
        .unwrap();
    assert_eq!(fake().last_host_node_sync_mode(), Some(0));
    assert_eq!(fake().call_count("cuGraphAddNode"), 2);
    assert_eq!(fake().call_count("cuGraphAddHostNode"), 0);
    for graph in [&captured, &graph, &blocking_graph] {
        let types = graph.node_types().unwrap();
        assert_eq!(types.len(), 1);
        assert_eq!(types[0].1, CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST);
        let exec = graph.instantiate().unwrap();
        exec.launch(&stream).unwrap();
        stream.synchronize().unwrap();
    }
    assert_eq!(runs.load(Ordering::SeqCst), 8);
    drop((captured, graph, blocking_graph));
    drops.wait_dropped(6);
    assert_eq!(drops.live(), 0);
}

/// On a driver before 13.2 (reporting `version`) a sync mode is refused with `DriverTooOld {
/// cuLaunchHostFunc_v2, 13020, version }`, by every launch that takes options and by
/// `add_host_node_with`: the owners are handed back (dropped by the caller), nothing is added to a
/// graph or a capture, and neither `cuLaunchHostFunc_v2` nor any other enqueue is called.
fn a_sync_mode_is_refused(version: i32) {
    assert_eq!(load_fake_driver().version(), DriverVersion(version));
    let context = fake_primary_context();
    let stream = Stream::new(&context).unwrap();
    let runs = Arc::new(AtomicUsize::new(0));
    let drops = Drops::new();
    for mode in [HostTaskSyncMode::SpinWait, HostTaskSyncMode::Blocking] {
        let options = LaunchOptions::with_sync_mode(mode);
        assert_too_old(
            options.host_launch(&stream, counting(&runs, &drops)),
            version,
        );
        let data = Arc::as_ptr(&runs).cast_mut().cast::<c_void>();
        // SAFETY: refused before anything could call `bump`.
        assert_too_old(
            unsafe { options.launch_host_function(&stream, Some(bump), data, drops.owner()) },
            version,
        );
        let graph = Graph::new().unwrap();
        assert_too_old(
            options.add_host_node(&graph, &[], counting(&runs, &drops)),
            version,
        );
        assert!(graph.nodes().unwrap().is_empty());

        let driver = load_fake_driver();
        let capturing = Stream::new_non_blocking(&context).unwrap();
        // SAFETY: a live stream.
        unsafe { driver.cuStreamBeginCapture(capturing.raw(), RELAXED) }.unwrap();
        assert_too_old(
            options.host_launch_repeatable(&capturing, counting(&runs, &drops)),
            version,
        );
        let mut raw: CUgraph = ptr::null_mut();
        // SAFETY: a live stream; a valid out-pointer.
        unsafe { driver.cuStreamEndCapture(capturing.raw(), &mut raw) }
            .expect("the capture is still valid");
        // SAFETY: the graph the capture made, owned by nobody else.
        let captured = unsafe { Graph::from_raw(raw) };
        assert!(captured.nodes().unwrap().is_empty());
    }
    let me = ThreadInfo::current();
    let records = drops.records();
    assert_eq!(records.len(), 8, "owners outlived their errors");
    assert!(records.iter().all(|r| r.thread.same_as(&me)), "{records:?}");
    assert_eq!(drops.live(), 0);
    assert_eq!(fake().call_count("cuLaunchHostFunc_v2"), 0);
    assert_eq!(fake().call_count("cuLaunchHostFunc"), 0);
    assert_eq!(fake().call_count("cuGraphAddNode"), 0);
    assert_eq!(fake().call_count("cuGraphAddHostNode"), 0);
    assert_eq!(fake().call_count("cuUserObjectCreate"), 0);
    assert_eq!(fake().last_launch_sync_mode(), None);
    assert_eq!(fake().last_host_node_sync_mode(), None);
    stream.synchronize().unwrap();
    assert_eq!(runs.load(Ordering::SeqCst), 0);
}

isolated_test! {
    /// On 13.0 a sync mode is refused (see `a_sync_mode_is_refused`).
    fn a_sync_mode_on_a_13_0_driver_is_driver_too_old_with_owners_dropped_and_nothing_called(
        FAKE_CUDA_VERSION = "13000"
    ) {
        a_sync_mode_is_refused(13000);
    }

    /// On 13.1 too: it has no `cuLaunchHostFunc_v2` (asked for at the typedef's placeholder
    /// 13010, a driver answers with the three-argument v1, which would ignore the mode).
    fn a_sync_mode_on_a_13_1_driver_is_driver_too_old_with_owners_dropped_and_nothing_called(
        FAKE_CUDA_VERSION = "13010"
    ) {
        a_sync_mode_is_refused(13010);
    }

    /// 13.2 is the first driver with `cuLaunchHostFunc_v2`.
    fn a_sync_mode_on_a_13_2_driver_launches_through_cu_launch_host_func_v2_with_the_mode_asked_for(
        FAKE_CUDA_VERSION = "13020"
    ) {
        sync_mode_launches_use_the_v2_calls(13020);
    }

    /// ... and a newer driver has it too.
    fn a_sync_mode_on_a_13_5_driver_launches_through_cu_launch_host_func_v2_with_the_mode_asked_for(
        FAKE_CUDA_VERSION = "13050"
    ) {
        sync_mode_launches_use_the_v2_calls(13050);
    }
}
