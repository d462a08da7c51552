//! Module images: what `cuModuleLoadData`, `cuLibraryLoadData`, the CUDA
//! runtime's registered fat binaries and `cuLink*` hand the driver.
//!
//! The sim runs no device code, but it knows which kernels and globals an
//! image defines, so that a wrong name fails as on a GPU and globals get a
//! buffer of their real size:
//!
//! - **fat binary wrapper** (what `nvcc` output registers with
//!   `__cudaRegisterFatBinary`): magic `0x466243B1`; version 1 points to one
//!   fat binary, version 2 to a NULL-terminated array of prelinked ones.
//! - **fat binary**: magic `0xBA55ED50`, a 16-byte header (`u32 magic, u16
//!   version, u16 header size, u64 size of the entries`) and entries, each a
//!   header of at least 64 bytes (`u16 kind` 1 = PTX, 2 = ELF; `u32 header
//!   size` at 4; `u32 padded payload size` at 8; `u32 compressed size` at 16;
//!   `u64 flags` at 40, 0x2000 = LZ4, 0x8000 = ZSTD; `u64 uncompressed size`
//!   at 56) followed by its payload.
//! - **ELF** (cubin): global `STT_FUNC` symbols are kernels, `STT_OBJECT`
//!   symbols globals with their sizes.
//! - **PTX** text: `.entry` names are kernels; module-scope `.global` and
//!   `.const` variables are globals.
//!
//! A part the sim cannot read (ZSTD-compressed, unknown format, garbage)
//! makes the image *opaque*: then any kernel name resolves, and any global
//! resolves to a zeroed buffer of [`OPAQUE_GLOBAL_BYTES`].

/// `__fatBinC_Wrapper_t.magic`.
pub const WRAPPER_MAGIC: u32 = 0x4662_43B1;
/// Fat binary header magic.
pub const FATBIN_MAGIC: u32 = 0xBA55_ED50;
/// Fat binary entry kinds.
pub const KIND_PTX: u16 = 1;
pub const KIND_ELF: u16 = 2;
const FLAG_LZ4: u64 = 0x2000;
const FLAG_ZSTD: u64 = 0x8000;
/// Size of a global the sim cannot see in an opaque image: 64 KiB, the
/// constant bank of a real GPU (no `__constant__` can be larger).
pub const OPAQUE_GLOBAL_BYTES: u64 = 64 << 10;
/// No single image part is believed larger than this (corrupt headers).
const MAX_PART: u64 = 1 << 30;

/// What an image defines.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Image {
    /// Kernel (entry function) names.
    pub kernels: Vec<String>,
    /// Global variables: (name, size in bytes).
    pub globals: Vec<(String, u64)>,
    /// The globals that are managed (`__managed__`: PTX
    /// `.attribute(.managed)`).
    pub managed: Vec<String>,
    /// Kernel parameters from PTX: (kernel, [(offset, size)]).
    pub params: Vec<(String, Vec<(u64, u64)>)>,
    /// Some part could not be read: any name resolves.
    pub opaque: bool,
}

impl Image {
    /// An image nothing is known about (every name resolves).
    pub fn opaque() -> Image {
        Image {
            opaque: true,
            ..Image::default()
        }
    }

    /// Adds what `other` defines.
    pub fn merge(&mut self, other: Image) {
        for k in other.kernels {
            if !self.kernels.contains(&k) {
                self.kernels.push(k);
            }
        }
        for g in other.globals {
            if !self.globals.iter().any(|(n, _)| *n == g.0) {
                self.globals.push(g);
            }
        }
        for m in other.managed {
            if !self.managed.contains(&m) {
                self.managed.push(m);
            }
        }
        for p in other.params {
            if !self.params.iter().any(|(n, _)| *n == p.0) {
                self.params.push(p);
            }
        }
        self.opaque |= other.opaque;
    }

    /// Whether kernel `name` exists.
    pub fn has_kernel(&self, name: &str) -> bool {
        self.opaque || self.kernels.iter().any(|k| k == name)
    }

    /// Whether global `name` is managed memory.
    pub fn is_managed(&self, name: &str) -> bool {
        self.managed.iter().any(|m| m == name)
            || (self.opaque && !self.globals.iter().any(|(n, _)| n == name))
    }

    /// The size of global `name`, if it exists.
    pub fn global_size(&self, name: &str) -> Option<u64> {
        match self.globals.iter().find(|(n, _)| n == name) {
            Some((_, s)) => Some(*s),
            None if self.opaque => Some(OPAQUE_GLOBAL_BYTES),
            None => None,
        }
    }
}

fn u16_at(b: &[u8], o: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], o: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(o..o + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], o: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?))
}

/// Parses an image held in memory whose length is known (a file, a fat
/// binary entry, a `cuLink*` input).
pub fn parse_bytes(b: &[u8]) -> Image {
    match u32_at(b, 0) {
        Some(FATBIN_MAGIC) => parse_fatbin(b),
        _ if b.starts_with(b"\x7fELF") => parse_elf(b).unwrap_or_else(Image::opaque),
        _ => {
            let text = b.split(|c| *c == 0).next().unwrap_or(&[]);
            parse_ptx(&String::from_utf8_lossy(text)).unwrap_or_else(Image::opaque)
        }
    }
}

/// Parses an image given only by its address, as `cuModuleLoadData` and
/// `cuLibraryLoadData` receive it: its headers say how long it is (a PTX
/// text ends at its NUL).
///
/// # Safety
/// `p` points to a module image as the CUDA API requires: a fat binary
/// wrapper, a fat binary, an ELF image or a NUL-terminated text, whose
/// headers describe memory that is readable.
pub unsafe fn parse_ptr(p: *const u8) -> Image {
    // SAFETY: every image starts with at least 4 readable bytes (a magic or
    // the start of a NUL-terminated text of which we then read no further
    // than its NUL).
    let head = unsafe { std::slice::from_raw_parts(p, 4) };
    if head == WRAPPER_MAGIC.to_le_bytes() {
        // SAFETY: a wrapper per the caller's contract.
        return unsafe { parse_wrapper(p) };
    }
    if head == FATBIN_MAGIC.to_le_bytes() {
        // SAFETY: a fat binary header is 16 bytes.
        let h = unsafe { std::slice::from_raw_parts(p, 16) };
        let len = u16_at(h, 6).unwrap_or(16) as u64 + u64_at(h, 8).unwrap_or(0);
        if len > MAX_PART {
            return Image::opaque();
        }
        // SAFETY: the header says the fat binary is `len` bytes long.
        return parse_fatbin(unsafe { std::slice::from_raw_parts(p, len as usize) });
    }
    if head == *b"\x7fELF" {
        // SAFETY: an ELF image per the caller's contract.
        return match unsafe { elf_len(p) } {
            // SAFETY: the ELF headers say the image spans `n` bytes.
            Some(n) => {
                parse_elf(unsafe { std::slice::from_raw_parts(p, n) }).unwrap_or_else(Image::opaque)
            }
            None => Image::opaque(),
        };
    }
    let mut n = 0usize;
    // SAFETY: any other image is a NUL-terminated text (PTX); bytes are read
    // up to its NUL (at most 256 MiB are scanned).
    while n < (256 << 20) && unsafe { *p.add(n) } != 0 {
        n += 1;
    }
    // SAFETY: the n bytes before the NUL were just read.
    let text = unsafe { std::slice::from_raw_parts(p, n) };
    parse_ptx(&String::from_utf8_lossy(text)).unwrap_or_else(Image::opaque)
}

/// A fat binary wrapper (`__fatBinC_Wrapper_t`: `u32 magic, u32 version,
/// const void *data, void *filename_or_fatbins`).
///
/// # Safety
/// `p` points to a wrapper whose pointers are valid as the runtime sets them.
unsafe fn parse_wrapper(p: *const u8) -> Image {
    // SAFETY: a wrapper is 24 bytes (two u32, two pointers).
    let w = unsafe { std::slice::from_raw_parts(p, 24) };
    let version = u32_at(w, 4).unwrap_or(0);
    let data = u64_at(w, 8).unwrap_or(0) as *const u8;
    let list = u64_at(w, 16).unwrap_or(0) as *const *const u8;
    let mut img = Image::default();
    let mut any = false;
    if !data.is_null() {
        // SAFETY: `data` points to a fat binary (version 1 always; version 2
        // too when set).
        img.merge(unsafe { parse_ptr(data) });
        any = true;
    }
    if version == 2 && !list.is_null() {
        // Prelinked fat binaries: a NULL-terminated array.
        for i in 0..65536 {
            // SAFETY: the array is NULL-terminated (version 2's contract).
            let f = unsafe { *list.add(i) };
            if f.is_null() {
                break;
            }
            // SAFETY: each element points to a fat binary.
            img.merge(unsafe { parse_ptr(f) });
            any = true;
        }
    }
    if !any || !(1..=2).contains(&version) {
        img.opaque = true;
    }
    img
}

/// The extent of an ELF64 image from its headers (the end of its furthest
/// section or header table).
///
/// # Safety
/// `p` points to an ELF image whose headers are readable.
unsafe fn elf_len(p: *const u8) -> Option<usize> {
    // SAFETY: the ELF64 file header is 64 bytes.
    let h = unsafe { std::slice::from_raw_parts(p, 64) };
    if h[4] != 2 || h[5] != 1 {
        return None; // not ELF64 little-endian
    }
    let shoff = u64_at(h, 0x28)?;
    let shentsize = u16_at(h, 0x3A)? as u64;
    let shnum = u16_at(h, 0x3C)? as u64;
    let phoff = u64_at(h, 0x20)?;
    let phentsize = u16_at(h, 0x36)? as u64;
    let phnum = u16_at(h, 0x38)? as u64;
    if shentsize < 64 || shoff > MAX_PART || shnum * shentsize > MAX_PART {
        return None;
    }
    let mut end = (shoff + shnum * shentsize).max(phoff + phnum * phentsize);
    for i in 0..shnum {
        // SAFETY: the section header table lies within the image.
        let s = unsafe { std::slice::from_raw_parts(p.add((shoff + i * shentsize) as usize), 64) };
        let ty = u32_at(s, 4)?;
        let off = u64_at(s, 0x18)?;
        let size = u64_at(s, 0x20)?;
        if ty != 8 {
            // SHT_NOBITS occupies no file space
            end = end.max(off.checked_add(size)?);
        }
    }
    (end <= MAX_PART).then_some(end as usize)
}

/// Kernels and globals from an ELF64 image's symbol tables.
fn parse_elf(b: &[u8]) -> Option<Image> {
    if b.get(4) != Some(&2) || b.get(5) != Some(&1) {
        return None;
    }
    let shoff = u64_at(b, 0x28)? as usize;
    let shentsize = u16_at(b, 0x3A)? as usize;
    let shnum = u16_at(b, 0x3C)? as usize;
    if shentsize < 64 {
        return None;
    }
    let section = |i: usize| -> Option<(u32, usize, usize, u32, usize)> {
        let s = b.get(shoff + i * shentsize..shoff + i * shentsize + 64)?;
        Some((
            u32_at(s, 4)?,
            u64_at(s, 0x18)? as usize,
            u64_at(s, 0x20)? as usize,
            u32_at(s, 0x28)?,
            u64_at(s, 0x38)? as usize,
        ))
    };
    let mut img = Image::default();
    // Section names, for the per-kernel `.nv.info.<kernel>` sections.
    let shstrndx = u16_at(b, 0x3E)? as usize;
    let shstr = section(shstrndx).and_then(|(_, o, sz, _, _)| b.get(o..o.checked_add(sz)?));
    for i in 0..shnum {
        let (ty, off, size, link, entsize) = section(i)?;
        let name = shstr.and_then(|t| {
            let at = u32_at(b.get(shoff + i * shentsize..)?, 0)? as usize;
            t.get(at..)?.split(|c| *c == 0).next()
        });
        if let Some(kernel) = name.and_then(|n| n.strip_prefix(b".nv.info.")) {
            if let Some(info) = b.get(off..off.checked_add(size)?) {
                img.params.push((
                    String::from_utf8_lossy(kernel).into_owned(),
                    kernel_params(info),
                ));
            }
            continue;
        }
        if ty != 2 {
            continue; // SHT_SYMTAB only
        }
        let (_, stroff, strsize, _, _) = section(link as usize)?;
        let strtab = b.get(stroff..stroff.checked_add(strsize)?)?;
        let syms = b.get(off..off.checked_add(size)?)?;
        let entsize = if entsize == 0 { 24 } else { entsize };
        for sym in syms.chunks_exact(entsize) {
            let name_off = u32_at(sym, 0)? as usize;
            let info = sym[4];
            let shndx = u16_at(sym, 6)?;
            let sz = u64_at(sym, 16)?;
            let name = strtab
                .get(name_off..)
                .and_then(|s| s.split(|c| *c == 0).next())
                .map(|s| String::from_utf8_lossy(s).into_owned())
                .unwrap_or_default();
            if name.is_empty() || shndx == 0 {
                continue; // unnamed or undefined
            }
            match (info >> 4, info & 0xf) {
                // STB_GLOBAL or STB_WEAK (template kernels compiled by
                // NVRTC are weak), STT_FUNC
                (1 | 2, 2) => img.kernels.push(name),
                (_, 1) => img.globals.push((name, sz)), // STT_OBJECT
                _ => {}
            }
        }
    }
    Some(img)
}

/// A kernel's parameters from its `.nv.info.<kernel>` section: the
/// attributes are (format, id[, size or value]); each `EIATTR_KPARAM_INFO`
/// (id 0x17, 12 bytes: index u32, ordinal u16, offset u16, flags u32 with the
/// size in bytes in bits 18..31) is one parameter. (offset, size) by ordinal.
fn kernel_params(info: &[u8]) -> Vec<(u64, u64)> {
    let mut found: Vec<(u16, u64, u64)> = Vec::new();
    let mut i = 0;
    while i + 4 <= info.len() {
        let (format, id) = (info[i], info[i + 1]);
        let len = match format {
            // EIFMT_SVAL: a 16-bit size, then that many bytes.
            4 => u16_at(info, i + 2).unwrap_or(0) as usize,
            // EIFMT_NVAL, EIFMT_BVAL, EIFMT_HVAL: the value in 2 bytes.
            1..=3 => 0,
            _ => break,
        };
        if id == 0x17 && format == 4 && len >= 12 {
            if let (Some(ordinal), Some(offset), Some(flags)) = (
                u16_at(info, i + 8),
                u16_at(info, i + 10),
                u32_at(info, i + 12),
            ) {
                found.push((ordinal, offset as u64, (flags >> 18) as u64));
            }
        }
        i += 4 + len;
    }
    found.sort_by_key(|p| p.0);
    found.into_iter().map(|(_, o, s)| (o, s)).collect()
}

/// Kernels and globals of a PTX text; `None` if it is not PTX.
pub fn parse_ptx(text: &str) -> Option<Image> {
    let is_ptx = text.contains(".entry") || text.contains(".version") || text.contains(".target");
    if !is_ptx {
        return None;
    }
    let mut img = Image::default();
    let text = strip_comments(text);
    let mut rest = text.as_str();
    while let Some(i) = rest.find(".entry") {
        rest = &rest[i + 6..];
        let name: String = rest
            .trim_start()
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '$' | '.'))
            .collect();
        if !name.is_empty() {
            if let Some(list) = rest.trim_start()[name.len()..]
                .trim_start()
                .strip_prefix('(')
                .and_then(|r| r.split(')').next())
            {
                img.params.push((name.clone(), ptx_params(list)));
            }
            img.kernels.push(name);
        }
    }
    // Module-scope variables: statements outside any `{ }` body whose
    // directives include `.global` or `.const`.
    let mut depth = 0usize;
    let mut init = 0usize; // braces of an initializer (`= {1, 2}`)
    let mut stmt = String::new();
    for c in text.chars() {
        match c {
            '{' if depth == 0 && (init > 0 || stmt.contains('=')) => init += 1,
            '}' if init > 0 => init -= 1,
            _ if init > 0 => {}
            '{' => {
                depth += 1;
                stmt.clear();
            }
            '}' => {
                depth = depth.saturating_sub(1);
                stmt.clear();
            }
            ';' if depth == 0 => {
                if let Some(g) = ptx_global(&stmt) {
                    if stmt.contains(".managed") {
                        img.managed.push(g.0.clone());
                    }
                    img.globals.push(g);
                }
                stmt.clear();
            }
            _ if depth == 0 => stmt.push(c),
            _ => {}
        }
    }
    Some(img)
}

/// (offset, size) of each `.param` of an entry's parameter list, laid out
/// as the driver packs them (each at its alignment: `.align N`, else its
/// element size).
fn ptx_params(list: &str) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut off = 0u64;
    for p in list.split(',') {
        let toks: Vec<&str> = p.split_whitespace().collect();
        if !toks.contains(&".param") {
            continue;
        }
        let elem = toks.iter().find_map(|t| match *t {
            ".u8" | ".s8" | ".b8" | ".pred" => Some(1u64),
            ".u16" | ".s16" | ".b16" | ".f16" | ".bf16" => Some(2),
            ".u32" | ".s32" | ".b32" | ".f32" => Some(4),
            ".u64" | ".s64" | ".b64" | ".f64" => Some(8),
            _ => None,
        });
        let Some(elem) = elem else { continue };
        let align = toks
            .iter()
            .position(|t| *t == ".align")
            .and_then(|i| toks.get(i + 1))
            .and_then(|a| a.parse::<u64>().ok())
            .filter(|a| a.is_power_of_two())
            .unwrap_or(elem);
        let count = toks
            .last()
            .and_then(|n| n.split_once('['))
            .and_then(|(_, c)| c.trim_end_matches(']').parse::<u64>().ok())
            .unwrap_or(1);
        off = off.next_multiple_of(align);
        let size = elem.saturating_mul(count);
        out.push((off, size));
        off += size;
    }
    out
}

/// The text without `//` and `/* */` comments (one linear pass: PTX texts
/// in real fat binaries run to megabytes).
fn strip_comments(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'/' && b.get(i + 1) == Some(&b'/') {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i] == b'/' && b.get(i + 1) == Some(&b'*') {
            i += 2;
            while i < b.len() && !(b[i] == b'*' && b.get(i + 1) == Some(&b'/')) {
                i += 1;
            }
            i = (i + 2).min(b.len());
            out.push(b' ');
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `[.visible|.extern] .global|.const [.align N] .type name[dims] [= init]`.
fn ptx_global(stmt: &str) -> Option<(String, u64)> {
    let decl = stmt.split('=').next()?;
    let toks: Vec<&str> = decl.split_whitespace().collect();
    if !toks.iter().any(|t| *t == ".global" || *t == ".const") || toks.contains(&".extern") {
        return None;
    }
    let elem = toks.iter().find_map(|t| match *t {
        ".b8" | ".u8" | ".s8" => Some(1u64),
        ".b16" | ".u16" | ".s16" | ".f16" | ".bf16" => Some(2),
        ".b32" | ".u32" | ".s32" | ".f32" => Some(4),
        ".b64" | ".u64" | ".s64" | ".f64" => Some(8),
        _ => None,
    })?;
    // The name is the last token (with its dimensions, maybe spaced out).
    let start = toks.iter().rposition(|t| !t.starts_with('['))?;
    let name_tok = toks[start..].concat();
    let (name, dims) = match name_tok.find('[') {
        Some(i) => (&name_tok[..i], &name_tok[i..]),
        None => (name_tok.as_str(), ""),
    };
    if name.is_empty() || name.starts_with('.') {
        return None;
    }
    let mut n = 1u64;
    for d in dims.split(['[', ']']).filter(|s| !s.is_empty()) {
        n = n.saturating_mul(d.trim().parse::<u64>().unwrap_or(1));
    }
    Some((name.to_string(), elem.saturating_mul(n)))
}

/// Entries of a fat binary (header included in `b`).
fn parse_fatbin(b: &[u8]) -> Image {
    let mut img = Image::default();
    let hsize = u16_at(b, 6).unwrap_or(16) as usize;
    let files = u64_at(b, 8).unwrap_or(0).min(MAX_PART) as usize;
    let end = (hsize + files).min(b.len());
    let mut off = hsize;
    while off + 64 <= end {
        let e = &b[off..end];
        let kind = u16_at(e, 0).unwrap_or(0);
        let ehsize = u32_at(e, 4).unwrap_or(0) as usize;
        let padded = u32_at(e, 8).unwrap_or(0) as usize;
        let csize = u32_at(e, 16).unwrap_or(0) as usize;
        let flags = u64_at(e, 40).unwrap_or(0);
        let usize_ = u64_at(e, 56).unwrap_or(0);
        if ehsize < 64 {
            img.opaque = true;
            break;
        }
        let compressed = flags & (FLAG_LZ4 | FLAG_ZSTD) != 0;
        let plen = if compressed || (csize > 0 && csize <= padded) {
            csize
        } else {
            padded
        };
        let Some(payload) = e.get(ehsize..ehsize.saturating_add(plen)) else {
            img.opaque = true;
            break;
        };
        let data: Option<Vec<u8>> = if flags & FLAG_ZSTD != 0 {
            None
        } else if flags & FLAG_LZ4 != 0 {
            lz4_block_decompress(payload, usize_.min(MAX_PART) as usize)
        } else {
            Some(payload.to_vec())
        };
        match (kind, data) {
            (_, None) => img.opaque = true,
            (KIND_PTX, Some(d)) => {
                let text = d.split(|c| *c == 0).next().unwrap_or(&[]);
                match parse_ptx(&String::from_utf8_lossy(text)) {
                    Some(p) => img.merge(p),
                    None => img.opaque = true,
                }
            }
            (KIND_ELF, Some(d)) => match parse_elf(&d) {
                Some(p) => img.merge(p),
                None => img.opaque = true,
            },
            _ => {} // other entry kinds hold no code
        }
        off += ehsize + padded.max(csize);
    }
    img
}

/// Decompresses an LZ4 block (no frame) of known decompressed size.
pub fn lz4_block_decompress(src: &[u8], size: usize) -> Option<Vec<u8>> {
    let mut out: Vec<u8> = Vec::with_capacity(size);
    let mut i = 0usize;
    let ext = |i: &mut usize, mut n: usize| -> Option<usize> {
        if n == 15 {
            loop {
                let b = *src.get(*i)?;
                *i += 1;
                n += b as usize;
                if b != 255 {
                    break;
                }
            }
        }
        Some(n)
    };
    loop {
        let token = *src.get(i)?;
        i += 1;
        let lit = ext(&mut i, (token >> 4) as usize)?;
        out.extend_from_slice(src.get(i..i.checked_add(lit)?)?);
        i += lit;
        if out.len() > size {
            return None;
        }
        if i == src.len() {
            break;
        }
        let offset = u16_at(src, i)? as usize;
        i += 2;
        if offset == 0 || offset > out.len() {
            return None;
        }
        let len = ext(&mut i, (token & 15) as usize)? + 4;
        if out.len() + len > size {
            return None;
        }
        let start = out.len() - offset;
        for k in 0..len {
            let c = out[start + k];
            out.push(c);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTX: &str = "// a comment .entry fake\n.version 8.0\n.target sm_80\n.address_size 64\n\
        .visible .global .align 8 .u64 counter;\n\
        .global .align 4 .b8 table[3][16] = {1, 2};\n\
        .const .align 4 .f32 coeffs[8];\n\
        .extern .global .u32 elsewhere;\n\
        .visible .entry cgpu_sim_spin(\n .param .u64 ns\n)\n{\n .reg .b64 %rd<2>;\n ld.global.u64 %rd1, [counter];\n ret;\n}\n\
        .entry other_k() { ret; }\n";

    #[test]
    fn ptx_params_are_laid_out_as_the_driver_packs_them() {
        let img = parse_ptx(
            ".version 8.0\n.visible .entry k(\n .param .u32 a,\n .param .u64 .ptr .global .align 8 b,\n .param .align 16 .b8 c[24],\n .param .u8 d\n)\n{ ret; }",
        )
        .unwrap();
        assert_eq!(
            img.params,
            vec![("k".to_string(), vec![(0, 4), (8, 8), (16, 24), (40, 1)])]
        );
    }

    #[test]
    fn ptx_kernels_and_globals() {
        let img = parse_ptx(PTX).unwrap();
        assert_eq!(img.kernels, vec!["cgpu_sim_spin", "other_k"]);
        assert_eq!(
            img.globals,
            vec![
                ("counter".to_string(), 8),
                ("table".to_string(), 48),
                ("coeffs".to_string(), 32)
            ]
        );
        assert!(!img.opaque);
        assert!(parse_ptx("\x01\x02garbage").is_none());
        assert!(parse_bytes(b"\x01\x02garbage").opaque);
    }

    fn entry(kind: u16, flags: u64, payload: &[u8], usize_: u64) -> Vec<u8> {
        let padded = payload.len().div_ceil(8) * 8;
        let mut e = vec![0u8; 64];
        e[0..2].copy_from_slice(&kind.to_le_bytes());
        e[2..4].copy_from_slice(&0x0101u16.to_le_bytes());
        e[4..8].copy_from_slice(&64u32.to_le_bytes());
        e[8..12].copy_from_slice(&(padded as u32).to_le_bytes());
        if flags != 0 {
            e[16..20].copy_from_slice(&(payload.len() as u32).to_le_bytes());
        }
        e[40..48].copy_from_slice(&flags.to_le_bytes());
        e[56..64].copy_from_slice(&usize_.to_le_bytes());
        e.extend_from_slice(payload);
        e.resize(64 + padded, 0);
        e
    }

    fn fatbin(entries: &[Vec<u8>]) -> Vec<u8> {
        let body: Vec<u8> = entries.concat();
        let mut f = Vec::new();
        f.extend_from_slice(&FATBIN_MAGIC.to_le_bytes());
        f.extend_from_slice(&1u16.to_le_bytes());
        f.extend_from_slice(&16u16.to_le_bytes());
        f.extend_from_slice(&(body.len() as u64).to_le_bytes());
        f.extend_from_slice(&body);
        f
    }

    /// A minimal ELF64 with a symbol table: kernel `k_elf`, global `g_elf`
    /// (12 bytes), weak kernel `k_weak`, local function `f_local`.
    fn elf() -> Vec<u8> {
        let strtab = b"\0k_elf\0g_elf\0.symtab\0.strtab\0k_weak\0f_local\0".to_vec();
        let mut syms = vec![0u8; 24]; // null symbol
        let sym = |name: u32, info: u8, size: u64| {
            let mut s = vec![0u8; 24];
            s[0..4].copy_from_slice(&name.to_le_bytes());
            s[4] = info;
            s[6..8].copy_from_slice(&1u16.to_le_bytes());
            s[16..24].copy_from_slice(&size.to_le_bytes());
            s
        };
        syms.extend(sym(1, 0x12, 0));
        syms.extend(sym(7, 0x11, 12));
        syms.extend(sym(29, 0x22, 0));
        syms.extend(sym(36, 0x02, 0));
        let mut b = vec![0u8; 64];
        b[0..4].copy_from_slice(b"\x7fELF");
        b[4] = 2;
        b[5] = 1;
        let str_off = 64;
        let sym_off = str_off + strtab.len();
        let sh_off = sym_off + syms.len();
        b.extend_from_slice(&strtab);
        b.extend_from_slice(&syms);
        b[0x28..0x30].copy_from_slice(&(sh_off as u64).to_le_bytes());
        b[0x3A..0x3C].copy_from_slice(&64u16.to_le_bytes());
        b[0x3C..0x3E].copy_from_slice(&3u16.to_le_bytes());
        let sh = |ty: u32, off: usize, size: usize, link: u32, ent: u64| {
            let mut s = vec![0u8; 64];
            s[4..8].copy_from_slice(&ty.to_le_bytes());
            s[0x18..0x20].copy_from_slice(&(off as u64).to_le_bytes());
            s[0x20..0x28].copy_from_slice(&(size as u64).to_le_bytes());
            s[0x28..0x2C].copy_from_slice(&link.to_le_bytes());
            s[0x38..0x40].copy_from_slice(&ent.to_le_bytes());
            s
        };
        b.extend(vec![0u8; 64]);
        b.extend(sh(3, str_off, strtab.len(), 0, 0));
        b.extend(sh(2, sym_off, syms.len(), 1, 24));
        b
    }

    /// The `.nv.info.plain` section NVRTC 12.9 writes for
    /// `plain(float *, double, char, int)` (sm_80).
    #[test]
    fn kernel_params_from_nv_info() {
        let info = [
            0x04, 0x37, 0x04, 0x00, 0x81, 0x00, 0x00, 0x00, 0x01, 0x35, 0x00, 0x00, 0x04, 0x0a,
            0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x60, 0x01, 0x18, 0x00, 0x03, 0x19, 0x18, 0x00,
            0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x03, 0x00, 0x14, 0x00, 0x00, 0xf0,
            0x11, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x10, 0x00,
            0x00, 0xf0, 0x05, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01, 0x00,
            0x08, 0x00, 0x00, 0xf0, 0x21, 0x00, 0x04, 0x17, 0x0c, 0x00, 0x00, 0x00, 0x00, 0x00,
            0x00, 0x00, 0x00, 0x00, 0x00, 0xf0, 0x21, 0x00, 0x03, 0x1b, 0xff, 0x00, 0x04, 0x1c,
            0x08, 0x00, 0x20, 0x00, 0x00, 0x00, 0xc0, 0x00, 0x00, 0x00,
        ];
        assert_eq!(kernel_params(&info), vec![(0, 8), (8, 8), (16, 1), (20, 4)]);
        assert_eq!(kernel_params(&info[..12]), vec![]);
    }

    #[test]
    fn elf_symbols() {
        let e = elf();
        let img = parse_bytes(&e);
        assert_eq!(img.kernels, vec!["k_elf", "k_weak"]);
        assert_eq!(img.globals, vec![("g_elf".to_string(), 12)]);
        assert!(!img.opaque);
        // SAFETY: a complete ELF image in memory.
        let by_ptr = unsafe { parse_ptr(e.as_ptr()) };
        assert_eq!(by_ptr, img);
    }

    #[test]
    fn fatbin_entries_lz4_zstd_and_wrappers() {
        // "aaaa...": literal 'a' then a match of 19 at offset 1 (LZ4 block).
        let ptx_plain = entry(KIND_PTX, 0, PTX.as_bytes(), 0);
        let lz = [0x1f, b'a', 1, 0, 0, 0x50, b'x', b'y', b'z', b'!', b'!'];
        let out = lz4_block_decompress(&lz, 25).unwrap();
        assert_eq!(out, b"aaaaaaaaaaaaaaaaaaaaxyz!!".to_vec());
        assert!(lz4_block_decompress(&[0x1f, b'a', 9, 0], 100).is_none());
        let f = fatbin(&[ptx_plain.clone(), entry(KIND_ELF, 0, &elf(), 0)]);
        let img = parse_bytes(&f);
        assert_eq!(
            img.kernels,
            vec!["cgpu_sim_spin", "other_k", "k_elf", "k_weak"]
        );
        assert!(!img.opaque);
        assert!(!img.has_kernel("nope"));
        assert_eq!(img.global_size("g_elf"), Some(12));
        assert_eq!(img.global_size("nope"), None);
        // A ZSTD entry makes it opaque: every name resolves.
        let z = fatbin(&[
            ptx_plain,
            entry(KIND_ELF, FLAG_ZSTD, &[0x28, 0xb5, 0x2f, 0xfd], 100),
        ]);
        let img = parse_bytes(&z);
        assert!(img.opaque && img.has_kernel("anything"));
        assert_eq!(img.global_size("x"), Some(OPAQUE_GLOBAL_BYTES));
        // Wrappers, version 1 and 2.
        let f = fatbin(&[entry(KIND_ELF, 0, &elf(), 0)]);
        let w1: [u64; 3] = [(WRAPPER_MAGIC as u64) | (1u64 << 32), f.as_ptr() as u64, 0];
        // SAFETY: a wrapper pointing to a fat binary alive in this scope.
        let img = unsafe { parse_ptr(w1.as_ptr() as *const u8) };
        assert_eq!(img.kernels, vec!["k_elf", "k_weak"]);
        let list = [f.as_ptr() as u64, 0];
        let w2: [u64; 3] = [
            (WRAPPER_MAGIC as u64) | (2u64 << 32),
            0,
            list.as_ptr() as u64,
        ];
        // SAFETY: as above, with a NULL-terminated list.
        let img = unsafe { parse_ptr(w2.as_ptr() as *const u8) };
        assert_eq!(img.kernels, vec!["k_elf", "k_weak"]);
        assert!(!img.opaque);
    }
}
