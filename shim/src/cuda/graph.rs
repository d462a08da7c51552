//! Graphs, enough for capture-free `cuGraphLaunch` of kernel (and empty)
//! nodes: a launch queues the kernel nodes in insertion order. Stream
//! capture (`cuStreamBeginCapture`, stream.rs) builds such graphs too.

use crate::driver::{cu, Graph, GraphExec, KernelNode, Obj};
use crate::{guard, put, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::Arc;

/// `CUDA_KERNEL_NODE_PARAMS` (v1) and `_v2` (v2 appends `kern` and `ctx`).
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

fn graph_of(h: usize) -> Result<Arc<Mutex<Graph>>, CUresult> {
    match cu()?.objs.lock().get(h) {
        Some(Obj::Graph(g)) => Ok(Arc::clone(g)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphCreate(pg: *mut CUgraph, flags: u32) -> CUresult {
    guard(|| {
        let d = cu()?;
        if pg.is_null() || flags != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let h = d
            .objs
            .lock()
            .insert(Obj::Graph(Arc::new(Mutex::new(Graph::default()))));
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(pg, h as CUgraph, CUDA_ERROR_INVALID_VALUE) }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphDestroy(g: CUgraph) -> CUresult {
    guard(|| {
        let d = cu()?;
        graph_of(g as usize)?;
        d.objs.lock().remove(g as usize);
        Ok(())
    })
}

fn add_node(
    pn: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    kernel: Option<KernelNode>,
) -> CuRes {
    let d = cu()?;
    if pn.is_null() || (ndeps > 0 && deps.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let graph = graph_of(g as usize)?;
    let mut gr = graph.lock();
    for i in 0..ndeps {
        // SAFETY: deps holds ndeps node handles by the caller's contract.
        let dep = unsafe { *deps.add(i) } as usize;
        if !gr.nodes.contains(&dep) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let h = d.objs.lock().insert(Obj::GraphNode(g as usize));
    gr.nodes.push(h);
    if let Some(k) = kernel {
        gr.kernels.push((h, k));
    }
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pn, h as CUgraphNode, CUDA_ERROR_INVALID_VALUE) }
}

fn add_kernel_node(
    pn: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    p: *const KernelNodeParams,
) -> CuRes {
    let d = cu()?;
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null params from the caller (the v1 prefix of v2).
    let kp = unsafe { p.read_unaligned() };
    let func = d.func(kp.func as usize)?;
    if kp.grid.contains(&0) || kp.block.contains(&0) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // Parameters are captured at node creation, as the driver does.
    // SAFETY: kernel params per the node params' contract.
    let ns = unsafe { super::launch::kernel_ns(d, &func, kp.kernel_params, kp.extra) }?;
    add_node(pn, g, deps, ndeps, Some(KernelNode { func, ns }))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode(
    pn: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    p: *const KernelNodeParams,
) -> CUresult {
    guard(|| add_kernel_node(pn, g, deps, ndeps, p))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddKernelNode_v2(
    pn: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
    p: *const KernelNodeParams,
) -> CUresult {
    guard(|| add_kernel_node(pn, g, deps, ndeps, p))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphAddEmptyNode(
    pn: *mut CUgraphNode,
    g: CUgraph,
    deps: *const CUgraphNode,
    ndeps: usize,
) -> CUresult {
    guard(|| add_node(pn, g, deps, ndeps, None))
}

fn instantiate(pe: *mut CUgraphExec, g: CUgraph) -> CuRes {
    let d = cu()?;
    if pe.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let graph = graph_of(g as usize)?;
    let gr = graph.lock();
    let kernels = gr.kernels.iter().map(|(_, k)| k.clone()).collect();
    let mem_ops = gr.mem_ops.iter().map(|(_, m)| m.clone()).collect();
    drop(gr);
    let h = d
        .objs
        .lock()
        .insert(Obj::GraphExec(Arc::new(GraphExec { kernels, mem_ops })));
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pe, h as CUgraphExec, CUDA_ERROR_INVALID_VALUE) }
}

/// CUDA 10/11 signature: (exec, graph, errorNode, logBuffer, bufferSize).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate(
    pe: *mut CUgraphExec,
    g: CUgraph,
    _err: *mut CUgraphNode,
    _log: *mut i8,
    _n: usize,
) -> CUresult {
    guard(|| instantiate(pe, g))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiate_v2(
    pe: *mut CUgraphExec,
    g: CUgraph,
    _err: *mut CUgraphNode,
    _log: *mut i8,
    _n: usize,
) -> CUresult {
    guard(|| instantiate(pe, g))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphInstantiateWithFlags(
    pe: *mut CUgraphExec,
    g: CUgraph,
    _flags: u64,
) -> CUresult {
    guard(|| instantiate(pe, g))
}

fn graph_launch(e: CUgraphExec, stream: CUstream) -> CuRes {
    let d = cu()?;
    let ge = match d.objs.lock().get(e as usize) {
        Some(Obj::GraphExec(x)) => Arc::clone(x),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    d.stream(stream as usize)?;
    for k in &ge.kernels {
        if super::stream::record_if_capturing(stream as usize, k)? {
            continue;
        }
        super::launch::submit(d, stream as usize, k.ns)?;
    }
    // Copies and memsets run now (or are recorded, if the stream captures).
    super::stream::capture_mem_ops(stream as usize, || {
        for op in &ge.mem_ops {
            if !super::stream::record_mem_op(|| op.clone()) {
                super::memory::run_mem_op(d, op)?;
            }
        }
        Ok(())
    })
}

/// `cuGraphGetNodes(graph, nodes, *count)`: the graph's nodes (with `nodes`
/// NULL: only their number; a larger array's rest is set to NULL).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphGetNodes(
    g: CUgraph,
    nodes: *mut CUgraphNode,
    count: *mut usize,
) -> CUresult {
    guard(|| {
        if count.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let graph = graph_of(g as usize)?;
        let all = graph.lock().nodes.clone();
        if nodes.is_null() {
            // SAFETY: non-null out pointer from the caller.
            unsafe { *count = all.len() };
            return Ok(());
        }
        // SAFETY: in/out pointer from the caller (checked non-null).
        let cap = unsafe { *count };
        for i in 0..cap {
            // SAFETY: `nodes` holds `cap` entries by the caller's contract.
            unsafe { *nodes.add(i) = all.get(i).copied().unwrap_or(0) as CUgraphNode };
        }
        // SAFETY: as above.
        unsafe { *count = all.len().min(cap) };
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch(e: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| graph_launch(e, stream))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphLaunch_ptsz(e: CUgraphExec, stream: CUstream) -> CUresult {
    guard(|| graph_launch(e, stream))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGraphExecDestroy(e: CUgraphExec) -> CUresult {
    guard(|| {
        let d = cu()?;
        let mut objs = d.objs.lock();
        match objs.get(e as usize) {
            Some(Obj::GraphExec(_)) => {
                objs.remove(e as usize);
                Ok(())
            }
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    })
}
