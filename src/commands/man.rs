//! `opmark man`: the manual page in roff, generated from the clap definition (one page
//! with every subcommand as a section), so the page cannot drift from `--help`. One page
//! is what `man opmark` finds: it names no `opmark-run(1)` pages (there are none), only
//! opmark(1) and the system's own pages.

use clap::CommandFactory as _;

use crate::cli::{Cli, GlobalArgs, EXIT_CODES_HELP, RUN_HELP};
use crate::error::{exit_code, Error, ErrorKind, Result};

/// Writes opmark(1) on stdout; with `--json`, one document `{"format": "roff", "page"}`.
pub fn run(global: &GlobalArgs) -> Result<u8> {
    let page = page()?;
    if global.json {
        super::common::print_json(&serde_json::json!({ "format": "roff", "page": page }))?;
    } else {
        // As every text command: a closed pipe ends us quietly with 141.
        crate::out!("{page}");
    }
    Ok(exit_code::OK)
}

/// Where the text blocks of the page are wrapped: man indents a section's body by 7
/// columns, and an 80-column terminal then still shows a line whole.
const BLOCK_WIDTH: usize = 72;

/// Examples for the EXAMPLES section: what each does, then the command lines (one that
/// goes on, on the next, ends with `\`).
const EXAMPLES: &[(&str, &[&str])] = &[
    (
        "Run a command once under an operation id. Running it again with the same id (after a lost connection, a killed client, a retry by an agent) follows the command while it still runs and then replays its recorded exit status and output; it never runs it a second time.",
        &["opmark run web1 --op deploy-42 -- 'systemctl restart app'"],
    ),
    (
        "The same for an agent: one JSON document on stdout; branch on verdict, reason_code and retryable.",
        &["opmark --json run web1 --op deploy-42 -- 'systemctl restart app'"],
    ),
    (
        "One operation per host under the same op id, at most 2 hosts at once, stopping new hosts after the first failure.",
        &[
            "opmark run web1 web2 web3 --op rotate-7 --forks 2 \\",
            "    --max-failures 1 -- 'logrotate -f /etc/logrotate.conf'",
        ],
    ),
    (
        "Look at the operation's marker on its host: absent, running, completed (with its exit status), interrupted or fenced.",
        &["opmark probe web1 deploy-42"],
    ),
    (
        "After an outage: probe every unresolved operation and settle what the evidence settles; the rest is listed with what to look at.",
        &["opmark reconcile", "opmark list --unresolved"],
    ),
    (
        "Record an operator's decision about an operation the evidence could not settle, once you have checked by hand.",
        &[
            "opmark show deploy-42",
            "opmark resolve deploy-42 --host web1 --as applied --exit 0 \\",
            "    --note 'app restarted at 10:02, seen in its log'",
        ],
    ),
    (
        "Serve the Model Context Protocol on stdio (tools run, plan, probe, output, show, list, reconcile, cancel) for an agent framework; its configuration starts this command.",
        &["opmark mcp"],
    ),
    (
        "Check that a host is usable, each failing check with its fix; then verify that no ledger event was edited or deleted.",
        &["opmark doctor web1", "opmark audit verify"],
    ),
    (
        "Try it against a disposable local sshd.",
        &["opmark lab up", "eval \"$(opmark lab env)\"", "opmark run target1 --op hello-1 -- echo hello", "opmark lab down"],
    ),
];

/// The system's pages the page refers to.
const SEE_ALSO: &str = "ssh(1), ssh_config(5), ssh-keygen(1), sshd(8)";

/// The page: clap_mangen's title, NAME, SYNOPSIS, DESCRIPTION and OPTIONS, a COMMANDS
/// list, one section per subcommand with its options (and `run`'s exit statuses and
/// reason codes), then EXIT STATUS, EXAMPLES and SEE ALSO.
fn page() -> Result<String> {
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorKind::Internal,
            format!("cannot render the manual page: {e}"),
        )
    };
    let mut cmd = Cli::command();
    cmd.build();
    let man = clap_mangen::Man::new(cmd.clone());
    let mut out = Vec::new();
    man.render_title(&mut out).map_err(fail)?;
    man.render_name_section(&mut out).map_err(fail)?;
    man.render_synopsis_section(&mut out).map_err(fail)?;
    man.render_description_section(&mut out).map_err(fail)?;
    man.render_options_section(&mut out).map_err(fail)?;
    let mut page = String::from_utf8_lossy(&out).into_owned();

    // clap's own `help` subcommand is `--help`, said in OPTIONS.
    let subcommands: Vec<&clap::Command> = cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set() && s.get_name() != "help")
        .collect();
    page.push_str(".SH COMMANDS\n");
    for sub in &subcommands {
        page.push_str(&format!(
            ".TP\n\\fBopmark {}\\fR\n{}\n",
            sub.get_name(),
            escape(&about(sub))
        ));
    }
    for sub in &subcommands {
        // After `build`, a subcommand's bin name is `opmark <name>`: the synopsis uses it.
        let name = format!("opmark {}", sub.get_name());
        let mut section = Vec::new();
        let man = clap_mangen::Man::new((*sub).clone());
        man.render_description_section(&mut section).map_err(fail)?;
        man.render_synopsis_section(&mut section).map_err(fail)?;
        man.render_options_section(&mut section).map_err(fail)?;
        page.push_str(&format!(".SH \"{}\"\n", name.to_uppercase()));
        // Each rendered section opens with its own `.SH`; demote them to `.SS` so they
        // sit under this subcommand's heading.
        page.push_str(&String::from_utf8_lossy(&section).replace(".SH ", ".SS "));
        let actions: Vec<&clap::Command> = sub
            .get_subcommands()
            .filter(|s| !s.is_hide_set() && s.get_name() != "help")
            .collect();
        if !actions.is_empty() {
            page.push_str(".SS COMMANDS\n");
            for action in actions {
                page.push_str(&format!(
                    ".TP\n\\fB{name} {}\\fR\n{}\n",
                    action.get_name(),
                    escape(&about(action))
                ));
            }
        }
        if sub.get_name() == "run" {
            page.push_str(".SS \"EXIT STATUS AND REASON CODES\"\n");
            page.push_str(&block(RUN_HELP));
        }
    }
    page.push_str(".SH \"EXIT STATUS\"\n");
    page.push_str(&block(EXIT_CODES_HELP));
    page.push_str(".SH EXAMPLES\n");
    for (what, lines) in EXAMPLES {
        page.push_str(&format!(".PP\n{}\n.PP\n.RS 4\n.nf\n", escape(what)));
        for line in *lines {
            // A line that goes on a line before it (`\` at its end) has no prompt.
            let line = match line.starts_with(' ') {
                true => (*line).to_owned(),
                false => format!("$ {line}"),
            };
            page.push_str(&escape(&line));
            page.push('\n');
        }
        page.push_str(".fi\n.RE\n");
    }
    page.push_str(&format!(".SH \"SEE ALSO\"\n{}\n", escape(SEE_ALSO)));
    Ok(page)
}

/// A command's one-line summary, as the help's command list shows it.
fn about(cmd: &clap::Command) -> String {
    cmd.get_about()
        .or_else(|| cmd.get_long_about())
        .map(|a| a.to_string())
        .unwrap_or_default()
}

/// `text` as a block that keeps its lines and the columns of its tables, wrapped for a
/// terminal (see [`crate::text::wrap_hanging`]).
fn block(text: &str) -> String {
    let wrapped = crate::text::wrap_hanging(text, BLOCK_WIDTH);
    let lines: Vec<String> = wrapped
        .lines()
        .map(|l| {
            if l.is_empty() {
                String::new()
            } else {
                escape(l)
            }
        })
        .collect();
    format!(".nf\n{}\n.fi\n", lines.join("\n"))
}

/// Text for roff: backslashes and hyphen-minus escaped (`\-` is the minus an option is
/// typed with), and a line that would start with a control character kept as text.
fn escape(text: &str) -> String {
    text.lines()
        .map(|line| {
            let line = line.replace('\\', "\\e").replace('-', "\\-");
            if line.starts_with(['.', '\'']) {
                format!("\\&{line}")
            } else {
                line
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roff_escapes_what_roff_would_read_as_markup() {
        assert_eq!(escape("a-b \\n"), "a\\-b \\en");
        assert_eq!(escape(".hidden\n'also"), "\\&.hidden\n\\&'also");
    }
}
