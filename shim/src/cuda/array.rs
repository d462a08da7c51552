//! 3D copies (`cuMemcpy3D*`, the array copies `cuMemcpyAtoH`…), mipmapped
//! arrays, texture and surface objects, array descriptors.
//!
//! A CUDA array's backing is linear in the sim: `depth` layers of `height`
//! rows of `width × element` bytes, so a copy to or from an array is a
//! pitched copy with the array's row size as pitch, bounds-checked against
//! the array. A mipmapped array is one array per level (each level half the
//! size of the one before, at least 1), all charged to the device. Texture
//! and surface objects hold the descriptors they were made from (the sim
//! samples nothing: kernels do not compute).

use crate::driver::{cu, Array, Driver, Obj};
use crate::{exports, put, CuRes};
use cgpu_ffi::*;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::ffi::c_void;
use std::sync::atomic::{AtomicU64, Ordering::*};
use std::sync::{Arc, OnceLock};

/// `CUDA_MEMCPY3D` (and `CUDA_MEMCPY3D_PEER`, whose `reserved0`/`reserved1`
/// are the source and destination contexts).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Memcpy3D {
    pub src_x_in_bytes: usize,
    pub src_y: usize,
    pub src_z: usize,
    pub src_lod: usize,
    pub src_memory_type: u32,
    pub src_host: *const c_void,
    pub src_device: CUdeviceptr,
    pub src_array: CUarray,
    pub reserved0: *mut c_void,
    pub src_pitch: usize,
    pub src_height: usize,
    pub dst_x_in_bytes: usize,
    pub dst_y: usize,
    pub dst_z: usize,
    pub dst_lod: usize,
    pub dst_memory_type: u32,
    pub dst_host: *mut c_void,
    pub dst_device: CUdeviceptr,
    pub dst_array: CUarray,
    pub reserved1: *mut c_void,
    pub dst_pitch: usize,
    pub dst_height: usize,
    pub width_in_bytes: usize,
    pub height: usize,
    pub depth: usize,
}

// SAFETY: plain data (addresses as numbers); never dereferenced outside a
// validated copy.
unsafe impl Send for Memcpy3D {}
unsafe impl Sync for Memcpy3D {}

fn array_of(d: &Driver, h: usize) -> Result<Arc<Array>, CUresult> {
    match d.objs.lock().get(h) {
        Some(Obj::Array(a)) => Ok(Arc::clone(a)),
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

/// One side of a copy: its first byte, pitch, rows per layer, and the
/// range it may touch (checked) or None for host memory (the caller's).
struct Side {
    base: u64,
    pitch: u64,
    rows: u64,
    limit: Option<(u64, u64)>,
}

#[allow(clippy::too_many_arguments)]
fn side(
    d: &Driver,
    ty: u32,
    host: u64,
    dev: u64,
    arr: CUarray,
    pitch: usize,
    height: usize,
    x: usize,
    y: usize,
    z: usize,
    m: &Memcpy3D,
) -> Result<Side, CUresult> {
    // CUmemorytype: host 1, device 2, array 3, unified 4
    let (base, pitch, rows, limit) = match ty {
        1 => (host, pitch as u64, height as u64, None),
        2 | 4 => {
            let devmem = super::memory::find_dev(d, dev, 1).is_some();
            if ty == 2 && !devmem {
                return Err(CUDA_ERROR_INVALID_VALUE);
            }
            (dev, pitch as u64, height as u64, devmem.then_some((0, 0)))
        }
        3 => {
            let a = array_of(d, arr as usize)?;
            (
                a.base,
                a.row_bytes(),
                a.rows(),
                Some((a.base, a.base + a.row_bytes() * a.rows() * a.layers())),
            )
        }
        _ => return Err(CUDA_ERROR_INVALID_VALUE),
    };
    if base == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let pitch = if pitch == 0 {
        m.width_in_bytes as u64
    } else {
        pitch
    };
    let rows = if rows == 0 {
        m.height.max(1) as u64
    } else {
        rows
    };
    if pitch < m.width_in_bytes as u64 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let start = (z as u64 * rows + y as u64)
        .checked_mul(pitch)
        .and_then(|o| o.checked_add(x as u64))
        .and_then(|o| o.checked_add(base))
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    Ok(Side {
        base: start,
        pitch,
        rows,
        limit,
    })
}

/// Offset of the last byte + 1 touched from a side's first byte.
fn span(s: &Side, m: &Memcpy3D) -> u64 {
    let (w, h, dd) = (
        m.width_in_bytes as u64,
        m.height.max(1) as u64,
        m.depth.max(1) as u64,
    );
    ((dd - 1) * s.rows + (h - 1)) * s.pitch + w
}

fn check_side(d: &Driver, s: &Side, m: &Memcpy3D) -> CuRes {
    let n = span(s, m);
    match s.limit {
        None => Ok(()),
        Some((0, 0)) => super::memory::check_dev_range(d, s.base, n),
        Some((lo, hi)) => {
            if s.base >= lo && s.base.checked_add(n).is_some_and(|e| e <= hi) {
                Ok(())
            } else {
                Err(CUDA_ERROR_INVALID_VALUE)
            }
        }
    }
}

fn sides(d: &Driver, m: &Memcpy3D) -> Result<(Side, Side), CUresult> {
    if m.src_lod != 0 || m.dst_lod != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let s = side(
        d,
        m.src_memory_type,
        m.src_host as u64,
        m.src_device,
        m.src_array,
        m.src_pitch,
        m.src_height,
        m.src_x_in_bytes,
        m.src_y,
        m.src_z,
        m,
    )?;
    let t = side(
        d,
        m.dst_memory_type,
        m.dst_host as u64,
        m.dst_device,
        m.dst_array,
        m.dst_pitch,
        m.dst_height,
        m.dst_x_in_bytes,
        m.dst_y,
        m.dst_z,
        m,
    )?;
    Ok((s, t))
}

/// Validates a 3D copy without performing it (a memcpy node's parameters).
pub fn check_memcpy3d(m: &Memcpy3D) -> CuRes {
    let d = cu()?;
    if m.width_in_bytes == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let (s, t) = sides(d, m)?;
    check_side(d, &s, m)?;
    check_side(d, &t, m)
}

/// Performs a 3D copy (validated first; nothing is copied on error).
pub fn memcpy3d(m: &Memcpy3D) -> CuRes {
    let d = cu()?;
    if m.width_in_bytes == 0 || m.height == 0 || m.depth == 0 {
        return Ok(());
    }
    let (s, t) = sides(d, m)?;
    check_side(d, &s, m)?;
    check_side(d, &t, m)?;
    for z in 0..m.depth as u64 {
        for y in 0..m.height as u64 {
            let so = s.base + (z * s.rows + y) * s.pitch;
            let to = t.base + (z * t.rows + y) * t.pitch;
            // Both ranges were validated against our mappings (or are the
            // caller's host memory); recorded instead inside a capture.
            super::memory::copy_pub(to, so, m.width_in_bytes);
        }
    }
    Ok(())
}

fn memcpy3d_ptr(p: *const Memcpy3D) -> CuRes {
    if p.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null descriptor from the caller.
    let m = unsafe { p.read_unaligned() };
    memcpy3d(&m)
}

/// Runs an async copy on `stream` (recorded into the capture when the
/// stream captures).
fn with_stream(stream: CUstream, f: impl FnOnce() -> CuRes) -> CuRes {
    super::stream::capture_mem_ops(stream as usize, f)
}

/// A 1D copy between an array (at byte `off`) and other memory.
fn array_copy(to_array: bool, arr: CUarray, off: usize, ty: u32, other: u64, n: usize) -> CuRes {
    let mut m: Memcpy3D = Memcpy3D {
        width_in_bytes: n,
        height: 1,
        depth: 1,
        ..zeroed()
    };
    if to_array {
        m.dst_memory_type = 3;
        m.dst_array = arr;
        m.dst_x_in_bytes = off;
        m.src_memory_type = ty;
        m.src_host = other as *const c_void;
        m.src_device = other;
    } else {
        m.src_memory_type = 3;
        m.src_array = arr;
        m.src_x_in_bytes = off;
        m.dst_memory_type = ty;
        m.dst_host = other as *mut c_void;
        m.dst_device = other;
    }
    memcpy3d(&m)
}

fn zeroed() -> Memcpy3D {
    // SAFETY: all-zero is valid for this plain C struct (null pointers).
    unsafe { std::mem::zeroed() }
}

fn atoa(dst: CUarray, doff: usize, src: CUarray, soff: usize, n: usize) -> CuRes {
    let m = Memcpy3D {
        src_memory_type: 3,
        src_array: src,
        src_x_in_bytes: soff,
        dst_memory_type: 3,
        dst_array: dst,
        dst_x_in_bytes: doff,
        width_in_bytes: n,
        height: 1,
        depth: 1,
        ..zeroed()
    };
    memcpy3d(&m)
}

// ------------------------------------------------------------ mipmapped arrays

pub struct Mipmapped {
    pub levels: Vec<usize>,
}

fn mipmapped() -> &'static Mutex<HashMap<usize, Mipmapped>> {
    static M: OnceLock<Mutex<HashMap<usize, Mipmapped>>> = OnceLock::new();
    M.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Levels a mipmap of these dimensions can have (down to 1×1×1).
fn max_levels(w: usize, h: usize, dd: usize) -> u32 {
    let m = w.max(h).max(dd).max(1);
    usize::BITS - m.leading_zeros()
}

fn mipmapped_create(
    out: *mut CUmipmappedArray,
    desc: *const CUDA_ARRAY3D_DESCRIPTOR,
    levels: u32,
) -> CuRes {
    let d = cu()?;
    if out.is_null() || desc.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null descriptor from the caller.
    let ds = unsafe { desc.read_unaligned() };
    no_sparse_or_deferred(ds.Flags)?;
    // The count is checked before anything is allocated.
    if levels == 0 || levels > max_levels(ds.Width, ds.Height, ds.Depth) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut made: Vec<usize> = Vec::new();
    let (mut w, mut h, mut dd) = (ds.Width, ds.Height, ds.Depth);
    for _ in 0..levels {
        let mut a: CUarray = std::ptr::null_mut();
        let r = super::memory::array_create_pub(&mut a, w, h, dd, ds.Format as u32, ds.NumChannels);
        if let Err(e) = r {
            for x in made {
                let _ = super::memory::array_destroy_pub(d, x);
            }
            return Err(e);
        }
        made.push(a as usize);
        w = (w / 2).max(1);
        h = if h == 0 { 0 } else { (h / 2).max(1) };
        dd = if dd == 0 { 0 } else { (dd / 2).max(1) };
    }
    static IDS: AtomicU64 = AtomicU64::new(0);
    let h = 0x5d00_0000_0000 + (IDS.fetch_add(1, Relaxed) as usize + 1) * 0x40;
    mipmapped().lock().insert(h, Mipmapped { levels: made });
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(out, h as CUmipmappedArray, CUDA_ERROR_INVALID_VALUE) }
}

fn mipmapped_destroy(h: CUmipmappedArray) -> CuRes {
    let d = cu()?;
    let m = mipmapped()
        .lock()
        .remove(&(h as usize))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?;
    for a in m.levels {
        let _ = super::memory::array_destroy_pub(d, a);
    }
    Ok(())
}

fn mipmapped_level(out: *mut CUarray, h: CUmipmappedArray, level: u32) -> CuRes {
    cu()?;
    let a = mipmapped()
        .lock()
        .get(&(h as usize))
        .ok_or(CUDA_ERROR_INVALID_HANDLE)?
        .levels
        .get(level as usize)
        .copied()
        .ok_or(CUDA_ERROR_INVALID_VALUE)?;
    // SAFETY: out pointer from the caller.
    unsafe { put(out, a as CUarray, CUDA_ERROR_INVALID_VALUE) }
}

fn array3d_descriptor(out: *mut CUDA_ARRAY3D_DESCRIPTOR, arr: CUarray) -> CuRes {
    let a = array_of(cu()?, arr as usize).map_err(|_| CUDA_ERROR_INVALID_HANDLE)?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: out pointer from the caller (checked non-null); writing each
    // field of the caller's descriptor.
    unsafe {
        let o = &mut *out;
        o.Width = a.dims[0];
        o.Height = a.dims[1];
        o.Depth = a.dims[2];
        o.Format = a.format as _;
        o.NumChannels = a.channels;
        o.Flags = 0;
    }
    Ok(())
}

fn array_descriptor(out: *mut CUDA_ARRAY_DESCRIPTOR, arr: CUarray) -> CuRes {
    let a = array_of(cu()?, arr as usize).map_err(|_| CUDA_ERROR_INVALID_HANDLE)?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if a.dims[2] != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe {
        let o = &mut *out;
        o.Width = a.dims[0];
        o.Height = a.dims[1];
        o.Format = a.format as _;
        o.NumChannels = a.channels;
    }
    Ok(())
}

// ------------------------------------------------- texture and surface objects

/// `CUDA_RESOURCE_DESC`: a type, a 128-byte union, flags.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ResourceDesc {
    pub res_type: u32,
    pub res: [u64; 16],
    pub flags: u32,
}

/// `CUDA_TEXTURE_DESC` (104 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct TextureDesc {
    pub address_mode: [u32; 3],
    pub filter_mode: u32,
    pub flags: u32,
    pub max_anisotropy: u32,
    pub mipmap_filter_mode: u32,
    pub mipmap_level_bias: f32,
    pub min_mipmap_level_clamp: f32,
    pub max_mipmap_level_clamp: f32,
    pub border_color: [f32; 4],
    pub reserved: [i32; 12],
}

/// `CUDA_RESOURCE_VIEW_DESC` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ResourceViewDesc {
    pub format: u32,
    pub width: usize,
    pub height: usize,
    pub depth: usize,
    pub first_mipmap_level: u32,
    pub last_mipmap_level: u32,
    pub first_layer: u32,
    pub last_layer: u32,
    pub reserved: [u32; 16],
}

struct TexObj {
    res: ResourceDesc,
    tex: Option<TextureDesc>,
    view: Option<ResourceViewDesc>,
}

fn tex_objs() -> &'static Mutex<HashMap<u64, TexObj>> {
    static T: OnceLock<Mutex<HashMap<u64, TexObj>>> = OnceLock::new();
    T.get_or_init(|| Mutex::new(HashMap::new()))
}

/// Checks what a resource names: an array, a mipmapped array, or linear or
/// pitched device memory within one allocation.
fn check_resource(d: &Driver, r: &ResourceDesc, surface: bool) -> CuRes {
    // CUresourcetype: array 0, mipmapped 1, linear 2, pitch2D 3
    let first = r.res[0] as usize;
    match r.res_type {
        0 => array_of(d, first).map(|_| ()),
        1 if !surface => mipmapped()
            .lock()
            .contains_key(&first)
            .then_some(())
            .ok_or(CUDA_ERROR_INVALID_VALUE),
        2 if !surface => {
            // {devPtr, format, numChannels, sizeInBytes}
            let size = r.res[3];
            super::memory::check_dev_range(d, first as u64, size.max(1))
        }
        3 if !surface => {
            // {devPtr, format, numChannels, width, height, pitchInBytes}
            let (h, pitch) = (r.res[4], r.res[5]);
            super::memory::check_dev_range(d, first as u64, h.max(1).saturating_mul(pitch).max(1))
        }
        _ => Err(CUDA_ERROR_INVALID_VALUE),
    }
}

static TEX_IDS: AtomicU64 = AtomicU64::new(0);

fn tex_create(
    out: *mut u64,
    res: *const ResourceDesc,
    tex: *const TextureDesc,
    view: *const ResourceViewDesc,
    surface: bool,
) -> CuRes {
    let d = cu()?;
    if out.is_null() || res.is_null() || (!surface && tex.is_null()) {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: non-null descriptors from the caller.
    let r = unsafe { res.read_unaligned() };
    check_resource(d, &r, surface)?;
    // SAFETY: as above (NULL where optional).
    let (t, v) = unsafe {
        (
            (!tex.is_null()).then(|| tex.read_unaligned()),
            (!view.is_null()).then(|| view.read_unaligned()),
        )
    };
    let id = TEX_IDS.fetch_add(1, Relaxed) + 1;
    tex_objs().lock().insert(
        id,
        TexObj {
            res: r,
            tex: t,
            view: v,
        },
    );
    // SAFETY: out pointer from the caller (checked non-null).
    unsafe { put(out, id, CUDA_ERROR_INVALID_VALUE) }
}

fn tex_destroy(h: u64) -> CuRes {
    cu()?;
    tex_objs()
        .lock()
        .remove(&h)
        .map(|_| ())
        .ok_or(CUDA_ERROR_INVALID_VALUE)
}

fn tex_get<T: Copy>(h: u64, out: *mut T, f: impl FnOnce(&TexObj) -> Option<T>) -> CuRes {
    cu()?;
    let v = {
        let t = tex_objs().lock();
        let o = t.get(&h).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        f(o).ok_or(CUDA_ERROR_INVALID_VALUE)?
    };
    // SAFETY: out pointer from the caller.
    unsafe { put(out, v, CUDA_ERROR_INVALID_VALUE) }
}

type Desc3 = *const CUDA_ARRAY3D_DESCRIPTOR;

exports! {
    cuMemcpy3D_v2 | cuMemcpy3D_v2_ptds | cuMemcpy3DPeer | cuMemcpy3DPeer_ptds
        (p: *const Memcpy3D) => memcpy3d_ptr(p);
    cuMemcpy3DAsync_v2 | cuMemcpy3DAsync_v2_ptsz | cuMemcpy3DPeerAsync | cuMemcpy3DPeerAsync_ptsz
        (p: *const Memcpy3D, stream: CUstream) => with_stream(stream, || memcpy3d_ptr(p));
    cuMemcpyAtoH_v2 | cuMemcpyAtoH_v2_ptds(dst: *mut c_void, src: CUarray, off: usize, n: usize)
        => array_copy(false, src, off, 1, dst as u64, n);
    cuMemcpyAtoHAsync_v2 | cuMemcpyAtoHAsync_v2_ptsz(dst: *mut c_void, src: CUarray, off: usize, n: usize, stream: CUstream)
        => with_stream(stream, || array_copy(false, src, off, 1, dst as u64, n));
    cuMemcpyHtoA_v2 | cuMemcpyHtoA_v2_ptds(dst: CUarray, off: usize, src: *const c_void, n: usize)
        => array_copy(true, dst, off, 1, src as u64, n);
    cuMemcpyHtoAAsync_v2 | cuMemcpyHtoAAsync_v2_ptsz(dst: CUarray, off: usize, src: *const c_void, n: usize, stream: CUstream)
        => with_stream(stream, || array_copy(true, dst, off, 1, src as u64, n));
    cuMemcpyAtoD_v2 | cuMemcpyAtoD_v2_ptds(dst: CUdeviceptr, src: CUarray, off: usize, n: usize)
        => array_copy(false, src, off, 2, dst, n);
    cuMemcpyDtoA_v2 | cuMemcpyDtoA_v2_ptds(dst: CUarray, off: usize, src: CUdeviceptr, n: usize)
        => array_copy(true, dst, off, 2, src, n);
    cuMemcpyAtoA_v2 | cuMemcpyAtoA_v2_ptds(dst: CUarray, doff: usize, src: CUarray, soff: usize, n: usize)
        => atoa(dst, doff, src, soff, n);
    cuMipmappedArrayCreate(out: *mut CUmipmappedArray, desc: Desc3, levels: u32) => mipmapped_create(out, desc, levels);
    cuMipmappedArrayDestroy(h: CUmipmappedArray) => mipmapped_destroy(h);
    cuMipmappedArrayGetLevel(out: *mut CUarray, h: CUmipmappedArray, level: u32) => mipmapped_level(out, h, level);
    cuArray3DGetDescriptor_v2(out: *mut CUDA_ARRAY3D_DESCRIPTOR, arr: CUarray) => array3d_descriptor(out, arr);
    cuArrayGetDescriptor_v2(out: *mut CUDA_ARRAY_DESCRIPTOR, arr: CUarray) => array_descriptor(out, arr);
    cuTexObjectCreate(out: *mut u64, res: *const ResourceDesc, tex: *const TextureDesc, view: *const ResourceViewDesc)
        => tex_create(out, res, tex, view, false);
    cuSurfObjectCreate(out: *mut u64, res: *const ResourceDesc) => tex_create(out, res, std::ptr::null(), std::ptr::null(), true);
    cuTexObjectDestroy | cuSurfObjectDestroy(h: u64) => tex_destroy(h);
    cuTexObjectGetResourceDesc | cuSurfObjectGetResourceDesc(out: *mut ResourceDesc, h: u64) => tex_get(h, out, |o| Some(o.res));
    cuTexObjectGetTextureDesc(out: *mut TextureDesc, h: u64) => tex_get(h, out, |o| o.tex);
    cuTexObjectGetResourceViewDesc(out: *mut ResourceViewDesc, h: u64) => tex_get(h, out, |o| o.view);
}

/// `cuMemcpyBatchAsync`: `count` linear copies (device or host memory on
/// either side), validated in order and performed in order; the attributes
/// (access order, location hints) change nothing in the sim but must be
/// well formed. On a failing copy, `fail_idx` (v1) names it.
#[allow(clippy::too_many_arguments)]
fn memcpy_batch(
    dsts: *const CUdeviceptr,
    srcs: *const CUdeviceptr,
    sizes: *const usize,
    count: usize,
    attrs: *const c_void,
    attr_idxs: *const usize,
    nattrs: usize,
    fail_idx: *mut usize,
    stream: CUstream,
) -> CuRes {
    cu()?.stream(stream as usize)?;
    if !fail_idx.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *fail_idx = usize::MAX };
    }
    if dsts.is_null() || srcs.is_null() || sizes.is_null() || count == 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    if attrs.is_null() || attr_idxs.is_null() || nattrs == 0 || nattrs > count {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    // SAFETY: attr_idxs holds nattrs entries by the caller's contract.
    if unsafe { *attr_idxs } != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    for i in 0..count {
        // SAFETY: the three arrays hold count entries by the caller's contract.
        let (dst, src, n) = unsafe { (*dsts.add(i), *srcs.add(i), *sizes.add(i)) };
        let m = Memcpy3D {
            src_memory_type: 4,
            src_host: src as *const c_void,
            src_device: src,
            dst_memory_type: 4,
            dst_host: dst as *mut c_void,
            dst_device: dst,
            width_in_bytes: n,
            height: 1,
            depth: 1,
            ..zeroed()
        };
        if let Err(e) = memcpy3d(&m) {
            if !fail_idx.is_null() {
                // SAFETY: non-null out pointer from the caller.
                unsafe { *fail_idx = i };
            }
            return Err(e);
        }
    }
    Ok(())
}

type DPtrs = *const CUdeviceptr;
type Sizes = *const usize;

exports! {
    cuMemcpyBatchAsync | cuMemcpyBatchAsync_ptsz(dsts: DPtrs, srcs: DPtrs, sizes: Sizes, count: usize, attrs: *const c_void, idxs: Sizes, nattrs: usize, fail: *mut usize, stream: CUstream)
        => memcpy_batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, fail, stream);
    cuMemcpyBatchAsync_v2 | cuMemcpyBatchAsync_v2_ptsz(dsts: DPtrs, srcs: DPtrs, sizes: Sizes, count: usize, attrs: *const c_void, idxs: Sizes, nattrs: usize, stream: CUstream)
        => memcpy_batch(dsts, srcs, sizes, count, attrs, idxs, nattrs, std::ptr::null_mut(), stream);
}

/// `cuArrayGetPlane`: only multi-planar (NV12) arrays have planes, and the
/// sim creates none.
fn array_plane(out: *mut CUarray, h: CUarray) -> CuRes {
    let d = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    match d.objs.lock().get(h as usize) {
        Some(Obj::Array(_)) => Err(CUDA_ERROR_INVALID_VALUE),
        _ => Err(CUDA_ERROR_INVALID_HANDLE),
    }
}

exports! {
    cuArrayGetPlane(out: *mut CUarray, h: CUarray, _plane: u32) => array_plane(out, h);
}

/// `CUDA_ARRAY3D_SPARSE`, `CUDA_ARRAY3D_DEFERRED_MAPPING`.
const SPARSE_OR_DEFERRED: u32 = 0x40 | 0x80;

/// The simulated GPUs have neither sparse nor deferred-mapping CUDA arrays
/// (`SPARSE_CUDA_ARRAY_SUPPORTED`, `DEFERRED_MAPPING_CUDA_ARRAY_SUPPORTED`
/// are 0): asking for one is `CUDA_ERROR_NOT_SUPPORTED`.
pub fn no_sparse_or_deferred(flags: u32) -> CuRes {
    if flags & SPARSE_OR_DEFERRED != 0 {
        return Err(CUDA_ERROR_NOT_SUPPORTED);
    }
    Ok(())
}

/// The sparse properties and memory requirements exist only for sparse and
/// deferred-mapping arrays, which the sim never makes: for any array the
/// driver's documented answer, `CUDA_ERROR_INVALID_VALUE`.
fn not_sparse(out: *mut c_void, h: usize, mipmapped_array: bool) -> CuRes {
    let d = cu()?;
    if out.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let known = if mipmapped_array {
        mipmapped().lock().contains_key(&h)
    } else {
        array_of(d, h).is_ok()
    };
    if !known {
        return Err(CUDA_ERROR_INVALID_HANDLE);
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

/// `cuMemMapArrayAsync`: every entry names a sparse or deferred-mapping
/// array or mipmapped array, and there are none.
fn map_array(list: *const c_void, count: u32, s: CUstream) -> CuRes {
    let d = cu()?;
    d.stream(s as usize)?;
    if count == 0 {
        return Ok(());
    }
    if list.is_null() {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    Err(CUDA_ERROR_INVALID_VALUE)
}

exports! {
    cuArrayGetSparseProperties(out: *mut c_void, h: CUarray) => not_sparse(out, h as usize, false);
    cuArrayGetMemoryRequirements(out: *mut c_void, h: CUarray, dev: CUdevice) => {
        cu()?.check_dev(dev)?;
        not_sparse(out, h as usize, false)
    };
    cuMipmappedArrayGetSparseProperties(out: *mut c_void, h: CUmipmappedArray) => not_sparse(out, h as usize, true);
    cuMipmappedArrayGetMemoryRequirements(out: *mut c_void, h: CUmipmappedArray, dev: CUdevice) => {
        cu()?.check_dev(dev)?;
        not_sparse(out, h as usize, true)
    };
    cuMemMapArrayAsync | cuMemMapArrayAsync_ptsz(list: *const c_void, count: u32, s: CUstream) => map_array(list, count, s);
}

/// `CUmemcpy3DOperand`: a type, then a pointer (address, row length and
/// layer height in elements, a location hint) or an array (handle, offset in
/// elements).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3DOperand {
    pub ty: u32,
    pub pad: u32,
    pub ptr_or_array: u64,
    pub a: usize,
    pub b: usize,
    pub c: usize,
}

/// `CUDA_MEMCPY3D_BATCH_OP` (112 bytes).
#[repr(C)]
#[derive(Clone, Copy)]
pub struct Memcpy3DBatchOp {
    pub src: Memcpy3DOperand,
    pub dst: Memcpy3DOperand,
    pub extent: [usize; 3],
    pub src_access_order: u32,
    pub flags: u32,
}

const _: () = assert!(std::mem::size_of::<Memcpy3DBatchOp>() == 112);

/// One batch operation as the sim's 3D copy: elements are the array's (an
/// array on either side; both must agree) or bytes between two pointers.
fn batch_op_as_3d(d: &Driver, op: &Memcpy3DBatchOp) -> Result<Memcpy3D, CUresult> {
    let [w, h, depth] = op.extent;
    if w == 0
        || h == 0
        || depth == 0
        || !(1..=3).contains(&op.src_access_order)
        || op.flags & !1 != 0
    {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let elem_of = |o: &Memcpy3DOperand| -> Result<Option<u64>, CUresult> {
        match o.ty {
            1 => Ok(None),
            2 => Ok(Some(array_of(d, o.ptr_or_array as usize)?.elem_bytes())),
            _ => Err(CUDA_ERROR_INVALID_VALUE),
        }
    };
    let elem = match (elem_of(&op.src)?, elem_of(&op.dst)?) {
        (Some(a), Some(b)) if a != b => return Err(CUDA_ERROR_INVALID_VALUE),
        (Some(a), _) | (None, Some(a)) => a as usize,
        (None, None) => 1,
    };
    let mut m = Memcpy3D {
        width_in_bytes: w * elem,
        height: h,
        depth,
        ..zeroed()
    };
    // Pointer: unified addressing; rows of `rowLength` elements (0: the
    // extent's width), layers of `layerHeight` rows (0: the extent's height).
    let side = |o: &Memcpy3DOperand| -> (u32, u64, usize, usize, [usize; 3]) {
        if o.ty == 1 {
            let row = if o.a == 0 { w } else { o.a };
            let layer = if o.b == 0 { h } else { o.b };
            (4, o.ptr_or_array, row * elem, layer, [0; 3])
        } else {
            (3, o.ptr_or_array, 0, 0, [o.a * elem, o.b, o.c])
        }
    };
    let (ty, p, pitch, height, off) = side(&op.src);
    m.src_memory_type = ty;
    m.src_x_in_bytes = off[0];
    m.src_y = off[1];
    m.src_z = off[2];
    if ty == 3 {
        m.src_array = p as CUarray;
    } else {
        m.src_device = p;
        m.src_host = p as *const c_void;
        m.src_pitch = pitch;
        m.src_height = height;
    }
    let (ty, p, pitch, height, off) = side(&op.dst);
    m.dst_memory_type = ty;
    m.dst_x_in_bytes = off[0];
    m.dst_y = off[1];
    m.dst_z = off[2];
    if ty == 3 {
        m.dst_array = p as CUarray;
    } else {
        m.dst_device = p;
        m.dst_host = p as *mut c_void;
        m.dst_pitch = pitch;
        m.dst_height = height;
    }
    check_memcpy3d(&m)?;
    Ok(m)
}

/// `cuMemcpy3DBatchAsync` (v1 with the failing index, `_v2` without) and
/// `cuMemcpy3DWithAttributesAsync` (one operation): every operation is
/// validated before any is performed, then they run in order on the stream.
fn memcpy3d_batch(
    n: usize,
    ops: *const Memcpy3DBatchOp,
    fail: *mut usize,
    flags: u64,
    stream: CUstream,
) -> CuRes {
    let d = cu()?;
    d.stream(stream as usize)?;
    if !fail.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { *fail = usize::MAX };
    }
    if n == 0 || ops.is_null() || flags != 0 {
        return Err(CUDA_ERROR_INVALID_VALUE);
    }
    let mut copies = Vec::with_capacity(n);
    for i in 0..n {
        // SAFETY: the caller's array of `n` operations.
        let op = unsafe { ops.add(i).read_unaligned() };
        match batch_op_as_3d(d, &op) {
            Ok(m) => copies.push(m),
            Err(e) => {
                if !fail.is_null() {
                    // SAFETY: non-null out pointer from the caller.
                    unsafe { *fail = i };
                }
                return Err(e);
            }
        }
    }
    with_stream(stream, || copies.iter().try_for_each(memcpy3d))
}

type Ops3 = *const Memcpy3DBatchOp;

exports! {
    cuMemcpy3DBatchAsync | cuMemcpy3DBatchAsync_ptsz(n: usize, ops: Ops3, fail: *mut usize, flags: u64, s: CUstream)
        => memcpy3d_batch(n, ops, fail, flags, s);
    cuMemcpy3DBatchAsync_v2 | cuMemcpy3DBatchAsync_v2_ptsz(n: usize, ops: Ops3, flags: u64, s: CUstream)
        => memcpy3d_batch(n, ops, std::ptr::null_mut(), flags, s);
    cuMemcpy3DWithAttributesAsync(op: Ops3, flags: u64, s: CUstream)
        => memcpy3d_batch(1, op, std::ptr::null_mut(), flags, s);
}
