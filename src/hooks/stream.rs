//! Stream capture (CUDA graphs): passed through, counted so that the
//! scheduler's drain never synchronises a context while this process has a
//! capture open (that would invalidate it; see `scheduler/capture.rs`).

use super::sig;
use super::types::*;
use crate::driver::RealFn;
use crate::scheduler::capture::CAPTURES;

/// `cuStreamBeginCapture` and `_ptsz` (CUDA 10.0: global mode).
///
/// # Safety
/// The driver's contract for `cuStreamBeginCapture`.
pub unsafe fn begin_capture_v1(
    real: &RealFn<sig::cuStreamBeginCapture>,
    stream: CUstream,
) -> CUresult {
    CAPTURES.begin();
    let rc = super::call_real!(real, stream);
    CAPTURES.begun(rc);
    rc
}

/// `cuStreamBeginCapture_v2` and `_v2_ptsz`.
///
/// # Safety
/// The driver's contract for `cuStreamBeginCapture_v2`.
pub unsafe fn begin_capture(
    real: &RealFn<sig::cuStreamBeginCapture_v2>,
    stream: CUstream,
    mode: u32,
) -> CUresult {
    CAPTURES.begin();
    let rc = super::call_real!(real, stream, mode);
    CAPTURES.begun(rc);
    rc
}

/// `cuStreamBeginCaptureToGraph` and `_ptsz` (CUDA 12.3).
///
/// # Safety
/// The driver's contract for `cuStreamBeginCaptureToGraph`.
pub unsafe fn begin_capture_to_graph(
    real: &RealFn<sig::cuStreamBeginCaptureToGraph>,
    stream: CUstream,
    graph: CUgraph,
    deps: *const CUgraphNode,
    edges: *const CUgraphEdgeData,
    n: usize,
    mode: u32,
) -> CUresult {
    CAPTURES.begin();
    let rc = super::call_real!(real, stream, graph, deps, edges, n, mode);
    CAPTURES.begun(rc);
    rc
}

/// `cuStreamEndCapture` and `_ptsz`: the capture is over whatever it returns.
///
/// # Safety
/// The driver's contract for `cuStreamEndCapture`.
pub unsafe fn end_capture(
    real: &RealFn<sig::cuStreamEndCapture>,
    stream: CUstream,
    graph: *mut CUgraph,
) -> CUresult {
    let rc = super::call_real!(real, stream, graph);
    CAPTURES.ended();
    rc
}
