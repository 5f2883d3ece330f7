//! The rows of each table's base and final pages, and their differences.
//!
//! For a table T: B_T is the rows of the base versions attributed to T, F_T those of the final
//! versions. A row moves between leaves only by the generation writing both (or freeing the one
//! it leaves), so these sets hold every row the generation touched, and a row it did not touch is
//! in both with the same cell (or in neither). An **insert** is in F_T and not in B_T; an
//! **update** in both with other values (the old row B_T's); a **delete** in B_T and not in F_T.
//!
//! Undecided instead: the inserts of a table one of whose final pages has no known base, or a
//! base that could not be attributed (a row moved from it would look like an insert); every row
//! of a table with the same key twice in F_T or in B_T (the pages disagree: no set can be
//! trusted); a row whose record cannot be read (an overflow page neither carried nor freed, or
//! damage). A cell whose bytes are the same in base and final is unchanged without reading its
//! overflow pages, which the generation need not carry.

use std::collections::{BTreeMap, BTreeSet};

use super::attribution::{attribute, version_of, Attribution, Version};
use super::pages::{Base, GenerationPages};
use super::schema::{read_schema, Tree, TreeKind};
use super::{GenerationChanges, RowChange, TableChanges};
use crate::recover::btree::{
    body_len, decode_page, decode_record, read_varint, table_rows, write_varint, BtreeError, Cell,
    DbGeometry, RecordError,
};
use crate::recover::value::{same_row, Val};

/// How many pages of the image the schema's walk may fetch (a bound on its retries).
const SCHEMA_IMAGE_PAGES: usize = 4096;

/// The row changes of the generation whose pages are `pages`. `image` looks up a page of the
/// capture's main image (the newer generation's file): used only to follow the pointers of pages
/// the generation did not write (and to read the schema's pages it did not write), never for a
/// row.
pub(crate) fn compute(
    pages: &GenerationPages,
    image: Option<&dyn Fn(u32) -> Option<Vec<u8>>>,
) -> GenerationChanges {
    let no_image = |_: u32| None;
    let image: &dyn Fn(u32) -> Option<Vec<u8>> = image.unwrap_or(&no_image);
    let mut notes = pages.notes.clone();
    let trees = schema(pages, image, &mut notes);
    let attribution = attribute(pages, &trees, image, &mut notes);
    let sides: Vec<(usize, Sides<'_>)> = trees
        .iter()
        .enumerate()
        .filter(|(_, tree)| tree.is_table())
        .map(|(index, tree)| (index, sides(pages, &attribution, index, tree, &mut notes)))
        .collect();
    // Carried pages that are no tree's, on no freelist and in no chain read: if there are any,
    // an overflow chain the generation overwrote in place may be among them.
    let chains: BTreeSet<u32> = sides
        .iter()
        .flat_map(|(_, side)| side.fin.iter().flat_map(|e| e.chain.iter().copied()))
        .collect();
    let mut accounted: BTreeSet<u32> = attribution.final_owner.keys().copied().collect();
    accounted.extend(&attribution.final_free);
    accounted.extend(&attribution.unattributed);
    accounted.extend(&chains);
    let stray: Vec<u32> = pages
        .final_pages
        .keys()
        .copied()
        .filter(|p| !accounted.contains(p))
        .collect();
    let mut tables = Vec::new();
    for (index, side) in sides {
        let changes = table_changes(
            pages,
            &attribution,
            &chains,
            &stray,
            index,
            &trees[index],
            side,
            &mut notes,
        );
        if !changes.is_empty() {
            tables.push(changes);
        }
    }
    tables.sort_by_key(|t| t.root);
    GenerationChanges {
        tables,
        unattributed_pages: attribution.unattributed.iter().copied().collect(),
        notes,
    }
}

/// The schema's trees, read from the final versions of the schema's pages (through the image
/// for the ones the generation did not write), else from their base versions.
fn schema(
    pages: &GenerationPages,
    image: &dyn Fn(u32) -> Option<Vec<u8>>,
    notes: &mut Vec<String>,
) -> Vec<Tree> {
    let mut fetched: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    for version in [Version::Final, Version::Base] {
        let own = |p: u32| version_of(pages, version, p);
        // Fetch the image's pages the walk asks for, one at a time.
        let mut attempt = Vec::new();
        loop {
            let lookup = |p: u32| own(p).or_else(|| fetched.get(&p).map(Vec::as_slice));
            match table_rows(1, &pages.geometry, lookup) {
                Err(BtreeError::TreePageMissing { pgno, .. })
                | Err(BtreeError::OverflowMissing { overflow: pgno, .. })
                    if fetched.len() < SCHEMA_IMAGE_PAGES && !fetched.contains_key(&pgno) =>
                {
                    match image(pgno) {
                        Some(bytes) => {
                            fetched.insert(pgno, bytes);
                        }
                        None => break,
                    }
                }
                _ => {
                    let lookup = |p: u32| own(p).or_else(|| fetched.get(&p).map(Vec::as_slice));
                    if let Some(trees) = read_schema(&pages.geometry, lookup, &mut attempt) {
                        notes.extend(attempt);
                        return trees;
                    }
                    break;
                }
            }
        }
        notes.append(&mut attempt);
    }
    notes.push("no version of the schema could be read: no page can be attributed".into());
    Vec::new()
}

/// A row's cell as one version of a page holds it.
struct Entry<'a> {
    pgno: u32,
    /// The rowid (rowid tables).
    rowid: Option<i64>,
    /// The cell's payload size, local bytes and first overflow page: equal in base and final
    /// means the same row, without reading the overflow pages.
    total: u32,
    local: &'a [u8],
    first_overflow: Option<u32>,
    /// The record's values, or why they cannot be read.
    values: Result<Vec<Val>, Unreadable>,
    /// The overflow pages read for it (as far as they could be read).
    chain: Vec<u32>,
    /// An index-format row's key values (the first `key_values`, or all), from the record or,
    /// when its overflow pages cannot be read, from the cell's local bytes if they hold them.
    key: Option<Vec<Val>>,
}

impl Entry<'_> {
    fn same_cell(&self, other: &Entry<'_>) -> bool {
        self.total == other.total
            && self.local == other.local
            && self.first_overflow == other.first_overflow
    }

    /// The row as a change: the values when readable (the rowid alias filled in), else none.
    fn row(&self, ipk: Option<usize>) -> RowChange {
        let mut values = self.values.as_ref().map_or_else(|_| Vec::new(), Vec::clone);
        if let (Some(i), Some(rowid)) = (ipk, self.rowid) {
            if let Some(v @ Val::Null) = values.get_mut(i) {
                *v = Val::Int(rowid);
            }
        }
        RowChange {
            rowid: self.rowid,
            values,
        }
    }
}

/// The key of a row: its rowid, or a `WITHOUT ROWID` table's key values, encoded to bytes that
/// compare equal exactly when the values are the same (type and bytes; reals bit for bit).
type Key = Vec<u8>;

/// Why a row's record cannot be read.
#[derive(Debug, Clone, thiserror::Error)]
enum Unreadable {
    /// Its payload cannot be put together (an overflow page missing or malformed).
    #[error(transparent)]
    Payload(BtreeError),
    /// The whole payload is not a record.
    #[error("page {pgno}: the record of the cell at byte {offset}: {source}")]
    Record {
        /// The page.
        pgno: u32,
        /// The cell's offset in the page.
        offset: usize,
        /// What is wrong with the record.
        #[source]
        source: RecordError,
    },
}

/// Why a row has no [`Key`].
#[derive(Debug, thiserror::Error)]
enum NoKey {
    /// Its record cannot be read, nor its key values from the cell's local bytes.
    #[error(transparent)]
    Unreadable(Unreadable),
    /// No key values were taken from its record.
    #[error("the record has no key")]
    Empty,
}

fn key_of(entry: &Entry<'_>) -> Result<Key, NoKey> {
    if let Some(rowid) = entry.rowid {
        return Ok(rowid.to_be_bytes().to_vec());
    }
    let values = match (&entry.key, &entry.values) {
        (Some(key), _) => key,
        (None, Err(why)) => return Err(NoKey::Unreadable(why.clone())),
        (None, Ok(_)) => return Err(NoKey::Empty),
    };
    let mut key = Vec::new();
    for v in values {
        let (tag, bytes): (u8, Vec<u8>) = match v {
            Val::Null => (0, vec![]),
            Val::Int(i) => (1, i.to_be_bytes().to_vec()),
            Val::Real(r) => (2, r.to_bits().to_be_bytes().to_vec()),
            Val::Text(t) => (3, t.clone()),
            Val::Blob(b) => (4, b.clone()),
        };
        key.push(tag);
        key.extend_from_slice(&(bytes.len() as u64).to_be_bytes());
        key.extend_from_slice(&bytes);
    }
    Ok(key)
}

/// The entries of the cells of `pgno`'s version `bytes`, their records read with overflow pages
/// from `overflow`.
fn entries<'a>(
    pgno: u32,
    bytes: &'a [u8],
    geometry: &DbGeometry,
    key_values: usize,
    overflow: &impl Fn(u32) -> Option<&'a [u8]>,
    out: &mut Vec<Entry<'a>>,
) -> Result<(), BtreeError> {
    let page = decode_page(bytes, pgno, geometry)?;
    for cell in &page.cells {
        let rowid = match cell {
            Cell::TableLeaf { rowid, .. } => Some(*rowid),
            _ => None,
        };
        let Some(payload) = cell.payload() else {
            continue;
        };
        let mut chain = Vec::new();
        let values = payload
            .assemble_noting(geometry, overflow, &mut chain)
            .map_err(Unreadable::Payload)
            .and_then(|record| {
                decode_record(&record).map_err(|source| Unreadable::Record {
                    pgno,
                    offset: payload.cell_offset,
                    source,
                })
            });
        let key = match (rowid, &values) {
            (Some(_), _) => None,
            (None, Ok(v)) => Some(prefix(v, key_values).to_vec()),
            (None, Err(_)) => local_key(payload.local, key_values),
        };
        out.push(Entry {
            key,
            pgno,
            rowid,
            total: payload.total,
            local: payload.local,
            first_overflow: payload.first_overflow,
            values,
            chain,
        });
    }
    Ok(())
}

/// The first `key_values` values (all of them when 0).
fn prefix(values: &[Val], key_values: usize) -> &[Val] {
    if key_values == 0 {
        values
    } else {
        &values[..key_values.min(values.len())]
    }
}

/// The first `key_values` values of a record whose first bytes are `local`, when those bytes
/// hold them whole (a key before a long value that spills to overflow pages). `None` when the
/// whole record is the key, or the key is not all in `local`.
fn local_key(local: &[u8], key_values: usize) -> Option<Vec<Val>> {
    if key_values == 0 {
        return None;
    }
    let (header_size, mut at) = read_varint(local)?;
    let header_end = usize::try_from(header_size).ok()?;
    let mut types = Vec::new();
    let mut body = 0usize;
    while types.len() < key_values && at < header_end {
        let (t, n) = read_varint(local.get(at..header_end)?)?;
        at += n;
        body += usize::try_from(body_len(t)?).ok()?;
        types.push(t);
    }
    if types.len() < key_values {
        return None;
    }
    // A record of the key columns alone: its header, then their bodies.
    let mut header = Vec::new();
    for t in &types {
        write_varint(*t, &mut header);
    }
    let size = header.len() + 1;
    let size = if size < 0x80 { size } else { return None };
    let mut record = vec![size as u8];
    record.extend_from_slice(&header);
    record.extend_from_slice(local.get(header_end..header_end.checked_add(body)?)?);
    decode_record(&record).ok()
}

/// A table's rows on its base pages and on its final pages.
struct Sides<'a> {
    base: Vec<Entry<'a>>,
    fin: Vec<Entry<'a>>,
}

/// The rows of the table `trees[index]`, base and final, each version's overflow pages read
/// in the same version.
fn sides<'a>(
    pages: &'a GenerationPages,
    attribution: &Attribution,
    index: usize,
    tree: &Tree,
    notes: &mut Vec<String>,
) -> Sides<'a> {
    let geometry = &pages.geometry;
    let key_values = match tree.kind {
        TreeKind::Table { key_values, .. } => key_values,
        TreeKind::Index { .. } => 0,
    };
    let mut sides: [Vec<Entry<'_>>; 2] = [Vec::new(), Vec::new()];
    let owned = [
        (Version::Base, &attribution.base_owner),
        (Version::Final, &attribution.final_owner),
    ];
    for (side, (version, owners)) in owned.into_iter().enumerate() {
        // A version's overflow pages are read in the same version.
        let overflow = |p: u32| version_of(pages, version, p);
        for (&pgno, _) in owners.iter().filter(|(_, &t)| t == index) {
            let Some(bytes) = version_of(pages, version, pgno) else {
                continue;
            };
            if let Err(e) = entries(
                pgno,
                bytes,
                geometry,
                key_values,
                &overflow,
                &mut sides[side],
            ) {
                notes.push(format!("{}: {e}", tree.name));
            }
        }
    }
    let [base, fin] = sides;
    Sides { base, fin }
}

/// The changes of the table `trees[index]`, from its rows; `chains` are the overflow pages of
/// the final rows read, `stray` the carried pages that are no tree's, on no freelist and in no
/// such chain.
#[allow(clippy::too_many_arguments)]
fn table_changes(
    pages: &GenerationPages,
    attribution: &Attribution,
    chains: &BTreeSet<u32>,
    stray: &[u32],
    index: usize,
    tree: &Tree,
    Sides { base, fin }: Sides<'_>,
    notes: &mut Vec<String>,
) -> TableChanges {
    let (without_rowid, ipk) = match tree.kind {
        TreeKind::Table {
            without_rowid, ipk, ..
        } => (without_rowid, ipk),
        TreeKind::Index { .. } => (true, None),
    };
    let mut out = TableChanges {
        name: tree.name.clone(),
        root: tree.root,
        without_rowid,
        ..TableChanges::default()
    };

    // Why inserts cannot be told from rows moved in from a page whose base is not known.
    let final_pages: BTreeSet<u32> = attribution
        .final_owner
        .iter()
        .filter(|(_, &t)| t == index)
        .map(|(p, _)| *p)
        .collect();
    let mut unknown: Vec<u32> = final_pages
        .iter()
        .copied()
        .filter(|p| {
            matches!(pages.base.get(p), Some(Base::Unknown))
                || (attribution.unattributed.contains(p) && pages.base_page(*p).is_some())
        })
        .collect();
    unknown.extend(
        attribution
            .freed_without_base
            .iter()
            .filter(|(_, t)| **t == index)
            .map(|(p, _)| *p),
    );
    unknown.sort_unstable();
    out.unknown_base_pages = unknown.clone();
    let inserts_undecided = (!unknown.is_empty()).then(|| {
        format!(
            "pages {unknown:?} of {} have no known or attributed base: a row moved from them \
             would look like an insert",
            tree.name
        )
    });

    // Why deletes cannot be told from rows still on a final page no tree could be found for.
    let lost: Vec<u32> = attribution
        .base_owner
        .iter()
        .filter(|(p, &t)| {
            t == index
                && pages.final_pages.contains_key(p)
                && !attribution.final_owner.contains_key(p)
                && !attribution.final_free.contains(p)
                && !chains.contains(p)
        })
        .map(|(p, _)| *p)
        .collect();
    let deletes_undecided = (!lost.is_empty()).then(|| {
        format!(
            "the final versions of pages {lost:?} of {} are in no tree found, on no freelist \
             and in no overflow chain: a row still on them would look deleted",
            tree.name
        )
    });

    let index_side = |side: &[Entry<'_>], which: &str, out: &mut TableChanges| {
        let mut map: BTreeMap<Key, usize> = BTreeMap::new();
        let mut duplicate = None;
        for (i, e) in side.iter().enumerate() {
            match key_of(e) {
                Ok(k) => {
                    if let Some(j) = map.insert(k, i) {
                        duplicate = Some((side[j].pgno, e.pgno));
                    }
                }
                Err(why) => out
                    .undecided
                    .push((e.row(ipk), format!("{which} row on page {}: {why}", e.pgno))),
            }
        }
        (map, duplicate)
    };
    let (base_map, dup_base) = index_side(&base, "base", &mut out);
    let (final_map, dup_final) = index_side(&fin, "final", &mut out);
    if let Some((a, b)) = dup_base.or(dup_final) {
        let which = if dup_base.is_some() { "base" } else { "final" };
        let why = format!(
            "the same key is on pages {a} and {b} of {}'s {which} pages: its pages disagree",
            tree.name
        );
        notes.push(why.clone());
        out.undecided.clear();
        for e in base.iter().chain(fin.iter()) {
            out.undecided.push((e.row(ipk), why.clone()));
        }
        return out;
    }

    for (key, &f) in &final_map {
        let new = &fin[f];
        match base_map.get(key).map(|&b| &base[b]) {
            Some(old) if old.same_cell(new) && new.first_overflow.is_none() => {}
            // The same cell, but SQLite overwrites a row of the same size in place, overflow
            // pages included (writing only the overflow pages whose bytes change): unchanged
            // only if none of its overflow pages was written.
            Some(old) if old.same_cell(new) => match (&old.values, &new.values) {
                (Ok(a), Ok(b)) if same_row(a, b) => {}
                (Ok(_), Ok(_)) => out.updates.push((old.row(ipk), new.row(ipk))),
                (_, Ok(_)) if !new.chain.iter().any(|p| pages.final_pages.contains_key(p)) => {}
                (_, Err(_)) if stray.is_empty() => {}
                (Err(why), _) | (_, Err(why)) => out.undecided.push((
                    new.row(ipk),
                    format!(
                        "a row whose cell is unchanged but whose overflow pages may have been \
                         overwritten in place (carried pages {stray:?} belong to no known row): \
                         {why}"
                    ),
                )),
            },
            Some(old) => match (&old.values, &new.values) {
                (Ok(a), Ok(b)) if same_row(a, b) => {}
                (Ok(_), Ok(_)) => out.updates.push((old.row(ipk), new.row(ipk))),
                (Err(why), _) | (_, Err(why)) => out
                    .undecided
                    .push((new.row(ipk), format!("updated row: {why}"))),
            },
            None => match (&new.values, &inserts_undecided) {
                (Err(why), _) => out
                    .undecided
                    .push((new.row(ipk), format!("inserted row: {why}"))),
                (Ok(_), Some(why)) => out.undecided.push((new.row(ipk), why.clone())),
                (Ok(_), None) => out.inserts.push(new.row(ipk)),
            },
        }
    }
    for (key, &b) in &base_map {
        if final_map.contains_key(key) {
            continue;
        }
        let old = &base[b];
        match &old.values {
            Ok(_) if deletes_undecided.is_some() => out
                .undecided
                .push((old.row(ipk), deletes_undecided.clone().unwrap_or_default())),
            Ok(_) => out.deletes.push(old.row(ipk)),
            Err(why) => out
                .undecided
                .push((old.row(ipk), format!("deleted row: {why}"))),
        }
    }
    out
}
