//! The russh transport against real sshd targets: resolution from ssh config, host keys,
//! authentication (files, agent), exec streams and exit reports, loss detection, jumps,
//! the pool, and cold-connect latency against OpenSSH.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use opmark::ssh::{
    self, destination::StrictMode, ConnectStage, Destination, ExecEvent, HostSpec, Pool, Session,
};
use opmark::vocab::Boundary;

use crate::support::{self, sha, text, Lab, Target};

/// Resolves `alias` through the lab's ssh_config, with no agent leaking in from the
/// developer's environment.
fn dest(lab: &Lab, alias: &str) -> Destination {
    dest_in(lab.ssh_config(), alias)
}

fn dest_in(config: &Path, alias: &str) -> Destination {
    let mut d = ssh::resolve(&HostSpec {
        host: alias.into(),
        config_path: Some(config.to_path_buf()),
        ..HostSpec::default()
    })
    .unwrap_or_else(|e| panic!("resolve {alias}: {e}"));
    d.agent_socket = None;
    d
}

/// A config with one alias `t` for `target`, using the lab's client key, the given
/// known_hosts file and extra option lines.
fn custom_config(
    lab: &Lab,
    dir: &Path,
    target: &Target,
    known_hosts: &Path,
    extra: &str,
) -> PathBuf {
    let cfg = dir.join(format!("ssh_config-{}", rand_suffix()));
    let text = format!(
        "Host t\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {}\n  IdentitiesOnly yes\n  \
         UserKnownHostsFile {}\n{extra}",
        target.addr,
        target.port,
        target.user,
        lab.client_key().display(),
        known_hosts.display()
    );
    std::fs::write(&cfg, text).unwrap();
    cfg
}

fn rand_suffix() -> String {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static N: AtomicUsize = AtomicUsize::new(0);
    N.fetch_add(1, Ordering::Relaxed).to_string()
}

/// Everything one exec produced.
#[derive(Debug, Default)]
struct Outcome {
    stdout: Vec<u8>,
    stderr: Vec<u8>,
    status: Option<u32>,
    signal: Option<String>,
    end: Option<ExecEvent>,
}

async fn exec_to_end(session: &Session, command: &str, stdin: Option<Vec<u8>>) -> Outcome {
    let mut exec = session
        .exec(command, stdin)
        .await
        .unwrap_or_else(|e| panic!("exec {command}: {e}"));
    let mut out = Outcome::default();
    loop {
        match exec.next().await {
            ExecEvent::Stdout(b) => out.stdout.extend(b),
            ExecEvent::Stderr(b) => out.stderr.extend(b),
            ExecEvent::ExitStatus(s) => out.status = Some(s),
            ExecEvent::ExitSignal { signal, .. } => out.signal = Some(signal),
            end @ (ExecEvent::Closed | ExecEvent::Lost(_)) => {
                out.end = Some(end);
                return out;
            }
        }
    }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn aliases_ports_users_and_identities_resolve_from_generated_ssh_config() {
    let Some(lab) = crate::loopback_lab!(2) else {
        return;
    };
    rt().block_on(async {
        for t in lab.targets() {
            let d = dest(&lab, &t.alias);
            assert_eq!(d.hostname, t.addr.to_string());
            assert_eq!((d.port, d.user.as_str()), (t.port, t.user.as_str()));
            assert_eq!(d.identities, vec![lab.client_key().to_path_buf()]);
            assert_eq!(d.known_hosts, vec![lab.known_hosts().to_path_buf()]);
            assert_eq!(d.display(), t.alias);
            let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
            let o = exec_to_end(&s, "echo hello; id -un; echo err >&2", None).await;
            assert_eq!(text(&o.stdout), format!("hello\n{}\n", t.user));
            assert_eq!(text(&o.stderr), "err\n");
            assert_eq!((o.status, o.end), (Some(0), Some(ExecEvent::Closed)));
        }
    });
}

#[test]
fn hashed_known_hosts_entries_are_accepted() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let kh = dir.join("hashed_known_hosts");
    std::fs::copy(lab.known_hosts(), &kh).unwrap();
    let st = Command::new("ssh-keygen")
        .arg("-H")
        .arg("-f")
        .arg(&kh)
        .output()
        .unwrap();
    assert!(st.status.success(), "{}", text(&st.stderr));
    let body = std::fs::read_to_string(&kh).unwrap();
    assert!(body.lines().all(|l| l.starts_with("|1|")), "{body}");
    let cfg = custom_config(&lab, &dir, &lab.targets()[0], &kh, "");
    rt().block_on(async {
        let s = Session::connect(&dest_in(&cfg, "t"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exec_to_end(&s, "echo ok", None).await.stdout, b"ok\n");
    });
}

#[test]
fn host_known_only_by_its_rsa_or_ecdsa_key_negotiates_that_type() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let t = &lab.targets()[0];
    let mut tried = Vec::new();
    for key in t.host_public_keys().unwrap() {
        if key.starts_with("ssh-ed25519") {
            continue;
        }
        let kh = dir.join(format!("only_{}", rand_suffix()));
        std::fs::write(&kh, format!("{} {key}\n", t.known_hosts_host())).unwrap();
        // The fingerprint of the one key known_hosts holds, as OpenSSH prints it.
        let listed = Command::new("ssh-keygen")
            .arg("-lf")
            .arg(&kh)
            .output()
            .unwrap();
        assert!(listed.status.success(), "{}", text(&listed.stderr));
        let want = text(&listed.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        assert!(want.starts_with("SHA256:"), "ssh-keygen -lf: {want}");
        let cfg = custom_config(&lab, &dir, t, &kh, "");
        let seen = rt().block_on(async {
            let s = Session::connect(&dest_in(&cfg, "t"))
                .await
                .unwrap_or_else(|e| panic!("known only by {}: {e}", &key[..12]));
            assert_eq!(exec_to_end(&s, "echo ok", None).await.stdout, b"ok\n");
            s.host_key()
        });
        // The host presented that key, not its ed25519 one: the type was negotiated.
        assert_eq!(
            seen.as_deref(),
            Some(want.as_str()),
            "known only by {}",
            &key[..12]
        );
        tried.push(key.split_whitespace().next().unwrap_or_default().to_owned());
    }
    tried.sort();
    assert_eq!(
        tried,
        ["ecdsa-sha2-nistp256", "ssh-rsa"],
        "each of the target's other host key types was tried"
    );
}

#[test]
fn rsa_and_ecdsa_identity_files_authenticate() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    for (kind, bits) in [("rsa", "3072"), ("ecdsa", "256")] {
        let key = dir.join(format!("id_{kind}"));
        let out = Command::new("ssh-keygen")
            .args(["-q", "-t", kind, "-b", bits, "-N", "", "-C", kind, "-f"])
            .arg(&key)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        lab.authorize_key(&std::fs::read_to_string(key.with_extension("pub")).unwrap())
            .unwrap();
        let mut d = dest(&lab, "target1");
        d.identities = vec![key];
        rt().block_on(async {
            let s = Session::connect(&d)
                .await
                .unwrap_or_else(|e| panic!("{kind}: {e}"));
            assert_eq!(exec_to_end(&s, "echo ok", None).await.stdout, b"ok\n");
        });
    }
}

/// Connects with `cfg`'s alias `t` and, only if that succeeded, runs a command that
/// creates `marker`. Returns the connect error.
async fn connect_and_touch(cfg: &Path, marker: &Path) -> ssh::ConnectError {
    let d = dest_in(cfg, "t");
    match Session::connect(&d).await {
        Ok(s) => {
            exec_to_end(&s, &format!("touch {}", marker.display()), None).await;
            panic!("connected although the host key should have been refused")
        }
        Err(e) => e,
    }
}

#[test]
fn unknown_host_key_is_refused_and_nothing_runs() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let kh = dir.join("empty_known_hosts");
    std::fs::write(&kh, "").unwrap();
    let cfg = custom_config(&lab, &dir, &lab.targets()[0], &kh, "");
    let marker = dir.join("ran-unknown");
    let e = rt().block_on(connect_and_touch(&cfg, &marker));
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert_eq!(e.boundary(), Boundary::NotSent);
    assert!(
        e.message.contains("SHA256:") && e.message.contains("accept-new"),
        "{e}"
    );
    assert!(
        !marker.exists(),
        "the command ran despite an unknown host key"
    );
    assert_eq!(
        std::fs::read_to_string(&kh).unwrap(),
        "",
        "strict mode must not learn"
    );
}

#[test]
fn changed_host_key_is_refused_naming_seen_fingerprint_and_expected_line() {
    let Some(lab) = crate::loopback_lab!(2) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let (t1, t2) = (&lab.targets()[0], &lab.targets()[1]);
    // target1's name with target2's keys: exactly what a changed key looks like.
    let kh = dir.join("changed_known_hosts");
    let mut body = String::from("# comment line\n");
    for key in t2.host_public_keys().unwrap() {
        body.push_str(&format!("{} {key}\n", t1.known_hosts_host()));
    }
    std::fs::write(&kh, &body).unwrap();
    let cfg = custom_config(&lab, &dir, t1, &kh, "");
    let marker = dir.join("ran-changed");
    let e = rt().block_on(connect_and_touch(&cfg, &marker));
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    let seen = russh::keys::PublicKey::from_openssh(&t1.host_public_keys().unwrap()[0]).unwrap();
    let fp = ssh::known_hosts::fingerprint(&seen);
    assert!(e.message.contains("HAS CHANGED"), "{e}");
    assert!(e.message.contains(&fp), "fingerprint {fp} missing: {e}");
    assert!(e.message.contains(&format!("{}:2", kh.display())), "{e}");
    assert!(!marker.exists());
}

#[test]
fn accept_new_learns_a_key_once_then_refuses_a_change() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let kh = dir.join("learned_known_hosts");
    let cfg = custom_config(
        &lab,
        &dir,
        &lab.targets()[0],
        &kh,
        "  StrictHostKeyChecking accept-new\n",
    );
    let d = dest_in(&cfg, "t");
    assert_eq!(d.strict, StrictMode::AcceptNew);
    rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exec_to_end(&s, "echo first", None).await.stdout, b"first\n");
        let learned = std::fs::read_to_string(&kh).unwrap();
        assert_eq!(learned.lines().count(), 1, "{learned}");
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            exec_to_end(&s, "echo second", None).await.stdout,
            b"second\n"
        );
        assert_eq!(
            std::fs::read_to_string(&kh).unwrap(),
            learned,
            "learned twice"
        );
    });
    lab.rotate_host_keys("target1").unwrap();
    let marker = dir.join("ran-after-rotate");
    let e = rt().block_on(connect_and_touch(&cfg, &marker));
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert!(e.message.contains(&format!("{}:1", kh.display())), "{e}");
    assert!(!marker.exists());
}

fn keygen_with_passphrase(path: &Path, passphrase: &str) {
    let out = Command::new("ssh-keygen")
        .args([
            "-q", "-t", "ed25519", "-C", "test-key", "-N", passphrase, "-f",
        ])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn wrong_key_is_refused_at_auth_naming_the_identities_tried() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let wrong = dir.join("wrong_ed25519");
    keygen_with_passphrase(&wrong, "");
    let missing = dir.join("no_such_key");
    let mut d = dest(&lab, "target1");
    d.identities = vec![wrong.clone(), missing.clone()];
    let e = rt().block_on(Session::connect(&d)).unwrap_err();
    assert_eq!(e.stage, ConnectStage::Auth, "{e}");
    assert_eq!(e.boundary(), Boundary::NotSent);
    assert!(
        e.message
            .contains(&format!("{} (refused)", wrong.display())),
        "{e}"
    );
    assert!(
        e.message
            .contains(&format!("{} (no such file)", missing.display())),
        "{e}"
    );
    assert!(!e.message.contains("PRIVATE KEY"), "{e}");
}

/// An ssh-agent started for one test, killed (by its pid) on drop.
struct Agent {
    pid: i32,
    sock: PathBuf,
}

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = Command::new("kill").arg(self.pid.to_string()).status();
    }
}

fn start_agent(dir: &Path) -> Agent {
    let sock = dir.join("agent.sock");
    let out = Command::new("ssh-agent")
        .arg("-s")
        .arg("-a")
        .arg(&sock)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let stdout = text(&out.stdout);
    let pid = stdout
        .split("SSH_AGENT_PID=")
        .nth(1)
        .and_then(|r| r.split(';').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no agent pid in {stdout}"));
    Agent { pid, sock }
}

#[test]
fn encrypted_key_works_through_ssh_agent() {
    crate::require_tool!("ssh-agent", "ssh-add");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let key = dir.join("enc_ed25519");
    keygen_with_passphrase(&key, "correct horse");
    let pubkey = std::fs::read_to_string(key.with_extension("pub")).unwrap();
    lab.authorize_key(&pubkey).unwrap();
    let agent = start_agent(&dir);
    let askpass = dir.join("askpass.sh");
    std::fs::write(&askpass, "#!/bin/sh\necho 'correct horse'\n").unwrap();
    std::fs::set_permissions(
        &askpass,
        std::os::unix::fs::PermissionsExt::from_mode(0o700),
    )
    .unwrap();
    let out = Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .env("SSH_ASKPASS", &askpass)
        .env("SSH_ASKPASS_REQUIRE", "force")
        .env("DISPLAY", ":0")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "ssh-add: {}", text(&out.stderr));

    let mut d = dest(&lab, "target1");
    d.identities = vec![key.clone()];
    // Without the agent (and without a terminal) the encrypted key cannot be used.
    let e = rt().block_on(Session::connect(&d)).unwrap_err();
    assert_eq!(e.stage, ConnectStage::Auth, "{e}");
    assert!(e.message.contains("encrypted"), "{e}");
    // Through the agent it works, and IdentitiesOnly keeps to that one key.
    d.agent_socket = Some(agent.sock.clone());
    rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            exec_to_end(&s, "echo via-agent", None).await.stdout,
            b"via-agent\n"
        );
    });
    // Agent identities alone (no identity file at all) work too.
    d.identities = vec![];
    d.identities_only = false;
    rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            exec_to_end(&s, "echo agent-only", None).await.stdout,
            b"agent-only\n"
        );
    });
}

#[test]
fn large_stdout_and_stdin_arrive_intact() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    rt().block_on(async {
        let s = Session::connect(&dest(&lab, "target1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        // 5 MB of stdout, streamed.
        let o = exec_to_end(&s, "yes 0123456789abcdef | head -c 5242880", None).await;
        let expected: Vec<u8> = b"0123456789abcdef\n"
            .iter()
            .cycle()
            .take(5_242_880)
            .copied()
            .collect();
        assert_eq!(o.stdout.len(), expected.len());
        assert_eq!(sha(&o.stdout), sha(&expected));
        assert_eq!(o.status, Some(0));
        // 1 MiB of stdin, hashed on the host and echoed back at the same time.
        let input: Vec<u8> = (0..1_048_576u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        let o = exec_to_end(&s, "sha256sum | cut -d' ' -f1 >&2", Some(input.clone())).await;
        assert_eq!(text(&o.stderr).trim(), sha(&input));
        let o = exec_to_end(&s, "cat", Some(input.clone())).await;
        assert_eq!(sha(&o.stdout), sha(&input));
        assert_eq!((o.status, o.end), (Some(0), Some(ExecEvent::Closed)));
    });
}

#[test]
fn exit_codes_and_signal_are_reported_exactly() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    rt().block_on(async {
        let s = Session::connect(&dest(&lab, "target1"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        for code in [0u32, 1, 255] {
            let o = exec_to_end(&s, &format!("echo out; exit {code}"), None).await;
            assert_eq!((o.status, o.signal.as_deref()), (Some(code), None));
            assert_eq!(o.end, Some(ExecEvent::Closed));
        }
        let o = exec_to_end(&s, "echo before; kill -TERM $$", None).await;
        assert_eq!(o.stdout, b"before\n");
        assert_eq!((o.status, o.signal.as_deref()), (None, Some("TERM")));
        assert_eq!(o.end, Some(ExecEvent::Closed));
    });
}

#[test]
fn several_execs_share_one_pooled_connection_and_a_dead_one_is_replaced() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let d = dest(&lab, "target1");
    let runtime = rt();
    let pool = Pool::new(4);
    let client_port = |o: Outcome| {
        text(&o.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap_or_default()
            .to_string()
    };
    let (a, b) = runtime.block_on(async {
        let s1 = pool.session(&d).await.unwrap();
        let s2 = pool.session(&d).await.unwrap();
        // Six channels at once through a limit of four: all finish.
        let runs: Vec<_> = (0..6)
            .map(|i| {
                let s = s1.clone();
                tokio::spawn(
                    async move { exec_to_end(&s, &format!("sleep 0.2; echo {i}"), None).await },
                )
            })
            .collect();
        for (i, r) in runs.into_iter().enumerate() {
            assert_eq!(text(&r.await.unwrap().stdout), format!("{i}\n"));
        }
        (
            client_port(exec_to_end(&s1, "echo $SSH_CONNECTION", None).await),
            client_port(exec_to_end(&s2, "echo $SSH_CONNECTION", None).await),
        )
    });
    assert_eq!(a, b, "both sessions should be one connection");
    lab.stop_sshd("target1").unwrap();
    lab.start_sshd("target1").unwrap();
    let c = runtime.block_on(async {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let s = pool.session(&d).await.unwrap();
            match s.exec("echo $SSH_CONNECTION", None).await {
                Ok(_) => return client_port(exec_to_end(&s, "echo $SSH_CONNECTION", None).await),
                Err(e) if Instant::now() < deadline => {
                    // The pool notices the death at the latest on the failed exec.
                    tracing::debug!("{e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(e) => panic!("pool did not replace the dead session: {e}"),
            }
        }
    });
    assert_ne!(a, c, "a dead session must be replaced by a new connection");
}

#[test]
fn connection_refused_is_a_connect_error() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    lab.stop_sshd("target1").unwrap();
    let e = rt()
        .block_on(Session::connect(&dest(&lab, "target1")))
        .unwrap_err();
    assert_eq!(e.stage, ConnectStage::Connect, "{e}");
    assert_eq!(e.boundary(), Boundary::NotSent);
    assert!(e.message.contains("refused"), "{e}");
}

#[test]
fn link_cut_before_dispatch_is_a_connect_error_within_connect_timeout() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let mut d = dest(&lab, "target1");
    d.connect_timeout = Duration::from_secs(2);
    lab.cut("target1").unwrap();
    let started = Instant::now();
    let e = rt().block_on(Session::connect(&d)).unwrap_err();
    let took = started.elapsed();
    lab.restore("target1").unwrap();
    // A ConnectTimeout expiry has its own stage: one bounded attempt, not retried.
    assert_eq!(e.stage, ConnectStage::Timeout, "{e}");
    assert!(e.message.contains("timed out"), "{e}");
    // Bounded by the connect timeout, not TCP's two minutes of SYN retries; the margin is
    // for a busy machine.
    assert!(
        took < d.connect_timeout + Duration::from_secs(10),
        "took {took:?}"
    );
}

#[test]
fn link_cut_mid_command_is_reported_lost_within_keepalive_budget() {
    let Some(lab) = crate::netns_lab!(1) else {
        return;
    };
    let d = dest(&lab, "target1");
    let budget = d.loss_budget().expect("keepalives on by default");
    assert!(
        budget <= Duration::from_secs(10),
        "default budget {budget:?}"
    );
    let (event, took) = rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        let mut exec = s
            .exec("echo started; sleep 60; echo finished", None)
            .await
            .unwrap();
        assert_eq!(exec.next().await, ExecEvent::Stdout(b"started\n".to_vec()));
        lab.cut("target1").unwrap();
        let cut_at = Instant::now();
        let event = loop {
            match exec.next().await {
                ExecEvent::Stdout(_) | ExecEvent::Stderr(_) => {}
                other => break other,
            }
        };
        let took = cut_at.elapsed();
        assert!(s.is_closed());
        // A later exec on the dead session is refused before anything is sent.
        assert!(matches!(
            s.exec("true", None).await,
            Err(ssh::ExecError::NotSent(_))
        ));
        (event, took)
    });
    lab.restore("target1").unwrap();
    println!("loss detected {took:?} after the cut (budget {budget:?}): {event:?}");
    match &event {
        ExecEvent::Lost(why) => assert!(why.contains("keepalive"), "{why}"),
        other => panic!("expected Lost, got {other:?}"),
    }
    // Bounded by the keepalive budget, not TCP's minutes of retransmissions; the margin
    // is for a busy machine.
    assert!(
        took <= budget + Duration::from_secs(10),
        "took {took:?}, budget {budget:?}"
    );
}

#[test]
fn connection_killed_mid_command_is_lost_not_closed() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let d = dest(&lab, "target1");
    let (event, took) = rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        let mut exec = s.exec("echo started; sleep 30", None).await.unwrap();
        assert_eq!(exec.next().await, ExecEvent::Stdout(b"started\n".to_vec()));
        lab.stop_sshd("target1").unwrap();
        let killed_at = Instant::now();
        let event = loop {
            match exec.next().await {
                ExecEvent::Stdout(_) | ExecEvent::Stderr(_) => {}
                other => break other,
            }
        };
        (event, killed_at.elapsed())
    });
    println!("connection end seen {took:?} after sshd was killed: {event:?}");
    match event {
        ExecEvent::Lost(why) => assert!(!why.contains("keepalive"), "{why}"),
        other => panic!("expected Lost, got {other:?}"),
    }
    // Seen from the socket, well before keepalives could have told (the default budget);
    // `why` above already says it was not a keepalive timeout.
    let budget = d.loss_budget().expect("keepalives on by default");
    assert!(
        took < budget,
        "a closed socket is seen at once, took {took:?} (keepalive budget {budget:?})"
    );
}

#[test]
fn proxy_jump_through_a_bastion_works_and_an_unknown_bastion_key_is_refused() {
    let Some(lab) = crate::loopback_lab!(2) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let spec = |host: &str, jump: &str, cfg: &Path| HostSpec {
        host: host.into(),
        jump: Some(jump.into()),
        config_path: Some(cfg.to_path_buf()),
        ..HostSpec::default()
    };
    let mut d = ssh::resolve(&spec("target2", "target1", lab.ssh_config())).unwrap();
    d.agent_socket = None;
    d.jumps[0].agent_socket = None;
    assert_eq!(d.jumps.len(), 1);
    rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        let o = exec_to_end(&s, "echo through-bastion", None).await;
        assert_eq!(o.stdout, b"through-bastion\n");
        // The connection rides the bastion: when the bastion's sshd dies, so does it.
        lab.stop_sshd("target1").unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        while !s.is_closed() {
            assert!(
                Instant::now() < deadline,
                "target2 session outlived its bastion"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        lab.start_sshd("target1").unwrap();
    });
    // The bastion's key unknown: refused at the bastion, nothing reaches target2.
    let empty = dir.join("empty_kh");
    std::fs::write(&empty, "").unwrap();
    let t1 = &lab.targets()[0];
    let mut cfg_text = std::fs::read_to_string(lab.ssh_config()).unwrap();
    cfg_text = format!(
        "Host bastion\n  HostName {}\n  Port {}\n  User {}\n  IdentityFile {}\n  UserKnownHostsFile {}\n\n{cfg_text}",
        t1.addr,
        t1.port,
        t1.user,
        lab.client_key().display(),
        empty.display()
    );
    let cfg = dir.join("ssh_config_bastion");
    std::fs::write(&cfg, cfg_text).unwrap();
    let mut d = ssh::resolve(&spec("target2", "bastion", &cfg)).unwrap();
    d.agent_socket = None;
    d.jumps[0].agent_socket = None;
    let e = rt().block_on(Session::connect(&d)).unwrap_err();
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert!(e.message.starts_with("jump host bastion:"), "{e}");
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

#[test]
#[ignore = "benchmark: cargo test --test it transport::cold -- --ignored --nocapture"]
fn cold_connect_and_exec_latency_against_openssh() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let d = dest(&lab, "target1");
    let runtime = rt();
    let runs = 9;
    let mut ours = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        runtime.block_on(async {
            let s = Session::connect(&d).await.unwrap();
            let o = exec_to_end(&s, "true", None).await;
            assert_eq!(o.status, Some(0));
        });
        ours.push(started.elapsed());
    }
    let mut openssh = Vec::new();
    for _ in 0..runs {
        let started = Instant::now();
        let st = support::ssh(&lab)
            .args(["target1", "true"])
            .status()
            .unwrap();
        assert!(st.success());
        openssh.push(started.elapsed());
    }
    let mut warm = Vec::new();
    runtime.block_on(async {
        let s = Session::connect(&d).await.unwrap();
        for _ in 0..runs {
            let started = Instant::now();
            exec_to_end(&s, "true", None).await;
            warm.push(started.elapsed());
        }
    });
    println!(
        "cold connect+exec `true`, median of {runs}: opmark/russh {:?}, OpenSSH ssh {:?}; \
         reused connection {:?}",
        median(ours),
        median(openssh),
        median(warm)
    );
}

/// `opmark --json -F cfg run ARGS`, parsed.
fn run_json_with(env: &support::Sealed, cfg: &Path, args: &[&str]) -> serde_json::Value {
    let out = env
        .opmark()
        .arg("-F")
        .arg(cfg)
        .args(["--json", "run"])
        .args(args)
        .output()
        .unwrap();
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "not one JSON document ({e}): {} / {}",
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

#[test]
fn proxy_command_nc_carries_the_run_and_the_replay() {
    crate::require_tool!("nc");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let t = &lab.targets()[0];
    // The proxy logs the expanded tokens, so the test knows the connection went through it.
    let proxy_log = dir.join("proxy.log");
    let cfg = custom_config(
        &lab,
        &dir,
        t,
        lab.known_hosts(),
        &format!(
            "  ProxyCommand sh -c 'echo %h %p %r %n >> {}; exec nc %h %p'\n",
            proxy_log.display()
        ),
    );
    let env = support::Sealed::new(crate::test_name!());
    let effects = dir.join("effects");
    let cmd = format!("echo ran >> {}; echo via-proxy", effects.display());
    let first = run_json_with(&env, &cfg, &["t", "--op", "proxied-1", "--", &cmd]);
    assert_eq!(first["verdict"], "completed", "{first}");
    assert_eq!(first["stdout"], "via-proxy\n");
    let second = run_json_with(&env, &cfg, &["t", "--op", "proxied-1", "--", &cmd]);
    assert_eq!(second["verdict"], "replayed", "{second}");
    assert_eq!(second["stdout"], "via-proxy\n");
    assert_eq!(std::fs::read_to_string(&effects).unwrap(), "ran\n");
    let log = std::fs::read_to_string(&proxy_log).unwrap();
    let line = format!("{} {} {} t", t.addr, t.port, t.user);
    assert!(
        log.lines().count() >= 2 && log.lines().all(|l| l == line),
        "every connection went through the ProxyCommand with %h %p %r %n expanded: {log}"
    );
}

#[test]
fn proxy_command_process_ends_with_the_session() {
    crate::require_tool!("nc");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let pid_file = dir.join("proxy.pid");
    let cfg = custom_config(
        &lab,
        &dir,
        &lab.targets()[0],
        lab.known_hosts(),
        &format!(
            "  ProxyCommand sh -c 'echo $$ > {}; exec nc %h %p'\n",
            pid_file.display()
        ),
    );
    let d = dest_in(&cfg, "t");
    rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exec_to_end(&s, "echo hi", None).await.stdout, b"hi\n");
        let pid = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .to_string();
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        assert!(proc_dir.exists(), "the proxy runs while the session lives");
        drop(s);
        let deadline = Instant::now() + Duration::from_secs(10);
        // A reaped or zombie process no longer holds the transport.
        let alive = || {
            std::fs::read_to_string(proc_dir.join("stat"))
                .map(|st| !st.contains(") Z "))
                .unwrap_or(false)
        };
        while alive() {
            assert!(
                Instant::now() < deadline,
                "ProxyCommand pid {pid} outlived its session"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    });
}

#[test]
fn failing_proxy_command_is_not_applied_and_nothing_runs() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let env = support::Sealed::new(crate::test_name!());
    let effects = dir.join("effects");
    let cmd = format!("echo ran >> {}", effects.display());
    // A proxy that cannot reach the host this time: a connect failure, worth a retry.
    let cfg = custom_config(
        &lab,
        &dir,
        &lab.targets()[0],
        lab.known_hosts(),
        "  ProxyCommand sh -c 'echo proxy-says-no >&2; exit 1'\n",
    );
    let out = env
        .opmark()
        .arg("-F")
        .arg(&cfg)
        .args(["--json", "run", "t", "--op", "p-1", "--", &cmd])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["verdict"], "not_applied", "{v}");
    assert_eq!(v["reason_code"], "connect_failed", "{v}");
    assert_eq!(v["retryable"], true, "{v}");
    assert!(
        text(&out.stderr).contains("proxy-says-no"),
        "the proxy's stderr reaches opmark's: {}",
        text(&out.stderr)
    );
    // A command that does not exist: the config is wrong, no retry can help.
    let cfg = custom_config(
        &lab,
        &dir,
        &lab.targets()[0],
        lab.known_hosts(),
        "  ProxyCommand /nonexistent/proxy %h %p\n",
    );
    let v = run_json_with(&env, &cfg, &["t", "--op", "p-2", "--", &cmd]);
    assert_eq!(v["verdict"], "not_applied", "{v}");
    assert_eq!(v["retryable"], false, "{v}");
    assert!(
        v["reason"].as_str().unwrap_or("").contains("exit 127"),
        "{v}"
    );
    assert!(!effects.exists(), "nothing ran");
}

/// Signs `pubkey` with the CA key `ca` (`ssh-keygen -s`): a user certificate for
/// `principal`, or a host certificate (`-h`) when `host`.
fn sign(ca: &Path, pubkey: &Path, principal: &str, host: bool) -> PathBuf {
    sign_with(ca, pubkey, principal, host, &[])
}

/// As [`sign`], with more `ssh-keygen` options (`-V` validity...).
fn sign_with(ca: &Path, pubkey: &Path, principal: &str, host: bool, extra: &[&str]) -> PathBuf {
    let mut cmd = Command::new("ssh-keygen");
    cmd.args(extra)
        .args(["-q", "-s"])
        .arg(ca)
        .args(["-I", "opmark-test", "-n", principal]);
    if host {
        cmd.arg("-h");
    }
    let out = cmd.arg(pubkey).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let name = pubkey
        .to_string_lossy()
        .trim_end_matches(".pub")
        .to_string();
    PathBuf::from(format!("{name}-cert.pub"))
}

/// Appends `lines` to a target's sshd_config and restarts its sshd.
fn reconfigure_sshd(lab: &Lab, target: &Target, lines: &str) {
    let mut config = std::fs::read_to_string(target.sshd_config()).unwrap();
    config.push_str(lines);
    std::fs::write(target.sshd_config(), config).unwrap();
    lab.stop_sshd(&target.alias).unwrap();
    lab.start_sshd(&target.alias).unwrap();
}

#[test]
fn user_certificate_via_file_or_agent() {
    crate::require_tool!("ssh-keygen", "ssh-agent", "ssh-add");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let t = &lab.targets()[0];
    let ca = dir.join("user_ca");
    keygen_with_passphrase(&ca, "");
    reconfigure_sshd(
        &lab,
        t,
        &format!("TrustedUserCAKeys {}.pub\n", ca.display()),
    );
    // A key the host does not list in authorized_keys: only its certificate can get in.
    let key = dir.join("certified");
    keygen_with_passphrase(&key, "");
    let config_for = |extra: &str| {
        let cfg = custom_config(&lab, &dir, t, lab.known_hosts(), extra);
        // The lab's key is in authorized_keys; use only the certified key here.
        let text = std::fs::read_to_string(&cfg).unwrap().replace(
            &lab.client_key().display().to_string(),
            &key.display().to_string(),
        );
        std::fs::write(&cfg, text).unwrap();
        cfg
    };
    let connects = |cfg: &Path, agent: Option<&Path>| {
        let mut d = dest_in(cfg, "t");
        d.agent_socket = agent.map(Path::to_path_buf);
        rt().block_on(async {
            match Session::connect(&d).await {
                Ok(s) => {
                    assert_eq!(exec_to_end(&s, "echo in", None).await.stdout, b"in\n");
                    Ok(())
                }
                Err(e) => Err(e),
            }
        })
    };

    // No certificate anywhere: the bare key is refused.
    let e = connects(&config_for(""), None).unwrap_err();
    assert_eq!(e.stage, ConnectStage::Auth, "{e}");

    // `<key>-cert.pub` beside the identity.
    let cert = sign(&ca, &key.with_extension("pub"), &t.user, false);
    assert_eq!(cert, dir.join("certified-cert.pub"));
    connects(&config_for(""), None).unwrap_or_else(|e| panic!("-cert.pub: {e}"));

    // A CertificateFile elsewhere (the -cert.pub moved away).
    let moved = dir.join("elsewhere.crt");
    std::fs::rename(&cert, &moved).unwrap();
    connects(&config_for(""), None).unwrap_err();
    connects(
        &config_for(&format!("  CertificateFile {}\n", moved.display())),
        None,
    )
    .unwrap_or_else(|e| panic!("CertificateFile: {e}"));

    // An RSA certificate: signed with rsa-sha2 (OpenSSH refuses ssh-rsa-cert-v01).
    let rsa = dir.join("certified_rsa");
    let out = Command::new("ssh-keygen")
        .args(["-q", "-t", "rsa", "-b", "2048", "-N", "", "-f"])
        .arg(&rsa)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    sign(&ca, &rsa.with_extension("pub"), &t.user, false);
    let rsa_cfg = config_for("");
    let rsa_text = std::fs::read_to_string(&rsa_cfg)
        .unwrap()
        .replace(&key.display().to_string(), &rsa.display().to_string());
    std::fs::write(&rsa_cfg, rsa_text).unwrap();
    connects(&rsa_cfg, None).unwrap_or_else(|e| panic!("RSA certificate: {e}"));

    // The agent holding key and certificate (ssh-add loads `<key>-cert.pub`), with no
    // key or certificate file left for opmark to read.
    std::fs::rename(&moved, &cert).unwrap();
    let agent = start_agent(&dir);
    let out = Command::new("ssh-add")
        .arg(&key)
        .env("SSH_AUTH_SOCK", &agent.sock)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    for f in [&key, &key.with_extension("pub"), &cert] {
        std::fs::remove_file(f).unwrap();
    }
    let cfg_path = config_for("");
    let cfg = std::fs::read_to_string(&cfg_path)
        .unwrap()
        .replace("IdentitiesOnly yes", "IdentitiesOnly no");
    std::fs::write(&cfg_path, cfg).unwrap();
    connects(&cfg_path, Some(&agent.sock)).unwrap_or_else(|e| panic!("agent certificate: {e}"));
}

#[test]
fn host_certificate_trusted_by_cert_authority_line_unless_revoked() {
    crate::require_tool!("ssh-keygen");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let t = &lab.targets()[0];
    let ca = dir.join("host_ca");
    keygen_with_passphrase(&ca, "");
    let ca_pub = std::fs::read_to_string(ca.with_extension("pub")).unwrap();
    let ca_pub = ca_pub.trim();
    let host_pub = t.dir.join("ssh_host_ed25519_key.pub");
    let cert = sign(&ca, &host_pub, &t.addr.to_string(), true);
    reconfigure_sshd(&lab, t, &format!("HostCertificate {}\n", cert.display()));
    let host_key = std::fs::read_to_string(&host_pub).unwrap();
    let host_key: Vec<&str> = host_key.split_whitespace().take(2).collect();
    let host_key = host_key.join(" ");
    let expected_fp = {
        let out = Command::new("ssh-keygen")
            .arg("-lf")
            .arg(&host_pub)
            .output()
            .unwrap();
        text(&out.stdout)
            .split_whitespace()
            .nth(1)
            .unwrap()
            .to_string()
    };
    let with_known_hosts = |name: &str, lines: &str| {
        let kh = dir.join(name);
        std::fs::write(&kh, lines).unwrap();
        custom_config(&lab, &dir, t, &kh, "")
    };

    // Only the CA is known, for a host pattern that covers the target.
    let cfg = with_known_hosts(
        "kh_ca",
        &format!(
            "@cert-authority {},other.example {ca_pub}\n",
            t.known_hosts_host()
        ),
    );
    let d = dest_in(&cfg, "t");
    rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            exec_to_end(&s, "echo certified", None).await.stdout,
            b"certified\n"
        );
        assert_eq!(s.host_key().as_deref(), Some(expected_fp.as_str()));
    });

    // The certified host key revoked: refused though the CA is trusted.
    let cfg = with_known_hosts(
        "kh_revoked",
        &format!("@cert-authority * {ca_pub}\n@revoked * {host_key}\n"),
    );
    let marker = dir.join("ran-revoked");
    let e = rt().block_on(connect_and_touch(&cfg, &marker));
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert!(
        e.message.contains("@revoked") && e.message.contains("kh_revoked:2"),
        "{e}"
    );
    assert!(!marker.exists());

    // The CA revoked: refused too.
    let cfg = with_known_hosts(
        "kh_ca_revoked",
        &format!("@cert-authority * {ca_pub}\n@revoked * {ca_pub}\n"),
    );
    let e = rt().block_on(connect_and_touch(&cfg, &marker));
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert!(e.message.contains("kh_ca_revoked:2"), "{e}");

    // A CA trusted only for other hosts vouches for nothing here: unknown host.
    let cfg = with_known_hosts("kh_other", &format!("@cert-authority *.example {ca_pub}\n"));
    let e = rt().block_on(connect_and_touch(&cfg, &marker));
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert!(e.message.contains("no host key is known"), "{e}");

    // A certificate for another principal is refused, naming why.
    let wrong = sign(&ca, &host_pub, "someone-else.example", true);
    assert_eq!(wrong, cert);
    lab.stop_sshd(&t.alias).unwrap();
    lab.start_sshd(&t.alias).unwrap();
    let cfg = with_known_hosts("kh_ca2", &format!("@cert-authority * {ca_pub}\n"));
    let e = rt().block_on(connect_and_touch(&cfg, &marker));
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert!(e.message.contains("someone-else.example"), "{e}");

    // Expired, or a user certificate where a host certificate belongs: refused.
    for (extra, host, why) in [
        (&["-V", "-2d:-1d"][..], true, "expired"),
        (&[][..], false, "user certificate"),
    ] {
        sign_with(&ca, &host_pub, &t.addr.to_string(), host, extra);
        lab.stop_sshd(&t.alias).unwrap();
        lab.start_sshd(&t.alias).unwrap();
        let e = rt().block_on(connect_and_touch(&cfg, &marker));
        assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
        assert!(e.message.contains(why), "{why}: {e}");
    }
    assert!(!marker.exists());
}

#[test]
fn ssh_askpass_gives_the_passphrase_of_an_encrypted_key() {
    crate::require_tool!("ssh-keygen");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let key = dir.join("encrypted");
    keygen_with_passphrase(&key, "s3cret phrase");
    lab.authorize_key(&std::fs::read_to_string(key.with_extension("pub")).unwrap())
        .unwrap();
    let cfg = custom_config(&lab, &dir, &lab.targets()[0], lab.known_hosts(), "");
    let text_cfg = std::fs::read_to_string(&cfg).unwrap().replace(
        &lab.client_key().display().to_string(),
        &key.display().to_string(),
    );
    std::fs::write(&cfg, text_cfg).unwrap();
    let log = dir.join("askpass.log");
    let askpass = dir.join("askpass.sh");
    std::fs::write(
        &askpass,
        format!(
            "#!/bin/sh\nprintf '%s\\n' \"$1\" >> {}\necho 's3cret phrase'\n",
            log.display()
        ),
    )
    .unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&askpass, std::fs::Permissions::from_mode(0o755)).unwrap();
    let env = support::Sealed::new(crate::test_name!());
    let asks = || std::fs::read_to_string(&log).map_or(0, |t| t.lines().count());
    let run_with = |op: &str, vars: &[(&str, &str)], extra: &[&str]| {
        let mut cmd = env.opmark();
        cmd.arg("-F").arg(&cfg).env("SSH_ASKPASS", &askpass);
        for (k, v) in vars {
            cmd.env(k, v);
        }
        let out = cmd
            .args(["--json", "run"])
            .args(extra)
            .args(["t", "--op", op, "--", "echo unlocked"])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", text(&out.stderr)));
        v
    };

    // stdin is not a terminal; a DISPLAY makes ssh (and opmark) use SSH_ASKPASS.
    let v = run_with("ask-1", &[("DISPLAY", ":0")], &[]);
    assert_eq!(v["verdict"], "completed", "{v}");
    assert_eq!(v["stdout"], "unlocked\n");
    assert_eq!(asks(), 1);
    assert!(
        std::fs::read_to_string(&log)
            .unwrap()
            .starts_with(&format!("Enter passphrase for key '{}'", key.display())),
        "the prompt names the key"
    );
    // SSH_ASKPASS_REQUIRE=force needs no display.
    let v = run_with("ask-2", &[("SSH_ASKPASS_REQUIRE", "force")], &[]);
    assert_eq!(v["verdict"], "completed", "{v}");
    assert_eq!(asks(), 2);

    // never, BatchMode, or no display: refused without running the program.
    for (op, vars, extra) in [
        (
            "ask-3",
            &[("DISPLAY", ":0"), ("SSH_ASKPASS_REQUIRE", "never")][..],
            &[][..],
        ),
        (
            "ask-4",
            &[("SSH_ASKPASS_REQUIRE", "force")][..],
            &["-o", "BatchMode=yes"][..],
        ),
        ("ask-5", &[][..], &[][..]),
    ] {
        let v = run_with(op, vars, extra);
        assert_eq!(v["verdict"], "not_applied", "{op}: {v}");
        assert_eq!(v["reason_code"], "auth_refused", "{op}: {v}");
        assert!(v["reason"].as_str().unwrap().contains("ssh-add"), "{v}");
        assert_eq!(asks(), 2, "{op}: askpass must not run");
    }
}

/// Runs `opmark -F cfg --json run t --op OP -- echo on-tty` under `script`, so that it has
/// a terminal, typing `typed` at it. Returns everything the terminal showed.
fn run_on_tty(env: &support::Sealed, cfg: &Path, op: &str, typed: &str) -> String {
    use std::io::{Read, Write};
    let quote = |s: &str| format!("'{}'", s.replace('\'', r"'\''"));
    let line = [
        env!("CARGO_BIN_EXE_opmark"),
        "-F",
        &cfg.display().to_string(),
        "--json",
        "run",
        "t",
        "--op",
        op,
        "--",
        "echo on-tty",
    ]
    .iter()
    .map(|a| quote(a))
    .collect::<Vec<_>>()
    .join(" ");
    let template = env.opmark();
    let mut cmd = Command::new("script");
    cmd.env_clear();
    for (k, v) in template.get_envs() {
        if let Some(v) = v {
            cmd.env(k, v);
        }
    }
    let mut child = cmd
        .args(["-q", "-e", "-c", &line, "/dev/null"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Kept open until opmark is done: script ends the session when its input ends.
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(typed.as_bytes()).unwrap();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stdout.read_to_end(&mut buf);
        buf
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("opmark under script did not finish");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(stdin);
    text(&reader.join().unwrap()).replace('\r', "")
}

/// The JSON verdict at the end of a terminal transcript.
fn last_json(transcript: &str) -> serde_json::Value {
    let line = transcript
        .lines()
        .rev()
        .find_map(|l| l.find("{\"").map(|i| &l[i..]))
        .unwrap_or_else(|| panic!("no JSON in: {transcript}"));
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {transcript}"))
}

#[test]
fn strict_ask_prompts_on_a_tty_and_learns_the_key_on_yes() {
    crate::require_tool!("script");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let kh = dir.join("kh_ask");
    std::fs::write(&kh, "").unwrap();
    let cfg = custom_config(
        &lab,
        &dir,
        &lab.targets()[0],
        &kh,
        "  StrictHostKeyChecking ask\n",
    );
    let env = support::Sealed::new(crate::test_name!());
    let question = "Are you sure you want to continue connecting (yes/no/[fingerprint])?";

    // Nobody at a terminal: `ask` is `yes`, the unknown key refused, nothing asked.
    let v = run_json_with(&env, &cfg, &["t", "--op", "ask-0", "--", "echo on-tty"]);
    assert_eq!(v["verdict"], "not_applied", "{v}");
    assert_eq!(v["reason_code"], "host_key_rejected", "{v}");
    assert!(
        v["reason"].as_str().unwrap().contains("nobody can answer"),
        "{v}"
    );

    // A terminal but BatchMode: nobody is asked either.
    let batch = custom_config(
        &lab,
        &dir,
        &lab.targets()[0],
        &kh,
        "  StrictHostKeyChecking ask\n  BatchMode yes\n",
    );
    let shown = run_on_tty(&env, &batch, "ask-b", "yes\n");
    assert!(!shown.contains(question), "{shown}");
    let v = last_json(&shown);
    assert_eq!(v["reason_code"], "host_key_rejected", "{v}");
    assert_eq!(std::fs::read_to_string(&kh).unwrap(), "");

    // On a terminal, answered no (after one answer that is neither).
    let shown = run_on_tty(&env, &cfg, "ask-1", "maybe\nno\n");
    assert!(shown.contains(question), "{shown}");
    assert!(
        shown.contains("ED25519 key fingerprint is SHA256:"),
        "{shown}"
    );
    assert!(
        shown.contains("Please type 'yes', 'no' or the fingerprint:"),
        "{shown}"
    );
    let v = last_json(&shown);
    assert_eq!(v["verdict"], "not_applied", "{v}");
    assert_eq!(v["reason_code"], "host_key_rejected", "{v}");
    assert_eq!(
        std::fs::read_to_string(&kh).unwrap(),
        "",
        "nothing learned on no"
    );

    // Answered yes: the command runs and the key is added to known_hosts.
    let shown = run_on_tty(&env, &cfg, "ask-2", "yes\n");
    assert!(shown.contains(question), "{shown}");
    let v = last_json(&shown);
    assert_eq!(v["verdict"], "completed", "{v}");
    assert_eq!(v["stdout"], "on-tty\n");
    assert_eq!(std::fs::read_to_string(&kh).unwrap().lines().count(), 1);

    // Known now: no question, no terminal needed.
    let v = run_json_with(&env, &cfg, &["t", "--op", "ask-3", "--", "echo on-tty"]);
    assert_eq!(v["verdict"], "completed", "{v}");
}

#[test]
fn proxy_command_ssh_w_reaches_a_host_through_an_openssh_bastion() {
    crate::require_tool!("ssh");
    let Some(lab) = crate::loopback_lab!(2) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let target = &lab.targets()[1];
    let cfg = custom_config(
        &lab,
        &dir,
        target,
        lab.known_hosts(),
        &format!(
            "  ProxyCommand ssh -F {} -o BatchMode=yes -W %h:%p target1\n",
            lab.ssh_config().display()
        ),
    );
    let d = dest_in(&cfg, "t");
    rt().block_on(async {
        let s = Session::connect(&d).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            exec_to_end(&s, "echo via-ssh-w", None).await.stdout,
            b"via-ssh-w\n"
        );
    });
    // Without the bastion there is no way in: a connect failure, nothing sent.
    lab.stop_sshd("target1").unwrap();
    let e = rt().block_on(Session::connect(&d)).unwrap_err();
    assert_eq!(e.stage, ConnectStage::Connect, "{e}");
    assert!(e.message.contains("ProxyCommand"), "{e}");
    lab.start_sshd("target1").unwrap();
}

/// A directory for injection markers with a lower-case path (a host name is
/// lower-cased before it reaches a ProxyCommand's `%h`), unique per test.
fn marker_dir(test: &str) -> PathBuf {
    let dir = PathBuf::from(format!(
        "/tmp/opmark-inj-{}-{}",
        std::process::id(),
        test.to_ascii_lowercase()
            .replace(|c: char| !c.is_ascii_alphanumeric(), "-")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Percent-encodes every byte but letters and digits, for an `ssh://` user.
fn url_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn user_jump_and_token_injections_into_a_proxy_command_are_refused_and_run_nothing() {
    crate::require_tool!("nc");
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let t = &lab.targets()[0];
    let marks = marker_dir(crate::test_name!());
    let m = |n: u32| marks.join(format!("m{n}")).display().to_string();
    // Every host goes through a ProxyCommand run by `sh -c`, with `%r` outside the inner
    // quotes and `%h` inside them, as the configs of issue 25 had it. Host names are
    // lower-cased before `%h` (so `${IFS}` would not survive): `$(>file)` creates its
    // file with no command name. With the checks disabled, m1-m5, m7, m9 and m10 appear.
    let cfg = lab.dir().join("ssh_config_injection");
    std::fs::write(
        &cfg,
        format!(
            "Host t\n  HostName {addr}\n  Port {port}\n  User {user}\n  IdentityFile {key}\n  \
             IdentitiesOnly yes\n  UserKnownHostsFile {kh}\n\
             Host tokjump\n  HostName x$(>{m6})\n  ProxyJump admin@%h\n\
             Host dollarjump\n  ProxyJump j$(>{m7})\n\
             Host semijump\n  ProxyJump j;>{m8}\n\
             Host tokhost\n  HostName x$(>{m9})\n\
             Host tokuser\n  HostName {addr}\n  User a|touch${{IFS}}{m10}\n\
             Host *\n  ProxyCommand sh -c 'exec nc %h %p' %r\n",
            addr = t.addr,
            port = t.port,
            user = t.user,
            key = lab.client_key().display(),
            kh = lab.known_hosts().display(),
            m6 = m(6),
            m7 = m(7),
            m8 = m(8),
            m9 = m(9),
            m10 = m(10),
        ),
    )
    .unwrap();
    let env = support::Sealed::new(crate::test_name!());
    // The proxy path works: a plain user goes through it.
    let ok = run_json_with(
        &env,
        &cfg,
        &["t", "-l", &t.user, "--op", "inj-ok", "--", "echo fine"],
    );
    assert_eq!(
        (ok["verdict"].as_str(), ok["stdout"].as_str()),
        (Some("completed"), Some("fine\n")),
        "{ok}"
    );

    let uri = format!("ssh://{}@t", url_encode(&format!("a|id>{}", m(5))));
    let cases: Vec<(Vec<String>, &str, u32)> = vec![
        (
            vec!["t".into(), "-l".into(), format!("a|id>{}", m(1))],
            "-l: remote user name",
            1,
        ),
        (
            vec!["t".into(), "-l".into(), format!("a$(touch {})", m(2))],
            "-l: remote user name",
            2,
        ),
        (
            vec![
                "t".into(),
                "-o".into(),
                format!("User=b`touch${{IFS}}{}`", m(3)),
            ],
            "-o User= (command-line option 1): remote user name",
            3,
        ),
        (
            vec!["t".into(), "-J".into(), format!("j|id>{}", m(4))],
            "-J, jump host",
            4,
        ),
        (vec![uri], "the ssh:// destination: remote user name", 5),
        (vec!["tokjump".into()], "ProxyJump at", 6),
        (vec!["dollarjump".into()], "ProxyJump at", 7),
        (vec!["semijump".into()], "ProxyJump at", 8),
        (vec!["tokhost".into()], "%h in the ProxyCommand at", 9),
        (vec!["tokuser".into()], "%r in the ProxyCommand at", 10),
        (
            vec!["t".into(), "-o".into(), format!("ProxyJump=j$(>{})", m(11))],
            "-o ProxyJump= (command-line option 1), jump host",
            11,
        ),
    ];
    for (args, origin, n) in &cases {
        let op = format!("inj-{n}");
        let out = env
            .opmark()
            .arg("-F")
            .arg(&cfg)
            .arg("run")
            .args(args)
            .args(["--op", &op, "--", "echo ran"])
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert!(
            !Path::new(&m(*n)).exists(),
            "{args:?} ran a local command: {} exists",
            m(*n)
        );
        assert_eq!(out.status.code(), Some(246), "{args:?}: {err}");
        assert!(
            err.contains(origin) && err.contains("contains invalid characters"),
            "{args:?}: the refusal names where the value came from and the rule: {err}"
        );
        assert!(
            !text(&out.stdout).contains("ran"),
            "{args:?} ran: {}",
            text(&out.stdout)
        );
        assert!(
            !Path::new(&m(*n)).exists(),
            "{args:?} ran a local command: {} exists",
            m(*n)
        );
    }
    // `user@host`: the destination check refuses it first (exit 245, bad input).
    let out = env
        .opmark()
        .arg("-F")
        .arg(&cfg)
        .args([
            "run",
            &format!("a|id>{}@t", m(12)),
            "--op",
            "inj-12",
            "--",
            "echo ran",
        ])
        .output()
        .unwrap();
    assert!(!Path::new(&m(12)).exists(), "user@host ran a local command");
    assert!(!out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("invalid host"),
        "{}",
        text(&out.stderr)
    );
    assert_eq!(
        std::fs::read_dir(&marks).unwrap().count(),
        0,
        "nothing was created by any refused value"
    );
    // Nothing was recorded for the refused runs; the good one was.
    let list = env.opmark().args(["list", "--json"]).output().unwrap();
    let list = text(&list.stdout);
    assert!(list.contains("\"inj-ok\""), "{list}");
    for n in 1..=12 {
        assert!(
            !list.contains(&format!("\"inj-{n}\"")),
            "inj-{n} recorded: {list}"
        );
    }
    let _ = std::fs::remove_dir_all(&marks);
}

#[test]
fn a_host_key_algorithms_pin_is_honoured_against_a_real_sshd() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let t = &lab.targets()[0];
    let keys = t.host_public_keys().unwrap();
    let rsa = keys
        .iter()
        .find(|k| k.starts_with("ssh-rsa"))
        .expect("the target has an RSA host key");
    // The client knows only the RSA key. Without a pin opmark asks for it and connects.
    let kh = dir.join(format!("rsa_only_{}", rand_suffix()));
    std::fs::write(&kh, format!("{} {rsa}\n", t.known_hosts_host())).unwrap();
    let cfg = custom_config(&lab, &dir, t, &kh, "");
    rt().block_on(async {
        let s = Session::connect(&dest_in(&cfg, "t"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(exec_to_end(&s, "echo ok", None).await.stdout, b"ok\n");
    });
    // Pinned to ssh-ed25519: only that is asked for, the server proves itself with its
    // Ed25519 key, which this client does not know: refused (it connected before, when
    // the pin was dropped and known_hosts picked RSA).
    let cfg = custom_config(&lab, &dir, t, &kh, "  HostKeyAlgorithms ssh-ed25519\n");
    let e = rt()
        .block_on(Session::connect(&dest_in(&cfg, "t")))
        .unwrap_err();
    assert_eq!(e.stage, ConnectStage::HostKey, "{e}");
    assert!(
        e.message.contains("ED25519") || e.message.contains("ed25519"),
        "{e}"
    );
    // Pinned to what it knows: connects.
    let cfg = custom_config(&lab, &dir, t, &kh, "  HostKeyAlgorithms rsa-sha2-512\n");
    rt().block_on(async {
        let s = Session::connect(&dest_in(&cfg, "t"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            exec_to_end(&s, "echo pinned", None).await.stdout,
            b"pinned\n"
        );
    });
}

#[test]
fn cipher_and_kex_lists_are_what_opmark_offers_to_a_real_sshd() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let dir = lab.dir().to_path_buf();
    let t = &lab.targets()[0];
    // Lists sshd 9.2 accepts by default: the connection works with exactly them.
    let cfg = custom_config(
        &lab,
        &dir,
        t,
        lab.known_hosts(),
        "  Ciphers aes128-ctr\n  MACs hmac-sha2-256\n  KexAlgorithms ecdh-sha2-nistp256\n",
    );
    rt().block_on(async {
        let s = Session::connect(&dest_in(&cfg, "t"))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            exec_to_end(&s, "echo listed", None).await.stdout,
            b"listed\n"
        );
    });
    // Lists sshd 9.2 does not enable by default: no common algorithm, nothing sent. Had
    // opmark dropped the option (as it did), it would have connected with its defaults.
    for extra in [
        "  Ciphers aes128-cbc\n",
        "  KexAlgorithms diffie-hellman-group1-sha1\n",
    ] {
        let cfg = custom_config(&lab, &dir, t, lab.known_hosts(), extra);
        let e = rt()
            .block_on(Session::connect(&dest_in(&cfg, "t")))
            .unwrap_err();
        assert_ne!(e.stage, ConnectStage::Auth, "{extra}: {e}");
        assert!(
            matches!(e.stage, ConnectStage::Connect | ConnectStage::HostKey),
            "{extra}: {e:?}"
        );
    }
}

/// Makes a target's sshd log at DEBUG2, where it says whether a `publickey` request was
/// a query or signed ("querying public key" / "attempting public key"); the log's length
/// before the next connection.
fn sshd_debug2(lab: &Lab, target: &Target) -> u64 {
    let config = std::fs::read_to_string(target.sshd_config()).unwrap();
    assert!(config.contains("LogLevel VERBOSE\n"), "{config}");
    std::fs::write(
        target.sshd_config(),
        config.replace("LogLevel VERBOSE\n", "LogLevel DEBUG2\n"),
    )
    .unwrap();
    lab.stop_sshd(&target.alias).unwrap();
    lab.start_sshd(&target.alias).unwrap();
    std::fs::metadata(&target.log).map_or(0, |m| m.len())
}

fn log_since(target: &Target, from: u64) -> String {
    let log = std::fs::read(&target.log).unwrap();
    String::from_utf8_lossy(&log[from as usize..]).into_owned()
}

#[test]
fn a_key_held_here_is_signed_at_once_and_a_refused_one_moves_on_to_the_next() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.targets()[0].clone();
    let from = sshd_debug2(&lab, &target);
    let d = dest(&lab, "target1");
    let out = rt().block_on(async {
        let s = Session::connect(&d).await.expect("connect");
        exec_to_end(&s, "true", None).await
    });
    assert_eq!(out.status, Some(0));
    let log = log_since(&target, from);
    // No unsigned query round trip before the signature (docs/findings.md#speed).
    assert!(log.contains("attempting public key"), "{log}");
    assert!(!log.contains("querying public key"), "{log}");

    // A key the host refuses, signed all the same: refused as a query would have been,
    // and the next identity authenticates.
    let wrong = lab.dir().join("refused_ed25519");
    keygen_with_passphrase(&wrong, "");
    let mut d = dest(&lab, "target1");
    d.identities = vec![wrong, lab.client_key().to_path_buf()];
    let from = std::fs::metadata(&target.log).unwrap().len();
    let out = rt().block_on(async {
        let s = Session::connect(&d)
            .await
            .expect("the second key authenticates");
        exec_to_end(&s, "true", None).await
    });
    assert_eq!(out.status, Some(0));
    let log = log_since(&target, from);
    assert_eq!(log.matches("attempting public key").count(), 2, "{log}");
    assert!(!log.contains("querying public key"), "{log}");
    assert_eq!(log.matches("Accepted publickey").count(), 1, "{log}");
}

/// A relay in front of a target that passes the server's bytes up to its NEWKEYS, then
/// holds them back until the client has sent `enough` encrypted bytes without an answer
/// (or `patience` is spent), and says which happened.
fn hold_after_newkeys(
    upstream: std::net::SocketAddr,
    enough: usize,
    patience: Duration,
) -> (u16, std::sync::mpsc::Receiver<usize>) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (client, _) = listener.accept().unwrap();
        let server = std::net::TcpStream::connect(upstream).unwrap();
        // Client bytes after the client's own NEWKEYS: what it sent encrypted.
        let sent = Arc::new(AtomicUsize::new(0));
        let (mut c_read, mut s_write) = (client.try_clone().unwrap(), server.try_clone().unwrap());
        let counted = sent.clone();
        std::thread::spawn(move || {
            let mut clear = Clear::default();
            let mut buf = [0u8; 65536];
            while let Ok(n) = c_read.read(&mut buf) {
                if n == 0 || s_write.write_all(&buf[..n]).is_err() {
                    break;
                }
                counted.fetch_add(clear.after_newkeys(&buf[..n]), Ordering::SeqCst);
            }
            let _ = s_write.shutdown(std::net::Shutdown::Write);
        });
        let (mut s_read, mut c_write) = (server, client);
        let mut clear = Clear::default();
        let mut held = Vec::new();
        let mut buf = [0u8; 65536];
        // Up to the server's NEWKEYS, passed on; the rest held.
        while held.is_empty() && !clear.encrypted {
            let Ok(n) = s_read.read(&mut buf) else { return };
            if n == 0 {
                return;
            }
            let after = clear.after_newkeys(&buf[..n]);
            c_write.write_all(&buf[..n - after]).unwrap();
            held.extend_from_slice(&buf[n - after..n]);
        }
        let deadline = Instant::now() + patience;
        while sent.load(Ordering::SeqCst) < enough && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let _ = tx.send(sent.load(Ordering::SeqCst));
        c_write.write_all(&held).unwrap();
        while let Ok(n) = s_read.read(&mut buf) {
            if n == 0 || c_write.write_all(&buf[..n]).is_err() {
                break;
            }
        }
    });
    (port, rx)
}

/// One side's SSH stream read as clear text (identification line, then packets) up to
/// its NEWKEYS.
#[derive(Default)]
struct Clear {
    buf: Vec<u8>,
    ident: bool,
    encrypted: bool,
}

impl Clear {
    /// Feeds a chunk; answers how many of its bytes come after this side's NEWKEYS.
    fn after_newkeys(&mut self, chunk: &[u8]) -> usize {
        if self.encrypted {
            return chunk.len();
        }
        self.buf.extend_from_slice(chunk);
        while !self.ident {
            let Some(nl) = self.buf.iter().position(|&b| b == b'\n') else {
                return 0;
            };
            self.ident = self.buf.drain(..=nl).as_slice().starts_with(b"SSH-");
        }
        while self.buf.len() >= 6 {
            let len = u32::from_be_bytes(self.buf[..4].try_into().unwrap()) as usize;
            if self.buf.len() < 4 + len {
                return 0;
            }
            let msg = self.buf[5];
            self.buf.drain(..4 + len);
            if msg == 21 {
                self.encrypted = true;
                return std::mem::take(&mut self.buf).len();
            }
        }
        0
    }
}

#[test]
fn the_auth_request_rides_behind_the_service_request_before_any_answer() {
    let Some(lab) = crate::loopback_lab!(1) else {
        return;
    };
    let target = lab.targets()[0].clone();
    // A SERVICE_REQUEST alone is one small packet (under 64 bytes with any cipher here);
    // a signed ed25519 USERAUTH_REQUEST is over 150 more.
    let (port, said) = hold_after_newkeys(
        std::net::SocketAddr::new(target.addr, target.port),
        200,
        Duration::from_secs(5),
    );
    let cfg = lab.dir().join("ssh_config.held");
    std::fs::write(
        &cfg,
        format!(
            "Host held\n  HostName 127.0.0.1\n  Port {port}\n  HostKeyAlias {}\n  User {}\n  \
             IdentityFile {}\n  IdentitiesOnly yes\n  UserKnownHostsFile {}\n  \
             StrictHostKeyChecking yes\n",
            target.known_hosts_host(),
            target.user,
            lab.client_key().display(),
            lab.known_hosts().display(),
        ),
    )
    .unwrap();
    let d = dest_in(&cfg, "held");
    let out = rt().block_on(async {
        let s = Session::connect(&d)
            .await
            .expect("connect through the relay");
        exec_to_end(&s, "true", None).await
    });
    assert_eq!(out.status, Some(0));
    let sent = said.recv().unwrap();
    assert!(
        sent >= 200,
        "the client sent {sent} encrypted bytes and then waited for the service accept: \
         the auth request was not pipelined"
    );
}
