//! Stream capture (CUDA graphs): passed through, counted so that the
//! scheduler's drain never synchronises a context while this process has a
//! capture open (that would invalidate it; see `scheduler/capture.rs`).
//!
//! Synchronise calls (`cuCtxSynchronize`, `cuStreamSynchronize`,
//! `cuEventSynchronize`): passed through, counted so that the scheduler
//! tells a holder that waits for its GPU work (busy) from one that does
//! nothing (idle, handed over after a grace), and when a context's or a
//! stream's synchronise returns, knows the process's queue is empty (the
//! GPU time until its next launch is not charged to it).

use super::sig;
use super::types::*;
use crate::driver::RealFn;
use crate::process::fork::ForkLocal;
use crate::scheduler::capture::CAPTURES;
use crate::scheduler::Synced;
use parking_lot::{RwLock, RwLockReadGuard, RwLockWriteGuard};

/// Stream-ordered allocations ask whether their stream is being captured
/// and make the real call under it, shared; beginning and ending a capture
/// take it exclusively around the real call. So no capture of this process
/// begins or ends between an allocation's check and its call: an
/// allocation seen outside a capture is a real one (charged), one seen in a
/// capture is a graph's node (charged when the graph is launched). One per
/// fork generation (a child never waits on a lock of a parent thread).
static CAPTURE: ForkLocal<RwLock<()>> = ForkLocal::new(|| RwLock::new(()));

/// Held by a stream-ordered allocation from its capture check to the end
/// of its real call.
pub(super) fn capture_guard() -> RwLockReadGuard<'static, ()> {
    CAPTURE.get().read()
}

/// Held around the real call that begins or ends a capture.
fn capture_change() -> RwLockWriteGuard<'static, ()> {
    CAPTURE.get().write()
}

/// `cuStreamBeginCapture` and `_ptsz` (CUDA 10.0: global mode).
///
/// # Safety
/// The driver's contract for `cuStreamBeginCapture`.
pub unsafe fn begin_capture_v1(
    real: &RealFn<sig::cuStreamBeginCapture>,
    stream: CUstream,
) -> CUresult {
    let b = CAPTURES.begin(stream as usize);
    let rc = {
        let _c = capture_change();
        super::call_real!(real, stream)
    };
    CAPTURES.begun(b, rc);
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
    let b = CAPTURES.begin(stream as usize);
    let rc = {
        let _c = capture_change();
        super::call_real!(real, stream, mode)
    };
    CAPTURES.begun(b, rc);
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
    let b = CAPTURES.begin(stream as usize);
    let rc = {
        let _c = capture_change();
        super::call_real!(real, stream, graph, deps, edges, n, mode)
    };
    CAPTURES.begun(b, rc);
    rc
}

/// `cuStreamEndCapture` and `_ptsz`: the stream's capture is over unless the
/// driver refused the end and the capture goes on (see `scheduler/capture.rs`).
/// A refused end asks the driver whether the stream is still capturing (a
/// NULL graph pointer, the wrong thread: it is), so that no refusal counts
/// a running capture ended.
///
/// # Safety
/// The driver's contract for `cuStreamEndCapture`.
pub unsafe fn end_capture(
    real: &RealFn<sig::cuStreamEndCapture>,
    stream: CUstream,
    graph: *mut CUgraph,
) -> CUresult {
    let _c = capture_change();
    let rc = super::call_real!(real, stream, graph);
    if rc != CUDA_SUCCESS {
        let mut status: CUstreamCaptureStatus = 0;
        if super::call_real!(super::real::cuStreamIsCapturing, stream, &mut status) == CUDA_SUCCESS
            && status == CU_STREAM_CAPTURE_STATUS_ACTIVE
        {
            return rc;
        }
    }
    CAPTURES.ended(stream as usize, rc);
    rc
}

/// `cuCtxSynchronize`: counted as waiting for the GPU.
///
/// # Safety
/// The driver's contract for `cuCtxSynchronize`.
pub unsafe fn ctx_synchronize(real: &RealFn<sig::cuCtxSynchronize>) -> CUresult {
    let w = crate::scheduler::WaitingForGpu::new();
    let rc = super::call_real!(real,);
    w.returned(rc, Synced::Context);
    rc
}

/// `cuStreamSynchronize` and `_ptsz`: counted as waiting for the GPU.
///
/// # Safety
/// The driver's contract for `cuStreamSynchronize`.
pub unsafe fn stream_synchronize(
    real: &RealFn<sig::cuStreamSynchronize>,
    stream: CUstream,
) -> CUresult {
    let w = crate::scheduler::WaitingForGpu::new();
    let rc = super::call_real!(real, stream);
    w.returned(rc, Synced::Stream(stream as usize));
    rc
}

/// `cuEventSynchronize`: counted as waiting for the GPU.
///
/// # Safety
/// The driver's contract for `cuEventSynchronize`.
pub unsafe fn event_synchronize(
    real: &RealFn<sig::cuEventSynchronize>,
    event: CUevent,
) -> CUresult {
    let _w = crate::scheduler::WaitingForGpu::new();
    super::call_real!(real, event)
}
