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
    let db = super::sql::quote(db);
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

#[cfg(test)]
mod tests {
    use super::*;

    const SCHEMA: &str = "
        CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT UNIQUE);
        CREATE INDEX notes_body ON notes(body);
        CREATE VIRTUAL TABLE notes_fts USING fts5(body, content='notes', content_rowid='id');
        CREATE TRIGGER notes_ai AFTER INSERT ON notes BEGIN
            INSERT INTO notes_fts(rowid, body) VALUES (new.id, new.body);
        END;
        CREATE TABLE hermes_guard_merges (generation TEXT PRIMARY KEY);
    ";

    #[test]
    fn objects_leave_out_shadow_tables_automatic_indexes_and_internal_tables() {
        let conn = Connection::open_in_memory().unwrap();
        conn.execute_batch(SCHEMA).unwrap();
        let names: Vec<String> = objects(&conn, "main")
            .unwrap()
            .into_iter()
            .map(|o| format!("{} {}", o.kind, o.name))
            .collect();
        assert_eq!(
            names,
            [
                "table notes",
                "index notes_body",
                "table notes_fts",
                "trigger notes_ai"
            ]
        );
    }

    #[test]
    fn an_empty_target_gets_everything_another_only_what_the_generation_created() {
        let source = Connection::open_in_memory().unwrap();
        source.execute_batch(SCHEMA).unwrap();
        source
            .execute_batch("ATTACH ':memory:' AS pre; CREATE TABLE pre.notes (id INTEGER PRIMARY KEY, body TEXT);")
            .unwrap();
        let empty = Connection::open_in_memory().unwrap();
        assert_eq!(to_create(&source, &empty, true, true).unwrap().len(), 4);
        let other = Connection::open_in_memory().unwrap();
        other
            .execute_batch("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT)")
            .unwrap();
        let names: Vec<String> = to_create(&source, &other, false, true)
            .unwrap()
            .into_iter()
            .map(|o| o.name)
            .collect();
        assert_eq!(names, ["notes_body", "notes_fts", "notes_ai"]);
        assert!(to_create(&source, &other, false, false).unwrap().is_empty());

        create(
            &source,
            &empty,
            std::path::Path::new("empty"),
            &to_create(&source, &empty, true, true).unwrap(),
            true,
        )
        .unwrap();
        empty
            .execute("INSERT INTO notes (body) VALUES ('a platypus')", [])
            .unwrap();
        let hits: i64 = empty
            .query_row(
                "SELECT COUNT(*) FROM notes_fts WHERE notes_fts MATCH 'platypus'",
                [],
                |r| r.get(0),
            )
            .unwrap();
        assert_eq!(hits, 1, "the trigger was created with the table");
    }
}
