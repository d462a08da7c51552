//! Tensor maps (TMA descriptors): `cuTensorMapEncodeTiled`,
//! `cuTensorMapEncodeIm2col`, `cuTensorMapEncodeIm2colWide`,
//! `cuTensorMapReplaceAddress`, `cuTensorMapSetAllocationClass`.
//!
//! The arguments are checked as the driver documents it (alignment, ranks,
//! dimensions, strides, box and element strides, interleave/swizzle/packed
//! type combinations, out-of-bounds fill only for floating types) and the
//! descriptor is written into the caller's 128-byte `CUtensorMap` (whose own
//! 64-byte alignment is not required: cuda-bindings hands out descriptors
//! aligned to 32 bytes only). The
//! descriptor is opaque to clients; the sim's layout (its own, not the
//! hardware's) is 16 little-endian words:
//!
//! | word | content |
//! |---|---|
//! | 0 | global address |
//! | 1 | tag `cgTM` (bits 0–31), kind (1 tiled, 2 im2col, 3 im2col wide), data type, rank, interleave (a byte each) |
//! | 2–6 | global dimensions |
//! | 7–10 | global strides (bytes) |
//! | 11 | box dimensions 0–3 (16 bits each); im2col: channels per pixel, pixels per column |
//! | 12 | box dimension 4 (bits 0–15), element strides (a byte each from bit 16) |
//! | 13–14 | im2col: lower and upper corners (16 bits each); wide: the mode (bits 32–39 of word 13) |
//! | 15 | swizzle, L2 promotion, OOB fill (a byte each) |
//!
//! Nothing runs on the sim's kernels, so a descriptor is never read on the
//! device; `cuTensorMapReplaceAddress` checks the descriptor is one the sim
//! encoded and rewrites word 0. The allocation class has no effect on the
//! simulated GPUs: every request succeeds, reports SMALL and leaves the
//! descriptor as it is, as the driver documents for such architectures.

use crate::driver::cu;
use crate::{exports, CuRes};
use cgpu_ffi::*;

const TAG: u64 = u32::from_le_bytes(*b"cgTM") as u64;
const KIND_TILED: u64 = 1;
const KIND_IM2COL: u64 = 2;
const KIND_IM2COL_WIDE: u64 = 3;
const INTERLEAVE_NONE: u32 = 0;
const INTERLEAVE_32B: u32 = 2;
const SWIZZLE_NONE: u32 = 0;
const SWIZZLE_32B: u32 = 1;
/// `CU_TENSOR_MAP_DATA_TYPE_16U4_ALIGN8B`, `_16U4_ALIGN16B`, `_16U6_ALIGN16B`.
const U4_ALIGN8B: u32 = 13;
const U4_ALIGN16B: u32 = 14;
const U6_ALIGN16B: u32 = 15;
const ALLOC_CLASS_SMALL: u32 = 1;

/// Bits of one element of data type `t` (the packed types: per value, as
/// stored).
fn elem_bits(t: u32) -> Option<u64> {
    Some(match t {
        0 => 8,
        1 | 6 | 9 => 16,
        2 | 3 | 7 | 10..=12 => 32,
        4 | 5 | 8 => 64,
        U4_ALIGN8B => 4,
        U4_ALIGN16B | U6_ALIGN16B => 8,
        _ => return None,
    })
}

fn is_float(t: u32) -> bool {
    (6..=12).contains(&t)
}

/// The largest inner box size (bytes) a swizzle mode allows.
fn swizzle_span(s: u32) -> u64 {
    match s {
        1 => 32,
        2 => 64,
        _ => 128,
    }
}

fn check(ok: bool) -> CuRes {
    if ok {
        Ok(())
    } else {
        Err(CUDA_ERROR_INVALID_VALUE)
    }
}

/// Reads `n` values from a caller array (NULL when `n` is 0 is fine).
fn read<T: Copy>(p: *const T, n: usize) -> Result<Vec<T>, CUresult> {
    if n == 0 {
        return Ok(Vec::new());
    }
    check(!p.is_null())?;
    // SAFETY: the caller's array holds `n` elements (the API contract).
    Ok((0..n)
        .map(|i| unsafe { p.add(i).read_unaligned() })
        .collect())
}

/// What every encoding shares.
struct Common {
    map: *mut [u64; 16],
    dtype: u32,
    rank: u32,
    addr: u64,
    dims: Vec<u64>,
    strides: Vec<u64>,
    elem_strides: Vec<u32>,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
}

/// The alignment a global address and strides need.
fn addr_align(dtype: u32, interleave: u32) -> u64 {
    if interleave == INTERLEAVE_32B || dtype == U4_ALIGN16B || dtype == U6_ALIGN16B {
        32
    } else {
        16
    }
}

impl Common {
    /// The checks of every encoding; `inner` is the box's inner size in
    /// elements (tiled: boxDim[0]; im2col: channels per pixel).
    fn validate(&self, inner: u64, min_rank: u32) -> CuRes {
        cu()?;
        check(!self.map.is_null())?;
        let bits = elem_bits(self.dtype).ok_or(CUDA_ERROR_INVALID_VALUE)?;
        check((min_rank..=5).contains(&self.rank))?;
        check(self.interleave <= 2 && self.swizzle <= 6 && self.l2 <= 3 && self.oob <= 1)?;
        check(self.interleave == INTERLEAVE_NONE || self.rank >= 3)?;
        let align = addr_align(self.dtype, self.interleave);
        check(self.addr != 0 && self.addr % align == 0)?;
        for &d in &self.dims {
            check((1..=1 << 31).contains(&d))?;
        }
        match self.dtype {
            U4_ALIGN16B | U6_ALIGN16B => check(self.dims[0] % 128 == 0)?,
            U4_ALIGN8B => check(self.dims[0] % 2 == 0)?,
            _ => {}
        }
        for &s in &self.strides {
            check(s % align == 0 && s < 1 << 40)?;
        }
        for &e in &self.elem_strides {
            check((1..=8).contains(&e))?;
        }
        if self.interleave == INTERLEAVE_32B {
            check(self.swizzle == SWIZZLE_32B)?;
        }
        if self.interleave == INTERLEAVE_NONE && self.swizzle != SWIZZLE_NONE {
            check((inner * bits).div_ceil(8) <= swizzle_span(self.swizzle))?;
        }
        if self.dtype == U6_ALIGN16B {
            check(self.interleave == INTERLEAVE_NONE)?;
        }
        check(self.oob == 0 || is_float(self.dtype))
    }

    /// Writes the descriptor: the common words, then `extra` (words 11–14).
    fn write(&self, kind: u64, extra: [u64; 4]) -> CuRes {
        let mut w = [0u64; 16];
        w[0] = self.addr;
        w[1] = TAG
            | kind << 32
            | (self.dtype as u64) << 40
            | (self.rank as u64) << 48
            | (self.interleave as u64) << 56;
        for (i, d) in self.dims.iter().enumerate() {
            w[2 + i] = *d;
        }
        for (i, s) in self.strides.iter().enumerate() {
            w[7 + i] = *s;
        }
        w[11..15].copy_from_slice(&extra);
        w[15] = self.swizzle as u64 | (self.l2 as u64) << 8 | (self.oob as u64) << 16;
        let mut es = 0u64;
        for (i, e) in self.elem_strides.iter().enumerate() {
            es |= (*e as u64) << (8 * i);
        }
        w[12] |= es << 16;
        // SAFETY: non-null CUtensorMap (128 bytes) from the caller (checked
        // by `validate`).
        unsafe { self.map.write_unaligned(w) };
        Ok(())
    }
}

#[allow(clippy::too_many_arguments)]
fn common(
    map: *mut [u64; 16],
    dtype: u32,
    rank: u32,
    addr: *mut std::ffi::c_void,
    dims: *const u64,
    strides: *const u64,
    elem_strides: *const u32,
    interleave: u32,
    swizzle: u32,
    l2: u32,
    oob: u32,
) -> Result<Common, CUresult> {
    check((1..=5).contains(&rank))?;
    let r = rank as usize;
    Ok(Common {
        map,
        dtype,
        rank,
        addr: addr as u64,
        dims: read(dims, r)?,
        strides: read(strides, r - 1)?,
        elem_strides: read(elem_strides, r)?,
        interleave,
        swizzle,
        l2,
        oob,
    })
}

fn encode_tiled(c: Common, box_dim: *const u32) -> CuRes {
    let boxes = read(box_dim, c.rank as usize)?;
    c.validate(*boxes.first().unwrap_or(&0) as u64, 1)?;
    let bits = elem_bits(c.dtype).unwrap_or(8);
    for &b in &boxes {
        check((1..=256).contains(&b))?;
    }
    if c.interleave == INTERLEAVE_NONE {
        check((boxes[0] as u64 * bits) % 128 == 0)?;
    }
    if c.dtype == U4_ALIGN16B || c.dtype == U6_ALIGN16B {
        check(boxes[0] == 128)?;
    }
    match c.dtype {
        U6_ALIGN16B => check(matches!(c.swizzle, 0 | 3 | 4 | 6))?,
        U4_ALIGN16B => check(matches!(c.swizzle, 0 | 3 | 4))?,
        _ => {}
    }
    let mut w = [0u64; 4];
    for (i, b) in boxes.iter().enumerate() {
        w[i / 4] |= (*b as u64) << (16 * (i % 4));
    }
    c.write(KIND_TILED, w)
}

/// Im2col: the corners' range for each rank, and the box's non-zero area.
fn encode_im2col(
    c: Common,
    lower: *const i32,
    upper: *const i32,
    channels: u32,
    pixels: u32,
) -> CuRes {
    c.validate(channels as u64, 3)?;
    let n = c.rank as usize - 2;
    let (lo, hi) = (read(lower, n)?, read(upper, n)?);
    let range = match c.rank {
        3 => 32768,
        4 => 128,
        _ => 16,
    };
    for &v in lo.iter().chain(&hi) {
        check((-range..range).contains(&v))?;
    }
    for k in 0..n {
        // Spatial dimensions are 1..rank-1 (W, H, D after C).
        check(c.dims[k + 1] as i64 + hi[k] as i64 - lo[k] as i64 > 0)?;
    }
    check((1..=256).contains(&channels) && (1..=1024).contains(&pixels))?;
    let mut w = [channels as u64 | (pixels as u64) << 16, 0, 0, 0];
    for k in 0..n {
        w[2] |= (lo[k] as u16 as u64) << (16 * k);
        w[3] |= (hi[k] as u16 as u64) << (16 * k);
    }
    c.write(KIND_IM2COL, w)
}

fn encode_im2col_wide(
    c: Common,
    lower: i32,
    upper: i32,
    channels: u32,
    pixels: u32,
    mode: u32,
) -> CuRes {
    c.validate(channels as u64, 3)?;
    check(mode <= 1)?;
    check((-32768..32768).contains(&lower) && (-32768..32768).contains(&upper))?;
    check(c.dims[1] as i64 + upper as i64 - lower as i64 > 0)?;
    check((1..=256).contains(&channels))?;
    // W128 mode ignores pixels per column.
    check(mode == 1 || (1..=1024).contains(&pixels))?;
    check(matches!(c.swizzle, 2..=4))?;
    match c.dtype {
        U6_ALIGN16B => check(matches!(c.swizzle, 2..=4))?,
        U4_ALIGN16B => check(matches!(c.swizzle, 3 | 4))?,
        _ => {}
    }
    let w = [
        channels as u64 | (pixels as u64) << 16,
        0,
        lower as u16 as u64 | (mode as u64) << 32,
        upper as u16 as u64,
    ];
    c.write(KIND_IM2COL_WIDE, w)
}

/// A descriptor the sim encoded, read back.
fn read_map(map: *mut [u64; 16]) -> Result<[u64; 16], CUresult> {
    cu()?;
    check(!map.is_null())?;
    // SAFETY: non-null CUtensorMap (128 bytes) from the caller.
    let w = unsafe { map.read_unaligned() };
    check(w[1] & 0xffff_ffff == TAG)?;
    Ok(w)
}

fn replace_address(map: *mut [u64; 16], addr: *mut std::ffi::c_void) -> CuRes {
    let w = read_map(map)?;
    let dtype = (w[1] >> 40) as u8 as u32;
    let interleave = (w[1] >> 56) as u8 as u32;
    let a = addr as u64;
    check(a != 0 && a % addr_align(dtype, interleave) == 0)?;
    // SAFETY: as in read_map; word 0 only.
    unsafe { (map as *mut u64).write_unaligned(a) };
    Ok(())
}

fn set_alloc_class(map: *mut [u64; 16], class: u32, out: *mut u32) -> CuRes {
    if !out.is_null() {
        // SAFETY: non-null out pointer from the caller.
        unsafe { out.write_unaligned(ALLOC_CLASS_SMALL) };
    }
    read_map(map)?;
    check(class <= 2)
}

type Map = *mut [u64; 16];
type Ptr = *mut std::ffi::c_void;

exports! {
    cuTensorMapEncodeTiled(map: Map, dtype: u32, rank: u32, addr: Ptr, dims: *const u64, strides: *const u64,
        box_dim: *const u32, elem_strides: *const u32, interleave: u32, swizzle: u32, l2: u32, oob: u32)
        => encode_tiled(common(map, dtype, rank, addr, dims, strides, elem_strides, interleave, swizzle, l2, oob)?, box_dim);
    cuTensorMapEncodeIm2col(map: Map, dtype: u32, rank: u32, addr: Ptr, dims: *const u64, strides: *const u64,
        lower: *const i32, upper: *const i32, channels: u32, pixels: u32, elem_strides: *const u32,
        interleave: u32, swizzle: u32, l2: u32, oob: u32)
        => encode_im2col(common(map, dtype, rank, addr, dims, strides, elem_strides, interleave, swizzle, l2, oob)?,
            lower, upper, channels, pixels);
    cuTensorMapEncodeIm2colWide(map: Map, dtype: u32, rank: u32, addr: Ptr, dims: *const u64, strides: *const u64,
        lower: i32, upper: i32, channels: u32, pixels: u32, elem_strides: *const u32,
        interleave: u32, mode: u32, swizzle: u32, l2: u32, oob: u32)
        => encode_im2col_wide(common(map, dtype, rank, addr, dims, strides, elem_strides, interleave, swizzle, l2, oob)?,
            lower, upper, channels, pixels, mode);
    cuTensorMapReplaceAddress(map: Map, addr: Ptr) => replace_address(map, addr);
    cuTensorMapSetAllocationClass(map: Map, class: u32, out: *mut u32) => set_alloc_class(map, class, out);
}
