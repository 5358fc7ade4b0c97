//! Secrets through the real binary: one canary per redaction form, run against a real
//! sshd target and classified, must never reach the ledger's files (database, WAL, shm),
//! `list`, `show`, their JSON, `classify`, `-vvv` stderr or an error message.
//!
//! Every secret below contains "canary" (any case), and nothing else the test writes or
//! names does (paths, hosts, op ids), so one byte search covers every form.

use std::path::Path;
use std::process::Output;

use opmark::lab::Lab;

use crate::support::{self, contains_canary, text, Sealed};

/// One command line per redaction form (docs/ledger.md#redaction and issue 12), each with its
/// canary in the secret's place only.
const ROWS: &[&str] = &[
    "sshpass -p CanaryA1 ssh -p 2222 host true",
    "sshpass -pCanaryA2 ssh host true",
    "sudo /usr/bin/sshpass -e -p 'Canary A3' scp f h:",
    "docker login -u bob -p CanaryA4 registry.example.com",
    "podman login -p=CanaryA5 quay.io",
    "MYSQL_PWD=CanaryA6 mysql -u root db",
    "curl -u admin:CanaryA7 https://api.example.com",
    "curl --user admin:CanaryA8 https://api.example.com",
    "curl -fsSu 'admin:Canary A9' https://x.example",
    "curl 'https://x.example/?token=CanaryB1&page=2'",
    "wget 'https://s3.example/o?X-Amz-Signature=CanaryB2'",
    "redis-cli -h cache -a CanaryB3 get k",
    "redis-cli --pass CanaryB4 ping",
    "mysql <<EOF\nSET PASSWORD FOR app = 'CanaryB5';\nEOF",
    "cat > /etc/app.env <<-'END'\n\tapi=CanaryB6\n\tEND",
    "./configure password=CanaryB7",
    "PASSWORD=CanaryB8 ./deploy.sh",
    "app pass=CanaryB9 user=bob",
    "psql 'host=db password=CanaryC1 dbname=app'",
    "tool --password CanaryC2 run",
    "mysql --password=CanaryC3 -e 'select 1'",
    "mysql -u root -pCanaryC4 db",
    "PGPASSWORD=CanaryC5 psql -h db",
    "AWS_SECRET_ACCESS_KEY=CanaryC6 aws s3 ls",
    "GITHUB_TOKEN=CanaryC7 gh pr list",
    "curl -H 'Authorization: Basic Q2FuYXJ5QzdCYXNpYw==' https://x.example",
    "curl -H 'Authorization: Bearer CanaryC8' https://x.example",
    "curl -H 'X-Api-Key: CanaryC9' https://x.example",
    "deploy --token=CanaryD1",
    "client --api-key CanaryD2",
    "htpasswd -b /etc/nginx/.htpasswd bob CanaryD3",
    "htpasswd -nbB bob CanaryD4",
    "openssl rsa -in k.pem -passin pass:CanaryD5 -out k2.pem",
    "openssl enc -aes-256-cbc -k CanaryD6 -in f",
    "printf '%s' '-----BEGIN OPENSSH PRIVATE KEY-----\nCanaryD7\n-----END OPENSSH PRIVATE KEY-----' > ~/id",
    "git clone https://bob:CanaryD8@example.com/r.git",
    "redis-cli -u redis://:CanaryD9@cache:6379 ping",
    "mongo -u admin -p CanaryE1 --authenticationDatabase admin",
    "ldapsearch -x -D cn=admin,dc=ex -w CanaryE2 -b dc=ex",
    "ldappasswd -x -D cn=admin -w CanaryE3 -a CanaryE4 -s CanaryE5 uid=bob",
    "ipmitool -I lanplus -H bmc -U admin -P CanaryE6 power status",
    "smbclient //fs/share -U bob%CanaryE7 -c ls",
    "lftp -u bob,CanaryE8 sftp://host",
    "echo 'root:CanaryE9' | chpasswd",
    "printf '%s' CanaryF1 | docker login -u bob --password-stdin reg",
    "docker login -u bob --password-stdin <<< CanaryF2",
    "echo 'machine api.example.com login bob password CanaryF3' >> ~/.netrc",
    "curl -d '{\"password\": \"CanaryF4\"}' https://x.example",
    "echo 'db_password: CanaryF5' >> ~/config.yml",
    "curl -H 'Cookie: session=CanaryF6' https://x.example",
    "aws s3 ls # AKIACANARYF7XXXXXXXX",
    "gh auth login --with-token ghp_CanaryF8aaaaaaaaaaaaaaaaaaaa",
    "slack token xoxb-CanaryF9-eeeeeeeeee",
    "policy says corp-canary-16 is secret",
];

/// Every file under `dir`, recursively (the ledger, its WAL and shm, the key, sockets).
/// Every regular file under `dir`, at any depth (FIFOs, sockets and links left out).
pub(crate) fn files_under(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        match entry.file_type() {
            Ok(t) if t.is_dir() => files_under(&path, out),
            Ok(t) if t.is_file() => out.push(path),
            _ => {}
        }
    }
}

/// A leak report for `what` when its output holds a canary.
fn leaks(what: &str, out: &Output) -> Option<String> {
    (contains_canary(&out.stdout) || contains_canary(&out.stderr)).then(|| {
        format!(
            "{what} printed a secret (status {:?}):\n--- stdout\n{}\n--- stderr\n{}",
            out.status.code(),
            text(&out.stdout),
            text(&out.stderr)
        )
    })
}

#[test]
fn no_secret_form_reaches_the_ledger_list_show_classify_verbose_logs_or_errors() {
    let Some(lab) = support::loopback_lab(1) else {
        return;
    };
    let env = Sealed::new("redaction");
    // The user's policy adds a pattern of its own (written so that the file itself holds
    // no canary); run, classify and the ledger must all apply it.
    let builtin = include_str!("../../command-classes.toml");
    let policy = builtin.replacen("\nredact = [", "\nredact = [\n  'corp-c[a]nary-[0-9]+',", 1);
    assert_ne!(policy, builtin, "the shipped policy has a `redact` list");
    std::fs::create_dir_all(env.config.join("opmark")).unwrap();
    std::fs::write(env.config.join("opmark/command-classes.toml"), policy).unwrap();

    // Rows run four at a time: each is a few opmark processes, two of them over SSH.
    let rows: Vec<(usize, &str)> = ROWS.iter().copied().enumerate().collect();
    let mut found: Vec<String> = std::thread::scope(|scope| {
        let workers: Vec<_> = rows
            .chunks(ROWS.len().div_ceil(4))
            .map(|chunk| {
                let (env, lab) = (&env, &lab);
                scope.spawn(move || {
                    chunk
                        .iter()
                        .flat_map(|&(n, row)| row_leaks(env, lab, n, row))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        workers
            .into_iter()
            .flat_map(|w| w.join().expect("row worker"))
            .collect()
    });
    // Held open from here on, so the WAL is not checkpointed away before it is searched.
    let ledger = opmark::ledger::Ledger::open(&env.ledger).unwrap();
    for args in [
        vec!["list"],
        vec!["--json", "list"],
        vec!["stats"],
        vec!["--json", "stats"],
        vec!["audit", "verify"],
    ] {
        let out = env.opmark_with_lab(&lab).args(&args).output().unwrap();
        found.extend(leaks(&format!("`opmark {}`", args.join(" ")), &out));
    }
    assert!(found.is_empty(), "{}", found.join("\n\n"));

    // The ledger and everything else opmark keeps (WAL and shm included: the newest pages
    // live there until a checkpoint).
    let mut files = Vec::new();
    files_under(&env.root, &mut files);
    assert!(
        files.iter().any(|f| f.ends_with("ledger.db-wal"))
            && files.iter().any(|f| f.ends_with("ledger.db")),
        "the ledger and its WAL exist: {files:?}"
    );
    for file in files {
        let bytes = std::fs::read(&file).unwrap_or_default();
        assert!(
            !contains_canary(&bytes),
            "secret found in {}",
            file.display()
        );
    }

    // What was masked keeps its shape.
    let shown = env
        .opmark()
        .args(["show", "secret-form-0"])
        .output()
        .unwrap();
    assert!(
        text(&shown.stdout).contains("sshpass -p *** ssh -p 2222 host"),
        "{}",
        text(&shown.stdout)
    );
    drop(ledger);
}

/// Runs row `n` through `run` (JSON with -vvv, then plain), `classify`, `show`, and the
/// errors that quote it; returns a report per output that holds its canary.
fn row_leaks(env: &Sealed, lab: &Lab, n: usize, row: &str) -> Vec<String> {
    let mut found = Vec::new();
    let mut check = |what: String, out: Output| {
        found.extend(leaks(&what, &out));
        out
    };
    // Each row is also passed where an op id or a host goes, to see the error; as an op
    // id it must be invalid (a valid one is a ledger key, kept as given).
    assert!(row.contains(' '), "row {n} must not be a valid op id");
    let op = format!("secret-form-{n}");
    // `exit 0` first: the host parses the whole line but runs none of it (no `chpasswd`
    // on a test machine).
    let command = format!("exit 0; {row}");
    let out = check(
        format!("-vvv --json run of row {n}"),
        env.opmark_with_lab(lab)
            .args([
                "-vvv", "--json", "run", "target1", "--op", &op, "--", &command,
            ])
            .output()
            .unwrap(),
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("row {n}: no JSON document ({e}): {}", text(&out.stderr)));
    let verdict = doc["verdict"].as_str().unwrap_or_default();
    assert!(
        ["completed", "blocked"].contains(&verdict),
        "row {n}: a command that only exits completes (or, unparseable, is blocked): {doc}"
    );
    check(
        format!("plain run of row {n}"),
        env.opmark_with_lab(lab)
            .args(["run", "target1", "--op", &op, "--", &command])
            .output()
            .unwrap(),
    );
    for args in [
        vec!["classify", "--", row],
        vec!["--json", "classify", "--", row],
        vec!["show", &op],
        vec!["--json", "show", &op],
        vec!["-vvv", "show", &op, "--host", "target1"],
        // Errors that echo the user's input must mask it too.
        vec!["show", row],
        vec!["run", "target1", "--op", row, "--", "true"],
        vec!["show", &op, "--host", row],
    ] {
        let out = env.opmark_with_lab(lab).args(&args).output().unwrap();
        check(format!("`opmark {}` of row {n}", args[..2].join(" ")), out);
    }
    found
}
