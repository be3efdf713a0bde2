//! Plain text tables: a header row, columns padded to their widest cell,
//! numbers aligned right.

/// A table being filled.
pub(crate) struct Table {
    header: Vec<&'static str>,
    /// Whether each column is aligned right (numbers).
    right: Vec<bool>,
    rows: Vec<Vec<String>>,
}

/// A right-aligned column: a header ending in this marker.
const RIGHT: char = '>';

impl Table {
    /// A table with these column headers; a header ending in `>` (the
    /// marker is not shown) is aligned right.
    pub(crate) fn new(header: &[&'static str]) -> Table {
        Table {
            header: header.iter().map(|h| h.trim_end_matches(RIGHT)).collect(),
            right: header.iter().map(|h| h.ends_with(RIGHT)).collect(),
            rows: Vec::new(),
        }
    }

    /// Adds a row (missing cells are empty).
    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The table as lines of text, two spaces between columns.
    pub(crate) fn render(&self) -> String {
        let cell = |row: &[String], i: usize| row.get(i).map_or("", |c| c.as_str()).to_owned();
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.chars().count()).collect();
        for row in &self.rows {
            for (i, width) in widths.iter_mut().enumerate() {
                *width = (*width).max(cell(row, i).chars().count());
            }
        }
        let header: Vec<String> = self.header.iter().map(|h| (*h).to_owned()).collect();
        let mut out = String::new();
        for row in std::iter::once(&header).chain(&self.rows) {
            let mut line = String::new();
            for (i, width) in widths.iter().enumerate() {
                if i > 0 {
                    line.push_str("  ");
                }
                let text = cell(row, i);
                let pad = " ".repeat(width - text.chars().count());
                if self.right[i] {
                    line.push_str(&pad);
                    line.push_str(&text);
                } else {
                    line.push_str(&text);
                    line.push_str(&pad);
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_padded_and_numbers_aligned_right() {
        let mut table = Table::new(&["NAME", "COUNT>"]);
        table.row(vec!["mail-sender".into(), "7".into()]);
        table.row(vec!["a".into(), "1200".into()]);
        assert_eq!(
            table.render(),
            "NAME         COUNT\nmail-sender      7\na             1200\n"
        );
    }
}
