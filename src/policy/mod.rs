//! Command-classes policy (docs/trust.md#the-policy): loading `command-classes.toml`, validating it
//! into a checked [`Policy`], and classifying shell commands into [`Family`]s.
//!
//! Layers: `raw` mirrors the file (serde, unknown keys rejected); this module validates it
//! (every error names the file, the line, the key and the fix); `classify` parses a
//! command with brush-parser and applies the rules to each simple command in it; `words`
//! turns shell words into the text the rules see; `pattern` holds a rule's regex, compiled
//! on first use behind a prefilter of its leading literals.

mod classify;
mod pattern;
mod raw;
mod show;
mod words;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use serde::Serialize;

use crate::duration::parse_duration;
use crate::error::{Error, ErrorKind};
use crate::family::Family;
use crate::redact::ExtraPattern;

use pattern::Pattern;
use raw::{key_path_at, line_of, quoted_field, RawPolicy};

/// The shipped default policy, compiled in so that opmark never runs without one.
pub const BUILTIN_TEXT: &str = include_str!("../../command-classes.toml");

/// The origin name of the compiled-in policy, as it appears in rule references.
pub const BUILTIN_ORIGIN: &str = "built-in command-classes.toml";

/// A validated policy: every family has its behaviour and every rule is well formed (a
/// file's regexes compiled at load; the compiled-in policy's when first needed, see
/// `pattern`, and its `redact` patterns when a text holds their leading literals).
/// Cheap to clone: the rules and compiled regexes are shared (every `load` of the
/// compiled-in policy is such a clone).
#[derive(Debug, Clone)]
pub struct Policy {
    origin: String,
    /// True for the compiled-in policy (its origin is a name, not a path).
    builtin: bool,
    default_family: Family,
    families: [FamilyPolicy; 4],
    rules: Arc<[Rule]>,
    /// Pattern rules (those with a `pattern`), indexes into `rules`, in file order.
    pattern_rules: Arc<[usize]>,
    /// Program basename to the first program-only rule listing it.
    program_rules: Arc<HashMap<String, usize>>,
    redact: Vec<ExtraPattern>,
    /// How long an operation may stay unresolved before it is flagged `needs_human`
    /// (top-level `escalate_after`; shipped and default 1h).
    escalate_after: Duration,
    /// The `allowed_signers` file whose keys alone may approve (top-level `approvers`):
    /// where set, `--approve NOTE` no longer counts (docs/trust.md#the-approval-flow).
    approvers: Option<PathBuf>,
}

/// `escalate_after` when the file does not say: an operation unresolved for an hour has
/// outlived any retry an agent makes on its own, so a person should look.
pub const DEFAULT_ESCALATE_AFTER: Duration = Duration::from_secs(3600);

/// What a family's operations do when things go wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FamilyPolicy {
    /// Automatic attempts within one `run` (at least 1).
    pub attempts: u32,
    /// What happens when a probe finds the operation `interrupted`.
    pub after_interrupted: AfterInterrupted,
    /// The shortest `gc --older-than` allowed for this family's markers.
    pub min_retention: Duration,
    /// How far back a repetition (the same intent on the same host under another op id)
    /// is looked for (docs/guarantees.md#repetitions); zero looks nowhere.
    pub repeat_window: Duration,
    /// What a repetition within the window does.
    pub on_repeat: OnRepeat,
}

/// What a run does when it repeats a recent operation (docs/guarantees.md#repetitions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum OnRepeat {
    /// Runs, silently.
    Allow,
    /// Runs, and says so on stderr and in JSON (`repeats`).
    Warn,
    /// `blocked` (`repeats_recent_operation`); nothing is sent.
    Block,
}

impl OnRepeat {
    /// The policy file's word (also the word the shim is told).
    pub fn as_str(self) -> &'static str {
        match self {
            OnRepeat::Allow => "allow",
            OnRepeat::Warn => "warn",
            OnRepeat::Block => "block",
        }
    }
}

/// What happens after a probe says `interrupted` (docs/decisions.md#probe-interrupted).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AfterInterrupted {
    /// Supersede the interrupted claim and run again automatically (recorded as such).
    Rerun,
    /// `indeterminate` until an operator approves.
    Block,
}

/// One checked `[[rule]]`.
#[derive(Debug, Clone)]
pub(crate) struct Rule {
    /// 1-based position in the file, as shown to users (`rule #12`).
    pub index: usize,
    /// The rule's stable name (`name = "..."`), unique in its file; what a reader can
    /// still find after rules were added above it and its number changed.
    pub name: Option<String>,
    pub family: Family,
    /// Program basenames; empty means "any program" (pattern-only rule).
    pub programs: Vec<String>,
    pub pattern: Option<Pattern>,
    pub deny: bool,
    pub approval: bool,
    /// Host locks a command this rule decides takes by default (`run --lock` adds more).
    pub locks: Vec<crate::host_lock::HostLock>,
}

/// The family of a whole command string and how each part of it was decided.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Classification {
    /// The most dangerous family of the parts (read-only when there are none).
    pub family: Family,
    /// Each simple command (and each redirection that writes) with its family and rule.
    pub parts: Vec<Part>,
    /// The rule that denies the command, if any part hits a `deny = true` rule.
    pub deny: Option<String>,
    /// The rule that requires approval, if any part hits an `approval = "always"` rule;
    /// also set (to a reason) when the command cannot be parsed, since its parts could
    /// not be checked.
    pub approval: Option<String>,
    /// Why the command could not be parsed (it is then destructive).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parse_error: Option<String>,
    /// The host locks the rules of its parts name (`locks = [...]`), each once.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub locks: Vec<crate::host_lock::HostLock>,
}

/// One classified piece of a command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Part {
    /// The simple command (or redirection) as written.
    pub command: String,
    /// Its family.
    pub family: Family,
    /// What decided it: `<origin> rule #N`, `no rule: default_family`, or the structural
    /// reason (dynamic command, redirection, parse error).
    pub rule: String,
}

/// A policy file that cannot be used. Messages name the file, the line, the key and
/// how to fix it.
#[derive(Debug, thiserror::Error)]
pub enum PolicyError {
    /// The file could not be read.
    #[error("cannot read policy file {path}: {source}; check the path given to --policy or OPMARK_POLICY")]
    Read {
        /// The path as given.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The file was read but is not a valid policy.
    #[error("{origin}, line {line}, key `{key}`: {problem}; fix: {fix}")]
    Invalid {
        /// The file (or `built-in command-classes.toml`).
        origin: String,
        /// 1-based line of the problem.
        line: usize,
        /// Dotted key path, e.g. `families.read-only.attempts` or `rule[3].pattern`.
        key: String,
        /// What is wrong.
        problem: String,
        /// How to fix it.
        fix: String,
    },
}

impl PolicyError {
    /// The key path the error is about, when it is about a key.
    pub fn key(&self) -> Option<&str> {
        match self {
            PolicyError::Invalid { key, .. } => Some(key),
            PolicyError::Read { .. } => None,
        }
    }

    /// The 1-based line the error is about, when known.
    pub fn line(&self) -> Option<usize> {
        match self {
            PolicyError::Invalid { line, .. } => Some(*line),
            PolicyError::Read { .. } => None,
        }
    }
}

impl From<PolicyError> for Error {
    fn from(err: PolicyError) -> Self {
        Error::new(ErrorKind::Config, err.to_string())
    }
}

/// Default minimum marker retention per family, used when a family omits
/// `min_retention`. Markers of families that may not rerun must outlive any plausible
/// late retry, so they are kept longer.
fn default_min_retention(family: Family) -> Duration {
    let days = match family {
        Family::ReadOnly => 1,
        Family::Convergent => 7,
        Family::AppendOnly | Family::Destructive => 30,
    };
    Duration::from_secs(days * 86_400)
}

/// Default `on_repeat` per family, for policy files older than the key: what a repeat of
/// the family can do decides (docs/guarantees.md#repetitions).
fn default_on_repeat(family: Family) -> OnRepeat {
    match family {
        Family::ReadOnly => OnRepeat::Allow,
        Family::Convergent => OnRepeat::Warn,
        Family::AppendOnly | Family::Destructive => OnRepeat::Block,
    }
}

/// Default `repeat_window`: a day, as shipped.
const DEFAULT_REPEAT_WINDOW: Duration = Duration::from_secs(86_400);

/// Collects the context every validation error needs.
struct Checker<'a> {
    text: &'a str,
    origin: &'a str,
}

impl Checker<'_> {
    fn err(
        &self,
        span: std::ops::Range<usize>,
        key: String,
        problem: String,
        fix: &str,
    ) -> PolicyError {
        PolicyError::Invalid {
            origin: self.origin.to_string(),
            line: line_of(self.text, span.start),
            key,
            problem,
            fix: fix.to_string(),
        }
    }

    fn family(&self, value: &toml::Spanned<String>, key: String) -> Result<Family, PolicyError> {
        value.get_ref().parse::<Family>().map_err(|_| {
            self.err(
                value.span(),
                key,
                format!("unknown family `{}`", value.get_ref()),
                "use one of read-only, convergent, append-only, destructive",
            )
        })
    }
}

impl Policy {
    /// Loads the policy: the `explicit` file (from `--policy` / `OPMARK_POLICY`) if given,
    /// else the user's `${XDG_CONFIG_HOME:-~/.config}/opmark/command-classes.toml` if it
    /// exists, else the built-in one.
    pub fn load(explicit: Option<&Path>) -> Result<Policy, PolicyError> {
        let path = match explicit {
            Some(path) => Some(path.to_path_buf()),
            None => user_policy_path().filter(|p| p.is_file()),
        };
        match path {
            Some(path) => {
                let shown = path.display().to_string();
                let text = std::fs::read_to_string(&path).map_err(|source| PolicyError::Read {
                    path: shown.clone(),
                    source,
                })?;
                Policy::parse(&text, &shown)
            }
            None => Ok(Policy::builtin()),
        }
    }

    /// The compiled-in default policy. Its regexes are compiled when a command first
    /// needs them: a unit test compiles every one of them.
    pub fn builtin() -> Policy {
        static BUILTIN: OnceLock<Policy> = OnceLock::new();
        BUILTIN
            .get_or_init(|| {
                // A unit test parses the shipped file, so this cannot fail in a release.
                let mut policy = Policy::parse_checked(BUILTIN_TEXT, BUILTIN_ORIGIN, false)
                    .unwrap_or_else(|e| panic!("the built-in policy is invalid: {e}"));
                policy.builtin = true;
                policy
            })
            .clone()
    }

    /// Parses and validates policy `text`; `origin` names it in errors and rule references.
    pub fn parse(text: &str, origin: &str) -> Result<Policy, PolicyError> {
        Policy::parse_checked(text, origin, true)
    }

    /// [`Policy::parse`]; `compile` false leaves the rules' and the `redact` regexes to
    /// their first use (only for text already known to compile).
    fn parse_checked(text: &str, origin: &str, compile: bool) -> Result<Policy, PolicyError> {
        let check = Checker { text, origin };
        let raw: RawPolicy = toml::from_str(text).map_err(|e| toml_error(&check, &e))?;

        let default_family = match &raw.default_family {
            Some(v) => check.family(v, "default_family".into())?,
            None => {
                return Err(check.err(
                    0..0,
                    "default_family".into(),
                    "missing key".into(),
                    "add `default_family = \"destructive\"` at the top of the file (the family of commands no rule matches)",
                ))
            }
        };

        let Some(families_raw) = &raw.families else {
            return Err(check.err(
                text.len()..text.len(),
                "families".into(),
                "missing the [families.*] tables".into(),
                "add a [families.read-only], [families.convergent], [families.append-only] and [families.destructive] table, each with attempts and after_interrupted",
            ));
        };
        let mut families: [Option<FamilyPolicy>; 4] = Default::default();
        for (name, table) in families_raw.get_ref() {
            let family = check.family(name, format!("families.{}", name.get_ref()))?;
            let key = |leaf: &str| format!("families.{}.{leaf}", name.get_ref());
            let attempts = match &table.get_ref().attempts {
                Some(a) if *a.get_ref() >= 1 && *a.get_ref() <= 100 => *a.get_ref() as u32,
                Some(a) => {
                    return Err(check.err(
                        a.span(),
                        key("attempts"),
                        format!("attempts = {} is out of range", a.get_ref()),
                        "use a whole number from 1 to 100 (1 means: never retry automatically)",
                    ))
                }
                None => {
                    return Err(check.err(
                        table.span(),
                        key("attempts"),
                        "missing key".into(),
                        "add `attempts = N` (automatic attempts within one run, at least 1)",
                    ))
                }
            };
            let after_interrupted = match &table.get_ref().after_interrupted {
                Some(v) => match v.get_ref().as_str() {
                    "rerun" => AfterInterrupted::Rerun,
                    "block" => AfterInterrupted::Block,
                    other => {
                        return Err(check.err(
                            v.span(),
                            key("after_interrupted"),
                            format!("unknown value `{other}`"),
                            "use \"rerun\" or \"block\"",
                        ))
                    }
                },
                None => {
                    return Err(check.err(
                        table.span(),
                        key("after_interrupted"),
                        "missing key".into(),
                        "add `after_interrupted = \"rerun\"` or `\"block\"`",
                    ))
                }
            };
            let min_retention = match &table.get_ref().min_retention {
                Some(v) => parse_duration(v.get_ref()).map_err(|problem| {
                    check.err(
                        v.span(),
                        key("min_retention"),
                        problem,
                        "write a duration like \"12h\" or \"7d\"",
                    )
                })?,
                None => default_min_retention(family),
            };
            let repeat_window = match &table.get_ref().repeat_window {
                Some(v) => parse_duration(v.get_ref()).map_err(|problem| {
                    check.err(
                        v.span(),
                        key("repeat_window"),
                        problem,
                        "write a duration like \"24h\" or \"30m\" (\"0s\" looks for no repetition)",
                    )
                })?,
                None => DEFAULT_REPEAT_WINDOW,
            };
            let on_repeat = match &table.get_ref().on_repeat {
                Some(v) => match v.get_ref().as_str() {
                    "allow" => OnRepeat::Allow,
                    "warn" => OnRepeat::Warn,
                    "block" => OnRepeat::Block,
                    other => {
                        return Err(check.err(
                            v.span(),
                            key("on_repeat"),
                            format!("unknown value `{other}`"),
                            "use \"allow\", \"warn\" or \"block\"",
                        ))
                    }
                },
                None => default_on_repeat(family),
            };
            families[family as usize] = Some(FamilyPolicy {
                attempts,
                after_interrupted,
                min_retention,
                repeat_window,
                on_repeat,
            });
        }
        let mut checked_families = Vec::with_capacity(4);
        for family in Family::ALL {
            match families[family as usize].take() {
                Some(f) => checked_families.push(f),
                None => {
                    return Err(check.err(
                        families_raw.span(),
                        format!("families.{family}"),
                        format!("missing the [families.{family}] table"),
                        "every family needs its table with attempts and after_interrupted",
                    ))
                }
            }
        }
        let families: [FamilyPolicy; 4] = checked_families
            .try_into()
            .unwrap_or_else(|_| unreachable!("exactly four families were pushed"));

        let mut rules = Vec::with_capacity(raw.rule.len());
        // Name to (rule number, byte offset), to name both rules when a name is used
        // twice. Lines are counted only then: counting them for every rule rescanned the
        // file from its start each time (~2 ms of every run with the shipped policy).
        let mut names: HashMap<&str, (usize, usize)> = HashMap::new();
        for (i, spanned) in raw.rule.iter().enumerate() {
            let index = i + 1;
            let r = spanned.get_ref();
            let key = |leaf: &str| format!("rule[{index}].{leaf}");
            let name = match &r.name {
                None => None,
                Some(n) => {
                    let text = n.get_ref().as_str();
                    if !valid_rule_name(text) {
                        return Err(check.err(
                            n.span(),
                            key("name"),
                            format!("`{text}` is not a usable rule name"),
                            "use 1 to 64 letters, digits, `-`, `_` or `.`, starting with a letter (e.g. \"apt-install\")",
                        ));
                    }
                    if let Some((first, first_at)) = names.insert(text, (index, n.span().start)) {
                        let first_line = line_of(check.text, first_at);
                        let line = line_of(check.text, n.span().start);
                        return Err(check.err(
                            n.span(),
                            key("name"),
                            format!(
                                "the name `{text}` is used by rule[{first}] (line {first_line}) and rule[{index}] (line {line})"
                            ),
                            "give each rule its own name",
                        ));
                    }
                    Some(text.to_owned())
                }
            };
            let family = match &r.family {
                Some(v) => check.family(v, key("family"))?,
                None => {
                    return Err(check.err(
                        spanned.span(),
                        key("family"),
                        "missing key".into(),
                        "add `family = \"...\"` to the rule",
                    ))
                }
            };
            let mut programs = Vec::new();
            if let Some(list) = &r.programs {
                if list.get_ref().is_empty() {
                    return Err(check.err(
                        list.span(),
                        key("programs"),
                        "empty list".into(),
                        "list at least one program basename, or remove the key",
                    ));
                }
                for p in list.get_ref() {
                    let name = p.get_ref();
                    if name.is_empty() || name.contains('/') || name.contains(char::is_whitespace) {
                        return Err(check.err(
                            p.span(),
                            key("programs"),
                            format!("`{name}` is not a program basename"),
                            "write the bare program name (`rm`, not `/bin/rm`, no spaces); use `pattern` to match arguments",
                        ));
                    }
                    programs.push(name.clone());
                }
            }
            let pattern = match &r.pattern {
                Some(p) => {
                    let pattern = Pattern::new(p.get_ref());
                    if compile {
                        pattern.compile().map_err(|e| {
                            check.err(
                                p.span(),
                                key("pattern"),
                                format!("invalid regex: {}", regex_error_summary(&e)),
                                "fix the regular expression (Rust regex syntax; no look-around or backreferences); use single quotes so backslashes stay literal",
                            )
                        })?;
                    }
                    Some(pattern)
                }
                None => None,
            };
            if programs.is_empty() && pattern.is_none() {
                return Err(check.err(
                    spanned.span(),
                    format!("rule[{index}]"),
                    "the rule matches nothing".into(),
                    "give it `programs = [...]`, `pattern = '...'`, or both",
                ));
            }
            let approval = match &r.approval {
                None => false,
                Some(v) => match v.get_ref().as_str() {
                    "always" => true,
                    "never" => false,
                    other => {
                        return Err(check.err(
                            v.span(),
                            key("approval"),
                            format!("unknown value `{other}`"),
                            "use \"always\" (needs --approve every time) or \"never\"",
                        ))
                    }
                },
            };
            let mut locks = Vec::new();
            for l in r
                .locks
                .as_ref()
                .map(|l| l.get_ref().as_slice())
                .unwrap_or_default()
            {
                let lock = crate::host_lock::HostLock::parse(l.get_ref()).map_err(|why| {
                    check.err(
                        l.span(),
                        key("locks"),
                        why,
                        "write each lock as \"NAME\" or \"NAME:N\"",
                    )
                })?;
                locks.push(lock);
            }
            let locks = crate::host_lock::HostLock::set(&locks).map_err(|why| {
                check.err(
                    spanned.span(),
                    key("locks"),
                    why,
                    "name each lock once in the rule",
                )
            })?;
            rules.push(Rule {
                index,
                name,
                family,
                programs,
                pattern,
                deny: r.deny.as_ref().is_some_and(|d| *d.get_ref()),
                approval,
                locks,
            });
        }

        let pattern_rules: Vec<usize> = (0..rules.len())
            .filter(|&i| rules[i].pattern.is_some())
            .collect();
        let mut program_rules = HashMap::new();
        for (i, rule) in rules.iter().enumerate() {
            if rule.pattern.is_none() {
                for p in &rule.programs {
                    program_rules.entry(p.clone()).or_insert(i);
                }
            }
        }

        let mut redact = Vec::new();
        for p in raw.redact.iter().flatten() {
            let source = p.get_ref();
            if !compile {
                redact.push(ExtraPattern::lazy(
                    source,
                    pattern::leading_literals(source),
                ));
                continue;
            }
            redact.push(ExtraPattern::compile(source).map_err(|e| {
                check.err(
                    p.span(),
                    "redact".into(),
                    format!("invalid regex: {}", regex_error_summary(&e)),
                    "fix the regular expression (Rust regex syntax); use single quotes so backslashes stay literal",
                )
            })?);
        }

        // Optional, so policy files written before it keep working.
        let escalate_after = match &raw.escalate_after {
            Some(v) => match parse_duration(v.get_ref()) {
                Ok(d) if !d.is_zero() => d,
                Ok(_) => {
                    return Err(check.err(
                        v.span(),
                        "escalate_after".into(),
                        "escalate_after = 0 would flag every unresolved operation at once".into(),
                        "write a positive duration like \"1h\" (how long an operation may stay unresolved before a person is asked to look)",
                    ))
                }
                Err(problem) => {
                    return Err(check.err(
                        v.span(),
                        "escalate_after".into(),
                        problem,
                        "write a duration like \"30m\" or \"1h\"",
                    ))
                }
            },
            None => DEFAULT_ESCALATE_AFTER,
        };

        // A relative path is the policy file's neighbour, as a user writing the file
        // next to its allowed_signers would expect; `~/` is the home directory.
        let approvers = match &raw.approvers {
            Some(v) if v.get_ref().trim().is_empty() => {
                return Err(check.err(
                    v.span(),
                    "approvers".into(),
                    "approvers is empty".into(),
                    "name an OpenSSH allowed_signers file, or remove the key for self-service approvals",
                ))
            }
            Some(v) => {
                let text = v.get_ref();
                let path = match text.strip_prefix("~/") {
                    Some(rest) => crate::paths::home_dir().map_or_else(|| PathBuf::from(text), |h| h.join(rest)),
                    None => PathBuf::from(text),
                };
                Some(if path.is_absolute() {
                    path
                } else {
                    Path::new(origin)
                        .parent()
                        .map_or(path.clone(), |dir| dir.join(&path))
                })
            }
            None => None,
        };

        Ok(Policy {
            origin: origin.to_string(),
            builtin: false,
            default_family,
            families,
            rules: rules.into(),
            pattern_rules: pattern_rules.into(),
            program_rules: Arc::new(program_rules),
            redact,
            escalate_after,
            approvers,
        })
    }

    /// The behaviour of family `f`.
    pub fn family(&self, f: Family) -> &FamilyPolicy {
        &self.families[f as usize]
    }

    /// Extra redaction patterns for the ledger (top-level `redact`), for
    /// [`crate::redact::Redactor::with_patterns`].
    pub fn redact_patterns(&self) -> &[ExtraPattern] {
        &self.redact
    }

    /// Where the policy came from: a path, or `built-in command-classes.toml`.
    pub fn origin(&self) -> &str {
        &self.origin
    }

    /// How long an operation may stay unresolved before it is flagged `needs_human`.
    pub fn escalate_after(&self) -> Duration {
        self.escalate_after
    }

    /// The policy's `approvers` file, if it names one.
    pub fn approvers(&self) -> Option<&Path> {
        self.approvers.as_deref()
    }

    /// The family of simple commands no rule matches.
    pub fn default_family(&self) -> Family {
        self.default_family
    }

    /// The rule that decides a simple command whose words (program basename first,
    /// wrappers already removed) are joined in `text`. Pattern rules are tried first, in
    /// file order; then program-only rules, in file order.
    pub(crate) fn match_rule(&self, program: &str, text: &str) -> Option<&Rule> {
        for &i in self.pattern_rules.iter() {
            let rule = &self.rules[i];
            if (rule.programs.is_empty() || rule.programs.iter().any(|p| p == program))
                && rule.pattern.as_ref().is_some_and(|p| p.is_match(text))
            {
                return Some(rule);
            }
        }
        self.program_rules.get(program).map(|&i| &self.rules[i])
    }

    /// Whether this is the compiled-in policy rather than a file.
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    /// How rules are referred to in classification output (and so in `run`'s `rule`
    /// field and the ledger): `<origin> rule #N (name)`, or `<origin> rule #N` for a
    /// rule without a name. The number says where it is today; the name is what still
    /// finds it after the file changed.
    pub(crate) fn rule_name(&self, rule: &Rule) -> String {
        match &rule.name {
            Some(name) => format!("{} rule #{} ({name})", self.origin, rule.index),
            None => format!("{} rule #{}", self.origin, rule.index),
        }
    }
}

/// Equal when they classify and behave alike: the same families, rules (numbers,
/// names, patterns as written) and redaction; where they were loaded from is not
/// compared, so a policy printed by `opmark policy show` and loaded back is equal.
impl PartialEq for Policy {
    fn eq(&self, other: &Policy) -> bool {
        self.default_family == other.default_family
            && self.escalate_after == other.escalate_after
            && self.families == other.families
            && self.rules == other.rules
            && self.redact.len() == other.redact.len()
            && self
                .redact
                .iter()
                .zip(&other.redact)
                .all(|(a, b)| a.as_str() == b.as_str())
    }
}

impl PartialEq for Rule {
    fn eq(&self, other: &Rule) -> bool {
        self.index == other.index
            && self.name == other.name
            && self.family == other.family
            && self.programs == other.programs
            && self.pattern.as_ref().map(Pattern::as_str)
                == other.pattern.as_ref().map(Pattern::as_str)
            && self.deny == other.deny
            && self.approval == other.approval
            && self.locks == other.locks
    }
}

/// A rule name is a word people can type and grep for, and never looks like a number
/// reference (`#3`) or needs quoting in a message.
fn valid_rule_name(name: &str) -> bool {
    name.len() <= 64
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// `${XDG_CONFIG_HOME:-~/.config}/opmark/command-classes.toml`; a relative
/// XDG_CONFIG_HOME is ignored, as the XDG spec requires.
pub fn user_policy_path() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|p| p.is_absolute())
        .or_else(|| {
            std::env::var_os("HOME")
                .map(PathBuf::from)
                .filter(|p| p.is_absolute())
                .map(|h| h.join(".config"))
        })?;
    Some(base.join("opmark").join("command-classes.toml"))
}

/// The last line of a regex error (the one that says what is wrong), without the
/// multi-line caret diagram.
fn regex_error_summary(e: &regex::Error) -> String {
    let text = e.to_string();
    text.lines()
        .rev()
        .find(|l| l.trim_start().starts_with("error:"))
        .map(|l| l.trim().trim_start_matches("error:").trim().to_string())
        .unwrap_or_else(|| text.lines().last().unwrap_or_default().trim().to_string())
}

/// Turns a toml/serde error into our error with line, key path and a fix.
fn toml_error(check: &Checker<'_>, e: &toml::de::Error) -> PolicyError {
    let message = e.message().trim().to_string();
    let span = e.span().unwrap_or(0..0);
    let unknown = quoted_field(&message, "unknown field");
    let key = key_path_at(check.text, &span, unknown.as_deref());
    let fix = if let Some(field) = &unknown {
        format!(
            "remove or rename `{field}`; {}",
            expected_keys(&message).unwrap_or("see the header of the shipped command-classes.toml")
        )
    } else if message.starts_with("invalid type") {
        "give the key a value of the expected type (strings in quotes, numbers bare, lists in [ ])"
            .to_string()
    } else {
        "fix the TOML syntax at that line".to_string()
    };
    check.err(span, key, message.replace('\n', " "), &fix)
}

fn expected_keys(message: &str) -> Option<&str> {
    message.find("expected").map(|i| &message[i..])
}

#[cfg(test)]
mod tests;
