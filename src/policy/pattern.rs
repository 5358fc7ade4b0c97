//! A rule's `pattern`, compiled on first use: compiling the shipped policy's ~160 regexes
//! (and a set of all of them) took ~30 ms of CPU and most of the heap of every `run`
//! before its first SSH byte, while a command consults a handful of them at most.
//!
//! What keeps it cheap is a prefilter read from the pattern's text: a pattern written
//! `^prog...` or `^(?:a|b...)...` can only match a text that starts with one of its
//! leading literals (`prog`, `a`, `b`), so `true` never compiles a `^systemctl` rule.
//! The prefilter is conservative: any construct it does not fully understand (a flag
//! group, a nested class, no `^`) gives "no prefilter", and the regex decides alone.
//! It only ever skips a regex that could not have matched, so verdicts are unchanged.

use std::sync::{Arc, OnceLock};

use regex::Regex;

/// A rule's regex with its prefilter, both worked out when first needed (reading the
/// prefixes of all ~160 shipped patterns at load cost more than the few a command
/// reaches). Cheap to clone: clones share the compiled regex and the prefixes.
#[derive(Debug, Clone)]
pub(crate) struct Pattern {
    source: String,
    /// Every match starts at the beginning of the text with one of these; `None`: the
    /// pattern's text did not tell.
    prefixes: Arc<OnceLock<Option<Vec<String>>>>,
    compiled: Arc<OnceLock<Regex>>,
}

impl Pattern {
    /// A pattern to compile when first needed; [`Pattern::compile`] checks it now.
    pub(crate) fn new(source: &str) -> Pattern {
        Pattern {
            source: source.to_owned(),
            prefixes: Arc::default(),
            compiled: Arc::default(),
        }
    }

    fn prefix_list(&self) -> Option<&[String]> {
        self.prefixes
            .get_or_init(|| anchored_prefixes(&self.source))
            .as_deref()
    }

    /// Compiles the regex now (a policy file is checked whole at load, so that a bad
    /// pattern is refused with its line rather than found at match time).
    pub(crate) fn compile(&self) -> Result<&Regex, regex::Error> {
        if let Some(re) = self.compiled.get() {
            return Ok(re);
        }
        let re = Regex::new(&self.source)?;
        Ok(self.compiled.get_or_init(|| re))
    }

    /// The pattern as written.
    pub(crate) fn as_str(&self) -> &str {
        &self.source
    }

    /// Whether the regex matches `text` (the same answer as `Regex::is_match`).
    pub(crate) fn is_match(&self, text: &str) -> bool {
        if let Some(prefixes) = self.prefix_list() {
            if !prefixes.iter().any(|p| text.starts_with(p.as_str())) {
                return false;
            }
        }
        match self.compile() {
            Ok(re) => re.is_match(text),
            // Only the compiled-in policy is not compiled at load, and a unit test
            // compiles every one of its patterns.
            Err(e) => panic!("the policy pattern `{}` does not compile: {e}", self.source),
        }
    }

    #[cfg(test)]
    pub(crate) fn is_compiled(&self) -> bool {
        self.compiled.get().is_some()
    }

    #[cfg(test)]
    pub(crate) fn prefixes(&self) -> Option<&[String]> {
        self.prefix_list()
    }
}

/// Literals one of which every match of `pattern` starts with (wherever in the text it
/// starts), when each of its top-level alternatives begins (after an optional `^`) with
/// a literal or a `(?:...)` group whose alternatives do; `None` when that is not certain
/// or one of them may be empty. A policy's `redact` patterns are compiled only for text
/// that holds one of them.
pub(crate) fn leading_literals(pattern: &str) -> Option<Vec<String>> {
    let mut out = Vec::new();
    for alternative in split_alternatives(pattern.as_bytes())? {
        let alternative = alternative.strip_prefix(b"^").unwrap_or(alternative);
        out.extend(branch_prefixes(alternative)?);
    }
    (!out.iter().any(String::is_empty)).then_some(out)
}

/// The literals every match of `pattern` starts with at offset 0, when each of its
/// top-level alternatives begins with `^` and then a literal or a `(?:...)` group whose
/// alternatives do (recursively). `None` whenever that is not certain.
fn anchored_prefixes(pattern: &str) -> Option<Vec<String>> {
    let s = pattern.as_bytes();
    let mut out = Vec::new();
    for alternative in split_alternatives(s)? {
        out.extend(branch_prefixes(alternative.strip_prefix(b"^")?)?);
    }
    Some(out)
}

/// The prefixes of one alternative (no `|` at its top level); the empty string when it
/// may start with anything.
fn branch_prefixes(s: &[u8]) -> Option<Vec<String>> {
    if let Some(rest) = s.strip_prefix(b"(?:") {
        let close = 3 + group_end(rest)?;
        // An optional or counted group may match nothing: the text may start anywhere.
        if matches!(s.get(close + 1), Some(b'?' | b'*' | b'{')) {
            return Some(vec![String::new()]);
        }
        let mut out = Vec::new();
        for alternative in split_alternatives(&s[3..close])? {
            out.extend(branch_prefixes(alternative)?);
        }
        return Some(out);
    }
    if s.first() == Some(&b'(') {
        // A capture group or flags (`(?i)`, `(?x:`): not read here.
        return None;
    }
    let mut end = s.iter().position(|&b| !is_literal(b)).unwrap_or(s.len());
    // A quantifier after a literal applies to its last character only.
    if matches!(s.get(end), Some(b'?' | b'*' | b'{')) {
        end = end.saturating_sub(1);
    }
    Some(vec![String::from_utf8(s[..end].to_vec()).ok()?])
}

/// Characters that stand for themselves in a regex (outside a class, without flags).
fn is_literal(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b' ' | b'/' | b'=' | b',' | b':' | b'@')
}

/// Splits at the `|` of the top level (outside groups, classes and escapes).
fn split_alternatives(s: &[u8]) -> Option<Vec<&[u8]>> {
    let mut parts = Vec::new();
    let (mut depth, mut start, mut i) = (0usize, 0, 0);
    while i < s.len() {
        match s[i] {
            b'\\' => i += 1,
            b'[' => i = class_end(s, i)?,
            b'(' => depth += 1,
            b')' => depth = depth.checked_sub(1)?,
            b'|' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if depth != 0 || i > s.len() {
        return None;
    }
    parts.push(&s[start..]);
    Some(parts)
}

/// The index in `s` of the `)` closing a group whose `(` came just before `s`.
fn group_end(s: &[u8]) -> Option<usize> {
    let (mut depth, mut i) = (1usize, 0);
    while i < s.len() {
        match s[i] {
            b'\\' => i += 1,
            b'[' => i = class_end(s, i)?,
            b'(' => depth += 1,
            b')' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// The index of the `]` closing the class opened at `s[open]`; `None` for a nested class
/// (`[[:alpha:]]`, `[a-z&&[^x]]`), which is not read here.
fn class_end(s: &[u8], open: usize) -> Option<usize> {
    let mut i = open + 1;
    if s.get(i) == Some(&b'^') {
        i += 1;
    }
    // A `]` first in the class is a literal.
    if s.get(i) == Some(&b']') {
        i += 1;
    }
    while i < s.len() {
        match s[i] {
            b'\\' => i += 1,
            b'[' => return None,
            b']' => return Some(i),
            _ => {}
        }
        i += 1;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prefixes(p: &str) -> Option<Vec<String>> {
        anchored_prefixes(p)
    }

    fn strings(v: &[&str]) -> Option<Vec<String>> {
        Some(v.iter().map(|s| s.to_string()).collect())
    }

    #[test]
    fn reads_the_leading_literals_of_anchored_patterns() {
        assert_eq!(prefixes("^rm(?: \\S+)* -rf"), strings(&["rm"]));
        assert_eq!(
            prefixes("^(?:chmod|chown|chgrp)(?: \\S+)*"),
            strings(&["chmod", "chown", "chgrp"])
        );
        assert_eq!(prefixes("^ip6?tables -L"), strings(&["ip"]));
        assert_eq!(prefixes("^ab*c"), strings(&["a"]));
        assert_eq!(prefixes("^ab{2}c"), strings(&["a"]));
        assert_eq!(prefixes("^ab+c"), strings(&["ab"]));
        assert_eq!(
            prefixes("^(?:(?:reboot|halt)(?: |$)|(?:init|telinit) [016]$|systemctl x)"),
            strings(&["reboot", "halt", "init", "telinit", "systemctl x"])
        );
        assert_eq!(
            prefixes("^service \\S+ (?:status)$|^service --status-all$"),
            strings(&["service ", "service --status-all"])
        );
        assert_eq!(prefixes("^mkfs(?:\\.\\w+)?|^x"), strings(&["mkfs", "x"]));
        assert_eq!(prefixes("^[a-z]+"), strings(&[""]));
        assert_eq!(prefixes("^(?:ab)?c"), strings(&[""]));
        assert_eq!(prefixes("^(?:a|)b"), strings(&["a", ""]));
        assert_eq!(prefixes("^a[|(]b|^c"), strings(&["a", "c"]));
    }

    #[test]
    fn gives_up_on_what_it_does_not_read() {
        for p in [
            "rm -rf",
            "^rm|kill",
            "(?i)^rm",
            "^(?i:rm)",
            "^(rm|kill)",
            "^(?x) rm",
            "^a[[:alpha:]]",
            "^a(?:b",
            "^a)b",
            "^a[bc",
        ] {
            assert_eq!(prefixes(p), None, "{p}");
        }
    }

    #[test]
    fn leading_literals_are_prefixes_of_every_match_anywhere() {
        let lits = |p: &str| leading_literals(p);
        assert_eq!(lits("AKIA[0-9A-Z]{16}"), strings(&["AKIA"]));
        assert_eq!(lits("sk_(?:live|test)_[A-Za-z0-9]{16,}"), strings(&["sk_"]));
        assert_eq!(lits("^tok_|key-"), strings(&["tok_", "key-"]));
        assert_eq!(lits("(?:ab|cd)x"), strings(&["ab", "cd"]));
        for p in [
            "", "[a-z]+", "(?i)tok_", "a?b", "(?:ab)?c", "tok|", "\\btok", "x*",
        ] {
            assert_eq!(lits(p), None, "{p}");
        }
        let texts = [
            "tok_1",
            "a key-2",
            "AKIA1234567890ABCDEF",
            "x ab",
            "cdx",
            "nothing",
        ];
        for p in ["^tok_|key-", "(?:ab|cd)x", "AKIA[0-9A-Z]{16}", "ke?y-"] {
            let re = Regex::new(p).unwrap();
            let lits = leading_literals(p).unwrap();
            for t in texts {
                if re.is_match(t) {
                    assert!(lits.iter().any(|l| t.contains(l.as_str())), "{p} on {t}");
                }
            }
        }
    }

    #[test]
    fn a_filtered_pattern_answers_as_its_regex() {
        let texts = [
            "rm -rf /",
            "rmdir /x",
            "iptables -L",
            "ip6tables -L",
            "ip link",
            "service nginx status",
            "service --status-all",
            "true",
            "",
        ];
        for p in [
            "^rm(?: \\S+)* -rf /$",
            "^ip6?tables -L",
            "^service \\S+ (?:status)$|^service --status-all$",
            "^(?:ab)?c",
            "^[a-z]+$",
        ] {
            let pattern = Pattern::new(p);
            let re = Regex::new(p).unwrap();
            for t in texts {
                assert_eq!(pattern.is_match(t), re.is_match(t), "{p} on {t:?}");
            }
        }
    }

    #[test]
    fn clones_share_the_compiled_regex() {
        let a = Pattern::new("^x");
        let b = a.clone();
        assert!(a.is_match("xy"));
        assert!(b.compiled.get().is_some());
    }
}
