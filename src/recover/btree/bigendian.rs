//! The fixed-width big-endian integers of page headers and cells.

/// Reads a big-endian u16 at `at`, or `None` past the end.
pub(super) fn be_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

/// Reads a big-endian u32 at `at`, or `None` past the end.
pub(super) fn be_u32(bytes: &[u8], at: usize) -> Option<u32> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}
