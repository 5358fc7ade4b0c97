//! The command runs as `ssh HOST CMD` would run it (docs/host-protocol.md#the-commands-environment): by the login shell with
//! `-c`, in the login directory, with the login's umask, locale and environment, while
//! the shim's own records keep their strict modes. Each test gives one real sshd target
//! a login shell (bash, dash, zsh) and a login environment (sshd's `SetEnv`, the shell's
//! own startup file), runs the same commands through the OpenSSH client and through
//! `opmark run`, and compares what they print.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use opmark::lab::Lab;
use serde_json::Value;

use crate::support::{self, text, tool_path, Sealed};

/// What a command printed and how it ended.
#[derive(Debug, PartialEq, Eq)]
struct Seen {
    stdout: String,
    stderr: String,
    code: Option<i64>,
}

/// `ssh -F <lab> target1 CMD`: the reference.
fn over_ssh(lab: &Lab, cmd: &str) -> Seen {
    let out = support::ssh(lab)
        .args(["-o", "ConnectTimeout=5", "target1", cmd])
        .output()
        .unwrap();
    Seen {
        stdout: text(&out.stdout),
        stderr: text(&out.stderr),
        code: out.status.code().map(i64::from),
    }
}

/// `opmark --json run target1 --op OP -- CMD`, which must complete.
fn over_opmark(env: &Sealed, lab: &Lab, op: &str, cmd: &str) -> Seen {
    let out = env
        .opmark_with_lab(lab)
        .args(["--json", "run", "target1", "--op", op, "--", cmd])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not one JSON document ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    assert_eq!(doc["verdict"], "completed", "{doc}");
    Seen {
        stdout: doc["stdout"].as_str().unwrap().to_owned(),
        stderr: doc["stderr"].as_str().unwrap().to_owned(),
        code: doc["exit_code"].as_i64(),
    }
}

/// Adds `KEY=VALUE` words to the target's `SetEnv` line (the session's environment, as
/// a real host's sshd_config or `AcceptEnv` gives it); takes effect at the next start of
/// its sshd ([`Lab::set_login`] restarts it).
fn add_session_env(lab: &Lab, words: &str) {
    let path = lab.targets()[0].sshd_config();
    let config = std::fs::read_to_string(&path).unwrap();
    assert!(config.contains("\nSetEnv "), "{config}");
    let config: String = config
        .lines()
        .map(|l| {
            if l.starts_with("SetEnv ") {
                format!("{l} {words}\n")
            } else {
                format!("{l}\n")
            }
        })
        .collect();
    std::fs::write(&path, config).unwrap();
}

/// A one-target loopback lab whose login shell is `shell` (root only: the target gets a
/// private /etc/passwd).
fn lab_with_login(name: &str) -> Option<Lab> {
    if !support::require_root(name) {
        return None;
    }
    support::loopback_lab_named(name, 1)
}

/// What every side-by-side test prints: umask, $0 and $SHELL, the locale, the working
/// directory, the modes of a file and a directory the command creates, the OPMARK_*
/// variables it sees (those the session itself has, nothing of the shim's).
const PROBE: &str = r#"echo "umask=$(umask)"
echo "0=$0 SHELL=$SHELL"
echo "LC_ALL=${LC_ALL-unset} LANG=${LANG-unset}"
locale
echo "pwd=$(pwd)"
rm -rf "$HOME/made.f" "$HOME/made.d"
touch "$HOME/made.f" && mkdir "$HOME/made.d"
echo "modes=$(stat -c %a "$HOME/made.f" "$HOME/made.d" | tr '\n' ' ')"
rm -rf "$HOME/made.f" "$HOME/made.d"
env | grep '^OPMARK_' | sort
echo "SHLVL=${SHLVL-unset}"
echo end"#;

/// Runs [`PROBE`] (and `extra`, each command on its own) over ssh and through opmark on
/// a target whose login shell is `shell`; asserts equal outputs and returns ssh's probe
/// output.
fn side_by_side(lab: &Lab, shell: &str, extra: &[&str]) -> String {
    let env = Sealed::new(&format!("login-{shell}"));
    let by_ssh = over_ssh(lab, PROBE);
    let by_opmark = over_opmark(&env, lab, &format!("{shell}-probe"), PROBE);
    assert_eq!(
        by_opmark, by_ssh,
        "{shell}: opmark (left) and ssh (right) differ"
    );
    assert!(by_ssh.stdout.ends_with("end\n"), "{by_ssh:?}");
    for (n, cmd) in extra.iter().enumerate() {
        let by_ssh = over_ssh(lab, cmd);
        let by_opmark = over_opmark(&env, lab, &format!("{shell}-extra-{n}"), cmd);
        assert_eq!(
            by_opmark, by_ssh,
            "{shell}: `{cmd}`: opmark (left) and ssh (right) differ"
        );
    }
    by_ssh.stdout
}

/// The line of `out` that starts with `key`.
fn line<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} line in {out}"))
}

#[test]
fn a_bash_login_runs_commands_as_ssh_does() {
    crate::require_tool!("bash");
    let Some(lab) = lab_with_login(crate::test_name!()) else {
        return;
    };
    // The login's own startup file sets its umask (bash reads ~/.bashrc when sshd
    // starts it), the session's environment its locale.
    std::fs::write(lab.targets()[0].home.join(".bashrc"), "umask 027\n").unwrap();
    add_session_env(&lab, "LC_ALL=C.UTF-8");
    lab.set_login("target1", &tool_path("bash"), None).unwrap();
    let out = side_by_side(
        &lab,
        "bash",
        &[
            "[[ 1 == 1 ]] && echo ok",
            "echo \"${RANDOM:+random is set}\"",
            "shopt -q extglob; echo \"$? $BASH_VERSINFO\"",
        ],
    );
    assert_eq!(line(&out, "umask="), "umask=0027", "{out}");
    let want = format!("0=bash SHELL={}", tool_path("bash").display());
    assert_eq!(line(&out, "0="), want, "{out}");
    assert_eq!(line(&out, "LC_ALL="), "LC_ALL=C.UTF-8 LANG=unset", "{out}");
    assert_eq!(line(&out, "modes="), "modes=640 750 ", "{out}");
    assert_eq!(over_ssh(&lab, "[[ 1 == 1 ]] && echo ok").stdout, "ok\n");
    assert_eq!(
        over_ssh(&lab, "echo \"${RANDOM:+random is set}\"").stdout,
        "random is set\n"
    );
}

#[test]
fn a_dash_login_runs_commands_as_ssh_does() {
    crate::require_tool!("dash");
    let Some(lab) = lab_with_login(crate::test_name!()) else {
        return;
    };
    // No startup file for a non-interactive dash: sshd's umask; LANG from the session,
    // LC_ALL unset (the shim's own LC_ALL=C must not show).
    add_session_env(&lab, "LANG=C.UTF-8");
    lab.set_login("target1", &tool_path("dash"), None).unwrap();
    let out = side_by_side(&lab, "dash", &["echo \"$0 $#\"; exit 7"]);
    // The point of the comparison: not the shim's own 077 (sshd's here comes from the
    // test process, 022 unless the machine says otherwise).
    assert_ne!(line(&out, "umask="), "umask=0077", "{out}");
    let want = format!("0=dash SHELL={}", tool_path("dash").display());
    assert_eq!(line(&out, "0="), want, "{out}");
    assert_eq!(line(&out, "LC_ALL="), "LC_ALL=unset LANG=C.UTF-8", "{out}");
}

#[test]
fn a_zsh_login_runs_commands_as_ssh_does() {
    crate::require_tool!("zsh");
    let Some(lab) = lab_with_login(crate::test_name!()) else {
        return;
    };
    // zsh reads ~/.zshenv for every shell, -c included.
    std::fs::write(lab.targets()[0].home.join(".zshenv"), "umask 027\n").unwrap();
    add_session_env(&lab, "LC_ALL=C.UTF-8");
    lab.set_login("target1", &tool_path("zsh"), None).unwrap();
    let out = side_by_side(
        &lab,
        "zsh",
        &[
            "[[ 1 == 1 ]] && echo ok",
            "print -r -- ${ZSH_VERSION:+zsh} ${(U):-upper}",
        ],
    );
    assert_eq!(line(&out, "umask="), "umask=027", "{out}");
    let want = format!("0=zsh SHELL={}", tool_path("zsh").display());
    assert_eq!(line(&out, "0="), want, "{out}");
    assert_eq!(line(&out, "modes="), "modes=640 750 ", "{out}");
    assert_eq!(over_ssh(&lab, "[[ 1 == 1 ]] && echo ok").stdout, "ok\n");
}

/// Every directory and file under `root`, with its mode.
fn modes_under(root: &Path) -> Vec<(PathBuf, u32)> {
    let mut out = Vec::new();
    let mut todo = vec![root.to_owned()];
    while let Some(p) = todo.pop() {
        let meta = std::fs::symlink_metadata(&p).unwrap();
        out.push((p.clone(), meta.permissions().mode() & 0o7777));
        if meta.is_dir() {
            for e in std::fs::read_dir(&p).unwrap().flatten() {
                todo.push(e.path());
            }
        }
    }
    out
}

#[test]
fn an_open_login_umask_reaches_the_command_but_not_the_shims_records() {
    crate::require_tool!("bash");
    let Some(lab) = lab_with_login(crate::test_name!()) else {
        return;
    };
    std::fs::write(lab.targets()[0].home.join(".bashrc"), "umask 000\n").unwrap();
    lab.set_login("target1", &tool_path("bash"), None).unwrap();
    let env = Sealed::new("open-umask");
    let made = lab.targets()[0].home.join("made-by-command");
    let cmd = format!("umask; touch {0}; stat -c %a {0}", made.display());
    let by_opmark = over_opmark(&env, &lab, "open-umask", &cmd);
    assert_eq!(by_opmark.stdout, "0000\n666\n", "{by_opmark:?}");
    std::fs::remove_file(&made).unwrap();
    assert_eq!(over_ssh(&lab, &cmd), by_opmark);
    // The marker root as the shim left it: directories 0700, files 0600 (FIFOs too).
    let root = lab.targets()[0].marker_root();
    let all = modes_under(&root);
    assert!(
        all.iter().any(|(p, _)| p.ends_with("ops/open-umask/exit")),
        "{all:?}"
    );
    for (path, mode) in all {
        let want = if path.is_dir() { 0o700 } else { 0o600 };
        assert_eq!(mode, want, "{} is {mode:o}", path.display());
    }
}

#[test]
fn a_session_whose_shell_variable_is_unusable_still_gets_the_passwd_login_shell() {
    crate::require_tool!("dash");
    let Some(lab) = lab_with_login(crate::test_name!()) else {
        return;
    };
    // sshd's SetEnv comes after its own SHELL: the variable names no shell, while sshd
    // still runs the passwd one (dash). opmark falls back to passwd too, not to sh.
    add_session_env(&lab, "SHELL=/no/such/shell");
    lab.set_login("target1", &tool_path("dash"), None).unwrap();
    let env = Sealed::new("unusable-shell");
    let cmd = "echo \"$0 $SHELL\"";
    let by_ssh = over_ssh(&lab, cmd);
    assert_eq!(by_ssh.stdout, "dash /no/such/shell\n", "{by_ssh:?}");
    assert_eq!(over_opmark(&env, &lab, "unusable-shell", cmd), by_ssh);
}

#[test]
fn bash_syntax_still_classifies_as_its_commands() {
    let env = Sealed::new("classify-bash");
    for (cmd, family) in [
        ("[[ 1 == 1 ]] && echo ok", "read-only"),
        ("[[ -f /etc/x ]] && rm -rf /tmp/y", "destructive"),
    ] {
        let out = env.opmark().args(["classify", "--", cmd]).output().unwrap();
        assert_eq!(out.status.code(), Some(0), "{cmd}: {}", text(&out.stderr));
        let first = text(&out.stdout);
        assert!(
            first.starts_with(&format!("{family}: {cmd}\n")),
            "{cmd}: {first}"
        );
    }
}
