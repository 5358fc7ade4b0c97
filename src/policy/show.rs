//! The checked policy written back out, for `opmark policy show`: as TOML that loads
//! back to an equal [`Policy`] (so it can be copied and edited), and as a serde value
//! for `--json`. Defaults the file left out (`min_retention`, `repeat_window`, `on_repeat`) are written explicitly:
//! this is the policy in effect, not the file as typed.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::Serialize;

use super::{AfterInterrupted, FamilyPolicy, OnRepeat, Policy, Rule};
use crate::family::Family;

/// The policy as a document with the same keys as `command-classes.toml`.
#[derive(Debug, Serialize)]
pub struct PolicyDocument {
    default_family: Family,
    escalate_after: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    approvers: Option<String>,
    redact: Vec<String>,
    families: BTreeMap<&'static str, FamilyDocument>,
    rule: Vec<RuleDocument>,
}

#[derive(Debug, Serialize)]
struct FamilyDocument {
    attempts: u32,
    after_interrupted: AfterInterrupted,
    min_retention: String,
    repeat_window: String,
    on_repeat: OnRepeat,
}

#[derive(Debug, Serialize)]
struct RuleDocument {
    #[serde(skip_serializing_if = "Option::is_none")]
    name: Option<String>,
    family: Family,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    programs: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pattern: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    deny: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    approval: Option<&'static str>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    locks: Vec<String>,
}

impl Policy {
    /// The policy as plain data, keys as in the policy file.
    pub fn document(&self) -> PolicyDocument {
        PolicyDocument {
            default_family: self.default_family,
            escalate_after: duration_text(self.escalate_after),
            approvers: self.approvers.as_ref().map(|p| p.display().to_string()),
            redact: self.redact.iter().map(|r| r.as_str().to_owned()).collect(),
            families: Family::ALL
                .iter()
                .map(|&f| (f.as_str(), family_document(self.family(f))))
                .collect(),
            rule: self.rules.iter().map(rule_document).collect(),
        }
    }

    /// The policy as a TOML policy file; `Policy::parse` of it gives an equal policy.
    pub fn to_toml(&self) -> String {
        // Serialising plain strings, numbers and tables cannot fail.
        toml::to_string(&self.document())
            .unwrap_or_else(|e| unreachable!("a policy document is always TOML: {e}"))
    }
}

fn family_document(f: &FamilyPolicy) -> FamilyDocument {
    FamilyDocument {
        attempts: f.attempts,
        after_interrupted: f.after_interrupted,
        min_retention: duration_text(f.min_retention),
        repeat_window: duration_text(f.repeat_window),
        on_repeat: f.on_repeat,
    }
}

fn rule_document(r: &Rule) -> RuleDocument {
    RuleDocument {
        name: r.name.clone(),
        family: r.family,
        programs: r.programs.clone(),
        pattern: r.pattern.as_ref().map(|p| p.as_str().to_owned()),
        deny: r.deny,
        approval: r.approval.then_some("always"),
        locks: r.locks.iter().map(ToString::to_string).collect(),
    }
}

/// The duration in the largest unit that states it exactly, as `parse_duration` reads.
fn duration_text(d: Duration) -> String {
    crate::duration::format_duration(d)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::{BUILTIN_ORIGIN, BUILTIN_TEXT};

    #[test]
    fn the_printed_builtin_policy_loads_back_to_an_equal_policy() {
        let builtin = Policy::builtin();
        let printed = builtin.to_toml();
        let loaded = Policy::parse(&printed, "printed.toml").unwrap();
        assert!(loaded == builtin, "round trip changed the policy");
        assert!(!loaded.is_builtin());
        assert!(Policy::parse(BUILTIN_TEXT, BUILTIN_ORIGIN).unwrap() == builtin);
    }

    #[test]
    fn a_user_policy_with_unnamed_rules_and_defaults_round_trips() {
        let text = r#"
default_family = "convergent"
[families.read-only]
attempts = 2
after_interrupted = "rerun"
[families.convergent]
attempts = 1
after_interrupted = "block"
min_retention = "90m"
[families.append-only]
attempts = 1
after_interrupted = "block"
[families.destructive]
attempts = 1
after_interrupted = "block"
min_retention = "1500ms"
[[rule]]
family = "read-only"
programs = ["ls"]
[[rule]]
name = "no-reboot"
family = "destructive"
pattern = '^reboot( |$)\d*'
deny = true
approval = "always"
"#;
        let policy = Policy::parse(text, "mine.toml").unwrap();
        let printed = policy.to_toml();
        assert!(printed.contains("min_retention = \"90m\""), "{printed}");
        assert!(printed.contains("min_retention = \"1500ms\""), "{printed}");
        let loaded = Policy::parse(&printed, "again.toml").unwrap();
        assert!(loaded == policy, "{printed}");
        // And a different policy is not equal: the comparison can fail.
        let other = Policy::parse(&text.replace("attempts = 2", "attempts = 3"), "x").unwrap();
        assert!(other != policy);
    }

    #[test]
    fn durations_are_written_in_their_largest_exact_unit() {
        assert_eq!(duration_text(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(duration_text(Duration::from_secs(36 * 3_600)), "36h");
        assert_eq!(duration_text(Duration::from_secs(61)), "61s");
        assert_eq!(duration_text(Duration::from_millis(0)), "0ms");
    }
}
