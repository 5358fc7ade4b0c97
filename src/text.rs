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

/// Cuts `s` to `width` characters, marking the cut with `…`.
pub fn fit(s: &str, width: usize) -> String {
    if s.chars().count() <= width {
        s.to_owned()
    } else {
        let mut out: String = s.chars().take(width.saturating_sub(1)).collect();
        out.push('…');
        out
    }
}

/// `2024-05-01T10:00:00.123456Z` → `2024-05-01 10:00:00`.
pub fn to_second(at: &str) -> String {
    at.get(..19).unwrap_or(at).replace('T', " ")
}

/// An RFC 3339 time as the ledger stores it.
pub fn parse_at(at: &str) -> Option<time::OffsetDateTime> {
    time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339).ok()
}
