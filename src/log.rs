//! The interposer's logger: one line per event on stderr, level from
//! `CGPU_LOG`.
//!
//! The rest of the library logs through the `tracing` macros; this module is
//! the subscriber behind them, written for the place it runs in (inside
//! somebody else's process, at any moment of its life):
//!
//! - each event is formatted into a fixed buffer on the stack and written
//!   with one `write(2)` (lines from several threads or processes do not
//!   interleave; nothing is allocated, no lock is taken, no thread-local is
//!   touched), so it works in an exit handler, in a forked child and while
//!   other threads hold any lock;
//! - it never panics: a line longer than the buffer is cut (and ends in
//!   `…`), a failed write is ignored;
//! - levels only, no filter language: `error`, `warn` (default; `warning`
//!   is the same), `info`, `debug`, `trace`, `off`. Anything else falls
//!   back to `warn` and says so;
//! - errors are printed whatever the level, `off` included: an error means
//!   that cgpu cannot do what its environment asked (a bad variable, a
//!   ledger it cannot use, a missing driver), and that is never silent.
//!
//! Line format: `cgpu[<pid>] <level>: <message>` (a leading `cgpu: ` in the
//! message is dropped), then any structured fields as ` name=value`.

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU8, Ordering};

use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Level, Metadata, Subscriber};

/// Largest line written; longer ones are cut.
const LINE: usize = 1024;

/// The verbosity: 0 = off (errors only), 1 = error, 2 = warn, 3 = info,
/// 4 = debug, 5 = trace.
static LEVEL: AtomicU8 = AtomicU8::new(2);

fn rank(l: &Level) -> u8 {
    match *l {
        Level::ERROR => 1,
        Level::WARN => 2,
        Level::INFO => 3,
        Level::DEBUG => 4,
        Level::TRACE => 5,
    }
}

/// What a `CGPU_LOG` value means: `Some(rank)`, or `None` for a value that
/// is not a level (the caller falls back to `warn` and says so).
pub fn parse_level(v: &str) -> Option<u8> {
    match v.trim().to_ascii_lowercase().as_str() {
        "" | "warn" | "warning" => Some(2),
        "off" | "none" | "quiet" => Some(0),
        "error" => Some(1),
        "info" => Some(3),
        "debug" => Some(4),
        "trace" => Some(5),
        _ => None,
    }
}

/// Would an event at `level` be written now?
pub fn enabled(level: &Level) -> bool {
    *level == Level::ERROR || rank(level) <= LEVEL.load(Ordering::Relaxed)
}

/// A fixed buffer that fills up and then silently cuts.
struct Buf {
    b: [u8; LINE],
    n: usize,
    cut: bool,
}

impl Buf {
    fn new() -> Self {
        Buf {
            b: [0; LINE],
            n: 0,
            cut: false,
        }
    }
    fn bytes(&self) -> &[u8] {
        &self.b[..self.n]
    }
}

impl fmt::Write for Buf {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        // Keep 4 bytes for "…\n".
        let room = LINE - 4 - self.n;
        let s = s.as_bytes();
        let take = if s.len() <= room {
            s.len()
        } else {
            self.cut = true;
            // Cut on a UTF-8 boundary.
            let mut t = room;
            while t > 0 && (s[t] & 0xC0) == 0x80 {
                t -= 1;
            }
            t
        };
        self.b[self.n..self.n + take].copy_from_slice(&s[..take]);
        self.n += take;
        if self.cut {
            // Stop formatting: the rest would be dropped anyway.
            return Err(fmt::Error);
        }
        Ok(())
    }
}

/// Writes the message first, then the other fields as ` name=value`.
struct Fields<'a> {
    buf: &'a mut Buf,
    /// Set once the message is written (fields then follow it).
    message_done: bool,
    others: Buf,
}

impl Visit for Fields<'_> {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "message" {
            let _ = self
                .buf
                .write_str(value.strip_prefix("cgpu: ").unwrap_or(value));
            self.message_done = true;
        } else {
            let _ = write!(self.others, " {}={}", field.name(), value);
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        if field.name() == "message" {
            // The message is `format_args!(…)`, whose Debug is its Display.
            let mut m = Buf::new();
            let _ = write!(m, "{value:?}");
            let s = std::str::from_utf8(m.bytes()).unwrap_or("");
            let _ = self.buf.write_str(s.strip_prefix("cgpu: ").unwrap_or(s));
            if m.cut {
                self.buf.cut = true;
            }
            self.message_done = true;
        } else {
            let _ = write!(self.others, " {}={:?}", field.name(), value);
        }
    }
}

/// Format and write one line. Never panics, never allocates.
fn write_event(level: &Level, event: &Event<'_>) {
    let mut buf = Buf::new();
    // SAFETY: getpid has no preconditions and is async-signal-safe; it is
    // read for each line so that a forked child prints its own pid.
    let pid = unsafe { libc::getpid() };
    let name = match *level {
        Level::ERROR => "error",
        Level::WARN => "warning",
        Level::INFO => "info",
        Level::DEBUG => "debug",
        Level::TRACE => "trace",
    };
    let _ = write!(buf, "cgpu[{pid}] {name}: ");
    let mut v = Fields {
        buf: &mut buf,
        message_done: false,
        others: Buf::new(),
    };
    event.record(&mut v);
    let others = v.others;
    if !buf.cut {
        let s = std::str::from_utf8(others.bytes()).unwrap_or("");
        let _ = buf.write_str(s);
        if others.cut {
            buf.cut = true;
        }
    }
    if buf.cut {
        buf.b[buf.n..buf.n + 3].copy_from_slice("…".as_bytes());
        buf.n += 3;
    }
    buf.b[buf.n] = b'\n';
    buf.n += 1;
    write_stderr(buf.bytes());
}

/// One `write(2)` to fd 2 (retried on EINTR and short writes); errors ignored.
pub fn write_stderr(mut b: &[u8]) {
    while !b.is_empty() {
        // SAFETY: `b` is a valid readable buffer of its length.
        let n = unsafe { libc::write(2, b.as_ptr().cast(), b.len()) };
        if n < 0 {
            if std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            return;
        }
        if n == 0 {
            return;
        }
        b = &b[n as usize..];
    }
}

/// The subscriber. Spans are not recorded (the library opens none).
struct Logger;

impl Subscriber for Logger {
    fn enabled(&self, metadata: &Metadata<'_>) -> bool {
        metadata.is_event() && enabled(metadata.level())
    }
    fn max_level_hint(&self) -> Option<tracing::level_filters::LevelFilter> {
        use tracing::level_filters::LevelFilter;
        Some(match LEVEL.load(Ordering::Relaxed) {
            0 | 1 => LevelFilter::ERROR,
            2 => LevelFilter::WARN,
            3 => LevelFilter::INFO,
            4 => LevelFilter::DEBUG,
            _ => LevelFilter::TRACE,
        })
    }
    fn new_span(&self, _: &Attributes<'_>) -> Id {
        Id::from_u64(1)
    }
    fn record(&self, _: &Id, _: &Record<'_>) {}
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let level = *event.metadata().level();
        if !enabled(&level) {
            return;
        }
        // A Debug impl of a field could panic; never let that cross into
        // the host program (this runs inside hooks and exit handlers).
        let _ =
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| write_event(&level, event)));
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

static INIT: std::sync::Once = std::sync::Once::new();

/// Install the logger, level from `CGPU_LOG`. Lazy (called from the first
/// hooked call, never from a library constructor); idempotent. A value that
/// is not a level is reported (at error level, so always shown) and `warn`
/// is used.
pub fn init() {
    INIT.call_once(|| {
        let raw = std::env::var_os("CGPU_LOG").map(|v| v.to_string_lossy().into_owned());
        let bad = match raw.as_deref().map(parse_level) {
            None => None,
            Some(Some(l)) => {
                LEVEL.store(l, Ordering::Relaxed);
                None
            }
            Some(None) => raw,
        };
        // Fails only if the host program installed its own global
        // subscriber first (a Rust program using tracing): then ours is not
        // used and its subscriber gets our events.
        let _ = tracing::subscriber::set_global_default(Logger);
        if let Some(v) = bad {
            tracing::error!(
                "bad environment: CGPU_LOG='{v}' is not a level (error, warn, info, debug, trace, off); using 'warn'"
            );
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(parse_level(""), Some(2));
        assert_eq!(parse_level("WARNING"), Some(2));
        assert_eq!(parse_level(" debug "), Some(4));
        assert_eq!(parse_level("off"), Some(0));
        assert_eq!(parse_level("cgpu=debug"), None);
        assert_eq!(parse_level("verbose"), None);
    }

    #[test]
    fn buffer_cuts_on_char_boundary_and_never_overflows() {
        let mut b = Buf::new();
        let long = "é".repeat(LINE);
        assert!(write!(b, "{long}").is_err());
        assert!(b.cut);
        assert!(b.n <= LINE - 4);
        assert!(std::str::from_utf8(b.bytes()).is_ok());
        assert!(write!(b, "more").is_err());
    }
}
