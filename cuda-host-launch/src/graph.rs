//! Graph host nodes whose owners live as long as the graph, and thin graph / executable-graph types.

use std::ffi::c_void;
use std::marker::PhantomData;
use std::ptr;

use cuda_dl_sys::types::{
    CUDA_HOST_NODE_PARAMS, CUDA_HOST_NODE_PARAMS_v2, CUgraph, CUgraphExec, CUgraphNode,
    CUgraphNodeParams, CUgraphNodeType, CUhostFn, CUresult,
};

use crate::enqueue::admit::admit;
use crate::enqueue::refusal::Refusal;
use crate::launch::raw_payload;
use crate::launch_error::LaunchError;
use crate::reaper::defer_drop::defer_drop;
use crate::reaper::owned_record::OwnedRecord;
use crate::record::payload::RawPayload;
use crate::support::error::Error;
use crate::support::host_thread::refuse_inside_host_function;
use crate::support::raw_stream::AsRawStream;
use crate::transport::host_function::{RepeatableClosure, trampoline_repeatable};
use crate::transport::options::LaunchOptions;
use crate::transport::user_object::GraphOwnedRecord;

/// A CUDA graph (`CUgraph`), destroyed on drop.
///
/// Host nodes added by this crate own their closures or owners through user objects: destroying the
/// graph does not free them while an executable graph made from it still exists.
#[derive(Debug)]
pub struct Graph {
    raw: CUgraph,
}

// SAFETY: a graph handle may be used from any thread, one thread at a time (graphs are not
// internally synchronized, hence no `Sync`).
unsafe impl Send for Graph {}

impl Graph {
    /// An empty graph (`cuGraphCreate`).
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn new() -> Result<Graph, Error> {
        refuse_inside_host_function("Graph::new")?;
        let driver = cuda_dl_sys::driver()?;
        let mut raw = ptr::null_mut();
        // SAFETY: `raw` is a valid place to write; flags must be 0.
        unsafe { driver.cuGraphCreate(&mut raw, 0)? };
        Ok(Graph { raw })
    }

    /// Takes ownership of a graph made elsewhere (say, by `cuStreamEndCapture`); it is destroyed
    /// when this value is dropped.
    ///
    /// # Safety
    /// `raw` must be a live graph that nothing else destroys.
    pub unsafe fn from_raw(raw: CUgraph) -> Graph {
        Graph { raw }
    }

    /// The driver's handle.
    pub fn raw(&self) -> CUgraph {
        self.raw
    }

    /// A copy of the graph (`cuGraphClone`); the copy holds its own references to the user objects
    /// (and so the owners) of this crate's host nodes.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn try_clone(&self) -> Result<Graph, Error> {
        refuse_inside_host_function("Graph::try_clone")?;
        let driver = cuda_dl_sys::driver()?;
        let mut raw = ptr::null_mut();
        // SAFETY: live graph; valid out-pointer.
        unsafe { driver.cuGraphClone(&mut raw, self.raw)? };
        Ok(Graph { raw })
    }

    /// An executable graph (`cuGraphInstantiateWithFlags`, no flags), which holds its own references
    /// to the graph's user objects.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn instantiate(&self) -> Result<GraphExec, Error> {
        refuse_inside_host_function("Graph::instantiate")?;
        let driver = cuda_dl_sys::driver()?;
        let mut raw = ptr::null_mut();
        // SAFETY: live graph; valid out-pointer.
        unsafe { driver.cuGraphInstantiateWithFlags(&mut raw, self.raw, 0)? };
        Ok(GraphExec { raw })
    }

    /// The graph's nodes (`cuGraphGetNodes`), borrowed from it.
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    ///
    /// # Examples
    /// A node handle cannot outlive its graph:
    /// ```compile_fail,E0505
    /// # fn main() -> Result<(), cuda_host_launch::Error> {
    /// let graph = cuda_host_launch::Graph::new()?;
    /// let nodes = graph.nodes()?;
    /// drop(graph);
    /// let _dangling = nodes;
    /// # Ok(()) }
    /// ```
    pub fn nodes(&self) -> Result<Vec<GraphNode<'_>>, Error> {
        refuse_inside_host_function("Graph::nodes")?;
        let driver = cuda_dl_sys::driver()?;
        let mut count = 0usize;
        // SAFETY: live graph; a null array asks for the count.
        unsafe { driver.cuGraphGetNodes(self.raw, ptr::null_mut(), &mut count)? };
        if count == 0 {
            // The real driver refuses an array with room for no node.
            return Ok(Vec::new());
        }
        let mut nodes = vec![ptr::null_mut(); count];
        // SAFETY: `nodes` has room for `count` handles.
        unsafe { driver.cuGraphGetNodes(self.raw, nodes.as_mut_ptr(), &mut count)? };
        nodes.truncate(count);
        Ok(nodes
            .into_iter()
            // SAFETY: the driver just listed `node` as a node of this graph.
            .map(|node| unsafe { GraphNode::from_raw(self, node) })
            .collect())
    }

    /// Each node with its type (`cuGraphGetNodes`, `cuGraphNodeGetType`).
    ///
    /// # Errors
    /// [`Error::Cuda`] if a call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn node_types(&self) -> Result<Vec<(GraphNode<'_>, CUgraphNodeType)>, Error> {
        refuse_inside_host_function("Graph::node_types")?;
        let driver = cuda_dl_sys::driver()?;
        self.nodes()?
            .into_iter()
            .map(|node| {
                let mut kind = CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
                // SAFETY: `node` is a node of this live graph, as the driver just listed it.
                unsafe { driver.cuGraphNodeGetType(node.raw, &mut kind)? };
                Ok((node, kind))
            })
            .collect()
    }
}

/// A node of a [`Graph`], borrowed from it: what [`add_host_node`] and [`Graph::nodes`] return, and
/// what [`add_host_node`] takes as dependencies.
///
/// The borrow keeps the graph alive (and so the node: this crate never removes nodes) for as long
/// as the handle is used, and the node remembers its graph, so that a node of another graph given
/// as a dependency is refused with [`Error::NodeOfAnotherGraph`] before the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GraphNode<'g> {
    raw: CUgraphNode,
    /// The handle of the graph the node belongs to, which `_graph` keeps alive.
    graph: CUgraph,
    _graph: PhantomData<&'g Graph>,
}

impl<'g> GraphNode<'g> {
    /// A node made elsewhere (say, by a raw `cuGraphAddKernelNode`), as a node of `graph`.
    ///
    /// # Safety
    /// `raw` must be a node of `graph`, and stay one (not destroyed with `cuGraphDestroyNode`) for
    /// as long as the returned value, or any copy of it, is used.
    pub unsafe fn from_raw(graph: &'g Graph, raw: CUgraphNode) -> GraphNode<'g> {
        GraphNode {
            raw,
            graph: graph.raw,
            _graph: PhantomData,
        }
    }

    /// The driver's handle.
    pub fn raw(self) -> CUgraphNode {
        self.raw
    }
}

/// The handles of `dependencies`, each checked to be a node of `graph`.
fn raw_dependencies(
    graph: &Graph,
    dependencies: &[GraphNode<'_>],
) -> Result<Vec<CUgraphNode>, Error> {
    dependencies
        .iter()
        .map(|node| {
            if node.graph == graph.raw {
                Ok(node.raw)
            } else {
                Err(Error::NodeOfAnotherGraph {
                    node: node.raw.addr(),
                    node_graph: node.graph.addr(),
                    graph: graph.raw.addr(),
                })
            }
        })
        .collect()
}

/// A driver handle and the call that destroys it, run when this is dropped: what `Graph` and
/// `GraphExec` hand to `defer_drop`, so that a drop inside a host function waits for the reaper.
struct DestroyLater<H: Copy> {
    handle: H,
    destroy: unsafe fn(&cuda_dl_sys::Driver, H) -> Result<(), cuda_dl_sys::CallError>,
}

// SAFETY: a graph or executable-graph handle, which the driver lets any thread destroy; used by one
// thread only, the one that drops this.
unsafe impl<H: Copy> Send for DestroyLater<H> {}

impl<H: Copy> Drop for DestroyLater<H> {
    fn drop(&mut self) {
        if let Ok(driver) = cuda_dl_sys::driver() {
            // SAFETY: `destroy` is the destroy call for `handle`, which is live (its owner is being
            // dropped) and destroyed once, here.
            let _ = unsafe { (self.destroy)(driver, self.handle) };
        }
    }
}

impl Drop for Graph {
    fn drop(&mut self) {
        defer_drop(DestroyLater {
            handle: self.raw,
            destroy: cuda_dl_sys::Driver::cuGraphDestroy,
        });
    }
}

/// An executable graph (`CUgraphExec`), destroyed on drop.
#[derive(Debug)]
pub struct GraphExec {
    raw: CUgraphExec,
}

// SAFETY: an executable graph may be used from any thread, one at a time (not internally
// synchronized, hence no `Sync`).
unsafe impl Send for GraphExec {}

impl GraphExec {
    /// Launches the graph on `stream` (`cuGraphLaunch`).
    ///
    /// # Errors
    /// [`Error::Cuda`] if the call fails.
    /// [`Error::InsideHostFunction`] inside a host function (no driver call is made).
    pub fn launch(&self, stream: impl AsRawStream) -> Result<(), Error> {
        refuse_inside_host_function("GraphExec::launch")?;
        let driver = cuda_dl_sys::driver()?;
        // SAFETY: live executable graph; the stream is valid by `AsRawStream`'s contract.
        unsafe { driver.cuGraphLaunch(self.raw, stream.as_raw_stream())? };
        Ok(())
    }

    /// The driver's handle.
    pub fn raw(&self) -> CUgraphExec {
        self.raw
    }
}

impl Drop for GraphExec {
    fn drop(&mut self) {
        defer_drop(DestroyLater {
            handle: self.raw,
            destroy: cuda_dl_sys::Driver::cuGraphExecDestroy,
        });
    }
}

/// Adds a host node running `f` after `dependencies` (`cuGraphAddHostNode`). `f` (with its captures)
/// is owned by the graph through a user object and dropped, off the driver's thread, once the graph
/// and every executable graph made from it are destroyed. A panic in `f` is caught on every run and
/// reported.
///
/// # Errors
/// A [`LaunchError`]: [`Error::NodeOfAnotherGraph`] if a dependency is not a node of `graph` (no
/// driver call is made); [`Error::InsideHostFunction`]; [`Error::Cuda`] if a driver call fails
/// (`DriverTooOld` before 11.3, which has no user objects). `f` is handed back, unrun, whichever
/// step failed (after a failed `cuGraphRetainUserObject`, `cuGraphAddHostNode` or
/// `cuGraphAddNode` it is taken back out of the graph's user object, which is let go): no node is
/// left pointing at it.
///
/// # Examples
/// ```
/// use std::sync::Arc;
/// use std::sync::atomic::{AtomicUsize, Ordering};
/// use cuda_host_launch::{Device, Graph, PrimaryContext, Stream, add_host_node};
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
/// let context = PrimaryContext::retain(Device::get(0)?)?;
/// let stream = Stream::new(&context)?;
/// let graph = Graph::new()?;
/// let runs = Arc::new(AtomicUsize::new(0));
/// let counter = Arc::clone(&runs);
/// let first = add_host_node(&graph, &[], move || {
///     counter.fetch_add(1, Ordering::Relaxed);
/// })?;
/// add_host_node(&graph, &[first], || println!("after the first node"))?;
/// let exec = graph.instantiate()?;
/// exec.launch(&stream)?;
/// # Ok(()) }
/// ```
///
/// The node handle returned cannot outlive its graph:
/// ```compile_fail,E0505
/// # fn main() -> Result<(), cuda_host_launch::Error> {
/// use cuda_host_launch::{Graph, add_host_node};
/// let graph = Graph::new()?;
/// let node = add_host_node(&graph, &[], || {})?;
/// drop(graph);
/// let other = Graph::new()?;
/// add_host_node(&other, &[node], || {})?;
/// # Ok(()) }
/// ```
pub fn add_host_node<'g, F>(
    graph: &'g Graph,
    dependencies: &[GraphNode<'_>],
    f: F,
) -> Result<GraphNode<'g>, LaunchError<F>>
where
    F: Fn() + Send + Sync + 'static,
{
    LaunchOptions::default().add_host_node(graph, dependencies, f)
}

impl LaunchOptions {
    /// [`add_host_node`] with these options: with a sync mode, the node is added through
    /// `cuGraphAddNode` with the v2 host-node parameters (drivers 13.2 and newer, where their
    /// `syncMode` field and `cuLaunchHostFunc_v2` appeared, else `DriverTooOld`).
    ///
    /// # Errors
    /// As [`add_host_node`].
    ///
    /// # Examples
    /// Compiled, not run (the doc tests' fake driver reports CUDA 13.0; this needs 13.2):
    /// ```no_run
    /// use cuda_host_launch::{Device, Graph, HostTaskSyncMode, LaunchOptions, PrimaryContext};
    /// # fn main() -> Result<(), cuda_host_launch::Error> {
    /// # let _fake = fake_cuda::fixture::driver(); // the doc tests' driver: the fake
    /// let context = PrimaryContext::retain(Device::get(0)?)?;
    /// context.set_current()?;
    /// let graph = Graph::new()?;
    /// let spin = LaunchOptions::with_sync_mode(HostTaskSyncMode::SpinWait);
    /// let first = spin.add_host_node(&graph, &[], || println!("first"))?;
    /// spin.add_host_node(&graph, &[first], || println!("then"))?;
    /// # Ok(()) }
    /// ```
    pub fn add_host_node<'g, F>(
        &self,
        graph: &'g Graph,
        dependencies: &[GraphNode<'_>],
        f: F,
    ) -> Result<GraphNode<'g>, LaunchError<F>>
    where
        F: Fn() + Send + Sync + 'static,
    {
        let dependencies = match raw_dependencies(graph, dependencies) {
            Ok(dependencies) => dependencies,
            Err(e) => return Err(LaunchError::new(e, Some(f))),
        };
        let record = OwnedRecord::graph_node(RepeatableClosure(f));
        // SAFETY: `graph` is a live graph (borrowed, and not `Sync`, so no other thread uses it);
        // `dependencies` are its nodes (checked above); a repeatable closure record may run any
        // number of times.
        let node =
            unsafe { add_node(graph.raw, &dependencies, self, record) }.map_err(|refusal| {
                // SAFETY: the record was made just above with a `RepeatableClosure<F>`.
                unsafe { LaunchError::unpack(refusal, |p: RepeatableClosure<F>| Some(p.0)) }
            })?;
        // SAFETY: the driver just added `node` to `graph`; this crate never removes nodes.
        Ok(unsafe { GraphNode::from_raw(graph, node) })
    }

    /// Adds a host node running `f(user_data)` (`cuGraphAddHostNode`) to a graph made anywhere,
    /// with `owners` kept alive by the graph (through a user object) until it and every executable
    /// graph made from it are destroyed, then dropped off the driver's thread.
    ///
    /// The raw form, for binding authors: the graph and the dependencies are raw handles, and so
    /// is the node returned ([`GraphNode::from_raw`] borrows it from a [`Graph`]).
    ///
    /// # Safety
    /// - `graph` must be a live graph, not used by another thread during the call;
    /// - `dependencies` must be nodes of `graph`;
    /// - `f(user_data)` must be sound to call any number of times, from driver threads, possibly
    ///   concurrently, and must not unwind; what `user_data` points to must live as long as
    ///   `owners`.
    ///
    /// # Errors
    /// As [`add_host_node`] (`owners` handed back or kept as `f` is there); [`Error::NullFunction`]
    /// for a null `f` (handed back).
    pub unsafe fn add_host_node_raw<O>(
        &self,
        graph: CUgraph,
        dependencies: &[CUgraphNode],
        f: CUhostFn,
        user_data: *mut c_void,
        owners: O,
    ) -> Result<CUgraphNode, LaunchError<O>>
    where
        O: Send + Sync + 'static,
    {
        let record = OwnedRecord::graph_node(raw_payload(f, user_data, owners)?);
        // SAFETY: the caller's contract.
        unsafe { add_node(graph, dependencies, self, record) }.map_err(|refusal| {
            // SAFETY: the record was made just above with a `RawPayload<O>`.
            unsafe { LaunchError::unpack(refusal, |p: RawPayload<O>| Some(p.owners)) }
        })
    }
}

/// The driver's call that adds a host node with these options, resolved before the record is
/// handed to the graph (so a driver without it refuses the node with the record handed back).
enum AddNode {
    /// `cuGraphAddHostNode` (no sync mode).
    Host(
        unsafe extern "C" fn(
            *mut CUgraphNode,
            CUgraph,
            *const CUgraphNode,
            usize,
            *const CUDA_HOST_NODE_PARAMS,
        ) -> CUresult,
    ),
    /// `cuGraphAddNode` with the v2 host-node parameters and this sync mode.
    Node(
        unsafe extern "C" fn(
            *mut CUgraphNode,
            CUgraph,
            *const CUgraphNode,
            *const cuda_dl_sys::types::CUgraphEdgeData,
            usize,
            *mut CUgraphNodeParams,
        ) -> CUresult,
        u32,
    ),
}

/// Attaches `record` to `graph`, then adds the node that runs it; detaches if adding fails. The
/// record goes back in the refusal whichever step failed (taken back out of the user object).
///
/// # Safety
/// `graph` live; `dependencies` its nodes; the record repeatable.
unsafe fn add_node(
    graph: CUgraph,
    dependencies: &[CUgraphNode],
    options: &LaunchOptions,
    record: OwnedRecord,
) -> Result<CUgraphNode, Refusal> {
    let checks = || -> Result<_, Error> {
        let driver = admit("adding a graph host node")?.driver;
        options.check_supported(driver)?;
        let add = match options.sync_mode {
            None => AddNode::Host(driver.raw().cuGraphAddHostNode()?),
            Some(mode) => AddNode::Node(driver.raw().cuGraphAddNode()?, mode.raw()),
        };
        Ok((driver, add))
    };
    let (driver, add) = match checks() {
        Ok(checked) => checked,
        Err(e) => return Err(Refusal::back(e, record)),
    };
    let owned = GraphOwnedRecord::attach(driver, graph, record)?;
    let mut node: CUgraphNode = ptr::null_mut();
    let (code, function) = match add {
        AddNode::Host(add) => {
            let params = CUDA_HOST_NODE_PARAMS {
                fn_: Some(trampoline_repeatable),
                userData: owned.user_data(),
            };
            // SAFETY: live graph, its dependencies, valid params and out-pointer.
            let code = unsafe {
                add(
                    &mut node,
                    graph,
                    dependencies.as_ptr(),
                    dependencies.len(),
                    &params,
                )
            };
            (code, "cuGraphAddHostNode")
        }
        AddNode::Node(add, mode) => {
            let mut params = CUgraphNodeParams {
                type_: CUgraphNodeType::CU_GRAPH_NODE_TYPE_HOST,
                ..Default::default()
            };
            params.__bindgen_anon_1.host = CUDA_HOST_NODE_PARAMS_v2 {
                fn_: Some(trampoline_repeatable),
                userData: owned.user_data(),
                syncMode: mode,
                ..Default::default()
            };
            // SAFETY: live graph, its dependencies (no edge data), valid params and out-pointer.
            let code = unsafe {
                add(
                    &mut node,
                    graph,
                    dependencies.as_ptr(),
                    ptr::null(),
                    dependencies.len(),
                    &mut params,
                )
            };
            (code, "cuGraphAddNode")
        }
    };
    if code != CUresult::CUDA_SUCCESS {
        // No node uses the record: taken back from the user object, which goes.
        let record = owned.detach(driver, true);
        let error = cuda_dl_sys::Error::from(driver.describe(code, Some(function)));
        return Err(Refusal::back_if_taken(error.into(), record));
    }
    // The caller's graph, alive throughout: it alone owns the record now.
    owned.settle(driver, true);
    Ok(node)
}
