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
