//! Serving gRPC to kubelets whatever `:authority` they send.
//!
//! Kubelets before 1.26 dial a device plugin with the socket path as the
//! HTTP/2 `:authority` (`/var/lib/kubelet/device-plugins/x.sock`); newer
//! ones send `localhost`. The HTTP/2 server under tonic (h2) resets every
//! stream whose `:authority` is not a valid URI authority, so an old kubelet
//! could neither list nor allocate devices. Each connection therefore passes
//! through [`relay`]: the client's header blocks are decoded (HPACK, RFC
//! 7541, with its dynamic table and Huffman coding) and sent on as plain
//! literals, with an `:authority` that is not a valid authority replaced by
//! `localhost`; every other frame, and everything the server sends, passes
//! byte for byte.
//!
//! The HPACK coder here is also what the kubelet double uses to speak as an
//! old kubelet does (Huffman-coded `:authority`, indexed into the dynamic
//! table and referred to by index afterwards).

use std::collections::{HashMap, VecDeque};
use std::sync::OnceLock;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// One header field.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Field {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
    /// Sent as "never indexed" (a sensitive value); kept so on re-encoding.
    pub never_index: bool,
}

impl Field {
    pub fn new(name: &str, value: &str) -> Field {
        Field {
            name: name.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            never_index: false,
        }
    }
}

const STATIC: [(&str, &str); 61] = [
    (":authority", ""),
    (":method", "GET"),
    (":method", "POST"),
    (":path", "/"),
    (":path", "/index.html"),
    (":scheme", "http"),
    (":scheme", "https"),
    (":status", "200"),
    (":status", "204"),
    (":status", "206"),
    (":status", "304"),
    (":status", "400"),
    (":status", "404"),
    (":status", "500"),
    ("accept-charset", ""),
    ("accept-encoding", "gzip, deflate"),
    ("accept-language", ""),
    ("accept-ranges", ""),
    ("accept", ""),
    ("access-control-allow-origin", ""),
    ("age", ""),
    ("allow", ""),
    ("authorization", ""),
    ("cache-control", ""),
    ("content-disposition", ""),
    ("content-encoding", ""),
    ("content-language", ""),
    ("content-length", ""),
    ("content-location", ""),
    ("content-range", ""),
    ("content-type", ""),
    ("cookie", ""),
    ("date", ""),
    ("etag", ""),
    ("expect", ""),
    ("expires", ""),
    ("from", ""),
    ("host", ""),
    ("if-match", ""),
    ("if-modified-since", ""),
    ("if-none-match", ""),
    ("if-range", ""),
    ("if-unmodified-since", ""),
    ("last-modified", ""),
    ("link", ""),
    ("location", ""),
    ("max-forwards", ""),
    ("proxy-authenticate", ""),
    ("proxy-authorization", ""),
    ("range", ""),
    ("referer", ""),
    ("refresh", ""),
    ("retry-after", ""),
    ("server", ""),
    ("set-cookie", ""),
    ("strict-transport-security", ""),
    ("transfer-encoding", ""),
    ("user-agent", ""),
    ("vary", ""),
    ("via", ""),
    ("www-authenticate", ""),
];

/// An HPACK dynamic table (RFC 7541 §4): newest entry first.
#[derive(Debug)]
struct Table {
    entries: VecDeque<(Vec<u8>, Vec<u8>)>,
    size: usize,
    max: usize,
}

impl Table {
    fn new(max: usize) -> Table {
        Table {
            entries: VecDeque::new(),
            size: 0,
            max,
        }
    }

    fn evict_to(&mut self, max: usize) {
        while self.size > max {
            let (n, v) = self.entries.pop_back().expect("size > 0 means entries");
            self.size -= n.len() + v.len() + 32;
        }
    }

    fn set_max(&mut self, max: usize) {
        self.max = max;
        self.evict_to(max);
    }

    fn insert(&mut self, name: Vec<u8>, value: Vec<u8>) {
        let size = name.len() + value.len() + 32;
        if size > self.max {
            self.entries.clear();
            self.size = 0;
            return;
        }
        self.evict_to(self.max - size);
        self.size += size;
        self.entries.push_front((name, value));
    }

    /// Index `i` (1-based, static entries first).
    fn get(&self, i: usize) -> Result<(Vec<u8>, Vec<u8>), String> {
        if i == 0 {
            return Err("HPACK index 0".into());
        }
        if i <= STATIC.len() {
            let (n, v) = STATIC[i - 1];
            return Ok((n.as_bytes().to_vec(), v.as_bytes().to_vec()));
        }
        self.entries
            .get(i - STATIC.len() - 1)
            .cloned()
            .ok_or_else(|| format!("HPACK index {i} beyond the table"))
    }
}

fn decode_int(buf: &[u8], pos: &mut usize, prefix: u8) -> Result<usize, String> {
    let short = || "HPACK integer cut short".to_string();
    let mask = (1usize << prefix) - 1;
    let mut v = usize::from(*buf.get(*pos).ok_or_else(short)?) & mask;
    *pos += 1;
    if v < mask {
        return Ok(v);
    }
    let mut shift = 0;
    loop {
        let b = *buf.get(*pos).ok_or_else(short)?;
        *pos += 1;
        v += usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            return Ok(v);
        }
        if shift > 28 {
            return Err("HPACK integer too large".into());
        }
    }
}

fn decode_str(buf: &[u8], pos: &mut usize) -> Result<Vec<u8>, String> {
    let huffman = buf.get(*pos).is_some_and(|b| b & 0x80 != 0);
    let len = decode_int(buf, pos, 7)?;
    let end = pos
        .checked_add(len)
        .filter(|&e| e <= buf.len())
        .ok_or("HPACK string cut short")?;
    let raw = &buf[*pos..end];
    *pos = end;
    if huffman {
        huffman_decode(raw)
    } else {
        Ok(raw.to_vec())
    }
}

/// Appends an HPACK integer with `prefix` bits, `flags` in the first byte.
pub fn encode_int(v: usize, prefix: u8, flags: u8, out: &mut Vec<u8>) {
    let mask = (1usize << prefix) - 1;
    if v < mask {
        out.push(flags | v as u8);
        return;
    }
    out.push(flags | mask as u8);
    let mut rest = v - mask;
    while rest >= 0x80 {
        out.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    out.push(rest as u8);
}

fn encode_str(s: &[u8], huffman: bool, out: &mut Vec<u8>) {
    if huffman {
        let h = huffman_encode(s);
        encode_int(h.len(), 7, 0x80, out);
        out.extend_from_slice(&h);
    } else {
        encode_int(s.len(), 7, 0, out);
        out.extend_from_slice(s);
    }
}

/// The decoding side of one connection.
#[derive(Debug)]
pub struct Decoder {
    table: Table,
}

impl Decoder {
    /// `max` is the table size the peer's encoder starts with (4096 unless
    /// the decoding side's SETTINGS said otherwise).
    pub fn new(max: usize) -> Decoder {
        Decoder {
            table: Table::new(max),
        }
    }

    /// Decodes one complete header block.
    pub fn decode(&mut self, block: &[u8]) -> Result<Vec<Field>, String> {
        let mut out = Vec::new();
        let mut pos = 0;
        while pos < block.len() {
            let b = block[pos];
            if b & 0x80 != 0 {
                let (name, value) = self.table.get(decode_int(block, &mut pos, 7)?)?;
                out.push(Field {
                    name,
                    value,
                    never_index: false,
                });
            } else if b & 0xc0 == 0x40 {
                let i = decode_int(block, &mut pos, 6)?;
                let name = if i == 0 {
                    decode_str(block, &mut pos)?
                } else {
                    self.table.get(i)?.0
                };
                let value = decode_str(block, &mut pos)?;
                self.table.insert(name.clone(), value.clone());
                out.push(Field {
                    name,
                    value,
                    never_index: false,
                });
            } else if b & 0xe0 == 0x20 {
                let max = decode_int(block, &mut pos, 5)?;
                if max > 1 << 20 {
                    return Err(format!("HPACK table size {max} too large"));
                }
                self.table.set_max(max);
            } else {
                let never_index = b & 0x10 != 0;
                let i = decode_int(block, &mut pos, 4)?;
                let name = if i == 0 {
                    decode_str(block, &mut pos)?
                } else {
                    self.table.get(i)?.0
                };
                let value = decode_str(block, &mut pos)?;
                out.push(Field {
                    name,
                    value,
                    never_index,
                });
            }
        }
        Ok(out)
    }
}

/// Encodes fields as literals that leave the peer's dynamic table alone
/// (plain strings, new names): nothing the peer decodes depends on state.
pub fn encode_literals(fields: &[Field], out: &mut Vec<u8>) {
    for f in fields {
        out.push(if f.never_index { 0x10 } else { 0x00 });
        encode_str(&f.name, false, out);
        encode_str(&f.value, false, out);
    }
}

/// An encoder that indexes every field in the peer's dynamic table and
/// refers to repeated fields by index, with Huffman-coded strings: what
/// grpc-go's encoder sends.
#[derive(Debug)]
pub struct IndexingEncoder {
    table: Table,
}

impl IndexingEncoder {
    pub fn new(max: usize) -> IndexingEncoder {
        IndexingEncoder {
            table: Table::new(max),
        }
    }

    pub fn encode(&mut self, fields: &[Field], out: &mut Vec<u8>) {
        for f in fields {
            let hit = self
                .table
                .entries
                .iter()
                .position(|(n, v)| *n == f.name && *v == f.value);
            if let Some(i) = hit {
                encode_int(i + STATIC.len() + 1, 7, 0x80, out);
                continue;
            }
            out.push(0x40);
            encode_str(&f.name, true, out);
            encode_str(&f.value, true, out);
            self.table.insert(f.name.clone(), f.value.clone());
        }
    }
}

// The Huffman code of RFC 7541 Appendix B (symbols 0..=255; EOS only pads).
#[rustfmt::skip]
const ENCODE_CODES: [u32; 256] = [
    0x1ff8, 0x7fffd8, 0xfffffe2, 0xfffffe3, 0xfffffe4, 0xfffffe5, 0xfffffe6, 0xfffffe7, 0xfffffe8,
    0xffffea, 0x3ffffffc, 0xfffffe9, 0xfffffea, 0x3ffffffd, 0xfffffeb, 0xfffffec, 0xfffffed,
    0xfffffee, 0xfffffef, 0xffffff0, 0xffffff1, 0xffffff2, 0x3ffffffe, 0xffffff3, 0xffffff4,
    0xffffff5, 0xffffff6, 0xffffff7, 0xffffff8, 0xffffff9, 0xffffffa, 0xffffffb, 0x14, 0x3f8,
    0x3f9, 0xffa, 0x1ff9, 0x15, 0xf8, 0x7fa, 0x3fa, 0x3fb, 0xf9, 0x7fb, 0xfa, 0x16, 0x17, 0x18,
    0x0, 0x1, 0x2, 0x19, 0x1a, 0x1b, 0x1c, 0x1d, 0x1e, 0x1f, 0x5c, 0xfb, 0x7ffc, 0x20, 0xffb,
    0x3fc, 0x1ffa, 0x21, 0x5d, 0x5e, 0x5f, 0x60, 0x61, 0x62, 0x63, 0x64, 0x65, 0x66, 0x67, 0x68,
    0x69, 0x6a, 0x6b, 0x6c, 0x6d, 0x6e, 0x6f, 0x70, 0x71, 0x72, 0xfc, 0x73, 0xfd, 0x1ffb, 0x7fff0,
    0x1ffc, 0x3ffc, 0x22, 0x7ffd, 0x3, 0x23, 0x4, 0x24, 0x5, 0x25, 0x26, 0x27, 0x6, 0x74, 0x75,
    0x28, 0x29, 0x2a, 0x7, 0x2b, 0x76, 0x2c, 0x8, 0x9, 0x2d, 0x77, 0x78, 0x79, 0x7a, 0x7b, 0x7ffe,
    0x7fc, 0x3ffd, 0x1ffd, 0xffffffc, 0xfffe6, 0x3fffd2, 0xfffe7, 0xfffe8, 0x3fffd3, 0x3fffd4,
    0x3fffd5, 0x7fffd9, 0x3fffd6, 0x7fffda, 0x7fffdb, 0x7fffdc, 0x7fffdd, 0x7fffde, 0xffffeb,
    0x7fffdf, 0xffffec, 0xffffed, 0x3fffd7, 0x7fffe0, 0xffffee, 0x7fffe1, 0x7fffe2, 0x7fffe3,
    0x7fffe4, 0x1fffdc, 0x3fffd8, 0x7fffe5, 0x3fffd9, 0x7fffe6, 0x7fffe7, 0xffffef, 0x3fffda,
    0x1fffdd, 0xfffe9, 0x3fffdb, 0x3fffdc, 0x7fffe8, 0x7fffe9, 0x1fffde, 0x7fffea, 0x3fffdd,
    0x3fffde, 0xfffff0, 0x1fffdf, 0x3fffdf, 0x7fffeb, 0x7fffec, 0x1fffe0, 0x1fffe1, 0x3fffe0,
    0x1fffe2, 0x7fffed, 0x3fffe1, 0x7fffee, 0x7fffef, 0xfffea, 0x3fffe2, 0x3fffe3, 0x3fffe4,
    0x7ffff0, 0x3fffe5, 0x3fffe6, 0x7ffff1, 0x3ffffe0, 0x3ffffe1, 0xfffeb, 0x7fff1, 0x3fffe7,
    0x7ffff2, 0x3fffe8, 0x1ffffec, 0x3ffffe2, 0x3ffffe3, 0x3ffffe4, 0x7ffffde, 0x7ffffdf,
    0x3ffffe5, 0xfffff1, 0x1ffffed, 0x7fff2, 0x1fffe3, 0x3ffffe6, 0x7ffffe0, 0x7ffffe1, 0x3ffffe7,
    0x7ffffe2, 0xfffff2, 0x1fffe4, 0x1fffe5, 0x3ffffe8, 0x3ffffe9, 0xffffffd, 0x7ffffe3, 0x7ffffe4,
    0x7ffffe5, 0xfffec, 0xfffff3, 0xfffed, 0x1fffe6, 0x3fffe9, 0x1fffe7, 0x1fffe8, 0x7ffff3,
    0x3fffea, 0x3fffeb, 0x1ffffee, 0x1ffffef, 0xfffff4, 0xfffff5, 0x3ffffea, 0x7ffff4, 0x3ffffeb,
    0x7ffffe6, 0x3ffffec, 0x3ffffed, 0x7ffffe7, 0x7ffffe8, 0x7ffffe9, 0x7ffffea, 0x7ffffeb,
    0xffffffe, 0x7ffffec, 0x7ffffed, 0x7ffffee, 0x7ffffef, 0x7fffff0, 0x3ffffee,
];

const ENCODE_CODE_LENGTHS: [u8; 256] = [
    13, 23, 28, 28, 28, 28, 28, 28, 28, 24, 30, 28, 28, 30, 28, 28, 28, 28, 28, 28, 28, 28, 30, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 6, 10, 10, 12, 13, 6, 8, 11, 10, 10, 8, 11, 8, 6, 6, 6, 5, 5,
    5, 6, 6, 6, 6, 6, 6, 6, 7, 8, 15, 6, 12, 10, 13, 6, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7,
    7, 7, 7, 7, 7, 7, 7, 7, 8, 7, 8, 13, 19, 13, 14, 6, 15, 5, 6, 5, 6, 5, 6, 6, 6, 5, 7, 7, 6, 6,
    6, 5, 6, 7, 6, 5, 5, 6, 7, 7, 7, 7, 7, 15, 11, 14, 13, 28, 20, 22, 20, 20, 22, 22, 22, 23, 22,
    23, 23, 23, 23, 23, 24, 23, 24, 24, 22, 23, 24, 23, 23, 23, 23, 21, 22, 23, 22, 23, 23, 24, 22,
    21, 20, 22, 22, 23, 23, 21, 23, 22, 22, 24, 21, 22, 23, 23, 21, 21, 22, 21, 23, 22, 23, 23, 20,
    22, 22, 22, 23, 22, 22, 23, 26, 26, 20, 19, 22, 23, 22, 25, 26, 26, 26, 27, 27, 26, 24, 25, 19,
    21, 26, 27, 27, 26, 27, 24, 21, 21, 26, 26, 28, 27, 27, 27, 20, 24, 20, 21, 22, 21, 21, 23, 22,
    22, 25, 25, 24, 24, 26, 23, 26, 27, 26, 26, 27, 27, 27, 27, 27, 28, 27, 27, 27, 27, 27, 26,
];

fn huffman_codes() -> &'static HashMap<(u8, u32), u8> {
    static M: OnceLock<HashMap<(u8, u32), u8>> = OnceLock::new();
    M.get_or_init(|| {
        (0..256)
            .map(|s| ((ENCODE_CODE_LENGTHS[s], ENCODE_CODES[s]), s as u8))
            .collect()
    })
}

/// Decodes a Huffman-coded HPACK string.
pub fn huffman_decode(src: &[u8]) -> Result<Vec<u8>, String> {
    let codes = huffman_codes();
    let mut out = Vec::with_capacity(src.len() * 8 / 5);
    let (mut code, mut len) = (0u32, 0u8);
    for byte in src {
        for bit in (0..8).rev() {
            code = (code << 1) | u32::from((byte >> bit) & 1);
            len += 1;
            if len >= 5 {
                if let Some(&s) = codes.get(&(len, code)) {
                    out.push(s);
                    (code, len) = (0, 0);
                } else if len >= 30 {
                    return Err("invalid Huffman code".into());
                }
            }
        }
    }
    // Padding: fewer than 8 bits, all ones (a prefix of EOS).
    if len > 7 || code != (1u32 << len) - 1 {
        return Err("invalid Huffman padding".into());
    }
    Ok(out)
}

pub fn huffman_encode(src: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let (mut bits, mut n) = (0u64, 0u32);
    for &b in src {
        let len = u32::from(ENCODE_CODE_LENGTHS[usize::from(b)]);
        bits = (bits << len) | u64::from(ENCODE_CODES[usize::from(b)]);
        n += len;
        while n >= 8 {
            n -= 8;
            out.push((bits >> n) as u8);
        }
        bits &= (1u64 << n) - 1;
    }
    if n > 0 {
        out.push(((bits << (8 - n)) | ((1u64 << (8 - n)) - 1)) as u8);
    }
    out
}

/// `localhost` for an `:authority` that is not a valid URI authority (a
/// socket path, say); `None` to keep it.
pub fn fix_authority(value: &[u8]) -> Option<Vec<u8>> {
    match tonic::codegen::http::uri::Authority::try_from(value) {
        Ok(_) => None,
        Err(_) => Some(b"localhost".to_vec()),
    }
}

const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const HEADERS: u8 = 0x1;
const CONTINUATION: u8 = 0x9;
const END_STREAM: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;
/// The smallest SETTINGS_MAX_FRAME_SIZE a peer may set: safe to send.
const MAX_FRAME: usize = 16_384;

fn frame_header(len: usize, kind: u8, flags: u8, stream: u32) -> [u8; 9] {
    let l = (len as u32).to_be_bytes();
    let s = stream.to_be_bytes();
    [l[1], l[2], l[3], kind, flags, s[0], s[1], s[2], s[3]]
}

/// A HEADERS frame (and CONTINUATION frames when the block is large).
fn headers_frames(stream: u32, end_stream: bool, block: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block.len() + 18);
    let chunks: Vec<&[u8]> = if block.is_empty() {
        vec![&[][..]]
    } else {
        block.chunks(MAX_FRAME).collect()
    };
    for (i, c) in chunks.iter().enumerate() {
        let last = i + 1 == chunks.len();
        let (kind, mut flags) = if i == 0 {
            (HEADERS, if end_stream { END_STREAM } else { 0 })
        } else {
            (CONTINUATION, 0)
        };
        if last {
            flags |= END_HEADERS;
        }
        out.extend_from_slice(&frame_header(c.len(), kind, flags, stream));
        out.extend_from_slice(c);
    }
    out
}

/// Copies an HTTP/2 connection from `client` to `server`, re-encoding each
/// header block the client sends with `transcode` (given the decoded
/// fields, it appends the block to send); the other direction is copied as
/// is. Ends when either side closes or the client breaks the protocol.
pub async fn relay<C, S>(
    client: C,
    server: S,
    mut transcode: impl FnMut(Vec<Field>, &mut Vec<u8>) + Send,
) where
    C: AsyncRead + AsyncWrite + Send,
    S: AsyncRead + AsyncWrite + Send,
{
    let (mut cr, mut cw) = tokio::io::split(client);
    let (mut sr, mut sw) = tokio::io::split(server);
    let up = async {
        let mut decoder = Decoder::new(4096);
        let mut preface = [0u8; 24];
        cr.read_exact(&mut preface).await?;
        sw.write_all(&preface).await?;
        if &preface != PREFACE {
            // Not HTTP/2 with prior knowledge: pass it on for the server to refuse.
            tokio::io::copy(&mut cr, &mut sw).await?;
            return Ok::<(), std::io::Error>(());
        }
        let bad = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidData, e);
        // A header block in progress: stream, END_STREAM, fragments so far.
        let mut pending: Option<(u32, bool, Vec<u8>)> = None;
        loop {
            let mut h = [0u8; 9];
            cr.read_exact(&mut h).await?;
            let len = (usize::from(h[0]) << 16) | (usize::from(h[1]) << 8) | usize::from(h[2]);
            let (kind, flags) = (h[3], h[4]);
            let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
            let mut payload = vec![0u8; len];
            cr.read_exact(&mut payload).await?;
            let fragment = match kind {
                HEADERS => {
                    let mut p = &payload[..];
                    let mut pad = 0;
                    if flags & PADDED != 0 {
                        pad = usize::from(*p.first().ok_or_else(|| bad("empty HEADERS".into()))?);
                        p = &p[1..];
                    }
                    if flags & PRIORITY != 0 {
                        p = p.get(5..).ok_or_else(|| bad("short HEADERS".into()))?;
                    }
                    let end = p
                        .len()
                        .checked_sub(pad)
                        .ok_or_else(|| bad("HEADERS padding too long".into()))?;
                    pending = Some((stream, flags & END_STREAM != 0, Vec::new()));
                    p[..end].to_vec()
                }
                CONTINUATION if pending.is_some() => payload,
                _ => {
                    sw.write_all(&h).await?;
                    sw.write_all(&payload).await?;
                    continue;
                }
            };
            let (s, end_stream, block) = pending.as_mut().expect("set above");
            block.extend_from_slice(&fragment);
            if flags & END_HEADERS != 0 {
                let (s, end_stream) = (*s, *end_stream);
                let block = std::mem::take(block);
                pending = None;
                let fields = decoder.decode(&block).map_err(bad)?;
                let mut out = Vec::new();
                transcode(fields, &mut out);
                sw.write_all(&headers_frames(s, end_stream, &out)).await?;
            }
        }
    };
    let down = async {
        tokio::io::copy(&mut sr, &mut cw).await?;
        cw.shutdown().await
    };
    // Whichever direction ends first ends the connection.
    tokio::select! {
        _ = up => {}
        _ = down => {}
    }
}

/// The server side's transcoding: `:authority` fixed, all else as sent.
pub fn accept_any_authority(mut fields: Vec<Field>, out: &mut Vec<u8>) {
    for f in &mut fields {
        if f.name == b":authority" {
            if let Some(v) = fix_authority(&f.value) {
                f.value = v;
            }
        }
    }
    encode_literals(&fields, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hex(s: &str) -> Vec<u8> {
        let s: String = s.split_whitespace().collect();
        (0..s.len())
            .step_by(2)
            .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
            .collect()
    }

    #[test]
    fn rfc7541_c4_requests_with_huffman_and_the_dynamic_table() {
        assert_eq!(
            huffman_encode(b"www.example.com"),
            hex("f1e3 c2e5 f23a 6ba0 ab90 f4ff")
        );
        assert_eq!(huffman_decode(&hex("a8eb 1064 9cbf")).unwrap(), b"no-cache");
        let mut d = Decoder::new(4096);
        let first = d
            .decode(&hex("8286 8441 8cf1 e3c2 e5f2 3a6b a0ab 90f4 ff"))
            .unwrap();
        assert_eq!(
            first,
            vec![
                Field::new(":method", "GET"),
                Field::new(":scheme", "http"),
                Field::new(":path", "/"),
                Field::new(":authority", "www.example.com"),
            ]
        );
        // Index 62 (0xbe) is the :authority just inserted.
        let second = d.decode(&hex("8286 84be 5886 a8eb 1064 9cbf")).unwrap();
        assert_eq!(second[3], Field::new(":authority", "www.example.com"));
        assert_eq!(second[4], Field::new("cache-control", "no-cache"));
    }

    #[test]
    fn indexing_encoder_round_trips_and_refers_back() {
        let fields = vec![
            Field::new(":method", "POST"),
            Field::new(
                ":authority",
                "/var/lib/kubelet/device-plugins/cgpu-gpu-mem.sock",
            ),
            Field::new("content-type", "application/grpc"),
        ];
        let mut e = IndexingEncoder::new(4096);
        let mut d = Decoder::new(4096);
        let mut a = Vec::new();
        e.encode(&fields, &mut a);
        let mut b = Vec::new();
        e.encode(&fields, &mut b);
        assert_eq!(b, vec![0x80 | 64, 0x80 | 63, 0x80 | 62]);
        assert_eq!(d.decode(&a).unwrap(), fields);
        assert_eq!(d.decode(&b).unwrap(), fields);
    }

    #[test]
    fn socket_paths_become_localhost_and_hosts_stay() {
        assert_eq!(
            fix_authority(b"/var/lib/kubelet/device-plugins/x.sock"),
            Some(b"localhost".to_vec())
        );
        assert_eq!(fix_authority(b"localhost"), None);
        assert_eq!(fix_authority(b"[::1]:1"), None);
        let mut out = Vec::new();
        accept_any_authority(vec![Field::new(":authority", "/x.sock")], &mut out);
        assert_eq!(
            Decoder::new(0).decode(&out).unwrap(),
            vec![Field::new(":authority", "localhost")]
        );
    }
}
