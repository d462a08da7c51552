//! Green contexts and device resources: a device's SMs are described as a
//! resource (`cuDeviceGetDevResource`), split into groups
//! (`cuDevSmResourceSplitByCount`, `cuDevSmResourceSplit`), gathered into a
//! descriptor (`cuDevResourceGenerateDesc`), and a green context is created
//! over it (`cuGreenCtxCreate`).
//!
//! A green context is a context (`cuCtxFromGreenCtx` gives its `CUcontext`,
//! which works everywhere a context does, its streams and events included)
//! that knows how many SMs it was given; as with the driver, creating it
//! retains the device's primary context (which reserves `CGPU_SIM_CTX_MIB`
//! if it was not active) and destroying it releases it, and it reserves no
//! memory of its own. Kernels take the same device time whatever the SM
//! count (the sim's kernels do not scale with SMs). What a context allocates
//! while a green context is current stays allocated when the green context
//! is destroyed (it belongs to the primary context, as with the driver).
//!
//! The sim keeps what it needs to check a resource in the bytes the header
//! reserves for the driver (`_internal_padding`): a tag, the device and the
//! split it came from.

use crate::driver::{cu, Ctx, Driver, Obj};
use crate::{exports, put, CuRes};
use cgpu_ffi::*;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;

const TYPE_SM: u32 = 1;
const TYPE_WORKQUEUE_CONFIG: u32 = 1000;
const TYPE_WORKQUEUE: u32 = 10000;
const GREEN_CTX_DEFAULT_STREAM: u32 = 1;
const SPLIT_IGNORE_SM_COSCHEDULING: u32 = 1;
const SPLIT_MAX_POTENTIAL_CLUSTER_SIZE: u32 = 2;
const GROUP_BACKFILL: u32 = 1;
const GROUP_LOCALITY_DOMAIN_ID: u32 = 2;
const GROUP_LOCALITY_SUPPLEMENTAL: u32 = 4;
const LOCALITY_ANY: u32 = !0;
/// `_internal_padding[0..4]` of a resource the sim filled in.
const TAG: u32 = u32::from_le_bytes(*b"cgRS");

/// `CUdevSmResource`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct SmResource {
    pub sm_count: u32,
    pub min_sm_partition_size: u32,
    pub sm_coscheduled_alignment: u32,
    pub flags: u32,
    pub locality_domain_id: u32,
}

/// `CUdevResource` (ABI version 1, 144 bytes): the type, 92 bytes of the
/// driver's own, a 40-byte union (`CUdevSmResource`,
/// `CUdevWorkqueueConfigResource`, `CUdevWorkqueueResource`), a next pointer.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct DevResource {
    pub ty: u32,
    /// Ours: tag, device, split id (u64), kind of origin.
    pub internal: [u32; 23],
    pub data: [u32; 10],
    pub next: *mut DevResource,
}

const _: () = assert!(std::mem::size_of::<DevResource>() == 144);

impl DevResource {
    fn new(ty: u32, dev: usize, split: u64) -> DevResource {
        let mut internal = [0u32; 23];
        internal[0] = TAG;
        internal[1] = dev as u32;
        internal[2] = split as u32;
        internal[3] = (split >> 32) as u32;
        DevResource {
            ty,
            internal,
            data: [0; 10],
            next: std::ptr::null_mut(),
        }
    }
    fn sm(dev: usize, split: u64, sm: SmResource) -> DevResource {
        let mut r = DevResource::new(TYPE_SM, dev, split);
        r.data[..5].copy_from_slice(&[
            sm.sm_count,
            sm.min_sm_partition_size,
            sm.sm_coscheduled_alignment,
            sm.flags,
            sm.locality_domain_id,
        ]);
        r
    }
    fn ours(&self) -> bool {
        self.internal[0] == TAG
    }
    fn dev(&self) -> usize {
        self.internal[1] as usize
    }
    fn split(&self) -> u64 {
        self.internal[2] as u64 | (self.internal[3] as u64) << 32
    }
    fn sm_res(&self) -> SmResource {
        SmResource {
            sm_count: self.data[0],
            min_sm_partition_size: self.data[1],
            sm_coscheduled_alignment: self.data[2],
            flags: self.data[3],
            locality_domain_id: self.data[4],
        }
    }
}

/// `CU_DEV_SM_RESOURCE_GROUP_PARAMS` (64 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct SmGroupParams {
    pub sm_count: u32,
    pub coscheduled_sm_count: u32,
    pub preferred_coscheduled_sm_count: u32,
    pub flags: u32,
    pub locality_domain_id: u32,
    pub reserved: [u32; 11],
}

/// A descriptor (`CUdevResourceDesc`): the device and SMs a green context
/// created from it gets.
pub struct DevResourceDesc {
    pub dev: usize,
    pub sm: SmResource,
}

/// A green context: its context (`cuCtxFromGreenCtx`) and its SMs.
pub struct GreenCtx {
    pub ctx: usize,
    pub dev: usize,
    pub sm: SmResource,
    pub destroyed: AtomicBool,
}

/// Split ids: the resources of one split call share one (a descriptor may
/// only combine SM resources of the same split); 0 = a whole device's or
/// context's.
static SPLITS: AtomicU64 = AtomicU64::new(1);

/// Co-scheduling granularity of `dev`: 8 SMs from compute capability 9.0
/// (clusters), 2 before.
fn alignment(d: &Driver, dev: usize) -> u32 {
    if d.devs[dev].cc.0 >= 9 {
        8
    } else {
        2
    }
}

fn whole_device(d: &Driver, dev: usize) -> SmResource {
    let a = alignment(d, dev);
    SmResource {
        sm_count: d.devs[dev].sms as u32,
        min_sm_partition_size: a,
        sm_coscheduled_alignment: a,
        flags: 0,
        locality_domain_id: 0,
    }
}

/// The SMs a context may use: a green context's, else the whole device's.
fn ctx_sms(d: &Driver, h: usize, c: &Ctx) -> SmResource {
    green_of_ctx(d, h)
        .map(|g| g.sm)
        .unwrap_or_else(|| whole_device(d, c.dev))
}

/// The green context whose `CUcontext` is `ctx`, if any.
fn green_of_ctx(d: &Driver, ctx: usize) -> Option<Arc<GreenCtx>> {
    green_handle_of_ctx(d, ctx).and_then(|h| green(d, h).ok())
}

/// The handle of the green context whose `CUcontext` is `ctx`.
pub fn green_handle_of_ctx(d: &Driver, ctx: usize) -> Option<usize> {
    match d.objs.lock().get(ctx) {
        Some(Obj::Ctx(c)) => Some(c.green.load(Acquire)).filter(|&g| g != 0),
        _ => None,
    }
}

fn green(d: &Driver, h: usize) -> Result<Arc<GreenCtx>, CUresult> {
    match d.objs.lock().get(h) {
        Some(Obj::GreenCtx(g)) => Ok(Arc::clone(g)),
        _ => Err(CUDA_ERROR_INVALID_CONTEXT),
    }
}

/// A live green context.
fn live_green(d: &Driver, h: usize) -> Result<Arc<GreenCtx>, CUresult> {
    let g = green(d, h)?;
    if g.destroyed.load(Acquire) {
        return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    Ok(g)
}

/// Writes the `ty` resource of (device `dev`, SMs `sm`).
fn put_resource(out: *mut DevResource, dev: usize, sm: SmResource, ty: u32) -> CuRes {
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let r = match ty {
        TYPE_SM => DevResource::sm(dev, 0, sm),
        TYPE_WORKQUEUE_CONFIG => {
            let mut r = DevResource::new(ty, dev, 0);
            // Device, expected concurrent stream-ordered workloads (the
            // driver's default of 8 connections), device-wide sharing.
            r.data[..3].copy_from_slice(&[dev as u32, 8, 0]);
            r
        }
        TYPE_WORKQUEUE => DevResource::new(ty, dev, 0),
        _ => return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE),
    };
    // SAFETY: non-null pointer to a CUdevResource from the caller.
    unsafe { out.write_unaligned(r) };
    Ok(())
}

/// Reads a resource the caller hands back: one the sim filled in.
fn read_resource(p: *const DevResource) -> Result<DevResource, CUresult> {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null pointer to a CUdevResource from the caller.
    let r = unsafe { p.read_unaligned() };
    if !r.ours() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Ok(r)
}

fn device_resource(dev: CUdevice, out: *mut DevResource, ty: u32) -> CuRes {
    let d = cu()?;
    let i = d.check_dev(dev)?;
    if ty == TYPE_WORKQUEUE {
        return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    put_resource(out, i, whole_device(d, i), ty)
}

fn context_resource(ctx: CUcontext, out: *mut DevResource, ty: u32) -> CuRes {
    let d = cu()?;
    let (h, c) = if ctx.is_null() {
        d.cur_ctx()?
    } else {
        (ctx as usize, d.ctx(ctx as usize)?)
    };
    put_resource(out, c.dev, ctx_sms(d, h, &c), ty)
}

fn green_resource(g: CUgreenCtx, out: *mut DevResource, ty: u32) -> CuRes {
    let d = cu()?;
    let g = live_green(d, g as usize)?;
    put_resource(out, g.dev, g.sm, ty)
}

fn stream_resource(s: CUstream, out: *mut DevResource, ty: u32) -> CuRes {
    let d = cu()?;
    if ty == TYPE_WORKQUEUE || ty == TYPE_WORKQUEUE_CONFIG {
        return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    let ctx = stream_ctx(d, s)?;
    let c = d.ctx(ctx)?;
    put_resource(out, c.dev, ctx_sms(d, ctx, &c), ty)
}

/// The context of a stream (a special stream: the current context).
fn stream_ctx(d: &Driver, s: CUstream) -> Result<usize, CUresult> {
    Ok(match d.stream(s as usize)? {
        (_, Some(st)) => st.ctx,
        (_, None) => d.cur_ctx()?.0,
    })
}

/// The input of a split: an SM resource the sim filled in, of a live device.
fn split_input(d: &Driver, input: *const DevResource) -> Result<(usize, SmResource), CUresult> {
    let r = read_resource(input)?;
    if r.ty != TYPE_SM {
        return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE);
    }
    if r.dev() >= d.devs.len() {
        return Err(CUDA_ERROR_INVALID_DEVICE);
    }
    Ok((r.dev(), r.sm_res()))
}

/// Writes the remainder of a split (`CU_DEV_RESOURCE_TYPE_INVALID` when no
/// SM is left).
fn put_remainder(out: *mut DevResource, dev: usize, split: u64, left: u32, align: u32) {
    if out.is_null() {
        return;
    }
    let mut r = DevResource::sm(
        dev,
        split,
        SmResource {
            sm_count: left,
            min_sm_partition_size: align,
            sm_coscheduled_alignment: align,
            ..Default::default()
        },
    );
    if left == 0 {
        r.ty = 0;
    }
    // SAFETY: non-null pointer to a CUdevResource from the caller.
    unsafe { out.write_unaligned(r) };
}

/// `cuDevSmResourceSplitByCount`: as many groups as asked (at most as fit)
/// of `minCount` SMs rounded up to the co-scheduling granularity (2 SMs with
/// `IGNORE_SM_COSCHEDULING`), the rest in `remainder`.
fn split_by_count(
    result: *mut DevResource,
    nb: *mut u32,
    input: *const DevResource,
    remainder: *mut DevResource,
    flags: u32,
    min_count: u32,
) -> CuRes {
    let d = cu()?;
    if nb.is_null()
        || flags & !(SPLIT_IGNORE_SM_COSCHEDULING | SPLIT_MAX_POTENTIAL_CLUSTER_SIZE) != 0
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (dev, sm) = split_input(d, input)?;
    if flags & SPLIT_MAX_POTENTIAL_CLUSTER_SIZE != 0 && d.devs[dev].cc.0 < 9 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if min_count > sm.sm_count {
        return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    let align = if flags & SPLIT_IGNORE_SM_COSCHEDULING != 0 {
        2
    } else {
        sm.sm_coscheduled_alignment.max(1)
    };
    let size = min_count.max(align).div_ceil(align) * align;
    let fit = sm.sm_count / size;
    // SAFETY: non-null pointer from the caller.
    let want = unsafe { nb.read_unaligned() };
    if result.is_null() {
        // SAFETY: as above.
        unsafe { nb.write_unaligned(fit) };
        return Ok(());
    }
    let n = want.min(fit);
    if n == 0 {
        return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
    }
    let split = SPLITS.fetch_add(1, Relaxed);
    let group = SmResource {
        sm_count: size,
        min_sm_partition_size: align,
        sm_coscheduled_alignment: align,
        ..Default::default()
    };
    for k in 0..n as usize {
        // SAFETY: `result` holds `*nbGroups` >= n resources (the API contract).
        unsafe {
            result
                .add(k)
                .write_unaligned(DevResource::sm(dev, split, group))
        };
    }
    put_remainder(remainder, dev, split, sm.sm_count - n * size, align);
    // SAFETY: non-null pointer from the caller.
    unsafe { nb.write_unaligned(n) };
    Ok(())
}

/// `cuDevSmResourceSplit`: groups as `groupParams` describe them, in order;
/// a group with `smCount` 0 discovers its size (what is left, in multiples
/// of its co-scheduled count) and writes it back. The sim's device is one
/// locality domain (0).
fn split_groups(
    result: *mut DevResource,
    nb: u32,
    input: *const DevResource,
    remainder: *mut DevResource,
    flags: u32,
    params: *mut SmGroupParams,
) -> CuRes {
    let d = cu()?;
    if flags != 0 || nb == 0 || params.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (dev, sm) = split_input(d, input)?;
    let max_cos = if d.devs[dev].cc.0 >= 9 { 32 } else { 2 };
    let default_cos = alignment(d, dev);
    // Check and size every group before writing anything.
    let mut sizes = Vec::with_capacity(nb as usize);
    let mut left = sm.sm_count;
    for k in 0..nb as usize {
        // SAFETY: `groupParams` holds `nbGroups` entries (the API contract).
        let p = unsafe { params.add(k).read_unaligned() };
        let known = GROUP_BACKFILL | GROUP_LOCALITY_DOMAIN_ID | GROUP_LOCALITY_SUPPLEMENTAL;
        if p.flags & !known != 0 || p.coscheduled_sm_count > max_cos {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if p.flags & GROUP_LOCALITY_DOMAIN_ID != 0
            && p.locality_domain_id != 0
            && p.locality_domain_id != LOCALITY_ANY
        {
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        let cos = if p.coscheduled_sm_count == 0 {
            default_cos
        } else {
            p.coscheduled_sm_count
        };
        let backfill = p.flags & GROUP_BACKFILL != 0;
        let n = if p.sm_count == 0 {
            if backfill {
                left
            } else {
                left / cos * cos
            }
        } else {
            let n = p.sm_count;
            if n < 2 || n > sm.sm_count || n % 2 != 0 || (!backfill && n % cos != 0) {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            n
        };
        if n > left || (!result.is_null() && (n == 0 || n < cos)) {
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        left -= n;
        sizes.push((n, cos, p));
    }
    let split = SPLITS.fetch_add(1, Relaxed);
    for (k, (n, cos, p)) in sizes.into_iter().enumerate() {
        if p.sm_count == 0 {
            // SAFETY: as above; discovery writes the size back.
            unsafe { (*params.add(k)).sm_count = n };
        }
        if !result.is_null() {
            let g = SmResource {
                sm_count: n,
                min_sm_partition_size: cos,
                sm_coscheduled_alignment: cos,
                flags: p.flags,
                locality_domain_id: if p.flags & GROUP_LOCALITY_DOMAIN_ID != 0 {
                    p.locality_domain_id
                } else {
                    0
                },
            };
            // SAFETY: `result` holds `nbGroups` resources (the API contract).
            unsafe {
                result
                    .add(k)
                    .write_unaligned(DevResource::sm(dev, split, g))
            };
        }
    }
    put_remainder(remainder, dev, split, left, default_cos);
    Ok(())
}

/// `cuDevResourceGenerateDesc`: SM resources of one device and one split
/// (their SMs add up), at most one workqueue configuration.
fn generate_desc(out: *mut usize, res: *const DevResource, nb: u32) -> CuRes {
    let d = cu()?;
    if out.is_null() || res.is_null() || nb == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut dev = None;
    let mut split = None;
    let mut sm: Option<SmResource> = None;
    for k in 0..nb as usize {
        // SAFETY: `resources` holds `nbResources` entries (the API contract).
        let r = read_resource(unsafe { res.add(k) })?;
        if r.dev() >= d.devs.len() {
            return Err(CUDA_ERROR_INVALID_VALUE);
        }
        if *dev.get_or_insert(r.dev()) != r.dev() {
            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
        }
        match r.ty {
            TYPE_SM => {
                let s = r.sm_res();
                if *split.get_or_insert(r.split()) != r.split() {
                    return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
                }
                match &mut sm {
                    None => sm = Some(s),
                    Some(acc) => {
                        if acc.sm_coscheduled_alignment != s.sm_coscheduled_alignment
                            || acc.locality_domain_id != s.locality_domain_id
                        {
                            return Err(CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION);
                        }
                        acc.sm_count += s.sm_count;
                    }
                }
            }
            TYPE_WORKQUEUE_CONFIG | TYPE_WORKQUEUE => {}
            _ => return Err(CUDA_ERROR_INVALID_RESOURCE_TYPE),
        }
    }
    let dev = dev.unwrap_or(0);
    let desc = DevResourceDesc {
        dev,
        sm: sm.unwrap_or_else(|| whole_device(d, dev)),
    };
    let h = d.objs.lock().insert(Obj::ResourceDesc(Arc::new(desc)));
    // SAFETY: non-null out pointer from the caller.
    unsafe { put(out, h, CUDA_ERROR_INVALID_VALUE) }
}

fn green_create(out: *mut CUgreenCtx, desc: usize, dev: CUdevice, flags: u32) -> CuRes {
    let d = cu()?;
    if out.is_null() || flags & !GREEN_CTX_DEFAULT_STREAM != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let i = d.check_dev(dev)?;
    let desc = match d.objs.lock().get(desc) {
        Some(Obj::ResourceDesc(r)) => Arc::clone(r),
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    if desc.dev != i {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // The green context holds the device's primary context.
    let mut primary: CUcontext = std::ptr::null_mut();
    // SAFETY: our own function, with a valid out pointer.
    let r = unsafe { super::context::cuDevicePrimaryCtxRetain(&mut primary, dev) };
    if r != CUDA_SUCCESS {
        return Err(r);
    }
    let flags_now = d.primary[i].lock().flags;
    let c = Ctx {
        dev: i,
        primary: false,
        flags: AtomicU32::new(flags_now),
        destroyed: AtomicBool::new(false),
        limits: Default::default(),
        usage: AtomicU32::new(1),
        green: Default::default(),
    };
    d.touch_dev(i);
    let c = Arc::new(c);
    let mut objs = d.objs.lock();
    let ctx = objs.insert(Obj::Ctx(Arc::clone(&c)));
    let g = objs.insert(Obj::GreenCtx(Arc::new(GreenCtx {
        ctx,
        dev: i,
        sm: desc.sm,
        destroyed: AtomicBool::new(false),
    })));
    drop(objs);
    c.green.store(g, Release);
    // SAFETY: non-null out pointer from the caller.
    unsafe { put(out, g as CUgreenCtx, CUDA_ERROR_INVALID_VALUE) }
}

fn green_destroy(h: CUgreenCtx) -> CuRes {
    let d = cu()?;
    let g = green(d, h as usize)?;
    if g.destroyed.swap(true, AcqRel) {
        return Err(CUDA_ERROR_CONTEXT_IS_DESTROYED);
    }
    if let Ok(c) = d.ctx(g.ctx) {
        super::export_tables::cls_context_gone(g.ctx);
        if let Some(e) = d.exec_if_started(c.dev) {
            e.wait(e.submitted_seq());
        }
        // Captures on its streams end invalid; its memory stays (the
        // primary context's), its limits' reservation returns.
        d.invalidate_captures(g.ctx);
        super::limits::release(d, &c);
        let primary = d.primary[c.dev].lock().handle;
        super::memory::reparent_ctx_allocs(d, g.ctx, primary);
        c.destroyed.store(true, Release);
    }
    crate::driver::CTX_STACK.with(|s| s.borrow_mut().retain(|&x| x != g.ctx));
    super::context::primary_release(g.dev as CUdevice)
}

fn green_stream(out: *mut CUstream, h: CUgreenCtx, flags: u32, prio: i32) -> CuRes {
    let d = cu()?;
    let g = live_green(d, h as usize)?;
    // CU_STREAM_NON_BLOCKING is required.
    if out.is_null() || flags != 1 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    super::stream::create_in(d, out, g.ctx, g.dev, flags, prio)
}

fn green_id(h: CUgreenCtx, id: *mut u64) -> CuRes {
    let d = cu()?;
    if id.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let g = if h.is_null() {
        let (cur, _) = d.cur_ctx()?;
        green_of_ctx(d, cur).ok_or(CUDA_ERROR_INVALID_CONTEXT)?
    } else {
        live_green(d, h as usize)?
    };
    // SAFETY: our own function, with a valid out pointer.
    let r = unsafe { super::context::cuCtxGetId(g.ctx as CUcontext, id) };
    if r == CUDA_SUCCESS {
        Ok(())
    } else {
        Err(r)
    }
}

fn green_event(h: CUgreenCtx, ev: CUevent, record: bool) -> CuRes {
    let d = cu()?;
    let g = live_green(d, h as usize)?;
    if record && d.invalidate_captures(g.ctx) {
        return Err(CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
    }
    super::stream::ctx_event(g.ctx as CUcontext, ev, record)
}

/// `cuStreamGetGreenCtx`: the green context of the stream's context, or NULL.
fn stream_green(s: CUstream, out: *mut CUgreenCtx) -> CuRes {
    let d = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let ctx = stream_ctx(d, s)?;
    let g = green_handle_of_ctx(d, ctx).unwrap_or(0);
    // SAFETY: non-null out pointer from the caller.
    unsafe { put(out, g as CUgreenCtx, CUDA_ERROR_INVALID_VALUE) }
}

pub type CUgreenCtx = *mut std::ffi::c_void;
type Res = *mut DevResource;

exports! {
    cuDeviceGetDevResource(dev: CUdevice, r: Res, ty: u32) => device_resource(dev, r, ty);
    cuCtxGetDevResource(ctx: CUcontext, r: Res, ty: u32) => context_resource(ctx, r, ty);
    cuGreenCtxGetDevResource(g: CUgreenCtx, r: Res, ty: u32) => green_resource(g, r, ty);
    cuStreamGetDevResource | cuStreamGetDevResource_ptsz(s: CUstream, r: Res, ty: u32) => stream_resource(s, r, ty);
    cuDevSmResourceSplitByCount(result: Res, nb: *mut u32, input: *const DevResource, rem: Res, flags: u32, min_count: u32)
        => split_by_count(result, nb, input, rem, flags, min_count);
    cuDevSmResourceSplit(result: Res, nb: u32, input: *const DevResource, rem: Res, flags: u32, params: *mut SmGroupParams)
        => split_groups(result, nb, input, rem, flags, params);
    cuDevResourceGenerateDesc(out: *mut usize, res: *const DevResource, nb: u32) => generate_desc(out, res, nb);
    cuGreenCtxCreate(out: *mut CUgreenCtx, desc: usize, dev: CUdevice, flags: u32) => green_create(out, desc, dev, flags);
    cuGreenCtxDestroy(g: CUgreenCtx) => green_destroy(g);
    cuCtxFromGreenCtx(out: *mut CUcontext, g: CUgreenCtx) => {
        let d = cu()?;
        if out.is_null() { return Err(CUDA_ERROR_INVALID_VALUE) }
        let g = live_green(d, g as usize)?;
        // SAFETY: non-null out pointer from the caller.
        unsafe { put(out, g.ctx as CUcontext, CUDA_ERROR_INVALID_VALUE) }
    };
    cuGreenCtxStreamCreate(out: *mut CUstream, g: CUgreenCtx, flags: u32, prio: i32) => green_stream(out, g, flags, prio);
    cuGreenCtxGetId(g: CUgreenCtx, id: *mut u64) => green_id(g, id);
    cuGreenCtxRecordEvent(g: CUgreenCtx, ev: CUevent) => green_event(g, ev, true);
    cuGreenCtxWaitEvent(g: CUgreenCtx, ev: CUevent) => green_event(g, ev, false);
    cuStreamGetGreenCtx(s: CUstream, out: *mut CUgreenCtx) => stream_green(s, out);
}
