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

#[test]
fn the_shipped_patterns_are_prefiltered_and_answer_as_their_regexes() {
    let p = Policy::parse(BUILTIN_TEXT, BUILTIN_ORIGIN).unwrap();
    let patterns: Vec<&pattern::Pattern> =
        p.rules.iter().filter_map(|r| r.pattern.as_ref()).collect();
    let unfiltered: Vec<&str> = patterns
        .iter()
        .filter(|x| x.prefixes().is_none_or(|v| v.iter().any(String::is_empty)))
        .map(|x| x.as_str())
        .collect();
    // A pattern without a prefilter is compiled for every command: keep them rare.
    assert!(
        unfiltered.len() <= 3,
        "patterns without a prefilter: {unfiltered:#?}"
    );
    // Texts that reach into every pattern: its prefixes with and without more words.
    let mut texts: Vec<String> = vec!["true".into(), "ls -la /".into(), String::new()];
    for x in &patterns {
        for prefix in x.prefixes().unwrap_or_default() {
            for tail in ["", " ", " -x", " -rf /", " delete x", " --all", "x"] {
                texts.push(format!("{prefix}{tail}"));
            }
        }
    }
    for x in &patterns {
        let re = regex::Regex::new(x.as_str()).unwrap();
        for t in &texts {
            assert_eq!(x.is_match(t), re.is_match(t), "{} on {t:?}", x.as_str());
        }
    }
}

#[test]
fn the_builtin_policy_compiles_only_what_a_command_needs() {
    let p = Policy::parse_checked(BUILTIN_TEXT, BUILTIN_ORIGIN, false).unwrap();
    assert_eq!(p.classify("true").family, Family::ReadOnly);
    let compiled = |p: &Policy| {
        p.rules
            .iter()
            .filter_map(|r| r.pattern.as_ref())
            .filter(|x| x.is_compiled())
            .count()
    };
    assert_eq!(compiled(&p), 0);
    assert_eq!(
        p.classify("systemctl restart nginx").family,
        Family::Destructive
    );
    assert!(compiled(&p) < 10, "{} compiled", compiled(&p));
}

#[test]
fn the_builtin_redact_patterns_are_filtered_and_compile_only_when_needed() {
    let p = Policy::parse_checked(BUILTIN_TEXT, BUILTIN_ORIGIN, false).unwrap();
    let patterns = p.redact_patterns();
    assert!(!patterns.is_empty());
    let red = crate::redact::Redactor::with_patterns(patterns);
    assert_eq!(
        red.redact("systemctl restart nginx"),
        "systemctl restart nginx"
    );
    assert!(patterns.iter().all(|x| !x.is_compiled()));
    for x in patterns {
        let literals = pattern::leading_literals(x.as_str());
        assert!(literals.is_some(), "`{}` has no literal filter", x.as_str());
        let re = regex::Regex::new(x.as_str()).unwrap();
        for t in ["AKIAABCDEFGHIJKLMNOP", "glpat-abcdefghij0123456789", "true"] {
            assert_eq!(x.is_match(t), re.is_match(t), "{} on {t}", x.as_str());
        }
    }
}

#[test]
fn a_rule_name_used_twice_is_refused_naming_both_rules_and_lines() {
    let text = "default_family = \"destructive\"\n\
        [families.read-only]\nattempts = 1\nafter_interrupted = \"rerun\"\n\
        [families.convergent]\nattempts = 1\nafter_interrupted = \"rerun\"\n\
        [families.append-only]\nattempts = 1\nafter_interrupted = \"block\"\n\
        [families.destructive]\nattempts = 1\nafter_interrupted = \"block\"\n\
        [[rule]]\nname = \"ls\"\nfamily = \"read-only\"\nprograms = [\"ls\"]\n\
        [[rule]]\nname = \"cat\"\nfamily = \"read-only\"\nprograms = [\"cat\"]\n\
        [[rule]]\nname = \"ls\"\nfamily = \"read-only\"\nprograms = [\"dir\"]\n";
    let e = Policy::parse(text, "p.toml").unwrap_err();
    assert_eq!(e.line(), Some(23), "{e}");
    assert_eq!(e.key(), Some("rule[3].name"), "{e}");
    let message = e.to_string();
    assert!(
        message.contains("the name `ls` is used by rule[1] (line 15) and rule[3] (line 23)"),
        "{message}"
    );
}

#[test]
fn repetition_keys_have_the_shipped_defaults_and_old_files_get_them() {
    let shipped = Policy::builtin();
    let old_text: String = BUILTIN_TEXT
        .lines()
        .filter(|l| !l.starts_with("repeat_window") && !l.starts_with("on_repeat"))
        .map(|l| format!("{l}\n"))
        .collect();
    let old = Policy::parse(&old_text, "old.toml").unwrap();
    for p in [&shipped, &old] {
        for (family, action) in [
            (Family::ReadOnly, OnRepeat::Allow),
            (Family::Convergent, OnRepeat::Warn),
            (Family::AppendOnly, OnRepeat::Block),
            (Family::Destructive, OnRepeat::Block),
        ] {
            assert_eq!(p.family(family).on_repeat, action, "{family}");
            assert_eq!(p.family(family).repeat_window, Duration::from_secs(86_400));
        }
    }
    // What `policy show` writes loads back the same.
    let again = Policy::parse(&old.to_toml(), "shown.toml").unwrap();
    assert_eq!(
        again.family(Family::Convergent),
        old.family(Family::Convergent)
    );
}

#[test]
fn a_bad_repetition_value_names_the_file_line_key_and_fix() {
    let bad = BUILTIN_TEXT.replacen("\non_repeat = \"warn\"", "\non_repeat = \"maybe\"", 1);
    let e = Policy::parse(&bad, "mine.toml").unwrap_err().to_string();
    for needle in [
        "mine.toml",
        "families.convergent.on_repeat",
        "maybe",
        "\"allow\", \"warn\" or \"block\"",
    ] {
        assert!(e.contains(needle), "`{needle}` in {e}");
    }
    let bad = BUILTIN_TEXT.replacen("\nrepeat_window = \"24h\"", "\nrepeat_window = \"soon\"", 1);
    let e = Policy::parse(&bad, "mine.toml").unwrap_err().to_string();
    assert!(e.contains("families.read-only.repeat_window"), "{e}");
}

/// The four family tables every policy file needs, with no top-level keys: what a
/// policy written before `escalate_after` looks like.
const OLD_POLICY: &str = "default_family = \"destructive\"\n\
    [families.read-only]\nattempts = 1\nafter_interrupted = \"rerun\"\n\
    [families.convergent]\nattempts = 1\nafter_interrupted = \"rerun\"\n\
    [families.append-only]\nattempts = 1\nafter_interrupted = \"block\"\n\
    [families.destructive]\nattempts = 1\nafter_interrupted = \"block\"\n";

#[test]
fn escalate_after_is_shipped_as_1h_read_when_set_and_defaults_for_old_policies() {
    assert_eq!(
        Policy::builtin().escalate_after(),
        Duration::from_secs(3600)
    );
    let old = Policy::parse(OLD_POLICY, "old.toml").unwrap();
    assert_eq!(old.escalate_after(), DEFAULT_ESCALATE_AFTER);
    let set = format!("escalate_after = \"90s\"\n{OLD_POLICY}");
    let p = Policy::parse(&set, "p.toml").unwrap();
    assert_eq!(p.escalate_after(), Duration::from_secs(90));
    // `policy show` writes it, and what it writes loads back equal.
    let shown = p.to_toml();
    assert!(shown.contains("escalate_after = \"90s\""), "{shown}");
    assert_eq!(Policy::parse(&shown, "shown.toml").unwrap(), p);
}

#[test]
fn a_bad_escalate_after_is_refused_naming_the_key_and_the_fix() {
    for (value, says) in [
        ("\"soon\"", "write a duration like"),
        ("\"0s\"", "positive duration"),
        ("\"5\"", "has no unit"),
    ] {
        let text = format!("escalate_after = {value}\n{OLD_POLICY}");
        let e = Policy::parse(&text, "p.toml").unwrap_err();
        assert_eq!(e.key(), Some("escalate_after"), "{value}: {e}");
        assert_eq!(e.line(), Some(1), "{value}: {e}");
        assert!(e.to_string().contains(says), "{value}: {e}");
    }
}

#[test]
fn package_managers_take_the_apt_lock_by_default_and_a_rules_locks_are_checked() {
    let p = Policy::parse(BUILTIN_TEXT, BUILTIN_ORIGIN).unwrap();
    let locks = |command: &str| -> Vec<String> {
        p.classify(command)
            .locks
            .iter()
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(locks("apt-get -y upgrade"), ["apt"]);
    assert_eq!(locks("sudo dpkg -i x.deb && apt-get -f install"), ["apt"]);
    assert_eq!(
        locks("apt-get -s install nginx"),
        Vec::<String>::new(),
        "a simulation"
    );
    assert_eq!(locks("systemctl restart nginx"), Vec::<String>::new());
    let mine = BUILTIN_TEXT.replacen("locks = [\"apt\"]", "locks = [\"pkg:2\", \"net\"]", 1);
    let p = Policy::parse(&mine, "mine.toml").unwrap();
    let c = p.classify("apt-get -y upgrade");
    assert_eq!(
        crate::host_lock::HostLock::wire_list(&c.locks),
        "net:1,pkg:2"
    );
    // Printed and loaded back, the locks stay.
    assert!(Policy::parse(&p.to_toml(), "printed.toml").unwrap() == p);
    for (bad, needle) in [
        ("locks = [\"a/b\"]", "lock `a/b`"),
        ("locks = [\"apt\", \"apt:2\"]", "`apt` is named twice"),
    ] {
        let text = BUILTIN_TEXT.replacen("locks = [\"apt\"]", bad, 1);
        let e = Policy::parse(&text, "mine.toml").unwrap_err().to_string();
        for n in ["mine.toml", ".locks", needle] {
            assert!(e.contains(n), "`{n}` in {e}");
        }
    }
}
