//! Which tree each version of each page belongs to. A page has two versions that matter: its
//! final one (carried pages) and its base (carried pages with a known base, and freed pages);
//! a page freed and reused within the generation belongs to one tree in one and another in the
//! other, so each version is attributed on its own.
//!
//! Strongest first:
//! 1. **Structure.** From each tree's root down through interior pages, reading every page in
//!    the version being attributed (final: the final version; base: the base) when the
//!    generation carries it, else in the capture's main image (a later generation's file, so only
//!    to follow pointers: the rows of a page reached this way are read from the generation's own
//!    versions, and its shape must fit the tree). A page reached by two trees is unattributed.
//! 2. **Content.** A version no walk reached, holding cells, that is not on that version's
//!    freelist (a page on a freelist keeps stale cells): the trees whose record shape fits every
//!    cell (page format, at most as many values as the tree's records and as many in at least
//!    one, an `INTEGER PRIMARY KEY` column NULL). Exactly one fits: it is that tree's.
//!    Otherwise it is unattributed, and said so.

use std::collections::{BTreeMap, BTreeSet};

use super::pages::{freelist, Base, GenerationPages};
use super::schema::{Tree, TreeKind};
use crate::recover::btree::{decode_page, read_varint, Cell, Page, PageKind};

/// SQLite's deepest tree (`BTCURSOR_MAX_DEPTH`).
const MAX_DEPTH: usize = 20;

/// Which of a page's versions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Version {
    /// At the generation's last commit.
    Final,
    /// What the newer generation started from.
    Base,
}

/// The trees of each page's versions.
#[derive(Debug, Default)]
pub(crate) struct Attribution {
    /// Page → index into the schema's trees, for the final versions.
    pub(crate) final_owner: BTreeMap<u32, usize>,
    /// The same for the base versions.
    pub(crate) base_owner: BTreeMap<u32, usize>,
    /// Pages with a version holding cells that no tree could be found for.
    pub(crate) unattributed: BTreeSet<u32>,
    /// The pages on the freelist at the generation's last commit (as far as it could be read).
    pub(crate) final_free: BTreeSet<u32>,
    /// Pages the generation freed without writing them whose base is not given, by the tree
    /// whose base version reaches them (rows moved out of them would look like inserts).
    pub(crate) freed_without_base: BTreeMap<u32, usize>,
}

/// Attributes every version of the generation's pages to the `trees`; `image` is the capture's
/// main image, by page (for the pointers of pages the generation did not write).
pub(crate) fn attribute(
    pages: &GenerationPages,
    trees: &[Tree],
    image: &dyn Fn(u32) -> Option<Vec<u8>>,
    notes: &mut Vec<String>,
) -> Attribution {
    let mut out = Attribution::default();
    let final_free = freelist_of(pages, Version::Final, image, notes);
    let base_free = freelist_of(pages, Version::Base, image, notes);
    let unseen = freed_unseen(pages, final_free.as_ref(), base_free.as_ref());
    for version in [Version::Final, Version::Base] {
        let reached = walk_trees(
            pages,
            version,
            trees,
            image,
            &unseen,
            &mut out.freed_without_base,
            notes,
        );
        let attributing = Attributing {
            pages,
            trees,
            image,
            version,
            free: match version {
                Version::Final => final_free.as_ref(),
                Version::Base => base_free.as_ref(),
            },
            reached: &reached,
        };
        let owners = match version {
            Version::Final => &mut out.final_owner,
            Version::Base => &mut out.base_owner,
        };
        for pgno in pages.pages() {
            attributing.page(pgno, owners, &mut out.unattributed, notes);
        }
    }
    out.final_free = final_free.unwrap_or_default();
    note_overflow(&unseen, &out.freed_without_base, notes);
    out
}

/// Pages the generation put on the freelist without writing them and whose base is not given:
/// the rows SQLite moved out of them (a leaf merged into a sibling) would look like inserts.
/// Empty when either freelist is not known.
fn freed_unseen(
    pages: &GenerationPages,
    final_free: Option<&BTreeSet<u32>>,
    base_free: Option<&BTreeSet<u32>>,
) -> BTreeSet<u32> {
    match (final_free, base_free) {
        (Some(f), Some(b)) => f
            .difference(b)
            .filter(|p| !pages.final_pages.contains_key(p) && !pages.freed.contains_key(p))
            .copied()
            .collect(),
        _ => BTreeSet::new(),
    }
}

/// Walks every tree in `version`: the trees (indexes into `trees`) that reach each of the
/// generation's pages. A base walk that meets a page of `unseen` records it in
/// `freed_without_base`; the walks' notes go to `notes`, tree by tree.
fn walk_trees(
    pages: &GenerationPages,
    version: Version,
    trees: &[Tree],
    image: &dyn Fn(u32) -> Option<Vec<u8>>,
    unseen: &BTreeSet<u32>,
    freed_without_base: &mut BTreeMap<u32, usize>,
    notes: &mut Vec<String>,
) -> BTreeMap<u32, BTreeSet<usize>> {
    let mut reached: BTreeMap<u32, BTreeSet<usize>> = BTreeMap::new();
    for (index, tree) in trees.iter().enumerate() {
        let mut walk = Walk {
            pages,
            version,
            tree,
            image,
            seen: BTreeSet::new(),
            reached: Vec::new(),
            unseen,
            notes: Vec::new(),
        };
        walk.descend(tree.root, 0);
        let met = if version == Version::Base {
            &walk.seen
        } else {
            &BTreeSet::new()
        };
        for pgno in met.intersection(unseen) {
            freed_without_base.insert(*pgno, index);
        }
        for pgno in walk.reached {
            reached.entry(pgno).or_default().insert(index);
        }
        notes.extend(walk.notes);
    }
    reached
}

/// The note on the pages of `unseen` no base walk reached (none: no note).
fn note_overflow(
    unseen: &BTreeSet<u32>,
    freed_without_base: &BTreeMap<u32, usize>,
    notes: &mut Vec<String>,
) {
    let overflow: Vec<u32> = unseen
        .iter()
        .filter(|p| !freed_without_base.contains_key(p))
        .copied()
        .collect();
    if !overflow.is_empty() {
        // No base walk reaches them: taken for overflow pages, which hold no rows of their own
        // (a row whose chain needs one is undecided). A freed leaf is reached through its
        // parent, which SQLite wrote when it dropped the pointer, unless that parent's own
        // base is unknown or it is reached only through pages the generation did not write.
        notes.push(format!(
            "pages {overflow:?} were freed without their base and are in no tree's base: taken              for overflow pages"
        ));
    }
}

/// Attributing the pages of one version, once every tree was walked in it.
struct Attributing<'a> {
    pages: &'a GenerationPages,
    trees: &'a [Tree],
    image: &'a dyn Fn(u32) -> Option<Vec<u8>>,
    version: Version,
    /// The version's freelist, `None` when it is not known.
    free: Option<&'a BTreeSet<u32>>,
    /// The trees that reach each page in the version.
    reached: &'a BTreeMap<u32, BTreeSet<usize>>,
}

impl Attributing<'_> {
    /// Attributes `pgno`'s version: by structure when one tree reached it, else by content.
    fn page(
        &self,
        pgno: u32,
        owners: &mut BTreeMap<u32, usize>,
        unattributed: &mut BTreeSet<u32>,
        notes: &mut Vec<String>,
    ) {
        let (version, trees) = (self.version, self.trees);
        let Some(bytes) = version_of(self.pages, version, pgno) else {
            return;
        };
        let Ok(page) = decode_page(bytes, pgno, &self.pages.geometry) else {
            if self.reached.contains_key(&pgno) {
                notes.push(format!(
                    "page {pgno} ({} version) is in a tree but does not decode",
                    name(version)
                ));
                unattributed.insert(pgno);
            }
            return;
        };
        let holds_rows = page.cells.iter().any(|c| c.payload().is_some());
        match self
            .reached
            .get(&pgno)
            .map(|s| s.iter().copied().collect::<Vec<_>>())
        {
            Some(by) if by.len() == 1 => {
                if self.free.is_some_and(|f| f.contains(&pgno)) {
                    notes.push(format!(
                        "page {pgno} ({} version) is both on the freelist and in the tree of {}: \
                         not attributed",
                        name(version),
                        trees[by[0]].name
                    ));
                    unattributed.insert(pgno);
                } else {
                    owners.insert(pgno, by[0]);
                }
            }
            Some(by) => {
                let names: Vec<&str> = by.iter().map(|i| trees[*i].name.as_str()).collect();
                notes.push(format!(
                    "page {pgno} ({} version) is reached from the trees of {names:?}: not \
                     attributed",
                    name(version)
                ));
                if holds_rows {
                    unattributed.insert(pgno);
                }
            }
            None if !holds_rows => {}
            None => match self.free {
                Some(free) if free.contains(&pgno) => {}
                None => {
                    notes.push(format!(
                        "page {pgno} ({} version) is in no tree found, and the {0} freelist is \
                         not known, so its cells may be stale: not attributed",
                        name(version)
                    ));
                    unattributed.insert(pgno);
                }
                Some(_) => self.by_content(pgno, &page, owners, unattributed, notes),
            },
        }
    }

    /// Attributes `pgno`'s version, reached by no tree and on no freelist, by the trees its
    /// cells fit (or, when several rowid tables fit, by the one the image anchors its rows in).
    fn by_content(
        &self,
        pgno: u32,
        page: &Page<'_>,
        owners: &mut BTreeMap<u32, usize>,
        unattributed: &mut BTreeSet<u32>,
        notes: &mut Vec<String>,
    ) {
        let (version, trees) = (self.version, self.trees);
        let fit: Vec<usize> = (0..trees.len())
            .filter(|i| fits(page, &trees[*i], true))
            .collect();
        let anchored = match fit.len() {
            0 | 1 => None,
            _ => anchored_in(page, &fit, trees, self.image, self.pages),
        };
        if let [only] = fit.as_slice() {
            owners.insert(pgno, *only);
        } else if let Some((tree, anchors)) = anchored {
            notes.push(format!(
                "page {pgno} ({} version) is in no tree found and its cells fit {} trees; \
                 {anchors} of its rows are in the newer generation's file under {} alone, byte \
                 for byte: taken for that table's",
                name(version),
                fit.len(),
                trees[tree].name
            ));
            owners.insert(pgno, tree);
        } else if fit.len() > 1 && fit.iter().all(|i| !trees[*i].is_table()) {
            // Only indexes fit: whichever it is, it holds no table's rows.
        } else {
            let names: Vec<&str> = fit.iter().map(|i| trees[*i].name.as_str()).collect();
            notes.push(format!(
                "page {pgno} ({} version) is in no tree found, and its cells fit {} trees \
                 {names:?}: not attributed",
                name(version),
                fit.len()
            ));
            unattributed.insert(pgno);
        }
    }
}

/// "final" or "base".
fn name(version: Version) -> &'static str {
    match version {
        Version::Final => "final",
        Version::Base => "base",
    }
}

/// A page's version of the generation: final (carried pages) or base (known bases, freed pages).
pub(crate) fn version_of(pages: &GenerationPages, version: Version, pgno: u32) -> Option<&[u8]> {
    match version {
        Version::Final => pages.final_page(pgno),
        Version::Base => pages.base_page(pgno),
    }
}

/// The pages on the freelist of a version, `None` when it is not known. The generation changes
/// the freelist only by writing page 1: when page 1 is not carried, no page the generation wrote
/// was on it before or after (the lists are then given as empty). Trunks are read in the same
/// version, else (a trunk the generation did not write, unchanged by it) in the image.
fn freelist_of(
    pages: &GenerationPages,
    version: Version,
    image: &dyn Fn(u32) -> Option<Vec<u8>>,
    notes: &mut Vec<String>,
) -> Option<BTreeSet<u32>> {
    if !pages.final_pages.contains_key(&1) {
        return Some(BTreeSet::new());
    }
    let page1 = version_of(pages, version, 1)?;
    // Trunks from the image are owned here, so that the lookup can lend them.
    let mut from_image: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    loop {
        let (list, problem) = freelist(page1, |p| {
            version_of(pages, version, p).or_else(|| from_image.get(&p).map(Vec::as_slice))
        });
        let Some(problem) = problem else {
            return Some(list);
        };
        // A missing trunk the image has: fetch it and read again.
        let wanted = list
            .iter()
            .copied()
            .find(|p| version_of(pages, version, *p).is_none() && !from_image.contains_key(p));
        match wanted.and_then(|p| image(p).map(|b| (p, b))) {
            Some((p, bytes)) if problem.contains("not available") => {
                from_image.insert(p, bytes);
            }
            _ => {
                notes.push(format!("the {} freelist: {problem}", name(version)));
                return Some(list);
            }
        }
    }
}

/// One tree's walk in one version.
struct Walk<'a> {
    pages: &'a GenerationPages,
    version: Version,
    tree: &'a Tree,
    image: &'a dyn Fn(u32) -> Option<Vec<u8>>,
    seen: BTreeSet<u32>,
    /// The generation's pages reached (a version of them exists).
    reached: Vec<u32>,
    /// Pages freed without their base: a base walk that meets one marks it (in `seen`).
    unseen: &'a BTreeSet<u32>,
    notes: Vec<String>,
}

impl Walk<'_> {
    /// Walks the subtree at `pgno`; pages that cannot be read end their branch silently (the
    /// pages below are attributed by content), pages of the wrong kind or shape with a note.
    fn descend(&mut self, pgno: u32, depth: usize) {
        if depth >= MAX_DEPTH || !self.seen.insert(pgno) || self.unseen.contains(&pgno) {
            return;
        }
        let own = version_of(self.pages, self.version, pgno);
        // A carried page whose base did not exist, or whose base is unknown, is not read from
        // the image in the base walk: the image's version is not the base.
        let carried_without_base = self.version == Version::Base
            && matches!(
                self.pages.base.get(&pgno),
                Some(Base::Absent | Base::Unknown)
            );
        let image_bytes;
        let bytes = match own {
            Some(b) => b,
            None if carried_without_base => return,
            None => match (self.image)(pgno) {
                Some(b) => {
                    image_bytes = b;
                    &image_bytes
                }
                None => return,
            },
        };
        let Ok(page) = decode_page(bytes, pgno, &self.pages.geometry) else {
            if own.is_some() {
                self.reached.push(pgno);
            }
            return;
        };
        if page.kind.is_table() == self.tree.index_format() || !fits(&page, self.tree, false) {
            if own.is_some() {
                self.notes.push(format!(
                    "page {pgno} ({} version) is under the root of {} but is a {} page whose \
                     cells do not fit it",
                    name(self.version),
                    self.tree.name,
                    page.kind
                ));
            }
            return;
        }
        if own.is_some() {
            self.reached.push(pgno);
        }
        let children: Vec<u32> = page
            .cells
            .iter()
            .filter_map(Cell::left_child)
            .chain(page.right_child)
            .collect();
        for child in children {
            self.descend(child, depth + 1);
        }
    }
}

/// Of the rowid tables in `fit` (the trees a page's cells all fit), the one whose tree in the
/// capture's main image (the newer generation's file) holds some of the page's rows under the
/// same rowid with the same bytes, when exactly one does: a row the newer generation left as it
/// was is where the page's rows were. With how many rows agree. Only local bytes are compared
/// (a row with overflow pages is not an anchor), and the image is searched by rowid, one page
/// per level.
fn anchored_in(
    page: &Page<'_>,
    fit: &[usize],
    trees: &[Tree],
    image: &dyn Fn(u32) -> Option<Vec<u8>>,
    pages: &GenerationPages,
) -> Option<(usize, usize)> {
    let rows: Vec<(i64, &[u8])> = page
        .cells
        .iter()
        .filter_map(|c| match c {
            Cell::TableLeaf { rowid, payload } if payload.first_overflow.is_none() => {
                Some((*rowid, payload.local))
            }
            _ => None,
        })
        .collect();
    let mut found: Vec<(usize, usize)> = Vec::new();
    for &index in fit {
        let tree = &trees[index];
        if !matches!(
            tree.kind,
            TreeKind::Table {
                without_rowid: false,
                ..
            }
        ) {
            continue;
        }
        let anchors = rows
            .iter()
            .filter(|(rowid, bytes)| {
                row_in_image(tree.root, *rowid, image, pages).is_some_and(|b| b == *bytes)
            })
            .count();
        if anchors > 0 {
            found.push((index, anchors));
        }
    }
    match found.as_slice() {
        [one] => Some(*one),
        _ => None,
    }
}

/// The local bytes of row `rowid` in the table tree rooted at `root` in the image, if it is
/// there.
fn row_in_image(
    root: u32,
    rowid: i64,
    image: &dyn Fn(u32) -> Option<Vec<u8>>,
    pages: &GenerationPages,
) -> Option<Vec<u8>> {
    let mut pgno = root;
    for _ in 0..MAX_DEPTH {
        let bytes = image(pgno)?;
        let page = decode_page(&bytes, pgno, &pages.geometry).ok()?;
        match page.kind {
            PageKind::LeafTable => {
                return page.cells.iter().find_map(|c| match c {
                    Cell::TableLeaf { rowid: r, payload } if *r == rowid => {
                        Some(payload.local.to_vec())
                    }
                    _ => None,
                });
            }
            PageKind::InteriorTable => {
                let next = page.cells.iter().find_map(|c| match c {
                    Cell::TableInterior {
                        left_child,
                        rowid: key,
                    } if rowid <= *key => Some(*left_child),
                    _ => None,
                });
                pgno = next.or(page.right_child)?;
            }
            _ => return None,
        }
    }
    None
}

/// Whether every cell of `page` fits `tree`'s records: the page's format, at most as many values
/// as a full record (a row written before an `ADD COLUMN` has fewer), the rowid alias NULL; with
/// `strict`, also some cell with exactly a full record and the shape known. Values are counted
/// from the record header in the cell's local bytes.
pub(crate) fn fits(page: &Page<'_>, tree: &Tree, strict: bool) -> bool {
    if page.kind.is_table() == tree.index_format() {
        return false;
    }
    let Some(full) = tree.values else {
        return !strict;
    };
    let ipk = match tree.kind {
        TreeKind::Table { ipk, .. } => ipk,
        TreeKind::Index { .. } => None,
    };
    let mut some_full = false;
    for cell in &page.cells {
        let Some(payload) = cell.payload() else {
            continue;
        };
        let Some(types) = serial_types(payload.local) else {
            // The header runs into the overflow pages: counted as fitting.
            continue;
        };
        if types.len() > full || ipk.is_some_and(|i| types.get(i).is_some_and(|t| *t != 0)) {
            return false;
        }
        some_full |= types.len() == full;
    }
    !strict
        || (some_full
            && matches!(
                page.kind,
                PageKind::LeafTable | PageKind::LeafIndex | PageKind::InteriorIndex
            ))
}

/// The serial types of a record's header, read from its first bytes; `None` when the header is
/// not all there or malformed.
fn serial_types(record: &[u8]) -> Option<Vec<u64>> {
    let (size, mut at) = read_varint(record)?;
    let end = usize::try_from(size).ok()?;
    if end < at || end > record.len() {
        return None;
    }
    let mut types = Vec::new();
    while at < end {
        let (t, n) = read_varint(record.get(at..end)?)?;
        types.push(t);
        at += n;
    }
    Some(types)
}
