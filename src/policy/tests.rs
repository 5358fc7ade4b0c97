//! Unit tests of policy loading and validation; the classifier's table lives in
//! tests/it/policy.rs.

use super::*;

#[test]
fn builtin_policy_parses_and_has_the_documented_defaults() {
    let p = Policy::parse(BUILTIN_TEXT, BUILTIN_ORIGIN).unwrap();
    assert_eq!(p.default_family(), Family::Destructive);
    assert_eq!(p.family(Family::ReadOnly).attempts, 3);
    assert_eq!(
        p.family(Family::ReadOnly).after_interrupted,
        AfterInterrupted::Rerun
    );
    assert_eq!(p.family(Family::Convergent).attempts, 3);
    assert_eq!(p.family(Family::AppendOnly).attempts, 1);
    assert_eq!(
        p.family(Family::AppendOnly).after_interrupted,
        AfterInterrupted::Block
    );
    assert_eq!(p.family(Family::Destructive).attempts, 1);
    assert_eq!(
        p.family(Family::Destructive).after_interrupted,
        AfterInterrupted::Block
    );
    assert!(!p.redact_patterns().is_empty());
}

#[test]
fn every_shipped_rule_has_a_name() {
    let p = Policy::builtin();
    let unnamed: Vec<usize> = p
        .rules
        .iter()
        .filter(|r| r.name.is_none())
        .map(|r| r.index)
        .collect();
    assert!(unnamed.is_empty(), "rules without a name: {unnamed:?}");
    let ls = p.classify("ls /srv");
    assert_eq!(
        ls.parts[0].rule,
        "built-in command-classes.toml rule #12 (file-readers)"
    );
}

/// Runs `f` on a thread with a 2 MiB stack, the size of tokio workers and test threads.
fn on_small_stack(f: impl FnOnce() + Send + 'static) {
    std::thread::Builder::new()
        .stack_size(2 * 1024 * 1024)
        .spawn(f)
        .unwrap()
        .join()
        .expect("classification must not overflow a 2 MiB stack");
}

#[test]
fn hostile_nesting_and_long_chains_do_not_overflow_the_stack() {
    on_small_stack(|| {
        let p = Policy::builtin();
        for text in [
            format!("{}ls{}", "(".repeat(10_000), ")".repeat(10_000)),
            format!("{}ls{}", "( ".repeat(60), " )".repeat(60)),
            format!("{}ls{}", "{ ".repeat(60), "; }".repeat(60)),
            format!("echo {}ls{}", "$(echo ".repeat(60), ")".repeat(60)),
            format!("echo {}ls{}", "\"$(echo ".repeat(30), ")\"".repeat(30)),
            vec!["ls"; 5_000].join(" | "),
            vec!["ls"; 5_000].join(" && "),
            vec!["ls"; 5_000].join("; "),
            format!("ls {}", "a ".repeat(50_000)),
            format!("{}ls{}", "if true; then ".repeat(60), "; fi".repeat(60)),
        ] {
            let c = p.classify(&text);
            assert!(c.family >= Family::ReadOnly);
        }
    });
}
