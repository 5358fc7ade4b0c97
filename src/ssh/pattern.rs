//! OpenSSH's pattern matching (its `match.c`): `*`/`?` globs and comma-separated pattern
//! lists with `!` negation, as ssh_config `Host`/`Match` lines, known_hosts host lists
//! and algorithm lists use them.

/// OpenSSH `match_pattern_list` for known_hosts host lists: true when some positive
/// pattern matches and no negated (`!`) pattern does. `name` must already be
/// lower-case; patterns are compared case-insensitively.
pub fn match_pattern_list(name: &str, patterns: &[String]) -> bool {
    patterns.iter().all(|p| pattern_list(name, p, true) != -1)
        && patterns.iter().any(|p| pattern_list(name, p, true) == 1)
}

/// OpenSSH `match_pattern_list(string, list, dolower)`: 1 when a positive
/// comma-separated pattern matches, -1 when a negated one does, else 0.
pub(super) fn pattern_list(s: &str, list: &str, lower: bool) -> i32 {
    let mut positive = 0;
    for p in list.split(',').filter(|p| !p.is_empty()) {
        let (negated, p) = match p.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, p),
        };
        let p = if lower {
            p.to_ascii_lowercase()
        } else {
            p.to_string()
        };
        if wildcard_match(&p, s) {
            if negated {
                return -1;
            }
            positive = 1;
        }
    }
    positive
}

/// Glob match with `*` (any run) and `?` (one character), nothing else special.
pub fn wildcard_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // Iterative matcher with single backtrack point: linear in practice, no recursion.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}
