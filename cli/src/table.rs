//! The command line's tables (bench, bench --cost, recover's report), through comfy-table:
//! borderless, two spaces between columns, numbers right-aligned, no trailing blanks. A row starts
//! with its first cell and ends with its last, so a script (and the tests) can read it by words.

use comfy_table::presets::NOTHING;
use comfy_table::{CellAlignment, Table};

/// A table with `header`, the columns whose index is in `right` right-aligned.
pub fn new(header: &[&str], right: &[usize]) -> Table {
    let mut table = Table::new();
    table.load_style(NOTHING).set_header(header.to_vec());
    for (i, column) in table.column_iter_mut().enumerate() {
        column.set_padding((0, 2));
        if right.contains(&i) {
            column.set_cell_alignment(CellAlignment::Right);
        }
    }
    table
}

/// The table's lines, each without trailing blanks.
pub fn render(table: &Table) -> String {
    table.trim_fmt()
}

#[cfg(test)]
mod tests {
    #[test]
    fn rows_start_with_the_first_cell_and_end_with_the_last() {
        let mut t = super::new(&["id", "ratio", "result"], &[1]);
        t.add_row(vec!["W1-NORMAL", "0.990", "PASS"]);
        t.add_row(vec!["R1", "1.000", "MISS"]);
        let text = super::render(&t);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines[0], "id         ratio  result");
        assert_eq!(lines[1], "W1-NORMAL  0.990  PASS");
        assert_eq!(lines[2], "R1         1.000  MISS");
    }
}
