//! Command families: the shipped policy's verdicts on real command lines, the
//! classifier's invariants (proptest), and policy files that must be refused.

use std::path::PathBuf;
use std::process::Command;

use opmark::family::Family;
use opmark::policy::{AfterInterrupted, Policy, PolicyError};
use proptest::prelude::*;

const R: Family = Family::ReadOnly;
const C: Family = Family::Convergent;
const A: Family = Family::AppendOnly;
const D: Family = Family::Destructive;

/// Real-world command lines and the family the shipped policy must give them.
const TABLE: &[(&str, Family)] = &[
    // Quoting and operators inside quotes.
    ("echo '&& rm -rf /'", R),
    ("echo \"; rm -rf /\"", R),
    ("echo 'a | sh'", R),
    ("grep -r 'rm -rf' /etc", R),
    ("printf '%s\\n' '$(rm -rf /)'", R),
    ("echo \"$(rm -rf /tmp/x)\"", D),
    ("echo `reboot`", D),
    ("\\rm -f /tmp/x", D),
    ("'ls' -la", R),
    // coreutils and findutils.
    ("ls -la /var/log", R),
    ("cat /etc/os-release", R),
    ("head -n 50 /var/log/syslog", R),
    ("tail -f /var/log/nginx/access.log", R),
    ("df -h", R),
    ("du -sh /var/lib/docker", R),
    ("stat /etc/passwd", R),
    ("wc -l /etc/passwd", R),
    ("sha256sum /usr/bin/ssh", R),
    ("find / -name '*.conf'", R),
    ("find / -delete", D),
    ("find /tmp -mtime +7 -delete", D),
    ("find . -name '*.log' -exec rm {} \\;", D),
    ("find . -name '*.py' -exec grep -l TODO {} +", R),
    ("find /srv -type f -fprint /tmp/list", C),
    ("cp /etc/nginx/nginx.conf /etc/nginx/nginx.conf.bak", C),
    ("mkdir -p /opt/app/releases", C),
    ("ln -sfn /opt/app/releases/42 /opt/app/current", C),
    ("touch /var/run/app.flag", C),
    ("chmod 600 /root/.ssh/authorized_keys", C),
    ("chown -R www-data:www-data /var/www", C),
    ("rm -rf /var/tmp/build", D),
    ("mv /tmp/a /tmp/b", D),
    ("shred -u secret.txt", D),
    ("truncate -s 0 /var/log/app.log", C),
    ("tar -czf /backup/etc.tgz /etc", C),
    ("tar tzf backup.tgz", R),
    ("tar -xzf release.tgz -C /opt/app", C),
    ("tar --to-command=sh -xf x.tar", D),
    ("gzip -d -c access.log.gz", R),
    // Text tools.
    (
        "grep -i error /var/log/syslog | sort | uniq -c | sort -rn | head",
        R,
    ),
    ("awk '{print $1}' /var/log/nginx/access.log", R),
    ("awk 'BEGIN { system(\"rm -rf /\") }'", D),
    ("awk -F: '$3 > 1000 {print $1}' /etc/passwd", R),
    ("awk '{print $1 > \"/tmp/out\"}' f", D),
    ("awk '{print | \"sh\"}' f", D),
    ("awk 'BEGIN { \"date\" | getline d }'", D),
    ("sed -n '1,20p' /etc/hosts", R),
    ("sed -i 's/foo/bar/' /etc/app.conf", D),
    ("sort -o /tmp/sorted /tmp/in", C),
    ("jq '.items[].name' data.json", R),
    ("cut -d: -f1 /etc/passwd", R),
    // Redirections.
    ("cat x > /dev/null", R),
    ("ls missing 2>/dev/null", R),
    ("ls >/dev/null 2>&1", R),
    ("echo hello > /tmp/greeting", C),
    ("echo 'line' >> /var/log/app.log", A),
    ("date &>> /tmp/runs.log", A),
    ("uptime | tee -a /tmp/uptime.log", A),
    ("uptime | tee /tmp/uptime.txt", C),
    ("ps aux | tee /dev/null", R),
    ("> /tmp/emptied", C),
    ("echo 1 > /proc/sys/vm/drop_caches", C),
    ("cat image.iso > /dev/sdb", D),
    ("echo hi > /dev/tcp/10.0.0.1/9000", A),
    // Here-documents and here-strings.
    ("cat <<EOF\nhello\nEOF", R),
    ("cat <<'EOF'\n$(rm -rf /)\nEOF", R),
    ("cat <<EOF\n$(rm -rf /tmp/x)\nEOF", D),
    ("cat > /etc/motd <<EOF\nwelcome\nEOF", C),
    ("grep x <<< \"$(id)\"", R),
    // Process and system inspection.
    ("ps aux", R),
    ("pgrep -fl nginx", R),
    ("top -b -n 1", R),
    ("free -m", R),
    ("uptime", R),
    ("uname -a", R),
    ("id -u", R),
    ("lsof -i :443", R),
    ("dmesg -T | tail", R),
    ("dmesg -C", D),
    ("kill -0 1234", R),
    ("kill -9 1234", D),
    ("pkill -f worker", D),
    ("killall nginx", D),
    ("renice -n 10 -p 1234", C),
    ("fuser -k 80/tcp", D),
    ("hostname", R),
    ("hostname web-01", C),
    ("date +%s", R),
    ("date -s '2024-01-01 00:00'", C),
    ("sysctl net.ipv4.ip_forward", R),
    ("sysctl -w net.ipv4.ip_forward=1", C),
    // systemd and journald.
    ("systemctl status nginx", R),
    ("systemctl --no-pager status nginx", R),
    ("systemctl is-active nginx", R),
    ("systemctl list-units --failed", R),
    ("systemctl cat sshd", R),
    ("systemctl enable nginx", C),
    ("systemctl enable --now nginx", C),
    ("systemctl start nginx", C),
    ("systemctl stop nginx", C),
    ("systemctl daemon-reload", C),
    ("systemctl restart nginx", D),
    ("sudo systemctl restart nginx", D),
    ("systemctl kill nginx", D),
    ("service nginx status", R),
    ("service nginx restart", D),
    ("journalctl -u nginx -n 100 --no-pager", R),
    ("journalctl --since '1 hour ago'", R),
    ("journalctl --vacuum-time=7d", D),
    ("timedatectl", R),
    ("timedatectl set-timezone UTC", C),
    ("crontab -l", R),
    ("crontab -r", D),
    ("logger 'deploy finished'", A),
    // Package managers.
    ("apt list --installed", R),
    ("apt-cache policy nginx", R),
    ("apt-get update", C),
    ("apt-get install -y nginx", C),
    ("DEBIAN_FRONTEND=noninteractive apt-get install -y nginx", C),
    ("apt-get -s upgrade", R),
    ("apt-get remove -y nginx", C),
    ("dpkg -l | grep nginx", R),
    ("dpkg -i package.deb", C),
    ("dnf list installed", R),
    ("dnf check-update", R),
    ("dnf install -y httpd", C),
    ("yum info httpd", R),
    ("yum remove -y httpd", C),
    ("rpm -qa | grep kernel", R),
    ("apk info", R),
    ("apk add --no-cache curl", C),
    ("pip list", R),
    ("pip install requests==2.31.0", C),
    ("pip3 show requests", R),
    ("npm ls --depth=0", R),
    ("npm ci", C),
    ("npm publish", A),
    // Tests and builds: run again under a new op id with a warning, never held a day.
    ("pytest -q", C),
    ("python3 -m pytest -x tests/", C),
    ("make test", C),
    ("make -j4 check", C),
    ("cargo test --locked", C),
    ("go test ./...", C),
    ("npm test", C),
    ("npm run build", D),
    // Containers.
    ("docker ps -a", R),
    ("docker logs --tail 100 web", R),
    ("docker inspect web", R),
    ("docker image ls", R),
    ("docker pull nginx:1.25", C),
    ("docker start web", C),
    ("docker stop web", C),
    ("docker restart web", D),
    ("docker rm -f web", D),
    ("docker exec web ls", D),
    ("docker run --rm alpine echo hi", D),
    ("docker system prune -af", D),
    ("docker compose ps", R),
    ("docker compose up -d", C),
    ("docker compose down", C),
    ("docker compose down -v", D),
    ("docker-compose -f prod.yml logs web", R),
    ("podman ps", R),
    // Kubernetes.
    ("kubectl get pods -A", R),
    ("kubectl -n prod get deploy", R),
    ("kubectl describe pod web-1", R),
    ("kubectl logs -f deploy/web", R),
    ("kubectl apply -f deploy.yaml", C),
    ("kubectl scale deploy/web --replicas=3", C),
    ("kubectl rollout status deploy/web", R),
    ("kubectl rollout restart deploy/web", D),
    ("kubectl delete pod web-1", D),
    ("kubectl exec -it web-1 -- sh", D),
    ("helm list -A", R),
    ("helm upgrade --install web ./chart", C),
    ("helm install status ./chart", C),
    // git.
    ("git status", R),
    ("git log --oneline -n 20", R),
    ("git -C /srv/app diff", R),
    ("git fetch origin", R),
    ("git fetch origin main:main", C),
    ("git pull --ff-only", C),
    ("git push origin main", C),
    ("git push --force origin main", D),
    ("git push origin :old-branch", D),
    ("git checkout main", C),
    ("git checkout -- config.yml", D),
    ("git reset --hard origin/main", D),
    ("git clean -fdx", D),
    ("git commit -am 'fix'", A),
    ("git branch", R),
    ("git branch -D old", D),
    ("git stash list", R),
    ("git remote -v", R),
    ("git remote add upstream https://example.com/x.git", C),
    ("git push https://example.com/x.git main", C),
    ("git config --get user.email", R),
    ("git config user.email a@b", C),
    // Databases.
    ("psql -c 'select count(*) from users'", R),
    ("psql -U app -d prod -c 'SELECT 1'", R),
    ("psql -c 'select 1; drop table users'", D),
    ("psql -c 'delete from sessions'", D),
    ("psql -f migrate.sql", D),
    ("psql -l", R),
    ("mysql -e 'show databases'", R),
    ("mysql -e 'update users set admin=1'", D),
    ("sqlite3 app.db '.tables'", R),
    ("pg_dump prod", R),
    ("pg_dump -f /backup/prod.sql prod", C),
    ("redis-cli ping", R),
    ("redis-cli -h cache get session:1", R),
    ("redis-cli set feature:x on", C),
    ("redis-cli incr counter", A),
    ("redis-cli del session:1", D),
    // Network inspection and configuration.
    ("ss -tlnp", R),
    ("netstat -tulpn", R),
    ("ip addr", R),
    ("ip -br a", R),
    ("ip route get 1.1.1.1", R),
    ("ip link set eth0 up", C),
    ("ip route del default", D),
    ("ping -c 3 10.0.0.1", R),
    ("dig +short example.com", R),
    ("curl -sS https://example.com/health", R),
    ("curl -X POST https://api.example.com/deploy", A),
    ("curl -d 'a=1' https://api.example.com/items", A),
    ("curl -X DELETE https://api.example.com/items/1", D),
    ("curl -X PUT -d @cfg.json https://api.example.com/cfg", C),
    (
        "curl -fsSLo /usr/local/bin/tool https://example.com/tool",
        C,
    ),
    ("curl -fsSL https://get.example.com | sh", D),
    ("curl -fsSL https://get.example.com | sudo bash", D),
    ("wget -qO- https://example.com", R),
    ("wget https://example.com/file.tgz", C),
    ("iptables -L -n", R),
    ("iptables -nvL", R),
    ("iptables -A INPUT -p tcp --dport 22 -j ACCEPT", A),
    ("iptables -D INPUT 3", D),
    ("iptables -P INPUT DROP", C),
    ("nft list ruleset", R),
    ("nginx -t", R),
    ("nginx -s reload", C),
    ("ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub", R),
    ("wipefs /dev/sdb", R),
    ("wipefs -a /dev/sdb", D),
    ("ufw status", R),
    ("ufw allow 22/tcp", C),
    ("nmcli con show", R),
    ("nmcli con up id office", C),
    ("nmcli con add type ethernet ifname eth1", A),
    // File transfer.
    ("scp app.tgz web:/tmp/", C),
    ("rsync -av /src/ /dst/", C),
    ("rsync -avn /src/ /dst/", R),
    ("rsync -av --delete /src/ /dst/", D),
    ("rclone ls remote:bucket", R),
    ("rclone sync /data remote:bucket", D),
    ("aws s3 ls s3://bucket", R),
    ("aws ec2 describe-instances --region eu-west-1", R),
    ("aws s3 cp file s3://bucket/file", C),
    ("aws s3 rm s3://bucket/file", D),
    // Users and permissions.
    ("useradd -m deploy", C),
    ("usermod -aG docker deploy", C),
    ("userdel deploy", D),
    ("passwd -S root", R),
    ("getent passwd deploy", R),
    ("sudo -l", R),
    ("setfacl -m u:deploy:rx /srv", C),
    // Filesystems and disks.
    ("lsblk", R),
    ("mount", R),
    ("mount /dev/sdb1 /mnt", C),
    ("umount /mnt", C),
    ("swapon /swapfile", C),
    ("losetup /dev/loop0 disk.img", C),
    ("lvs", R),
    ("lvextend -L +10G /dev/vg0/data", A),
    ("lvextend -L 50G /dev/vg0/data", C),
    ("resize2fs /dev/vg0/data", C),
    ("fsck -y /dev/sdb1", D),
    ("fdisk -l", R),
    ("parted /dev/sdb mklabel gpt", D),
    ("mkfs.ext4 /dev/sdb1", D),
    ("dd if=/dev/zero of=/dev/sdb bs=1M", D),
    ("smartctl -a /dev/sda", R),
    // Wrappers and environment.
    ("FOO=1 ls", R),
    ("FOO=1 BAR=2 rm x", D),
    ("env", R),
    ("env -i PATH=/usr/bin ls", R),
    ("env FOO=bar apt-get update", C),
    ("sudo -u postgres psql -c 'select 1'", R),
    ("sudo -E -u deploy -- git pull", C),
    ("nice -n 19 tar -czf /backup/x.tgz /srv", C),
    ("nice -10 ls", R),
    ("timeout 30s curl -sS https://example.com", R),
    ("timeout -s KILL 5 rm -rf /tmp/x", D),
    ("nohup rm -rf /tmp/cache &", D),
    ("ionice -c3 du -sh /", R),
    ("stdbuf -oL tail -f log", R),
    ("time ls", R),
    ("ls | xargs rm", D),
    ("ls | xargs -n1 echo", R),
    ("find . -print0 | xargs -0 -I{} cp {} /backup/", C),
    ("xargs", R),
    ("command -v docker", R),
    ("PATH=$PATH:/usr/sbin iptables -L", R),
    ("PATH=/tmp/evil ls", D),
    ("LD_PRELOAD=/tmp/x.so ls", D),
    ("env LD_PRELOAD=/tmp/x.so ls", D),
    ("export PATH=/tmp/evil; ls", D),
    ("export FOO=bar; ls", R),
    ("alias ls='rm -rf /tmp/x'\nls", D),
    ("alias", R),
    // Dynamic: never less than destructive.
    ("$(echo rm) -rf /", D),
    ("`which rm` -rf /tmp/x", D),
    ("$CMD --version", D),
    ("\"$EDITOR\" /etc/hosts", D),
    ("{rm,-rf,/tmp/x}", D),
    ("/bin/r? -rf x", D),
    ("eval \"$(ssh-agent)\"", D),
    ("sh -c 'ls'", R),
    ("bash script.sh", D),
    ("bash -c \"echo hi\"", R),
    ("source /etc/profile", D),
    (". ./venv/bin/activate", D),
    ("exec nginx -g 'daemon off;'", D),
    ("sudo sh -c 'echo 1 > /proc/sys/vm/drop_caches'", C),
    ("env -S 'ls -l'", D),
    ("watch -n1 ls", R),
    ("trap 'rm -f /tmp/lock' EXIT", D),
    ("python3 -c 'print(1)'", D),
    ("python3 --version", R),
    // Compound commands: the most dangerous part wins.
    ("ls && rm -rf /tmp/x", D),
    ("ls || echo missing", R),
    ("ls; echo done", R),
    ("cd /srv/app && git pull && systemctl reload app", C),
    ("(cd /tmp && ls)", R),
    ("{ echo a; echo b; } > /tmp/out", C),
    ("{ date; uptime; } >> /var/log/status.log", A),
    (
        "if systemctl is-active -q nginx; then echo up; else systemctl start nginx; fi",
        C,
    ),
    ("for f in /etc/*.conf; do cat \"$f\"; done", R),
    ("for h in a b; do ssh $h uptime; done", D),
    ("while read l; do echo \"$l\"; done < /etc/hosts", R),
    (
        "case $1 in start) systemctl start x;; stop) systemctl stop x;; esac",
        C,
    ),
    // A call is the stricter of the body and the program of that name (the definition
    // may not have run).
    ("ls() { cat /etc/hosts; }; ls", R),
    ("ls() { rm -rf /tmp/x; }; ls", D),
    ("f() { ls; }; f", D),
    ("f() { rm -rf /tmp/x; }; f", D),
    (":(){ :|:& };:", D),
    ("ls $(rm -rf /tmp/x)", D),
    ("x=$(date)", R),
    ("x=$(rm -rf /tmp/x)", D),
    ("diff <(ls /a) <(ls /b)", R),
    ("diff <(ls /a) <(rm /b)", D),
    ("[[ -f /etc/passwd ]] && echo yes", R),
    ("test -d /srv || mkdir /srv", C),
    ("", R),
    ("# rm -rf /", R),
    // Unparseable: destructive.
    ("echo \"unterminated", D),
    ("ls (", D),
    ("if then fi", D),
];

#[test]
fn shipped_policy_classifies_real_command_lines() {
    assert!(TABLE.len() >= 150, "the table has {} rows", TABLE.len());
    let policy = Policy::builtin();
    let mut wrong = Vec::new();
    for (command, expected) in TABLE {
        let c = policy.classify(command);
        if c.family != *expected {
            wrong.push(format!(
                "{command:?}: expected {expected}, got {} via {:?}",
                c.family,
                c.parts
                    .iter()
                    .map(|p| (&p.command, p.family, &p.rule))
                    .collect::<Vec<_>>()
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "{} misclassified:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
}

#[test]
fn parts_name_the_rule_that_decided_them() {
    let policy = Policy::builtin();
    let c = policy.classify("ls | frobnicate");
    assert_eq!(c.parts.len(), 2);
    assert_eq!(c.parts[0].command, "ls");
    assert!(
        c.parts[0]
            .rule
            .starts_with("built-in command-classes.toml rule #"),
        "{}",
        c.parts[0].rule
    );
    assert_eq!(c.parts[1].rule, "no rule: default_family");
    assert_eq!(c.parts[1].family, Family::Destructive);
}

#[test]
fn unparseable_command_is_destructive_and_shows_the_parse_error() {
    let c = Policy::builtin().classify("echo 'unterminated");
    assert_eq!(c.family, Family::Destructive);
    let e = c.parse_error.expect("a parse error");
    assert!(e.contains("quote"), "{e}");
    // Its parts could not be checked against deny/approval rules: a human decides.
    assert!(c.approval.unwrap().contains("unparseable"));
}

#[test]
fn deny_and_approval_rules_mark_the_whole_command() {
    let policy = Policy::builtin();
    let c = policy.classify("ls && rm -rf /");
    assert!(c.deny.is_some(), "{c:?}");
    let c = policy.classify("echo ok; sudo reboot");
    assert!(c.approval.is_some(), "{c:?}");
    assert!(c.deny.is_none());
    let c = policy.classify("echo 'rm -rf /'");
    assert!(c.deny.is_none() && c.approval.is_none());
}

/// Spellings of "remove everything" that the shipped deny rule must catch, however the
/// path is written.
const DENIED_REMOVALS: &[&str] = &[
    "rm -rf /",
    "rm -rf /.",
    "rm -rf //",
    "rm -rf /./",
    "rm -rf ///.//",
    "rm -rf /..",
    "rm -rf /tmp/../",
    "rm -fr /*",
    "rm -fr //*",
    "rm -r -f /",
    "rm -R --force /",
    "rm -rf \"/\"",
    "rm -rf '/.'",
    "rm -rf -- /.",
    "rm -rf /etc/",
    "rm -rf /etc/.",
    "rm -rf //usr//",
    "rm -rf /var/tmp/..",
    "rm -rf ~",
    "rm -rf ~/",
    "rm -rf ~/.",
    "rm -rf \"$HOME\"/",
    "rm -rf ${HOME}",
    "rm /. -rf",
    "sudo rm -rf /.",
    "cd /srv && rm -rf /./",
];

#[test]
fn every_spelling_of_removing_the_root_or_a_system_directory_is_denied() {
    let policy = Policy::builtin();
    let passed: Vec<&str> = DENIED_REMOVALS
        .iter()
        .copied()
        .filter(|command| policy.classify(command).deny.is_none())
        .collect();
    assert!(passed.is_empty(), "not denied: {passed:?}");
}

#[test]
fn removing_ordinary_paths_that_only_look_like_the_root_is_not_denied() {
    let policy = Policy::builtin();
    for command in [
        "rm -rf /tmp/build",
        "rm -rf /var/tmp/build/",
        "rm -rf /srv/app/releases/41",
        "rm -rf ~/.cache/pip",
        "rm -rf ./",
        "rm -f /etc/nginx/sites-enabled/default",
        "rm -rf /home/bob/tmp/..",
    ] {
        let c = policy.classify(command);
        assert!(c.deny.is_none(), "{command}: {c:?}");
        assert_eq!(c.family, D, "{command}");
    }
}

#[test]
fn a_plain_path_never_makes_a_command_milder() {
    // `cat /etc/./passwd` reads as before; the plain form is only a second look.
    let policy = Policy::builtin();
    assert_eq!(policy.classify("cat /etc/./passwd").family, R);
    assert_eq!(policy.classify("ls //srv/").family, R);
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/policy")
        .join(name)
}

fn load_err(name: &str) -> (PolicyError, String) {
    let err = Policy::load(Some(&fixture(name))).expect_err("the fixture must be refused");
    let message = err.to_string();
    (err, message)
}

/// Every refusal names the file, the line and the key, and says how to fix it.
fn assert_names(name: &str, line: usize, key: &str, problem: &str) {
    let (err, message) = load_err(name);
    assert!(message.contains(name), "{message}");
    assert_eq!(err.line(), Some(line), "{message}");
    assert_eq!(err.key(), Some(key), "{message}");
    assert!(message.contains(&format!("line {line}")), "{message}");
    assert!(message.contains(problem), "{message}");
    assert!(message.contains("fix:"), "{message}");
}

#[test]
fn unknown_key_is_refused_naming_file_line_and_key() {
    assert_names(
        "unknown_key.toml",
        4,
        "families.read-only.atempts",
        "unknown field `atempts`",
    );
}

#[test]
fn bad_family_name_is_refused() {
    assert_names(
        "bad_family.toml",
        24,
        "rule[2].family",
        "unknown family `safe`",
    );
    assert_names(
        "bad_default_family.toml",
        1,
        "default_family",
        "unknown family `safe`",
    );
}

#[test]
fn bad_regex_is_refused() {
    assert_names("bad_regex.toml", 21, "rule[1].pattern", "invalid regex");
}

#[test]
fn missing_default_family_is_refused() {
    assert_names(
        "missing_default_family.toml",
        1,
        "default_family",
        "missing key",
    );
}

#[test]
fn missing_family_table_is_refused() {
    let (err, message) = load_err("missing_family_table.toml");
    assert_eq!(err.key(), Some("families.append-only"), "{message}");
    assert!(message.contains("missing_family_table.toml"), "{message}");
    assert!(message.contains("[families.append-only]"), "{message}");
}

#[test]
fn zero_attempts_is_refused() {
    assert_names(
        "zero_attempts.toml",
        12,
        "families.append-only.attempts",
        "attempts = 0",
    );
}

#[test]
fn wrong_type_is_refused() {
    assert_names(
        "wrong_type.toml",
        4,
        "families.read-only.attempts",
        "invalid type",
    );
}

#[test]
fn bad_duration_and_toml_syntax_are_refused() {
    assert_names(
        "bad_retention.toml",
        19,
        "families.destructive.min_retention",
        "forever",
    );
    let (err, message) = load_err("toml_syntax.toml");
    assert_eq!(err.line(), Some(1), "{message}");
}

#[test]
fn missing_policy_file_is_a_read_error_naming_the_path() {
    let err = Policy::load(Some(&fixture("nope.toml"))).unwrap_err();
    assert!(matches!(err, PolicyError::Read { .. }));
    assert!(err.to_string().contains("nope.toml"));
}

#[test]
fn custom_policy_applies_its_defaults_rules_and_extras() {
    let p = Policy::load(Some(&fixture("valid_custom.toml"))).unwrap();
    assert!(p.origin().ends_with("valid_custom.toml"));
    assert_eq!(p.classify("frobnicate").family, Family::Convergent);
    assert_eq!(p.classify("ls -l").family, Family::ReadOnly);
    let c = p.classify("ls; rm x");
    assert_eq!(c.family, Family::Destructive);
    assert!(
        c.deny
            .as_deref()
            .unwrap()
            .ends_with("valid_custom.toml rule #2"),
        "{c:?}"
    );
    let c = p.classify("kill 1");
    assert!(c.approval.as_deref().unwrap().ends_with("rule #3"), "{c:?}");
    assert_eq!(
        p.family(Family::Destructive).min_retention.as_secs(),
        90 * 86400
    );
    // Families without min_retention get the documented default.
    assert_eq!(p.family(Family::ReadOnly).min_retention.as_secs(), 86400);
    assert_eq!(
        p.family(Family::AppendOnly).after_interrupted,
        AfterInterrupted::Block
    );
    assert!(p.redact_patterns()[0].is_match("tok_abc123"));
}

fn opmark_without_user_policy(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_opmark"))
        .args(args)
        .env_remove("OPMARK_POLICY")
        .env("XDG_CONFIG_HOME", fixture("no-such-config-dir"))
        .output()
        .expect("run opmark")
}

#[test]
fn binary_refuses_bad_policy_with_config_exit_code() {
    let bad = fixture("unknown_key.toml");
    let out =
        opmark_without_user_policy(&["--policy", bad.to_str().unwrap(), "classify", "--", "ls"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(246), "{stderr}");
    assert!(stderr.contains("unknown_key.toml"), "{stderr}");
    assert!(stderr.contains("families.read-only.atempts"), "{stderr}");
    assert!(out.stdout.is_empty());
}

#[test]
fn binary_classify_json_reports_parts_and_deny() {
    let out =
        opmark_without_user_policy(&["--json", "classify", "--", "ls", "&&", "rm", "-rf", "/"]);
    assert_eq!(out.status.code(), Some(0));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("one JSON document");
    assert_eq!(v["family"], "destructive");
    assert_eq!(v["parts"][0]["command"], "ls");
    assert_eq!(v["parts"][0]["family"], "read-only");
    assert_eq!(v["parts"][1]["command"], "rm -rf /");
    assert!(v["deny"].as_str().unwrap().contains("rule #"), "{v}");
    assert!(v["approval"].is_null());
    assert!(v.get("parse_error").is_none());
}

#[test]
fn binary_classify_text_shows_family_rule_and_parse_error() {
    let out = opmark_without_user_policy(&["classify", "--", "echo", "'oops"]);
    assert_eq!(out.status.code(), Some(0));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.starts_with("destructive: echo 'oops"), "{stdout}");
    assert!(stdout.contains("parse error:"), "{stdout}");

    let out = opmark_without_user_policy(&["classify", "--", "systemctl", "status", "nginx"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        stdout.starts_with("read-only: systemctl status nginx"),
        "{stdout}"
    );
    assert!(
        stdout.contains("built-in command-classes.toml rule #"),
        "{stdout}"
    );
}

#[test]
fn user_policy_file_is_used_when_no_policy_is_given() {
    let dir = std::env::temp_dir().join(format!("opmark-policy-user-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("opmark")).unwrap();
    std::fs::copy(
        fixture("valid_custom.toml"),
        dir.join("opmark/command-classes.toml"),
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_opmark"))
        .args(["--json", "classify", "--", "frobnicate"])
        .env_remove("OPMARK_POLICY")
        .env("XDG_CONFIG_HOME", &dir)
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["family"], "convergent", "{v}");
}

// ---- properties --------------------------------------------------------------------

/// Words a generated command may use: programs of every family, wrappers, dynamic
/// forms, and quoted text that holds shell operators.
fn word() -> impl Strategy<Value = String> {
    prop_oneof![
        prop::sample::select(vec![
            "ls",
            "cat",
            "rm",
            "-rf",
            "/tmp/x",
            "systemctl",
            "restart",
            "status",
            "nginx",
            "git",
            "push",
            "fetch",
            "tee",
            "-a",
            "sudo",
            "env",
            "xargs",
            "timeout",
            "5",
            "apt-get",
            "install",
            "curl",
            "-X",
            "POST",
            "echo",
            "find",
            "-delete",
            "eval",
            "sh",
            "-c",
            "$x",
            "$(rm x)",
            "`id`",
            "'&& rm -rf /'",
            "\"a;b\"",
            "FOO=1",
            "iptables",
            "-A",
            "docker",
            "run",
            "kubectl",
            "get",
            "reboot",
            "unknownprog",
        ])
        .prop_map(str::to_string),
        "[a-z]{1,6}",
        "'[a-z &|;<>()$]{0,8}'",
    ]
}

fn simple_command() -> impl Strategy<Value = String> {
    (
        prop::collection::vec(word(), 1..5),
        prop::sample::select(vec![
            "",
            " > /tmp/o",
            " >> /tmp/o",
            " 2>/dev/null",
            " < /etc/hosts",
        ]),
    )
        .prop_map(|(words, redirect)| format!("{}{redirect}", words.join(" ")))
}

/// Well-formed commands: simple ones, combined and nested.
fn command() -> impl Strategy<Value = String> {
    simple_command().prop_recursive(3, 12, 3, |inner| {
        prop_oneof![
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} | {b}")),
            (inner.clone(), inner.clone()).prop_map(|(a, b)| format!("{a} && {b}")),
            inner.clone().prop_map(|a| format!("( {a} )")),
            inner.clone().prop_map(|a| format!("{{ {a}; }}")),
            inner.clone().prop_map(|a| format!("echo \"$({a})\"")),
            inner.clone().prop_map(|a| format!("if true; then {a}; fi")),
            inner.clone().prop_map(|a| format!("g() {{ {a}; }}; g")),
            inner.clone().prop_map(|a| format!("FOO=1 {a}")),
            inner
                .clone()
                .prop_map(|a| format!("for i in 1 2; do {a}; done")),
            inner.prop_map(|a| format!("cat <<EOF\n$({a})\nEOF\n")),
        ]
    })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: std::env::var("PROPTEST_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256), ..ProptestConfig::default() })]

    #[test]
    fn classifier_never_panics_on_arbitrary_input(s in "\\PC{0,80}") {
        let _ = Policy::builtin().classify(&s);
    }

    #[test]
    fn classifier_never_panics_on_shell_like_input(s in "[a-z $`'\"\\\\(){}\\[\\]|&;<>=*?!#~\n-]{0,60}") {
        let c = Policy::builtin().classify(&s);
        if c.parse_error.is_some() {
            prop_assert_eq!(c.family, Family::Destructive);
        }
    }

    #[test]
    fn compound_is_never_less_strict_than_its_parts(
        a in command(),
        b in command(),
        op in prop::sample::select(vec![" ; ", " && ", " || ", " | ", "\n"]),
    ) {
        let policy = Policy::builtin();
        let ca = policy.classify(&a);
        let cb = policy.classify(&b);
        let whole = policy.classify(&format!("{a}{op}{b}"));
        prop_assert!(whole.family >= ca.family, "{:?} < {:?} for {:?}", whole.family, ca.family, a);
        prop_assert!(whole.family >= cb.family, "{:?} < {:?} for {:?}", whole.family, cb.family, b);
        prop_assert!(whole.deny.is_some() || (ca.deny.is_none() && cb.deny.is_none()));
        prop_assert!(whole.approval.is_some() || (ca.approval.is_none() && cb.approval.is_none()));
    }
}

/// One row of the evasion table in docs/trust.md: the command as written there (code span,
/// `\|` for a pipe, `⏎` for a newline) and the answers it must get.
struct Evasion {
    command: String,
    family: Family,
    denied: bool,
    needs_approval: bool,
}

fn evasion_table() -> Vec<Evasion> {
    let doc = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/trust.md"),
    )
    .unwrap();
    let section = doc
        .split("\n## Evasion table\n")
        .nth(1)
        .expect("docs/trust.md has an `## Evasion table` section");
    let section = section.split("\n## ").next().unwrap();
    let mut rows = Vec::new();
    for line in section.lines().filter(|l| l.starts_with("| ")) {
        // Split on the table's own bars, not on the escaped ones inside commands.
        let cells: Vec<String> = line
            .replace("\\|", "\u{1}")
            .split('|')
            .map(|c| c.trim().replace('\u{1}', "|"))
            .collect();
        if cells.len() != 7 || cells[1] == "kind" {
            continue;
        }
        let span = &cells[2];
        let command = span
            .strip_prefix("`` ")
            .and_then(|s| s.strip_suffix(" ``"))
            .or_else(|| span.strip_prefix('`').and_then(|s| s.strip_suffix('`')))
            .unwrap_or_else(|| panic!("not a code span: {span}"))
            .replace('⏎', "\n");
        let family = match cells[3].as_str() {
            "read-only" => R,
            "convergent" => C,
            "append-only" => A,
            "destructive" => D,
            other => panic!("unknown family {other:?} in: {line}"),
        };
        rows.push(Evasion {
            command,
            family,
            denied: cells[4] == "denied",
            needs_approval: cells[5] == "needs approval",
        });
    }
    rows
}

#[test]
fn every_row_of_the_evasion_table_holds() {
    let rows = evasion_table();
    assert!(
        rows.len() >= 40,
        "the evasion table has only {} rows",
        rows.len()
    );
    let policy = Policy::builtin();
    let mut wrong = Vec::new();
    for row in &rows {
        let c = policy.classify(&row.command);
        let got = (c.family, c.deny.is_some(), c.approval.is_some());
        if got != (row.family, row.denied, row.needs_approval) {
            wrong.push(format!(
                "{:?}: the table says {} deny={} approval={}, the classifier {} deny={:?} approval={:?}",
                row.command, row.family, row.denied, row.needs_approval, c.family, c.deny, c.approval
            ));
        }
    }
    assert!(
        wrong.is_empty(),
        "docs/trust.md#evasion-table rows that do not hold:\n{}",
        wrong.join("\n")
    );
    // The table must hold the three wrappers of the issue that brought it, each refused or
    // held, and rows of every outcome, so that it cannot pass by listing easy cases only.
    for wrapped in [
        "sh -c 'rm -rf /'",
        "bash -c 'mkfs.ext4 /dev/sdb'",
        "eval reboot",
    ] {
        let row = rows.iter().find(|r| r.command == wrapped).expect(wrapped);
        assert!(
            row.denied || row.needs_approval,
            "{wrapped} is neither denied nor held"
        );
    }
    assert!(rows.iter().any(|r| r.denied));
    assert!(rows.iter().any(|r| r.needs_approval && !r.denied));
    assert!(rows.iter().any(|r| !r.denied && !r.needs_approval));
}

#[test]
fn a_wrapper_without_a_rule_inside_is_as_mild_as_its_command_and_says_where_it_looked() {
    let policy = Policy::builtin();
    let c = policy.classify("sudo -u app sh -c 'eval \"ls -la /srv\"'");
    assert_eq!(c.family, R, "{c:?}");
    assert!(c.deny.is_none() && c.approval.is_none(), "{c:?}");
    assert!(
        c.parts[0].rule.ends_with("(inside `eval` inside `sh -c`)"),
        "{:?}",
        c.parts
    );
    // Nine wrappers deep is past the bound: the innermost text is not followed.
    let mut nested = "reboot".to_string();
    for _ in 0..9 {
        nested = format!("eval {}", shell_quote(&nested));
    }
    let c = policy.classify(&nested);
    assert_eq!(c.family, D);
    assert!(
        c.approval
            .as_deref()
            .is_some_and(|a| a.contains("more than 8 deep")),
        "{:?}",
        c.approval
    );
}

fn shell_quote(text: &str) -> String {
    format!("'{}'", text.replace('\'', r"'\''"))
}
