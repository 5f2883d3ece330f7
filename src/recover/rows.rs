//! Reading rows of the capture one at a time (memory does not grow with the table), in rowid
//! order; after a damaged page, from the end backwards, so only the damaged range is missed and
//! it is reported.

use rusqlite::Connection;

use super::report::Unreadable;
use super::value::Val;
use super::RecoverError;

/// One row read: its rowid in the capture (when the table has one), its values, and for a
/// changed row the values the image had.
pub(crate) struct SourceRow {
    pub rowid: Option<i64>,
    pub values: Vec<Val>,
    pub before: Option<Vec<Val>>,
}

/// `SELECT <rowid>, <select> FROM <from> WHERE <filter> ORDER BY <rowid>` on the capture: the
/// first `ncols` selected values are the row, the next `nbefore` the image's row (a change).
pub(crate) struct Scan<'a> {
    pub conn: &'a Connection,
    pub select: String,
    pub from: String,
    pub filter: String,
    /// The expression of the rowid (`a.rowid`); `None` for a `WITHOUT ROWID` table.
    pub rowid: Option<String>,
    pub ncols: usize,
    pub nbefore: usize,
}

impl Scan<'_> {
    /// Calls `each` for every row SQLite can read; returns the ranges it could not. An error of
    /// `each` stops the scan and is returned.
    pub fn for_each(
        &self,
        each: &mut dyn FnMut(SourceRow) -> Result<(), RecoverError>,
    ) -> Result<Vec<Unreadable>, RecoverError> {
        let Some(rowid) = &self.rowid else {
            let sql = format!(
                "SELECT {} FROM {} WHERE {}",
                self.select, self.from, self.filter
            );
            let mut last = None;
            return Ok(match self.run(&sql, None, false, each, &mut last)? {
                Ok(()) => Vec::new(),
                Err(e) => vec![Unreadable {
                    after_rowid: None,
                    before_rowid: None,
                    at_most: None,
                    error: e.to_string(),
                }],
            });
        };
        let sql = format!(
            "SELECT {rowid}, {} FROM {} WHERE {} ORDER BY {rowid}",
            self.select, self.from, self.filter
        );
        let mut after = None;
        let Err(e) = self.run(&sql, None, true, each, &mut after)? else {
            return Ok(Vec::new());
        };
        let sql = format!(
            "SELECT {rowid}, {} FROM {} WHERE ({}) AND {rowid} > ?1 ORDER BY {rowid} DESC",
            self.select, self.from, self.filter
        );
        let mut before = None;
        let tail = self.run(
            &sql,
            Some(after.unwrap_or(i64::MIN)),
            true,
            each,
            &mut before,
        )?;
        if tail.is_ok() && after.is_some() {
            log::warn!(
                "hermes-guard: reading {} stopped after rowid {after:?} ({e}) but every later row \
                 read backwards",
                self.from
            );
            return Ok(Vec::new());
        }
        let damaged = tail.is_err();
        Ok(vec![Unreadable {
            after_rowid: after,
            before_rowid: if damaged { before } else { None },
            at_most: match (after, before) {
                (Some(a), Some(b)) if damaged => {
                    Some(b.saturating_sub(a).saturating_sub(1).max(0) as u64)
                }
                _ => None,
            },
            error: e.to_string(),
        }])
    }

    /// One pass: `Ok(Err)` is a read error of the capture (rows up to it were handed over and
    /// `last` holds the last rowid read), `Err` an error of `each`.
    fn run(
        &self,
        sql: &str,
        from_rowid: Option<i64>,
        with_rowid: bool,
        each: &mut dyn FnMut(SourceRow) -> Result<(), RecoverError>,
        last: &mut Option<i64>,
    ) -> Result<rusqlite::Result<()>, RecoverError> {
        let mut stmt = match self.conn.prepare(sql) {
            Ok(s) => s,
            Err(e) => return Ok(Err(e)),
        };
        let q = match from_rowid {
            Some(r) => stmt.query([r]),
            None => stmt.query([]),
        };
        let mut q = match q {
            Ok(q) => q,
            Err(e) => return Ok(Err(e)),
        };
        let off = usize::from(with_rowid);
        loop {
            let row = match q.next() {
                Ok(Some(r)) => r,
                Ok(None) => return Ok(Ok(())),
                Err(e) => return Ok(Err(e)),
            };
            let read = (|| -> rusqlite::Result<SourceRow> {
                let rowid = if with_rowid { row.get(0)? } else { None };
                let mut values = Vec::with_capacity(self.ncols);
                for i in 0..self.ncols {
                    values.push(Val::from(row.get_ref(off + i)?));
                }
                let before = if self.nbefore > 0 {
                    let mut b = Vec::with_capacity(self.nbefore);
                    for i in 0..self.nbefore {
                        b.push(Val::from(row.get_ref(off + self.ncols + i)?));
                    }
                    Some(b)
                } else {
                    None
                };
                Ok(SourceRow {
                    rowid,
                    values,
                    before,
                })
            })();
            match read {
                Ok(r) => {
                    if r.rowid.is_some() {
                        *last = r.rowid;
                    }
                    each(r)?;
                }
                Err(e) => return Ok(Err(e)),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn db() -> Connection {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(
            "CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);
             INSERT INTO t VALUES (3, 'c'), (1, 'a'), (2, 'b');",
        )
        .unwrap();
        conn
    }

    #[test]
    fn rows_come_one_at_a_time_in_rowid_order_with_the_filter_applied() {
        let conn = db();
        let scan = Scan {
            conn: &conn,
            select: "a.v, a.v || '!'".into(),
            from: "main.t AS a".into(),
            filter: "a.id > 1".into(),
            rowid: Some("a.rowid".into()),
            ncols: 1,
            nbefore: 1,
        };
        let mut seen = Vec::new();
        let unreadable = scan
            .for_each(&mut |row| {
                seen.push((row.rowid, row.values, row.before));
                Ok(())
            })
            .unwrap();
        assert!(unreadable.is_empty());
        assert_eq!(
            seen,
            vec![
                (
                    Some(2),
                    vec![Val::Text(b"b".to_vec())],
                    Some(vec![Val::Text(b"b!".to_vec())])
                ),
                (
                    Some(3),
                    vec![Val::Text(b"c".to_vec())],
                    Some(vec![Val::Text(b"c!".to_vec())])
                ),
            ]
        );
    }

    #[test]
    fn an_error_of_the_callback_stops_the_scan_and_is_returned() {
        let conn = db();
        let scan = Scan {
            conn: &conn,
            select: "a.v".into(),
            from: "main.t AS a".into(),
            filter: "1".into(),
            rowid: Some("a.rowid".into()),
            ncols: 1,
            nbefore: 0,
        };
        let mut calls = 0;
        let err = scan
            .for_each(&mut |_| {
                calls += 1;
                Err(RecoverError::BadTarget {
                    database: "x".into(),
                    why: "stop".into(),
                })
            })
            .unwrap_err();
        assert_eq!(calls, 1);
        assert!(err.to_string().contains("stop"));
    }

    #[test]
    fn a_query_that_cannot_run_is_reported_unreadable_not_returned() {
        let conn = db();
        let scan = Scan {
            conn: &conn,
            select: "a.v".into(),
            from: "main.no_such_table AS a".into(),
            filter: "1".into(),
            rowid: Some("a.rowid".into()),
            ncols: 1,
            nbefore: 0,
        };
        let unreadable = scan.for_each(&mut |_| Ok(())).unwrap();
        assert_eq!(unreadable.len(), 1);
        assert!(
            unreadable[0].error.contains("no such table"),
            "{unreadable:?}"
        );
    }
}
