//! The shell-aware classifier: parses a command string with brush-parser and gives every
//! simple command in it (including those inside subshells, groups, loops, functions,
//! substitutions and `find -exec`) a family; the whole takes the most dangerous one.
//!
//! Structural decisions that no policy can override, because the policy cannot see
//! what they would run: a program name that is computed (`$x`, `$(...)`, globs, brace
//! expansion), `eval`/`source`/`.`/`exec`/`trap`, shells (`sh -c ...`), `watch`,
//! `env -S`, and anything unparseable are destructive.

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

/// Inputs nested deeper than this are not handed to the parser, whose recursive descent
/// would otherwise overflow the stack on something like 10,000 `(`.
const MAX_NESTING: usize = 64;

/// The `approval` of a command that could not be parsed.
pub(crate) const UNPARSEABLE_APPROVAL: &str =
    "unparseable: deny and approval rules cannot be checked";

/// Programs that run text they receive as shell commands; what they run is invisible.
const SHELLS: &[&str] = &[
    "sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "fish", "csh", "tcsh", "yash", "rbash",
];

/// Builtins and programs that turn data into commands at run time.
const DYNAMIC: &[(&str, &str)] = &[
    ("eval", "`eval` runs text as commands"),
    ("source", "`source` runs a file's commands"),
    (".", "`.` runs a file's commands"),
    ("exec", "`exec` replaces the shell with a command"),
    ("trap", "`trap` runs text as commands later"),
    (
        "watch",
        "`watch` runs its arguments through `sh -c`, repeatedly",
    ),
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
    /// Functions defined so far in this command, with the family of their bodies. A call
    /// runs the body, not the program of that name.
    functions: HashMap<String, Family>,
}

/// Classifies `command` under `policy` (see the module docs).
pub(crate) fn classify(policy: &Policy, command: &str) -> Classification {
    let mut c = Classifier {
        policy,
        options: ParserOptions::default(),
        parts: Vec::new(),
        deny: None,
        approval: None,
        functions: HashMap::new(),
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

impl Classifier<'_> {
    fn push(&mut self, command: String, family: Family, rule: String) {
        self.parts.push(Part {
            command,
            family,
            rule,
        });
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
        for command in &pipeline.seq {
            self.command(command, depth);
        }
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
                self.push(
                    text.to_string(),
                    Family::Destructive,
                    "dynamic: an expansion here may run commands that cannot be analysed".into(),
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
            self.push(
                opaque.clone(),
                Family::Destructive,
                "dynamic: a command substitution inside an expansion cannot be analysed".into(),
            );
        }
        if let Some(e) = &info.error {
            self.push(
                info.raw.clone(),
                Family::Destructive,
                format!("unparseable word: {e}"),
            );
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
        self.classify_words(shown, &words);
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
    fn classify_words(&mut self, shown: String, words: &[WordInfo]) {
        // A call of a function defined in this command runs its body, or, when the
        // definition did not run (`if x; then f() {...}; fi; f`), the program of that
        // name: it gets the stricter of the two.
        let function = self
            .functions
            .get(&words[0].text)
            .copied()
            .filter(|_| !words[0].expands && !words[0].globs);
        let mut start = 0;
        loop {
            let program = &words[start];
            if program.expands || program.globs || program.error.is_some() {
                self.push(
                    shown,
                    Family::Destructive,
                    format!(
                        "dynamic: the program name `{}` is only known at run time",
                        program.raw
                    ),
                );
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
                Unwrapped::Command(offset) => start += 1 + offset,
                Unwrapped::Dynamic(why) => {
                    self.push(shown, Family::Destructive, format!("dynamic: {why}"));
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
            self.push(
                shown,
                Family::Destructive,
                "dynamic: `alias` defines a name that runs text as commands".into(),
            );
            return;
        }
        if let Some((_, why)) = DYNAMIC.iter().find(|(name, _)| *name == program) {
            if program == "exec" && args.is_empty() {
                // `exec >log 2>&1` only redirects the shell; the redirections are parts.
                self.push(
                    shown,
                    Family::ReadOnly,
                    "`exec` without a command only changes redirections".into(),
                );
            } else {
                self.push(shown, Family::Destructive, format!("dynamic: {why}"));
            }
            return;
        }
        if SHELLS.contains(&program.as_str()) {
            self.push(
                shown,
                Family::Destructive,
                format!("dynamic: `{program}` runs commands this classifier cannot see"),
            );
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
                        self.classify_words(display(inner), inner);
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
        let (family, rule) = match matched {
            Some(rule) => {
                let name = self.policy.rule_name(rule);
                if rule.deny && self.deny.is_none() {
                    self.deny = Some(name.clone());
                }
                if rule.approval && self.approval.is_none() {
                    self.approval = Some(name.clone());
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
