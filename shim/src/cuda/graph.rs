//! Graphs: nodes of every kind the driver has (kernel, memcpy, memset, host,
//! child graph, empty, event record/wait, memory alloc/free, conditional),
//! edges, queries, clones, ids, user objects, instantiation and launch.
//! Stream capture (`stream.rs`) builds the same graphs.
//!
//! A graph is a list of nodes, each with the handles of the nodes it depends
//! on. Instantiation orders the nodes topologically (insertion order among
//! ready nodes) and flattens child graphs; a launch runs that list on the
//! stream: kernels take device time on the executor, copies, memsets and
//! events happen at the launch (in order, like the sim's async copies), host
//! nodes are queued in stream order, as `cuLaunchHostFunc` is.
//!
//! Graph memory (`cuGraphAddMemAllocNode`): the node fixes the address when
//! it is added (a real mapping, so the address is valid). The device memory
//! behind it is charged to the device when a launch allocates it, and stays
//! reserved by the device's graph memory pool after it is freed (by a free
//! node, `cuMemFree` or `cuMemFreeAsync`) until `cuDeviceGraphMemTrim`, as
//! with the driver: `cuDeviceGetGraphMemAttribute` reports used and reserved
//! bytes and their high-water marks.
//!
//! Conditional nodes: kernels do not compute in the sim, so a condition
//! keeps the value it was given at creation (`defaultLaunchValue`, reset at
//! every launch with `CU_GRAPH_COND_ASSIGN_DEFAULT`): an IF body runs when it
//! is nonzero, a SWITCH runs body `value`, and a WHILE body runs once when it
//! is nonzero (nothing on the device could ever clear it).

use crate::driver::{cu, Driver, Func, KernelNode, Obj};
use crate::{exports, put, stub_fns, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::ffi::{c_char, c_void};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

/// `CUDA_KERNEL_NODE_PARAMS` (v1) and the prefix of `_v2`/`_v3` (they
/// append `kern` and `ctx`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParams {
    pub func: CUfunction,
    pub grid: [u32; 3],
    pub block: [u32; 3],
    pub shared_mem_bytes: u32,
    pub kernel_params: *mut *mut c_void,
    pub extra: *mut *mut c_void,
}

// SAFETY: plain data; the pointers are only handed back to the caller that
// gave them (GetParams), never dereferenced after the node is made.
unsafe impl Send for KernelNodeParams {}
unsafe impl Sync for KernelNodeParams {}

/// `CUDA_KERNEL_NODE_PARAMS_v2`/`_v3`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct KernelNodeParamsV2 {
    pub v1: KernelNodeParams,
    pub kern: CUkernel,
    pub ctx: CUcontext,
}

/// `CUDA_MEMSET_NODE_PARAMS` (v1; `_v2` appends `ctx`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MemsetNodeParams {
    pub dst: CUdeviceptr,
    pub pitch: usize,
    pub value: u32,
    pub element_size: u32,
    pub width: usize,
    pub height: usize,
}

/// `CUDA_HOST_NODE_PARAMS` (v1, and the prefix of `_v2`).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct HostNodeParams {
    pub func: super::stream::CUhostFn,
    pub user_data: *mut c_void,
}

/// `CUDA_MEM_ALLOC_NODE_PARAMS` (v1 = v2 layout).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemAllocNodeParams {
    pub pool_props: CUmemPoolProps,
    pub access_descs: *const CUmemAccessDesc,
    pub access_desc_count: usize,
    pub bytesize: usize,
    pub dptr: CUdeviceptr,
}

/// `CUDA_CONDITIONAL_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ConditionalNodeParams {
    pub handle: u64,
    pub type_: u32,
    pub size: u32,
    pub graph_out: *mut CUgraph,
    pub ctx: CUcontext,
}

/// `CUDA_MEMCPY_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct MemcpyNodeParams {
    pub flags: i32,
    pub reserved: i32,
    pub copy_ctx: CUcontext,
    pub copy: super::array::Memcpy3D,
}

/// `CUgraphNodeParams`: a type, then a union of the per-type parameters
/// (256 bytes in all).
#[repr(C)]
#[derive(Default)]
pub struct GraphNodeParams {
    pub type_: u32,
    pub reserved0: [i32; 3],
    pub u: [u64; 29],
    pub reserved2: i64,
}

/// `CUDA_GRAPH_INSTANTIATE_PARAMS`.
#[repr(C)]
pub struct InstantiateParams {
    pub flags: u64,
    pub upload_stream: CUstream,
    pub err_node_out: CUgraphNode,
    pub result_out: u32,
}

// CUgraphNodeType
pub const NODE_KERNEL: u32 = 0;
pub const NODE_MEMCPY: u32 = 1;
pub const NODE_MEMSET: u32 = 2;
pub const NODE_HOST: u32 = 3;
pub const NODE_GRAPH: u32 = 4;
pub const NODE_EMPTY: u32 = 5;
pub const NODE_WAIT_EVENT: u32 = 6;
pub const NODE_EVENT_RECORD: u32 = 7;
pub const NODE_MEM_ALLOC: u32 = 10;
pub const NODE_MEM_FREE: u32 = 11;
pub const NODE_BATCH_MEM_OP: u32 = 12;
pub const NODE_CONDITIONAL: u32 = 13;

/// A kernel node: what runs, the parameters as given, and its launch
/// attributes (`cuGraphKernelNodeSetAttribute`: id → the 64-byte value).
#[derive(Clone)]
pub struct KernelData {
    pub run: KernelNode,
    pub params: KernelNodeParams,
    /// `kern` and `ctx` of `CUDA_KERNEL_NODE_PARAMS_v2` (NULL when given v1).
    pub kern: usize,
    pub ctx: usize,
    pub attrs: HashMap<u32, [u8; 64]>,
}

/// A graph allocation: its address is fixed when the node is added.
pub struct GraphAlloc {
    pub dev: usize,
    pub ptr: u64,
    pub size: u64,
    /// Bytes it takes in the graph memory pool (a multiple of 2 MiB).
    pub pooled: u64,
    /// Allocated by a launch and not freed yet.
    pub live: std::sync::atomic::AtomicBool,
    /// Executable graphs made from the node's graph that still exist (the
    /// driver allows one at a time).
    pub execs: AtomicU32,
    /// Its node is gone: the address range goes once the memory is freed.
    pub orphan: std::sync::atomic::AtomicBool,
    /// Managed memory (`CU_MEM_ALLOCATION_TYPE_MANAGED` in the node's pool
    /// properties, or captured from a managed pool).
    pub managed: bool,
}

/// A conditional handle (`cuGraphConditionalHandleCreate`).
pub struct CondHandle {
    /// The graph it was created for: only its conditional nodes may use it.
    pub graph: usize,
    pub default: u32,
    pub assign_default: bool,
    pub value: AtomicU32,
}

#[derive(Clone)]
pub enum NodeKind {
    Empty,
    Kernel(KernelData),
    Memcpy(super::array::Memcpy3D),
    Memset(MemsetNodeParams),
    Host(usize, usize),
    /// The child graph's handle (owned by the node).
    Child(usize),
    EventRecord(usize),
    EventWait(usize),
    MemAlloc(Arc<GraphAlloc>),
    MemFree(u64),
    /// Conditional: handle value, type, body graphs (owned by the node).
    Cond(u64, u32, Vec<usize>),
    /// A copy or memset recorded by stream capture (reported as a memcpy or
    /// memset node).
    MemOp(crate::driver::MemOp),
    /// Stream memory operations (`cuGraphAddBatchMemOpNode`).
    BatchMemOp(Arc<BatchNode>),
}

/// A batch memory operation node: its operations (the array handed back by
/// `cuGraphBatchMemOpNodeGetParams`), context and flags.
pub struct BatchNode {
    pub ctx: usize,
    pub ops: Vec<super::stream::BatchMemOp>,
    pub flags: u32,
}

impl BatchNode {
    /// Its parameters as `cuGraphBatchMemOpNodeGetParams` hands them back:
    /// `ops` points into the node's own array, valid while the node lives.
    fn params(&self) -> BatchNodeParams {
        BatchNodeParams {
            ctx: self.ctx as CUcontext,
            count: self.ops.len() as u32,
            ops: self.ops.as_ptr() as *mut _,
            flags: self.flags,
        }
    }
}

/// `CUDA_BATCH_MEM_OP_NODE_PARAMS`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BatchNodeParams {
    pub ctx: CUcontext,
    pub count: u32,
    pub ops: *mut super::stream::BatchMemOp,
    pub flags: u32,
}

fn batch_data(p: *const BatchNodeParams) -> Result<NodeKind, CUresult> {
    let d = cu()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller.
    let bp = unsafe { p.read_unaligned() };
    if !bp.ctx.is_null() {
        d.ctx(bp.ctx as usize)?;
    }
    let ops = super::stream::read_batch(bp.count, bp.ops, bp.flags)?;
    if ops.is_empty() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(NodeKind::BatchMemOp(Arc::new(BatchNode {
        ctx: bp.ctx as usize,
        ops,
        flags: bp.flags,
    })))
}

fn batch_params(n: CUgraphNode, out: *mut BatchNodeParams) -> CuRes {
    match node_kind(n)? {
        NodeKind::BatchMemOp(b) => {
            // SAFETY: out pointer from the caller.
            unsafe { put(out, b.params(), CUDA_ERROR_INVALID_VALUE) }
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

impl NodeKind {
    pub fn type_code(&self) -> u32 {
        match self {
            NodeKind::Empty => NODE_EMPTY,
            NodeKind::Kernel(_) => NODE_KERNEL,
            NodeKind::Memcpy(_) => NODE_MEMCPY,
            NodeKind::Memset(_) => NODE_MEMSET,
            NodeKind::Host(..) => NODE_HOST,
            NodeKind::Child(_) => NODE_GRAPH,
            NodeKind::EventRecord(_) => NODE_EVENT_RECORD,
            NodeKind::EventWait(_) => NODE_WAIT_EVENT,
            NodeKind::MemAlloc(_) => NODE_MEM_ALLOC,
            NodeKind::MemFree(_) => NODE_MEM_FREE,
            NodeKind::BatchMemOp(_) => NODE_BATCH_MEM_OP,
            NodeKind::Cond(..) => NODE_CONDITIONAL,
            NodeKind::MemOp(crate::driver::MemOp::Copy { .. }) => NODE_MEMCPY,
            NodeKind::MemOp(crate::driver::MemOp::Set { .. }) => NODE_MEMSET,
        }
    }
}

pub struct Node {
    pub h: usize,
    pub kind: NodeKind,
    pub deps: Vec<usize>,
    /// Unique among the nodes of its graph (`cuGraphNodeGetLocalId`).
    pub local_id: u32,
}

/// A graph. Node handles map to `Obj::GraphNode(graph handle)`.
#[derive(Default)]
pub struct Graph {
    pub id: u32,
    pub nodes: Vec<Node>,
    pub next_local: u32,
    /// User object references the graph holds (object handle → count).
    pub user_objs: HashMap<usize, u32>,
    /// Set for the body graphs of a conditional node: they belong to it.
    pub owned_by_node: bool,
    /// Moved into a child graph node (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`):
    /// the parent owns it; it cannot be destroyed, instantiated, used for an
    /// update or embedded elsewhere, nor take new memory nodes.
    pub moved: bool,
}

impl Graph {
    pub fn node(&self, h: usize) -> Option<&Node> {
        self.nodes.iter().find(|n| n.h == h)
    }
    pub fn node_mut(&mut self, h: usize) -> Option<&mut Node> {
        self.nodes.iter_mut().find(|n| n.h == h)
    }
}

/// One step of an instantiated graph.
#[derive(Clone)]
pub enum Op {
    Kernel(KernelNode),
    Memcpy(super::array::Memcpy3D),
    Memset(MemsetNodeParams),
    Host(usize, usize),
    EventRecord(usize),
    EventWait,
    Alloc(Arc<GraphAlloc>),
    Free(u64),
    Cond(Arc<CondHandle>, u32, Vec<Vec<Step>>),
    MemOp(crate::driver::MemOp),
    BatchMemOp(Arc<BatchNode>),
}

/// An op, the node it came from (for the exec's per-node setters), and
/// whether it is enabled.
#[derive(Clone)]
pub struct Step {
    pub node: usize,
    pub op: Op,
    pub enabled: bool,
}

pub struct GraphExec {
    pub id: u32,
    pub flags: u64,
    pub steps: Mutex<Vec<Step>>,
    /// User object references taken from the graph at instantiation (and
    /// from the graph of the last successful `cuGraphExecUpdate`).
    pub user_objs: Mutex<HashMap<usize, u32>>,
    /// The shape of the graph it was made from, that an update must match.
    pub shape: Mutex<Vec<ShapeNode>>,
}

/// A node of a graph as `cuGraphExecUpdate` compares it: its type, its
/// dependencies (indices among the graph's nodes, in node order), what of
/// its parameters may not change, and the graphs inside it (child graph,
/// conditional bodies).
pub struct ShapeNode {
    /// The node's handle (reported when the update fails on it).
    pub h: usize,
    pub ty: u32,
    pub deps: Vec<usize>,
    pub fixed: Fixed,
    pub inner: Vec<Vec<ShapeNode>>,
}

/// Parameters an update may not change.
#[derive(PartialEq, Eq)]
pub enum Fixed {
    None,
    /// A kernel's function's context.
    Kernel(usize),
    /// A 2D memset: element size, width, height (only the address and the
    /// value may change); a 1D one: nothing.
    Memset(Option<(u32, usize, usize)>),
    /// A copy's source and destination memory types.
    Memcpy(u32, u32),
    /// An allocation's size and device.
    Alloc(u64, usize),
    /// A conditional node's type and number of bodies.
    Cond(u32, usize),
}

/// A user object (`cuUserObjectCreate`): a destructor run when the last
/// reference goes.
pub struct UserObject {
    pub ptr: usize,
    pub destroy: usize,
    pub refs: AtomicU32,
}

static GRAPH_IDS: AtomicU32 = AtomicU32::new(0);
static EXEC_IDS: AtomicU32 = AtomicU32::new(0);

fn new_graph(d: &Driver) -> usize {
    let g = Graph {
        id: GRAPH_IDS.fetch_add(1, Relaxed) + 1,
        ..Graph::default()
    };
    d.objs.lock().insert(Obj::Graph(Arc::new(Mutex::new(g))))
}

/// A new empty graph (stream capture builds into one).
pub fn new_graph_handle(d: &Driver) -> usize {
    new_graph(d)
}

/// Destroys a graph by handle (a capture that failed).
pub fn destroy_graph_handle(g: usize) -> CuRes {
    destroy_graph(cu()?, g)
}

/// `nodes` and every node they depend on, directly or not, in graph `g`.
pub fn ancestors(g: usize, nodes: &[usize]) -> HashSet<usize> {
    let mut seen: HashSet<usize> = HashSet::new();
    let Ok(graph) = graph_of(g) else { return seen };
    let gr = graph.lock();
    let mut todo: Vec<usize> = nodes.to_vec();
    while let Some(n) = todo.pop() {
        if seen.insert(n) {
            if let Some(x) = gr.node(n) {
                todo.extend(x.deps.iter().copied());
            }
        }
    }
    seen
}

pub fn graph_of(h: usize) -> Result<Arc<Mutex<Graph>>, CUresult> {
    match cu()?.objs.lock().get(h) {
        Some(Obj::Graph(g)) => Ok(Arc::clone(g)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// The graph (handle, object) that holds node `n`.
fn owner_of(n: CUgraphNode) -> Result<(usize, Arc<Mutex<Graph>>), CUresult> {
    let gh = match cu()?.objs.lock().get(n as usize) {
        Some(Obj::GraphNode(g)) => *g,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    Ok((gh, graph_of(gh)?))
}

fn exec_of(h: CUgraphExec) -> Result<Arc<GraphExec>, CUresult> {
    match cu()?.objs.lock().get(h as usize) {
        Some(Obj::GraphExec(x)) => Ok(Arc::clone(x)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn user_obj(h: usize) -> Result<Arc<UserObject>, CUresult> {
    match cu()?.objs.lock().get(h) {
        Some(Obj::UserObject(u)) => Ok(Arc::clone(u)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

fn cond_handles() -> &'static Mutex<HashMap<u64, Arc<CondHandle>>> {
    static H: OnceLock<Mutex<HashMap<u64, Arc<CondHandle>>>> = OnceLock::new();
    H.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Reads `n` node handles from a caller array.
pub(crate) fn read_nodes(p: *const CUgraphNode, n: usize) -> Result<Vec<usize>, CUresult> {
    if n > 0 && p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: p holds n node handles by the caller's contract (checked
    // non-null when n > 0).
    Ok((0..n).map(|i| unsafe { *p.add(i) } as usize).collect())
}

/// Adds a node of `kind` to graph `g` after `deps`; returns its handle.
pub fn add_node_kind(g: usize, deps: &[usize], kind: NodeKind) -> Result<usize, CUresult> {
    let d = cu()?;
    let graph = graph_of(g)?;
    let mut gr = graph.lock();
    if gr.moved && matches!(kind, NodeKind::MemAlloc(_) | NodeKind::MemFree(_)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut seen = HashSet::new();
    for dep in deps {
        if gr.node(*dep).is_none() || !seen.insert(*dep) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let h = d.objs.lock().insert(Obj::GraphNode(g));
    let local_id = gr.next_local;
    gr.next_local += 1;
    gr.nodes.push(Node {
        h,
        kind,
        deps: deps.to_vec(),
        local_id,
    });
    Ok(h)
}

fn add_node(
    pn: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    kind: impl FnOnce() -> Result<NodeKind, CUresult>,
) -> CuRes {
    cu()?;
    if pn.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    graph_of(g as usize)?;
    let deps = read_nodes(deps, ndeps)?;
    let kind = kind()?;
    // A conditional node takes a handle created for its own graph, as the
    // driver checks (its bodies, made by cond_data, go with the refusal).
    if let NodeKind::Cond(h, _, bodies) = &kind {
        let ok = cond_handles()
            .lock()
            .get(h)
            .is_some_and(|c| c.graph == g as usize);
        if !ok {
            for b in bodies {
                let _ = destroy_graph(cu()?, *b);
            }
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let h = add_node_kind(g as usize, &deps, kind)?;
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pn, h as CUgraphNode, CUDA_ERROR_INVALID_VALUE) }
}

/// A kernel node's data from `CUDA_KERNEL_NODE_PARAMS` (`v2`: the `_v2`/`_v3`
/// layout, which adds `kern` and `ctx`). With `v2`, a NULL `func` and a
/// `CUkernel` in `kern` name the kernel (the runtime passes its kernels so).
fn kernel_data(p: *const KernelNodeParams, v2: bool) -> Result<NodeKind, CUresult> {
    let d = cu()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller (the v1 prefix of v2/v3).
    let kp = unsafe { p.read_unaligned() };
    let (kern, ctx) = if v2 {
        // SAFETY: the caller's CUDA_KERNEL_NODE_PARAMS_v2 (checked non-null).
        let v = unsafe { (p as *const KernelNodeParamsV2).read_unaligned() };
        (v.kern as usize, v.ctx as usize)
    } else {
        (0, 0)
    };
    // (`ctx` is ignored when `func` is set.)
    if kp.func.is_null() && ctx != 0 {
        d.ctx(ctx)?;
    }
    let handle = if kp.func.is_null() {
        kern
    } else {
        kp.func as usize
    };
    // (A CUkernel is a function handle in the sim.)
    let func: Arc<Func> = d.func(handle)?;
    if kp.grid.contains(&0) || kp.block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Parameters are captured at node creation, as the driver does.
    // SAFETY: kernel params per the node params' contract.
    let ns = unsafe { super::launch::kernel_ns(d, &func, kp.kernel_params, kp.extra) }?;
    Ok(NodeKind::Kernel(KernelData {
        run: KernelNode { func, ns },
        params: kp,
        kern,
        ctx,
        attrs: HashMap::new(),
    }))
}

fn memset_data(p: *const MemsetNodeParams) -> Result<NodeKind, CUresult> {
    let d = cu()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller.
    let m = unsafe { p.read_unaligned() };
    if !matches!(m.element_size, 1 | 2 | 4) || m.width == 0 || m.height == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let row = m.width as u64 * m.element_size as u64;
    if m.height > 1 && (m.pitch as u64) < row {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let span = (m.height as u64 - 1) * m.pitch as u64 + row;
    super::memory::check_dev_range(d, m.dst, span)?;
    Ok(NodeKind::Memset(m))
}

fn memcpy_data(p: *const super::array::Memcpy3D) -> Result<NodeKind, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null descriptor from the caller.
    let m = unsafe { p.read_unaligned() };
    super::array::check_memcpy3d(&m)?;
    Ok(NodeKind::Memcpy(m))
}

fn host_data(p: *const HostNodeParams) -> Result<NodeKind, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller.
    let hp = unsafe { p.read_unaligned() };
    let f = hp.func.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(NodeKind::Host(f as usize, hp.user_data as usize))
}

fn event_data(e: CUevent, record: bool) -> Result<NodeKind, CUresult> {
    cu()?.event(e as usize)?;
    Ok(if record {
        NodeKind::EventRecord(e as usize)
    } else {
        NodeKind::EventWait(e as usize)
    })
}

/// A node as `clone_graph` copies it: handle, kind, dependencies.
type NodeCopy = (usize, NodeKind, Vec<usize>);

/// A deep copy of graph `src` as a new graph; returns (handle, map from
/// old node handles to new ones). The copy holds references of its own to
/// the user objects `src` holds, as the driver's clones do.
fn clone_graph(src: usize) -> Result<(usize, HashMap<usize, usize>), CUresult> {
    let d = cu()?;
    let (nodes, uobjs): (Vec<NodeCopy>, HashMap<usize, u32>) = {
        let gr = graph_of(src)?;
        let gr = gr.lock();
        (
            gr.nodes
                .iter()
                .map(|n| (n.h, n.kind.clone(), n.deps.clone()))
                .collect(),
            gr.user_objs.clone(),
        )
    };
    // Graphs with memory nodes cannot be cloned or embedded (the driver
    // refuses: an allocation belongs to one graph).
    if nodes
        .iter()
        .any(|n| matches!(n.1, NodeKind::MemAlloc(_) | NodeKind::MemFree(_)))
    {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    let g = new_graph(d);
    for (u, c) in &uobjs {
        if let Ok(o) = user_obj(*u) {
            o.refs.fetch_add(*c, AcqRel);
        }
    }
    if let Ok(gr) = graph_of(g) {
        gr.lock().user_objs = uobjs;
    }
    let mut map = HashMap::new();
    for (old, kind, deps) in nodes {
        let kind = match kind {
            NodeKind::Child(c) => NodeKind::Child(clone_graph(c)?.0),
            NodeKind::Cond(h, t, bodies) => {
                let copies: Vec<usize> = bodies
                    .iter()
                    .map(|b| clone_graph(*b).map(|x| x.0))
                    .collect::<Result<_, _>>()?;
                for b in &copies {
                    if let Ok(gr) = graph_of(*b) {
                        gr.lock().owned_by_node = true;
                    }
                }
                NodeKind::Cond(h, t, copies)
            }
            k => k,
        };
        let deps: Vec<usize> = deps.iter().filter_map(|x| map.get(x).copied()).collect();
        let h = add_node_kind(g, &deps, kind)?;
        map.insert(old, h);
    }
    Ok((g, map))
}

fn child_data(child: CUgraph) -> Result<NodeKind, CUresult> {
    if graph_of(child as usize)?.lock().moved {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The node holds a clone: later changes to `child` do not affect it.
    Ok(NodeKind::Child(clone_graph(child as usize)?.0))
}

/// A child graph node that takes `child` itself
/// (`CU_GRAPH_CHILD_GRAPH_OWNERSHIP_MOVE`): the way a graph with memory
/// nodes becomes a child; it is destroyed with its parent.
fn child_moved(child: CUgraph) -> Result<NodeKind, CUresult> {
    let graph = graph_of(child as usize)?;
    let mut gr = graph.lock();
    if gr.moved || gr.owned_by_node {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if gr
        .nodes
        .iter()
        .any(|n| matches!(n.kind, NodeKind::Cond(..)))
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    gr.moved = true;
    Ok(NodeKind::Child(child as usize))
}

// ---------------------------------------------------------------- graph memory

/// Per-device graph memory pool counters.
#[derive(Default)]
pub struct GraphMem {
    pub used: u64,
    pub used_high: u64,
    pub reserved: u64,
    pub reserved_high: u64,
}

pub fn graph_mem(dev: usize) -> &'static Mutex<GraphMem> {
    static M: OnceLock<Vec<Mutex<GraphMem>>> = OnceLock::new();
    let v = M.get_or_init(|| {
        (0..crate::state::MAX_DEVICES)
            .map(|_| Mutex::new(GraphMem::default()))
            .collect()
    });
    &v[dev.min(v.len() - 1)]
}

/// Graph allocations by address (live or not), for cuMemFree and range checks.
pub fn graph_allocs() -> &'static Mutex<std::collections::BTreeMap<u64, Arc<GraphAlloc>>> {
    static A: OnceLock<Mutex<std::collections::BTreeMap<u64, Arc<GraphAlloc>>>> = OnceLock::new();
    A.get_or_init(|| Mutex::new(std::collections::BTreeMap::new()))
}

const GRAPH_MEM_GRANULE: u64 = 2 << 20;

/// A graph allocation of `size` bytes on `dev`: its address range, mapped
/// now, charged when a launch allocates it.
pub fn new_graph_alloc(
    d: &Driver,
    dev: usize,
    size: u64,
    managed: bool,
) -> Result<Arc<GraphAlloc>, CUresult> {
    let pooled = size
        .checked_next_multiple_of(GRAPH_MEM_GRANULE)
        .ok_or(CUDA_ERROR_OUT_OF_MEMORY)?;
    if size == 0 || pooled > d.devs[dev].total {
        return Err(CUDA_ERROR_OUT_OF_MEMORY);
    }
    let ptr = super::memory::map_anon(pooled as usize)?;
    let ga = Arc::new(GraphAlloc {
        dev,
        ptr,
        size,
        pooled,
        live: std::sync::atomic::AtomicBool::new(false),
        execs: AtomicU32::new(0),
        orphan: std::sync::atomic::AtomicBool::new(false),
        managed,
    });
    graph_allocs().lock().insert(ptr, Arc::clone(&ga));
    Ok(ga)
}

/// (start, size, device, managed) of the graph allocation holding `p`.
pub fn graph_alloc_at(p: u64) -> Option<(u64, u64, usize, bool)> {
    let allocs = graph_allocs().lock();
    let (start, ga) = allocs.range(..=p).next_back()?;
    (p < start + ga.size).then_some((*start, ga.size, ga.dev, ga.managed))
}

/// Whether `p` starts a graph allocation.
pub fn is_graph_alloc(p: u64) -> bool {
    graph_allocs().lock().contains_key(&p)
}

fn mem_alloc_data(p: *mut MemAllocNodeParams) -> Result<NodeKind, CUresult> {
    let d = cu()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller.
    let mp = unsafe { p.read_unaligned() };
    // Pinned (1) or managed (2) memory of a device.
    if mp.bytesize == 0
        || !(1..=2).contains(&mp.pool_props.allocType)
        || mp.pool_props.location.type_ != 1
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let dev = d.check_dev(mp.pool_props.location.id)?;
    let managed = mp.pool_props.allocType == 2;
    let ga = new_graph_alloc(d, dev, mp.bytesize as u64, managed)?;
    // SAFETY: the caller's params (checked non-null): dptr is an output.
    unsafe { std::ptr::addr_of_mut!((*p).dptr).write_unaligned(ga.ptr) };
    Ok(NodeKind::MemAlloc(ga))
}

/// A launch allocates `ga`: from the pool's free reserve, else the pool
/// grows by charging the device (OUT_OF_MEMORY when it is full).
fn graph_mem_alloc(d: &Driver, ga: &GraphAlloc) -> CuRes {
    if ga.live.load(Acquire) {
        // Launched again before being freed: the driver refuses.
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut m = graph_mem(ga.dev).lock();
    let free = m.reserved - m.used;
    if free < ga.pooled {
        let grow = ga.pooled - free;
        d.charge(ga.dev, grow)?;
        m.reserved += grow;
        m.reserved_high = m.reserved_high.max(m.reserved);
    }
    m.used += ga.pooled;
    m.used_high = m.used_high.max(m.used);
    ga.live.store(true, Release);
    Ok(())
}

/// Frees a graph allocation at `p` (a free node, cuMemFree, cuMemFreeAsync):
/// `Some(result)` if `p` is one.
pub fn graph_mem_free(p: u64) -> Option<CuRes> {
    let ga = graph_allocs().lock().get(&p).cloned()?;
    if !ga.live.swap(false, AcqRel) {
        return Some(Err(CUDA_ERROR_INVALID_VALUE));
    }
    {
        let mut m = graph_mem(ga.dev).lock();
        m.used = m.used.saturating_sub(ga.pooled);
    }
    drop_range_if_unused(&ga);
    Some(Ok(()))
}

/// Unmaps a graph allocation's address range once nothing can use it: its
/// node is gone, no executable graph made from it is left, and its memory
/// is not allocated.
fn drop_range_if_unused(ga: &GraphAlloc) {
    if ga.orphan.load(Acquire) && ga.execs.load(Acquire) == 0 && !ga.live.load(Acquire) {
        drop_range(ga);
    }
}

/// Unmaps a graph allocation's address range (its node is gone and the
/// memory is not allocated).
fn drop_range(ga: &GraphAlloc) {
    if graph_allocs().lock().remove(&ga.ptr).is_some() {
        super::memory::unmap_pub(ga.ptr, ga.pooled as usize);
    }
}

/// Whether `[p, p+len)` lies in a graph allocation (`Some(in bounds)`).
pub fn graph_mem_range(p: u64, len: u64) -> Option<bool> {
    let allocs = graph_allocs().lock();
    let (start, ga) = allocs.range(..=p).next_back()?;
    // The address range is mapped from the node's creation on (copies and
    // memsets into it can be added to graphs before any launch).
    if p >= start + ga.size {
        return None;
    }
    Some(p.checked_add(len).is_some_and(|e| e <= start + ga.size))
}

fn graph_mem_trim(d: &Driver, dev: usize) {
    let mut m = graph_mem(dev).lock();
    let spare = m.reserved - m.used;
    if spare > 0 {
        d.uncharge(dev, spare);
        m.reserved -= spare;
    }
}

// ------------------------------------------------------------- create/destroy

fn graph_create(pg: *mut CUgraph, flags: u32) -> CuRes {
    let d = cu()?;
    if pg.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let h = new_graph(d);
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pg, h as CUgraph, CUDA_ERROR_INVALID_VALUE) }
}

/// Destroys graph `g` and what its nodes own (child and body graphs, the
/// address range of allocations never launched or already freed).
fn destroy_graph(d: &Driver, g: usize) -> CuRes {
    let graph = graph_of(g)?;
    let (nodes, uobjs) = {
        let mut gr = graph.lock();
        (
            std::mem::take(&mut gr.nodes),
            std::mem::take(&mut gr.user_objs),
        )
    };
    d.objs.lock().remove(g);
    for n in nodes {
        forget_node(d, n);
    }
    for (u, c) in uobjs {
        release_user_obj(d, u, c);
    }
    Ok(())
}

/// Releases every user object reference graph `g` holds.
pub fn release_graph_user_objs(d: &Driver, g: usize) -> CuRes {
    let uobjs = std::mem::take(&mut graph_of(g)?.lock().user_objs);
    for (u, c) in uobjs {
        release_user_obj(d, u, c);
    }
    Ok(())
}

/// `CUDA_ERROR_GRAPH_RECAPTURE_FAILURE`.
pub const CUDA_ERROR_GRAPH_RECAPTURE_FAILURE: CUresult = 918;
/// `CU_GRAPH_RECAPTURE_ELIGIBLE_FOR_UPDATE`.
const RECAPTURE_ELIGIBLE: u32 = 0;

type RecaptureCallback = unsafe extern "C" fn(
    *mut std::ffi::c_void,
    CUgraphNode,
    *const GraphNodeParams,
    *const GraphNodeParams,
    u32,
) -> CUresult;

/// The end of a recapture: graph `built` (what the stream captured) must
/// have `target`'s topology — as many nodes, of the same kinds, in the same
/// creation order, with the same edges — and the same memory nodes (sizes,
/// devices); then each node whose parameters differ is reported to the
/// callback (if any; a result other than success fails the recapture), and
/// `target`'s nodes take the recaptured parameters (their handles stay).
/// Failures are `CUDA_ERROR_GRAPH_RECAPTURE_FAILURE`, found at the end of
/// the capture rather than at the call that diverged.
pub fn apply_recapture(built: usize, target: usize, callback: usize, user: usize) -> CuRes {
    let fail = Err(CUDA_ERROR_GRAPH_RECAPTURE_FAILURE);
    let (bg, tg) = (graph_of(built)?, graph_of(target)?);
    // (handle, kind, edges, a kernel's device time: part of its arguments
    // the parameter struct does not show).
    let shape = |g: &Graph| -> Vec<(usize, u32, Vec<usize>, u64)> {
        let index: HashMap<usize, usize> =
            g.nodes.iter().enumerate().map(|(i, n)| (n.h, i)).collect();
        g.nodes
            .iter()
            .map(|n| {
                let mut deps: Vec<usize> = n
                    .deps
                    .iter()
                    .filter_map(|x| index.get(x).copied())
                    .collect();
                deps.sort_unstable();
                let ns = match &n.kind {
                    NodeKind::Kernel(k) => k.run.ns,
                    _ => 0,
                };
                (n.h, n.kind.type_code(), deps, ns)
            })
            .collect()
    };
    let (new, old) = (shape(&bg.lock()), shape(&tg.lock()));
    if new.len() != old.len() || new.iter().zip(&old).any(|(a, b)| a.1 != b.1 || a.2 != b.2) {
        return fail;
    }
    for ((nh, ty, _, new_ns), (oh, _, _, old_ns)) in new.iter().zip(&old) {
        let mut p = [GraphNodeParams::default(), GraphNodeParams::default()];
        node_get_params(*nh as CUgraphNode, &mut p[0])?;
        node_get_params(*oh as CUgraphNode, &mut p[1])?;
        let same = {
            let bytes = |x: &GraphNodeParams| {
                // SAFETY: viewing a plain repr(C) struct as its bytes.
                unsafe {
                    std::slice::from_raw_parts(
                        x as *const GraphNodeParams as *const u8,
                        std::mem::size_of::<GraphNodeParams>(),
                    )
                    .to_vec()
                }
            };
            bytes(&p[0]) == bytes(&p[1]) && new_ns == old_ns
        };
        if same {
            continue;
        }
        if *ty == NODE_MEM_ALLOC || *ty == NODE_MEM_FREE {
            let (a, b) = (mem_node_shape(*nh), mem_node_shape(*oh));
            if a.is_none() || a != b {
                return fail;
            }
            continue;
        }
        if callback != 0 {
            // SAFETY: the caller's CUgraphRecaptureCallback, with parameter
            // structs that live across the call.
            let r = unsafe {
                let f: RecaptureCallback =
                    std::mem::transmute::<usize, RecaptureCallback>(callback);
                f(
                    user as *mut std::ffi::c_void,
                    *oh as CUgraphNode,
                    &p[1],
                    &p[0],
                    RECAPTURE_ELIGIBLE,
                )
            };
            if r != CUDA_SUCCESS {
                return fail;
            }
        }
    }
    // Target's nodes take the new kinds; the old ones go with `built`.
    let (mut b, mut t) = (bg.lock(), tg.lock());
    for (x, y) in b.nodes.iter_mut().zip(t.nodes.iter_mut()) {
        std::mem::swap(&mut x.kind, &mut y.kind);
    }
    Ok(())
}

/// What must match between a memory node and its recapture: an
/// allocation's size and device; a free's allocation size (the freed
/// address differs from one capture to the next).
fn mem_node_shape(n: usize) -> Option<(u64, usize)> {
    let (_, graph) = owner_of(n as CUgraphNode).ok()?;
    let gr = graph.lock();
    match &gr.node(n)?.kind {
        NodeKind::MemAlloc(a) => Some((a.size, a.dev)),
        NodeKind::MemFree(p) => gr.nodes.iter().find_map(|x| match &x.kind {
            NodeKind::MemAlloc(a) if a.ptr == *p => Some((a.size, a.dev)),
            _ => None,
        }),
        _ => None,
    }
}

fn forget_node(d: &Driver, n: Node) {
    d.objs.lock().remove(n.h);
    match n.kind {
        NodeKind::MemAlloc(a) => {
            // Memory still allocated stays until it is freed (cuMemFree),
            // and an executable graph made from the node keeps allocating
            // it at each launch (PyTorch destroys the graph once it is
            // instantiated).
            a.orphan.store(true, Release);
            drop_range_if_unused(&a);
        }
        NodeKind::Child(c) => {
            let _ = destroy_graph(d, c);
        }
        NodeKind::Cond(_, _, bodies) => {
            for b in bodies {
                let _ = destroy_graph(d, b);
            }
        }
        _ => {}
    }
}

/// Whether a graph holds memory nodes (itself or in a child graph moved
/// into it): its nodes and edges cannot be deleted then (the driver's rule
/// for graphs with allocation or free nodes).
fn has_memory_nodes(gr: &Graph) -> bool {
    gr.nodes.iter().any(|n| match &n.kind {
        NodeKind::MemAlloc(_) | NodeKind::MemFree(_) => true,
        NodeKind::Child(c) => graph_of(*c).is_ok_and(|g| has_memory_nodes(&g.lock())),
        _ => false,
    })
}

fn destroy_node(n: CUgraphNode) -> CuRes {
    let d = cu()?;
    let (_, graph) = owner_of(n)?;
    let node = {
        let mut gr = graph.lock();
        let i = gr
            .nodes
            .iter()
            .position(|x| x.h == n as usize)
            .ok_or(CUDA_ERROR_INVALID_VALUE)?;
        if has_memory_nodes(&gr) {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let node = gr.nodes.remove(i);
        for other in gr.nodes.iter_mut() {
            other.deps.retain(|x| *x != n as usize);
        }
        node
    };
    forget_node(d, node);
    Ok(())
}

// ------------------------------------------------------------------- queries

/// Writes `v` to a caller array of capacity `*count` (or only the count when
/// `out` is NULL), as the driver's list queries do: `*count` becomes the
/// number written, or the total when `out` is NULL.
fn put_list(out: *mut CUgraphNode, count: *mut usize, v: &[usize]) -> CuRes {
    if count.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if out.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *count = v.len() };
        return Ok(());
    }
    // SAFETY: non-null in/out pointer from the caller.
    let cap = unsafe { *count };
    let n = cap.min(v.len());
    for (i, x) in v.iter().take(n).enumerate() {
        // SAFETY: out holds cap >= n entries by the caller's contract.
        unsafe { *out.add(i) = *x as CUgraphNode };
    }
    // SAFETY: as above.
    unsafe { *count = n };
    Ok(())
}

/// Zeroes `n` `CUgraphEdgeData` (8 bytes each) when `edata` is not NULL.
fn zero_edges(edata: *mut u64, n: usize) {
    if !edata.is_null() {
        for i in 0..n {
            // SAFETY: edata holds as many entries as the node array.
            unsafe { *edata.add(i) = 0 };
        }
    }
}

fn get_nodes(g: CUgraph, out: *mut CUgraphNode, count: *mut usize, roots: bool) -> CuRes {
    let graph = graph_of(g as usize)?;
    let v: Vec<usize> = graph
        .lock()
        .nodes
        .iter()
        .filter(|n| !roots || n.deps.is_empty())
        .map(|n| n.h)
        .collect();
    put_list(out, count, &v)
}

fn get_edges(
    g: CUgraph,
    from: *mut CUgraphNode,
    to: *mut CUgraphNode,
    edata: *mut u64,
    count: *mut usize,
) -> CuRes {
    let graph = graph_of(g as usize)?;
    let edges: Vec<(usize, usize)> = graph
        .lock()
        .nodes
        .iter()
        .flat_map(|n| n.deps.iter().map(move |d| (*d, n.h)))
        .collect();
    if count.is_null() || from.is_null() != to.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if from.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *count = edges.len() };
        return Ok(());
    }
    // SAFETY: non-null in/out pointer from the caller.
    let n = unsafe { *count }.min(edges.len());
    for (i, (a, b)) in edges.iter().take(n).enumerate() {
        // SAFETY: from/to hold *count entries by the caller's contract.
        unsafe {
            *from.add(i) = *a as CUgraphNode;
            *to.add(i) = *b as CUgraphNode;
        }
    }
    zero_edges(edata, n);
    // SAFETY: as above.
    unsafe { *count = n };
    Ok(())
}

fn node_deps(
    n: CUgraphNode,
    out: *mut CUgraphNode,
    edata: *mut u64,
    count: *mut usize,
    dependents: bool,
) -> CuRes {
    let (_, graph) = owner_of(n)?;
    let gr = graph.lock();
    let node = gr.node(n as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let v: Vec<usize> = if dependents {
        gr.nodes
            .iter()
            .filter(|x| x.deps.contains(&node.h))
            .map(|x| x.h)
            .collect()
    } else {
        node.deps.clone()
    };
    drop(gr);
    put_list(out, count, &v)?;
    if !out.is_null() {
        // SAFETY: count was written by put_list.
        zero_edges(edata, unsafe { *count });
    }
    Ok(())
}

fn change_deps(
    g: CUgraph,
    from: *const CUgraphNode,
    to: *const CUgraphNode,
    n: usize,
    add: bool,
) -> CuRes {
    let graph = graph_of(g as usize)?;
    let from = read_nodes(from, n)?;
    let to = read_nodes(to, n)?;
    let mut gr = graph.lock();
    for (a, b) in from.iter().zip(&to) {
        if a == b || gr.node(*a).is_none() || gr.node(*b).is_none() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if !add && has_memory_nodes(&gr) {
            return Err(CUDA_ERROR_NOT_SUPPORTED);
        }
        let has = gr.node(*b).is_some_and(|x| x.deps.contains(a));
        if has == add {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    for (a, b) in from.iter().zip(&to) {
        if let Some(node) = gr.node_mut(*b) {
            if add {
                node.deps.push(*a);
            } else {
                node.deps.retain(|x| x != a);
            }
        }
    }
    Ok(())
}

fn node_kind(n: CUgraphNode) -> Result<NodeKind, CUresult> {
    let (_, graph) = owner_of(n)?;
    let gr = graph.lock();
    gr.node(n as usize)
        .map(|x| x.kind.clone())
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn set_node_kind(n: CUgraphNode, kind: NodeKind) -> CuRes {
    let (_, graph) = owner_of(n)?;
    let mut gr = graph.lock();
    let node = gr.node_mut(n as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if node.kind.type_code() != kind.type_code() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    node.kind = kind;
    Ok(())
}

// ------------------------------------------------------------- instantiation

/// Orders the nodes of graph `g` topologically (ready nodes in insertion
/// order) and flattens child graphs.
fn flatten(g: usize, out: &mut Vec<Step>) -> CuRes {
    let graph = graph_of(g)?;
    let nodes: Vec<(usize, NodeKind, Vec<usize>)> = graph
        .lock()
        .nodes
        .iter()
        .map(|n| (n.h, n.kind.clone(), n.deps.clone()))
        .collect();
    let mut done: HashSet<usize> = HashSet::new();
    let mut left: Vec<usize> = (0..nodes.len()).collect();
    while !left.is_empty() {
        let pos = left
            .iter()
            .position(|&i| nodes[i].2.iter().all(|x| done.contains(x)))
            .ok_or(CUDA_ERROR_INVALID_VALUE)?; // a cycle
        let i = left.remove(pos);
        let (h, kind, _) = &nodes[i];
        done.insert(*h);
        let op = match kind {
            NodeKind::Empty => continue,
            NodeKind::Kernel(k) => Op::Kernel(k.run.clone()),
            NodeKind::Memcpy(m) => Op::Memcpy(*m),
            NodeKind::Memset(m) => Op::Memset(*m),
            NodeKind::Host(f, u) => Op::Host(*f, *u),
            NodeKind::EventRecord(e) => Op::EventRecord(*e),
            NodeKind::EventWait(_) => Op::EventWait,
            NodeKind::MemAlloc(a) => Op::Alloc(Arc::clone(a)),
            NodeKind::MemFree(p) => Op::Free(*p),
            NodeKind::MemOp(m) => Op::MemOp(m.clone()),
            NodeKind::BatchMemOp(b) => Op::BatchMemOp(Arc::clone(b)),
            NodeKind::Child(c) => {
                flatten(*c, out)?;
                continue;
            }
            NodeKind::Cond(ch, t, bodies) => {
                let handle = cond_handles()
                    .lock()
                    .get(ch)
                    .cloned()
                    .ok_or(CUDA_ERROR_INVALID_VALUE)?;
                let mut bs = Vec::new();
                for b in bodies {
                    let mut v = Vec::new();
                    flatten(*b, &mut v)?;
                    bs.push(v);
                }
                Op::Cond(handle, *t, bs)
            }
        };
        out.push(Step {
            node: *h,
            op,
            enabled: true,
        });
    }
    Ok(())
}

/// The user object references graph `g` holds, with those of its child and
/// body graphs (an executable graph takes them all).
fn collect_user_objs(g: usize, out: &mut HashMap<usize, u32>) {
    let Ok(graph) = graph_of(g) else { return };
    let (own, subs): (HashMap<usize, u32>, Vec<usize>) = {
        let gr = graph.lock();
        (
            gr.user_objs.clone(),
            gr.nodes
                .iter()
                .flat_map(|n| match &n.kind {
                    NodeKind::Child(c) => vec![*c],
                    NodeKind::Cond(_, _, b) => b.clone(),
                    _ => Vec::new(),
                })
                .collect(),
        )
    };
    for (u, c) in own {
        *out.entry(u).or_insert(0) += c;
    }
    for s in subs {
        collect_user_objs(s, out);
    }
}

fn instantiate(pe: *mut CUgraphExec, g: CUgraph, flags: u64) -> CuRes {
    let d = cu()?;
    if pe.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // CUDA_GRAPH_INSTANTIATE_FLAG_*: auto free on launch 1, upload 2,
    // device launch 4, use node priority 8.
    if flags & !0xf != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if graph_of(g as usize)?.lock().moved {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut steps = Vec::new();
    flatten(g as usize, &mut steps)?;
    // A graph with memory nodes has one executable at a time.
    let allocs: Vec<Arc<GraphAlloc>> = steps
        .iter()
        .filter_map(|s| match &s.op {
            Op::Alloc(a) => Some(Arc::clone(a)),
            _ => None,
        })
        .collect();
    if allocs.iter().any(|a| a.execs.load(Acquire) > 0) {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    for a in &allocs {
        a.execs.fetch_add(1, AcqRel);
    }
    let shape = shape_of(g as usize)?;
    let mut user_objs = HashMap::new();
    collect_user_objs(g as usize, &mut user_objs);
    for (u, c) in &user_objs {
        if let Ok(o) = user_obj(*u) {
            o.refs.fetch_add(*c, AcqRel);
        }
    }
    let h = d.objs.lock().insert(Obj::GraphExec(Arc::new(GraphExec {
        id: EXEC_IDS.fetch_add(1, Relaxed) + 1,
        flags,
        steps: Mutex::new(steps),
        user_objs: Mutex::new(user_objs),
        shape: Mutex::new(shape),
    })));
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pe, h as CUgraphExec, CUDA_ERROR_INVALID_VALUE) }
}

fn instantiate_with_params(pe: *mut CUgraphExec, g: CUgraph, p: *mut InstantiateParams) -> CuRes {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller.
    let flags = unsafe { (*p).flags };
    let r = instantiate(pe, g, flags);
    // CUgraphInstantiateResult: SUCCESS 0, ERROR 1.
    // SAFETY: as above; result_out and err_node_out are outputs.
    unsafe {
        (*p).result_out = if r.is_ok() { 0 } else { 1 };
        (*p).err_node_out = std::ptr::null_mut();
    }
    if r.is_ok() && flags & 2 != 0 {
        // SAFETY: as above.
        let s = unsafe { (*p).upload_stream };
        cu()?.stream(s as usize)?;
    }
    r
}

// ------------------------------------------------------------------- launch

fn run_steps(d: &Driver, steps: &[Step], stream: usize) -> CuRes {
    for s in steps.iter().filter(|s| s.enabled) {
        match &s.op {
            Op::Kernel(k) => {
                if super::stream::record_if_capturing(stream, k)? {
                    continue;
                }
                super::launch::submit(d, stream, k.ns)?;
            }
            Op::Memcpy(m) => {
                let m = *m;
                if !super::stream::record_node_if_capturing(stream, || NodeKind::Memcpy(m))? {
                    super::array::memcpy3d(&m)?
                }
            }
            Op::Memset(m) => {
                let m = *m;
                if !super::stream::record_node_if_capturing(stream, || NodeKind::Memset(m))? {
                    run_memset(&m)?
                }
            }
            Op::MemOp(m) => {
                if !super::stream::record_node_if_capturing(stream, || NodeKind::MemOp(m.clone()))?
                {
                    super::memory::run_mem_op(d, m)?
                }
            }
            Op::BatchMemOp(b) => {
                if !super::stream::record_node_if_capturing(stream, || {
                    NodeKind::BatchMemOp(Arc::clone(b))
                })? {
                    super::stream::run_batch(stream as CUstream, &b.ops)?
                }
            }
            Op::Host(f, u) => {
                // SAFETY: f was a non-null CUhostFn given by the caller.
                let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(*f) };
                super::stream::host_func_after(stream, f, *u)?;
            }
            Op::EventRecord(e) => super::stream::record_event(*e, stream)?,
            Op::EventWait => {}
            Op::Alloc(a) => graph_mem_alloc(d, a)?,
            Op::Free(p) => graph_mem_free(*p).unwrap_or(Err(CUDA_ERROR_INVALID_VALUE))?,
            Op::Cond(h, t, bodies) => {
                if h.assign_default {
                    h.value.store(h.default, Relaxed);
                }
                let v = h.value.load(Relaxed) as usize;
                // IF 0, WHILE 1, SWITCH 2
                let body = match t {
                    0 | 1 if v != 0 => bodies.first(),
                    2 => bodies.get(v),
                    _ => None,
                };
                if let Some(b) = body {
                    run_steps(d, b, stream)?;
                }
            }
        }
    }
    Ok(())
}

fn run_memset(m: &MemsetNodeParams) -> CuRes {
    for row in 0..m.height {
        let p = m.dst + (row * m.pitch) as u64;
        match m.element_size {
            1 => super::memory::memset_n(p, m.value as u8, m.width)?,
            2 => super::memory::memset_n(p, m.value as u16, m.width)?,
            _ => super::memory::memset_n(p, m.value, m.width)?,
        }
    }
    Ok(())
}

fn graph_launch(e: CUgraphExec, stream: CUstream) -> CuRes {
    let d = cu()?;
    let ge = exec_of(e)?;
    d.stream(stream as usize)?;
    let steps = ge.steps.lock().clone();
    // CUDA_GRAPH_INSTANTIATE_FLAG_AUTO_FREE_ON_LAUNCH: what the previous
    // launch allocated and nobody freed is freed first.
    if ge.flags & 1 != 0 {
        for s in &steps {
            if let Op::Alloc(a) = &s.op {
                if a.live.load(Acquire) {
                    let _ = graph_mem_free(a.ptr);
                }
            }
        }
    }
    run_steps(d, &steps, stream as usize)
}

fn exec_destroy(e: CUgraphExec) -> CuRes {
    let d = cu()?;
    let ge = exec_of(e)?;
    d.objs.lock().remove(e as usize);
    for s in ge.steps.lock().iter() {
        if let Op::Alloc(a) = &s.op {
            let _ = a
                .execs
                .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(1)));
            drop_range_if_unused(a);
        }
    }
    let objs = std::mem::take(&mut *ge.user_objs.lock());
    for (u, c) in objs {
        release_user_obj(d, u, c);
    }
    Ok(())
}

/// Replaces the op of `node` in an exec (same type only).
fn exec_set(e: CUgraphExec, node: CUgraphNode, kind: NodeKind) -> CuRes {
    let ge = exec_of(e)?;
    let mut steps = ge.steps.lock();
    let s = steps
        .iter_mut()
        .find(|s| s.node == node as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    s.op = match (kind, &s.op) {
        (NodeKind::Kernel(k), Op::Kernel(_)) => Op::Kernel(k.run),
        (NodeKind::Memcpy(m), Op::Memcpy(_)) => Op::Memcpy(m),
        (NodeKind::Memset(m), Op::Memset(_)) => Op::Memset(m),
        (NodeKind::Host(f, u), Op::Host(..)) => Op::Host(f, u),
        (NodeKind::EventRecord(x), Op::EventRecord(_)) => Op::EventRecord(x),
        (NodeKind::EventWait(_), Op::EventWait) => Op::EventWait,
        (NodeKind::BatchMemOp(b), Op::BatchMemOp(_)) => Op::BatchMemOp(b),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    Ok(())
}

fn set_enabled(e: CUgraphExec, node: CUgraphNode, on: Option<u32>, out: *mut u32) -> CuRes {
    let ge = exec_of(e)?;
    let mut steps = ge.steps.lock();
    let s = steps
        .iter_mut()
        .find(|s| s.node == node as usize)
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    match on {
        Some(v) => {
            s.enabled = v != 0;
            Ok(())
        }
        // SAFETY: out pointer from the caller.
        None => unsafe { put(out, s.enabled as u32, CUDA_ERROR_INVALID_VALUE) },
    }
}

/// The shape of graph `g` (its nodes in the order they were added).
pub fn shape_of(g: usize) -> Result<Vec<ShapeNode>, CUresult> {
    let graph = graph_of(g)?;
    let nodes: Vec<(usize, NodeKind, Vec<usize>)> = graph
        .lock()
        .nodes
        .iter()
        .map(|n| (n.h, n.kind.clone(), n.deps.clone()))
        .collect();
    let index: HashMap<usize, usize> = nodes.iter().enumerate().map(|(i, n)| (n.0, i)).collect();
    let d = cu()?;
    let mut out = Vec::with_capacity(nodes.len());
    for (h, kind, deps) in nodes {
        let mut deps: Vec<usize> = deps.iter().filter_map(|x| index.get(x).copied()).collect();
        deps.sort_unstable();
        let mut inner = Vec::new();
        let fixed = match &kind {
            NodeKind::Kernel(k) => Fixed::Kernel(
                d.objs
                    .lock()
                    .get(k.run.func.module)
                    .and_then(|o| match o {
                        Obj::Module(m) => Some(m.ctx),
                        _ => None,
                    })
                    .unwrap_or(0),
            ),
            NodeKind::Memset(m) if m.height > 1 => {
                Fixed::Memset(Some((m.element_size, m.width, m.height)))
            }
            NodeKind::Memset(_) => Fixed::Memset(None),
            NodeKind::Memcpy(m) => Fixed::Memcpy(m.src_memory_type, m.dst_memory_type),
            NodeKind::MemAlloc(a) => Fixed::Alloc(a.size, a.dev),
            NodeKind::Child(c) => {
                inner.push(shape_of(*c)?);
                Fixed::None
            }
            NodeKind::Cond(_, t, bodies) => {
                for b in bodies {
                    inner.push(shape_of(*b)?);
                }
                Fixed::Cond(*t, bodies.len())
            }
            _ => Fixed::None,
        };
        out.push(ShapeNode {
            h,
            ty: kind.type_code(),
            deps,
            fixed,
            inner,
        });
    }
    Ok(out)
}

/// Why an update fails: (`CUgraphExecUpdateResult`, error node, error
/// "from" node), the nodes being the new graph's.
type UpdateFailure = (u32, usize, usize);

const UPDATE_ERROR: u32 = 1;
const UPDATE_TOPOLOGY_CHANGED: u32 = 2;
const UPDATE_NODE_TYPE_CHANGED: u32 = 3;
const UPDATE_PARAMETERS_CHANGED: u32 = 5;
const UPDATE_NOT_SUPPORTED: u32 = 6;
const UPDATE_UNSUPPORTED_FUNCTION_CHANGE: u32 = 7;

/// Compares the shape of the graph an exec was made from (`old`) with the
/// update's (`new`), as the driver does: first the topology (node count,
/// then each node's dependencies), then each node's type and the
/// parameters an update may not change, then the graphs inside nodes.
fn compare_shapes(old: &[ShapeNode], new: &[ShapeNode]) -> Result<(), UpdateFailure> {
    if old.len() != new.len() {
        return Err((UPDATE_TOPOLOGY_CHANGED, 0, 0));
    }
    for (o, n) in old.iter().zip(new) {
        if o.deps.len() != n.deps.len() {
            return Err((UPDATE_TOPOLOGY_CHANGED, n.h, 0));
        }
        if let Some((_, nd)) = o.deps.iter().zip(&n.deps).find(|(a, b)| a != b) {
            return Err((UPDATE_TOPOLOGY_CHANGED, n.h, new[*nd].h));
        }
    }
    for (o, n) in old.iter().zip(new) {
        if o.ty != n.ty {
            return Err((UPDATE_NODE_TYPE_CHANGED, n.h, 0));
        }
        match (&o.fixed, &n.fixed) {
            (Fixed::Kernel(a), Fixed::Kernel(b)) if a != b => {
                return Err((UPDATE_UNSUPPORTED_FUNCTION_CHANGE, n.h, 0));
            }
            (Fixed::Kernel(_), Fixed::Kernel(_)) => {}
            (Fixed::Memset(None), Fixed::Memset(None)) => {}
            (a, b) if a != b => return Err((UPDATE_PARAMETERS_CHANGED, n.h, 0)),
            _ => {}
        }
        for (oi, ni) in o.inner.iter().zip(&n.inner) {
            compare_shapes(oi, ni)?;
        }
    }
    Ok(())
}

/// `cuGraphExecUpdate`: the graph must have the shape of the graph the exec
/// was made from (see [`compare_shapes`]); the exec then takes its
/// parameters and its user object references, and keeps identifying its
/// nodes by the original graph's handles. A failed update changes nothing.
fn exec_update(e: CUgraphExec, g: CUgraph) -> Result<(), (CUresult, UpdateFailure)> {
    let fail = |x: CUresult| (x, (UPDATE_ERROR, 0, 0));
    let d = cu().map_err(fail)?;
    let ge = exec_of(e).map_err(|_| fail(CUDA_ERROR_INVALID_VALUE))?;
    if graph_of(g as usize)
        .map_err(|_| fail(CUDA_ERROR_INVALID_VALUE))?
        .lock()
        .moved
    {
        return Err(fail(CUDA_ERROR_INVALID_VALUE));
    }
    let shape = shape_of(g as usize).map_err(fail)?;
    compare_shapes(&ge.shape.lock(), &shape)
        .map_err(|f| (CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, f))?;
    let mut fresh = Vec::new();
    flatten(g as usize, &mut fresh).map_err(fail)?;
    let mut steps = ge.steps.lock();
    let same = steps.len() == fresh.len()
        && steps
            .iter()
            .zip(&fresh)
            .all(|(a, b)| std::mem::discriminant(&a.op) == std::mem::discriminant(&b.op));
    if !same {
        return Err(fail(CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE));
    }
    // An allocation node's memory belongs to one executable at a time.
    for (s, f) in steps.iter().zip(&fresh) {
        if let (Op::Alloc(a), Op::Alloc(b)) = (&s.op, &f.op) {
            if !Arc::ptr_eq(a, b) && b.execs.load(Acquire) > 0 {
                let n = shape.iter().find(|x| x.h == f.node).map_or(0, |x| x.h);
                return Err((
                    CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE,
                    (UPDATE_NOT_SUPPORTED, n, 0),
                ));
            }
        }
    }
    for (s, f) in steps.iter_mut().zip(fresh) {
        if let (Op::Alloc(a), Op::Alloc(b)) = (&s.op, &f.op) {
            if !Arc::ptr_eq(a, b) {
                b.execs.fetch_add(1, AcqRel);
                let _ = a
                    .execs
                    .fetch_update(AcqRel, Acquire, |v| Some(v.saturating_sub(1)));
                drop_range_if_unused(a);
            }
        }
        s.op = f.op;
    }
    drop(steps);
    // The exec now holds the new graph's user object references.
    let mut fresh_objs = HashMap::new();
    collect_user_objs(g as usize, &mut fresh_objs);
    for (u, c) in &fresh_objs {
        if let Ok(o) = user_obj(*u) {
            o.refs.fetch_add(*c, AcqRel);
        }
    }
    let old_objs = std::mem::replace(&mut *ge.user_objs.lock(), fresh_objs);
    for (u, c) in old_objs {
        release_user_obj(d, u, c);
    }
    Ok(())
}

// -------------------------------------------------------------- user objects

fn release_user_obj(d: &Driver, h: usize, count: u32) {
    let Ok(o) = user_obj(h) else { return };
    let before = o
        .refs
        .fetch_update(AcqRel, Acquire, |r| Some(r.saturating_sub(count)))
        .unwrap_or(0);
    if before <= count {
        d.objs.lock().remove(h);
        if o.destroy != 0 {
            // SAFETY: a non-null CUhostFn given at creation, with its data.
            let f: unsafe extern "C" fn(*mut c_void) = unsafe { std::mem::transmute(o.destroy) };
            let ptr = o.ptr;
            // The driver runs destructors asynchronously, never inside the call.
            std::thread::spawn(move || unsafe { f(ptr as *mut c_void) });
        }
    }
}

// ---------------------------------------------------------- conditional nodes

static COND_IDS: AtomicU64 = AtomicU64::new(0);

fn cond_handle_create(out: *mut u64, g: CUgraph, default: u32, flags: u32) -> CuRes {
    cu()?;
    graph_of(g as usize)?;
    if out.is_null() || flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let id = COND_IDS.fetch_add(1, Relaxed) + 1;
    cond_handles().lock().insert(
        id,
        Arc::new(CondHandle {
            graph: g as usize,
            default,
            assign_default: flags & 1 != 0,
            value: AtomicU32::new(default),
        }),
    );
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(out, id, CUDA_ERROR_INVALID_VALUE) }
}

fn cond_data(p: *mut ConditionalNodeParams) -> Result<NodeKind, CUresult> {
    let d = cu()?;
    // SAFETY: non-null params from the caller (checked by the caller).
    let cp = unsafe { p.read_unaligned() };
    if !cond_handles().lock().contains_key(&cp.handle) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let n = match (cp.type_, cp.size) {
        (0, 1 | 2) | (1, 1) => cp.size as usize,
        (2, 1..=1024) => cp.size as usize,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let bodies: Vec<usize> = (0..n).map(|_| new_graph(d)).collect();
    for b in &bodies {
        if let Ok(g) = graph_of(*b) {
            g.lock().owned_by_node = true;
        }
    }
    // phGraph_out is a driver-owned array valid while the node lives: the
    // node's own list of bodies (its heap buffer never moves).
    // SAFETY: the caller's params (checked non-null by the caller).
    unsafe {
        std::ptr::addr_of_mut!((*p).graph_out).write_unaligned(bodies.as_ptr() as *mut CUgraph)
    };
    Ok(NodeKind::Cond(cp.handle, cp.type_, bodies))
}

/// `cuGraphAddNode` / `cuGraphNodeSetParams`: the node of `p.type_`.
fn generic_kind(p: *mut GraphNodeParams) -> Result<NodeKind, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller; the union starts at `u`.
    let (t, u) = unsafe { ((*p).type_, std::ptr::addr_of_mut!((*p).u) as *mut u8) };
    match t {
        NODE_KERNEL => kernel_data(u as *const KernelNodeParams, true),
        NODE_MEMCPY => {
            // SAFETY: the union holds a CUDA_MEMCPY_NODE_PARAMS.
            let mp = unsafe { (u as *const MemcpyNodeParams).read_unaligned() };
            memcpy_data(&mp.copy)
        }
        NODE_MEMSET => memset_data(u as *const MemsetNodeParams),
        NODE_HOST => host_data(u as *const HostNodeParams),
        // CUDA_CHILD_GRAPH_NODE_PARAMS: the graph, then its ownership
        // (clone 0, move 1).
        NODE_GRAPH => {
            // SAFETY: the union holds a CUgraph then an i32.
            let (g, own) = unsafe { (*(u as *const CUgraph), *(u.add(8) as *const i32)) };
            match own {
                0 => child_data(g),
                1 => child_moved(g),
                _ => Err(CUDA_ERROR_INVALID_VALUE),
            }
        }
        NODE_EMPTY => Ok(NodeKind::Empty),
        // SAFETY: as above.
        NODE_WAIT_EVENT => event_data(unsafe { *(u as *const CUevent) }, false),
        // SAFETY: as above.
        NODE_EVENT_RECORD => event_data(unsafe { *(u as *const CUevent) }, true),
        NODE_MEM_ALLOC => mem_alloc_data(u as *mut MemAllocNodeParams),
        // SAFETY: the union holds a CUdeviceptr first.
        NODE_MEM_FREE => Ok(NodeKind::MemFree(unsafe { *(u as *const u64) })),
        NODE_CONDITIONAL => cond_data(u as *mut ConditionalNodeParams),
        NODE_BATCH_MEM_OP => batch_data(u as *const BatchNodeParams),
        _ => {
            crate::stub_hit!("cuGraphAddNode(external semaphore node)");
            Err(CUDA_ERROR_NOT_SUPPORTED)
        }
    }
}

fn mem_free_data(p: CUdeviceptr) -> Result<NodeKind, CUresult> {
    cu()?;
    if graph_allocs().lock().contains_key(&p) {
        Ok(NodeKind::MemFree(p))
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// The node's parameters as given (`v2`: with `kern` and `ctx`).
fn get_kernel_params(n: CUgraphNode, out: *mut KernelNodeParams, v2: bool) -> CuRes {
    match node_kind(n)? {
        NodeKind::Kernel(k) if v2 => {
            let v = KernelNodeParamsV2 {
                v1: k.params,
                kern: k.kern as CUkernel,
                ctx: k.ctx as CUcontext,
            };
            // SAFETY: out pointer from the caller (a CUDA_KERNEL_NODE_PARAMS_v2).
            unsafe { put(out as *mut KernelNodeParamsV2, v, CUDA_ERROR_INVALID_VALUE) }
        }
        // SAFETY: out pointer from the caller (a CUDA_KERNEL_NODE_PARAMS).
        NodeKind::Kernel(k) => unsafe { put(out, k.params, CUDA_ERROR_INVALID_VALUE) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// `cuGraphKernelNodeSetParams(_v2)`: new parameters, the launch attributes kept.
fn set_kernel_params(n: CUgraphNode, p: *const KernelNodeParams, v2: bool) -> CuRes {
    let attrs = match node_kind(n)? {
        NodeKind::Kernel(k) => k.attrs,
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    let mut k = kernel_data(p, v2)?;
    if let NodeKind::Kernel(x) = &mut k {
        x.attrs = attrs;
    }
    set_node_kind(n, k)
}

fn get_id(p: *mut u32, id: u32) -> CuRes {
    // SAFETY: out pointer from the caller.
    unsafe { put(p, id, CUDA_ERROR_INVALID_VALUE) }
}

fn dot_print(g: CUgraph, path: *const c_char) -> CuRes {
    let graph = graph_of(g as usize)?;
    // SAFETY: NUL-terminated path from the caller.
    let path = unsafe { crate::read_cstr(path) }.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    let mut s = String::from("digraph cgpu_sim {\n");
    for n in &graph.lock().nodes {
        s.push_str(&format!(
            "  n{:x} [label=\"type {}\"];\n",
            n.h,
            n.kind.type_code()
        ));
        for dep in &n.deps {
            s.push_str(&format!("  n{dep:x} -> n{:x};\n", n.h));
        }
    }
    s.push_str("}\n");
    std::fs::write(path, s).map_err(|_| CUDA_ERROR_OPERATING_SYSTEM)
}

type Nodes = *const CUgraphNode;
type NodeOut = *mut CUgraphNode;

exports! {
    cuGraphCreate(pg: *mut CUgraph, flags: u32) => graph_create(pg, flags);
    cuGraphDestroy(g: CUgraph) => {
        let d = cu()?;
        if graph_of(g as usize)?.lock().moved { return Err(CUDA_ERROR_INVALID_VALUE) }
        destroy_graph(d, g as usize)
    };
    cuGraphClone(pg: *mut CUgraph, g: CUgraph) => {
        if pg.is_null() { return Err(CUDA_ERROR_INVALID_VALUE) }
        let (h, _) = clone_graph(g as usize)?;
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(pg, h as CUgraph, CUDA_ERROR_INVALID_VALUE) }
    };
    cuGraphNodeFindInClone(pn: NodeOut, orig: CUgraphNode, clone: CUgraph) => {
        // Clones keep the order of nodes: the node at the same position.
        let (_, og) = owner_of(orig)?;
        let i = og.lock().nodes.iter().position(|x| x.h == orig as usize).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let cg = graph_of(clone as usize)?;
        let h = cg.lock().nodes.get(i).map(|x| x.h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(pn, h as CUgraphNode, CUDA_ERROR_INVALID_VALUE) }
    };
    cuGraphAddKernelNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *const KernelNodeParams)
        => add_node(pn, g, deps, ndeps, || kernel_data(p, false));
    cuGraphAddKernelNode_v2(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *const KernelNodeParams)
        => add_node(pn, g, deps, ndeps, || kernel_data(p, true));
    cuGraphAddEmptyNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize)
        => add_node(pn, g, deps, ndeps, || Ok(NodeKind::Empty));
    cuGraphAddMemsetNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *const MemsetNodeParams, _ctx: CUcontext)
        => add_node(pn, g, deps, ndeps, || memset_data(p));
    cuGraphAddMemcpyNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *const super::array::Memcpy3D, _ctx: CUcontext)
        => add_node(pn, g, deps, ndeps, || memcpy_data(p));
    cuGraphAddHostNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *const HostNodeParams)
        => add_node(pn, g, deps, ndeps, || host_data(p));
    cuGraphAddChildGraphNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, child: CUgraph)
        => add_node(pn, g, deps, ndeps, || child_data(child));
    cuGraphAddEventRecordNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, e: CUevent)
        => add_node(pn, g, deps, ndeps, || event_data(e, true));
    cuGraphAddEventWaitNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, e: CUevent)
        => add_node(pn, g, deps, ndeps, || event_data(e, false));
    cuGraphAddMemAllocNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *mut MemAllocNodeParams)
        => add_node(pn, g, deps, ndeps, || mem_alloc_data(p));
    cuGraphAddMemFreeNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: CUdeviceptr)
        => add_node(pn, g, deps, ndeps, || mem_free_data(p));
    cuGraphAddNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *mut GraphNodeParams)
        => add_node(pn, g, deps, ndeps, || generic_kind(p));
    // _v3 (CUDA 13.4): the same signature; it also knows the batch copy node types.
    cuGraphAddNode_v2 | cuGraphAddNode_v3(pn: NodeOut, g: CUgraph, deps: Nodes, _edata: *const u64, ndeps: usize, p: *mut GraphNodeParams)
        => add_node(pn, g, deps, ndeps, || generic_kind(p));
    cuGraphNodeSetParams | cuGraphNodeSetParams_v2(n: CUgraphNode, p: *mut GraphNodeParams) => {
        if let NodeKind::MemAlloc(_) | NodeKind::MemFree(_) | NodeKind::Cond(..) = node_kind(n)? {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        set_node_kind(n, generic_kind(p)?)
    };
    cuGraphExecNodeSetParams(e: CUgraphExec, n: CUgraphNode, p: *mut GraphNodeParams) => {
        if let NodeKind::MemAlloc(_) | NodeKind::MemFree(_) | NodeKind::Cond(..) = node_kind(n)? {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        exec_set(e, n, generic_kind(p)?)
    };
    cuGraphConditionalHandleCreate(out: *mut u64, g: CUgraph, _ctx: CUcontext, default: u32, flags: u32)
        => cond_handle_create(out, g, default, flags);
    cuGraphDestroyNode(n: CUgraphNode) => destroy_node(n);
    cuGraphGetNodes(g: CUgraph, out: NodeOut, count: *mut usize) => get_nodes(g, out, count, false);
    cuGraphGetRootNodes(g: CUgraph, out: NodeOut, count: *mut usize) => get_nodes(g, out, count, true);
    cuGraphGetEdges(g: CUgraph, from: NodeOut, to: NodeOut, count: *mut usize)
        => get_edges(g, from, to, std::ptr::null_mut(), count);
    cuGraphGetEdges_v2(g: CUgraph, from: NodeOut, to: NodeOut, edata: *mut u64, count: *mut usize)
        => get_edges(g, from, to, edata, count);
    cuGraphNodeGetDependencies(n: CUgraphNode, out: NodeOut, count: *mut usize)
        => node_deps(n, out, std::ptr::null_mut(), count, false);
    cuGraphNodeGetDependencies_v2(n: CUgraphNode, out: NodeOut, edata: *mut u64, count: *mut usize)
        => node_deps(n, out, edata, count, false);
    cuGraphNodeGetDependentNodes(n: CUgraphNode, out: NodeOut, count: *mut usize)
        => node_deps(n, out, std::ptr::null_mut(), count, true);
    cuGraphNodeGetDependentNodes_v2(n: CUgraphNode, out: NodeOut, edata: *mut u64, count: *mut usize)
        => node_deps(n, out, edata, count, true);
    cuGraphAddDependencies(g: CUgraph, from: Nodes, to: Nodes, n: usize) => change_deps(g, from, to, n, true);
    cuGraphAddDependencies_v2(g: CUgraph, from: Nodes, to: Nodes, _edata: *const u64, n: usize)
        => change_deps(g, from, to, n, true);
    cuGraphRemoveDependencies(g: CUgraph, from: Nodes, to: Nodes, n: usize) => change_deps(g, from, to, n, false);
    cuGraphRemoveDependencies_v2(g: CUgraph, from: Nodes, to: Nodes, _edata: *const u64, n: usize)
        => change_deps(g, from, to, n, false);
    cuGraphNodeGetType(n: CUgraphNode, t: *mut u32) => {
        let k = node_kind(n)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(t, k.type_code(), CUDA_ERROR_INVALID_VALUE) }
    };
    cuGraphGetId(g: CUgraph, id: *mut u32) => get_id(id, graph_of(g as usize)?.lock().id);
    cuGraphExecGetId(e: CUgraphExec, id: *mut u32) => get_id(id, exec_of(e)?.id);
    cuGraphNodeGetLocalId(n: CUgraphNode, id: *mut u32) => {
        let (_, g) = owner_of(n)?;
        let v = g.lock().node(n as usize).map(|x| x.local_id).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        get_id(id, v)
    };
    cuGraphNodeGetToolsId(n: CUgraphNode, id: *mut u64) => {
        // Unique in the process: the graph's id and the node's local id.
        let (_, g) = owner_of(n)?;
        let gr = g.lock();
        let v = gr.node(n as usize).map(|x| ((gr.id as u64) << 32) | x.local_id as u64).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(id, v, CUDA_ERROR_INVALID_VALUE) }
    };
    cuGraphNodeGetContainingGraph(n: CUgraphNode, pg: *mut CUgraph) => {
        let (gh, _) = owner_of(n)?;
        // SAFETY: out pointer from the caller.
        unsafe { put(pg, gh as CUgraph, CUDA_ERROR_INVALID_VALUE) }
    };
    cuGraphKernelNodeGetParams(n: CUgraphNode, p: *mut KernelNodeParams) => get_kernel_params(n, p, false);
    cuGraphKernelNodeGetParams_v2(n: CUgraphNode, p: *mut KernelNodeParams) => get_kernel_params(n, p, true);
    cuGraphKernelNodeSetParams(n: CUgraphNode, p: *const KernelNodeParams) => set_kernel_params(n, p, false);
    cuGraphKernelNodeSetParams_v2(n: CUgraphNode, p: *const KernelNodeParams) => set_kernel_params(n, p, true);
    cuGraphKernelNodeGetAttribute(n: CUgraphNode, attr: u32, out: *mut [u8; 64]) => match node_kind(n)? {
        NodeKind::Kernel(k) => {
            if !(1..=32).contains(&attr) { return Err(CUDA_ERROR_INVALID_VALUE) }
            // SAFETY: out pointer from the caller (a 64-byte CUkernelNodeAttrValue).
            unsafe { put(out, k.attrs.get(&attr).copied().unwrap_or([0; 64]), CUDA_ERROR_INVALID_VALUE) }
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphKernelNodeSetAttribute(n: CUgraphNode, attr: u32, v: *const [u8; 64]) => match node_kind(n)? {
        NodeKind::Kernel(mut k) => {
            if v.is_null() || !(1..=32).contains(&attr) { return Err(CUDA_ERROR_INVALID_VALUE) }
            // SAFETY: a 64-byte CUkernelNodeAttrValue from the caller (checked non-null).
            k.attrs.insert(attr, unsafe { v.read_unaligned() });
            set_node_kind(n, NodeKind::Kernel(k))
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphKernelNodeCopyAttributes(dst: CUgraphNode, src: CUgraphNode) => match (node_kind(dst)?, node_kind(src)?) {
        (NodeKind::Kernel(mut d), NodeKind::Kernel(s)) => {
            d.attrs = s.attrs;
            set_node_kind(dst, NodeKind::Kernel(d))
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphExecKernelNodeSetParams(e: CUgraphExec, n: CUgraphNode, p: *const KernelNodeParams)
        => exec_set(e, n, kernel_data(p, false)?);
    cuGraphExecKernelNodeSetParams_v2(e: CUgraphExec, n: CUgraphNode, p: *const KernelNodeParams)
        => exec_set(e, n, kernel_data(p, true)?);
    cuGraphMemsetNodeGetParams(n: CUgraphNode, p: *mut MemsetNodeParams) => match node_kind(n)? {
        // SAFETY: out pointer from the caller.
        NodeKind::Memset(m) => unsafe { put(p, m, CUDA_ERROR_INVALID_VALUE) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphMemsetNodeSetParams(n: CUgraphNode, p: *const MemsetNodeParams) => set_node_kind(n, memset_data(p)?);
    cuGraphAddBatchMemOpNode(pn: NodeOut, g: CUgraph, deps: Nodes, ndeps: usize, p: *const BatchNodeParams)
        => add_node(pn, g, deps, ndeps, || batch_data(p));
    cuGraphBatchMemOpNodeGetParams(n: CUgraphNode, p: *mut BatchNodeParams) => batch_params(n, p);
    cuGraphBatchMemOpNodeSetParams(n: CUgraphNode, p: *const BatchNodeParams) => set_node_kind(n, batch_data(p)?);
    cuGraphExecBatchMemOpNodeSetParams(e: CUgraphExec, n: CUgraphNode, p: *const BatchNodeParams)
        => exec_set(e, n, batch_data(p)?);
    cuGraphExecMemsetNodeSetParams(e: CUgraphExec, n: CUgraphNode, p: *const MemsetNodeParams, _ctx: CUcontext)
        => exec_set(e, n, memset_data(p)?);
    cuGraphMemcpyNodeGetParams(n: CUgraphNode, p: *mut super::array::Memcpy3D) => match node_kind(n)? {
        // SAFETY: out pointer from the caller.
        NodeKind::Memcpy(m) => unsafe { put(p, m, CUDA_ERROR_INVALID_VALUE) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphMemcpyNodeSetParams(n: CUgraphNode, p: *const super::array::Memcpy3D) => set_node_kind(n, memcpy_data(p)?);
    cuGraphExecMemcpyNodeSetParams(e: CUgraphExec, n: CUgraphNode, p: *const super::array::Memcpy3D, _ctx: CUcontext)
        => exec_set(e, n, memcpy_data(p)?);
    cuGraphHostNodeGetParams(n: CUgraphNode, p: *mut HostNodeParams) => match node_kind(n)? {
        NodeKind::Host(f, u) => {
            // SAFETY: f is a non-null CUhostFn stored at creation.
            let hp = HostNodeParams { func: Some(unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void)>(f) }), user_data: u as *mut c_void };
            // SAFETY: out pointer from the caller.
            unsafe { put(p, hp, CUDA_ERROR_INVALID_VALUE) }
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphHostNodeSetParams(n: CUgraphNode, p: *const HostNodeParams) => set_node_kind(n, host_data(p)?);
    cuGraphExecHostNodeSetParams(e: CUgraphExec, n: CUgraphNode, p: *const HostNodeParams)
        => exec_set(e, n, host_data(p)?);
    cuGraphChildGraphNodeGetGraph(n: CUgraphNode, pg: *mut CUgraph) => match node_kind(n)? {
        // SAFETY: out pointer from the caller.
        NodeKind::Child(c) => unsafe { put(pg, c as CUgraph, CUDA_ERROR_INVALID_VALUE) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphExecChildGraphNodeSetParams(e: CUgraphExec, n: CUgraphNode, child: CUgraph) => {
        let mut v = Vec::new();
        flatten(child as usize, &mut v)?;
        let ge = exec_of(e)?;
        let mut steps = ge.steps.lock();
        // The child's ops were flattened in place: same count and kinds only.
        let (_, og) = owner_of(n)?;
        let old = match og.lock().node(n as usize).map(|x| x.kind.clone()) {
            Some(NodeKind::Child(c)) => c,
            _ => return Err(CUDA_ERROR_INVALID_VALUE),
        };
        let mut before = Vec::new();
        flatten(old, &mut before)?;
        let start = steps.iter().position(|s| before.first().is_some_and(|b| b.node == s.node));
        match start {
            Some(i) if before.len() == v.len() && i + v.len() <= steps.len() => {
                for (s, f) in steps[i..i + v.len()].iter_mut().zip(v) {
                    s.op = f.op;
                }
                Ok(())
            }
            None if before.is_empty() && v.is_empty() => Ok(()),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    cuGraphEventRecordNodeGetEvent | cuGraphEventWaitNodeGetEvent(n: CUgraphNode, pe: *mut CUevent) => match node_kind(n)? {
        // SAFETY: out pointer from the caller.
        NodeKind::EventRecord(e) | NodeKind::EventWait(e) => unsafe { put(pe, e as CUevent, CUDA_ERROR_INVALID_VALUE) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphEventRecordNodeSetEvent(n: CUgraphNode, e: CUevent) => set_node_kind(n, event_data(e, true)?);
    cuGraphEventWaitNodeSetEvent(n: CUgraphNode, e: CUevent) => set_node_kind(n, event_data(e, false)?);
    cuGraphExecEventRecordNodeSetEvent(x: CUgraphExec, n: CUgraphNode, e: CUevent) => exec_set(x, n, event_data(e, true)?);
    cuGraphExecEventWaitNodeSetEvent(x: CUgraphExec, n: CUgraphNode, e: CUevent) => exec_set(x, n, event_data(e, false)?);
    cuGraphMemAllocNodeGetParams(n: CUgraphNode, p: *mut MemAllocNodeParams) => match node_kind(n)? {
        NodeKind::MemAlloc(a) => {
            if p.is_null() { return Err(CUDA_ERROR_INVALID_VALUE) }
            // SAFETY: zeroed is valid for this plain C struct.
            let mut out: MemAllocNodeParams = unsafe { std::mem::zeroed() };
            out.pool_props.allocType = if a.managed { 2 } else { 1 };
            out.pool_props.location.type_ = 1;
            out.pool_props.location.id = a.dev as i32;
            out.bytesize = a.size as usize;
            out.dptr = a.ptr;
            // SAFETY: out pointer from the caller (checked non-null).
            unsafe { put(p, out, CUDA_ERROR_INVALID_VALUE) }
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuGraphMemFreeNodeGetParams(n: CUgraphNode, p: *mut CUdeviceptr) => match node_kind(n)? {
        // SAFETY: out pointer from the caller.
        NodeKind::MemFree(x) => unsafe { put(p, x, CUDA_ERROR_INVALID_VALUE) },
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    };
    cuDeviceGetGraphMemAttribute(dev: CUdevice, attr: u32, value: *mut u64) => {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        let m = graph_mem(i).lock();
        // CU_GRAPH_MEM_ATTR_USED_MEM_CURRENT 0, _HIGH 1, RESERVED_MEM_CURRENT 2, _HIGH 3
        let v = match attr { 0 => m.used, 1 => m.used_high, 2 => m.reserved, 3 => m.reserved_high, _ => return Err(CUDA_ERROR_INVALID_VALUE) };
        // SAFETY: out pointer from the caller.
        unsafe { put(value, v, CUDA_ERROR_INVALID_VALUE) }
    };
    cuDeviceSetGraphMemAttribute(dev: CUdevice, attr: u32, value: *mut u64) => {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        // SAFETY: value points to a cuuint64_t by the API contract (checked non-null).
        if value.is_null() || unsafe { *value } != 0 { return Err(CUDA_ERROR_INVALID_VALUE) }
        let mut m = graph_mem(i).lock();
        match attr { 1 => m.used_high = m.used, 3 => m.reserved_high = m.reserved, _ => return Err(CUDA_ERROR_INVALID_VALUE) }
        Ok(())
    };
    cuDeviceGraphMemTrim(dev: CUdevice) => {
        let d = cu()?;
        let i = d.check_dev(dev)?;
        graph_mem_trim(d, i);
        Ok(())
    };
    cuGraphInstantiate | cuGraphInstantiate_v2
        (pe: *mut CUgraphExec, g: CUgraph, _err: NodeOut, _log: *mut c_char, _n: usize) => instantiate(pe, g, 0);
    cuGraphInstantiateWithFlags(pe: *mut CUgraphExec, g: CUgraph, flags: u64) => instantiate(pe, g, flags);
    cuGraphInstantiateWithParams | cuGraphInstantiateWithParams_ptsz
        (pe: *mut CUgraphExec, g: CUgraph, p: *mut InstantiateParams) => instantiate_with_params(pe, g, p);
    cuGraphExecGetFlags(e: CUgraphExec, f: *mut u64) => {
        let v = exec_of(e)?.flags;
        // SAFETY: out pointer from the caller.
        unsafe { put(f, v, CUDA_ERROR_INVALID_VALUE) }
    };
    cuGraphLaunch | cuGraphLaunch_ptsz(e: CUgraphExec, stream: CUstream) => graph_launch(e, stream);
    cuGraphUpload | cuGraphUpload_ptsz(e: CUgraphExec, stream: CUstream) => {
        exec_of(e)?;
        cu()?.stream(stream as usize).map(|_| ())
    };
    cuGraphExecDestroy(e: CUgraphExec) => exec_destroy(e);
    cuGraphExecUpdate(e: CUgraphExec, g: CUgraph, err_node: NodeOut, result: *mut u32) => {
        cu()?;
        let r = exec_update(e, g);
        let (res, node, _) = r.err().map_or((0, 0, 0), |x| x.1);
        if !err_node.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *err_node = node as CUgraphNode };
        }
        // SAFETY: out pointer from the caller.
        unsafe { put(result, res, CUDA_ERROR_INVALID_VALUE)? };
        r.map_err(|x| x.0)
    };
    cuGraphExecUpdate_v2(e: CUgraphExec, g: CUgraph, info: *mut u64) => {
        cu()?;
        if info.is_null() { return Err(CUDA_ERROR_INVALID_VALUE) }
        let r = exec_update(e, g);
        let (res, node, from) = r.err().map_or((0, 0, 0), |x| x.1);
        // CUgraphExecUpdateResultInfo: {result (u32, padded), errorNode, errorFromNode}.
        // SAFETY: the caller's 24-byte result info (checked non-null).
        unsafe {
            *info = res as u64;
            *info.add(1) = node as u64;
            *info.add(2) = from as u64;
        }
        r.map_err(|x| x.0)
    };
    cuGraphNodeSetEnabled(e: CUgraphExec, n: CUgraphNode, on: u32) => set_enabled(e, n, Some(on), std::ptr::null_mut());
    cuGraphNodeGetEnabled(e: CUgraphExec, n: CUgraphNode, on: *mut u32) => set_enabled(e, n, None, on);
    cuGraphDebugDotPrint(g: CUgraph, path: *const c_char, _flags: u32) => dot_print(g, path);
    cuUserObjectCreate(out: *mut usize, ptr: *mut c_void, destroy: super::stream::CUhostFn, refs: u32, flags: u32) => {
        let d = cu()?;
        // CU_USER_OBJECT_NO_DESTRUCTOR_SYNC (1) is required.
        if out.is_null() || refs == 0 || flags != 1 { return Err(CUDA_ERROR_INVALID_VALUE) }
        let destroy = destroy.ok_or(CUDA_ERROR_INVALID_VALUE)?;
        let h = d.objs.lock().insert(Obj::UserObject(Arc::new(UserObject { ptr: ptr as usize, destroy: destroy as usize, refs: AtomicU32::new(refs) })));
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(out, h, CUDA_ERROR_INVALID_VALUE) }
    };
    cuUserObjectRetain(o: usize, count: u32) => {
        if count == 0 { return Err(CUDA_ERROR_INVALID_VALUE) }
        user_obj(o)?.refs.fetch_add(count, AcqRel);
        Ok(())
    };
    cuUserObjectRelease(o: usize, count: u32) => {
        if count == 0 { return Err(CUDA_ERROR_INVALID_VALUE) }
        user_obj(o)?;
        release_user_obj(cu()?, o, count);
        Ok(())
    };
    cuGraphRetainUserObject(g: CUgraph, o: usize, count: u32, flags: u32) => {
        let graph = graph_of(g as usize)?;
        let obj = user_obj(o)?;
        // CU_GRAPH_USER_OBJECT_MOVE (1): take over the caller's references.
        if count == 0 || flags & !1 != 0 { return Err(CUDA_ERROR_INVALID_VALUE) }
        if flags & 1 == 0 { obj.refs.fetch_add(count, AcqRel); }
        *graph.lock().user_objs.entry(o).or_insert(0) += count;
        Ok(())
    };
    cuGraphReleaseUserObject(g: CUgraph, o: usize, count: u32) => {
        let graph = graph_of(g as usize)?;
        if count == 0 { return Err(CUDA_ERROR_INVALID_VALUE) }
        {
            let mut gr = graph.lock();
            let held = gr.user_objs.get_mut(&o).ok_or(CUDA_ERROR_INVALID_VALUE)?;
            if *held < count { return Err(CUDA_ERROR_INVALID_VALUE) }
            *held -= count;
            if *held == 0 { gr.user_objs.remove(&o); }
        }
        release_user_obj(cu()?, o, count);
        Ok(())
    };
}

stub_fns! {
    CUresult = CUDA_ERROR_NOT_SUPPORTED =>
        cuGraphAddExternalSemaphoresSignalNode,
        cuGraphAddExternalSemaphoresWaitNode, cuGraphExternalSemaphoresSignalNodeGetParams,
        cuGraphExternalSemaphoresSignalNodeSetParams, cuGraphExternalSemaphoresWaitNodeGetParams,
        cuGraphExternalSemaphoresWaitNodeSetParams, cuGraphExecExternalSemaphoresSignalNodeSetParams,
        cuGraphExecExternalSemaphoresWaitNodeSetParams;
}

/// `cuGraphNodeGetParams` (CUDA 13.2): the node's parameters in a
/// `CUgraphNodeParams`, for the node types whose parameters are plain data.
fn node_get_params(n: CUgraphNode, p: *mut GraphNodeParams) -> CuRes {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let kind = node_kind(n)?;
    // A conditional node hands out its own list of body graphs (the array
    // `cuGraphAddNode` gave, valid while the node lives), not a copy.
    let bodies_ptr = {
        let (_, graph) = owner_of(n)?;
        let gr = graph.lock();
        match gr.node(n as usize).map(|x| &x.kind) {
            Some(NodeKind::Cond(_, _, b)) => b.as_ptr() as *mut CUgraph,
            _ => std::ptr::null_mut(),
        }
    };
    // SAFETY: non-null params from the caller: a 256-byte CUgraphNodeParams.
    unsafe {
        std::ptr::write_bytes(p as *mut u8, 0, std::mem::size_of::<GraphNodeParams>());
        (*p).type_ = kind.type_code();
        let u = std::ptr::addr_of_mut!((*p).u) as *mut u8;
        match kind {
            NodeKind::Kernel(k) => {
                (u as *mut KernelNodeParamsV2).write_unaligned(KernelNodeParamsV2 {
                    v1: k.params,
                    kern: k.kern as CUkernel,
                    ctx: k.ctx as CUcontext,
                })
            }
            NodeKind::Memset(m) => (u as *mut MemsetNodeParams).write_unaligned(m),
            NodeKind::Memcpy(m) => (u.add(16) as *mut super::array::Memcpy3D).write_unaligned(m),
            NodeKind::Host(f, x) => {
                (u as *mut usize).write_unaligned(f);
                (u.add(8) as *mut usize).write_unaligned(x);
            }
            NodeKind::Child(c) => {
                (u as *mut usize).write_unaligned(c);
                // CU_GRAPH_CHILD_GRAPH_OWNERSHIP_INVALID: the graph handed back
                // is the node's, not one to add elsewhere.
                (u.add(8) as *mut i32).write_unaligned(-1);
            }
            NodeKind::EventRecord(e) | NodeKind::EventWait(e) => {
                (u as *mut usize).write_unaligned(e)
            }
            NodeKind::MemFree(x) => (u as *mut u64).write_unaligned(x),
            NodeKind::MemAlloc(a) => {
                let m = u as *mut MemAllocNodeParams;
                std::ptr::addr_of_mut!((*m).pool_props.allocType).write_unaligned(if a.managed {
                    2
                } else {
                    1
                });
                std::ptr::addr_of_mut!((*m).pool_props.location.type_).write_unaligned(1);
                std::ptr::addr_of_mut!((*m).pool_props.location.id).write_unaligned(a.dev as i32);
                std::ptr::addr_of_mut!((*m).bytesize).write_unaligned(a.size as usize);
                std::ptr::addr_of_mut!((*m).dptr).write_unaligned(a.ptr);
            }
            NodeKind::Cond(h, t, bodies) => {
                let c = u as *mut ConditionalNodeParams;
                std::ptr::addr_of_mut!((*c).handle).write_unaligned(h);
                std::ptr::addr_of_mut!((*c).type_).write_unaligned(t);
                std::ptr::addr_of_mut!((*c).size).write_unaligned(bodies.len() as u32);
                std::ptr::addr_of_mut!((*c).graph_out).write_unaligned(bodies_ptr);
            }
            NodeKind::BatchMemOp(b) => {
                (u as *mut BatchNodeParams).write_unaligned(b.params());
            }
            NodeKind::MemOp(m) => match super::stream::mem_op_node(m) {
                NodeKind::Memcpy(c) => {
                    (u.add(16) as *mut super::array::Memcpy3D).write_unaligned(c)
                }
                NodeKind::Memset(m) => (u as *mut MemsetNodeParams).write_unaligned(m),
                _ => {}
            },
            NodeKind::Empty => {}
        }
    }
    Ok(())
}

exports! {
    cuGraphNodeGetParams(n: CUgraphNode, p: *mut GraphNodeParams) => node_get_params(n, p);
}
