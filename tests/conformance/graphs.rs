//! Graphs built by hand (host nodes, dependencies, instantiate, launch, destroy) and user
//! objects (references held by graphs, executables and launches; destructors).

use std::ffi::c_void;
use std::ptr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use cuda_dl_sys::types::{
    CUDA_HOST_NODE_PARAMS, CUgraph, CUgraphExec, CUgraphNode, CUresult, CUuserObject,
};
use cuda_workspace::testing::{bump, os_thread};

use super::harness::{Cx, Log, SETTLE, Tagged, cases, data, leak, log_tag, wait_until};

/// `CU_USER_OBJECT_NO_DESTRUCTOR_SYNC`.
const NO_DESTRUCTOR_SYNC: u32 = 1;
/// `CU_GRAPH_USER_OBJECT_MOVE`.
const MOVE: u32 = 1;

/// Counts destructor calls and the threads they ran on.
#[derive(Default)]
struct Destroyed {
    count: AtomicUsize,
    threads: Mutex<Vec<String>>,
}

unsafe extern "C" fn record_destroy(data: *mut c_void) {
    // SAFETY: every user object below is made with a leaked `Destroyed`.
    let destroyed = unsafe { &*data.cast::<Destroyed>() };
    destroyed
        .threads
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .push(os_thread().0);
    destroyed.count.fetch_add(1, Ordering::SeqCst);
}

fn user_object(cx: &Cx, destroyed: &'static Destroyed, references: u32) -> CUuserObject {
    let mut object = ptr::null_mut();
    // SAFETY: a valid out-pointer; `destroyed` is leaked.
    unsafe {
        cx.driver.cuUserObjectCreate(
            &mut object,
            data(destroyed),
            Some(record_destroy),
            references,
            NO_DESTRUCTOR_SYNC,
        )
    }
    .unwrap();
    object
}

fn graph(cx: &Cx) -> CUgraph {
    let mut graph = ptr::null_mut();
    // SAFETY: a valid out-pointer.
    unsafe { cx.driver.cuGraphCreate(&mut graph, 0) }.unwrap();
    graph
}

fn host_node(
    cx: &Cx,
    graph: CUgraph,
    after: &[CUgraphNode],
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut c_void,
) -> CUgraphNode {
    let params = CUDA_HOST_NODE_PARAMS {
        fn_: Some(f),
        userData: data,
    };
    let mut node = ptr::null_mut();
    // SAFETY: a live graph; `after` are its nodes; valid parameters.
    unsafe {
        cx.driver
            .cuGraphAddHostNode(&mut node, graph, after.as_ptr(), after.len(), &params)
    }
    .unwrap();
    node
}

fn instantiate(cx: &Cx, graph: CUgraph) -> CUgraphExec {
    let mut exec = ptr::null_mut();
    // SAFETY: a valid out-pointer; a live graph.
    unsafe { cx.driver.cuGraphInstantiateWithFlags(&mut exec, graph, 0) }.unwrap();
    exec
}

cases! {
    /// Host nodes run in dependency order on every launch of the executable graph, which works
    /// on after its graph is destroyed.
    fn graph_host_nodes_run_in_dependency_order_on_every_launch(cx) {
        let stream = cx.stream();
        let log = leak(Log::default());
        let graph = graph(cx);
        let a = host_node(cx, graph, &[], log_tag, Tagged::data(log, b'A'));
        let b = host_node(cx, graph, &[a], log_tag, Tagged::data(log, b'B'));
        host_node(cx, graph, &[b], log_tag, Tagged::data(log, b'C'));
        let exec = instantiate(cx, graph);
        // SAFETY: handles from the driver.
        unsafe {
            cx.driver.cuGraphDestroy(graph).unwrap();
            cx.driver.cuGraphLaunch(exec, stream).unwrap();
            cx.driver.cuGraphLaunch(exec, stream).unwrap();
            cx.driver.cuStreamSynchronize(stream).unwrap();
            cx.driver.cuGraphExecDestroy(exec).unwrap();
        }
        assert_eq!(log.tags(), b"ABCABC");
    }

    /// A user object's destructor runs once, on a thread that is not the caller's, after the last
    /// reference is gone: the graph's (moved from the caller), the executable graph's, and that
    /// of a launch still in flight.
    fn a_user_object_outlives_its_graph_while_a_launch_is_in_flight(cx) {
        let stream = cx.stream();
        let ran = leak(AtomicUsize::new(0));
        let destroyed = leak(Destroyed::default());
        let object = user_object(cx, destroyed, 1);
        let graph = graph(cx);
        host_node(cx, graph, &[], bump, data(ran));
        // SAFETY: live handles; the caller's one reference moves to the graph.
        unsafe { cx.driver.cuGraphRetainUserObject(graph, object, 1, MOVE) }.unwrap();
        let exec = instantiate(cx, graph);
        let hold = cx.hold(stream);
        // SAFETY: handles from the driver, not used afterwards.
        unsafe {
            cx.driver.cuGraphDestroy(graph).unwrap();
            cx.driver.cuGraphLaunch(exec, stream).unwrap();
            cx.driver.cuGraphExecDestroy(exec).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!(destroyed.count.load(Ordering::SeqCst), 0, "destroyed while a launch was in flight");
        hold.release();
        wait_until("the destructor", || destroyed.count.load(Ordering::SeqCst) == 1);
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        std::thread::sleep(SETTLE);
        assert_eq!(destroyed.count.load(Ordering::SeqCst), 1);
        let threads = destroyed.threads.lock().unwrap().clone();
        assert_ne!(threads[0], os_thread().0, "the destructor ran on the caller's thread");
    }

    /// A clone of a graph holds user-object references of its own: destroying the original
    /// keeps the object; destroying the clone destroys it.
    fn a_graph_clone_holds_its_own_user_object_references(cx) {
        let destroyed = leak(Destroyed::default());
        let object = user_object(cx, destroyed, 1);
        let original = graph(cx);
        let mut clone = ptr::null_mut();
        // SAFETY: live handles; the caller's reference is released after the graph retains one.
        unsafe {
            cx.driver.cuGraphRetainUserObject(original, object, 1, 0).unwrap();
            cx.driver.cuUserObjectRelease(object, 1).unwrap();
            cx.driver.cuGraphClone(&mut clone, original).unwrap();
            cx.driver.cuGraphDestroy(original).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!(destroyed.count.load(Ordering::SeqCst), 0, "destroyed with the original");
        // SAFETY: a live graph, not used afterwards.
        unsafe { cx.driver.cuGraphDestroy(clone) }.unwrap();
        wait_until("the destructor", || destroyed.count.load(Ordering::SeqCst) == 1);
    }

    /// `cuUserObjectRetain` and `cuUserObjectRelease` count references: the destructor runs once
    /// the count reaches zero, not before; a graph's release (`cuGraphReleaseUserObject`) counts
    /// like the caller's.
    fn user_object_references_are_counted(cx) {
        let destroyed = leak(Destroyed::default());
        let object = user_object(cx, destroyed, 2);
        let graph = graph(cx);
        // SAFETY: a live user object and graph.
        unsafe {
            cx.driver.cuUserObjectRetain(object, 3).unwrap();
            cx.driver.cuUserObjectRelease(object, 4).unwrap();
            cx.driver.cuGraphRetainUserObject(graph, object, 2, 0).unwrap();
            cx.driver.cuUserObjectRelease(object, 1).unwrap();
            cx.driver.cuGraphReleaseUserObject(graph, object, 1).unwrap();
        }
        std::thread::sleep(SETTLE);
        assert_eq!(destroyed.count.load(Ordering::SeqCst), 0, "destroyed with references left");
        // SAFETY: a live graph, not used afterwards.
        unsafe { cx.driver.cuGraphDestroy(graph) }.unwrap();
        wait_until("the destructor", || destroyed.count.load(Ordering::SeqCst) == 1);
        std::thread::sleep(SETTLE);
        assert_eq!(destroyed.count.load(Ordering::SeqCst), 1);
    }

    /// `cuGraphInstantiateWithFlags` takes only the flags its reference lists for it: none,
    /// `AUTO_FREE_ON_LAUNCH` (1) and `USE_NODE_PRIORITY` (8) for a graph of host nodes; `UPLOAD`
    /// (2, for `cuGraphInstantiateWithParams` only), an unknown bit, `DEVICE_LAUNCH` (4) with
    /// `AUTO_FREE_ON_LAUNCH`, and `DEVICE_LAUNCH` for a graph with a host node (a device-launched
    /// graph holds only kernel, memcpy and memset nodes) are `CUDA_ERROR_INVALID_VALUE`.
    fn graph_instantiate_refuses_the_flags_the_driver_refuses(cx) {
        let ran = leak(AtomicUsize::new(0));
        let graph = graph(cx);
        host_node(cx, graph, &[], bump, data(ran));
        let with = |flags: u64| {
            let mut exec: CUgraphExec = ptr::null_mut();
            // SAFETY: a valid out-pointer; a live graph.
            let made = unsafe { cx.driver.cuGraphInstantiateWithFlags(&mut exec, graph, flags) };
            if made.is_ok() {
                // SAFETY: just made, not launched.
                unsafe { cx.driver.cuGraphExecDestroy(exec) }.unwrap();
            }
            made.err().map(|e| cuda_dl_sys::Error::from(e).code())
        };
        for flags in [0, 1, 8, 1 | 8] {
            assert_eq!(with(flags), None, "flags {flags:#x} refused");
        }
        let invalid = Some(Some(CUresult::CUDA_ERROR_INVALID_VALUE));
        for flags in [2, 1 << 20, 4 | 1, 4] {
            assert_eq!(with(flags), invalid, "flags {flags:#x}");
        }
        // SAFETY: a live graph, not used afterwards.
        unsafe { cx.driver.cuGraphDestroy(graph) }.unwrap();
    }
}
