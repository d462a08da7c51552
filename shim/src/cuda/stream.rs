//! Streams and events. Work of all streams of a process on a device runs in
//! submission order on the device's executor (which respects each stream's
//! order and every cross-stream dependency); a stream remembers the sequence
//! number of its last operation, an event the one of its last record.

use crate::cuda::graph::{add_node_kind, KernelData, KernelNodeParams, NodeKind};
use crate::driver::{cu, Capture, CaptureGraph, Driver, Event, KernelNode, MemOp, Obj, Stream};
use crate::exec::EventTimes;
use crate::{exports, guard, put, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;

fn create(ph: *mut CUstream, flags: u32, prio: i32) -> CuRes {
    let d = cu()?;
    if ph.is_null() || flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (ctx, c) = d.cur_ctx()?;
    create_in(d, ph, ctx, c.dev, flags, prio)
}

/// A new stream of context `ctx` on `dev`, its handle written to `ph`.
pub(crate) fn create_in(
    d: &Driver,
    ph: *mut CUstream,
    ctx: usize,
    dev: usize,
    flags: u32,
    prio: i32,
) -> CuRes {
    let s = Stream {
        ctx,
        dev,
        flags,
        prio: prio.clamp(-5, 0),
        last_seq: AtomicU64::new(0),
        capture: Mutex::new(None),
    };
    let h = d.objs.lock().insert(Obj::Stream(Arc::new(s)));
    // SAFETY: out pointer from the caller.
    unsafe { put(ph, h as CUstream, CUDA_ERROR_INVALID_VALUE) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreate(ph: *mut CUstream, flags: u32) -> CUresult {
    guard(|| create(ph, flags, 0))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamCreateWithPriority(
    ph: *mut CUstream,
    flags: u32,
    prio: i32,
) -> CUresult {
    guard(|| create(ph, flags, prio))
}

fn destroy(h: CUstream) -> CuRes {
    let d = cu()?;
    let mut objs = d.objs.lock();
    match objs.get(h as usize) {
        Some(Obj::Stream(_)) => {
            objs.remove(h as usize);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy(h: CUstream) -> CUresult {
    guard(|| destroy(h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamDestroy_v2(h: CUstream) -> CUresult {
    guard(|| destroy(h))
}

/// The sequence number a synchronisation on `h` must wait for.
fn stream_target(h: CUstream) -> Result<(usize, u64), CUresult> {
    let d = cu()?;
    let (dev, s) = d.stream(h as usize)?;
    let seq = match s {
        Some(s) => s.last_seq.load(Acquire),
        // default stream: everything submitted on the device so far
        None => d
            .exec_if_started(dev)
            .map(|e| e.submitted_seq())
            .unwrap_or(0),
    };
    Ok((dev, seq))
}

/// Synchronising or querying a capturing stream is illegal: it invalidates
/// the capture and fails with STREAM_CAPTURE_UNSUPPORTED, as the driver does.
fn refuse_if_capturing(h: CUstream) -> CuRes {
    if let (_, Some(s)) = cu()?.stream(h as usize)? {
        if let Some(c) = s.capture.lock().as_ref() {
            c.invalidate();
            return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
        }
    }
    Ok(())
}

fn synchronize(h: CUstream) -> CuRes {
    let d = cu()?;
    if crate::exec::in_host_fn() {
        return Err(CUDA_ERROR_NOT_PERMITTED);
    }
    refuse_if_capturing(h)?;
    let (dev, seq) = stream_target(h)?;
    if seq > 0 {
        d.exec(dev).wait(seq);
    }
    Ok(())
}

fn query(h: CUstream) -> CuRes {
    let d = cu()?;
    refuse_if_capturing(h)?;
    let (dev, seq) = stream_target(h)?;
    if seq == 0 || d.exec(dev).reached(seq) {
        Ok(())
    } else {
        Err(CUDA_ERROR_NOT_READY)
    }
}

exports! {
    cuStreamSynchronize | cuStreamSynchronize_ptsz(h: CUstream) => synchronize(h);
}

exports! {
    cuStreamQuery | cuStreamQuery_ptsz(h: CUstream) => query(h);
}

fn wait_event(h: CUstream, ev: CUevent, flags: u32) -> CuRes {
    let d = cu()?;
    let (_, s) = d.stream(h as usize)?;
    let e = d.event(ev as usize)?;
    if flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // An event last recorded in a capturing stream: the waiting stream
    // joins that capture (or, already in it, depends on the record too).
    let captured = e.captured.lock().clone();
    if let Some((shared, nodes)) = captured {
        let s = s.ok_or(CUDA_ERROR_STREAM_CAPTURE_IMPLICIT)?;
        let mut cap = s.capture.lock();
        match cap.as_mut() {
            Some(c) if Arc::ptr_eq(&c.shared, &shared) => {
                for n in nodes {
                    if !c.deps.contains(&n) {
                        c.deps.push(n);
                    }
                }
            }
            Some(_) => return Err(CUDA_ERROR_STREAM_CAPTURE_ISOLATION),
            None => {
                shared.lock().joined += 1;
                *cap = Some(Capture {
                    shared,
                    deps: nodes,
                    origin: false,
                });
            }
        }
        return Ok(());
    }
    // An interprocess event another process may record: the stream's later
    // work waits, in stream order, for the records made so far.
    if let Some(state) = &e.times.ipc {
        let target = state.words().recorded.load(Acquire);
        if state.words().done.load(Acquire) < target {
            let times = Arc::clone(&e.times);
            return queue_host(
                h as usize,
                Box::new(move || {
                    if let Some(st) = &times.ipc {
                        wait_ipc(|| st.words().done.load(Acquire) >= target);
                    }
                }),
            );
        }
    }
    // Submission order already puts the stream's later work after the record.
    Ok(())
}

/// Polls `done` until it holds (an interprocess event recorded by another
/// process completes in that process's executor).
fn wait_ipc(done: impl Fn() -> bool) {
    let mut nap = 20u64;
    while !done() {
        std::thread::sleep(std::time::Duration::from_micros(nap));
        nap = (nap * 2).min(1000);
    }
}

exports! {
    cuStreamWaitEvent | cuStreamWaitEvent_ptsz(h: CUstream, ev: CUevent, flags: u32) => wait_event(h, ev, flags);
}

fn get_flags(h: CUstream, flags: *mut u32) -> CuRes {
    let d = cu()?;
    let (_, s) = d.stream(h as usize)?;
    // SAFETY: out pointer from the caller.
    unsafe {
        put(
            flags,
            s.map(|s| s.flags).unwrap_or(0),
            CUDA_ERROR_INVALID_VALUE,
        )
    }
}

exports! {
    cuStreamGetFlags | cuStreamGetFlags_ptsz(h: CUstream, flags: *mut u32) => get_flags(h, flags);
}

fn get_priority(h: CUstream, prio: *mut i32) -> CuRes {
    let d = cu()?;
    let (_, s) = d.stream(h as usize)?;
    // SAFETY: out pointer from the caller.
    unsafe {
        put(
            prio,
            s.map(|s| s.prio).unwrap_or(0),
            CUDA_ERROR_INVALID_VALUE,
        )
    }
}

exports! {
    cuStreamGetPriority | cuStreamGetPriority_ptsz(h: CUstream, prio: *mut i32) => get_priority(h, prio);
}

fn get_ctx(h: CUstream, pctx: *mut CUcontext) -> CuRes {
    let d = cu()?;
    let ctx = match d.stream(h as usize)? {
        (_, Some(s)) => s.ctx,
        (_, None) => d.cur_ctx()?.0,
    };
    // SAFETY: out pointer from the caller.
    unsafe { put(pctx, ctx as CUcontext, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuStreamGetCtx | cuStreamGetCtx_ptsz(h: CUstream, pctx: *mut CUcontext) => get_ctx(h, pctx);
}

fn get_id(h: CUstream, id: *mut u64) -> CuRes {
    let d = cu()?;
    d.stream(h as usize)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(id, h as u64, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuStreamGetId | cuStreamGetId_ptsz(h: CUstream, id: *mut u64) => get_id(h, id);
}

/// Host callback: runs once the stream's prior work is done.
pub type CUhostFn = Option<unsafe extern "C" fn(*mut c_void)>;

fn launch_host_func(h: CUstream, f: CUhostFn, data: *mut c_void) -> CuRes {
    let f = f.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    host_func_after(h as usize, f, data as usize)
}

/// `cuLaunchHostFunc` on stream `h`: into a capturing stream a host node
/// (it runs at each launch of the graph); otherwise `f(data)` is queued in
/// stream order on the device's executor, so that the stream's later work,
/// a stream, event or context synchronisation wait for it, as on a GPU.
pub fn host_func_after(h: usize, f: unsafe extern "C" fn(*mut c_void), data: usize) -> CuRes {
    if record_node_if_capturing(h, || NodeKind::Host(f as usize, data))? {
        return Ok(());
    }
    queue_host(
        h,
        Box::new(move || {
            // SAFETY: the user's callback with the user's data, as CUDA calls it.
            unsafe { f(data as *mut c_void) }
        }),
    )
}

/// Queues `f` after the work submitted so far on stream `h`; the stream's
/// later work and its synchronisation wait for its return.
fn queue_host(h: usize, f: crate::exec::HostFn) -> CuRes {
    let d = cu()?;
    let (dev, s) = d.stream(h)?;
    let seq = d.exec(dev).host(f);
    if let Some(s) = s {
        s.last_seq.fetch_max(seq, AcqRel);
    }
    Ok(())
}

exports! {
    cuLaunchHostFunc | cuLaunchHostFunc_ptsz(h: CUstream, f: CUhostFn, data: *mut c_void) => launch_host_func(h, f, data);
    // CUDA 13.1: a CUhostTaskSyncMode (CU_HOST_TASK_BLOCKING 0,
    // CU_HOST_TASK_SPINWAIT 1) says only how the driver's thread waits for
    // the next host task; the function runs in stream order either way.
    cuLaunchHostFunc_v2 | cuLaunchHostFunc_v2_ptsz(h: CUstream, f: CUhostFn, data: *mut c_void, mode: u32) => {
        if mode > 1 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        launch_host_func(h, f, data)
    };
}

// ----------------------------------------------------------------------- events

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventCreate(ph: *mut CUevent, flags: u32) -> CUresult {
    guard(|| {
        let d = cu()?;
        if ph.is_null() || flags & !0xf != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if flags & CU_EVENT_INTERPROCESS != 0 && flags & CU_EVENT_DISABLE_TIMING == 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (_, c) = d.cur_ctx()?;
        // An interprocess event keeps its state in shared memory from the
        // start: a record made before its handle is taken counts too.
        let ipc = if flags & CU_EVENT_INTERPROCESS != 0 {
            Some(super::ipc::new_event_state()?)
        } else {
            None
        };
        let e = Event {
            dev: AtomicU32::new(c.dev as u32),
            flags,
            times: Arc::new(EventTimes {
                ipc,
                ..EventTimes::default()
            }),
            captured: Mutex::new(None),
        };
        let h = d.objs.lock().insert(Obj::Event(Arc::new(e)));
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(ph, h as CUevent, CUDA_ERROR_INVALID_VALUE) }
    })
}

fn event_destroy(h: CUevent) -> CuRes {
    let d = cu()?;
    let mut objs = d.objs.lock();
    match objs.get(h as usize) {
        Some(Obj::Event(_)) => {
            objs.remove(h as usize);
            Ok(())
        }
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy(h: CUevent) -> CUresult {
    guard(|| event_destroy(h))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventDestroy_v2(h: CUevent) -> CUresult {
    guard(|| event_destroy(h))
}

/// Records event `h` on `stream` (also a graph's event record node).
pub fn record_event(h: usize, stream: usize) -> CuRes {
    record(h as CUevent, stream as CUstream)
}

fn record(h: CUevent, stream: CUstream) -> CuRes {
    let d = cu()?;
    let e = d.event(h as usize)?;
    let (dev, s) = d.stream(stream as usize)?;
    // In a capturing stream the record stands for the stream's current
    // position in the capture: nothing runs.
    if let Some(s) = &s {
        if let Some(c) = s.capture.lock().as_ref() {
            *e.captured.lock() = Some((Arc::clone(&c.shared), c.deps.clone()));
            return Ok(());
        }
    }
    *e.captured.lock() = None;
    e.dev.store(dev as u32, Relaxed);
    let seq = d.exec(dev).marker(Some(Arc::clone(&e.times)));
    if let Some(s) = s {
        s.last_seq.fetch_max(seq, AcqRel);
    }
    Ok(())
}

exports! {
    cuEventRecord | cuEventRecord_ptsz(h: CUevent, stream: CUstream) => record(h, stream);
}

exports! {
    cuEventRecordWithFlags | cuEventRecordWithFlags_ptsz(h: CUevent, stream: CUstream, flags: u32) => {
        if flags & !1 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        record(h, stream)
    };
}

fn event_done(e: &Event) -> Result<bool, CUresult> {
    let d = cu()?;
    let seq = e.times.seq.load(Acquire);
    let local = seq == 0 || d.exec(e.dev.load(Relaxed) as usize).reached(seq);
    // An interprocess event: also every record other processes made.
    Ok(local && e.times.ipc.as_ref().is_none_or(|s| s.complete()))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventQuery(h: CUevent) -> CUresult {
    guard(|| {
        let e = cu()?.event(h as usize)?;
        if event_done(&e)? {
            Ok(())
        } else {
            Err(CUDA_ERROR_NOT_READY)
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventSynchronize(h: CUevent) -> CUresult {
    guard(|| {
        let d = cu()?;
        if crate::exec::in_host_fn() {
            return Err(CUDA_ERROR_NOT_PERMITTED);
        }
        let e = d.event(h as usize)?;
        let seq = e.times.seq.load(Acquire);
        if seq > 0 {
            d.exec(e.dev.load(Relaxed) as usize).wait(seq);
        }
        if let Some(s) = &e.times.ipc {
            wait_ipc(|| s.complete());
        }
        Ok(())
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    guard(|| {
        let d = cu()?;
        if ms.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let (a, b) = (d.event(start as usize)?, d.event(end as usize)?);
        if a.flags & CU_EVENT_DISABLE_TIMING != 0 || b.flags & CU_EVENT_DISABLE_TIMING != 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if a.times.seq.load(Acquire) == 0 || b.times.seq.load(Acquire) == 0 {
            return Err(CUDA_ERROR_INVALID_HANDLE);
        }
        if !event_done(&a)? || !event_done(&b)? {
            return Err(CUDA_ERROR_NOT_READY);
        }
        let (ta, tb) = (
            a.times.ts.load(Acquire) as i128,
            b.times.ts.load(Acquire) as i128,
        );
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe {
            put(
                ms,
                ((tb - ta) as f64 / 1e6) as f32,
                CUDA_ERROR_INVALID_VALUE,
            )
        }
    })
}

/// CUDA 12.8+: same as `cuEventElapsedTime`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuEventElapsedTime_v2(
    ms: *mut f32,
    start: CUevent,
    end: CUevent,
) -> CUresult {
    crate::version_gate!("cuEventElapsedTime_v2");
    std::hint::black_box(concat!(file!(), line!()));
    // SAFETY: same contract.
    unsafe { cuEventElapsedTime(ms, start, end) }
}

// ------------------------------------------------ more stream queries, capture

/// CUDA 12.5: a stream of a green context gives the green context (and a
/// NULL context), any other its context (and a NULL green context).
fn get_ctx_v2(h: CUstream, pctx: *mut CUcontext, pgreen: *mut *mut c_void) -> CuRes {
    if pctx.is_null() && pgreen.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let d = cu()?;
    let ctx = match d.stream(h as usize)? {
        (_, Some(s)) => s.ctx,
        (_, None) => d.cur_ctx()?.0,
    };
    let (c, g) = match super::green::green_handle_of_ctx(d, ctx) {
        Some(g) => (0, g),
        None => (ctx, 0),
    };
    // SAFETY: out pointers from the caller, written when non-null.
    unsafe {
        if !pctx.is_null() {
            put(pctx, c as CUcontext, CUDA_ERROR_INVALID_VALUE)?;
        }
        if !pgreen.is_null() {
            put(pgreen, g as *mut c_void, CUDA_ERROR_INVALID_VALUE)?;
        }
    }
    Ok(())
}

exports! {
    cuStreamGetCtx_v2 | cuStreamGetCtx_v2_ptsz(h: CUstream, pctx: *mut CUcontext, pgreen: *mut *mut c_void) => get_ctx_v2(h, pctx, pgreen);
}

fn get_device(h: CUstream, dev: *mut CUdevice) -> CuRes {
    let (d, _) = cu()?.stream(h as usize)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(dev, d as CUdevice, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuStreamGetDevice | cuStreamGetDevice_ptsz(h: CUstream, dev: *mut CUdevice) => get_device(h, dev);
}

/// `CUstreamCallback`.
pub type CUstreamCallback = Option<unsafe extern "C" fn(CUstream, CUresult, *mut c_void)>;

fn add_callback(h: CUstream, cb: CUstreamCallback, data: *mut c_void, flags: u32) -> CuRes {
    let d = cu()?;
    let cb = cb.ok_or(CUDA_ERROR_INVALID_VALUE)?;
    if flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    d.stream(h as usize)?;
    // The driver refuses a stream callback during capture (host functions
    // are the capturable kind), and the capture is invalidated.
    refuse_if_capturing(h)?;
    let (hs, data) = (h as usize, data as usize);
    queue_host(
        hs,
        Box::new(move || {
            // SAFETY: the user's callback with the user's arguments, as CUDA calls it.
            unsafe { cb(hs as CUstream, CUDA_SUCCESS, data as *mut c_void) }
        }),
    )
}

exports! {
    cuStreamAddCallback | cuStreamAddCallback_ptsz(h: CUstream, cb: CUstreamCallback, data: *mut c_void, flags: u32) => add_callback(h, cb, data, flags);
}

/// (status, id) of `h`'s capture: NONE (0), ACTIVE (1) or INVALIDATED (2).
fn capture_state(h: CUstream) -> Result<(u32, u64), CUresult> {
    let (_, s) = cu()?.stream(h as usize)?;
    Ok(s.and_then(|s| {
        s.capture.lock().as_ref().map(|c| {
            let g = c.shared.lock();
            (if g.invalidated { 2 } else { 1 }, g.id)
        })
    })
    .unwrap_or_default())
}

fn is_capturing(h: CUstream, status: *mut u32) -> CuRes {
    let (st, _) = capture_state(h)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(status, st, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuStreamIsCapturing | cuStreamIsCapturing_ptsz(h: CUstream, status: *mut u32) => is_capturing(h, status);
}

static CAPTURE_IDS: AtomicU64 = AtomicU64::new(0);

/// Starts capturing `h` (a created stream; the legacy default stream cannot
/// be captured). Every mode behaves the same here (no cross-thread checks).
fn begin_capture(h: CUstream, mode: u32) -> CuRes {
    let d = cu()?;
    if mode > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (_, s) = d.stream(h as usize)?;
    let s = s.ok_or(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
    let mut cap = s.capture.lock();
    if cap.is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    let graph = crate::cuda::graph::new_graph_handle(d);
    *cap = Some(Capture {
        shared: Arc::new(Mutex::new(CaptureGraph {
            id: CAPTURE_IDS.fetch_add(1, Relaxed) + 1,
            mode,
            graph,
            invalidated: false,
            joined: 0,
            user_graph: false,
            recapture: None,
        })),
        deps: Vec::new(),
        origin: true,
    });
    Ok(())
}

/// `cuStreamBeginCaptureToGraph`: captures into the caller's graph, after
/// the given nodes of it.
fn begin_capture_to_graph(
    h: CUstream,
    g: CUgraph,
    deps: *const CUgraphNode,
    n: usize,
    mode: u32,
) -> CuRes {
    let d = cu()?;
    if mode > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (_, s) = d.stream(h as usize)?;
    let s = s.ok_or(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
    let graph = crate::cuda::graph::graph_of(g as usize)?;
    let deps = crate::cuda::graph::read_nodes(deps, n)?;
    {
        let gr = graph.lock();
        if deps.iter().any(|x| gr.node(*x).is_none()) {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
    }
    let mut cap = s.capture.lock();
    if cap.is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    *cap = Some(Capture {
        shared: Arc::new(Mutex::new(CaptureGraph {
            id: CAPTURE_IDS.fetch_add(1, Relaxed) + 1,
            mode,
            graph: g as usize,
            invalidated: false,
            joined: 0,
            user_graph: true,
            recapture: None,
        })),
        deps,
        origin: true,
    });
    Ok(())
}

/// `cuStreamBeginRecaptureToGraph` (CUDA 13.3): captures into a new graph;
/// at `cuStreamEndCapture` it must have the existing graph's topology (same
/// node kinds in creation order, same edges) and memory nodes, every other
/// parameter difference goes to the callback, and the existing graph takes
/// the recaptured parameters (`graph::apply_recapture`). The user objects
/// the graph held are released first.
fn begin_recapture(h: CUstream, mode: u32, g: CUgraph, callback: usize, user: usize) -> CuRes {
    let d = cu()?;
    if mode > 2 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (_, s) = d.stream(h as usize)?;
    let s = s.ok_or(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED)?;
    crate::cuda::graph::graph_of(g as usize)?;
    let mut cap = s.capture.lock();
    if cap.is_some() {
        return Err(CUDA_ERROR_ILLEGAL_STATE);
    }
    crate::cuda::graph::release_graph_user_objs(d, g as usize)?;
    *cap = Some(Capture {
        shared: Arc::new(Mutex::new(CaptureGraph {
            id: CAPTURE_IDS.fetch_add(1, Relaxed) + 1,
            mode,
            graph: crate::cuda::graph::new_graph_handle(d),
            invalidated: false,
            joined: 0,
            user_graph: false,
            recapture: Some((g as usize, callback, user)),
        })),
        deps: Vec::new(),
        origin: true,
    });
    Ok(())
}

/// `cuStreamUpdateCaptureDependencies`: the nodes the stream's next captured
/// work depends on, added to (flags 0) or replacing (1) the current ones.
fn update_capture_deps(h: CUstream, deps: *const CUgraphNode, n: usize, flags: u32) -> CuRes {
    let d = cu()?;
    if flags > 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (_, s) = d.stream(h as usize)?;
    let s = s.ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    let new = crate::cuda::graph::read_nodes(deps, n)?;
    let mut cap = s.capture.lock();
    let c = cap.as_mut().ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    let gh = c.shared.lock().graph;
    let graph = crate::cuda::graph::graph_of(gh)?;
    if new.iter().any(|x| graph.lock().node(*x).is_none()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if flags == 1 {
        c.deps.clear();
    }
    for x in new {
        if !c.deps.contains(&x) {
            c.deps.push(x);
        }
    }
    Ok(())
}

type NodeList = *const CUgraphNode;

exports! {
    cuStreamBeginCaptureToGraph | cuStreamBeginCaptureToGraph_ptsz(h: CUstream, g: CUgraph, deps: NodeList, _edata: *const u64, n: usize, mode: u32)
        => begin_capture_to_graph(h, g, deps, n, mode);
    cuStreamBeginRecaptureToGraph | cuStreamBeginRecaptureToGraph_ptsz(h: CUstream, mode: u32, g: CUgraph, callback: usize, user: usize)
        => begin_recapture(h, mode, g, callback, user);
    cuStreamUpdateCaptureDependencies | cuStreamUpdateCaptureDependencies_ptsz(h: CUstream, deps: NodeList, n: usize, flags: u32)
        => update_capture_deps(h, deps, n, flags);
    cuStreamUpdateCaptureDependencies_v2 | cuStreamUpdateCaptureDependencies_v2_ptsz(h: CUstream, deps: NodeList, _edata: *const u64, n: usize, flags: u32)
        => update_capture_deps(h, deps, n, flags);
}

// CUDA 10.0 signature: global mode.
exports! {
    cuStreamBeginCapture | cuStreamBeginCapture_ptsz(h: CUstream) => begin_capture(h, 0);
}

exports! {
    cuStreamBeginCapture_v2 | cuStreamBeginCapture_v2_ptsz(h: CUstream, mode: u32) => begin_capture(h, mode);
}

/// Ends the capture of `h` (the stream that began it): the graph built, or
/// null and STREAM_CAPTURE_INVALIDATED if the capture was invalidated;
/// STREAM_CAPTURE_UNJOINED while a stream that joined it has not rejoined
/// (the capture is then invalidated, as the driver does).
fn end_capture(h: CUstream, pg: *mut CUgraph) -> CuRes {
    let d = cu()?;
    if pg.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (_, s) = d.stream(h as usize)?;
    let s = s.ok_or(CUDA_ERROR_ILLEGAL_STATE)?;
    let cap = {
        let mut slot = s.capture.lock();
        match slot.as_ref() {
            None => return Err(CUDA_ERROR_ILLEGAL_STATE),
            Some(c) if !c.origin => return Err(CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD),
            Some(_) => {}
        }
        slot.take().ok_or(CUDA_ERROR_ILLEGAL_STATE)?
    };
    // Every other stream of the capture leaves it.
    let others: Vec<Arc<Stream>> = d
        .objs
        .lock()
        .iter()
        .filter_map(|(_, o)| match o {
            Obj::Stream(x) => Some(Arc::clone(x)),
            _ => None,
        })
        .collect();
    // A stream's work is joined when its last nodes are among the origin's
    // last nodes or their ancestors.
    let gh = cap.shared.lock().graph;
    let joined_set = crate::cuda::graph::ancestors(gh, &cap.deps);
    let mut unjoined = false;
    for o in others {
        let mut c = o.capture.lock();
        if let Some(x) = c.as_ref().filter(|x| Arc::ptr_eq(&x.shared, &cap.shared)) {
            if !x.deps.iter().all(|n| joined_set.contains(n)) {
                unjoined = true;
            }
            *c = None;
        }
    }
    let g = cap.shared.lock();
    if g.invalidated || unjoined {
        if !g.user_graph {
            let _ = crate::cuda::graph::destroy_graph_handle(g.graph);
        }
        // SAFETY: out pointer from the caller (checked non-null).
        unsafe { put(pg, std::ptr::null_mut(), CUDA_ERROR_INVALID_VALUE) }?;
        return Err(if unjoined {
            CUDA_ERROR_STREAM_CAPTURE_UNJOINED
        } else {
            CUDA_ERROR_STREAM_CAPTURE_INVALIDATED
        });
    }
    let (built, recapture) = (g.graph, g.recapture);
    drop(g);
    let result = match recapture {
        None => built,
        Some((target, callback, user)) => {
            let r = crate::cuda::graph::apply_recapture(built, target, callback, user);
            let _ = crate::cuda::graph::destroy_graph_handle(built);
            if let Err(e) = r {
                // SAFETY: out pointer from the caller (checked non-null).
                unsafe { put(pg, std::ptr::null_mut(), CUDA_ERROR_INVALID_VALUE) }?;
                return Err(e);
            }
            target
        }
    };
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(pg, result as CUgraph, CUDA_ERROR_INVALID_VALUE) }
}

exports! {
    cuStreamEndCapture | cuStreamEndCapture_ptsz(h: CUstream, pg: *mut CUgraph) => end_capture(h, pg);
}

/// Records kernel `k` if `stream` is capturing (Ok(true)): it does not run.
pub fn record_if_capturing(stream: usize, k: &KernelNode) -> Result<bool, CUresult> {
    record_node_if_capturing(stream, || {
        NodeKind::Kernel(KernelData {
            run: k.clone(),
            params: KernelNodeParams {
                func: std::ptr::null_mut(),
                grid: [1; 3],
                block: [1; 3],
                shared_mem_bytes: 0,
                kernel_params: std::ptr::null_mut(),
                extra: std::ptr::null_mut(),
            },
            kern: 0,
            ctx: 0,
            attrs: Default::default(),
        })
    })
}

/// If `stream` is capturing, adds the node `make()` to the capture's graph
/// after the stream's current dependencies (Ok(true)): the work does not
/// run. Any captured operation (copies, memsets, ...) goes through here.
pub fn record_node_if_capturing(
    stream: usize,
    make: impl FnOnce() -> NodeKind,
) -> Result<bool, CUresult> {
    let (_, s) = cu()?.stream(stream)?;
    let Some(s) = s else { return Ok(false) };
    let mut cap = s.capture.lock();
    let Some(c) = cap.as_mut() else {
        return Ok(false);
    };
    let graph = c.shared.lock().graph;
    let n = add_node_kind(graph, &c.deps, make())?;
    c.deps = vec![n];
    Ok(true)
}

/// Runs `f` (an async copy or memset on `stream`): if the stream is
/// capturing, its memory operations are recorded into the capture (to run
/// at each replay) instead of performed. Arguments are checked either way.
pub fn capture_mem_ops(stream: usize, f: impl FnOnce() -> CuRes) -> CuRes {
    let (_, s) = cu()?.stream(stream)?;
    let Some(s) = s.filter(|s| s.capture.lock().is_some()) else {
        return f();
    };
    drop(s);
    RECORDING.with(|r| *r.borrow_mut() = Some(Vec::new()));
    let res = f();
    let ops = RECORDING
        .with(|r| r.borrow_mut().take())
        .unwrap_or_default();
    res?;
    for op in ops {
        record_node_if_capturing(stream, || mem_op_node(op))?;
    }
    Ok(())
}

/// The graph node of a captured copy or memset.
pub(crate) fn mem_op_node(op: MemOp) -> NodeKind {
    match op {
        // Unified addressing (4) on both sides: device or host memory.
        MemOp::Copy { dst, src, len } => NodeKind::Memcpy(crate::cuda::array::Memcpy3D {
            src_x_in_bytes: 0,
            src_y: 0,
            src_z: 0,
            src_lod: 0,
            src_memory_type: 4,
            src_host: std::ptr::null(),
            src_device: src,
            src_array: std::ptr::null_mut(),
            reserved0: std::ptr::null_mut(),
            src_pitch: len,
            src_height: 1,
            dst_x_in_bytes: 0,
            dst_y: 0,
            dst_z: 0,
            dst_lod: 0,
            dst_memory_type: 4,
            dst_host: std::ptr::null_mut(),
            dst_device: dst,
            dst_array: std::ptr::null_mut(),
            reserved1: std::ptr::null_mut(),
            dst_pitch: len,
            dst_height: 1,
            width_in_bytes: len,
            height: 1,
            depth: 1,
        }),
        MemOp::Set { dst, value, count } => {
            let mut v = [0u8; 4];
            v[..value.len().min(4)].copy_from_slice(&value[..value.len().min(4)]);
            NodeKind::Memset(crate::cuda::graph::MemsetNodeParams {
                dst,
                pitch: 0,
                value: u32::from_ne_bytes(v),
                element_size: value.len() as u32,
                width: count,
                height: 1,
            })
        }
    }
}

thread_local! {
    /// Memory operations being recorded by `capture_mem_ops` on this thread.
    static RECORDING: std::cell::RefCell<Option<Vec<MemOp>>> = const { std::cell::RefCell::new(None) };
    /// `cuThreadExchangeStreamCaptureMode`: this thread's capture mode
    /// (0 global, 1 thread-local, 2 relaxed).
    static CAPTURE_MODE: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// Records `op` if this thread is recording a captured memory operation
/// (true: the caller must not perform it now).
pub fn record_mem_op(op: impl FnOnce() -> MemOp) -> bool {
    RECORDING.with(|r| match r.borrow_mut().as_mut() {
        Some(v) => {
            v.push(op());
            true
        }
        None => false,
    })
}

/// Sets the calling thread's stream-capture mode to `*mode` and returns the
/// previous one in `*mode`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuThreadExchangeStreamCaptureMode(mode: *mut u32) -> CUresult {
    guard(|| {
        cu()?;
        if mode.is_null() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        // SAFETY: non-null in/out pointer from the caller.
        let new = unsafe { mode.read_unaligned() };
        if new > 2 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        let old = CAPTURE_MODE.with(|m| m.replace(new));
        // SAFETY: as above.
        unsafe { mode.write_unaligned(old) };
        Ok(())
    })
}

thread_local! {
    /// The edge data `cuStreamGetCaptureInfo_v3` hands out: one zeroed
    /// `CUgraphEdgeData` (8 bytes: default edges) per dependency, valid
    /// until the thread's next capture query.
    static EDGE_DATA: std::cell::RefCell<Vec<u64>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Capture info: status, id, the capture's graph, and the stream's current
/// dependencies (a pointer valid until the stream's next captured work, as
/// with the driver) with their edge data (every edge the sim makes is a
/// default edge: zeroed `CUgraphEdgeData`, one per dependency; the array is
/// valid until the thread's next capture query). With no dependencies, or
/// no capture, the arrays are NULL and the count 0.
/// `outs` = [id, graph, deps, edge data, count], absent ones NULL.
fn capture_info(h: CUstream, status: *mut u32, outs: &[*mut u64]) -> CuRes {
    // The driver requires the dependencies with the edge data.
    if outs.len() > 3 && !outs[3].is_null() && outs[2].is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (st, id) = capture_state(h)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(status, st, CUDA_ERROR_INVALID_VALUE) }?;
    let (_, s) = cu()?.stream(h as usize)?;
    let (graph, deps_ptr, ndeps) = match s.as_ref().and_then(|s| {
        s.capture
            .lock()
            .as_ref()
            .map(|c| (c.shared.lock().graph, c.deps.as_ptr() as u64, c.deps.len()))
    }) {
        Some((g, _, 0)) if st == 1 => (g, 0, 0),
        Some(x) if st == 1 => x,
        _ => (0, 0, 0),
    };
    let edges_ptr = if ndeps == 0 {
        0
    } else {
        EDGE_DATA.with(|e| {
            let mut e = e.borrow_mut();
            if e.len() < ndeps {
                e.resize(ndeps, 0);
            }
            e.as_ptr() as u64
        })
    };
    let vals = [id, graph as u64, deps_ptr, edges_ptr, ndeps as u64];
    for (i, &o) in outs.iter().enumerate() {
        if !o.is_null() {
            // SAFETY: non-null out pointer (id, graph, deps, edge data or count).
            unsafe { o.write_unaligned(vals[i]) };
        }
    }
    Ok(())
}

exports! {
    cuStreamGetCaptureInfo | cuStreamGetCaptureInfo_ptsz(h: CUstream, status: *mut u32, id: *mut u64) => capture_info(h, status, &[id]);
}

exports! {
    cuStreamGetCaptureInfo_v2 | cuStreamGetCaptureInfo_v2_ptsz(h: CUstream, status: *mut u32, id: *mut u64, g: *mut u64, deps: *mut u64, n: *mut u64) => capture_info(h, status, &[id, g, deps, std::ptr::null_mut(), n]);
}

exports! {
    cuStreamGetCaptureInfo_v3 | cuStreamGetCaptureInfo_v3_ptsz(h: CUstream, status: *mut u32, id: *mut u64, g: *mut u64, deps: *mut u64, edges: *mut u64, n: *mut u64) => capture_info(h, status, &[id, g, deps, edges, n]);
}

fn attach_mem(h: CUstream, _p: CUdeviceptr, _len: usize, flags: u32) -> CuRes {
    cu()?.stream(h as usize)?;
    if !matches!(flags, 1 | 2 | 4) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

exports! {
    cuStreamAttachMemAsync | cuStreamAttachMemAsync_ptsz(h: CUstream, p: CUdeviceptr, len: usize, flags: u32) => attach_mem(h, p, len, flags);
}

/// Stream attributes are accepted and read back as zeroes (a 64-byte union).
fn stream_attr(h: CUstream, value: *mut u8) -> CuRes {
    cu()?.stream(h as usize)?;
    if value.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(())
}

exports! {
    cuStreamGetAttribute | cuStreamGetAttribute_ptsz(h: CUstream, _attr: u32, value: *mut u8) => {
        stream_attr(h, value)?;
        // SAFETY: value points to a CUstreamAttrValue (64 bytes).
        unsafe { std::ptr::write_bytes(value, 0, 64) };
        Ok(())
    };
    cuStreamSetAttribute | cuStreamSetAttribute_ptsz(h: CUstream, _attr: u32, value: *const u8)
        => stream_attr(h, value as *mut u8);
}

pub(crate) fn ctx_event(ctx: CUcontext, ev: CUevent, record: bool) -> CuRes {
    let d = cu()?;
    let c = d.ctx(ctx as usize)?;
    let e = d.event(ev as usize)?;
    if record {
        e.dev.store(c.dev as u32, Relaxed);
        d.exec(c.dev).marker(Some(Arc::clone(&e.times)));
    }
    Ok(())
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxRecordEvent(ctx: CUcontext, ev: CUevent) -> CUresult {
    crate::version_gate!("cuCtxRecordEvent");
    guard(|| ctx_event(ctx, ev, true))
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxWaitEvent(ctx: CUcontext, ev: CUevent) -> CUresult {
    crate::version_gate!("cuCtxWaitEvent");
    guard(|| ctx_event(ctx, ev, false))
}

// -------------------------------------------------- stream memory operations

/// `cuStreamWriteValue32`/`64`: writes `value` (its 4 or 8 bytes) at device
/// address `addr` in stream order (at once: the sim's copies need no
/// ordering with kernels; recorded when the stream captures).
fn write_value(h: CUstream, addr: CUdeviceptr, value: &[u8], flags: u32) -> CuRes {
    if flags & !1 != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let op = MemOp::Set {
        dst: addr,
        value: value.to_vec(),
        count: 1,
    };
    capture_mem_ops(h as usize, || {
        if addr % value.len() as u64 != 0 {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if record_mem_op(|| op.clone()) {
            return Ok(());
        }
        super::memory::run_mem_op(cu()?, &op)
    })
}

/// CUDA 8's variant: the same arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWriteValue32(
    h: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: u32,
) -> CUresult {
    guard(|| write_value(h, addr, &value.to_ne_bytes(), flags))
}

exports! {
    cuStreamWriteValue32_v2 | cuStreamWriteValue32_v2_ptsz(h: CUstream, addr: CUdeviceptr, value: u32, flags: u32)
        => write_value(h, addr, &value.to_ne_bytes(), flags);
    cuStreamWriteValue64 | cuStreamWriteValue64_v2 | cuStreamWriteValue64_v2_ptsz(h: CUstream, addr: CUdeviceptr, value: u64, flags: u32)
        => write_value(h, addr, &value.to_ne_bytes(), flags);
}

/// `cuStreamWaitValue32`/`64`: succeeds when the condition (GEQ 0, EQ 1,
/// AND 2, NOR 3) already holds. The sim cannot make a stream wait for a
/// later write: otherwise `CUDA_ERROR_NOT_SUPPORTED`, counted as a stub.
fn wait_value(h: CUstream, addr: CUdeviceptr, value: u64, wide: bool, flags: u32) -> CuRes {
    let d = cu()?;
    d.stream(h as usize)?;
    let len = if wide { 8 } else { 4 };
    if addr % len != 0 || flags & !(3 | 1 << 30) != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    super::memory::check_dev_range(d, addr, len)?;
    let holds = if wide {
        // SAFETY: a live device mapping of ours, 8 bytes, aligned.
        let cur = unsafe { (addr as *const u64).read_volatile() };
        match flags & 3 {
            0 => (cur as i64).wrapping_sub(value as i64) >= 0,
            1 => cur == value,
            2 => cur & value != 0,
            _ => !(cur | value) != 0,
        }
    } else {
        // SAFETY: a live device mapping of ours, 4 bytes, aligned.
        let cur = unsafe { (addr as *const u32).read_volatile() };
        let value = value as u32;
        match flags & 3 {
            0 => (cur as i32).wrapping_sub(value as i32) >= 0,
            1 => cur == value,
            2 => cur & value != 0,
            _ => !(cur | value) != 0,
        }
    };
    if holds {
        Ok(())
    } else if wide {
        crate::stub_hit!("cuStreamWaitValue64 (not yet satisfied)");
        Err(CUDA_ERROR_NOT_SUPPORTED)
    } else {
        crate::stub_hit!("cuStreamWaitValue32 (not yet satisfied)");
        Err(CUDA_ERROR_NOT_SUPPORTED)
    }
}

/// CUDA 8's variant: the same arguments.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuStreamWaitValue32(
    h: CUstream,
    addr: CUdeviceptr,
    value: u32,
    flags: u32,
) -> CUresult {
    guard(|| wait_value(h, addr, value as u64, false, flags))
}

exports! {
    cuStreamWaitValue32_v2 | cuStreamWaitValue32_v2_ptsz(h: CUstream, addr: CUdeviceptr, value: u32, flags: u32)
        => wait_value(h, addr, value as u64, false, flags);
    cuStreamWaitValue64 | cuStreamWaitValue64_v2 | cuStreamWaitValue64_v2_ptsz(h: CUstream, addr: CUdeviceptr, value: u64, flags: u32)
        => wait_value(h, addr, value, true, flags);
}

/// `CUstreamBatchMemOpParams`: an operation tag and its parameters (48
/// bytes; the wait/write ones: address at 8, value at 16, flags at 24).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct BatchMemOp {
    pub op: u32,
    pub flags32: u32,
    pub address: u64,
    pub value: u64,
    pub flags: u32,
    pub pad: [u32; 5],
}

const _: () = assert!(std::mem::size_of::<BatchMemOp>() == 48);

/// `cuStreamBatchMemOp`: the operations in order, each as its own call
/// would do it (waits: the condition must already hold); flushes and
/// barriers have nothing to wait for in the sim. Atomic reductions are not
/// simulated (a counted stub).
fn batch_mem_op(h: CUstream, count: u32, ops: *const BatchMemOp, flags: u32) -> CuRes {
    cu()?.stream(h as usize)?;
    let list = read_batch(count, ops, flags)?;
    run_batch(h, &list)
}

/// Reads and checks a caller's array of `count` memory operations.
pub(crate) fn read_batch(
    count: u32,
    ops: *const BatchMemOp,
    flags: u32,
) -> Result<Vec<BatchMemOp>, CUresult> {
    if flags != 0 || (count > 0 && ops.is_null()) || count > 256 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: the caller's array of `count` CUstreamBatchMemOpParams.
    let list: Vec<BatchMemOp> = (0..count as usize)
        .map(|i| unsafe { ops.add(i).read_unaligned() })
        .collect();
    if list.iter().any(|o| !matches!(o.op, 1..=6 | 8)) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(list)
}

/// Runs checked memory operations in order on stream `h`.
pub(crate) fn run_batch(h: CUstream, list: &[BatchMemOp]) -> CuRes {
    for &o in list {
        match o.op {
            1 => wait_value(h, o.address, o.value as u32 as u64, false, o.flags)?,
            4 => wait_value(h, o.address, o.value, true, o.flags)?,
            2 => write_value(h, o.address, &(o.value as u32).to_ne_bytes(), o.flags)?,
            5 => write_value(h, o.address, &o.value.to_ne_bytes(), o.flags)?,
            8 => {
                crate::stub_hit!("cuStreamBatchMemOp (atomic reduction)");
                return Err(CUDA_ERROR_NOT_SUPPORTED);
            }
            _ => {} // flush remote writes, memory barrier
        }
    }
    Ok(())
}

exports! {
    cuStreamBatchMemOp | cuStreamBatchMemOp_v2 | cuStreamBatchMemOp_v2_ptsz(h: CUstream, count: u32, ops: *const BatchMemOp, flags: u32)
        => batch_mem_op(h, count, ops, flags);
}
