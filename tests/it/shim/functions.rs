//! The shim's functions one at a time: the script sourced as a library (`set --
//! --library; . shim.sh` defines everything and acts on nothing) under dash, bash and
//! busybox ash, each function called on records and processes the test lays out. The
//! verbs' tests in `shim.rs` prove what a call does; these name the function that
//! decides it, so a failure points at one function under one shell.

use std::path::{Path, PathBuf};
use std::process::Command;

use super::{script, shells};
use crate::support::{fresh_dir, text};

/// The script under test (the shipped one, or `OPMARK_SHIM_UNDER_TEST`'s mutant), as a
/// file the shells can source.
fn library_file() -> PathBuf {
    static FILE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    FILE.get_or_init(|| {
        let path = fresh_dir("shim-library").join("shim.sh");
        std::fs::write(&path, script()).unwrap();
        path
    })
    .clone()
}

/// Runs `body` in `shell` after sourcing the library, in a directory of its own, and
/// returns its stdout. A body that fails, or a library that would not load, panics with
/// the shell's name and its stderr.
pub(super) fn call(shell: &(&str, PathBuf), dir: &Path, body: &str) -> String {
    let out = Command::new(&shell.1)
        .arg("-c")
        .arg(format!("set -- --library\n. \"$0\" || exit 99\n{body}"))
        .arg(library_file())
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}: the body failed ({:?}): {}\n--- stdout ---\n{}",
        shell.0,
        out.status,
        text(&out.stderr),
        text(&out.stdout)
    );
    text(&out.stdout)
}

/// Each shell's answer to `body` in a fresh directory `name-SHELL`.
pub(super) fn under_every_shell(name: &str, body: &str) -> Vec<(&'static str, String)> {
    shells()
        .into_iter()
        .map(|shell| {
            let dir = fresh_dir(&format!("{name}-{}", shell.0));
            let said = call(&shell, &dir, body);
            (shell.0, said)
        })
        .collect()
}

#[test]
fn sourced_as_a_library_the_shim_defines_its_functions_and_sends_no_header() {
    for (shell, said) in under_every_shell(
        "shim-library-quiet",
        "command -v verb_run >/dev/null && command -v state >/dev/null && echo defined",
    ) {
        // No header line (`opmark-shim ...`), no frame: nothing ran but the body.
        assert_eq!(said, "defined\n", "{shell}");
    }
}

#[test]
fn op_ids_numbers_and_start_times_are_judged_alike_under_every_shell() {
    let long = "a".repeat(128);
    let body = format!(
        r#"
yn() {{ if "$@"; then echo "yes $*"; else echo "no $*"; fi; }}
yn valid_id a
yn valid_id op-1.x:y_Z
yn valid_id {long}
yn valid_id {long}b
yn valid_id .hidden
yn valid_id -flag
yn valid_id a/b
yn valid_id 'a b'
yn valid_id ''
yn is_uint 0
yn is_uint 120
yn is_uint ''
yn is_uint -1
yn is_uint 1a
yn older_than 5 7
yn older_than 7 5
yn older_than 5 5
yn older_than x 5
"#
    );
    let want = format!(
        "yes valid_id a\nyes valid_id op-1.x:y_Z\nyes valid_id {long}\nno valid_id {long}b\n\
         no valid_id .hidden\nno valid_id -flag\nno valid_id a/b\nno valid_id a b\nno valid_id \n\
         yes is_uint 0\nyes is_uint 120\nno is_uint \nno is_uint -1\nno is_uint 1a\n\
         yes older_than 5 7\nno older_than 7 5\nno older_than 5 5\nno older_than x 5\n"
    );
    for (shell, said) in under_every_shell("shim-library-ids", &body) {
        assert_eq!(said, want, "{shell}");
    }
}

#[test]
fn a_record_counts_only_once_its_last_line_is_written() {
    // The claim and the supervisor's record are written in place, so a reader may meet one
    // half-written: claimed and exited say "complete" only once the last key is there.
    let body = r#"
m=$PWD/m
mkdir -p "$m"
say() { if "$1"; then echo "$1 $rv"; else echo "not $1"; fi; }
say claimed
printf 'attempt=1\nfingerprint=ab\n' >"$m/claim"
say claimed
printf 'attempt=1\nfingerprint=ab\nboot=b-1' >"$m/claim"
say claimed
printf 'code=0\ntimed_out=0\n' >"$m/exit"
say exited
printf 'code=0\ntimed_out=0\nended_at=9\ncancel_pending=0\ncancelled=0\n' >"$m/exit"
say exited
rget "$m/claim" fingerprint && echo "fingerprint $rv"
rget "$m/claim" become || echo "no become ($rv)"
"#;
    for (shell, said) in under_every_shell("shim-library-records", body) {
        assert_eq!(
            said,
            "not claimed\nnot claimed\nclaimed b-1\nnot exited\nexited 0\nfingerprint ab\nno become ()\n",
            "{shell}"
        );
    }
}

#[test]
fn durable_write_replaces_a_record_whole_and_leaves_no_temp_file() {
    let body = r#"
mkdir d
durable_write "$PWD/d" rec "a=1" && cat d/rec
durable_write "$PWD/d" rec "a=2
b=3" && cat d/rec
ls -A d
durable_write "$PWD/missing" rec "a=1" 2>/dev/null || echo "refused: no directory"
"#;
    for (shell, said) in under_every_shell("shim-library-durable", body) {
        assert_eq!(
            said, "a=1\na=2\nb=3\nrec\nrefused: no directory\n",
            "{shell}"
        );
    }
}

/// Shell lines that leave a session whose leader is gone while one member lives on (a
/// supervisor killed, its command alive): `leader` and `leader_start` name the leader,
/// `member` the live member's pid (a `sleep 60`, also in the file `member`).
pub(super) const ORPHANED_SESSION: &str = r#"
setsid sh -c 'read -r l </proc/$$/stat; echo "$l" >leader.tmp; mv leader.tmp leader
sleep 60 >/dev/null 2>&1 </dev/null &
echo "$!" >member.tmp; mv member.tmp member' >/dev/null 2>&1 </dev/null
n=0
while ! [ -f member ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
read -r ps_line <leader
proc_fields
leader=${ps_line%% *} leader_start=$ps_start
n=0
while proc_stat "$leader" && [ "$ps_state" != Z ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
read -r member <member
"#;

/// The marker states `state` reads from each layout: one line per marker, "NAME ST WHY".
/// A live process is a `sleep` of the body's; a dead one a child it waited for; the
/// session case a `setsid` leader that exits and leaves a member behind.
const STATE_LAYOUTS: &str = r#"
root=$PWD/root
mkdir -p "$root/ops"
read_boot
sleep 60 &
live=$!
proc_stat "$live" && live_start=$ps_start
sleep 0 &
dead=$!
wait "$dead"
mk() { mkdir -p "$root/ops/$1"; }
rec() { mk "$1"; printf "$3" >"$root/ops/$1/$2"; }
show() { id_ok=$2; state "$1"; echo "$1 $st ${why:--}"; }
proc() { printf 'pid=%s\nstart=%s\ncaptures=1,2\nboot=%s\n' "$1" "$2" "$3"; }
claim() { printf 'attempt=1\nfingerprint=ab\nfg_pid=%s\nfg_start=%s\nboot=%s\n' "$1" "$2" "$3"; }

show none ''
rec fenced fenced 'at=1\n'
rec fenced exit 'code=0\ncancelled=0\n'
show fenced ''
rec done exit 'code=3\ntimed_out=0\nended_at=1\ncancel_pending=0\ncancelled=0\n'
show done ''
rec full claim "$(claim "$dead" 1 "$boot")"
rec full exit_write_failed ''
show full ''
rec rebooted proc "$(proc "$live" "$live_start" other-boot)"
show rebooted ''
rec running proc "$(proc "$live" "$live_start" "$boot")"
show running ''
rec unknowable proc "$(proc "$dead" "$live_start" "$boot")"
show unknowable no
rec reused proc "$(proc "$live" 1 "$boot")"
show reused ''
rec gone proc "$(proc "$dead" "$live_start" "$boot")"
show gone ''
rec torn proc "$(proc "$dead" "$live_start" "$boot")"
rec torn exit 'code=0\ntimed_out=0\n'
show torn ''
rec starting claim "$(claim "$live" "$live_start" "$boot")"
show starting ''
rec unstarted claim "$(claim "$dead" "$live_start" "$boot")"
show unstarted ''
rec other_boot claim "$(claim "$live" "$live_start" other-boot)"
show other_boot ''
rec claiming claim 'attempt=1\n'
show claiming ''
rec stale claim 'attempt=1\n'
touch -t 202001010000 "$root/ops/stale"
show stale ''

"#;

/// The layouts after the orphaned session (see [`ORPHANED_SESSION`]).
const STATE_LAYOUTS_ORPHANED: &str = r#"
rec orphaned proc "$(proc "$leader" "$leader_start" "$boot")"
show orphaned ''
kill "$member" "$live"
n=0
while proc_stat "$member" && [ "$ps_state" != Z ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
show orphaned ''
"#;

#[test]
fn a_markers_state_follows_its_records_and_the_liveness_of_the_processes_they_name() {
    let want = "\
none absent -
fenced fenced -
done completed -
full interrupted exit_write_failed
rebooted interrupted reboot
running running -
unknowable running liveness_unknown
reused interrupted process_gone
gone interrupted process_gone
torn interrupted process_gone
starting running starting
unstarted interrupted never_started
other_boot interrupted never_started
claiming running claiming
stale interrupted never_started
orphaned running -
orphaned interrupted process_gone
";
    for (shell, said) in under_every_shell(
        "shim-library-state",
        &format!("{STATE_LAYOUTS}{ORPHANED_SESSION}{STATE_LAYOUTS_ORPHANED}"),
    ) {
        assert_eq!(said, want, "{shell}");
    }
}

/// An index of one intent (fingerprint ab) with the slots `slots` ("OP AGE_S [held]"
/// per line, oldest first) and, for ops named in `markers` ("OP exit|claim"), a marker
/// of that intent that completed or is claimed by a dead process; then `repeat_find` for
/// a claim of op `mine` within a window of an hour, with the declared op ids `declared`.
fn repeat_walk(slots: &str, markers: &str, mine: &str, declared: &str) -> String {
    format!(
        r#"
root=$PWD/root
mkdir -p "$root/ops" "$root/fp/ab"
read_boot
now=1000000
ix=$root/fp/ab
n=0
while read -r s_op s_age s_held; do
    [ -n "$s_op" ] || continue
    n=$((n + 1))
    slot_name "$n"
    printf 'op=%s\nclaimed_at=%s\n' "$s_op" "$((now - s_age))" >"$sn"
    [ -z "$s_held" ] || echo held=1 >>"$sn"
done <<EOF
{slots}
EOF
while read -r k_op k_kind; do
    [ -n "$k_op" ] || continue
    mkdir -p "$root/ops/$k_op"
    printf 'attempt=1\nfingerprint=ab\nfg_pid=1\nfg_start=1\nboot=%s\n' "$boot" >"$root/ops/$k_op/claim"
    [ "$k_kind" = exit ] &&
        printf 'code=0\ntimed_out=0\nended_at=1\ncancel_pending=0\ncancelled=0\n' >"$root/ops/$k_op/exit"
done <<EOF
{markers}
EOF
op={mine} fp=ab rp_window=3600 rp_action=block rp_declared={declared}
repeat_find
echo "last=$rc_last own=${{rc_own:--}} found=${{rc_found:--}} op=${{rc_op:--}} state=${{rc_state:--}}"
"#
    )
}

#[test]
fn the_repeat_walk_stops_at_the_first_claim_of_the_intent_that_may_have_had_its_effect() {
    let cases = [
        (
            "an earlier op that completed counts",
            repeat_walk("a 100", "a exit", "c", "-"),
            "last=1 own=- found=1 op=a state=completed",
        ),
        (
            "our own slot (a retry of our op) is passed on the way",
            repeat_walk("a 100\nc 50", "a exit", "c", "-"),
            "last=2 own=2 found=1 op=a state=completed",
        ),
        (
            "a claim older than the window does not count",
            repeat_walk("a 7200", "a exit", "c", "-"),
            "last=1 own=- found=- op=- state=-",
        ),
        (
            "a declared repetition does not count",
            repeat_walk("a 100", "a exit", "c", "a"),
            "last=1 own=- found=- op=- state=-",
        ),
        (
            "a slot held back by an earlier refusal does not count",
            repeat_walk("a 100 held", "a exit", "c", "-"),
            "last=1 own=- found=- op=- state=-",
        ),
        (
            "a slot whose claimer has not made its marker yet counts while young",
            repeat_walk("a 10", "", "c", "-"),
            "last=1 own=- found=1 op=a state=claiming",
        ),
        (
            "and not once it is old",
            repeat_walk("a 300", "", "c", "-"),
            "last=1 own=- found=- op=- state=-",
        ),
        (
            "an interrupted claim may have had the effect",
            repeat_walk("a 100", "a claim", "c", "-"),
            "last=1 own=- found=1 op=a state=interrupted",
        ),
    ];
    for (what, body, want) in cases {
        for (shell, said) in under_every_shell("shim-library-repeats", &body) {
            assert_eq!(said.trim_end(), want, "{shell}: {what}");
        }
    }
}

#[test]
fn alive_is_the_recorded_process_and_session_alive_any_member_younger_than_the_supervisor() {
    // A live `sleep` and its recorded start; a dead child; then a session whose leader
    // (the supervisor) is gone while a member (the command's child) lives on.
    let body = r#"
yn() { if "$@"; then echo "yes $1"; else echo "no $1"; fi; }
sleep 60 &
live=$!
proc_stat "$live" && live_start=$ps_start
sleep 0 &
dead=$!
wait "$dead"
yn alive "$live" "$live_start"
yn alive "$live" "$((live_start + 1))"
yn alive "$dead" "$live_start"
"#;
    let after = r#"
proc_stat "$member" && member_start=$ps_start
yn session_alive "$leader" "$leader_start"
yn session_alive "$leader" "$((member_start + 1))"
yn session_alive "$live" "$((live_start + 1))"
kill "$member" "$live"
n=0
while proc_stat "$member" && [ "$ps_state" != Z ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
yn session_alive "$leader" "$leader_start"
"#;
    let want = "\
yes alive
no alive
no alive
yes session_alive
no session_alive
no session_alive
no session_alive
";
    // In order: the recorded process; its pid with another start time (reused); a dead
    // one; a session with a live member after its leader died; only members older than
    // the recorded supervisor (not of its session); the leader's pid held by another
    // process (the session is gone); no member left.
    for (shell, said) in under_every_shell(
        "shim-library-liveness",
        &format!("{body}{ORPHANED_SESSION}{after}"),
    ) {
        assert_eq!(said, want, "{shell}");
    }
}

/// A marker as verb_run leaves it for its supervisor (`mark OP CMD [ATTEMPT]`): the claim
/// of ATTEMPT (1 by default), the command, the captures' FIFOs and the file a failed exit
/// record is renamed from; then `supervised OP` prints what the supervisor recorded: the
/// exit record (or `no exit`), `exit_write_failed` when that is there, the kept stdout,
/// and the state the marker reads.
const SUPERVISED: &str = r#"
root=$PWD/root
read_boot
mark() {
	m=$root/ops/$1
	mkdir -p "$m"
	printf 'attempt=%s\nfingerprint=ab\nfg_pid=1\nfg_start=1\nboot=x\n' "${3:-1}" >"$m/claim"
	printf '%s' "$2" >"$m/cmd"
	mkfifo "$m/.out.fifo" "$m/.err.fifo"
	: >"$m/.noexit"
}
supervised() {
	m=$root/ops/$1
	if [ -f "$m/exit" ]; then sed 's/^ended_at=[0-9][0-9]*$/ended_at=N/' "$m/exit"; else echo "no exit"; fi
	[ -e "$m/exit_write_failed" ] && echo exit_write_failed
	[ -f "$m/out" ] && echo "out: $(cat "$m/out")"
	[ -e "$m/.noexit" ] && echo ".noexit left"
	state "$1"
	echo "state: $st ${why:--}"
}
"#;

#[test]
fn the_supervisor_records_the_commands_exit_whole_or_says_why_it_could_not() {
    let cases = [
        (
            "the command's status, in a complete record",
            "mark ran 'echo out; exit 3'\n(supervise \"$m\" 0 1000 16 1)\nsupervised ran",
            "code=3\ntimed_out=0\nended_at=N\ncancel_pending=0\ncancelled=0\nout: out\n\
             state: completed -",
        ),
        (
            // A full disk: the record cannot be written, and the file made before the
            // claim counted is renamed (no space needed), so the marker says why.
            "an exit record that cannot be written",
            "mark full 'echo out; exit 3'\n\
             (durable_write() { return 1; }; supervise \"$m\" 0 1000 16 1)\nsupervised full",
            "no exit\nexit_write_failed\nout: out\nstate: interrupted exit_write_failed",
        ),
        (
            // A late supervisor whose foreground set its claim aside for another.
            "a claim of another attempt",
            "mark other 'echo out; exit 3' 2\n(supervise \"$m\" 0 1000 16 1)\nsupervised other",
            "no exit\n.noexit left\nstate: interrupted never_started",
        ),
        (
            "a cancel asked for, but the command ended by itself",
            "mark pending 'exit 0'\n: >\"$m/cancelled\"\n(supervise \"$m\" 0 1000 6 1)\n\
             supervised pending",
            "code=0\ntimed_out=0\nended_at=N\ncancel_pending=1\ncancelled=0\nout: \n\
             state: completed -",
        ),
        (
            "a cancel whose signal ended the command",
            "mark stopped 'kill -TERM $$'\n: >\"$m/cancelled\"\n: >\"$m/signalled\"\n\
             (supervise \"$m\" 0 1000 12 1)\nsupervised stopped",
            "code=143\ntimed_out=0\nended_at=N\ncancel_pending=0\ncancelled=1\nout: \n\
             state: completed -",
        ),
    ];
    for (what, run, want) in cases {
        let body = format!("{SUPERVISED}{run}\n");
        for (shell, said) in under_every_shell("shim-library-exit", &body) {
            assert_eq!(said.trim_end(), want, "{shell}: {what}");
        }
    }
}

#[test]
fn a_large_content_is_hashed_by_openssl_where_there_is_one_and_anything_odd_from_it_falls_back() {
    if Command::new("openssl").arg("version").output().is_err() {
        crate::support::skip_or_fail(crate::test_name!(), "openssl is not installed");
        return;
    }
    // A 2 MB file and a small one; an `openssl` on PATH that records its calls and either
    // hashes for real, prints nonsense or fails.
    let body = r#"
head -c 2000000 /dev/zero > big; printf 'small\n' > small
want_big=$(sha256sum < big); want_small=$(sha256sum < small)
real=$(command -v openssl)
mkdir bin
printf '#!/bin/sh\necho called >> "%s/calls"\nexec "%s" "$@"\n' "$PWD" "$real" > bin/openssl
chmod +x bin/openssl
PATH="$PWD/bin:$PATH"
[ "$(sha256_of big 2000000)" = "${want_big%% *} *stdin" ] && echo "big by openssl"
[ "$(sha256_of small 6)" = "$want_small" ] && echo "small by sha256sum"
echo "openssl calls: $(wc -l < calls)"
printf '#!/bin/sh\necho "SHA2-256(stdin)= nonsense"\n' > bin/openssl
[ "$(sha256_of big 2000000)" = "$want_big" ] && echo "nonsense falls back"
printf '#!/bin/sh\nexit 1\n' > bin/openssl
[ "$(sha256_of big 2000000)" = "$want_big" ] && echo "failure falls back"
"#;
    for (shell, said) in under_every_shell("shim-sha256-of", body) {
        assert_eq!(
            said,
            "big by openssl\nsmall by sha256sum\nopenssl calls: 1\nnonsense falls back\nfailure falls back\n",
            "{shell}"
        );
    }
}
