//! Bytes that others chose — a build's file names, its messages over the
//! bridge, its output — made safe to show on an operator's terminal.
//!
//! A terminal acts on what it is sent: an escape sequence can set the
//! clipboard (OSC 52), move the cursor over earlier lines, retitle the
//! window; a carriage return can overwrite a line with one that looks like
//! fhsx's own. So nothing a build chose reaches a message unescaped.

use std::borrow::Cow;

/// `bytes` as text safe to print on a terminal: valid UTF-8 but control
/// characters, which are written `\xNN` (as is `\` itself, `\\`); invalid
/// UTF-8 is written `\xNN` byte by byte. Names a build chose go through
/// this before any message shows them: an escape sequence in a file name
/// must not reach an operator's terminal as one.
pub fn escaped(bytes: &[u8]) -> String {
    let mut out = String::with_capacity(bytes.len());
    for chunk in bytes.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '\\' => out.push_str("\\\\"),
                c if c.is_control() => {
                    let mut b = [0; 4];
                    for byte in c.encode_utf8(&mut b).bytes() {
                        push_hex(&mut out, byte);
                    }
                }
                c => out.push(c),
            }
        }
        for &b in chunk.invalid() {
            push_hex(&mut out, b);
        }
    }
    out
}

/// `\xNN` for the byte `b`.
fn hex(b: u8) -> [u8; 4] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    [
        b'\\',
        b'x',
        HEX[usize::from(b >> 4)],
        HEX[usize::from(b & 15)],
    ]
}

/// [`hex`] of `b`, onto a string.
fn push_hex(out: &mut String, b: u8) {
    out.extend(hex(b).map(char::from));
}

/// The build's own output as it may reach a terminal live: every byte as
/// it is but the C0 controls other than tab and newline, and DEL, which are
/// written `\xNN`. Byte by byte, so a stream can be cut anywhere. (The
/// log the store keeps holds the bytes as the build wrote them.)
pub fn terminal_safe(bytes: &[u8]) -> Cow<'_, [u8]> {
    let unsafe_byte = |b: u8| (b < 0x20 && b != b'\t' && b != b'\n') || b == 0x7f;
    if !bytes.iter().copied().any(unsafe_byte) {
        return Cow::Borrowed(bytes);
    }
    // Binary output (a build piping /dev/zero to stderr) is all controls:
    // four bytes out for each, with no allocation per byte.
    let mut out = Vec::with_capacity(bytes.len() + bytes.len() / 4);
    for &b in bytes {
        if unsafe_byte(b) {
            out.extend_from_slice(&hex(b));
        } else {
            out.push(b);
        }
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaped_names_cannot_drive_a_terminal() {
        assert_eq!(escaped(b"plain/\xc3\xa9t\xc3\xa9"), "plain/été");
        assert_eq!(
            escaped(b"\x1b]52;c;aGk=\x07\\n\xff"),
            "\\x1b]52;c;aGk=\\x07\\\\n\\xff"
        );
        assert_eq!(escaped("\u{9b}2J".as_bytes()), "\\xc2\\x9b2J");
    }

    #[test]
    fn live_output_keeps_lines_and_loses_controls() {
        assert_eq!(
            &*terminal_safe(b"make: ok\n\tcc x.c\n"),
            b"make: ok\n\tcc x.c\n"
        );
        assert_eq!(
            &*terminal_safe(b"\x1b[2J\rfhsx: forged\n"),
            b"\\x1b[2J\\x0dfhsx: forged\n"
        );
    }
}
