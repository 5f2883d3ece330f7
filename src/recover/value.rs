//! A value as SQLite stores it, compared exactly (type and bytes; reals bit for bit).

use rusqlite::types::{ToSql, ToSqlOutput, ValueRef};

/// A value; text kept as bytes (it need not be UTF-8).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Val {
    Null,
    Int(i64),
    Real(f64),
    Text(Vec<u8>),
    Blob(Vec<u8>),
}

impl From<ValueRef<'_>> for Val {
    fn from(v: ValueRef<'_>) -> Val {
        match v {
            ValueRef::Null => Val::Null,
            ValueRef::Integer(i) => Val::Int(i),
            ValueRef::Real(f) => Val::Real(f),
            ValueRef::Text(t) => Val::Text(t.to_vec()),
            ValueRef::Blob(b) => Val::Blob(b.to_vec()),
        }
    }
}

impl ToSql for Val {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(ToSqlOutput::Borrowed(match self {
            Val::Null => ValueRef::Null,
            Val::Int(i) => ValueRef::Integer(*i),
            Val::Real(f) => ValueRef::Real(*f),
            Val::Text(t) => ValueRef::Text(t),
            Val::Blob(b) => ValueRef::Blob(b),
        }))
    }
}

impl std::fmt::Display for Val {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Val::Null => f.write_str("NULL"),
            Val::Int(i) => write!(f, "{i}"),
            Val::Real(r) => write!(f, "{r}"),
            Val::Text(t) => write!(f, "{:?}", String::from_utf8_lossy(t)),
            Val::Blob(b) => write!(f, "x'{}'", crate::paths::hex(b)),
        }
    }
}

/// Text as stored in a database of `text_encoding` (page 1's offset 56: 1 UTF-8, 2 UTF-16le,
/// 3 UTF-16be), as UTF-8 bytes, the way `SELECT` hands it to a UTF-8 caller. UTF-8 text is
/// returned as it is, valid or not; `None`: UTF-16 text that does not decode.
pub(crate) fn utf8_text(stored: &[u8], text_encoding: u32) -> Option<Vec<u8>> {
    let unit = |c: &[u8]| match text_encoding {
        2 => u16::from_le_bytes([c[0], c[1]]),
        _ => u16::from_be_bytes([c[0], c[1]]),
    };
    match text_encoding {
        2 | 3 => {
            let units: Vec<u16> = stored.chunks_exact(2).map(unit).collect();
            String::from_utf16(&units).ok().map(String::into_bytes)
        }
        _ => Some(stored.to_vec()),
    }
}

/// Exactly the same value: same storage class and bytes; reals bit for bit (so `-0.0` differs
/// from `0.0`, and a NaN equals itself).
pub(crate) fn same_value(a: &Val, b: &Val) -> bool {
    match (a, b) {
        (Val::Real(x), Val::Real(y)) => x.to_bits() == y.to_bits(),
        _ => a == b,
    }
}

/// Two rows with exactly the same values.
pub(crate) fn same_row(a: &[Val], b: &[Val]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| same_value(x, y))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_compare_by_class_and_bits_not_by_sql_equality() {
        assert!(!same_value(&Val::Int(1), &Val::Real(1.0)));
        assert!(!same_value(
            &Val::Text(b"a".to_vec()),
            &Val::Blob(b"a".to_vec())
        ));
        assert!(!same_value(&Val::Real(0.0), &Val::Real(-0.0)));
        assert!(same_value(&Val::Real(f64::NAN), &Val::Real(f64::NAN)));
        assert!(same_row(
            &[Val::Null, Val::Text(b"x".to_vec())],
            &[Val::Null, Val::Text(b"x".to_vec())]
        ));
        assert!(!same_row(&[Val::Null], &[Val::Null, Val::Null]));
    }

    #[test]
    fn utf16_text_reads_as_utf8_and_utf8_stays_as_it_is() {
        let le: Vec<u8> = "ü✓".encode_utf16().flat_map(u16::to_le_bytes).collect();
        let be: Vec<u8> = "ü✓".encode_utf16().flat_map(u16::to_be_bytes).collect();
        assert_eq!(utf8_text(&le, 2), Some("ü✓".as_bytes().to_vec()));
        assert_eq!(utf8_text(&be, 3), Some("ü✓".as_bytes().to_vec()));
        assert_eq!(utf8_text(&[0xff, 0xfe], 1), Some(vec![0xff, 0xfe]));
        assert_eq!(utf8_text(&[0x00, 0xd8], 2), None, "a lone surrogate");
    }
}
