//! The policy file as written: serde types that mirror the TOML exactly (unknown keys
//! rejected), plus the helpers that turn byte spans into line numbers and key paths for
//! error messages. Validation into the checked `Policy` happens in `mod.rs`.

use std::collections::BTreeMap;
use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

/// The whole file. Every key is optional here so that a missing key gets our own
/// message (with the fix) instead of serde's terse "missing field".
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawPolicy {
    pub default_family: Option<Spanned<String>>,
    pub families: Option<Spanned<BTreeMap<Spanned<String>, Spanned<RawFamily>>>>,
    #[serde(default)]
    pub rule: Vec<Spanned<RawRule>>,
    pub redact: Option<Vec<Spanned<String>>>,
    pub escalate_after: Option<Spanned<String>>,
    pub approvers: Option<Spanned<String>>,
}

/// One `[families.<name>]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawFamily {
    pub attempts: Option<Spanned<i64>>,
    pub after_interrupted: Option<Spanned<String>>,
    pub min_retention: Option<Spanned<String>>,
    pub repeat_window: Option<Spanned<String>>,
    pub on_repeat: Option<Spanned<String>>,
}

/// One `[[rule]]` table.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawRule {
    pub name: Option<Spanned<String>>,
    pub family: Option<Spanned<String>>,
    pub programs: Option<Spanned<Vec<Spanned<String>>>>,
    pub pattern: Option<Spanned<String>>,
    pub deny: Option<Spanned<bool>>,
    pub approval: Option<Spanned<String>>,
    pub locks: Option<Spanned<Vec<Spanned<String>>>>,
}

/// The 1-based line of a byte offset.
pub(crate) fn line_of(text: &str, offset: usize) -> usize {
    let end = offset.min(text.len());
    text.as_bytes()[..end]
        .iter()
        .filter(|&&b| b == b'\n')
        .count()
        + 1
}

/// The dotted key path in effect at `span` (e.g. `families.read-only.attempts` or
/// `rule[3].pattern`), recovered from the source text because toml's errors carry only
/// a span. Good enough for messages; never used for logic.
pub(crate) fn key_path_at(text: &str, span: &Range<usize>, field: Option<&str>) -> String {
    let start = span.start.min(text.len());
    let line_start = text[..start].rfind('\n').map_or(0, |i| i + 1);
    let line_end = text[start..].find('\n').map_or(text.len(), |i| start + i);
    let line = text[line_start..line_end].trim();

    // The table header in effect: the nearest `[...]` line at or above this one.
    let mut header = String::new();
    let mut rule_count = 0usize;
    let mut header_line_is_this = false;
    for (i, l) in text[..line_end].lines().enumerate() {
        let l = l.trim();
        if l.starts_with("[[") {
            let name = l.trim_start_matches('[').trim_end_matches(']').trim();
            if name == "rule" {
                rule_count += 1;
                header = format!("rule[{rule_count}]");
            } else {
                header = name.to_string();
            }
        } else if l.starts_with('[') {
            header = l
                .trim_start_matches('[')
                .trim_end_matches(']')
                .trim()
                .to_string();
        }
        header_line_is_this = l.starts_with('[') && line_start == offset_of_line(text, i);
    }

    let key_on_line = if header_line_is_this {
        None
    } else {
        line.split_once('=')
            .map(|(k, _)| k.trim().trim_matches('"').to_string())
            .filter(|k| !k.is_empty())
    };
    let leaf = field.map(str::to_string).or(key_on_line);
    match (header.is_empty(), leaf) {
        (true, Some(leaf)) => leaf,
        (false, Some(leaf)) => format!("{header}.{leaf}"),
        (true, None) => "(top level)".to_string(),
        (false, None) => header,
    }
}

fn offset_of_line(text: &str, line_index: usize) -> usize {
    if line_index == 0 {
        return 0;
    }
    text.match_indices('\n')
        .nth(line_index - 1)
        .map_or(text.len(), |(i, _)| i + 1)
}

/// The field name quoted in a serde message such as "unknown field `foo`, expected ...".
pub(crate) fn quoted_field(message: &str, after: &str) -> Option<String> {
    let rest = &message[message.find(after)? + after.len()..];
    let rest = rest.trim_start().strip_prefix('`')?;
    Some(rest[..rest.find('`')?].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_path_names_table_and_key() {
        let text = "default_family = \"x\"\n[families.read-only]\nattempts = 0\n[[rule]]\nfamily = \"a\"\n[[rule]]\npattern = \"(\"\n";
        let at = |needle: &str| {
            let i = text.find(needle).unwrap() + usize::from(needle.starts_with('\n'));
            key_path_at(text, &(i..i + 1), None)
        };
        assert_eq!(at("default_family"), "default_family");
        assert_eq!(at("attempts"), "families.read-only.attempts");
        assert_eq!(at("\nfamily = "), "rule[1].family");
        assert_eq!(at("pattern"), "rule[2].pattern");
        assert_eq!(line_of(text, text.find("pattern").unwrap()), 7);
    }

    #[test]
    fn quoted_field_reads_serde_messages() {
        assert_eq!(
            quoted_field("unknown field `atempts`, expected one of", "unknown field"),
            Some("atempts".to_string())
        );
        assert_eq!(quoted_field("invalid type", "unknown field"), None);
    }
}
