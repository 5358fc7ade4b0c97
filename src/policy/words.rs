//! Shell words as the rules see them: quotes removed, expansions noted, command
//! substitutions collected so the classifier can classify their commands too.

use brush_parser::word::{self, WordPiece, WordPieceWithSource};
use brush_parser::ParserOptions;

/// What a shell word says once its quoting is removed.
#[derive(Debug, Clone, Default)]
pub(crate) struct WordInfo {
    /// The word as written (quotes included), for display.
    pub raw: String,
    /// The literal text after quote removal; expansions appear as written (`$HOME`).
    pub text: String,
    /// The word contains an expansion whose value is only known at run time
    /// (parameter, command substitution, arithmetic).
    pub expands: bool,
    /// The word contains unquoted glob or brace-expansion syntax, so the shell may turn
    /// it into other words (`{rm,-rf,/}` runs `rm`).
    pub globs: bool,
    /// Command substitutions inside the word (`$(...)` and backquotes), as source text.
    pub substitutions: Vec<String>,
    /// Expansions that may run commands but whose inner commands we cannot extract
    /// (e.g. `${x:-$(cmd)}`, `$(( $(cmd) ))`); the classifier treats them as destructive.
    pub opaque: Vec<String>,
    /// The word could not be parsed as a shell word.
    pub error: Option<String>,
}

/// Analyses one word as written in the command.
pub(crate) fn analyse(raw: &str, options: &ParserOptions) -> WordInfo {
    let mut info = WordInfo {
        raw: raw.to_string(),
        ..WordInfo::default()
    };
    match word::parse(raw, options) {
        Ok(pieces) => walk(raw, &pieces, false, &mut info),
        Err(e) => {
            info.error = Some(e.to_string());
            info.text = raw.to_string();
            info.expands = true;
        }
    }
    info
}

/// Analyses a here-document body (quotes are literal there; expansions are not).
pub(crate) fn analyse_heredoc(body: &str, options: &ParserOptions) -> WordInfo {
    let mut info = WordInfo {
        raw: body.to_string(),
        ..WordInfo::default()
    };
    match word::parse_heredoc(body, options) {
        Ok(pieces) => walk(body, &pieces, true, &mut info),
        Err(e) => {
            info.error = Some(e.to_string());
            info.expands = true;
        }
    }
    info
}

fn source_of<'a>(raw: &'a str, piece: &WordPieceWithSource) -> &'a str {
    raw.get(piece.start_index..piece.end_index).unwrap_or(raw)
}

/// True when expansion text may hide a command that runs.
fn may_run_commands(text: &str) -> bool {
    // `$((` opens arithmetic, which runs nothing by itself; a `$(` inside it still counts.
    let substitution = text
        .match_indices("$(")
        .any(|(i, _)| !text[i + 2..].starts_with('('));
    substitution || text.contains('`') || text.contains("<(") || text.contains(">(")
}

fn walk(raw: &str, pieces: &[WordPieceWithSource], quoted: bool, info: &mut WordInfo) {
    for piece in pieces {
        match &piece.piece {
            WordPiece::Text(s) => {
                if !quoted && has_glob_or_brace(s) {
                    info.globs = true;
                }
                info.text.push_str(s);
            }
            WordPiece::SingleQuotedText(s) | WordPiece::AnsiCQuotedText(s) => info.text.push_str(s),
            WordPiece::DoubleQuotedSequence(inner)
            | WordPiece::GettextDoubleQuotedSequence(inner) => {
                walk(raw, inner, true, info);
            }
            WordPiece::TildeExpansion(_) => info.text.push_str(source_of(raw, piece)),
            WordPiece::EscapeSequence(s) => info.text.push_str(s.strip_prefix('\\').unwrap_or(s)),
            WordPiece::ParameterExpansion(_) | WordPiece::ArithmeticExpression(_) => {
                let src = source_of(raw, piece);
                info.expands = true;
                info.text.push_str(src);
                if may_run_commands(src) {
                    info.opaque.push(src.to_string());
                }
            }
            WordPiece::CommandSubstitution(s) | WordPiece::BackquotedCommandSubstitution(s) => {
                info.expands = true;
                info.text.push_str(source_of(raw, piece));
                info.substitutions.push(s.clone());
            }
        }
    }
}

/// Unquoted `*`, `?`, `[` or a brace expression with `,` or `..` between braces.
fn has_glob_or_brace(s: &str) -> bool {
    if s.contains(['*', '?', '[']) {
        return true;
    }
    match (s.find('{'), s.rfind('}')) {
        (Some(open), Some(close)) if open < close => {
            let inner = &s[open + 1..close];
            inner.contains(',') || inner.contains("..")
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(raw: &str) -> WordInfo {
        analyse(raw, &ParserOptions::default())
    }

    #[test]
    fn quotes_are_removed_and_expansions_noted() {
        assert_eq!(a("'rm'").text, "rm");
        assert_eq!(a("\"a b\"").text, "a b");
        assert_eq!(a("\\;").text, ";");
        assert!(!a("'$HOME'").expands);
        assert!(a("$HOME").expands);
        assert!(a("\"$HOME\"").expands);
    }

    #[test]
    fn substitutions_are_collected_even_inside_double_quotes() {
        assert_eq!(a("$(rm -rf /)").substitutions, vec!["rm -rf /".to_string()]);
        assert_eq!(a("\"x$(date)\"").substitutions, vec!["date".to_string()]);
        assert_eq!(a("`id`").substitutions, vec!["id".to_string()]);
        assert!(a("'$(rm)'").substitutions.is_empty());
        assert_eq!(a("${x:-$(rm -rf /)}").opaque.len(), 1);
        // Arithmetic runs nothing; a substitution inside it does.
        assert!(a("$((i+1))").opaque.is_empty());
        assert_eq!(a("$(( $(id -u) + 1 ))").opaque.len(), 1);
    }

    #[test]
    fn unquoted_globs_and_braces_are_flagged() {
        assert!(a("{rm,-rf,/}").globs);
        assert!(a("/bin/r?").globs);
        assert!(!a("'*'").globs);
        assert!(!a("{}").globs);
    }
}
