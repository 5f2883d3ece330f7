//! What recovery needs to know of a schema: which tables to merge, how a row is identified, and
//! which foreign keys point at a rowid.

use std::collections::HashMap;

use rusqlite::{Connection, OptionalExtension};

// The identifier quoting lives in `sql.rs`; `changes/` reaches it through this path.
pub(crate) use super::sql::quote;

/// One column of a table.
#[derive(Debug, Clone)]
pub(crate) struct Column {
    pub name: String,
    pub decl_type: String,
    /// 1-based position in the primary key, 0 when not part of it.
    pub pk: i64,
    /// A generated column (never inserted, never compared).
    pub generated: bool,
    /// Its value is in the table's records: every column but a `VIRTUAL` generated one.
    pub stored: bool,
    /// Its declared `DEFAULT` expression, as `table_xinfo` gives it: what a record written
    /// before an `ALTER TABLE … ADD COLUMN` of it reads as.
    pub default: Option<String>,
}

/// A single-column foreign key.
#[derive(Debug, Clone)]
pub(crate) struct ForeignKey {
    pub from: String,
    pub parent: String,
    /// The parent column, `None` for the parent's primary key.
    pub to: Option<String>,
}

/// An ordinary table.
#[derive(Debug, Clone)]
pub(crate) struct Table {
    pub name: String,
    pub without_rowid: bool,
    pub columns: Vec<Column>,
    pub foreign_keys: Vec<ForeignKey>,
}

impl Table {
    /// The column that is an alias of the rowid (`INTEGER PRIMARY KEY`), if any.
    pub fn rowid_alias(&self) -> Option<&str> {
        if self.without_rowid {
            return None;
        }
        let pk: Vec<&Column> = self.columns.iter().filter(|c| c.pk > 0).collect();
        match pk.as_slice() {
            [only] if only.decl_type.eq_ignore_ascii_case("INTEGER") => Some(&only.name),
            _ => None,
        }
    }

    /// The declared primary key's columns, in key order, when it is not a rowid alias.
    pub fn declared_key(&self) -> Option<Vec<String>> {
        if self.rowid_alias().is_some() {
            return None;
        }
        let mut pk: Vec<&Column> = self.columns.iter().filter(|c| c.pk > 0).collect();
        if pk.is_empty() {
            return None;
        }
        pk.sort_by_key(|c| c.pk);
        Some(pk.into_iter().map(|c| c.name.clone()).collect())
    }

    pub fn has_column(&self, name: &str) -> bool {
        self.columns
            .iter()
            .any(|c| c.name.eq_ignore_ascii_case(name))
    }

    /// A name that selects the rowid and is not shadowed by a column.
    pub fn rowid_name(&self) -> Option<&'static str> {
        if self.without_rowid {
            return None;
        }
        ["rowid", "_rowid_", "oid"]
            .into_iter()
            .find(|n| !self.has_column(n))
    }
}

/// A virtual table and, for an external-content full-text table, its content table.
#[derive(Debug, Clone)]
pub(crate) struct Virtual {
    pub name: String,
    pub content: Option<String>,
}

/// The `main` schema of a connection.
#[derive(Debug, Default)]
pub(crate) struct Schema {
    /// Ordinary tables recovery may merge, by lower-case name.
    pub tables: HashMap<String, Table>,
    pub virtuals: Vec<Virtual>,
    /// `sqlite_master.sql` of every trigger, with its table (lower case).
    pub triggers: Vec<(String, String)>,
}

/// Whether recovery leaves a table of this name alone: SQLite's own (`sqlite_sequence`,
/// `sqlite_stat*`, `sqlite_master`) and recovery's record of what it merged.
pub(crate) fn is_internal(name: &str) -> bool {
    let lower = name.to_ascii_lowercase();
    lower.starts_with("sqlite_")
        || lower == super::ledger::LEDGER_TABLE
        || lower == super::ledger::MOVED_TABLE
}

impl Schema {
    /// The `main` schema.
    pub fn read(conn: &Connection) -> rusqlite::Result<Schema> {
        Schema::read_in(conn, "main")
    }

    /// The schema of the attached database `db` (`main`, or the capture's image `pre`).
    pub fn read_in(conn: &Connection, db: &str) -> rusqlite::Result<Schema> {
        let mut schema = Schema::default();
        let listed: Vec<(String, String, bool)> = {
            let mut stmt = conn.prepare(
                "SELECT name, type, wr FROM pragma_table_list WHERE schema = ?1 ORDER BY name",
            )?;
            let rows = stmt.query_map([db], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
            rows.collect::<rusqlite::Result<_>>()?
        };
        let master = format!("{}.sqlite_master", quote(db));
        for (name, kind, without_rowid) in listed {
            if is_internal(&name) {
                continue;
            }
            match kind.as_str() {
                "table" => {
                    let table = read_table(conn, db, &name, without_rowid)?;
                    schema.tables.insert(name.to_lowercase(), table);
                }
                "virtual" => {
                    let sql: Option<String> = conn
                        .query_row(
                            &format!("SELECT sql FROM {master} WHERE type = 'table' AND name = ?1"),
                            [&name],
                            |r| r.get(0),
                        )
                        .optional()?
                        .flatten();
                    schema.virtuals.push(Virtual {
                        content: sql.as_deref().and_then(external_content),
                        name,
                    });
                }
                _ => {} // views and shadow tables
            }
        }
        // Shadow tables of virtual tables that `table_list` does not mark (older modules).
        let shadows: Vec<String> = schema
            .tables
            .keys()
            .filter(|t| {
                schema
                    .virtuals
                    .iter()
                    .any(|v| t.starts_with(&format!("{}_", v.name.to_lowercase())))
            })
            .cloned()
            .collect();
        for t in shadows {
            schema.tables.remove(&t);
        }
        let mut stmt = conn.prepare(&format!(
            "SELECT tbl_name, sql FROM {master} WHERE type = 'trigger'"
        ))?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?.to_lowercase(),
                r.get::<_, Option<String>>(1)?.unwrap_or_default(),
            ))
        })?;
        schema.triggers = rows.collect::<rusqlite::Result<_>>()?;
        Ok(schema)
    }

    /// No table of the application's (a fresh or emptied database).
    pub fn is_empty(&self) -> bool {
        self.tables.is_empty() && self.virtuals.is_empty()
    }

    /// Whether a trigger on `table` mentions `name` (keeps an index of it in step).
    pub fn trigger_feeds(&self, table: &str, name: &str) -> bool {
        let name = name.to_lowercase();
        self.triggers
            .iter()
            .any(|(t, sql)| t == &table.to_lowercase() && sql.to_lowercase().contains(&name))
    }
}

fn read_table(
    conn: &Connection,
    db: &str,
    name: &str,
    without_rowid: bool,
) -> rusqlite::Result<Table> {
    let mut stmt = conn.prepare(
        "SELECT name, type, pk, hidden, dflt_value FROM pragma_table_xinfo(?1, ?2) ORDER BY cid",
    )?;
    let columns = stmt
        .query_map([name, db], |r| {
            let hidden: i64 = r.get(3)?;
            Ok(Column {
                name: r.get(0)?,
                decl_type: r.get::<_, Option<String>>(1)?.unwrap_or_default(),
                pk: r.get(2)?,
                generated: hidden == 2 || hidden == 3,
                stored: hidden != 2,
                default: r.get(4)?,
            })
        })?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let mut stmt = conn.prepare(
        "SELECT id, \"table\", \"from\", \"to\" FROM pragma_foreign_key_list(?1, ?2) \
         ORDER BY id, seq",
    )?;
    let mut by_id: Vec<(i64, ForeignKey)> = Vec::new();
    let mut composite: Vec<i64> = Vec::new();
    let rows = stmt.query_map([name, db], |r| {
        Ok((
            r.get::<_, i64>(0)?,
            ForeignKey {
                parent: r.get(1)?,
                from: r.get(2)?,
                to: r.get(3)?,
            },
        ))
    })?;
    for row in rows {
        let (id, fk) = row?;
        if by_id.iter().any(|(i, _)| *i == id) {
            composite.push(id);
        }
        by_id.push((id, fk));
    }
    let foreign_keys = by_id
        .into_iter()
        .filter(|(id, _)| !composite.contains(id))
        .map(|(_, fk)| fk)
        .collect();
    Ok(Table {
        name: name.to_owned(),
        without_rowid,
        columns,
        foreign_keys,
    })
}

/// The `content=` table of an FTS3/4/5 declaration, when it has one (external content).
fn external_content(sql: &str) -> Option<String> {
    let lower = sql.to_ascii_lowercase(); // same byte offsets as `sql`: they index it below
    if !lower.contains("using fts") {
        return None;
    }
    let at = lower.find("content")?;
    // Find `content` followed by `=` (not content_rowid).
    let mut search = at;
    loop {
        let rest = &lower[search..];
        let idx = rest.find("content")?;
        let after = search + idx + "content".len();
        let tail = lower[after..].trim_start();
        if tail.starts_with('=') {
            let value = sql[sql.len() - tail.len() + 1..].trim_start();
            let value = value
                .split([',', ')'])
                .next()?
                .trim()
                .trim_matches(|c| c == '\'' || c == '"' || c == '`' || c == '[' || c == ']');
            return (!value.is_empty()).then(|| value.to_owned());
        }
        search = after;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_content_with_non_ascii_before_it_is_read_exactly() {
        // 'İ' lowercases to three bytes from two: offsets into the declaration must not shift.
        assert_eq!(
            external_content("CREATE VIRTUAL TABLE \"İİİ\" USING fts5(body, content='İtems')"),
            Some("İtems".to_owned())
        );
    }

    #[test]
    fn external_content_is_read_from_the_declaration() {
        assert_eq!(
            external_content(
                "CREATE VIRTUAL TABLE messages_fts USING fts5(content, content='messages', content_rowid='id')"
            )
            .as_deref(),
            Some("messages")
        );
        assert_eq!(
            external_content("CREATE VIRTUAL TABLE f USING fts5(content)"),
            None
        );
        assert_eq!(
            external_content("CREATE VIRTUAL TABLE f USING fts4(body, content=\"docs\")")
                .as_deref(),
            Some("docs")
        );
    }

    #[test]
    fn quoting_doubles_inner_quotes() {
        assert_eq!(quote("a\"b"), "\"a\"\"b\"");
    }
}
