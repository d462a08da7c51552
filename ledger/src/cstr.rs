//! Text in fixed C buffers (a ledger's UUID and container ids, NVML's
//! strings, `gethostname`): the bytes up to the first NUL, or the whole
//! buffer when it holds none. One helper for the interposer and the tools.

/// The bytes before the first NUL.
pub fn until_nul(bytes: &[u8]) -> &[u8] {
    let end = bytes.iter().position(|&b| b == 0).unwrap_or(bytes.len());
    &bytes[..end]
}

/// The text before the first NUL; `None` if it is not UTF-8 (for callers
/// that must tell a corrupt value from a good one).
pub fn text(bytes: &[u8]) -> Option<String> {
    std::str::from_utf8(until_nul(bytes))
        .ok()
        .map(str::to_owned)
}

/// The text before the first NUL, bad UTF-8 shown as `�`.
pub fn text_lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(until_nul(bytes)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nul_padded_text() {
        assert_eq!(text(b"GPU-1\0\0junk"), Some("GPU-1".into()));
        assert_eq!(text(b"full"), Some("full".into()));
        assert_eq!(text(b"\0"), Some(String::new()));
        assert_eq!(text(b"a\xffb\0"), None);
        assert_eq!(text_lossy(b"a\xffb\0c"), "a\u{fffd}b");
    }
}
