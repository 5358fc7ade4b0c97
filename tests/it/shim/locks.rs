//! Host locks' primitive (docs/host-protocol.md#host-locks; `remote-scripts/shim/26-locks.sh`)
//! under dash, bash and busybox ash: slots taken by concurrent shells never hold more
//! than the capacity at once, a holder proven gone is reaped, a live one is waited for
//! and named, and the capacity is the lock's. `run --lock` through sshd: tests/it/locks.rs.

use super::functions::{under_every_shell, ORPHANED_SESSION};
use crate::support::most_at_once;

/// `workers` shells at once, each taking lock `apt` of capacity `cap` `rounds` times and
/// holding it for a tenth of a second; each writes the interval it held it for, in
/// centiseconds since boot, as "START END" lines (read from /proc/uptime right after
/// taking and right before giving back).
fn contended(cap: u32, workers: u32, rounds: u32) -> String {
    format!(
        r#"
read_boot
worker() {{
	read -r me_pid _ </proc/self/stat
	proc_stat "$me_pid"
	me_start=$ps_start
	r=0
	while [ "$r" -lt {rounds} ]; do
		now
		me="$me_pid $me_start $boot $now op-$me_pid-$r"
		uptime_cs
		lock_take "$PWD/locks/apt" {cap} "$me" $((up_cs + 6000)) || {{ echo "not taken: $?"; return; }}
		uptime_cs
		t0=$up_cs
		sleep 0.1
		uptime_cs
		echo "$t0 $up_cs" >>"held.$me_pid"
		lock_release "$PWD/locks/apt" "$lock_slot" "$me"
		r=$((r + 1))
	done
}}
i=0
while [ "$i" -lt {workers} ]; do
	worker &
	i=$((i + 1))
done
wait
cat held.*
ls -A locks/apt
"#
    )
}

/// The "START END" lines of [`contended`]'s answer, as intervals; asserts each is one.
fn held_intervals(said: &str) -> Vec<(u64, u64)> {
    said.lines()
        .filter_map(|line| {
            let (start, end) = line.split_once(' ')?;
            let interval = (start.parse::<u64>().ok()?, end.parse::<u64>().ok()?);
            assert!(
                interval.0 <= interval.1,
                "an interval ends before it starts: {line}"
            );
            Some(interval)
        })
        .collect()
}

#[test]
fn six_shells_taking_a_lock_of_one_slot_never_hold_it_at_once() {
    for (shell, said) in under_every_shell("shim-locks-one", &contended(1, 6, 3)) {
        assert!(!said.contains("not taken"), "{shell}: {said}");
        let held = held_intervals(&said);
        assert_eq!(held.len(), 18, "{shell}: every round held once: {said}");
        assert_eq!(most_at_once(&held), 1, "{shell}: held at once: {said}");
        // Every slot given back; the capacity stays, as the lock's.
        assert!(said.ends_with("capacity\n"), "{shell}: {said}");
    }
}

#[test]
fn a_lock_of_two_slots_is_held_by_two_at_once_and_never_three() {
    for (shell, said) in under_every_shell("shim-locks-two", &contended(2, 6, 3)) {
        assert!(!said.contains("not taken"), "{shell}: {said}");
        let held = held_intervals(&said);
        assert_eq!(held.len(), 18, "{shell}: {said}");
        assert_eq!(most_at_once(&held), 2, "{shell}: held at once: {said}");
    }
}

#[test]
fn a_gone_holder_is_reaped_a_live_one_is_waited_for_and_named() {
    let body = r#"
read_boot
d=$PWD/locks/apt
mkdir -p "$d"
sleep 0 &
dead=$!
wait "$dead"
sleep 60 &
live=$!
proc_stat "$live"
live_start=$ps_start
me="$$ 1 $boot 1700000000 mine"
ln -s "$dead 5 $boot 1700000000 gone-op" "$d/1"
lock_take "$d" 1 "$me" 0
echo "a dead holder: $? slot $lock_slot"
lock_release "$d" 1 "1 2 $boot 3 someone-else"
[ -L "$d/1" ] && echo "kept from one who does not hold it"
lock_release "$d" 1 "$me"
[ -L "$d/1" ] || echo "given back"
ln -s "$live $live_start other-boot 1700000000 old-boot-op" "$d/1"
lock_take "$d" 1 "$me" 0
echo "a holder of an earlier boot: $? slot $lock_slot"
lock_release "$d" 1 "$me"
ln -s "not-ours" "$d/1"
lock_take "$d" 1 "$me" 0
echo "a target opmark did not write: $? slot $lock_slot"
lock_release "$d" 1 "$me"
ln -s "$live $live_start $boot 1700000000 holder-op" "$d/1"
lock_take "$d" 1 "$me" 0
echo "a live holder: $? holder ${lock_holder##* } since $(echo "$lock_holder" | cut -d' ' -f4)"
uptime_cs
t0=$up_cs
lock_take "$d" 1 "$me" $((t0 + 100))
said=$?
uptime_cs
echo "a live holder for 1 s: $said"
[ "$((up_cs - t0))" -ge 95 ] && [ "$((up_cs - t0))" -lt 200 ] && echo "waited about 1 s"
lock_take "$d" 2 "$me" 0
echo "another capacity: $? the lock has $lock_capacity"
kill "$live"
wait "$live" 2>/dev/null
lock_take "$d" 1 "$me" 0
echo "its holder ended: $? slot $lock_slot"
ls -A "$d"
"#;
    let want = "\
a dead holder: 0 slot 1
kept from one who does not hold it
given back
a holder of an earlier boot: 0 slot 1
a target opmark did not write: 0 slot 1
a live holder: 1 holder holder-op since 1700000000
a live holder for 1 s: 1
waited about 1 s
another capacity: 2 the lock has 1
its holder ended: 0 slot 1
1
capacity
";
    for (shell, said) in under_every_shell("shim-locks-reap", body) {
        assert_eq!(said, want, "{shell}");
    }
}

#[test]
fn a_holder_whose_leader_is_gone_holds_while_its_session_has_a_process() {
    // The supervisor killed, the command alive: the lock is still held, as the claim is.
    let body = r#"
read_boot
d=$PWD/locks/apt
"#;
    let after = r#"
mkdir -p "$d"
ln -s "$leader $leader_start $boot 1700000000 orphan-op" "$d/1"
me="$$ 1 $boot 1700000000 mine"
lock_take "$d" 1 "$me" 0
echo "its command alive: $?"
kill "$member"
n=0
while proc_stat "$member" && [ "$ps_state" != Z ] && [ "$n" -lt 100 ]; do sleep 0.1; n=$((n + 1)); done
lock_take "$d" 1 "$me" 0
echo "its command gone: $? slot $lock_slot"
"#;
    for (shell, said) in under_every_shell(
        "shim-locks-session",
        &format!("{body}{ORPHANED_SESSION}{after}"),
    ) {
        assert_eq!(
            said, "its command alive: 1\nits command gone: 0 slot 1\n",
            "{shell}"
        );
    }
}

#[test]
fn bad_arguments_are_refused_before_anything_is_made() {
    let body = r#"
lock_take "$PWD/locks/a" 0 "me" 0; echo "capacity 0: $?"
lock_take "$PWD/locks/a" x "me" 0; echo "capacity x: $?"
lock_take "$PWD/locks/a" 1 "me" -1; echo "wait -1: $?"
[ -e locks ] || echo "nothing made"
"#;
    for (shell, said) in under_every_shell("shim-locks-bad", body) {
        assert_eq!(
            said, "capacity 0: 3\ncapacity x: 3\nwait -1: 3\nnothing made\n",
            "{shell}"
        );
    }
}

#[test]
fn a_holders_command_is_named_as_hex_of_its_first_line_and_at_most_160_bytes() {
    let long = "x".repeat(160);
    let body = format!(
        r#"
t() {{ printf "$1" >cmd; holder_cmd_fields "$PWD/cmd"; echo "$2: [$hc_fields]"; }}
t 'apt-get -y upgrade' one-line
t 'a b\nsecond line' two-lines
t 'a\n' a-newline-ending-it
t '\nb' an-empty-first-line
t '' empty
t '\303\251\t' 'utf-8 and a tab'
t '{long}' 160-bytes
t '{long}\n' '160 bytes and a newline'
t '{long}y' 161-bytes
t '{long}\ny' '160 bytes then another line'
rm cmd
holder_cmd_fields "$PWD/cmd"
echo "missing: [$hc_fields]"
"#
    );
    let x160 = "78".repeat(160);
    let want = format!(
        "one-line: [cmd=6170742d676574202d792075706772616465]\n\
         two-lines: [cmd=612062 cmd_cut=1]\n\
         a-newline-ending-it: [cmd=61]\n\
         an-empty-first-line: []\n\
         empty: []\n\
         utf-8 and a tab: [cmd=c3a909]\n\
         160-bytes: [cmd={x160}]\n\
         160 bytes and a newline: [cmd={x160}]\n\
         161-bytes: [cmd={x160} cmd_cut=1]\n\
         160 bytes then another line: [cmd={x160} cmd_cut=1]\n\
         missing: []\n"
    );
    for (shell, said) in under_every_shell("shim-locks-holder-cmd", &body) {
        assert_eq!(said, want, "{shell}");
    }
}

#[test]
fn lock_busy_tells_its_followers_the_holders_op_id_since_when_and_command() {
    // The supervisor of `mine`, in its marker, gives up on lock `apt` held by `holder-op`;
    // a claim that superseded another stays, so the test can look at what it said.
    let body = r#"
read_boot
mkdir -p ops/holder-op ops/mine ops/gone-op
printf 'apt-get -y upgrade\nsecond line' >ops/holder-op/cmd
cd ops/mine
m=$PWD
: >supersedes
mkfifo .w.1
# Held open here, the FIFO keeps what lock_busy writes until it is read.
exec 4<>.w.1
busy() {
	(lock_busy apt "1 2 $boot 1700000000 $1")
	read -r said <&4
	echo "$said"
}
busy holder-op
busy gone-op
busy 'bad/id'
"#;
    let want = "\
f lock_busy lock=apt holder=holder-op since=1700000000 cmd=6170742d676574202d792075706772616465 cmd_cut=1
f lock_busy lock=apt holder=gone-op since=1700000000
f lock_busy lock=apt since=1700000000
";
    for (shell, said) in under_every_shell("shim-locks-busy-frame", body) {
        assert_eq!(said, want, "{shell}");
    }
}
