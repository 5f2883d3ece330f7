//! Schema objects that exist only in the capture: created in the live database before the
//! rows, when the live database is empty (a fresh database whose first tables lived only in
//! the lost WAL), or when the captured generation created them itself (they are not in its main
//! image) and the live database has nothing of that name.

use std::collections::HashSet;

use rusqlite::Connection;

use super::schema::is_internal;
use super::RecoverError;

/// One object of `sqlite_master`.
#[derive(Debug, Clone)]
pub(crate) struct Object {
    pub kind: String,
    pub name: String,
    pub table: String,
    pub sql: String,
}

/// Every object of the database `db` of `conn` recovery may create, in creation order: no
/// SQLite-internal object, no automatic index, no shadow table of a virtual table.
pub(crate) fn objects(conn: &Connection, db: &str) -> rusqlite::Result<Vec<Object>> {
    let db = super::schema::quote(db);
    let shadows: HashSet<String> = {
        let mut stmt = conn.prepare(&format!(
            "SELECT lower(name) FROM pragma_table_list WHERE schema = {db} AND type = 'shadow'"
        ))?;
        let rows = stmt.query_map([], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT type, name, tbl_name, sql FROM {db}.sqlite_master WHERE sql IS NOT NULL \
         ORDER BY rowid"
    ))?;
    let all = stmt
        .query_map([], |r| {
            Ok(Object {
                kind: r.get(0)?,
                name: r.get(1)?,
                table: r.get(2)?,
                sql: r.get(3)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let virtuals: Vec<String> = all
        .iter()
        .filter(|o| o.kind == "table" && o.sql.to_ascii_lowercase().starts_with("create virtual"))
        .map(|o| format!("{}_", o.name.to_lowercase()))
        .collect();
    Ok(all
        .into_iter()
        .filter(|o| !is_internal(&o.name) && !is_internal(&o.table))
        .filter(|o| {
            let lower = o.name.to_lowercase();
            !(o.kind == "table"
                && (shadows.contains(&lower) || virtuals.iter().any(|v| lower.starts_with(v))))
        })
        .collect())
}

/// The objects of the capture (`main` of `source`) to create in `target`: all of them when
/// `target` is empty; otherwise those the captured image (`pre`, when `image` is set) did not
/// have. Either way only names the live database does not use.
pub(crate) fn to_create(
    source: &Connection,
    target: &Connection,
    live_empty: bool,
    image: bool,
) -> rusqlite::Result<Vec<Object>> {
    if !live_empty && !image {
        return Ok(Vec::new());
    }
    let live: HashSet<String> = objects(target, "main")?
        .into_iter()
        .map(|o| o.name.to_lowercase())
        .collect();
    let in_image: HashSet<String> = if image && !live_empty {
        objects(source, "pre")?
            .into_iter()
            .map(|o| o.name.to_lowercase())
            .collect()
    } else {
        HashSet::new()
    };
    Ok(objects(source, "main")?
        .into_iter()
        .filter(|o| {
            let lower = o.name.to_lowercase();
            !live.contains(&lower) && !in_image.contains(&lower)
        })
        .collect())
}

/// Creates `objects` in `target` (inside the merge's transaction), and, when the live database
/// was empty, takes the capture's `application_id` and `user_version` (the application's own
/// record of its schema) where the live ones are 0.
pub(crate) fn create(
    source: &Connection,
    target: &Connection,
    target_path: &std::path::Path,
    objects: &[Object],
    live_empty: bool,
) -> Result<(), RecoverError> {
    for o in objects {
        target.execute_batch(&o.sql).map_err(|e| {
            RecoverError::sqlite(
                target_path,
                format!("create {} {} as the capture has it", o.kind, o.name),
                e,
            )
        })?;
    }
    if live_empty {
        for pragma in ["application_id", "user_version"] {
            let get = |c: &Connection| {
                c.query_row(&format!("PRAGMA main.{pragma}"), [], |r| r.get::<_, i64>(0))
            };
            let captured = get(source).unwrap_or(0);
            let live = get(target).map_err(|e| RecoverError::sqlite(target_path, pragma, e))?;
            if live == 0 && captured != 0 {
                target
                    .execute_batch(&format!("PRAGMA main.{pragma} = {captured}"))
                    .map_err(|e| RecoverError::sqlite(target_path, pragma, e))?;
            }
        }
    }
    Ok(())
}
