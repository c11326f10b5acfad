//! Graphs, their nodes, executable graphs and launches.
//!
//! Only host nodes (and stream value writes, copies and sets captured into a graph) do anything
//! when launched; empty and kernel nodes are placeholders (the fake runs no kernels).

use std::collections::BTreeMap;
use std::ffi::{c_uint, c_ulonglong};
use std::sync::Arc;

use cuda_dl_sys::types::{
    CUDA_HOST_NODE_PARAMS, CUDA_KERNEL_NODE_PARAMS, CUgraph, CUgraphEdgeData, CUgraphExec,
    CUgraphNode, CUgraphNodeParams, CUgraphNodeType, CUstream,
};

use crate::capture;
use crate::errors::{
    CAPTURE_UNSUPPORTED, INVALID_HANDLE, INVALID_VALUE, NOT_SUPPORTED, Res, ensure,
};
use crate::scheduler::enqueue;
use crate::state::{Action, Exec, Graph, Node, NodeKind, Op, State, as_ptr, lock, new_handle};
use crate::stream::resolve;
use crate::user_object;

/// Registers a new, empty graph.
pub(crate) fn new_graph(st: &mut State) -> usize {
    let handle = new_handle();
    st.graphs.insert(
        handle,
        Graph {
            nodes: Vec::new(),
            user_objects: BTreeMap::new(),
        },
    );
    handle
}

/// Adds a node to `graph` (which exists) after `deps` (nodes of it).
pub(crate) fn add_node(st: &mut State, graph: usize, kind: NodeKind, deps: Vec<usize>) -> usize {
    let handle = new_handle();
    st.nodes.insert(handle, Node { graph, kind, deps });
    if let Some(g) = st.graphs.get_mut(&graph) {
        g.nodes.push(handle);
    }
    handle
}

/// Forgets `graph` and its nodes, and drops its references to user objects.
pub(crate) fn destroy_graph(st: &mut State, graph: usize) {
    let Some(g) = st.graphs.remove(&graph) else {
        return;
    };
    for node in &g.nodes {
        st.nodes.remove(node);
    }
    let refs: Vec<(usize, u32)> = g.user_objects.into_iter().collect();
    user_object::release_all(st, &refs);
}

/// The `n` nodes at `list`, each of which must belong to `graph`.
///
/// # Safety
/// `list` is null or valid for reading `n` handles.
unsafe fn node_list(
    st: &State,
    graph: usize,
    list: *const CUgraphNode,
    n: usize,
) -> Result<Vec<usize>, cuda_dl_sys::types::CUresult> {
    if n == 0 {
        return Ok(Vec::new());
    }
    ensure(!list.is_null(), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes `n` readable handles.
    let nodes = unsafe { std::slice::from_raw_parts(list, n) };
    nodes
        .iter()
        .map(|node| {
            let node = node.addr();
            match st.nodes.get(&node) {
                Some(n) if n.graph == graph => Ok(node),
                _ => Err(INVALID_VALUE),
            }
        })
        .collect()
}

/// The common part of every `cuGraphAdd*Node`.
///
/// # Safety
/// `out` is null or valid for writing a handle; `deps` is null or valid for reading `n` handles.
unsafe fn add(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    kind: NodeKind,
) -> Res {
    ensure(!out.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let graph = graph.addr();
    ensure(st.graphs.contains_key(&graph), INVALID_VALUE)?;
    // SAFETY: the caller's contract covers `deps`.
    let deps = unsafe { node_list(&st, graph, deps, n)? };
    let node = add_node(&mut st, graph, kind, deps);
    // SAFETY: non-null, and the caller passes a valid place for a node handle.
    unsafe { out.write(as_ptr(node)) };
    Ok(())
}

export!("cuGraphCreate", cuGraphCreate => graph_create(phGraph: *mut CUgraph, flags: c_uint));
unsafe fn graph_create(ph: *mut CUgraph, flags: c_uint) -> Res {
    ensure(!ph.is_null() && flags == 0, INVALID_VALUE)?;
    let graph = new_graph(&mut lock());
    // SAFETY: non-null, and the caller passes a valid place for a graph handle.
    unsafe { ph.write(as_ptr(graph)) };
    Ok(())
}

export!("cuGraphDestroy", cuGraphDestroy => graph_destroy(hGraph: CUgraph));
unsafe fn graph_destroy(graph: CUgraph) -> Res {
    let mut st = lock();
    ensure(st.graphs.contains_key(&graph.addr()), INVALID_VALUE)?;
    destroy_graph(&mut st, graph.addr());
    Ok(())
}

export!("cuGraphAddHostNode", cuGraphAddHostNode => add_host_node(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_HOST_NODE_PARAMS));
unsafe fn add_host_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const CUDA_HOST_NODE_PARAMS,
) -> Res {
    ensure(!params.is_null(), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes valid parameters.
    let params = unsafe { params.read() };
    ensure(params.fn_.is_some(), INVALID_VALUE)?;
    let kind = NodeKind::Host {
        f: params.fn_,
        data: params.userData.expose_provenance(),
    };
    // SAFETY: the caller's contract covers `out` and `deps`.
    unsafe { add(out, graph, deps, n, kind) }
}

export!("cuGraphAddEmptyNode", cuGraphAddEmptyNode => add_empty_node(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize));
unsafe fn add_empty_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
) -> Res {
    // SAFETY: the caller's contract covers `out` and `deps`.
    unsafe { add(out, graph, deps, n, NodeKind::Empty) }
}

/// Kernel nodes are accepted whatever their parameters and do nothing (the fake runs no kernels).
unsafe fn add_kernel_node(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *const CUDA_KERNEL_NODE_PARAMS,
) -> Res {
    ensure(!params.is_null(), INVALID_VALUE)?;
    // SAFETY: the caller's contract covers `out` and `deps`.
    unsafe { add(out, graph, deps, n, NodeKind::Kernel) }
}
export!("cuGraphAddKernelNode", cuGraphAddKernelNode => add_kernel_node(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_KERNEL_NODE_PARAMS));
export!("cuGraphAddKernelNode", cuGraphAddKernelNode_v2 => add_kernel_node(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *const CUDA_KERNEL_NODE_PARAMS));

export!("cuGraphAddNode", cuGraphAddNode => add_node_v1(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, numDependencies: usize, nodeParams: *mut CUgraphNodeParams));
unsafe fn add_node_v1(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    params: *mut CUgraphNodeParams,
) -> Res {
    // SAFETY: the caller's contract covers every pointer; there is no edge data.
    unsafe { add_node_v2(out, graph, deps, std::ptr::null(), n, params) }
}

export!("cuGraphAddNode", cuGraphAddNode_v2 => add_node_v2(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, nodeParams: *mut CUgraphNodeParams));
// The 13.4 variant has the same signature (the parameter struct grew optional fields only).
export!("cuGraphAddNode", cuGraphAddNode_v3 => add_node_v2(phGraphNode: *mut CUgraphNode, hGraph: CUgraph, dependencies: *const CUgraphNode, dependencyData: *const CUgraphEdgeData, numDependencies: usize, nodeParams: *mut CUgraphNodeParams));
/// Host and empty nodes (and kernel nodes, as empty ones); other types return 801.
unsafe fn add_node_v2(
    out: *mut CUgraphNode,
    graph: CUgraph,
    deps: *const CUgraphNode,
    _edges: *const CUgraphEdgeData,
    n: usize,
    params: *mut CUgraphNodeParams,
) -> Res {
    ensure(!params.is_null(), INVALID_VALUE)?;
    // SAFETY: non-null, and the caller passes valid parameters.
    let params = unsafe { &*params };
    let kind = match params.type_ {
        CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST => {
            // SAFETY: for a host node the union holds the host parameters.
            let host = unsafe { params.__bindgen_anon_1.host };
            ensure(host.fn_.is_some() && host.syncMode <= 1, INVALID_VALUE)?;
            crate::stream::LAST_SYNC_MODE[crate::stream::SYNC_MODE_OF_HOST_NODE]
                .store(host.syncMode, std::sync::atomic::Ordering::SeqCst);
            NodeKind::Host {
                f: host.fn_,
                data: host.userData.expose_provenance(),
            }
        }
        CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY => NodeKind::Empty,
        CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL => NodeKind::Kernel,
        _ => return Err(NOT_SUPPORTED),
    };
    // SAFETY: the caller's contract covers `out` and `deps`.
    unsafe { add(out, graph, deps, n, kind) }
}

/// Adds the edges `from[i] → to[i]`.
unsafe fn add_dependencies(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    n: usize,
) -> Res {
    let mut st = lock();
    let graph = graph.addr();
    ensure(st.graphs.contains_key(&graph), INVALID_VALUE)?;
    // SAFETY: the caller passes `n` readable handles in each array.
    let (from, to) = unsafe {
        (
            node_list(&st, graph, from, n)?,
            node_list(&st, graph, to, n)?,
        )
    };
    for (from, to) in from.into_iter().zip(to) {
        ensure(from != to, INVALID_VALUE)?;
        if let Some(node) = st.nodes.get_mut(&to)
            && !node.deps.contains(&from)
        {
            node.deps.push(from);
        }
    }
    Ok(())
}
export!("cuGraphAddDependencies", cuGraphAddDependencies => add_dependencies(hGraph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, numDependencies: usize));

export!("cuGraphAddDependencies", cuGraphAddDependencies_v2 => add_dependencies_v2(hGraph: CUgraph, from: *const CUgraphNode, to: *const CUgraphNode, edgeData: *const CUgraphEdgeData, numDependencies: usize));
unsafe fn add_dependencies_v2(
    graph: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    _edges: *const CUgraphEdgeData,
    n: usize,
) -> Res {
    // SAFETY: the same contract; edge data is ignored.
    unsafe { add_dependencies(graph, from, to, n) }
}

export!("cuGraphGetNodes", cuGraphGetNodes => get_nodes(hGraph: CUgraph, nodes: *mut CUgraphNode, numNodes: *mut usize));
unsafe fn get_nodes(graph: CUgraph, nodes: *mut CUgraphNode, num: *mut usize) -> Res {
    ensure(!num.is_null(), INVALID_VALUE)?;
    let st = lock();
    let g = st.graphs.get(&graph.addr()).ok_or(INVALID_VALUE)?;
    if nodes.is_null() {
        // SAFETY: non-null, and the caller passes a valid place for the count.
        unsafe { num.write(g.nodes.len()) };
        return Ok(());
    }
    // SAFETY: non-null, and the caller passes the capacity of `nodes` in it.
    let capacity = unsafe { num.read() };
    for i in 0..capacity {
        let node = g.nodes.get(i).copied().unwrap_or(0);
        // SAFETY: `nodes` has room for `capacity` handles (extra entries are set to null, as the
        // real driver does).
        unsafe { nodes.add(i).write(as_ptr(node)) };
    }
    // SAFETY: as above.
    unsafe { num.write(capacity.min(g.nodes.len())) };
    Ok(())
}

export!("cuGraphNodeGetType", cuGraphNodeGetType => node_get_type(hNode: CUgraphNode, type_: *mut CUgraphNodeType));
unsafe fn node_get_type(node: CUgraphNode, out: *mut CUgraphNodeType) -> Res {
    ensure(!out.is_null(), INVALID_VALUE)?;
    let st = lock();
    let node = st.nodes.get(&node.addr()).ok_or(INVALID_VALUE)?;
    let t = match node.kind {
        NodeKind::Host { .. } => CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST,
        NodeKind::Empty => CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY,
        NodeKind::Kernel => CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL,
        NodeKind::Write32 { .. } | NodeKind::Write64 { .. } => {
            CUgraphNodeType::CU_GRAPH_NODE_TYPE_BATCH_MEM_OP
        }
        NodeKind::Memcpy { .. } => CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMCPY,
        NodeKind::Memset { .. } => CUgraphNodeType::CU_GRAPH_NODE_TYPE_MEMSET,
    };
    // SAFETY: non-null, and the caller passes a valid place for the type.
    unsafe { out.write(t) };
    Ok(())
}

export!("cuGraphHostNodeGetParams", cuGraphHostNodeGetParams => host_node_get_params(hNode: CUgraphNode, nodeParams: *mut CUDA_HOST_NODE_PARAMS));
unsafe fn host_node_get_params(node: CUgraphNode, out: *mut CUDA_HOST_NODE_PARAMS) -> Res {
    ensure(!out.is_null(), INVALID_VALUE)?;
    let st = lock();
    let NodeKind::Host { f, data } = st.nodes.get(&node.addr()).ok_or(INVALID_VALUE)?.kind else {
        return Err(INVALID_VALUE);
    };
    let params = CUDA_HOST_NODE_PARAMS {
        fn_: f,
        userData: as_ptr(data),
    };
    // SAFETY: non-null, and the caller passes a valid place for the parameters.
    unsafe { out.write(params) };
    Ok(())
}

export!("cuGraphDestroyNode", cuGraphDestroyNode => destroy_node(hNode: CUgraphNode));
unsafe fn destroy_node(node: CUgraphNode) -> Res {
    let mut st = lock();
    let node = node.addr();
    let graph = st.nodes.remove(&node).ok_or(INVALID_VALUE)?.graph;
    let siblings = match st.graphs.get_mut(&graph) {
        Some(g) => {
            g.nodes.retain(|n| *n != node);
            g.nodes.clone()
        }
        None => Vec::new(),
    };
    for sibling in siblings {
        if let Some(n) = st.nodes.get_mut(&sibling) {
            n.deps.retain(|d| *d != node);
        }
    }
    Ok(())
}

export!("cuGraphClone", cuGraphClone => graph_clone(phGraphClone: *mut CUgraph, originalGraph: CUgraph));
unsafe fn graph_clone(out: *mut CUgraph, original: CUgraph) -> Res {
    ensure(!out.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let g = st.graphs.get(&original.addr()).ok_or(INVALID_VALUE)?;
    let (nodes, refs): (Vec<usize>, Vec<(usize, u32)>) = (
        g.nodes.clone(),
        g.user_objects.iter().map(|(o, n)| (*o, *n)).collect(),
    );
    let clone = new_graph(&mut st);
    let mut map = BTreeMap::new();
    for node in nodes {
        let Some(n) = st.nodes.get(&node) else {
            continue;
        };
        let (kind, deps) = (n.kind, n.deps.clone());
        let deps = deps.iter().filter_map(|d| map.get(d).copied()).collect();
        let copy = add_node(&mut st, clone, kind, deps);
        map.insert(node, copy);
    }
    user_object::retain_all(&mut st, &refs);
    if let Some(g) = st.graphs.get_mut(&clone) {
        g.user_objects = refs.into_iter().collect();
    }
    // SAFETY: non-null, and the caller passes a valid place for a graph handle.
    unsafe { out.write(as_ptr(clone)) };
    Ok(())
}

/// The nodes of `graph` in a topological order (creation order among the ready ones), or `None`
/// for a cycle.
fn topological_order(st: &State, graph: &Graph) -> Option<Vec<usize>> {
    let mut placed: Vec<usize> = Vec::with_capacity(graph.nodes.len());
    let mut left: Vec<usize> = graph.nodes.clone();
    while !left.is_empty() {
        let ready = left.iter().position(|node| {
            st.nodes
                .get(node)
                .is_none_or(|n| n.deps.iter().all(|d| placed.contains(d)))
        })?;
        placed.push(left.remove(ready));
    }
    Some(placed)
}

/// `CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH`.
const AUTO_FREE_ON_LAUNCH: c_ulonglong = 1;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_DEVICE_LAUNCH`.
const DEVICE_LAUNCH: c_ulonglong = 4;
/// `CUDA_GRAPH_INSTANTIATE_FLAG_USE_NODE_PRIORITY`.
const USE_NODE_PRIORITY: c_ulonglong = 8;

/// Whether `flags` are what `cuGraphInstantiateWithFlags` accepts for `graph`, as its reference
/// says: only `AUTO_FREE_ON_LAUNCH`, `DEVICE_LAUNCH` and `USE_NODE_PRIORITY` (`UPLOAD` is for
/// `cuGraphInstantiateWithParams` only), `DEVICE_LAUNCH` not with `AUTO_FREE_ON_LAUNCH`, and a
/// device-launchable graph holds only kernel, memcpy and memset nodes, at least one.
fn flags_valid(st: &State, graph: &Graph, flags: c_ulonglong) -> bool {
    if flags & !(AUTO_FREE_ON_LAUNCH | DEVICE_LAUNCH | USE_NODE_PRIORITY) != 0 {
        return false;
    }
    if flags & DEVICE_LAUNCH == 0 {
        return true;
    }
    flags & AUTO_FREE_ON_LAUNCH == 0
        && !graph.nodes.is_empty()
        && graph.nodes.iter().all(|node| {
            st.nodes.get(node).is_some_and(|n| {
                matches!(
                    n.kind,
                    NodeKind::Kernel | NodeKind::Memcpy { .. } | NodeKind::Memset { .. }
                )
            })
        })
}

export!("cuGraphInstantiateWithFlags", cuGraphInstantiateWithFlags => instantiate(phGraphExec: *mut CUgraphExec, hGraph: CUgraph, flags: c_ulonglong));
unsafe fn instantiate(out: *mut CUgraphExec, graph: CUgraph, flags: c_ulonglong) -> Res {
    ensure(!out.is_null(), INVALID_VALUE)?;
    let mut st = lock();
    let g = st.graphs.get(&graph.addr()).ok_or(INVALID_VALUE)?;
    ensure(flags_valid(&st, g, flags), INVALID_VALUE)?;
    let order = topological_order(&st, g).ok_or(INVALID_VALUE)?;
    let actions: Arc<[Action]> = order
        .iter()
        .filter_map(|node| match st.nodes.get(node)?.kind {
            NodeKind::Host { f: Some(f), data } => Some(Action::Host { f, data }),
            NodeKind::Write32 { addr, value } => Some(Action::Write32 { addr, value }),
            NodeKind::Write64 { addr, value } => Some(Action::Write64 { addr, value }),
            NodeKind::Memcpy { dst, src, len } => Some(Action::Memcpy { dst, src, len }),
            NodeKind::Memset {
                dst,
                value,
                width,
                count,
            } => Some(Action::Memset {
                dst,
                value,
                width,
                count,
            }),
            _ => None,
        })
        .collect();
    let refs: Vec<(usize, u32)> = g.user_objects.iter().map(|(o, n)| (*o, *n)).collect();
    user_object::retain_all(&mut st, &refs);
    let exec = new_handle();
    st.execs.insert(
        exec,
        Exec {
            actions,
            user_objects: refs,
        },
    );
    // SAFETY: non-null, and the caller passes a valid place for an executable-graph handle.
    unsafe { out.write(as_ptr(exec)) };
    Ok(())
}

export!("cuGraphExecDestroy", cuGraphExecDestroy => exec_destroy(hGraphExec: CUgraphExec));
unsafe fn exec_destroy(exec: CUgraphExec) -> Res {
    let mut st = lock();
    let exec = st.execs.remove(&exec.addr()).ok_or(INVALID_VALUE)?;
    // A launch in flight holds its own references, so destructors wait for it.
    user_object::release_all(&mut st, &exec.user_objects);
    Ok(())
}

stream_export!("cuGraphLaunch", cuGraphLaunch / cuGraphLaunch_ptsz => graph_launch(hGraphExec: CUgraphExec, hStream: CUstream));
unsafe fn graph_launch(exec: CUgraphExec, handle: CUstream, per_thread: bool) -> Res {
    let mut st = lock();
    let s = resolve(&mut st, handle, per_thread)?;
    let e = st.execs.get(&exec.addr()).ok_or(INVALID_HANDLE)?;
    let (actions, refs) = (e.actions.clone(), e.user_objects.clone());
    // Launching a graph inside a capture (a child-graph node) is not modelled.
    ensure(!capture::is_capturing(&st, s), CAPTURE_UNSUPPORTED)?;
    user_object::retain_all(&mut st, &refs);
    let op = Op::Launch {
        actions,
        user_objects: refs,
    };
    crate::errors::result(enqueue(&mut st, s, op))
}
