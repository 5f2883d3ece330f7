//! Property tests (`proptest`) of the decoder: random rows (integers of every width, reals with
//! -0.0 and NaN, text, blobs, NULLs, values long enough to overflow, rowids up to the 9-byte
//! varints) written by SQLite into a rowid table and a `WITHOUT ROWID` table decode to exactly
//! what `SELECT` returns; and no bytes at all — random pages, random records, real databases
//! with random bytes changed — make the decoder panic. Case counts are bounded so the module
//! runs in a few seconds under `cargo test`.

use std::sync::OnceLock;

use proptest::prelude::*;

use super::tests::{select, Fixture};
use super::varint::{read_varint, write_varint};
use super::*;
use crate::recover::value::{same_row, Val};

fn config(cases: u32) -> ProptestConfig {
    ProptestConfig {
        cases,
        // No regression files in the source tree: a failure prints its minimal input.
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

/// An integer of each serial width's range, with the widths' edges and 0 and 1 (serial types 8
/// and 9) likely.
fn int() -> impl Strategy<Value = i64> {
    prop_oneof![
        Just(0i64),
        Just(1),
        -128i64..128,
        -32768i64..32768,
        -(1i64 << 23)..(1 << 23),
        any::<i32>().prop_map(i64::from),
        -(1i64 << 47)..(1 << 47),
        any::<i64>(),
        prop::sample::select(vec![
            127i64,
            128,
            -129,
            32767,
            32768,
            (1 << 23) - 1,
            1 << 23,
            i32::MAX as i64 + 1,
            (1 << 47) - 1,
            1 << 47,
            i64::MAX,
            i64::MIN,
        ]),
    ]
}

/// A value of any storage class; long texts and blobs now and then, to overflow.
fn value() -> impl Strategy<Value = Val> {
    prop_oneof![
        2 => Just(Val::Null),
        4 => int().prop_map(Val::Int),
        1 => Just(Val::Real(-0.0)),
        1 => Just(Val::Real(f64::NAN)),
        2 => any::<f64>().prop_map(Val::Real),
        2 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Val::Text),
        2 => prop::collection::vec(any::<u8>(), 0..40).prop_map(Val::Blob),
        1 => (500usize..70_000, any::<u8>(), any::<bool>()).prop_map(|(len, seed, text)| {
            let bytes: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(31) ^ seed).collect();
            if text {
                Val::Text(bytes)
            } else {
                Val::Blob(bytes)
            }
        }),
    ]
}

/// A row: an explicit rowid (any, up to the 9-byte varints) or SQLite's next, and three values.
fn row() -> impl Strategy<Value = (Option<i64>, [Val; 3])> {
    (
        prop::option::weighted(0.3, any::<i64>()),
        [value(), value(), value()],
    )
}

/// Page sizes and reserved bytes: the smallest usable page (480 bytes) among them.
fn geometry() -> impl Strategy<Value = (u32, u8)> {
    prop::sample::select(vec![
        (512u32, 0u8),
        (512, 32),
        (1024, 0),
        (4096, 0),
        (4096, 12),
    ])
}

proptest! {
    #![proptest_config(config(24))]

    #[test]
    fn random_rows_decode_as_sqlite_reads_them(
        (page_size, reserved) in geometry(),
        rows in prop::collection::vec(row(), 0..40),
    ) {
        let f = Fixture::new(page_size, reserved, |conn| {
            conn.execute_batch(
                "CREATE TABLE t(a, b, c);
                 CREATE TABLE w(k INTEGER PRIMARY KEY, a, b, c) WITHOUT ROWID;",
            )
            .unwrap();
            for (i, (rowid, [a, b, c])) in rows.iter().enumerate() {
                conn.execute(
                    "INSERT OR REPLACE INTO t(rowid, a, b, c) VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![rowid, a, b, c],
                )
                .unwrap();
                conn.execute(
                    "INSERT INTO w VALUES (?1, ?2, ?3, ?4)",
                    rusqlite::params![i as i64, a, b, c],
                )
                .unwrap();
            }
        });
        let rows = table_rows(f.root("t"), &f.geometry, f.pages()).unwrap().entries;
        let want = select(&f.conn, "SELECT rowid, a, b, c FROM t ORDER BY rowid");
        prop_assert_eq!(rows.len(), want.len());
        for (row, want) in rows.iter().zip(&want) {
            let mut got = vec![Val::Int(row.rowid)];
            got.extend(row.values.iter().cloned());
            prop_assert!(same_row(&got, want), "{:?} != {:?}", got, want);
        }
        let keys = index_records(f.root("w"), &f.geometry, f.pages()).unwrap().entries;
        let want = select(&f.conn, "SELECT k, a, b, c FROM w ORDER BY k");
        prop_assert_eq!(keys.len(), want.len());
        for (got, want) in keys.iter().zip(&want) {
            prop_assert!(same_row(got, want), "{:?} != {:?}", got, want);
        }
        f.check_coverage();
    }
}

/// A page of random bytes, its type byte and cell count often plausible so that the cell parser
/// is reached, not only the header checks.
fn page_bytes() -> impl Strategy<Value = (u32, Vec<u8>)> {
    (
        prop::sample::select(vec![1u32, 2, 3]),
        prop::collection::vec(any::<u8>(), 512),
        prop::sample::select(vec![0x02u8, 0x05, 0x0a, 0x0d, 0x00, 0xff]),
        0u16..40,
        any::<bool>(),
    )
        .prop_map(|(pgno, mut bytes, kind, cells, plausible)| {
            if plausible {
                let hdr = if pgno == 1 { 100 } else { 0 };
                bytes[hdr] = kind;
                bytes[hdr + 3..hdr + 5].copy_from_slice(&cells.to_be_bytes());
                bytes[hdr + 5..hdr + 7].copy_from_slice(&200u16.to_be_bytes());
            }
            (pgno, bytes)
        })
}

/// A database SQLite wrote at 512-byte pages, with interior pages of both tree formats and
/// overflow chains; made once for the damage tests.
fn sample_db() -> &'static Vec<u8> {
    static DB: OnceLock<Vec<u8>> = OnceLock::new();
    DB.get_or_init(|| {
        let f = Fixture::new(512, 0, |conn| {
            conn.execute_batch(
                "CREATE TABLE t(a, b); CREATE INDEX t_b ON t(b);
                 CREATE TABLE w(k PRIMARY KEY, v) WITHOUT ROWID;",
            )
            .unwrap();
            for i in 0..120i64 {
                let v = if i % 20 == 3 {
                    Val::Blob(vec![i as u8; 1500 + i as usize])
                } else {
                    Val::Text(format!("value {i}").into_bytes())
                };
                conn.execute(
                    "INSERT INTO t VALUES (?1, ?2)",
                    rusqlite::params![i * 1_000_003, v],
                )
                .unwrap();
                conn.execute("INSERT INTO w VALUES (?1, ?2)", rusqlite::params![i, v])
                    .unwrap();
            }
        });
        f.bytes.clone()
    })
}

proptest! {
    #![proptest_config(config(512))]

    #[test]
    fn varints_round_trip(v in any::<u64>(), tail in prop::collection::vec(any::<u8>(), 0..4)) {
        let mut buf = Vec::new();
        write_varint(v, &mut buf);
        let len = buf.len();
        buf.extend(tail);
        prop_assert_eq!(read_varint(&buf), Some((v, len)));
    }

    #[test]
    fn arbitrary_varints_and_records_never_panic(
        bytes in prop::collection::vec(any::<u8>(), 0..64),
    ) {
        if let Some((_, n)) = read_varint(&bytes) {
            prop_assert!((1..=9).contains(&n) && n <= bytes.len());
        }
        let _ = decode_record(&bytes);
    }

    #[test]
    fn arbitrary_pages_never_panic(
        (pgno, bytes) in page_bytes(),
        pool in prop::collection::vec(prop::collection::vec(any::<u8>(), 512), 0..3),
    ) {
        let geometry = DbGeometry::new(512, 0).unwrap();
        // Overflow pages come from a small pool of random pages, so chains loop, end or vanish.
        let lookup = |p: u32| pool.get(p as usize % 4).map(Vec::as_slice);
        if let Ok(page) = decode_page(&bytes, pgno, &geometry) {
            for cell in &page.cells {
                if let Some(payload) = cell.payload() {
                    if let Ok(record) = payload.assemble(&geometry, lookup) {
                        prop_assert_eq!(record.len() as u64, u64::from(payload.total));
                        let _ = decode_record(&record);
                    }
                }
            }
        }
        let _ = table_rows(pgno, &geometry, |p| (p == pgno).then_some(bytes.as_slice()));
        let _ = index_records(pgno, &geometry, |p| (p == pgno).then_some(bytes.as_slice()));
    }
}

proptest! {
    #![proptest_config(config(96))]

    #[test]
    fn damaged_databases_never_panic(
        damage in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..12),
    ) {
        let mut bytes = sample_db().clone();
        for (at, byte) in damage {
            // Past the 100-byte database header, so the geometry stays what the pages were cut to.
            let i = 100 + at.index(bytes.len() - 100);
            bytes[i] ^= byte.max(1);
        }
        let geometry = DbGeometry::new(512, 0).unwrap();
        let pages = |p: u32| {
            let start = (p as usize).checked_sub(1)? * 512;
            bytes.get(start..start + 512)
        };
        for root in 1..=(bytes.len() / 512) as u32 {
            let _ = table_rows(root, &geometry, pages);
            let _ = index_records(root, &geometry, pages);
        }
    }
}
