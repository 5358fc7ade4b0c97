//! Text for people, shared by the commands: stored text made safe for a terminal, cut or
//! wrapped to a width, and the ledger's times shown to the second.

/// The width `show` wraps its timeline to.
pub const WIDTH: usize = 80;

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

/// Appends `prefix` + `text`, wrapping at [`WIDTH`] with continuation lines aligned under
/// the text's first column. Words longer than a line are split.
pub fn wrap_into(out: &mut String, prefix: &str, text: &str) {
    let indent = prefix.chars().count();
    let room = WIDTH.saturating_sub(indent).max(20);
    let mut line = String::new();
    let mut lines = Vec::new();
    for word in text.split(' ') {
        let mut word: String = word.to_owned();
        loop {
            let used = line.chars().count();
            let wlen = word.chars().count();
            let need = if used == 0 { wlen } else { used + 1 + wlen };
            if need <= room {
                if used > 0 {
                    line.push(' ');
                }
                line.push_str(&word);
                break;
            }
            if used > 0 {
                lines.push(std::mem::take(&mut line));
                continue;
            }
            // A single word longer than the room: split it.
            let head: String = word.chars().take(room).collect();
            lines.push(head);
            word = word.chars().skip(room).collect();
        }
    }
    lines.push(line);
    for (i, l) in lines.iter().enumerate() {
        if i == 0 {
            out.push_str(prefix);
        } else {
            out.push_str(&" ".repeat(indent));
        }
        out.push_str(l);
        out.push('\n');
    }
}
