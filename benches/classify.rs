//! Times classifying 10,000 command lines with the shipped policy (no criterion: a plain
//! main, so `cargo bench --bench classify` just prints the figures).

use std::hint::black_box;
use std::time::Instant;

use opmark::policy::Policy;

/// A mix of what agents send: simple reads, verbs of service and package tools,
/// pipelines, wrappers, substitutions, heredocs and a few unparseable lines.
const CORPUS: &[&str] = &[
    "ls -la /var/log",
    "systemctl status nginx",
    "sudo systemctl restart nginx",
    "journalctl -u nginx -n 100 --no-pager",
    "apt-get install -y nginx",
    "DEBIAN_FRONTEND=noninteractive apt-get -y upgrade",
    "docker ps -a --format '{{.Names}}'",
    "kubectl -n prod get pods -o wide",
    "git -C /srv/app pull --ff-only && systemctl reload app",
    "grep -i error /var/log/syslog | sort | uniq -c | sort -rn | head -20",
    "find /tmp -mtime +7 -name '*.tmp' -exec rm {} \\;",
    "curl -fsSL -X POST -H 'Content-Type: application/json' -d '{\"a\":1}' https://api.example.com/x",
    "echo \"$(date) deployed\" >> /var/log/deploy.log",
    "cat <<EOF > /etc/motd\nwelcome to $(hostname)\nEOF",
    "for f in /etc/nginx/sites-enabled/*; do nginx -t -c \"$f\" || exit 1; done",
    "if ! id deploy >/dev/null 2>&1; then useradd -m deploy; fi",
    "timeout 30s nice -n 10 rsync -a --delete /src/ /dst/",
    "psql -U app -d prod -c 'select count(*) from users'",
    "iptables -A INPUT -p tcp --dport 443 -j ACCEPT",
    "echo 'unterminated",
];

fn main() {
    let started = Instant::now();
    let policy = Policy::builtin();
    let load = started.elapsed();

    // A unique no-op command (`: run-N;`) in front of each line keeps brush-parser's small word cache
    // from flattering the figure with repeats.
    let n = 10_000;
    let commands: Vec<String> = (0..n)
        .map(|i| format!(": run-{i}; {}", CORPUS[i % CORPUS.len()]))
        .collect();
    let started = Instant::now();
    let mut destructive = 0usize;
    for command in &commands {
        let c = policy.classify(black_box(command));
        if c.family == opmark::family::Family::Destructive {
            destructive += 1;
        }
    }
    let took = started.elapsed();
    println!(
        "classified {n} commands in {:.3} s ({:.1} µs each; {destructive} destructive); built-in policy loaded in {:.1} ms",
        took.as_secs_f64(),
        took.as_secs_f64() * 1e6 / n as f64,
        load.as_secs_f64() * 1e3,
    );
}
