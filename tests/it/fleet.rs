//! `opmark run` on several hosts at once (docs/decisions.md#fleets) against real sshd targets:
//! one operation per host, forks, failure budget, rolling batches, prefixed output, the
//! combined JSON document and exit status, and `--detach`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use opmark::lab::Lab;
use serde_json::Value;

use crate::support::{self, fast_loss_config, fresh_dir, spawn, text, wait_for, Sealed};

/// A fleet run's document and the process status.
struct Fleet {
    json: Value,
    status: i32,
    stderr: String,
}

impl Fleet {
    fn of(out: Output) -> Fleet {
        let json = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "not one JSON document ({e}): stdout {} stderr {}",
                text(&out.stdout),
                text(&out.stderr)
            )
        });
        Fleet {
            json,
            status: out.status.code().unwrap_or(-1),
            stderr: text(&out.stderr),
        }
    }

    /// Each host's run document by host name, and by its lab short name too (`target1`
    /// for `<lab id>-target1`), so a test can name a target of its one lab briefly.
    fn hosts(&self) -> BTreeMap<String, Value> {
        let mut by_name = BTreeMap::new();
        for h in self.json["hosts"]
            .as_array()
            .unwrap_or_else(|| panic!("no hosts array: {self:?}"))
        {
            let name = h["host"].as_str().unwrap();
            by_name.insert(short(name).to_owned(), h.clone());
            by_name.insert(name.to_owned(), h.clone());
        }
        by_name
    }

    fn verdict(&self, host: &str) -> String {
        self.hosts()[host]["verdict"].as_str().unwrap().to_owned()
    }
}

impl std::fmt::Debug for Fleet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "status {} json {} stderr {}",
            self.status, self.json, self.stderr
        )
    }
}

/// `target1` of a lab alias `<lab id>-target1`.
fn short(host: &str) -> &str {
    match host.split_once('-') {
        Some((_, rest)) if rest.starts_with("target") => rest,
        _ => host,
    }
}

/// The lab's aliases (unique per lab: `<lab id>-target1`...).
fn aliases(lab: &Lab) -> Vec<String> {
    lab.targets().iter().map(|t| t.alias.clone()).collect()
}

/// `opmark --json run HOSTS... ARGS...` in `env`, to its end.
fn run_fleet(env: &Sealed, lab: &Lab, hosts: &[String], args: &[&str]) -> Fleet {
    Fleet::of(
        env.opmark_with_lab(lab)
            .args(["--json", "run"])
            .args(hosts)
            .args(args)
            .output()
            .unwrap(),
    )
}

/// A file in a target's own HOME (commands see it as `$HOME/<name>`).
fn in_home(lab: &Lab, alias: &str, name: &str) -> PathBuf {
    lab.target(alias).unwrap().home.join(name)
}

fn lines_in(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path).map_or(0, |t| t.lines().count())
}

#[test]
fn every_host_runs_once_and_a_rerun_replays_on_all() {
    let Some(lab) = support::loopback_lab(8) else {
        return;
    };
    let env = Sealed::new("fleet-once");
    let hosts = aliases(&lab);
    let cmd = [
        "--op",
        "deploy-1",
        "--",
        "echo ran >> \"$HOME/effect\"; echo done",
    ];
    let first = run_fleet(&env, &lab, &hosts, &cmd);
    assert_eq!(first.status, 0, "{first:?}");
    assert_eq!(first.json["schema"], "opmark/2");
    let listed: Vec<&str> = first.json["hosts"]
        .as_array()
        .unwrap()
        .iter()
        .map(|h| h["host"].as_str().unwrap())
        .collect();
    assert_eq!(listed, hosts, "one entry per host, in the order given");
    for (host, doc) in first.hosts() {
        assert_eq!(doc["verdict"], "completed", "{host}: {doc}");
        assert_eq!(doc["exit_code"], 0, "{host}: {doc}");
        assert_eq!(doc["op_id"], "deploy-1");
        assert_eq!(doc["stdout"], "done\n", "{host}: {doc}");
    }
    assert_eq!(first.json["summary"]["host_count"], 8);
    assert_eq!(first.json["summary"]["ok"], 8);

    let again = run_fleet(&env, &lab, &hosts, &cmd);
    assert_eq!(again.status, 0, "{again:?}");
    for (host, doc) in again.hosts() {
        assert_eq!(doc["verdict"], "replayed", "{host}: {doc}");
        assert_eq!(doc["stdout"], "done\n", "{host}: {doc}");
    }
    for host in &hosts {
        assert_eq!(
            lines_in(&in_home(&lab, host, "effect")),
            1,
            "{host} ran exactly once"
        );
    }

    // `show` without --host: every host of the op, grouped.
    let shown = env.opmark().args(["show", "deploy-1"]).output().unwrap();
    assert!(shown.status.success(), "{}", text(&shown.stderr));
    let shown = text(&shown.stdout);
    for host in &hosts {
        assert!(
            shown.contains(&format!("operation deploy-1 on {host}\n")),
            "{host} missing: {shown}"
        );
    }
    let doc: Value = serde_json::from_slice(
        &env.opmark()
            .args(["--json", "show", "deploy-1"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap();
    assert_eq!(doc["hosts"].as_array().unwrap().len(), 8, "{doc}");
}

#[test]
fn output_lines_of_concurrent_hosts_are_prefixed_and_never_mixed() {
    let Some(lab) = support::loopback_lab(8) else {
        return;
    };
    let env = Sealed::new("fleet-lines");
    let hosts = aliases(&lab);
    // Many lines at once from every host, on both streams, and a last line with no
    // newline, which must still come out whole.
    let cmd = "i=0; while [ $i -lt 300 ]; do echo \"line-$i-abcdefghijklmnopqrstuvwxyz0123456789\"; echo \"err-$i\" >&2; i=$((i+1)); done; printf tail";
    let out = env
        .opmark_with_lab(&lab)
        .arg("run")
        .args(&hosts)
        .args(["--op", "lines-1", "--", cmd])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    for host in &hosts {
        let mine: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.strip_prefix(&format!("{host}: ")))
            .collect();
        let mut expected: Vec<String> = (0..300)
            .map(|i| format!("line-{i}-abcdefghijklmnopqrstuvwxyz0123456789"))
            .collect();
        expected.push("tail".to_owned());
        assert_eq!(mine, expected, "{host}: every line whole, in order, once");
        let errs = stderr
            .lines()
            .filter(|l| l.starts_with(&format!("{host}: err-")))
            .count();
        assert_eq!(errs, 300, "{host}: stderr lines prefixed and whole");
    }
    assert_eq!(
        stdout.lines().count(),
        hosts.len() * 301,
        "no line outside a host's: {stdout}"
    );
    for host in &hosts {
        assert!(
            stderr.contains(&format!("opmark: {host}: completed, exit 0")),
            "a summary line per host: {stderr}"
        );
    }

    // --no-prefix: the command's own lines as they are.
    let plain = env
        .opmark_with_lab(&lab)
        .arg("run")
        .args(&hosts[..2])
        .args(["--no-prefix", "--op", "lines-2", "--", "echo same"])
        .output()
        .unwrap();
    assert_eq!(text(&plain.stdout), "same\nsame\n");
}

#[test]
fn a_host_with_a_changed_key_is_not_applied_and_not_retryable_while_the_others_complete() {
    let Some(lab) = support::loopback_lab(8) else {
        return;
    };
    let env = Sealed::new("fleet-key");
    let hosts = aliases(&lab);
    lab.rotate_host_keys("target3").unwrap();
    let a = run_fleet(
        &env,
        &lab,
        &hosts,
        &["--op", "key-1", "--", "echo ran >> \"$HOME/effect\""],
    );
    let docs = a.hosts();
    let changed = &docs["target3"];
    assert_eq!(changed["verdict"], "not_applied", "{a:?}");
    assert_eq!(changed["reason_code"], "host_key_rejected", "{a:?}");
    assert_eq!(changed["retryable"], false, "{a:?}");
    assert_eq!(lines_in(&in_home(&lab, "target3", "effect")), 0);
    for host in hosts.iter().filter(|h| short(h) != "target3") {
        assert_eq!(docs[host]["verdict"], "completed", "{host}: {a:?}");
        assert_eq!(lines_in(&in_home(&lab, host, "effect")), 1, "{host}");
    }
    assert_eq!(a.status, 241, "the worst verdict's code: {a:?}");
    assert_eq!(a.json["summary"]["failed"], 1);
}

#[test]
fn max_failures_stops_new_dispatches_and_reports_the_rest_as_not_dispatched() {
    let Some(lab) = support::loopback_lab(8) else {
        return;
    };
    let env = Sealed::new("fleet-budget");
    let hosts = aliases(&lab);
    std::fs::write(in_home(&lab, "target2", "fail"), "").unwrap();
    let cmd = "echo ran >> \"$HOME/effect\"; if [ -e \"$HOME/fail\" ]; then exit 3; fi";
    let a = run_fleet(
        &env,
        &lab,
        &hosts,
        &[
            "--forks",
            "1",
            "--max-failures",
            "1",
            "--op",
            "budget-1",
            "--",
            cmd,
        ],
    );
    let docs = a.hosts();
    assert_eq!(docs["target1"]["verdict"], "completed", "{a:?}");
    assert_eq!(docs["target2"]["verdict"], "completed", "{a:?}");
    assert_eq!(docs["target2"]["exit_code"], 3, "{a:?}");
    for host in &hosts[2..] {
        let doc = &docs[host];
        assert_eq!(doc["verdict"], "not_applied", "{host}: {a:?}");
        assert_eq!(doc["reason_code"], "not_dispatched_max_failures", "{a:?}");
        assert_eq!(doc["retryable"], true, "{a:?}");
        assert_eq!(doc["attempts"].as_array().unwrap().len(), 0, "{a:?}");
        assert_eq!(lines_in(&in_home(&lab, host, "effect")), 0, "{host} ran");
    }
    assert_eq!(a.json["summary"]["not_dispatched"], 6, "{a:?}");
    assert_eq!(a.status, 241, "{a:?}");

    // Retryable means it: the same op id later runs the rest, and only the rest.
    std::fs::remove_file(in_home(&lab, "target2", "fail")).unwrap();
    let rest = run_fleet(&env, &lab, &hosts, &["--op", "budget-1", "--", cmd]);
    assert_eq!(rest.verdict("target1"), "replayed", "{rest:?}");
    assert_eq!(rest.verdict("target2"), "replayed", "{rest:?}");
    assert_eq!(
        rest.status, 1,
        "a replayed exit 3 among clean hosts: {rest:?}"
    );
    for host in &hosts {
        assert_eq!(lines_in(&in_home(&lab, host, "effect")), 1, "{host}");
    }
}

#[test]
fn serial_batches_start_only_after_the_previous_batch_completed_cleanly() {
    let Some(lab) = support::loopback_lab(8) else {
        return;
    };
    let env = Sealed::new("fleet-serial");
    let hosts = aliases(&lab);
    // The pause is the workload (a batch must take time for order to mean anything),
    // not a synchronisation: the assertions read recorded times.
    let cmd = "date +%s%N > \"$HOME/start\"; sleep 0.3; date +%s%N > \"$HOME/end\"; if [ -e \"$HOME/fail\" ]; then exit 2; fi";
    let six = &hosts[..6];
    let a = run_fleet(
        &env,
        &lab,
        six,
        &["--serial", "2", "--op", "roll-1", "--", cmd],
    );
    assert_eq!(a.status, 0, "{a:?}");
    let time = |host: &str, name: &str| -> u128 {
        std::fs::read_to_string(in_home(&lab, host, name))
            .unwrap()
            .trim()
            .parse()
            .unwrap()
    };
    for pair in six.chunks(2).collect::<Vec<_>>().windows(2) {
        let (before, after) = (pair[0], pair[1]);
        let last_end = before.iter().map(|h| time(h, "end")).max().unwrap();
        let first_start = after.iter().map(|h| time(h, "start")).min().unwrap();
        assert!(
            first_start >= last_end,
            "batch {after:?} started before batch {before:?} ended"
        );
    }

    // A batch that did not complete cleanly stops the roll.
    std::fs::write(in_home(&lab, "target4", "fail"), "").unwrap();
    let b = run_fleet(
        &env,
        &lab,
        &hosts,
        // The same destructive command again under a new op id: declared, or the
        // hosts that ran roll-1 would hold it back (docs/guarantees.md#repetitions).
        &[
            "--serial",
            "2",
            "--op",
            "roll-2",
            "--repeats",
            "roll-1",
            "--",
            cmd,
        ],
    );
    let docs = b.hosts();
    assert_eq!(docs["target4"]["exit_code"], 2, "{b:?}");
    for host in &hosts[4..] {
        assert_eq!(
            docs[host]["reason_code"], "not_dispatched_batch_failed",
            "{host}: {b:?}"
        );
    }
    assert_eq!(b.status, 241, "{b:?}");
}

#[test]
fn one_host_cut_mid_run_is_indeterminate_while_the_others_complete() {
    let Some(lab) = support::netns_lab(3) else {
        return;
    };
    let env = Sealed::new("fleet-cut");
    let dir = fresh_dir("fleet-cut");
    let cfg = fast_loss_config(&lab, &dir);
    let hosts = aliases(&lab);
    // Each command ends only when the test opens its host's gate: the cut host's exit
    // cannot slip through before the cut.
    let cmd = "touch \"$HOME/started\"; while [ ! -e \"$HOME/gate\" ]; do sleep 0.05; done; echo ran >> \"$HOME/effect\"";
    let child = spawn(
        env.opmark()
            .arg("-F")
            .arg(&cfg)
            .args(["--json", "run"])
            .args(&hosts)
            .args(["--op", "cut-1", "--wait", "3s", "--", cmd]),
        &[],
    );
    wait_for("every command to start", Duration::from_secs(30), || {
        hosts.iter().all(|h| in_home(&lab, h, "started").exists())
    });
    lab.cut("target2").unwrap();
    for host in ["target1", "target3"] {
        std::fs::write(in_home(&lab, host, "gate"), "").unwrap();
    }
    let a = Fleet::of(child.wait_with_output().unwrap());
    let docs = a.hosts();
    assert_eq!(docs["target2"]["verdict"], "indeterminate", "{a:?}");
    assert_eq!(
        docs["target2"]["exit_code"],
        Value::Null,
        "unknown is not zero"
    );
    for host in ["target1", "target3"] {
        assert_eq!(docs[host]["verdict"], "completed", "{host}: {a:?}");
        assert_eq!(docs[host]["exit_code"], 0, "{host}: {a:?}");
    }
    assert_eq!(a.status, 242, "{a:?}");
    std::fs::write(in_home(&lab, "target2", "gate"), "").unwrap();
    lab.restore("target2").unwrap();
}

#[test]
fn detach_returns_in_progress_at_the_claim_and_a_later_run_follows_to_the_result() {
    let Some(lab) = support::loopback_lab(8) else {
        return;
    };
    let env = Sealed::new("fleet-detach");
    let hosts = aliases(&lab);
    let cmd = "while [ ! -e \"$HOME/gate\" ]; do sleep 0.05; done; echo ran >> \"$HOME/effect\"; echo finished";
    let a = run_fleet(&env, &lab, &hosts, &["--detach", "--op", "bg-1", "--", cmd]);
    assert_eq!(a.status, 240, "{a:?}");
    for (host, doc) in a.hosts() {
        assert_eq!(doc["verdict"], "in_progress", "{host}: {a:?}");
        assert_eq!(doc["reason_code"], "detached", "{host}: {a:?}");
        assert_eq!(doc["retryable"], true);
        assert_eq!(doc["attempts"][0]["boundary"], "started", "{host}: {a:?}");
    }
    // Still running on every host after opmark has returned.
    for host in &hosts {
        assert_eq!(lines_in(&in_home(&lab, host, "effect")), 0, "{host}");
    }
    let follower = spawn(
        env.opmark_with_lab(&lab)
            .args(["--json", "run"])
            .args(&hosts)
            .args(["--wait", "60s", "--op", "bg-1", "--", cmd]),
        &[],
    );
    for host in &hosts {
        std::fs::write(in_home(&lab, host, "gate"), "").unwrap();
    }
    let b = Fleet::of(follower.wait_with_output().unwrap());
    assert_eq!(b.status, 0, "{b:?}");
    for (host, doc) in b.hosts() {
        let verdict = doc["verdict"].as_str().unwrap();
        assert!(
            verdict == "completed" || verdict == "replayed",
            "{host}: {b:?}"
        );
        assert_eq!(doc["exit_code"], 0, "{host}: {b:?}");
        assert_eq!(doc["stdout"], "finished\n", "{host}: {b:?}");
    }
    for host in &hosts {
        assert_eq!(lines_in(&in_home(&lab, host, "effect")), 1, "{host}");
    }

    // One host detaches the same way, with today's single-host document.
    let one = Fleet::of(
        env.opmark_with_lab(&lab)
            .args(["--json", "run", "target1", "--detach", "--op", "bg-2", "--"])
            .arg("sleep 1")
            .output()
            .unwrap(),
    );
    assert_eq!(one.json["verdict"], "in_progress", "{one:?}");
    assert_eq!(one.json["reason_code"], "detached", "{one:?}");
    assert!(one.json.get("hosts").is_none(), "{one:?}");
}

#[test]
fn bad_hosts_file_lines_are_refused_naming_the_line_and_nothing_is_sent() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    let env = Sealed::new("fleet-file");
    let dir = fresh_dir("fleet-file");
    let file = dir.join("hosts");
    std::fs::write(
        &file,
        "# web tier\ntarget1\n\ntarget2 # second\n-oProxyCommand=x\n",
    )
    .unwrap();
    let cmd = "echo ran >> \"$HOME/effect\"";
    let out = env
        .opmark_with_lab(&lab)
        .args(["run", "--hosts-file"])
        .arg(&file)
        .args(["--op", "file-1", "--", cmd])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(245), "{}", text(&out.stderr));
    let stderr = text(&out.stderr);
    assert!(
        stderr.contains(&format!("{}:5", file.display())),
        "names file and line: {stderr}"
    );
    for host in ["target1", "target2"] {
        assert_eq!(lines_in(&in_home(&lab, host, "effect")), 0, "{host}");
    }

    // Comments and blank lines are skipped; the good file runs on both hosts.
    std::fs::write(&file, "# web tier\ntarget1\n\ntarget2 # second\n").unwrap();
    let good = Fleet::of(
        env.opmark_with_lab(&lab)
            .args(["--json", "run", "--hosts-file"])
            .arg(&file)
            .args(["--op", "file-2", "--", cmd])
            .output()
            .unwrap(),
    );
    assert_eq!(good.status, 0, "{good:?}");
    assert_eq!(good.hosts().len(), 2, "{good:?}");
}

#[test]
fn sigint_during_a_fleet_run_answers_every_host_first_then_exits_130() {
    let Some(lab) = support::loopback_lab(4) else {
        return;
    };
    let env = Sealed::new("fleet-sigint");
    let hosts = aliases(&lab);
    let cmd = "touch \"$HOME/started\"; while [ ! -e \"$HOME/gate\" ]; do sleep 0.05; done; echo ran >> \"$HOME/effect\"";
    // Three forks for four hosts: the fourth waits for a free fork it never gets.
    let child = spawn(
        env.opmark_with_lab(&lab)
            .args(["--json", "run"])
            .args(&hosts)
            .args(["--forks", "3", "--op", "int-1", "--", cmd]),
        &[],
    );
    wait_for("three commands to start", Duration::from_secs(30), || {
        hosts[..3]
            .iter()
            .all(|h| in_home(&lab, h, "started").exists())
    });
    let killed = Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let a = Fleet::of(child.wait_with_output().unwrap());
    assert_eq!(a.status, 130, "{a:?}");
    let docs = a.hosts();
    for host in &hosts[..3] {
        assert_eq!(docs[host]["verdict"], "in_progress", "{host}: {a:?}");
        assert_eq!(docs[host]["reason_code"], "client_interrupted", "{a:?}");
    }
    assert_eq!(docs["target4"]["verdict"], "not_applied", "{a:?}");
    assert_eq!(
        docs["target4"]["reason_code"], "client_interrupted",
        "{a:?}"
    );
    assert_eq!(docs["target4"]["retryable"], true, "{a:?}");
    assert!(
        a.stderr
            .contains("`opmark run` with op id int-1 follows or replays it"),
        "{a:?}"
    );
    // Detached by design: the started commands finish without their client, once.
    for host in &hosts {
        std::fs::write(in_home(&lab, host, "gate"), "").unwrap();
    }
    let again = run_fleet(
        &env,
        &lab,
        &hosts,
        &["--wait", "60s", "--op", "int-1", "--", cmd],
    );
    assert_eq!(again.status, 0, "{again:?}");
    for host in &hosts {
        assert_eq!(lines_in(&in_home(&lab, host, "effect")), 1, "{host}");
    }
}

/// The hosts of unresolved operations in the ledger.
fn unresolved_hosts(env: &Sealed) -> Vec<String> {
    let out = env
        .opmark()
        .args(["--json", "list", "--unresolved"])
        .output()
        .unwrap();
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    doc["operations"]
        .as_array()
        .map(|ops| {
            ops.iter()
                .filter_map(|o| o["host"].as_str().map(|h| short(h).to_owned()))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn reconcile_records_each_host_as_it_answers_while_a_hung_host_is_still_pending() {
    let Some(lab) = support::loopback_lab(3) else {
        return;
    };
    let env = Sealed::new("fleet-reconcile");
    let dir = fresh_dir("fleet-reconcile");
    // A hung host is given a minute to answer: long past the point the others settle.
    let cfg = dir.join("ssh_config");
    std::fs::write(
        &cfg,
        format!(
            "ConnectTimeout 60\nInclude {}\n",
            lab.ssh_config().display()
        ),
    )
    .unwrap();
    let hosts = aliases(&lab);
    // A client killed once the command started leaves each operation unresolved.
    for host in &hosts {
        let status = env
            .opmark()
            .arg("-F")
            .arg(&cfg)
            .env("OPMARK_FAULT", "after_started")
            .args(["run", host, "--op", "rec-1", "--", "true"])
            .status()
            .unwrap();
        assert!(!status.success(), "the fault point killed the client");
    }
    let mut pending = unresolved_hosts(&env);
    pending.sort();
    let shorts: Vec<&str> = hosts.iter().map(|h| short(h)).collect();
    assert_eq!(pending, shorts);
    // target3's sshd stopped: the TCP connection is accepted by the kernel, the SSH
    // banner never comes.
    let sshd = lab.target("target3").unwrap().sshd_pid().unwrap();
    let signal = |sig: &str| {
        assert!(Command::new("kill")
            .args([sig, &sshd.to_string()])
            .status()
            .unwrap()
            .success());
    };
    signal("-STOP");
    let mut reconcile = spawn(
        env.opmark()
            .arg("-F")
            .arg(&cfg)
            .args(["--json", "reconcile"]),
        &[],
    );
    wait_for(
        "target1 and target2 to be settled",
        Duration::from_secs(40),
        || unresolved_hosts(&env) == ["target3"],
    );
    let still_running = reconcile.try_wait().unwrap().is_none();
    signal("-CONT");
    let out = reconcile.wait_with_output().unwrap();
    assert!(
        still_running,
        "reconcile had already ended: {}",
        text(&out.stdout)
    );
    let doc: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["operations"].as_array().unwrap().len(), 3, "{doc}");
}

#[test]
fn a_progress_line_is_drawn_only_when_stderr_is_a_terminal() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    if !support::require_tool("script") {
        return;
    }
    let env = Sealed::new("fleet-progress");
    let line = format!(
        "{} -F {} run target1 target2 --op prog-1 -- true < /dev/null",
        env!("CARGO_BIN_EXE_opmark"),
        lab.ssh_config().display()
    );
    // opmark's sealed environment, for script and so for opmark under it.
    let sealed = env.opmark();
    let out = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .env_clear()
        .envs(sealed.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .expect("script runs");
    let transcript = text(&out.stdout);
    assert!(
        transcript.contains("opmark: 2/2 done, 0 running, 0 failed"),
        "{transcript}"
    );

    // Not a terminal: no progress line, only the summary.
    let piped = env
        .opmark_with_lab(&lab)
        .args(["run", "target1", "target2", "--op", "prog-2", "--", "true"])
        .output()
        .unwrap();
    let stderr = text(&piped.stderr);
    assert!(!stderr.contains(" done, "), "{stderr}");
    assert!(
        stderr.contains("opmark: target2: completed, exit 0"),
        "{stderr}"
    );
}

#[test]
fn reconcile_draws_its_progress_only_on_a_terminal() {
    let Some(lab) = support::loopback_lab(2) else {
        return;
    };
    if !support::require_tool("script") {
        return;
    }
    let env = Sealed::new("fleet-reconcile-progress");
    let hosts = aliases(&lab);
    let leave_unresolved = |op: &str| {
        for host in &hosts {
            let status = env
                .opmark_with_lab(&lab)
                .env("OPMARK_FAULT", "after_started")
                .args(["run", host, "--op", op, "--", "true"])
                .status()
                .unwrap();
            assert!(!status.success(), "the fault point killed the client");
        }
    };
    leave_unresolved("recp-1");
    let line = format!(
        "{} -F {} reconcile < /dev/null",
        env!("CARGO_BIN_EXE_opmark"),
        lab.ssh_config().display()
    );
    let sealed = env.opmark();
    let out = Command::new("script")
        .args(["-qefc", &line, "/dev/null"])
        .env_clear()
        .envs(sealed.get_envs().filter_map(|(k, v)| Some((k, v?))))
        .stdin(Stdio::null())
        .output()
        .expect("script runs");
    let transcript = text(&out.stdout);
    assert!(
        transcript.contains("opmark: reconciled 2/2 operations"),
        "{transcript}"
    );

    leave_unresolved("recp-2");
    let piped = env.opmark_with_lab(&lab).arg("reconcile").output().unwrap();
    let all = text(&piped.stdout) + &text(&piped.stderr);
    assert!(!all.contains("reconciled 2/2"), "{all}");
}

#[test]
fn the_hosts_intents_and_attempts_share_commits_each_recorded_before_its_dispatch() {
    use opmark::ledger::{Event, Ledger, OpKey};
    let Some(lab) = support::loopback_lab(4) else {
        return;
    };
    let env = Sealed::new(crate::test_name!());
    let hosts = aliases(&lab);
    let fleet = run_fleet(&env, &lab, &hosts, &["--op", "batched-1", "--", "true"]);
    assert_eq!(fleet.status, 0, "{fleet:?}");

    let ledger = Ledger::open(&env.ledger).unwrap();
    let records = ledger.operations_by_id("batched-1").unwrap();
    assert_eq!(records.len(), hosts.len(), "{records:?}");
    // One transaction stamps every event it appends with one record time (microseconds),
    // and commits fsync'd one after another never share one: the distinct record times
    // of the hosts' attempts are the commits that wrote them.
    let mut commits = std::collections::BTreeSet::new();
    for record in &records {
        let events = ledger
            .events(&OpKey::new("batched-1", record.host.clone()))
            .unwrap();
        let at = |want: fn(&Event) -> bool| {
            events
                .iter()
                .position(|e| want(&e.event))
                .unwrap_or_else(|| panic!("{}: {events:?}", record.host))
        };
        let intent = at(|e| matches!(e, Event::Intended { .. }));
        let attempt = at(|e| matches!(e, Event::AttemptDispatched { .. }));
        let verdict = at(|e| matches!(e, Event::Verdict { .. }));
        // The intent and the attempt, in one commit, before what the host answered.
        assert!(intent < attempt && attempt < verdict, "{events:?}");
        assert_eq!(events[intent].at, events[attempt].at, "{events:?}");
        assert!(events[attempt + 1..]
            .iter()
            .all(|e| e.at > events[attempt].at));
        commits.insert(events[attempt].at.clone());
    }
    assert!(
        commits.len() < hosts.len(),
        "{} hosts' intents and attempts took {} commits: {commits:?}",
        hosts.len(),
        commits.len()
    );
}
