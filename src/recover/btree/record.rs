//! The record format: a header (its own size as a varint, then one serial type per column) and a
//! body (the values, in column order). Serial types, as `sqlite3VdbeSerialGet` reads them:
//! 0 NULL; 1–6 big-endian two's-complement integers of 1, 2, 3, 4, 6 and 8 bytes; 7 a big-endian
//! IEEE 754 double (a NaN reads as NULL, as SQLite reads it); 8 and 9 the integers 0 and 1 with no
//! body bytes; 10 and 11 reserved (an error here: SQLite never writes them to a file); N ≥ 12
//! even a blob of (N − 12)/2 bytes, odd a text of (N − 13)/2 bytes (kept as bytes, in the
//! database's text encoding).
//!
//! A record is taken as SQLite writes it: the header's size is exact and the values end exactly at
//! the record's end; anything else is an error (stricter than SQLite's reader, which ignores
//! trailing bytes, so that a page of another table's shape is less likely to parse by chance).

use super::varint::read_varint;
use super::RecordError;
use crate::recover::value::Val;

/// The values of a whole record (its payload, overflow included).
pub(crate) fn decode_record(record: &[u8]) -> Result<Vec<Val>, RecordError> {
    let len = record.len();
    let (header_size, varint) = read_varint(record).ok_or(RecordError::HeaderSizeTruncated)?;
    if header_size < varint as u64 || header_size > len as u64 {
        return Err(RecordError::HeaderSize {
            size: header_size,
            len,
            varint,
        });
    }
    let header_end = header_size as usize;
    let mut at = varint;
    let mut body = header_end;
    let mut values = Vec::new();
    while at < header_end {
        let (serial_type, n) = record.get(at..header_end).and_then(read_varint).ok_or(
            RecordError::SerialTypeTruncated {
                offset: at,
                header: header_end,
            },
        )?;
        at += n;
        let column = values.len();
        let need = body_len(serial_type).ok_or(RecordError::ReservedSerialType {
            column,
            serial_type,
        })?;
        let truncated = RecordError::BodyTruncated {
            column,
            need,
            offset: body,
            len,
        };
        if need > (len - body) as u64 {
            return Err(truncated);
        }
        let bytes = record.get(body..body + need as usize).ok_or(truncated)?;
        body += bytes.len();
        values.push(value(serial_type, bytes));
    }
    if body != len {
        return Err(RecordError::TrailingBytes { end: body, len });
    }
    Ok(values)
}

/// The body bytes of a serial type, or `None` for the reserved 10 and 11.
pub(crate) fn body_len(serial_type: u64) -> Option<u64> {
    Some(match serial_type {
        0 | 8 | 9 => 0,
        1..=4 => serial_type,
        5 => 6,
        6 | 7 => 8,
        10 | 11 => return None,
        n => (n - 12) / 2,
    })
}

/// The value of a serial type whose body is `bytes` (exactly `body_len` long).
fn value(serial_type: u64, bytes: &[u8]) -> Val {
    match serial_type {
        0 => Val::Null,
        1..=6 => Val::Int(signed_be(bytes)),
        7 => {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(bytes);
            let real = f64::from_be_bytes(raw);
            if real.is_nan() {
                Val::Null
            } else {
                Val::Real(real)
            }
        }
        8 => Val::Int(0),
        9 => Val::Int(1),
        n if n % 2 == 0 => Val::Blob(bytes.to_vec()),
        _ => Val::Text(bytes.to_vec()),
    }
}

/// A big-endian two's-complement integer of 1 to 8 bytes, sign-extended.
fn signed_be(bytes: &[u8]) -> i64 {
    let negative = bytes.first().is_some_and(|b| b & 0x80 != 0);
    let mut v: u64 = if negative { u64::MAX } else { 0 };
    for &b in bytes {
        v = (v << 8) | u64::from(b);
    }
    v as i64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::recover::btree::varint::write_varint;

    /// A record of (serial type, body bytes) pairs.
    fn record(columns: &[(u64, &[u8])]) -> Vec<u8> {
        let mut types = Vec::new();
        for (t, _) in columns {
            write_varint(*t, &mut types);
        }
        // Header sizes below 127 take one byte.
        let mut out = vec![(types.len() + 1) as u8];
        out.extend(types);
        for (_, body) in columns {
            out.extend_from_slice(body);
        }
        out
    }

    #[test]
    fn every_serial_type_reads_as_sqlite_reads_it() {
        let rec = record(&[
            (0, b""),
            (1, &[0xff]),
            (2, &[0x80, 0x00]),
            (3, &[0x7f, 0xff, 0xff]),
            (4, &[0xff, 0xff, 0xff, 0xfe]),
            (5, &[0x80, 0, 0, 0, 0, 0]),
            (6, &[0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff]),
            (7, &(-0.0f64).to_be_bytes()),
            (7, &f64::NAN.to_be_bytes()),
            (8, b""),
            (9, b""),
            (12, b""),
            (13, b""),
            (18, b"abc"),
            (19, b"\xffx\x00"),
        ]);
        let vals = decode_record(&rec).unwrap();
        let want = [
            Val::Null,
            Val::Int(-1),
            Val::Int(-32768),
            Val::Int(0x7f_ffff),
            Val::Int(-2),
            Val::Int(-(1 << 47)),
            Val::Int(i64::MAX),
            Val::Real(-0.0),
            Val::Null,
            Val::Int(0),
            Val::Int(1),
            Val::Blob(vec![]),
            Val::Text(vec![]),
            Val::Blob(b"abc".to_vec()),
            Val::Text(b"\xffx\x00".to_vec()),
        ];
        assert!(
            crate::recover::value::same_row(&vals, &want),
            "{vals:?} != {want:?}"
        );
    }

    #[test]
    fn an_empty_record_has_no_columns() {
        assert_eq!(decode_record(&[1]), Ok(vec![]));
    }

    #[test]
    fn malformed_records_are_typed_errors() {
        assert_eq!(decode_record(&[]), Err(RecordError::HeaderSizeTruncated));
        assert_eq!(
            decode_record(&[0x80]),
            Err(RecordError::HeaderSizeTruncated)
        );
        assert_eq!(
            decode_record(&[0]),
            Err(RecordError::HeaderSize {
                size: 0,
                len: 1,
                varint: 1
            })
        );
        assert_eq!(
            decode_record(&[5, 1]),
            Err(RecordError::HeaderSize {
                size: 5,
                len: 2,
                varint: 1
            })
        );
        // A serial type whose varint crosses the header's end.
        assert_eq!(
            decode_record(&[2, 0x81, 0x00]),
            Err(RecordError::SerialTypeTruncated {
                offset: 1,
                header: 2
            })
        );
        assert_eq!(
            decode_record(&record(&[(0, b""), (10, b"")])),
            Err(RecordError::ReservedSerialType {
                column: 1,
                serial_type: 10
            })
        );
        assert_eq!(
            decode_record(&record(&[(11, b"")])),
            Err(RecordError::ReservedSerialType {
                column: 0,
                serial_type: 11
            })
        );
        assert_eq!(
            decode_record(&[2, 4, 0, 0]),
            Err(RecordError::BodyTruncated {
                column: 0,
                need: 4,
                offset: 2,
                len: 4
            })
        );
        // A huge text length never allocates or overflows.
        let mut rec = vec![10];
        write_varint(u64::MAX, &mut rec);
        assert!(matches!(
            decode_record(&rec),
            Err(RecordError::BodyTruncated { column: 0, .. })
        ));
        assert_eq!(
            decode_record(&[2, 1, 7, 0]),
            Err(RecordError::TrailingBytes { end: 3, len: 4 })
        );
    }
}
