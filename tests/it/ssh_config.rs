//! `opmark config --json` against `ssh -G`, field by field, for every case of the corpus
//! in `tests/fixtures/ssh_config/` (layout in its README): OpenSSH is the reference for
//! how a host resolves (docs/guarantees.md#the-command-line-contract).
//!
//! Each invocation runs in its own mount namespace where a tmpfs hides the real home
//! and `/etc/ssh`, and the case's files are copied there, so both programs read the
//! same user config (`~/.ssh/config`, relative `Include`s under `~/.ssh`) and the same
//! system config (`/etc/ssh/ssh_config` and its `ssh_config.d`), and the real ones are
//! never touched.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

use crate::support::{self, text};

/// Environment variables the corpus uses in `${VAR}` expansions.
const CASE_ENV: [(&str, &str); 2] = [
    ("OPMARK_FIXTURE_KEYS", "/srv/keys"),
    ("OPMARK_FIXTURE_NAME", "fixture"),
];

fn corpus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/ssh_config")
}

/// The passwd entry of this user: ssh takes the home and name from there, not from
/// `$HOME`/`$USER`; opmark is run with the same values so the two agree.
fn passwd_self() -> (String, String) {
    let uid = opmark::lab::effective_uid().to_string();
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap();
    passwd
        .lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split(':').collect();
            (f.len() > 5 && f[2] == uid).then(|| (f[0].to_string(), f[5].to_string()))
        })
        .expect("this uid has a passwd entry")
}

/// Runs `program` (a shell command prefix) with the case's files in place, in a fresh
/// mount namespace.
fn in_case(case: &Path, home: &str, user: &str, command: &str) -> Output {
    let script = format!(
        "set -e\n\
         mount -t tmpfs opmark-home \"$HOME\"\n\
         mount -t tmpfs opmark-etc /etc/ssh\n\
         mkdir -p \"$HOME/.ssh\"\n\
         if [ -d \"$CASE/dot_ssh\" ]; then cp -R \"$CASE/dot_ssh/.\" \"$HOME/.ssh/\"; fi\n\
         cp \"$CASE/ssh_config\" \"$HOME/.ssh/config\"\n\
         if [ -d \"$CASE/system\" ]; then cp -R \"$CASE/system/.\" /etc/ssh/; fi\n\
         exec {command}\n"
    );
    let mut cmd = Command::new("unshare");
    cmd.args(["-m", "--propagation", "private", "sh", "-c", &script])
        .env_clear()
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .env("HOME", home)
        .env("USER", user)
        .env("LOGNAME", user)
        .env("SHELL", "/bin/sh")
        .env("LANG", "C")
        .env("CASE", case)
        .stdin(std::process::Stdio::null());
    for (k, v) in CASE_ENV {
        cmd.env(k, v);
    }
    cmd.output().expect("run unshare")
}

/// `ssh -G` output as key → value (last wins), plus every value of the list keys.
fn parse_g(
    out: &str,
) -> (
    std::collections::HashMap<String, String>,
    Vec<(String, String)>,
) {
    let mut map = std::collections::HashMap::new();
    let mut all = Vec::new();
    for line in out.lines() {
        if let Some((k, v)) = line.split_once(' ') {
            map.insert(k.to_string(), v.to_string());
            all.push((k.to_string(), v.to_string()));
        }
    }
    (map, all)
}

fn yes_no(b: &Value) -> &'static str {
    if b.as_bool().expect("a boolean") {
        "yes"
    } else {
        "no"
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .expect("a list")
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// Shell-quotes one word for the namespace script.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// One invocation of a case: compares, and returns a description of each difference.
fn compare(
    case: &Path,
    args: &str,
    expect_refusal: Option<&str>,
    home: &str,
    user: &str,
) -> Vec<String> {
    let name = case.file_name().unwrap().to_string_lossy().into_owned();
    let at = format!("{name}: `{args}`");
    let opmark = quote(env!("CARGO_BIN_EXE_opmark"));
    let ssh = in_case(case, home, user, &format!("ssh -G {args}"));
    let om = in_case(case, home, user, &format!("{opmark} config --json {args}"));
    let ssh_out = text(&ssh.stdout);
    let om_out = text(&om.stdout);
    if let Some(needle) = expect_refusal {
        let err = text(&om.stderr);
        let mut problems = Vec::new();
        if om.status.code() != Some(246) {
            problems.push(format!(
                "{at}: opmark should refuse with exit 246, got {:?}; stdout {om_out} stderr {err}",
                om.status.code()
            ));
        } else if !err.contains(needle) || !err.contains(':') {
            problems.push(format!(
                "{at}: the refusal should name `{needle}` and where: {err}"
            ));
        }
        return problems;
    }
    if !ssh.status.success() {
        return vec![format!("{at}: ssh -G failed: {}", text(&ssh.stderr))];
    }
    if !om.status.success() {
        return vec![format!(
            "{at}: opmark config failed (exit {:?}) where ssh -G succeeded: {}",
            om.status.code(),
            text(&om.stderr)
        )];
    }
    let j: Value =
        serde_json::from_str(&om_out).unwrap_or_else(|e| panic!("{at}: JSON: {e}: {om_out}"));
    let (g, all) = parse_g(&ssh_out);
    let mut problems = Vec::new();
    let mut check = |field: &str, ours: String, theirs: String| {
        if ours != theirs {
            problems.push(format!("{at}: {field}: opmark `{ours}`, ssh -G `{theirs}`"));
        }
    };
    let defaults = strings(&j["opmark_defaults"]);
    let gv = |k: &str| g.get(k).cloned().unwrap_or_default();
    check(
        "hostname",
        j["hostname"].as_str().unwrap().into(),
        gv("hostname"),
    );
    check("port", j["port"].to_string(), gv("port"));
    check("user", j["user"].as_str().unwrap().into(), gv("user"));
    // ssh -G prints `none` for a cleared list.
    let files = |k: &str| match gv(k).as_str() {
        "none" => String::new(),
        v => v.to_string(),
    };
    check(
        "userknownhostsfile",
        strings(&j["userknownhostsfile"]).join(" "),
        files("userknownhostsfile"),
    );
    check(
        "globalknownhostsfile",
        strings(&j["globalknownhostsfile"]).join(" "),
        files("globalknownhostsfile"),
    );
    let strict = gv("stricthostkeychecking");
    if defaults.iter().any(|d| d == "stricthostkeychecking") {
        check("stricthostkeychecking (unset)", "ask".into(), strict);
    } else {
        check(
            "stricthostkeychecking",
            j["stricthostkeychecking"].as_str().unwrap().into(),
            strict,
        );
    }
    check(
        "hostkeyalias",
        j["hostkeyalias"].as_str().unwrap_or("").into(),
        gv("hostkeyalias"),
    );
    check(
        "proxyjump",
        j["proxyjump"].as_str().unwrap_or("").into(),
        gv("proxyjump"),
    );
    check(
        "proxycommand",
        j["proxycommand"].as_str().unwrap_or("").into(),
        gv("proxycommand"),
    );
    if defaults.iter().any(|d| d == "connecttimeout") {
        check(
            "connecttimeout (unset)",
            "none".into(),
            gv("connecttimeout"),
        );
    } else {
        check(
            "connecttimeout",
            j["connecttimeout"].to_string(),
            gv("connecttimeout"),
        );
    }
    if defaults.iter().any(|d| d == "serveraliveinterval") {
        // ssh's default is none (0), or 300 under BatchMode; opmark keeps its own.
        let unset = if gv("batchmode") == "yes" { "300" } else { "0" };
        check(
            "serveraliveinterval (unset)",
            unset.into(),
            gv("serveraliveinterval"),
        );
    } else {
        check(
            "serveraliveinterval",
            j["serveraliveinterval"].to_string(),
            gv("serveraliveinterval"),
        );
    }
    check(
        "serveralivecountmax",
        j["serveralivecountmax"].to_string(),
        gv("serveralivecountmax"),
    );
    check("batchmode", yes_no(&j["batchmode"]).into(), gv("batchmode"));
    check(
        "identitiesonly",
        yes_no(&j["identitiesonly"]).into(),
        gv("identitiesonly"),
    );
    check(
        "hashknownhosts",
        yes_no(&j["hashknownhosts"]).into(),
        gv("hashknownhosts"),
    );
    check(
        "addressfamily",
        j["addressfamily"].as_str().unwrap().into(),
        gv("addressfamily"),
    );
    check(
        "connectionattempts",
        j["connectionattempts"].to_string(),
        gv("connectionattempts"),
    );
    // The algorithm lists: opmark never offers a name ssh would not (its defaults are a
    // subset of ssh's; a config's list is narrowed to what russh does, never widened).
    // mlkem768x25519-sha256 is newer than ssh 9.2.
    for key in ["kexalgorithms", "hostkeyalgorithms", "ciphers", "macs"] {
        let theirs = gv(key);
        let theirs: Vec<&str> = theirs.split(',').collect();
        let ours = j[key].as_str().unwrap_or("");
        let beyond: Vec<&str> = ours
            .split(',')
            .filter(|n| !theirs.contains(n) && *n != "mlkem768x25519-sha256")
            .collect();
        check(
            &format!("{key} (names opmark offers beyond ssh -G's list)"),
            if ours.is_empty() {
                "(empty)".to_string()
            } else {
                beyond.join(",")
            },
            String::new(),
        );
    }
    let agent = match g.get("identityagent").map(String::as_str) {
        None | Some("none") | Some("SSH_AUTH_SOCK") => String::new(),
        Some(a) => a.to_string(),
    };
    check(
        "identityagent",
        j["identityagent"].as_str().unwrap_or("").into(),
        agent,
    );

    // ssh -G prints IdentityFile and CertificateFile unexpanded (it expands them only
    // when loading keys, with the same rules as UserKnownHostsFile): let ssh expand them
    // by asking for them as UserKnownHostsFile, which a first -o wins.
    // `IdentityFile none` is a file ssh never finds (it names no key): no entry.
    let is_id = |k: &str, v: &str| k == "identityfile" && !v.eq_ignore_ascii_case("none");
    let raw: Vec<String> = all
        .iter()
        .filter(|(k, v)| is_id(k, v) || k == "certificatefile")
        .map(|(_, v)| v.clone())
        .collect();
    let n_ids = all.iter().filter(|(k, v)| is_id(k, v)).count();
    if raw.is_empty() && all.iter().any(|(k, _)| k == "identityfile") {
        // Only `IdentityFile none`: no key files at all, and not ssh's defaults.
        check(
            "identityfile (none)",
            strings(&j["identityfile"]).join(" "),
            String::new(),
        );
    }
    if !raw.is_empty() {
        let list = raw
            .iter()
            .map(|r| format!("\"{r}\""))
            .collect::<Vec<_>>()
            .join(" ");
        let expand = in_case(
            case,
            home,
            user,
            &format!(
                "ssh -G -o {} {args}",
                quote(&format!("UserKnownHostsFile {list}"))
            ),
        );
        let (eg, _) = parse_g(&text(&expand.stdout));
        let expanded: Vec<String> = eg
            .get("userknownhostsfile")
            .map(|s| s.split(' ').map(str::to_string).collect())
            .unwrap_or_default();
        let (ids, certs) = expanded.split_at(n_ids.min(expanded.len()));
        let mut seen = std::collections::HashSet::new();
        let ids: Vec<String> = ids
            .iter()
            .filter(|p| seen.insert((*p).clone()))
            .cloned()
            .collect();
        check(
            "identityfile",
            strings(&j["identityfile"]).join(" "),
            ids.join(" "),
        );
        check(
            "certificatefile",
            strings(&j["certificatefile"]).join(" "),
            certs.join(" "),
        );
    }
    problems
}

/// One line of a case's `hosts`: the arguments, and the refusal expected, if any.
type Invocation = (String, Option<String>);

/// Every case directory with its invocations (`hosts`: one argument line each;
/// `ARGS => refused: NEEDLE` when opmark must refuse with exit 246).
fn corpus() -> Vec<(PathBuf, Vec<Invocation>)> {
    let mut cases: Vec<PathBuf> = std::fs::read_dir(corpus_dir())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.join("ssh_config").is_file())
        .collect();
    cases.sort();
    cases
        .into_iter()
        .map(|case| {
            let hosts = std::fs::read_to_string(case.join("hosts"))
                .unwrap_or_else(|e| panic!("{}: hosts: {e}", case.display()));
            let lines = hosts
                .lines()
                .map(str::trim)
                .filter(|l| !l.is_empty() && !l.starts_with('#'))
                .map(|l| match l.split_once("=> refused:") {
                    Some((args, needle)) => {
                        (args.trim().to_string(), Some(needle.trim().to_string()))
                    }
                    None => (l.to_string(), None),
                })
                .collect();
            (case, lines)
        })
        .collect()
}

#[test]
fn corpus_has_at_least_sixty_configs_covering_each_feature() {
    let cases = corpus();
    assert!(cases.len() >= 60, "only {} cases", cases.len());
    let all: String = cases
        .iter()
        .map(|(c, _)| std::fs::read_to_string(c.join("ssh_config")).unwrap())
        .collect();
    for feature in [
        "Match host",
        "Match originalhost",
        "Match user",
        "Match localuser",
        "Match exec",
        "Match all",
        "Include",
        "${",
        "%h",
        "!",
        "*",
        "HostKeyAlias",
        "ProxyJump",
        "IdentityFile none",
        "Match host=",
        "HostKeyAlgorithms",
        "KexAlgorithms",
        "Ciphers",
        "MACs",
        "PubkeyAcceptedAlgorithms",
        "PreferredAuthentications",
        "ProxyJump admin@%h",
        "Port ssh",
    ] {
        assert!(all.contains(feature), "no case uses `{feature}`");
    }
    assert!(
        cases.iter().any(|(c, _)| c.join("system").is_dir()),
        "no system config case"
    );
}

#[test]
fn opmark_resolves_every_corpus_case_like_ssh_g() {
    if !support::require_tools(crate::test_name!(), &["ssh", "unshare"])
        || !(opmark::lab::effective_uid() == 0
            || support::skip_or_fail(crate::test_name!(), "needs root (mount namespaces)"))
    {
        return;
    }
    let (user, home) = passwd_self();
    let mut problems = Vec::new();
    let mut compared = 0;
    for (case, lines) in corpus() {
        for (args, refusal) in lines {
            problems.extend(compare(&case, &args, refusal.as_deref(), &home, &user));
            compared += 1;
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {compared} invocations differ from ssh -G:\n{}",
        problems.len(),
        problems.join("\n")
    );
}

#[test]
fn system_config_override_is_read_after_the_user_config() {
    let dir = support::fresh_dir(crate::test_name!());
    std::fs::create_dir_all(dir.join("etc/ssh_config.d")).unwrap();
    std::fs::write(
        dir.join("etc/ssh_config"),
        "Include ssh_config.d/*.conf\nHost *\n User fromsystem\n Port 2\n",
    )
    .unwrap();
    std::fs::write(
        dir.join("etc/ssh_config.d/50-alias.conf"),
        "Host sysalias\n HostName 10.9.9.9\n",
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    std::fs::create_dir_all(env.home.join(".ssh")).unwrap();
    std::fs::write(env.home.join(".ssh/config"), "Host sysalias\n Port 2201\n").unwrap();
    let out = env
        .opmark()
        .env("OPMARK_SYSTEM_SSH_CONFIG", dir.join("etc/ssh_config"))
        .args(["config", "--json", "sysalias"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&j["hostname"], &j["port"], &j["user"]),
        (
            &Value::from("10.9.9.9"),
            &Value::from(2201),
            &Value::from("fromsystem")
        )
    );
    // With -F, no system config (as ssh).
    let cfg = dir.join("only");
    std::fs::write(&cfg, "Host sysalias\n Port 3\n").unwrap();
    let out = env
        .opmark()
        .env("OPMARK_SYSTEM_SSH_CONFIG", dir.join("etc/ssh_config"))
        .arg("-F")
        .arg(&cfg)
        .args(["config", "--json", "sysalias"])
        .output()
        .unwrap();
    let j: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(
        (&j["hostname"], &j["port"]),
        (&Value::from("sysalias"), &Value::from(3))
    );
}

#[test]
fn unsupported_match_and_options_exit_246_naming_file_and_line() {
    let dir = support::fresh_dir(crate::test_name!());
    let env = support::Sealed::new(crate::test_name!());
    for (text_cfg, needle, line) in [
        ("Host a\n Port 1\nMatch final\n User x\n", "Match final", 3),
        ("Host a\n BindAddress 10.0.0.1\n", "bindaddress", 2),
        ("Host a\n RemoteCommand ls\n", "remotecommand", 2),
        ("\n\nHost a\n Tunnel yes\n", "tunnel", 4),
    ] {
        let cfg = dir.join("cfg");
        std::fs::write(&cfg, text_cfg).unwrap();
        for sub in [&["config", "a"][..], &["run", "a", "--", "true"][..]] {
            let out = env.opmark().arg("-F").arg(&cfg).args(sub).output().unwrap();
            let err = text(&out.stderr);
            assert_eq!(out.status.code(), Some(246), "{sub:?} {text_cfg}: {err}");
            let place = format!("{}:{line}", cfg.display());
            assert!(err.contains(needle) && err.contains(&place), "{err}");
        }
    }
    // Nothing was recorded for the refused runs.
    let out = env.opmark().args(["list", "--json"]).output().unwrap();
    assert!(
        !text(&out.stdout).contains("\"a\""),
        "{}",
        text(&out.stdout)
    );
}

/// `opmark --json run ...` in `env`; the JSON verdict and the elapsed time.
fn timed_run_json(cmd: &mut Command) -> (Value, std::time::Duration) {
    let started = std::time::Instant::now();
    let out = cmd.output().unwrap();
    let elapsed = started.elapsed();
    let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON document ({e}): {}\nstderr: {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    });
    (json, elapsed)
}

/// The lines that reach lab `target` with its key and known_hosts.
fn target_lines(lab: &support::Lab, target: &support::Target) -> String {
    format!(
        "  HostName {}\n  Port {}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n",
        target.addr,
        target.port,
        target.user,
        lab.client_key().display(),
        lab.known_hosts().display()
    )
}

#[test]
fn match_originalhost_block_is_applied_when_running_on_a_real_target() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = &lab.targets()[0];
    let dir = support::fresh_dir(crate::test_name!());
    let cfg = dir.join("cfg");
    // Before this change Match was ignored: `m2` went to port 22 of a host named m2.
    std::fs::write(
        &cfg,
        format!("Match originalhost m2\n{}", target_lines(&lab, t)),
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    let (j, _) = timed_run_json(env.opmark().arg("-F").arg(&cfg).args([
        "--json",
        "run",
        "m2",
        "--op",
        "match-1",
        "--",
        "echo via-match",
    ]));
    assert_eq!(
        (&j["verdict"], &j["stdout"]),
        (&Value::from("completed"), &Value::from("via-match\n")),
        "{j}"
    );
}

#[test]
fn ssh_uri_and_o_options_reach_a_real_target_without_a_config_entry() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = &lab.targets()[0];
    let env = support::Sealed::new(crate::test_name!());
    let uri = format!("ssh://{}@{}:{}", t.user, t.addr, t.port);
    let (j, _) = timed_run_json(
        env.opmark()
            .args(["-F", "none", "--json", "run"])
            .arg(&uri)
            .arg("-o")
            .arg(format!("IdentityFile={}", lab.client_key().display()))
            .arg("-o")
            .arg(format!(
                "UserKnownHostsFile {}",
                lab.known_hosts().display()
            ))
            .args([
                "-o",
                "IdentitiesOnly=yes",
                "--op",
                "uri-1",
                "--",
                "echo via-uri",
            ]),
    );
    assert_eq!(
        (&j["verdict"], &j["stdout"]),
        (&Value::from("completed"), &Value::from("via-uri\n")),
        "{j}"
    );
    // The ledger names the host as user@host:port, which reconnects the same way.
    assert_eq!(
        j["host"],
        Value::from(format!("{}@{}:{}", t.user, t.addr, t.port)),
        "{j}"
    );
}

#[test]
fn host_key_alias_is_looked_up_as_the_bare_alias_on_a_real_target() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = &lab.targets()[0];
    let dir = support::fresh_dir(crate::test_name!());
    // known_hosts holds the keys under the alias only (OpenSSH never writes
    // `[alias]:port` for a HostKeyAlias).
    let kh = dir.join("known_hosts");
    let keys: String = t
        .host_public_keys()
        .unwrap()
        .iter()
        .map(|k| format!("shared-alias {k}\n"))
        .collect();
    std::fs::write(&kh, keys).unwrap();
    let cfg = dir.join("cfg");
    std::fs::write(
        &cfg,
        format!(
            "Host t\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
             UserKnownHostsFile {}\n  HostKeyAlias Shared-Alias\n",
            t.addr,
            t.port,
            t.user,
            lab.client_key().display(),
            kh.display()
        ),
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    let (j, _) = timed_run_json(env.opmark().arg("-F").arg(&cfg).args([
        "--json",
        "run",
        "t",
        "--op",
        "alias-1",
        "--",
        "echo via-alias",
    ]));
    assert_eq!(
        (&j["verdict"], &j["stdout"]),
        (&Value::from("completed"), &Value::from("via-alias\n")),
        "{j}"
    );
}

#[test]
fn alias_from_the_system_config_reaches_a_real_target() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = &lab.targets()[0];
    let dir = support::fresh_dir(crate::test_name!());
    std::fs::create_dir_all(dir.join("ssh_config.d")).unwrap();
    std::fs::write(dir.join("ssh_config"), "Include ssh_config.d/*.conf\n").unwrap();
    std::fs::write(
        dir.join("ssh_config.d/10-lab.conf"),
        format!("Host sysalias\n{}", target_lines(&lab, t)),
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    let (j, _) = timed_run_json(
        env.opmark()
            .env("OPMARK_SYSTEM_SSH_CONFIG", dir.join("ssh_config"))
            .args([
                "--json",
                "run",
                "sysalias",
                "--op",
                "sys-1",
                "--",
                "echo via-system",
            ]),
    );
    assert_eq!(
        (&j["verdict"], &j["stdout"]),
        (&Value::from("completed"), &Value::from("via-system\n")),
        "{j}"
    );
}

#[test]
fn connect_timeout_bounds_a_silent_server_in_one_attempt() {
    // A server that accepts and never sends its banner.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let held = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = held.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            keep.lock().unwrap().push(conn);
        }
    });
    let dir = support::fresh_dir(crate::test_name!());
    let cfg = dir.join("cfg");
    std::fs::write(
        &cfg,
        format!("Host silent\n  HostName 127.0.0.1\n  Port {port}\n  ConnectTimeout 1\n  UserKnownHostsFile /dev/null\n"),
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    let (j, elapsed) = timed_run_json(env.opmark().arg("-F").arg(&cfg).args([
        "--json",
        "run",
        "silent",
        "--op",
        "slow-1",
        "--attempts",
        "3",
        "--",
        "true",
    ]));
    assert_eq!(j["verdict"], Value::from("not_applied"), "{j}");
    assert_eq!(j["retryable"], Value::from(true), "{j}");
    // One attempt bounded by ConnectTimeout, as ssh; it was three (one per attempt).
    assert_eq!(j["attempts"].as_array().map(Vec::len), Some(1), "{j}");
    assert!(
        elapsed < std::time::Duration::from_secs(3),
        "took {elapsed:?}: {j}"
    );
}

#[test]
fn config_prints_ssh_g_style_lines_and_marks_opmark_defaults() {
    let dir = support::fresh_dir(crate::test_name!());
    let cfg = dir.join("cfg");
    std::fs::write(
        &cfg,
        "Host web\n  HostName Web.Example\n  Port 2201\n  User deploy\n",
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    let out = env
        .opmark()
        .arg("-F")
        .arg(&cfg)
        .args(["config", "web", "-o", "BatchMode=yes"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines = text(&out.stdout);
    for want in [
        "hostname web.example\n",
        "port 2201\n",
        "user deploy\n",
        "batchmode yes\n",
        "connecttimeout 10\n",
        "# connecttimeout: opmark's default (the config does not set it)\n",
    ] {
        assert!(lines.contains(want), "no `{want}` in:\n{lines}");
    }
}

#[test]
fn first_value_wins_between_flags_and_o_and_match_key_value_on_a_real_target() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = &lab.targets()[0];
    let dir = support::fresh_dir(crate::test_name!());
    let cfg = dir.join("cfg");
    // `Match originalhost=kv` (the `=` form was refused as an unknown criterion).
    std::fs::write(
        &cfg,
        format!(
            "Match originalhost=kv\n  HostName {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n",
            t.addr,
            lab.client_key().display(),
            lab.known_hosts().display()
        ),
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    // `-o User=` and `-o Port=` come first, so they win over `-l` and `-p`, as in ssh;
    // `-l`/`-p` used to win and sent the run to a user and port that do not exist.
    let port = t.port.to_string();
    let (j, _) = timed_run_json(env.opmark().arg("-F").arg(&cfg).args([
        "--json",
        "run",
        "kv",
        "-o",
        &format!("User={}", t.user),
        "-o",
        &format!("Port={port}"),
        "-l",
        "nobody-here",
        "-p",
        "1",
        "--op",
        "first-wins-1",
        "--",
        "echo first-wins",
    ]));
    assert_eq!(
        (&j["verdict"], &j["stdout"]),
        (&Value::from("completed"), &Value::from("first-wins\n")),
        "{j}"
    );
    // The ledger does not name the host by the `-p` that lost.
    assert_eq!(j["host"], Value::from("kv"), "{j}");
}
