//! SQLite's variable-length integers: 1 to 9 bytes, big-endian; each of the first eight bytes
//! gives its low 7 bits and continues while its high bit is set, and a ninth byte gives all 8 of
//! its bits (so 9 bytes hold any 64-bit value).

/// Reads the varint at the start of `bytes`: its value and how many bytes it took, or `None` if
/// `bytes` ends before the varint does.
pub(crate) fn read_varint(bytes: &[u8]) -> Option<(u64, usize)> {
    let mut value: u64 = 0;
    for (i, &byte) in bytes.iter().take(9).enumerate() {
        if i == 8 {
            return Some(((value << 8) | u64::from(byte), 9));
        }
        value = (value << 7) | u64::from(byte & 0x7f);
        if byte < 0x80 {
            return Some((value, i + 1));
        }
    }
    None
}

/// Writes `value` as SQLite does (the shortest form).
pub(crate) fn write_varint(value: u64, out: &mut Vec<u8>) {
    if value > 0x00ff_ffff_ffff_ffff {
        // Nine bytes: eight of 7 bits, then the low 8 bits whole.
        let high = value >> 8;
        for i in (0..8).rev() {
            out.push(0x80 | ((high >> (7 * i)) & 0x7f) as u8);
        }
        out.push((value & 0xff) as u8);
        return;
    }
    let mut groups = Vec::new();
    let mut v = value;
    loop {
        groups.push((v & 0x7f) as u8);
        v >>= 7;
        if v == 0 {
            break;
        }
    }
    let last = groups.len() - 1;
    for (i, g) in groups.iter().rev().enumerate() {
        out.push(if i < last { g | 0x80 } else { *g });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_encodings_read_back() {
        assert_eq!(read_varint(&[0x00]), Some((0, 1)));
        assert_eq!(read_varint(&[0x7f]), Some((127, 1)));
        assert_eq!(read_varint(&[0x81, 0x00]), Some((128, 2)));
        assert_eq!(read_varint(&[0xff, 0x7f, 0xaa]), Some((0x3fff, 2)));
        // The ninth byte contributes 8 bits: nine 0xff bytes are u64::MAX (rowid -1).
        assert_eq!(read_varint(&[0xff; 9]), Some((u64::MAX, 9)));
        assert_eq!(read_varint(&[0xff; 12]), Some((u64::MAX, 9)));
    }

    #[test]
    fn a_cut_off_varint_is_none() {
        assert_eq!(read_varint(&[]), None);
        assert_eq!(read_varint(&[0x80]), None);
        assert_eq!(read_varint(&[0xff; 8]), None);
    }

    #[test]
    fn boundaries_round_trip() {
        for v in [
            0u64,
            127,
            128,
            16383,
            16384,
            (1 << 56) - 1,
            1 << 56,
            u64::MAX - 1,
            u64::MAX,
        ] {
            let mut buf = Vec::new();
            write_varint(v, &mut buf);
            assert_eq!(read_varint(&buf), Some((v, buf.len())), "{v:#x}");
        }
    }
}
