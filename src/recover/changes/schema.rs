//! The trees of the generation's schema: each table and index with a root page, read from the
//! `sqlite_schema` rows of its pages, and the shape of their records (how many values, which
//! column is the rowid's alias, how many leading values are a `WITHOUT ROWID` table's key).
//!
//! Shapes come from SQLite itself: every `CREATE` statement is run in a private in-memory
//! database and its `PRAGMA table_xinfo`, `index_xinfo` and `index_list` read back, which knows
//! generated columns, the `INTEGER PRIMARY KEY … DESC` exception and key order exactly. A
//! statement that does not run there (a collation or module this process lacks) leaves its
//! object's shape unknown (a note): its pages are still attributed by structure, never by
//! content.

use rusqlite::Connection;

use crate::recover::btree::{table_rows, DbGeometry};
use crate::recover::schema::quote;
use crate::recover::value::{utf8_text, Val};

/// What a tree's records are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum TreeKind {
    /// A table (`sqlite_schema` included).
    Table {
        /// Keyed by its primary key, in an index-format tree.
        without_rowid: bool,
        /// The column that aliases the rowid (`INTEGER PRIMARY KEY`), stored as NULL.
        ipk: Option<usize>,
        /// A `WITHOUT ROWID` table: how many leading values of a record are its key (0 if not
        /// known: the whole record is the key).
        key_values: usize,
    },
    /// An index of the table named.
    Index {
        /// Its table.
        table: String,
    },
}

/// A schema object with a tree of its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Tree {
    /// `sqlite_schema.name`.
    pub(crate) name: String,
    /// Its root page.
    pub(crate) root: u32,
    /// Table or index.
    pub(crate) kind: TreeKind,
    /// The values of a full record (a table's stored columns; an index's keys and the rowid or
    /// primary key after them), if its declaration could be read.
    pub(crate) values: Option<usize>,
}

impl Tree {
    /// Whether its pages are index-format pages (indexes and `WITHOUT ROWID` tables).
    pub(crate) fn index_format(&self) -> bool {
        match self.kind {
            TreeKind::Table { without_rowid, .. } => without_rowid,
            TreeKind::Index { .. } => true,
        }
    }

    /// A table, whose rows are changes (an index's entries follow from its table's rows).
    pub(crate) fn is_table(&self) -> bool {
        matches!(self.kind, TreeKind::Table { .. })
    }
}

/// The `sqlite_schema` table itself: a rowid table of five columns rooted at page 1.
fn schema_tree() -> Tree {
    Tree {
        name: "sqlite_schema".into(),
        root: 1,
        kind: TreeKind::Table {
            without_rowid: false,
            ipk: None,
            key_values: 0,
        },
        values: Some(5),
    }
}

/// The trees of the schema whose `sqlite_schema` tree is read through `page`, `sqlite_schema`
/// first; notes say what could not be read. `None` when the schema's own tree cannot be walked.
pub(crate) fn read_schema<'p>(
    geometry: &DbGeometry,
    page: impl Fn(u32) -> Option<&'p [u8]>,
    notes: &mut Vec<String>,
) -> Option<Vec<Tree>> {
    let rows = match table_rows(1, geometry, page) {
        Ok(walk) => walk.entries,
        Err(e) => {
            notes.push(format!("the schema (sqlite_schema) cannot be read: {e}"));
            return None;
        }
    };
    let text = |v: Option<&Val>| match v {
        Some(Val::Text(t)) => {
            utf8_text(t, geometry.text_encoding()).map(|t| String::from_utf8_lossy(&t).into_owned())
        }
        _ => None,
    };
    // (type, name, table, root, sql)
    let mut objects = Vec::new();
    for row in &rows {
        let (Some(kind), Some(name), Some(table)) = (
            text(row.values.first()),
            text(row.values.get(1)),
            text(row.values.get(2)),
        ) else {
            continue;
        };
        let root = match row.values.get(3) {
            Some(Val::Int(r)) if *r > 0 && *r <= i64::from(u32::MAX) => *r as u32,
            _ => continue,
        };
        if kind == "table" || kind == "index" {
            objects.push((kind, name, table, root, text(row.values.get(4))));
        }
    }
    let memory = match Connection::open_in_memory() {
        Ok(c) => c,
        Err(e) => {
            notes.push(format!(
                "no in-memory database to read declarations in: {e}"
            ));
            return Some(trees_without_shapes(objects));
        }
    };
    // Tables first, so that their indexes can be made; internal tables under another name.
    let mut alias = std::collections::HashMap::new();
    for pass in ["table", "index"] {
        for (kind, name, table, _, sql) in objects.iter().filter(|o| o.0 == pass) {
            let Some(sql) = sql else { continue };
            let mut sql = sql.clone();
            if kind == "table" && name.starts_with("sqlite_") {
                let stand_in = format!("hg_internal_{name}");
                sql = sql.replacen(name.as_str(), &quote(&stand_in), 1);
                alias.insert(name.clone(), stand_in);
            } else if kind == "index" {
                if let Some(stand_in) = alias.get(table) {
                    sql = sql.replacen(table.as_str(), &quote(stand_in), 1);
                }
            }
            if let Err(e) = memory.execute_batch(&sql) {
                notes.push(format!(
                    "the declaration of {kind} {name} cannot be read ({e}): its shape is unknown"
                ));
            }
        }
    }
    let mut trees = vec![schema_tree()];
    for (kind, name, table, root, _) in objects {
        let in_memory = alias.get(&name).cloned().unwrap_or_else(|| name.clone());
        let tree = if kind == "table" {
            table_tree(&memory, &name, &in_memory, root)
        } else {
            index_tree(&memory, &name, table, root)
        };
        trees.push(tree);
    }
    Some(trees)
}

/// Trees whose shapes are all unknown (no in-memory database to read them in).
fn trees_without_shapes(objects: Vec<(String, String, String, u32, Option<String>)>) -> Vec<Tree> {
    let mut trees = vec![schema_tree()];
    for (kind, name, table, root, sql) in objects {
        let without_rowid = sql
            .as_deref()
            .is_some_and(|s| s.to_ascii_uppercase().contains("WITHOUT ROWID"));
        trees.push(Tree {
            name,
            root,
            kind: if kind == "table" {
                TreeKind::Table {
                    without_rowid,
                    ipk: None,
                    key_values: 0,
                }
            } else {
                TreeKind::Index { table }
            },
            values: None,
        });
    }
    trees
}

/// The shape of table `name`, declared in `memory` as `in_memory`.
fn table_tree(memory: &Connection, name: &str, in_memory: &str, root: u32) -> Tree {
    // (pk position, hidden) per column, in declaration order.
    let columns: rusqlite::Result<Vec<(i64, i64)>> = memory
        .prepare("SELECT pk, hidden FROM pragma_table_xinfo(?1) ORDER BY cid")
        .and_then(|mut s| {
            s.query_map([in_memory], |r| Ok((r.get(0)?, r.get(1)?)))?
                .collect()
        });
    let without_rowid: Option<bool> = memory
        .query_row(
            "SELECT wr FROM pragma_table_list WHERE name = ?1 AND schema = 'main'",
            [in_memory],
            |r| r.get(0),
        )
        .ok();
    // A rowid table whose primary key is not the rowid has an index for it ("pk" origin).
    let pk_index: Option<bool> = memory
        .query_row(
            "SELECT count(*) > 0 FROM pragma_index_list(?1) WHERE origin = 'pk'",
            [in_memory],
            |r| r.get(0),
        )
        .ok();
    let unknown = Tree {
        name: name.to_owned(),
        root,
        kind: TreeKind::Table {
            without_rowid: false,
            ipk: None,
            key_values: 0,
        },
        values: None,
    };
    let (Ok(columns), Some(without_rowid), Some(pk_index)) = (columns, without_rowid, pk_index)
    else {
        return unknown;
    };
    if columns.is_empty() {
        return unknown;
    }
    // Virtual generated columns (hidden 2) are not stored.
    let stored: Vec<i64> = columns
        .iter()
        .filter(|(_, hidden)| *hidden != 2)
        .map(|(pk, _)| *pk)
        .collect();
    let key_columns = stored.iter().filter(|pk| **pk > 0).count();
    let ipk = if !without_rowid && !pk_index && key_columns == 1 {
        stored.iter().position(|pk| *pk > 0)
    } else {
        None
    };
    Tree {
        name: name.to_owned(),
        root,
        kind: TreeKind::Table {
            without_rowid,
            ipk,
            key_values: if without_rowid { key_columns } else { 0 },
        },
        values: Some(stored.len()),
    }
}

/// The shape of index `name` of `table`: its record holds every column `index_xinfo` lists
/// (the keys, then the rowid or the table's primary key).
fn index_tree(memory: &Connection, name: &str, table: String, root: u32) -> Tree {
    let count: Option<i64> = memory
        .query_row("SELECT count(*) FROM pragma_index_xinfo(?1)", [name], |r| {
            r.get(0)
        })
        .ok();
    Tree {
        name: name.to_owned(),
        root,
        kind: TreeKind::Index { table },
        values: count.filter(|c| *c > 0).map(|c| c as usize),
    }
}
