//! `opmark man`: the manual page in roff, generated from the clap definition (one page
//! with every subcommand as a section), so the page cannot drift from `--help`.

use clap::CommandFactory as _;

use crate::cli::{Cli, GlobalArgs};
use crate::error::{exit_code, Error, ErrorKind, Result};

/// Writes opmark(1) on stdout; with `--json`, one document `{"format": "roff", "page"}`.
pub fn run(global: &GlobalArgs) -> Result<u8> {
    let page = page()?;
    let page = String::from_utf8_lossy(&page);
    if global.json {
        super::common::print_json(&serde_json::json!({ "format": "roff", "page": page }))?;
    } else {
        // As every text command: a closed pipe ends us quietly with 141.
        crate::out!("{page}");
    }
    Ok(exit_code::OK)
}

/// The page: clap_mangen's top-level page, then one SUBCOMMAND section per subcommand
/// with its options, since a single file is what `man opmark` finds.
fn page() -> Result<Vec<u8>> {
    let fail = |e: std::io::Error| {
        Error::new(
            ErrorKind::Internal,
            format!("cannot render the manual page: {e}"),
        )
    };
    let mut cmd = Cli::command();
    cmd.build();
    let mut out = Vec::new();
    clap_mangen::Man::new(cmd.clone())
        .render(&mut out)
        .map_err(fail)?;
    for sub in cmd.get_subcommands() {
        // After `build`, a subcommand's bin name is `opmark <name>`: the synopsis uses it.
        let name = format!("opmark {}", sub.get_name());
        let mut section = Vec::new();
        let man = clap_mangen::Man::new(sub.clone());
        out.extend_from_slice(format!(".SH \"{}\"\n", name.to_uppercase()).as_bytes());
        man.render_description_section(&mut section).map_err(fail)?;
        man.render_synopsis_section(&mut section).map_err(fail)?;
        man.render_options_section(&mut section).map_err(fail)?;
        // Each rendered section opens with its own `.SH`; demote them to `.SS` so they
        // sit under this subcommand's heading.
        let text = String::from_utf8_lossy(&section).replace(".SH ", ".SS ");
        out.extend_from_slice(text.as_bytes());
    }
    Ok(out)
}
