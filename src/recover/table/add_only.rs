//! The add-only rule (`MergeRule::AddOnly`): a capture whose image may hold a newer
//! generation's checkpoints cannot say what its own generation changed or deleted. A row its
//! delta calls changed is added when the live database lacks that content (under a fresh rowid
//! when the live table holds other content under its rowid); the live row is never touched. A
//! row its delta calls deleted stays. Both are reported as undecided, side by side on request.

use super::{Remaps, TableMerge};
use crate::recover::context::Merge;
use crate::recover::report::{RowIdentity, UndecidedRow};
use crate::recover::value::{same_row, Val};
use crate::recover::RecoverError;

/// How many undecided keys a report names without `--undecided`.
const KEYS_SHOWN: usize = 5;

impl TableMerge<'_> {
    /// A row the delta says the captured generation changed from `before` to `values`;
    /// `moved`: `rowid` is where an earlier merge of this generation added it (its own was
    /// taken).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn changed_add_only(
        &mut self,
        m: &Merge<'_>,
        remaps: &mut Remaps,
        values: Vec<Val>,
        before: Vec<Val>,
        rowid: Option<i64>,
        orphan: bool,
        moved: bool,
    ) -> Result<(), RecoverError> {
        match self.live_row(m, &values, rowid)? {
            Some(live) if same_row(&live, &values) => {
                self.report.already_live += 1;
                // Added beside the live row before (undecided then): only the report says so.
                self.report.added_beside_before += u64::from(moved);
                Ok(())
            }
            // The live database has no row of that identity: the captured row is added.
            None => self.insert(m, remaps, values, rowid, orphan, false),
            Some(live) => {
                self.undecided(m, &before, Some(&values), Some(&live), rowid, None);
                if self.identity == RowIdentity::Rowid {
                    // Its content is added beside the live row, under a fresh rowid.
                    self.report.undecided_added_beside += 1;
                    self.insert(m, remaps, values, rowid, orphan, true)
                } else {
                    // A declared key holds one row: the live one stays.
                    Ok(())
                }
            }
        }
    }

    /// Counts a row left as it is live; keeps its key, and with `--undecided` the three rows
    /// (and why, when the rule says more than they show).
    pub(super) fn undecided(
        &mut self,
        m: &Merge<'_>,
        image: &[Val],
        captured: Option<&[Val]>,
        live: Option<&[Val]>,
        rowid: Option<i64>,
        reason: Option<&str>,
    ) {
        self.report.undecided += 1;
        let key = self.key_text(captured.unwrap_or(image), rowid);
        if self.report.undecided_keys.len() < KEYS_SHOWN {
            self.report.undecided_keys.push(key.clone());
        }
        if m.options.list_undecided {
            let text = |row: &[Val]| row.iter().map(Val::to_string).collect::<Vec<_>>();
            let row = UndecidedRow {
                key,
                image: text(image),
                captured: captured.map(text),
                live: live.map(text),
                columns: self.src_cols.clone(),
                reason: reason.map(str::to_owned),
            };
            self.report.undecided_rows.push(row);
        }
    }
}
