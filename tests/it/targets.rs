//! The lab itself: real sshd targets on loopback and in network namespaces, reachable
//! with the OpenSSH client through the generated ssh_config; cut/restore; restarts.

use crate::support::{self, text, Lab};

fn ssh_out(lab: &Lab, alias: &str, command: &str) -> std::process::Output {
    support::ssh(lab)
        .args(["-o", "ConnectTimeout=5", alias, command])
        .output()
        .expect("run ssh")
}

#[test]
fn loopback_targets_answer_through_generated_ssh_config_with_own_state_dir() {
    let Some(lab) = crate::loopback_lab!(3) else {
        return;
    };
    assert_eq!(lab.targets().len(), 3);
    for t in lab.targets() {
        let out = ssh_out(&lab, &t.alias, "echo hello-$XDG_STATE_HOME; id -un");
        assert!(out.status.success(), "{}: {}", t.alias, text(&out.stderr));
        let stdout = text(&out.stdout);
        let mut lines = stdout.lines();
        assert_eq!(
            lines.next(),
            Some(format!("hello-{}", t.state_home.display()).as_str())
        );
        assert_eq!(lines.next(), Some(t.user.as_str()));
        assert!(t.addr.is_loopback() && t.port != 22, "{t:?}");
        assert!(!t.state_home.starts_with("/tmp"));
    }
    let ports: std::collections::BTreeSet<u16> = lab.targets().iter().map(|t| t.port).collect();
    assert_eq!(ports.len(), 3, "distinct ports");
}
