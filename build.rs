//! Assembles the host shim from its parts: every `remote-scripts/shim/*.sh`, in name
//! order, concatenated into `$OUT_DIR/shim.sh`, which `src/shim/mod.rs` embeds as
//! `SCRIPT`. The host still gets (and hashes) one script; the parts exist so that each
//! concept of it (framing, the marker root, the supervisor, a verb) is a file of its own
//! (docs/host-protocol.md#the-scripts-parts). Nothing is added between the parts: a part
//! ends with its own newline. The header (the first part: invocation, verb table, marker
//! layout) is shipped whole; the other parts without their comment lines (first
//! non-blank characters `# `, or a lone `#`): the script travels as one argument when it
//! is delivered (Linux caps one at 128 KiB) and every shell that runs it reads it, and
//! half of the parts' bytes are comments for their readers.

use std::path::{Path, PathBuf};

fn main() {
    let dir = Path::new("remote-scripts/shim");
    // The folder itself: a part added or removed changes what is assembled.
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut parts: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "sh"))
        .collect();
    // Name order is the script's order (the numbers in the names say where a part goes).
    parts.sort();
    assert!(!parts.is_empty(), "{}: no parts", dir.display());
    let mut script = String::new();
    for (n, part) in parts.iter().enumerate() {
        println!("cargo:rerun-if-changed={}", part.display());
        let text =
            std::fs::read_to_string(part).unwrap_or_else(|e| panic!("{}: {e}", part.display()));
        // A part without its last newline would glue its last line to the next part's
        // first, and the shell would read one line where the file shows two.
        assert!(
            text.ends_with('\n'),
            "{}: a part must end with a newline",
            part.display()
        );
        if n == 0 {
            script.push_str(&text);
        } else {
            for line in text.split_inclusive('\n') {
                if !is_comment_line(line) {
                    script.push_str(line);
                }
            }
        }
    }
    let out = PathBuf::from(std::env::var_os("OUT_DIR").unwrap()).join("shim.sh");
    std::fs::write(&out, script).unwrap_or_else(|e| panic!("{}: {e}", out.display()));
}

/// A line the shell reads as a comment and nothing else: `#` then a blank or the end, after
/// blanks. (`#!` and `#text` stay: a part must not start a line of a multi-line string
/// with `# `, which is said in docs/host-protocol.md.)
fn is_comment_line(line: &str) -> bool {
    let rest = line.trim_start_matches([' ', '\t']);
    rest.strip_prefix('#')
        .is_some_and(|after| after.is_empty() || after.starts_with([' ', '\t', '\n']))
}
