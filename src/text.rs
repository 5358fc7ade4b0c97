//! Stored text as people read it, shared by the render layer and the reports that carry
//! a line for people (`show`'s outcome, `cancel`'s message): text made safe for a
//! terminal, cut to a width, and the ledger's RFC 3339 times read or shown to the second.

/// `s` with control characters escaped, so stored text cannot drive the terminal.
pub fn printable(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_owned();
    }
    s.chars()
        .map(|c| {
            if c.is_control() {
                c.escape_default().to_string()
            } else {
                c.to_string()
            }
        })
        .collect()
}

/// The columns `s` takes on a terminal (a wide character two, a combining mark none).
pub fn width(s: &str) -> usize {
    unicode_width::UnicodeWidthStr::width(s)
}

/// Cuts `s` to at most `width` terminal columns, marking the cut with `…`.
pub fn fit(s: &str, width: usize) -> String {
    if self::width(s) <= width {
        return s.to_owned();
    }
    let room = width.saturating_sub(1);
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let w = unicode_width::UnicodeWidthChar::width(c).unwrap_or(0);
        if used + w > room {
            break;
        }
        used += w;
        out.push(c);
    }
    if width > 0 {
        out.push('…');
    }
    out
}

/// `s` padded with spaces to `width` terminal columns (`format!("{:w$}")` counts chars,
/// which misaligns a column holding wide characters).
pub fn pad(s: &str, width: usize) -> String {
    let mut out = s.to_owned();
    out.push_str(&" ".repeat(width.saturating_sub(self::width(s))));
    out
}

/// `text` wrapped at `width` columns, each line on its own, breaking only at spaces:
/// a help text written one logical line per paragraph or table row reads cleanly at any
/// terminal width. A continuation is indented under the text of its line: under the
/// second column of a row `  label   text` (an indented first word followed by two or
/// more spaces), two columns in for another indented line, not at all for a paragraph.
/// Spacing inside a row is kept; a word longer than a line is not cut.
pub fn wrap_hanging(text: &str, width: usize) -> String {
    let mut out = String::new();
    for line in text.lines() {
        let indent = line.len() - line.trim_start_matches(' ').len();
        let body = &line[indent..];
        let hang = match body.find("  ") {
            Some(gap) if indent > 0 && !body[..gap].contains(' ') => {
                let after = &body[gap..];
                indent + gap + (after.len() - after.trim_start_matches(' ').len())
            }
            _ if indent > 0 => indent + 2,
            _ => 0,
        };
        let mut row = " ".repeat(indent);
        let mut has_word = false;
        let mut spaces = 0;
        for word in body.split(' ') {
            if word.is_empty() {
                spaces += 1; // one more space in a run of them
                continue;
            }
            let gap = if has_word { spaces + 1 } else { 0 };
            spaces = 0;
            if has_word && self::width(&row) + gap + self::width(word) > width {
                out.push_str(&row);
                out.push('\n');
                row = " ".repeat(hang);
            } else {
                row.push_str(&" ".repeat(gap));
            }
            row.push_str(word);
            has_word = true;
        }
        out.push_str(&row);
        out.push('\n');
    }
    out
}

/// `2024-05-01T10:00:00.123456Z` → `2024-05-01 10:00:00`.
pub fn to_second(at: &str) -> String {
    Stamp::of(at).second()
}

/// An RFC 3339 time as the ledger stores it.
pub fn parse_at(at: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
}

/// A ledger time (RFC 3339, as the ledger writes it: UTC, microseconds), read once and
/// shown in parts in UTC. Text that is not such a time (a row edited by hand, a future
/// format) is shown cut by position as stored, so that nothing is hidden.
#[derive(Debug, Clone)]
pub struct Stamp<'a> {
    raw: &'a str,
    at: Option<time::OffsetDateTime>,
}

impl<'a> Stamp<'a> {
    /// The time `raw` holds.
    pub fn of(raw: &'a str) -> Stamp<'a> {
        Stamp {
            raw,
            at: parse_at(raw).map(|t| t.to_offset(time::UtcOffset::UTC)),
        }
    }

    fn shown(&self, format: &[time::format_description::BorrowedFormatItem<'_>]) -> Option<String> {
        self.at.and_then(|t| t.format(format).ok())
    }

    /// `2024-05-01`.
    pub fn day(&self) -> String {
        self.shown(time::macros::format_description!("[year]-[month]-[day]"))
            .unwrap_or_else(|| self.raw.get(..10).unwrap_or("").to_owned())
    }

    /// `2024-05-01 10:00:00`.
    pub fn second(&self) -> String {
        self.shown(time::macros::format_description!(
            "[year]-[month]-[day] [hour]:[minute]:[second]"
        ))
        .unwrap_or_else(|| self.raw.get(..19).unwrap_or(self.raw).replace('T', " "))
    }

    /// `10:00:00.123`.
    pub fn clock(&self) -> String {
        self.shown(time::macros::format_description!(
            "[hour]:[minute]:[second].[subsecond digits:3]"
        ))
        .unwrap_or_else(|| self.raw.get(11..23).unwrap_or(self.raw).to_owned())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_ledger_time_is_shown_by_its_parts_in_utc() {
        let at = Stamp::of("2026-03-04T22:30:59.123456Z");
        assert_eq!(at.day(), "2026-03-04");
        assert_eq!(at.second(), "2026-03-04 22:30:59");
        assert_eq!(at.clock(), "22:30:59.123");
        // Another offset is the same instant, shown in UTC (slicing showed 01:30).
        let east = Stamp::of("2026-03-05T01:30:59.5+03:00");
        assert_eq!(east.second(), "2026-03-04 22:30:59");
        assert_eq!(east.clock(), "22:30:59.500");
    }

    #[test]
    fn widths_are_terminal_columns_not_chars() {
        // Two columns per CJK character, none for a combining accent.
        assert_eq!(width("日本"), 4);
        assert_eq!(width("e\u{301}"), 1);
        assert_eq!(fit("日本語テキスト", 7), "日本語…");
        assert!(width(&fit("日本語テキスト", 7)) <= 7);
        assert_eq!(fit("abcdef", 6), "abcdef");
        assert_eq!(fit("abcdefg", 6), "abcde…");
        assert_eq!(pad("日本", 6), "日本  ");
    }

    #[test]
    fn help_text_wraps_under_its_column_and_keeps_short_rows_as_written() {
        let text = "A paragraph of several words.\n  label     one two three four\n  240 a    241 b\n  plain indented line here\n";
        assert_eq!(wrap_hanging(text, 80), text);
        assert_eq!(
            wrap_hanging(text, 20),
            "A paragraph of\nseveral words.\n  label     one two\n            three\n            four\n  240 a    241 b\n  plain indented\n    line here\n"
        );
        for line in wrap_hanging(text, 20).lines() {
            assert!(width(line) <= 20, "{line:?}");
        }
        // A word longer than the line stands alone, uncut.
        assert_eq!(wrap_hanging("a verylongword b", 6), "a\nverylongword\nb\n");
    }

    #[test]
    fn text_that_is_no_time_is_shown_as_stored() {
        let odd = Stamp::of("2026-03-04 garbage here");
        assert_eq!(odd.day(), "2026-03-04");
        assert_eq!(odd.second(), "2026-03-04 garbage ");
        assert_eq!(Stamp::of("soon").clock(), "soon");
    }
}
