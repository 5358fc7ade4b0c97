//! The shell-aware classifier: parses a command string with brush-parser and gives every
//! simple command in it (including those inside subshells, groups, loops, functions,
//! substitutions and `find -exec`) a family; the whole takes the most dangerous one.
//!
//! Wrappers are judged by what they run (docs/trust.md#the-policy): `sh|bash|... -c
//! 'TEXT'`, `eval 'TEXT'`, `su -c`, `watch`, `trap 'TEXT'`, a shell fed a literal here-doc
//! or here-string, and `env`, `sudo`, `doas`, `nohup`, `timeout`, `nice`, `xargs`, `exec`,
//! `command`, `builtin`, `busybox APPLET`... are classified as if their inner command had
//! been written alone, recursively up to a depth bound, so a deny or approval rule on
//! the inner command holds through them.
//!
//! Structural decisions that no policy can override, because the policy cannot see
//! what they would run: text built at run time (a computed program name such as `$x`,
//! `$(...)`, globs or brace expansion; `eval "$x"`; `sh -c "$(...)"`; a shell reading
//! its commands from a pipe, a process substitution or the caller's stdin; `alias`
//! definitions; `env -S`) is destructive **and needs approval**, exactly as unparseable
//! input does: deny and approval rules cannot be checked against it. A file's commands
//! (`source FILE`, `sh FILE`) are not visible either; they run as a program by path would,
//! destructive, since the file could be anything.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};

use brush_parser::ast::{
    self, Command, CommandPrefixOrSuffixItem, CompoundCommand, CompoundList, IoFileRedirectKind,
    IoFileRedirectTarget, IoRedirect, Pipeline, SimpleCommand,
};
use brush_parser::ParserOptions;

use super::words::{analyse, analyse_heredoc, WordInfo};
use super::{Classification, Part, Policy};
use crate::family::Family;

/// Deeper nesting of substitutions than this is not analysed (it is destructive): real
/// commands never come close, and it bounds recursion on hostile input.
const MAX_DEPTH: usize = 12;

/// Wrappers inside wrappers (`sh -c "eval 'bash -c ...'"`) deeper than this are not
/// followed: the innermost text is treated as built at run time (needs approval).
const MAX_WRAPPERS: usize = 8;

/// Inputs nested deeper than this are not handed to the parser, whose recursive descent
/// would otherwise overflow the stack on something like 10,000 `(`.
const MAX_NESTING: usize = 64;

/// The `approval` of a command that could not be parsed.
pub(crate) const UNPARSEABLE_APPROVAL: &str =
    "unparseable: deny and approval rules cannot be checked";

/// How the `approval` of text built at run time ends: what it is comes first.
const DYNAMIC_APPROVAL: &str = "deny and approval rules cannot be checked against it";

/// Programs that run text they receive as shell commands; what they run is invisible.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "yash", "rbash",
];

/// Builtins that run a file's commands, which the classifier cannot see.
const RUNS_A_FILE: &[(&str, &str)] = &[
    ("source", "`source` runs a file's commands"),
    (".", "`.` runs a file's commands"),
];

/// A command that runs another command given as its arguments (`sudo CMD...`). The
/// wrapped command is classified; the wrapper's own options are skipped.
struct Wrapper {
    name: &'static str,
    /// Short options that take a value (`-u root` or `-uroot`).
    short_args: &'static str,
    /// Long options that take a value when written without `=` (`--user root`).
    long_args: &'static [&'static str],
    /// Positional words before the command (`timeout DURATION CMD`).
    positionals: usize,
    /// `NAME=VALUE` words before the command are settings, not the command (`env`).
    assignments: bool,
    /// Options that make the wrapper run text as a shell command line (`env -S`).
    dynamic_short: &'static str,
    dynamic_long: &'static [&'static str],
    /// `-10` is an option, not a command (`nice -10 CMD`).
    numeric_option: bool,
}

const fn wrapper(name: &'static str, short_args: &'static str) -> Wrapper {
    Wrapper {
        name,
        short_args,
        long_args: &[],
        positionals: 0,
        assignments: false,
        dynamic_short: "",
        dynamic_long: &[],
        numeric_option: false,
    }
}

const WRAPPERS: &[Wrapper] = &[
    Wrapper {
        long_args: &[
            "user",
            "group",
            "close-from",
            "chdir",
            "prompt",
            "role",
            "type",
            "other-user",
            "command-timeout",
            "host",
            "chroot",
        ],
        ..wrapper("sudo", "ugCDprtUTR")
    },
    wrapper("doas", "uC"),
    Wrapper {
        long_args: &[
            "unset",
            "chdir",
            "block-signal",
            "default-signal",
            "ignore-signal",
        ],
        assignments: true,
        dynamic_short: "S",
        dynamic_long: &["split-string"],
        ..wrapper("env", "uC")
    },
    Wrapper {
        long_args: &["adjustment"],
        numeric_option: true,
        ..wrapper("nice", "n")
    },
    Wrapper {
        long_args: &["signal", "kill-after"],
        positionals: 1,
        ..wrapper("timeout", "sk")
    },
    Wrapper {
        long_args: &[
            "arg-file",
            "delimiter",
            "max-lines",
            "max-args",
            "max-procs",
            "max-chars",
            "process-slot-var",
        ],
        ..wrapper("xargs", "adEILnPs")
    },
    wrapper("nohup", ""),
    wrapper("ionice", "cnpPu"),
    Wrapper {
        long_args: &["input", "output", "error"],
        ..wrapper("stdbuf", "ioe")
    },
    Wrapper {
        long_args: &["format", "output"],
        ..wrapper("time", "fo")
    },
    wrapper("setsid", ""),
    wrapper("busybox", ""),
    wrapper("builtin", ""),
    wrapper("command", ""),
    // `exec -a NAME CMD`: replaces the shell with CMD.
    wrapper("exec", "a"),
    // `watch [-n S] CMD...`: runs the words joined through `sh -c` (see classify_words).
    Wrapper {
        long_args: &["interval"],
        ..wrapper("watch", "n")
    },
];

/// Variables that change which code runs: a command under them is not the command its
/// name says (`LD_PRELOAD=/tmp/x.so ls`, `PATH=/tmp/evil ls`, `BASH_ENV=/tmp/x bash`).
const CODE_VARIABLES: &[&str] = &[
    "PATH",
    "LD_PRELOAD",
    "LD_LIBRARY_PATH",
    "LD_AUDIT",
    "BASH_ENV",
    "ENV",
    "IFS",
    "SHELLOPTS",
    "BASHOPTS",
    "PROMPT_COMMAND",
    "GIT_SSH_COMMAND",
    "GIT_EXTERNAL_DIFF",
    "PERL5OPT",
    "PYTHONSTARTUP",
    "NODE_OPTIONS",
];

/// Why an assignment word changes which code runs, if it does.
fn code_assignment(text: &str) -> Option<String> {
    let (name, value) = text.split_once('=')?;
    let name = name.strip_suffix('+').unwrap_or(name);
    if !CODE_VARIABLES.contains(&name) {
        return None;
    }
    // PATH made only of the existing PATH and the standard system directories resolves
    // programs to the same binaries as usual (`PATH=$PATH:/usr/sbin`, `env -i PATH=/usr/bin`).
    const SYSTEM_DIRS: &[&str] = &[
        "$PATH",
        "${PATH}",
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ];
    if name == "PATH" && value.split(':').all(|d| SYSTEM_DIRS.contains(&d)) {
        return None;
    }
    Some(format!("dynamic: `{name}=` changes which code runs"))
}

/// Files that a redirection may write without effect on the world.
const HARMLESS_TARGETS: &[&str] = &[
    "/dev/null",
    "/dev/stdout",
    "/dev/stderr",
    "/dev/tty",
    "/dev/fd/1",
    "/dev/fd/2",
];

enum Unwrapped {
    /// The wrapped command starts at this index of the argument list.
    Command(usize),
    /// The wrapper runs text as commands.
    Dynamic(String),
    /// No command follows (`sudo -v`, `env`): classify the wrapper itself.
    Nothing,
}

struct Classifier<'p> {
    policy: &'p Policy,
    options: ParserOptions,
    parts: Vec<Part>,
    deny: Option<String>,
    approval: Option<String>,
    /// The host locks the deciding rules name, each once.
    locks: Vec<crate::host_lock::HostLock>,
    /// Functions defined so far in this command, with the family of their bodies. A call
    /// runs the body, not the program of that name.
    functions: HashMap<String, Family>,
    /// The wrappers whose inner text is being classified (`sh -c`, `eval`), outermost
    /// first: each part found inside says so in its rule.
    via: Vec<String>,
    /// Where the simple command being classified reads its standard input from.
    stdin: CommandInput,
    /// The command being classified reads a pipe (it is not first in its pipeline, or
    /// sits inside a compound command that is not).
    piped: bool,
}

/// Where a simple command's standard input comes from: what a shell without `-c` or a
/// file runs as its commands.
#[derive(Clone, Default)]
enum CommandInput {
    /// The command's own stdin: a pipe, or the caller's input (`--stdin`). Not visible.
    #[default]
    Inherited,
    /// `< FILE`: a file's contents, as `sh FILE` would read them.
    File,
    /// A here-document or here-string whose text is literal (no expansion in it).
    Literal(String),
    /// A here-document or here-string that expands variables or substitutions.
    Expanded,
    /// A process substitution (`< <(curl ...)`): a command writes it at run time.
    Substituted,
}

impl Policy {
    /// Classifies a command string (as `sh -c` would receive it). Defined here, beside
    /// the walk it starts, so that the policy's module never names this one.
    pub fn classify(&self, command: &str) -> Classification {
        classify(self, command)
    }
}

/// Classifies `command` under `policy` (see the module docs).
fn classify(policy: &Policy, command: &str) -> Classification {
    let mut c = Classifier {
        policy,
        options: ParserOptions::default(),
        parts: Vec::new(),
        deny: None,
        approval: None,
        locks: Vec::new(),
        functions: HashMap::new(),
        via: Vec::new(),
        stdin: CommandInput::Inherited,
        piped: false,
    };
    let parse_error = c.program(command, 0).err();
    let family = c
        .parts
        .iter()
        .map(|p| p.family)
        .max()
        // Nothing to run (empty input, only comments): nothing can change.
        .unwrap_or(Family::ReadOnly);
    Classification {
        family,
        parts: c.parts,
        deny: c.deny,
        approval: c.approval,
        parse_error,
        locks: crate::host_lock::HostLock::with_defaults(&[], &c.locks),
    }
}

/// The deepest bracket nesting of `text`, counted naively (quotes ignored): only a
/// cheap guard against parser stack overflow, so over-counting is harmless.
fn naive_nesting(text: &str) -> usize {
    let (mut depth, mut max) = (0usize, 0usize);
    for b in text.bytes() {
        match b {
            b'(' | b'{' | b'[' | b'`' => {
                depth += 1;
                max = max.max(depth);
            }
            b')' | b'}' | b']' => depth = depth.saturating_sub(1),
            _ => {}
        }
    }
    max
}

/// A path argument in its plain form, so that deny rules written for `/` also catch
/// `/.`, `//`, `/./`, `/tmp/../`, `/etc/` and `"$HOME"/`: repeated slashes, `.` and a
/// trailing slash go, `..` is resolved lexically (never above `/`), and `~`, `$HOME`
/// and `${HOME}` all become `~`. Anything that is not such a path is returned as is.
pub(crate) fn normalise_path(word: &str) -> std::borrow::Cow<'_, str> {
    let (root, rest) = if let Some(rest) = word.strip_prefix('/') {
        ("/", rest)
    } else if let Some(rest) = ["~", "$HOME", "${HOME}"].iter().find_map(|home| {
        word.strip_prefix(home)
            .filter(|r| r.is_empty() || r.starts_with('/'))
    }) {
        ("~", rest)
    } else {
        return std::borrow::Cow::Borrowed(word);
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in rest.split('/') {
        match part {
            "" | "." => {}
            // Under `~` the parent is unknown here: keep `..` as written.
            ".." if root == "/" => {
                parts.pop();
            }
            _ => parts.push(part),
        }
    }
    let plain = match (root, parts.is_empty()) {
        ("/", true) => "/".to_owned(),
        ("/", false) => format!("/{}", parts.join("/")),
        (_, true) => "~".to_owned(),
        (_, false) => format!("~/{}", parts.join("/")),
    };
    if plain == word {
        std::borrow::Cow::Borrowed(word)
    } else {
        std::borrow::Cow::Owned(plain)
    }
}

/// How strict a rule's answer is: a deny beats an approval beats a family.
fn strictness(policy: &Policy, rule: Option<&super::Rule>) -> (bool, bool, Family) {
    match rule {
        Some(r) => (r.deny, r.approval, r.family),
        None => (false, false, policy.default_family()),
    }
}

/// A word that is a process substitution: `<(cmd)` stands for a file whose text a command
/// writes at run time.
fn is_process_substitution(word: &WordInfo) -> bool {
    word.raw.starts_with("<(") || word.raw.starts_with(">(")
}

fn basename(path: &str) -> &str {
    path.rsplit('/').next().unwrap_or(path)
}

fn is_assignment(text: &str) -> bool {
    match text.split_once('=') {
        Some((name, _)) => {
            let mut chars = name.chars();
            chars
                .next()
                .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        }
        None => false,
    }
}

fn display(words: &[WordInfo]) -> String {
    words
        .iter()
        .map(|w| w.raw.as_str())
        .collect::<Vec<_>>()
        .join(" ")
}

/// Skips a wrapper's options and settings; says where the wrapped command starts.
fn unwrap(spec: &Wrapper, args: &[WordInfo]) -> Unwrapped {
    let mut positionals = spec.positionals;
    let mut i = 0;
    while i < args.len() {
        let t = args[i].text.as_str();
        if args[i].expands {
            // `sudo $OPTS cmd`: whatever it is, it is decided at run time; the caller
            // sees a computed program name and treats it as dynamic.
            return Unwrapped::Command(i);
        }
        if t == "--" {
            return if i + 1 < args.len() {
                Unwrapped::Command(i + 1)
            } else {
                Unwrapped::Nothing
            };
        }
        if t == "-" || (spec.assignments && is_assignment(t)) {
            i += 1;
            continue;
        }
        if let Some(long) = t.strip_prefix("--") {
            let name = long.split('=').next().unwrap_or(long);
            if spec.dynamic_long.contains(&name) {
                return Unwrapped::Dynamic(format!(
                    "`{} --{name}` runs text as commands",
                    spec.name
                ));
            }
            i += if spec.long_args.contains(&name) && !long.contains('=') {
                2
            } else {
                1
            };
            continue;
        }
        if let Some(short) = t.strip_prefix('-') {
            if spec.numeric_option && short.chars().all(|c| c.is_ascii_digit()) {
                i += 1;
                continue;
            }
            let mut takes_next = false;
            let count = short.chars().count();
            for (j, c) in short.chars().enumerate() {
                if spec.dynamic_short.contains(c) {
                    return Unwrapped::Dynamic(format!(
                        "`{} -{c}` runs text as commands",
                        spec.name
                    ));
                }
                if spec.short_args.contains(c) {
                    takes_next = j + 1 == count;
                    break;
                }
            }
            i += if takes_next { 2 } else { 1 };
            continue;
        }
        if positionals > 0 {
            positionals -= 1;
            i += 1;
            continue;
        }
        return Unwrapped::Command(i);
    }
    Unwrapped::Nothing
}

/// Where `cmd` reads its standard input from, by its last redirection of fd 0.
fn input_of(cmd: &SimpleCommand, options: &ParserOptions) -> CommandInput {
    let mut stdin = CommandInput::Inherited;
    let items = cmd
        .prefix
        .iter()
        .flat_map(|p| p.0.iter())
        .chain(cmd.suffix.iter().flat_map(|s| s.0.iter()));
    for item in items {
        let CommandPrefixOrSuffixItem::IoRedirect(r) = item else {
            continue;
        };
        stdin = match r {
            IoRedirect::HereDocument(None | Some(0), doc) => {
                if doc.requires_expansion {
                    let info = analyse_heredoc(&doc.doc.value, options);
                    if info.expands || info.error.is_some() {
                        CommandInput::Expanded
                    } else {
                        CommandInput::Literal(info.text)
                    }
                } else {
                    CommandInput::Literal(doc.doc.value.clone())
                }
            }
            IoRedirect::HereString(None | Some(0), word) => {
                let info = analyse(&word.value, options);
                if info.expands || info.error.is_some() {
                    CommandInput::Expanded
                } else {
                    CommandInput::Literal(info.text)
                }
            }
            IoRedirect::File(None | Some(0), IoFileRedirectKind::Read, target) => match target {
                IoFileRedirectTarget::Filename(_) => CommandInput::File,
                // `sh < <(curl ...)`: the text comes from a command at run time.
                IoFileRedirectTarget::ProcessSubstitution(..) => CommandInput::Substituted,
                _ => CommandInput::Inherited,
            },
            IoRedirect::File(None | Some(0), IoFileRedirectKind::DuplicateInput, _) => {
                CommandInput::Inherited
            }
            _ => continue,
        };
    }
    stdin
}

/// What a shell is asked to run, from its arguments (`bash -lc 'TEXT' name args`).
enum ShellRuns<'w> {
    /// `-c TEXT`: the text (which may be computed at run time).
    Text(&'w WordInfo),
    /// `-c` without its text.
    MissingText,
    /// A script file (or a process substitution standing for one).
    File(&'w WordInfo),
    /// No `-c` and no file: commands read from standard input.
    CommandInput,
}

fn shell_runs(args: &[WordInfo]) -> ShellRuns<'_> {
    let mut c_flag = false;
    let mut i = 0;
    while i < args.len() {
        let t = args[i].text.as_str();
        if args[i].expands {
            // Options decided at run time: whatever follows is run-time text too.
            return ShellRuns::Text(&args[i]);
        }
        if t == "--" || t == "-" {
            i += 1;
            break;
        }
        if matches!(t, "-o" | "+o" | "-O" | "+O" | "--rcfile" | "--init-file") {
            i += 2;
            continue;
        }
        if t.starts_with("--") {
            i += 1;
            continue;
        }
        if let Some(cluster) = t.strip_prefix('-').or_else(|| t.strip_prefix('+')) {
            if !cluster.is_empty() {
                c_flag |= t.starts_with('-') && cluster.contains('c');
                i += 1;
                continue;
            }
        }
        break;
    }
    match (c_flag, args.get(i)) {
        (true, Some(text)) => ShellRuns::Text(text),
        (true, None) => ShellRuns::MissingText,
        (false, Some(file)) => ShellRuns::File(file),
        (false, None) => ShellRuns::CommandInput,
    }
}

impl Classifier<'_> {
    fn push(&mut self, command: String, family: Family, rule: String) {
        let rule = self.within(rule);
        self.parts.push(Part {
            command,
            family,
            rule,
        });
    }

    /// `what`, saying which wrappers it was found inside, innermost first (`rm` inside
    /// `eval` inside `sh -c`).
    fn within(&self, what: String) -> String {
        if self.via.is_empty() {
            return what;
        }
        let chain: Vec<&str> = self.via.iter().rev().map(String::as_str).collect();
        format!("{what} (inside {})", chain.join(" inside "))
    }

    /// A part built at run time: destructive, and a human must approve it, since deny
    /// and approval rules cannot see it (as with unparseable input).
    fn dynamic(&mut self, command: String, why: &str) {
        self.push(command, Family::Destructive, format!("dynamic: {why}"));
        if self.approval.is_none() {
            self.approval = Some(self.within(format!("dynamic: {why}: {DYNAMIC_APPROVAL}")));
        }
    }

    /// Classifies `text` as the commands a wrapper (`via`) runs.
    fn inner(&mut self, via: String, text: &str, depth: usize) {
        if self.via.len() >= MAX_WRAPPERS {
            let why = format!("{via} is wrapped more than {MAX_WRAPPERS} deep");
            self.dynamic(text.trim().to_string(), &why);
            return;
        }
        self.via.push(via);
        let stdin = std::mem::take(&mut self.stdin);
        let piped = std::mem::replace(&mut self.piped, false);
        // A failure has recorded its own destructive part and the approval it needs.
        let _ = self.program(text, depth + 1);
        self.stdin = stdin;
        self.piped = piped;
        self.via.pop();
    }

    /// Parses and walks a whole command string (the top level, or a substitution's body).
    fn program(&mut self, text: &str, depth: usize) -> Result<(), String> {
        let result = self.parse_and_walk(text, depth);
        if result.is_err() && self.approval.is_none() {
            // Nothing inside could be checked against deny or approval rules, and `sh`
            // may accept what brush-parser refused: a human decides.
            self.approval = Some(UNPARSEABLE_APPROVAL.to_string());
        }
        result
    }

    fn parse_and_walk(&mut self, text: &str, depth: usize) -> Result<(), String> {
        let shown = text.trim().to_string();
        if depth > MAX_DEPTH || naive_nesting(text) > MAX_NESTING {
            let why = "nested too deeply to analyse".to_string();
            self.push(shown, Family::Destructive, format!("unparseable: {why}"));
            return Err(why);
        }
        let options = self.options.clone();
        // brush-parser is not known to panic, but a classifier that guards every remote
        // command must not take the process down on odd input: a panic is a parse error.
        let parsed = catch_unwind(AssertUnwindSafe(|| {
            brush_parser::Parser::new(text.as_bytes(), &options).parse_program()
        }));
        let program = match parsed {
            Ok(Ok(program)) => program,
            Ok(Err(e)) => {
                let why = e.to_string();
                self.push(shown, Family::Destructive, format!("unparseable: {why}"));
                return Err(why);
            }
            Err(_) => {
                let why = "the shell parser failed on this input".to_string();
                self.push(shown, Family::Destructive, format!("unparseable: {why}"));
                return Err(why);
            }
        };
        for list in &program.complete_commands {
            self.compound_list(list, depth);
        }
        Ok(())
    }

    fn compound_list(&mut self, list: &CompoundList, depth: usize) {
        for item in &list.0 {
            let and_or = &item.0;
            self.pipeline(&and_or.first, depth);
            for next in &and_or.additional {
                match next {
                    ast::AndOr::And(p) | ast::AndOr::Or(p) => self.pipeline(p, depth),
                }
            }
        }
    }

    fn pipeline(&mut self, pipeline: &Pipeline, depth: usize) {
        let outer = self.piped;
        for (i, command) in pipeline.seq.iter().enumerate() {
            self.piped = outer || i > 0;
            self.command(command, depth);
        }
        self.piped = outer;
    }

    fn command(&mut self, command: &Command, depth: usize) {
        match command {
            Command::Simple(simple) => self.simple(simple, depth),
            Command::Compound(compound, redirects) => {
                self.compound(compound, depth);
                for r in redirects.iter().flat_map(|r| r.0.iter()) {
                    self.redirect(r, depth);
                }
            }
            // A function body may run whenever the function is called (even under the
            // name of a harmless program), so its commands count as parts.
            Command::Function(function) => {
                let name = function.fname.value.clone();
                // Until the body is known, a call (recursion: `:(){ :|:& };:`) is the
                // worst case.
                self.functions.insert(name.clone(), Family::Destructive);
                let first = self.parts.len();
                self.compound(&function.body.0, depth);
                for r in function.body.1.iter().flat_map(|r| r.0.iter()) {
                    self.redirect(r, depth);
                }
                let body = self.parts[first..]
                    .iter()
                    .map(|p| p.family)
                    .max()
                    .unwrap_or(Family::ReadOnly);
                self.functions.insert(name, body);
            }
            Command::ExtendedTest(test, redirects) => {
                self.expansions_in_text(&test.expr.to_string(), depth);
                for r in redirects.iter().flat_map(|r| r.0.iter()) {
                    self.redirect(r, depth);
                }
            }
        }
    }

    fn compound(&mut self, compound: &CompoundCommand, depth: usize) {
        match compound {
            CompoundCommand::Arithmetic(a) => self.expansions_in_text(&a.expr.value, depth),
            CompoundCommand::ArithmeticForClause(f) => {
                for expr in [&f.initializer, &f.condition, &f.updater]
                    .into_iter()
                    .flatten()
                {
                    self.expansions_in_text(&expr.value, depth);
                }
                self.compound_list(&f.body.list, depth);
            }
            CompoundCommand::BraceGroup(g) => self.compound_list(&g.list, depth),
            CompoundCommand::Subshell(s) => self.compound_list(&s.list, depth),
            CompoundCommand::ForClause(f) => {
                for w in f.values.iter().flatten() {
                    let info = analyse(&w.value, &self.options);
                    self.word_effects(&info, depth);
                }
                self.compound_list(&f.body.list, depth);
            }
            CompoundCommand::CaseClause(c) => {
                let info = analyse(&c.value.value, &self.options);
                self.word_effects(&info, depth);
                for case in &c.cases {
                    for w in &case.patterns {
                        let info = analyse(&w.value, &self.options);
                        self.word_effects(&info, depth);
                    }
                    if let Some(list) = &case.cmd {
                        self.compound_list(list, depth);
                    }
                }
            }
            CompoundCommand::IfClause(i) => {
                self.compound_list(&i.condition, depth);
                self.compound_list(&i.then, depth);
                for e in i.elses.iter().flatten() {
                    if let Some(cond) = &e.condition {
                        self.compound_list(cond, depth);
                    }
                    self.compound_list(&e.body, depth);
                }
            }
            CompoundCommand::WhileClause(w) | CompoundCommand::UntilClause(w) => {
                self.compound_list(&w.0, depth);
                self.compound_list(&w.1.list, depth);
            }
            CompoundCommand::Coprocess(c) => self.command(&c.body, depth),
        }
    }

    /// Text (an arithmetic expression, a `[[ ]]` test) that may contain command
    /// substitutions: classify them by parsing the text as a word.
    fn expansions_in_text(&mut self, text: &str, depth: usize) {
        if text.contains("$(") || text.contains('`') || text.contains("<(") || text.contains(">(") {
            let info = analyse_heredoc(text, &self.options);
            self.word_effects(&info, depth);
            if info.substitutions.is_empty() && info.opaque.is_empty() {
                self.dynamic(
                    text.to_string(),
                    "an expansion here may run commands that cannot be analysed",
                );
            }
        }
    }

    /// Classifies what a word runs by itself: command substitutions and expansions.
    fn word_effects(&mut self, info: &WordInfo, depth: usize) {
        for sub in &info.substitutions {
            // A failing substitution has already recorded its own destructive part.
            let _ = self.program(sub, depth + 1);
        }
        for opaque in &info.opaque {
            self.dynamic(
                opaque.clone(),
                "a command substitution inside an expansion cannot be analysed",
            );
        }
        if let Some(e) = &info.error {
            self.push(
                info.raw.clone(),
                Family::Destructive,
                format!("unparseable word: {e}"),
            );
            if self.approval.is_none() {
                self.approval = Some(UNPARSEABLE_APPROVAL.to_string());
            }
        }
    }

    fn simple(&mut self, cmd: &SimpleCommand, depth: usize) {
        let mut acc = SimpleAcc::default();
        for item in cmd.prefix.iter().flat_map(|p| p.0.iter()) {
            self.item(item, true, &mut acc, depth);
        }
        if let Some(name) = &cmd.word_or_name {
            acc.shown.push(name.value.clone());
            acc.words.push(analyse(&name.value, &self.options));
        }
        for item in cmd.suffix.iter().flat_map(|s| s.0.iter()) {
            self.item(item, false, &mut acc, depth);
        }
        let SimpleAcc {
            words,
            shown,
            assignments,
        } = acc;
        for w in &words {
            self.word_effects(w, depth);
        }
        let shown = shown.join(" ");
        // After the items: a substitution among them may have classified commands of
        // its own, with their own input.
        self.stdin = input_of(cmd, &self.options);
        if words.is_empty() {
            if assignments {
                self.push(
                    shown,
                    Family::ReadOnly,
                    "assignment only: sets shell variables".into(),
                );
            }
            return;
        }
        self.classify_words(shown, &words, depth);
    }

    /// One prefix or suffix item of a simple command.
    fn item(
        &mut self,
        item: &CommandPrefixOrSuffixItem,
        in_prefix: bool,
        acc: &mut SimpleAcc,
        depth: usize,
    ) {
        match item {
            CommandPrefixOrSuffixItem::IoRedirect(r) => {
                acc.shown.push(match r {
                    // Show `<<EOF`, not the whole body.
                    IoRedirect::HereDocument(fd, doc) => format!(
                        "{}<<{}",
                        fd.map(|f| f.to_string()).unwrap_or_default(),
                        doc.here_end.value
                    ),
                    other => other.to_string(),
                });
                self.redirect(r, depth);
            }
            CommandPrefixOrSuffixItem::Word(w) => {
                acc.shown.push(w.value.clone());
                acc.words.push(analyse(&w.value, &self.options));
            }
            CommandPrefixOrSuffixItem::AssignmentWord(_, w) => {
                acc.shown.push(w.value.clone());
                let info = analyse(&w.value, &self.options);
                if in_prefix {
                    // `FOO=1 cmd`: an environment setting for cmd, not a word of it.
                    acc.assignments = true;
                    self.word_effects(&info, depth);
                    if let Some(why) = code_assignment(&info.text) {
                        self.push(w.value.clone(), Family::Destructive, why);
                    }
                } else {
                    // `export FOO=1`, `env FOO=1 cmd`: an argument.
                    acc.words.push(info);
                }
            }
            CommandPrefixOrSuffixItem::ProcessSubstitution(kind, sub) => {
                let kind = match kind {
                    ast::ProcessSubstitutionKind::Read => "<",
                    ast::ProcessSubstitutionKind::Write => ">",
                };
                acc.shown
                    .push(format!("{kind}({})", sub.list.to_string().trim()));
                self.compound_list(&sub.list, depth + 1);
                // The command sees a path like /dev/fd/63 in its place.
                acc.words.push(WordInfo {
                    raw: acc.shown.last().cloned().unwrap_or_default(),
                    text: "/dev/fd/63".into(),
                    ..WordInfo::default()
                });
            }
        }
    }

    /// Decides the family of one simple command given its words (program first).
    fn classify_words(&mut self, shown: String, words: &[WordInfo], depth: usize) {
        // A call of a function defined in this command runs its body, or, when the
        // definition did not run (`if x; then f() {...}; fi; f`), the program of that
        // name: it gets the stricter of the two.
        let function = self
            .functions
            .get(&words[0].text)
            .copied()
            .filter(|_| !words[0].expands && !words[0].globs);
        let mut start = 0;
        // `xargs` appends arguments it reads at run time to its command.
        let mut appends_args = false;
        loop {
            let program = &words[start];
            // `[` is the test builtin, not a glob that could name another program: it
            // needs no approval. It stays destructive, as it always was here: tests and
            // policies written against that rely on its family (issue 48 follow-up).
            if program.text == "[" && program.globs && !program.expands {
                self.push(
                    shown,
                    Family::Destructive,
                    "dynamic: the program name `[` is only known at run time".into(),
                );
                return;
            }
            let globs = program.globs;
            // `$HOME/bin/tool` names a file as surely as `~/bin/tool` does.
            let home_path = normalise_path(&program.text).starts_with("~/")
                && program.text.matches('$').count() == 1
                && !program.raw.contains('`')
                && program.substitutions.is_empty();
            if (program.expands && !home_path) || globs || program.error.is_some() {
                let why = format!(
                    "the program name `{}` is only known at run time",
                    program.raw
                );
                self.dynamic(shown, &why);
                return;
            }
            let base = basename(&program.text);
            let Some(spec) = WRAPPERS.iter().find(|w| w.name == base) else {
                break;
            };
            let args = &words[start + 1..];
            if spec.name == "command"
                && args
                    .first()
                    .is_some_and(|a| a.text == "-v" || a.text == "-V")
            {
                self.push(
                    shown,
                    Family::ReadOnly,
                    "`command -v` only looks a name up".into(),
                );
                return;
            }
            match unwrap(spec, args) {
                Unwrapped::Command(offset) if spec.name == "watch" => {
                    // watch joins its words and runs them through `sh -c`.
                    let rest = &args[offset..];
                    if rest.iter().any(|w| w.expands || w.globs) {
                        self.dynamic(shown, "`watch` of a command built at run time");
                    } else {
                        let text = rest.iter().map(|w| w.text.as_str()).collect::<Vec<_>>();
                        self.inner("`watch`".into(), &text.join(" "), depth);
                    }
                    return;
                }
                Unwrapped::Command(offset) => {
                    appends_args |= spec.name == "xargs";
                    start += 1 + offset;
                }
                Unwrapped::Dynamic(why) => {
                    self.dynamic(shown, &why);
                    return;
                }
                Unwrapped::Nothing => break,
            }
        }

        let program = basename(&words[start].text).to_string();
        let args = &words[start + 1..];
        // Settings given through a wrapper (`env PATH=/x cmd`) or exported for the rest
        // of the command (`export LD_PRELOAD=...`).
        let settings = if matches!(
            program.as_str(),
            "export" | "declare" | "typeset" | "local" | "readonly"
        ) {
            words
        } else {
            &words[..start]
        };
        if let Some(why) = settings.iter().find_map(|w| code_assignment(&w.text)) {
            self.push(shown, Family::Destructive, why);
            return;
        }
        // Aliases defined in `sh -c` text are expanded by dash on later lines.
        if program == "alias" && args.iter().any(|a| a.text.contains('=')) {
            self.dynamic(shown, "`alias` defines a name that runs text as commands");
            return;
        }
        if program == "exec" {
            // `exec >log 2>&1` only redirects the shell; the redirections are parts.
            self.push(
                shown,
                Family::ReadOnly,
                "`exec` without a command only changes redirections".into(),
            );
            return;
        }
        if self.runs_text(&shown, &program, args, depth) {
            return;
        }

        let mut own_args: Vec<&WordInfo> = Vec::with_capacity(args.len());
        if program == "find" {
            // `find ... -exec CMD {} ;` runs CMD: classify it as a part of its own.
            let mut i = 0;
            while i < args.len() {
                let t = args[i].text.as_str();
                if matches!(t, "-exec" | "-execdir" | "-ok" | "-okdir") {
                    let end = args[i + 1..]
                        .iter()
                        .position(|w| w.text == ";" || w.text == "+")
                        .map_or(args.len(), |p| i + 1 + p);
                    own_args.push(&args[i]);
                    let inner = &args[i + 1..end];
                    if inner.is_empty() {
                        self.push(
                            shown.clone(),
                            Family::Destructive,
                            "dynamic: `find -exec` without a command".into(),
                        );
                    } else {
                        self.classify_words(display(inner), inner, depth);
                    }
                    i = end + 1;
                } else {
                    own_args.push(&args[i]);
                    i += 1;
                }
            }
        } else {
            own_args.extend(args);
        }

        let mut text = program.clone();
        let mut normalised = program.clone();
        for a in &own_args {
            text.push(' ');
            text.push_str(&a.text);
            normalised.push(' ');
            normalised.push_str(&normalise_path(&a.text));
        }
        // `rm -rf /.` is `rm -rf /`: rules also see the paths in their plain form, and the
        // stricter answer of the two counts (normalising never makes a command milder).
        let mut matched = self.policy.match_rule(&program, &text);
        if normalised != text {
            let plain = self.policy.match_rule(&program, &normalised);
            if strictness(self.policy, plain) > strictness(self.policy, matched) {
                matched = plain;
            }
        }
        if appends_args {
            self.run_time_arguments(&program, &text, &normalised, matched);
        }
        let (family, rule) = match matched {
            Some(rule) => {
                let name = self.policy.rule_name(rule);
                if rule.deny && self.deny.is_none() {
                    self.deny = Some(self.within(name.clone()));
                }
                if rule.approval && self.approval.is_none() {
                    self.approval = Some(self.within(name.clone()));
                }
                for lock in &rule.locks {
                    if !self.locks.iter().any(|l| l.name() == lock.name()) {
                        self.locks.push(lock.clone());
                    }
                }
                (rule.family, name)
            }
            None => (
                self.policy.default_family(),
                "no rule: default_family".to_string(),
            ),
        };
        match function {
            Some(body) if body > family => {
                let rule = format!("function `{}` defined in this command", words[0].text);
                self.push(shown, body, rule);
            }
            _ => self.push(shown, family, rule),
        }
    }

    /// Commands that run text or a file as shell commands (`sh -c`, `eval`, `trap`,
    /// `su -c`, `source`, a shell reading its input): classifies what they run and says
    /// true, or says false for any other program.
    fn runs_text(&mut self, shown: &str, program: &str, args: &[WordInfo], depth: usize) -> bool {
        let shown = shown.to_string();
        match program {
            "eval" => {
                if args.iter().any(|w| w.expands || w.globs) {
                    self.dynamic(shown, "`eval` of text built at run time");
                } else {
                    let text = args.iter().map(|w| w.text.as_str()).collect::<Vec<_>>();
                    self.inner("`eval`".into(), &text.join(" "), depth);
                }
            }
            "trap" => match args.first() {
                None => self.push(shown, Family::ReadOnly, "`trap` lists handlers".into()),
                Some(w) if matches!(w.text.as_str(), "-p" | "-l" | "-" | "") && !w.expands => self
                    .push(
                        shown,
                        Family::ReadOnly,
                        "`trap` lists or resets handlers".into(),
                    ),
                Some(w) if w.expands => self.dynamic(shown, "`trap` of text built at run time"),
                Some(w) => self.inner("`trap`".into(), &w.text.clone(), depth),
            },
            "su" => {
                let at = args
                    .iter()
                    .position(|w| matches!(w.text.as_str(), "-c" | "--command"));
                let inline = args.iter().find_map(|w| w.text.strip_prefix("--command="));
                match (at.and_then(|i| args.get(i + 1)), inline) {
                    (Some(w), _) if w.expands => {
                        self.dynamic(shown, "`su -c` of text built at run time")
                    }
                    (Some(w), _) => self.inner("`su -c`".into(), &w.text.clone(), depth),
                    (None, Some(text)) => self.inner("`su -c`".into(), text, depth),
                    (None, None) => self.shell_input(shown, "su", depth),
                }
            }
            p if RUNS_A_FILE.iter().any(|(name, _)| *name == p) => {
                let why = RUNS_A_FILE.iter().find(|(name, _)| *name == p).unwrap().1;
                match args.first() {
                    Some(file) if file.expands || is_process_substitution(file) => {
                        self.dynamic(shown, &format!("`{p}` of a script built at run time"))
                    }
                    _ => self.push(
                        shown,
                        Family::Destructive,
                        format!("{why}, which cannot be seen here"),
                    ),
                }
            }
            p if SHELLS.contains(&p) => match shell_runs(args) {
                ShellRuns::Text(w) if w.expands || w.globs => {
                    self.dynamic(shown, &format!("`{p} -c` of text built at run time"))
                }
                ShellRuns::Text(w) => self.inner(format!("`{p} -c`"), &w.text.clone(), depth),
                ShellRuns::MissingText => self.push(
                    shown,
                    Family::Destructive,
                    format!("`{p} -c` without the text to run"),
                ),
                ShellRuns::File(f) if f.expands || is_process_substitution(f) => {
                    self.dynamic(shown, &format!("`{p}` runs a script built at run time"))
                }
                ShellRuns::File(_) => self.push(
                    shown,
                    Family::Destructive,
                    format!("`{p} FILE` runs a file's commands, which cannot be seen here"),
                ),
                ShellRuns::CommandInput => self.shell_input(shown, p, depth),
            },
            _ => return false,
        }
        true
    }

    /// A shell (or `su`) that reads its commands from its standard input.
    fn shell_input(&mut self, shown: String, program: &str, depth: usize) {
        match std::mem::take(&mut self.stdin) {
            CommandInput::Literal(text) => self.inner(format!("`{program}` reading a literal here-document or here-string"), &text, depth),
            CommandInput::File => self.push(
                shown,
                Family::Destructive,
                format!("`{program} < FILE` runs a file's commands, which cannot be seen here"),
            ),
            CommandInput::Expanded => self.dynamic(
                shown,
                &format!("`{program}` reads commands from a here-document or here-string built at run time"),
            ),
            CommandInput::Substituted => self.dynamic(
                shown,
                &format!("`{program}` reads commands from a process substitution, written at run time"),
            ),
            CommandInput::Inherited if self.piped => {
                self.dynamic(shown, &format!("`{program}` reads its commands from a pipe"))
            }
            CommandInput::Inherited => self.dynamic(
                shown,
                &format!("`{program}` reads its commands from the caller's input"),
            ),
        }
    }

    /// `xargs CMD`: the arguments come at run time, so a rule on CMD's arguments cannot
    /// see them. If CMD with a `/` appended would be denied or need approval where CMD
    /// as written is not, a human decides (`ls | xargs rm -rf`).
    fn run_time_arguments(
        &mut self,
        program: &str,
        text: &str,
        normalised: &str,
        written: Option<&super::Rule>,
    ) {
        let (deny, approval, _) = strictness(self.policy, written);
        if deny || approval || self.approval.is_some() {
            return;
        }
        let probe = [format!("{text} /"), format!("{normalised} /")];
        let hit = probe
            .iter()
            .filter_map(|t| self.policy.match_rule(program, t))
            .find(|r| r.deny || r.approval);
        if let Some(rule) = hit {
            self.approval = Some(format!(
                "dynamic: `xargs` gives `{program}` arguments read at run time, and with some \
                 (`/`) {} holds: {DYNAMIC_APPROVAL}",
                self.policy.rule_name(rule)
            ));
        }
    }

    fn redirect(&mut self, redirect: &IoRedirect, depth: usize) {
        let (target, family, op) = match redirect {
            IoRedirect::File(fd, kind, target) => {
                let op = format!("{}{kind}", fd.map(|f| f.to_string()).unwrap_or_default());
                let word = match target {
                    IoFileRedirectTarget::Filename(w) => w,
                    IoFileRedirectTarget::Fd(_) => return,
                    IoFileRedirectTarget::ProcessSubstitution(_, sub) => {
                        self.compound_list(&sub.list, depth + 1);
                        return;
                    }
                    IoFileRedirectTarget::Duplicate(w) => {
                        let t = w.value.as_str();
                        if t == "-" || t.chars().all(|c| c.is_ascii_digit()) {
                            return;
                        }
                        w
                    }
                };
                let family = match kind {
                    IoFileRedirectKind::Read | IoFileRedirectKind::DuplicateInput => {
                        let info = analyse(&word.value, &self.options);
                        self.word_effects(&info, depth);
                        return;
                    }
                    IoFileRedirectKind::Append => Family::AppendOnly,
                    IoFileRedirectKind::Write
                    | IoFileRedirectKind::Clobber
                    | IoFileRedirectKind::ReadAndWrite
                    | IoFileRedirectKind::DuplicateOutput => Family::Convergent,
                };
                (word, family, op)
            }
            IoRedirect::OutputAndError(word, append) => {
                if *append {
                    (word, Family::AppendOnly, "&>>".to_string())
                } else {
                    (word, Family::Convergent, "&>".to_string())
                }
            }
            IoRedirect::HereDocument(_, doc) => {
                if doc.requires_expansion {
                    let info = analyse_heredoc(&doc.doc.value, &self.options);
                    self.word_effects(&info, depth);
                }
                return;
            }
            IoRedirect::HereString(_, word) => {
                let info = analyse(&word.value, &self.options);
                self.word_effects(&info, depth);
                return;
            }
        };
        let info = analyse(&target.value, &self.options);
        self.word_effects(&info, depth);
        if !info.expands && HARMLESS_TARGETS.contains(&info.text.as_str()) {
            return;
        }
        let (family, what) =
            if info.text.starts_with("/dev/tcp/") || info.text.starts_with("/dev/udp/") {
                // bash opens a network connection: whatever is written is sent.
                (Family::AppendOnly, "sends data over the network")
            } else if info.text.starts_with("/dev/") {
                (Family::Destructive, "writes a device")
            } else if family == Family::AppendOnly {
                (family, "appends to a file")
            } else {
                (family, "overwrites a file")
            };
        self.push(
            format!("{op} {}", target.value),
            family,
            format!("redirection: `{op}` {what}"),
        );
    }
}

/// What a simple command's items add up to while they are walked.
#[derive(Default)]
struct SimpleAcc {
    /// Program and argument words (prefix assignments excluded).
    words: Vec<WordInfo>,
    /// Everything as written, for display.
    shown: Vec<String>,
    /// The command has `NAME=value` settings before the program.
    assignments: bool,
}
