//! The host names a user has told OpenSSH about: `Host` entries of the ssh config (plain
//! names, not patterns) and the names in its known_hosts files. They answer two
//! questions: "did you mean" for a name that resolves nowhere (a typo must not become a
//! ledger operation), and what shell completion offers for a HOST.

use std::net::ToSocketAddrs as _;
use std::path::{Path, PathBuf};

use super::{host_spec, Context, HostOptions};

/// Every plain host name of the ssh config in effect (`-F`, else `~/.ssh/config` and
/// `/etc/ssh/ssh_config`) and of the known_hosts files it names (else
/// `~/.ssh/known_hosts`), in file order, each once.
pub fn known_names(ctx: &Context) -> Vec<String> {
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let configs: Vec<PathBuf> = match &ctx.ssh_config {
        Some(p) if p.as_os_str() == "none" => Vec::new(),
        Some(p) => vec![p.clone()],
        None => home
            .iter()
            .map(|h| h.join(".ssh/config"))
            .chain([PathBuf::from("/etc/ssh/ssh_config")])
            .collect(),
    };
    let mut names = Vec::new();
    let mut known_files = Vec::new();
    for config in &configs {
        read_config(config, home.as_deref(), &mut names, &mut known_files, 0);
    }
    if known_files.is_empty() {
        known_files.extend(home.iter().map(|h| h.join(".ssh/known_hosts")));
    }
    for file in &known_files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') || line.starts_with('@') {
                continue;
            }
            let Some(field) = line.split_whitespace().next() else {
                continue;
            };
            for name in field.split(',') {
                // Hashed names cannot be read back; `[host]:port` is `host`.
                if name.starts_with('|') || name.starts_with('!') || name.contains('*') {
                    continue;
                }
                let name = name
                    .strip_prefix('[')
                    .and_then(|n| n.split_once("]:").map(|(h, _)| h))
                    .unwrap_or(name);
                push_once(&mut names, name);
            }
        }
    }
    names
}

fn push_once(names: &mut Vec<String>, name: &str) {
    if !name.is_empty() && !names.iter().any(|n| n == name) {
        names.push(name.to_owned());
    }
}

/// Reads `Host` names and `UserKnownHostsFile`s of one config file, and of the files it
/// `Include`s (a few levels deep, as a guard against loops).
fn read_config(
    path: &Path,
    home: Option<&Path>,
    names: &mut Vec<String>,
    known: &mut Vec<PathBuf>,
    depth: usize,
) {
    let Ok(text) = std::fs::read_to_string(path) else {
        return;
    };
    let tilde = |word: &str| -> PathBuf {
        match (word.strip_prefix("~/"), home) {
            (Some(rest), Some(h)) => h.join(rest),
            _ => PathBuf::from(word),
        }
    };
    for line in text.lines() {
        let line = line.trim();
        let (key, rest) = match line.split_once(|c: char| c.is_whitespace() || c == '=') {
            Some((k, r)) => (
                k,
                r.trim_start_matches(|c: char| c.is_whitespace() || c == '='),
            ),
            None => continue,
        };
        match key.to_ascii_lowercase().as_str() {
            "host" => {
                for word in rest.split_whitespace() {
                    // Patterns and negations match names; they are not names.
                    if !word.contains(['*', '?', '!']) {
                        push_once(names, word.trim_matches('"'));
                    }
                }
            }
            "userknownhostsfile" => {
                for word in rest.split_whitespace() {
                    let file = tilde(word.trim_matches('"'));
                    if !known.contains(&file) && word != "none" {
                        known.push(file);
                    }
                }
            }
            "include" if depth < 4 => {
                for word in rest.split_whitespace() {
                    let mut file = tilde(word.trim_matches('"'));
                    if file.is_relative() {
                        if let Some(h) = home {
                            file = h.join(".ssh").join(file);
                        }
                    }
                    read_config(&file, home, names, known, depth + 1);
                }
            }
            _ => {}
        }
    }
}

/// The known name closest to `typed`, when it is close enough to be a typo (an edit
/// distance of at most a third of its length, at least 1).
pub fn did_you_mean<'a>(typed: &str, known: &'a [String]) -> Option<&'a str> {
    let most = (typed.chars().count() / 3).max(1);
    known
        .iter()
        .filter(|k| k.as_str() != typed)
        .map(|k| (distance(typed, k), k))
        .filter(|(d, _)| *d <= most)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k.as_str())
}

/// Levenshtein distance over chars.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// Why `host` cannot be a destination at all, checked before anything is recorded: it is
/// no `Host` of the ssh config (no HostName, no proxy or jump that would resolve it
/// elsewhere) and its name resolves to no address. `None` when it may be reachable (or
/// when its problem is another one, which the connection reports as usual).
pub fn unresolvable(ctx: &Context, host: &str, options: &HostOptions) -> Option<String> {
    let dest = crate::ssh::resolve(&host_spec(ctx, host, options)).ok()?;
    if !dest.jumps.is_empty() || dest.proxy_command.is_some() || dest.proxy_jump.is_some() {
        return None;
    }
    if dest.hostname.parse::<std::net::IpAddr>().is_ok() {
        return None;
    }
    let error = match (dest.hostname.as_str(), dest.port).to_socket_addrs() {
        Ok(addrs) if addrs.len() > 0 => return None,
        Ok(_) => "no address".to_owned(),
        Err(e) => e.to_string(),
    };
    let known = known_names(ctx);
    let name = dest.hostname.as_str();
    let hint = match did_you_mean(name, &known) {
        Some(close) => format!("did you mean `{close}`? "),
        None => String::new(),
    };
    Some(format!(
        "cannot resolve host name `{}` ({error}); {hint}It is no Host of the ssh config{} and resolves to no address. Nothing was recorded or sent",
        crate::text::printable(name),
        ctx.ssh_config
            .as_ref()
            .map_or_else(String::new, |p| format!(" {}", p.display())),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_typo_is_matched_to_the_closest_known_name_and_a_stranger_to_none() {
        let known: Vec<String> = ["target1", "target2", "web-prod-1", "db"]
            .map(str::to_owned)
            .to_vec();
        assert_eq!(did_you_mean("targte1", &known), Some("target1"));
        assert_eq!(did_you_mean("web-prd-1", &known), Some("web-prod-1"));
        assert_eq!(did_you_mean("elsewhere.example", &known), None);
        assert_eq!(did_you_mean("target1", &known), Some("target2"));
        assert_eq!(distance("kitten", "sitting"), 3);
    }
}
