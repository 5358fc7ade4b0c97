# shellcheck shell=sh
# opmark host shim: claims an operation marker atomically, runs the command detached,
# records its exit status durably, and answers probes. Delivered by the opmark client on
# every call (nothing is installed on the host); runs under dash, bash and busybox ash.
#
# Invocation (built by src/shim/mod.rs): the exec request is a one-line stub that any
# login shell can run (sh, bash, zsh, fish, tcsh); it reads this script from the
# channel's data and runs  sh -c "$SHIM" opmark-shim "$SHIM" [c=TOKEN] VERB ARGS...
# The script receives its own text as $1 so that it can start its detached supervisor
# with the same code (`setsid -f sh -c "$SHIM" ... supervise`). TOKEN is the client's
# per-call token, echoed in the header so that text printed by the login shell's startup
# files (even a copy of a header) is never taken for the shim's reply. The rest of the
# channel's data is the verb's input: for run, the command (exactly its byte count), then
# the spooled stdin, if any, up to EOF.
#
# Replies. stdout: a header line, then the command's raw stdout bytes only.
# stderr (frames): lines "OPMARK/1 <nonce> <KIND> <fields>"; a frame "E <n>" is followed
# by exactly n raw bytes of the command's stderr. The nonce is 128 random bits made here,
# kept in a shell variable and never given to the command, so the command's own output
# cannot forge a frame.
#
# Marker layout under $root/ops/<op>/ (directories 0700, files 0600):
#   claim     attempt, fingerprint, family, shim version, time, foreground identity
#   proc      the supervisor's identity: pid, process start time, boot id
#   started/  the start gate: the supervisor runs the command only if it creates it
#   cmd       the command text (run by the supervisor as `sh -c` would run it)
#   stdin     the spooled stdin, out/err captured output (capped), *.dropped overflow
#   exit      the exit record (temp file, fsync, rename)
#   fenced    tombstone: this op id can never run
#   w/        wake-up FIFOs of foregrounds waiting for the exit record

OPMARK_SHIM_VERSION=1
OPMARK_SHIM_SELF=$1
shift
call_token=
case ${1:-} in
c=*)
	call_token=${1#c=}
	shift
	;;
esac
case $call_token in
*[!0-9a-f]*) call_token= ;;
esac
umask 077
LC_ALL=C
export LC_ALL
# The sub-shell used for the supervisor and the command; tests run other shells through it.
OPMARK_SHELL=${OPMARK_SH:-sh}

# ---------------------------------------------------------------------------------------
# Small helpers

valid_id() {
	case $1 in
	'' | *[!A-Za-z0-9._:-]* | [!A-Za-z0-9]*) return 1 ;;
	esac
	[ "${#1}" -le 128 ]
}

is_uint() {
	case $1 in
	'' | *[!0-9]*) return 1 ;;
	esac
	return 0
}

now() {
	date +%s
}

# durable_write DIR NAME CONTENT [MORE_DIRS...]: temp file, fsync, rename, fsync the
# directory (and MORE_DIRS, e.g. the parent of a new marker), so that a reader sees the
# old record or the new one, never a torn one, and a crash keeps it.
durable_write() {
	dw_dir=$1 dw_file="$1/$2" dw_tmp="$1/.$2.tmp.$$"
	printf '%s\n' "$3" >"$dw_tmp" || return 1
	# Rename first, then one sync for the file's data and the directory entry: readers
	# see the whole record either way (the rename is atomic, the data in the page
	# cache), and nothing proceeds until both are on disk.
	mv -f "$dw_tmp" "$dw_file" || return 1
	shift 3
	sync "$dw_file" "$dw_dir" "$@"
}

# rget FILE KEY: sets rv to the value of KEY=value in a record file ("" if absent).
# A variable, not output: a command substitution would cost a fork per field.
rget() {
	rv=
	[ -f "$1" ] || return 1
	while IFS= read -r rg_line || [ -n "$rg_line" ]; do
		case $rg_line in
		"$2="*)
			rv=${rg_line#*=}
			return 0
			;;
		esac
	done <"$1"
	return 1
}

# proc_stat PID: sets ps_state, ps_session, ps_start from /proc/PID/stat (fields 3, 6
# and 22, counted after the last ") " because the command name may hold spaces).
proc_stat() {
	ps_line=
	read -r ps_line 2>/dev/null <"/proc/$1/stat" || return 1
	ps_rest=${ps_line##*) }
	set -f
	# shellcheck disable=SC2086 # splitting the stat fields is the point
	set -- $ps_rest
	set +f
	[ "$#" -ge 20 ] || return 1
	ps_state=$1
	ps_session=$4
	shift 19
	ps_start=$1
	return 0
}

# alive PID START: the process exists, is not a zombie and is the one recorded (a reused
# pid has another start time).
alive() {
	proc_stat "$1" || return 1
	[ "$ps_state" != Z ] && [ "$ps_start" = "$2" ]
}

# session_alive SID START: some live process still belongs to the supervisor's session
# (the command may outlive a killed supervisor).
session_alive() {
	for sa_stat in /proc/[0-9]*/stat; do
		sa_pid=${sa_stat#/proc/}
		sa_pid=${sa_pid%/stat}
		proc_stat "$sa_pid" || continue
		[ "$ps_session" = "$1" ] || continue
		[ "$ps_state" != Z ] || continue
		if [ "$sa_pid" = "$1" ] && [ "$ps_start" != "$2" ]; then
			continue
		fi
		return 0
	done
	return 1
}

# read_boot: sets boot to this boot's id (a reboot changes it).
read_boot() {
	boot=
	read -r boot 2>/dev/null </proc/sys/kernel/random/boot_id
	boot=${boot:-unknown}
}

# ---------------------------------------------------------------------------------------
# Framing

new_nonce() {
	# shellcheck disable=SC2046 # od prints the bytes as words; joining them is the point
	set -- $(od -An -N16 -tx1 /dev/urandom)
	nonce=
	for nb in "$@"; do nonce=$nonce$nb; done
	case $nonce in
	'' | *[!0-9a-f]*) nonce= ;;
	esac
	[ "${#nonce}" -eq 32 ]
}

frame() {
	printf 'OPMARK/1 %s %s\n' "$nonce" "$*" >&3
}

hello() {
	printf 'OPMARK/1 %s H v=%s%s\n' "$nonce" "$OPMARK_SHIM_VERSION" "${call_token:+ c=$call_token}"
	frame "H v=$OPMARK_SHIM_VERSION${call_token:+ c=$call_token}"
}

refuse() {
	drop_spools
	frame "R $*"
	exit 0
}

drop_spools() {
	[ -n "${cmd_spool:-}" ] && rm -f "$cmd_spool"
	[ -n "${spool:-}" ] && rm -f "$spool"
}

# ---------------------------------------------------------------------------------------
# The marker root

setup_root() {
	root=${OPMARK_ROOT:-${XDG_STATE_HOME:-${HOME:-}/.local/state}/opmark}
	case $root in
	/*) ;;
	*) refuse "root_unusable reason=not_absolute" ;;
	esac
	# A reboot clears these, and with them the evidence that an operation ran.
	case $root/ in
	/tmp/* | /dev/shm/* | /run/* | /var/run/*) refuse "root_unusable reason=volatile_path" ;;
	esac
	if ! [ -d "$root/superseded" ]; then
		mkdir -p "$root/ops" "$root/spool" "$root/superseded" 2>/dev/null
		chmod 700 "$root" 2>/dev/null
	fi
	[ -w "$root/ops" ] || refuse "root_unusable reason=not_writable"
	exec 2>>"$root/shim.log"
}

# state OP: sets st (absent|fenced|completed|running|interrupted) and why.
state() {
	m="$root/ops/$1"
	why=
	if ! [ -d "$m" ]; then
		st=absent
	elif [ -f "$m/fenced" ]; then
		st=fenced
	elif [ -f "$m/exit" ]; then
		st=completed
	elif [ -f "$m/proc" ]; then
		rget "$m/proc" pid
		s_pid=$rv
		rget "$m/proc" start
		s_start=$rv
		rget "$m/proc" boot
		read_boot
		if [ "$rv" != "$boot" ]; then
			st=interrupted why=reboot
		elif alive "$s_pid" "$s_start" || session_alive "$s_pid" "$s_start"; then
			st=running
		elif [ -f "$m/exit" ]; then
			st=completed
		else
			st=interrupted why=process_gone
		fi
	elif [ -f "$m/claim" ]; then
		rget "$m/claim" fg_pid
		c_pid=$rv
		rget "$m/claim" fg_start
		c_start=$rv
		rget "$m/claim" boot
		read_boot
		if [ "$rv" = "$boot" ] && alive "$c_pid" "$c_start"; then
			st=running why=starting
		elif [ -f "$m/proc" ]; then
			state "$1"
		else
			st=interrupted why=never_started
		fi
	elif [ -n "$(find "$m" -prune -mmin -1 2>/dev/null)" ]; then
		# Between a claimer's mkdir and its claim record: a few microseconds normally.
		st=running why=claiming
	else
		st=interrupted why=never_started
	fi
}

# describe: the fields of a probe or refusal for the current marker $m.
describe() {
	d="state=$st"
	[ -n "$why" ] && d="$d why=$why"
	rget "$m/claim" fingerprint && d="$d fp=$rv"
	for dk in attempt family claimed_at; do
		rget "$m/claim" "$dk" && d="$d $dk=$rv"
	done
	if [ "$st" = completed ]; then
		for dk in code timed_out ended_at; do
			rget "$m/exit" "$dk" && d="$d $dk=$rv"
		done
	fi
	if [ "$st" = fenced ]; then
		rget "$m/fenced" fenced_at && d="$d fenced_at=$rv"
	fi
	if [ -f "$m/out" ] || [ -f "$m/err" ]; then
		sizes
		d="$d out=$so err=$se"
	fi
	printf '%s' "$d"
}

# sizes: so/se, the captured stdout/stderr byte counts (one wc for both).
sizes() {
	so=0 se=0
	[ -f "$m/out" ] && [ -f "$m/err" ] || return 0
	# shellcheck disable=SC2046 # wc's words: count name count name total
	set -- $(wc -c "$m/out" "$m/err")
	so=$1 se=$3
}

# ---------------------------------------------------------------------------------------
# Streaming: copy what the command wrote since offsets oo/eo, and wait for more without
# polling for the end: the supervisor writes to our wake-up FIFO when the exit record is
# down; a timer only paces live output and the check that the process still exists.

emit() {
	sizes
	if [ "$so" -gt "$oo" ]; then
		tail -c +"$((oo + 1))" "$m/out" | head -c "$((so - oo))"
		oo=$so
		emitted=1
	fi
	if [ "$se" -gt "$eo" ]; then
		frame "E $((se - eo))"
		tail -c +"$((eo + 1))" "$m/err" | head -c "$((se - eo))" >&3
		eo=$se
		emitted=1
	fi
}

trailer() {
	t_out=0 t_err=0
	[ -f "$m/out.dropped" ] && read -r t_out <"$m/out.dropped"
	[ -f "$m/err.dropped" ] && read -r t_err <"$m/err.dropped"
	rget "$m/exit" code
	t=$rv
	rget "$m/exit" timed_out
	t="$t out=$oo err=$eo timed_out=$rv dropped_out=$t_out dropped_err=$t_err"
	rget "$m/claim" attempt
	frame "X code=$t attempt=$rv"
}

# register_waiter [MORE_FIFOS...]: a wake-up FIFO for this foreground (and, for run,
# the supervisor's capture FIFOs in the same mkfifo call).
register_waiter() {
	wf="$m/.w.$nonce"
	mkfifo "$wf" "$@" && exec 5<>"$wf"
}

# follow M OUT_OFFSET ERR_OFFSET: stream until the exit record exists (trailer X) or the
# process is gone without one (frame I).
follow() {
	m=$1 oo=$2 eo=$3 fresh=${4:-}
	iv=0.05
	while :; do
		emitted=
		if [ -n "$fresh" ]; then
			# Just started: nothing to copy or check yet; go straight to waiting.
			fresh=
			wait_wake
			continue
		fi
		emit
		if [ -f "$m/exit" ]; then
			emit
			trailer
			break
		fi
		state "${m##*/}"
		if [ "$st" != running ]; then
			[ -f "$m/exit" ] && continue
			frame "I $(describe)"
			break
		fi
		if [ -n "$emitted" ]; then
			iv=0.05
		else
			case $iv in
			0.05) iv=0.1 ;;
			0.1) iv=0.2 ;;
			*) iv=0.5 ;;
			esac
		fi
		wait_wake
	done
}

# wait_wake: blocks until the supervisor writes "x" (exit record down) or a timer of
# $iv seconds writes "t" (time to copy live output and check the process).
wait_wake() {
	(
		sleep "$iv"
		printf 't\n' >&5
	) &
	timer=$!
	wake=
	read -r wake <&5
	[ "$wake" = x ] && kill "$timer" 2>/dev/null
}

# ---------------------------------------------------------------------------------------
# Verbs

# run OP ATTEMPT FP FAMILY TIMEOUT_S CAP_BYTES STDIN_BYTES|- STDIN_SHA256|- SUPERSEDE
#     CMD_BYTES; the channel's data holds the command (CMD_BYTES), then the stdin.
verb_run() {
	[ "$#" -eq 10 ] || refuse "bad_args reason=argument_count"
	op=$1 attempt=$2 fp=$3 family=$4 timeout=$5 cap=$6 in_bytes=$7 in_sum=$8 sup=$9
	shift 9
	cmd_bytes=$1
	valid_id "$op" || refuse "invalid_op_id"
	valid_id "$attempt" || refuse "bad_args reason=attempt_id"
	case $fp in
	*[!0-9a-f]*) refuse "bad_args reason=fingerprint" ;;
	esac
	[ "${#fp}" -eq 64 ] || refuse "bad_args reason=fingerprint"
	case $family in
	read-only | convergent | append-only | destructive) ;;
	*) refuse "bad_args reason=family" ;;
	esac
	if ! is_uint "$timeout" || ! is_uint "$cap"; then
		refuse "bad_args reason=timeout_or_cap"
	fi
	if ! is_uint "$cmd_bytes" || [ "$cmd_bytes" -eq 0 ]; then
		refuse "bad_args reason=command_bytes"
	fi
	command -v setsid >/dev/null 2>&1 || refuse "cannot_start reason=no_setsid"
	setup_root

	# Receive the command, then stdin, into unclaimed spool files first: a connection
	# lost halfway must not leave a claim whose command is cut short or would read half
	# an input. dd with count_bytes,fullblock reads exactly CMD_BYTES and never past them
	# (busybox `head -c` reads ahead into the stdin that follows).
	spool=
	cmd_spool="$root/spool/$attempt.$$.cmd"
	dd of="$cmd_spool" bs=65536 count="$cmd_bytes" iflag=count_bytes,fullblock 2>/dev/null ||
		refuse "bad_command reason=read_failed"
	got=$(wc -c <"$cmd_spool")
	if [ "$((got + 0))" -ne "$cmd_bytes" ]; then
		refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=$((got + 0))"
	fi
	if [ "$in_bytes" != - ]; then
		is_uint "$in_bytes" || refuse "bad_args reason=stdin_bytes"
		spool="$root/spool/$attempt.$$"
		cat >"$spool" || refuse "bad_stdin reason=read_failed"
		got=$(wc -c <"$spool")
		if [ "$((got + 0))" -ne "$in_bytes" ]; then
			rm -f "$spool"
			refuse "bad_stdin reason=size_mismatch expected=$in_bytes got=$((got + 0))"
		fi
		if command -v sha256sum >/dev/null 2>&1; then
			got=$(sha256sum <"$spool")
			if [ "${got%% *}" != "$in_sum" ]; then
				rm -f "$spool"
				refuse "bad_stdin reason=digest_mismatch"
			fi
		fi
	fi

	m="$root/ops/$op"
	if ! mkdir "$m" 2>/dev/null; then
		answer_taken_claim
		# Only reached after an interrupted claim was superseded: claim again, once.
		if ! mkdir "$m" 2>/dev/null; then
			state "$op"
			refuse "$st $(describe)"
		fi
	fi
	proc_stat "$$"
	read_boot
	durable_write "$m" claim "attempt=$attempt
fingerprint=$fp
family=$family
shim=$OPMARK_SHIM_VERSION
claimed_at=$(now)
fg_pid=$$
fg_start=$ps_start
boot=$boot" "$root/ops" || refuse "root_unusable reason=claim_write_failed"
	if ! mv -f "$cmd_spool" "$m/cmd"; then
		# As for a failed start below: nothing ran; release the op id.
		mkdir "$m/started" 2>/dev/null
		mv -f "$m" "$root/superseded/$op.$(now).$attempt.failed-start"
		refuse "root_unusable reason=claim_write_failed"
	fi
	cmd_spool=
	[ -n "$spool" ] && mv -f "$spool" "$m/stdin"
	: >"$m/out"
	: >"$m/err"
	register_waiter "$m/.out.fifo" "$m/.err.fifo"
	if ! setsid -f "$OPMARK_SHELL" -c "$OPMARK_SHIM_SELF" opmark-shim "$OPMARK_SHIM_SELF" \
		supervise "$m" "$timeout" "$cap" </dev/null >/dev/null 2>&1; then
		# Nothing can have run: the supervisor never passed the start gate. Fence the gate
		# so a late supervisor cannot start either, then release the op id.
		mkdir "$m/started" 2>/dev/null
		mv -f "$m" "$root/superseded/$op.$(now).$attempt.failed-start"
		# busybox's setsid has no -f: a host to fix, not a failure to retry.
		setsid -f true </dev/null >/dev/null 2>&1 || refuse "cannot_start reason=setsid_without_f"
		refuse "cannot_start reason=setsid_failed"
	fi
	frame "S attempt=$attempt"
	follow "$m" 0 0 fresh
}

# The marker is taken: answer with its state instead of running (or supersede an
# interrupted claim when the client says policy allows it, then return to claim again).
answer_taken_claim() {
	state "$op"
	if [ "$st" = fenced ]; then
		refuse "fenced $(describe)"
	fi
	if [ -f "$m/claim" ]; then
		rget "$m/claim" fingerprint
		[ "$rv" = "$fp" ] || refuse "conflict $(describe)"
	fi
	case $st in
	completed)
		# replay=1: the recorded output and the exit frame follow (other verbs' refusals
		# end the reply).
		frame "R completed replay=1 $(describe)"
		drop_spools
		follow "$m" 0 0
		exit 0
		;;
	running) refuse "running $(describe)" ;;
	interrupted)
		[ "$sup" = 1 ] || refuse "interrupted $(describe)"
		supersede_marker "$attempt" || refuse "interrupted $(describe)"
		frame "U superseded_by=$attempt"
		;;
	*) refuse "$st $(describe)" ;;
	esac
}

# supersede_marker BY: moves an interrupted claim aside (kept for audit). Taking the start
# gate first means a supervisor that has not started yet never will.
supersede_marker() {
	mkdir "$m/started" 2>/dev/null
	state "${m##*/}"
	[ "$st" = interrupted ] || return 1
	printf 'superseded_by=%s\nsuperseded_at=%s\n' "$1" "$(now)" >"$m/superseded"
	mv "$m" "$root/superseded/${m##*/}.$(now).$1" || return 1
	sync "$root/ops"
}

# supervise M TIMEOUT_S CAP: the detached supervisor (own session, started by
# `setsid -f` so signals are normal). Runs the command in $M/cmd once and records its
# exit.
supervise() {
	m=$1 timeout=$2 cap=$3
	exec 2>>"${m%/ops/*}/shim.log"
	proc_stat "$$"
	read_boot
	# If the marker was moved aside meanwhile, this write fails and nothing runs. No
	# fsync: after a crash the boot id changes and this record is moot anyway.
	printf 'pid=%s\nstart=%s\nboot=%s\n' "$$" "$ps_start" "$boot" >"$m/.proc.tmp" &&
		mv -f "$m/.proc.tmp" "$m/proc" || exit 1
	mkdir "$m/started" 2>/dev/null || exit 1
	trap 'sv_term=1' TERM
	# Under heavy load supervisors were seen dying of a SIGPIPE they never wrote for
	# (always while the deadline killer swept the session). Caught, not ignored: the
	# command still gets the default disposition (a handler resets on exec).
	trap 'sv_pipe=1' PIPE HUP
	killer=
	if [ "$timeout" -gt 0 ]; then
		kill_after "$timeout" "$$" "$m" &
		killer=$!
	fi
	input=/dev/null
	[ -f "$m/stdin" ] && input="$m/stdin"
	[ -p "$m/.out.fifo" ] && [ -p "$m/.err.fifo" ] || exit 1
	unbuffered=
	command -v stdbuf >/dev/null 2>&1 && unbuffered=1
	capture "$m/out" "$cap" <"$m/.out.fifo" &
	cap_out=$!
	capture "$m/err" "$cap" <"$m/.err.fifo" &
	cap_err=$!
	cd "${HOME:-/}" 2>/dev/null || cd /
	unset OPMARK_SH OPMARK_ROOT OPMARK_SHIM_SELF
	# As `sh -c CMD` would run it, whatever its size (an argument is capped at 128 KiB)
	# and without showing it in `ps`: $0 is the shell, no positional parameters, no
	# variable of ours (c is unset by the eval before the command's first word).
	# shellcheck disable=SC2016 # expanded by the command's shell, not here
	"$OPMARK_SHELL" -c 'c=$(cat -- "$1") || exit 126
eval "unset c; set --; $c
"' "$OPMARK_SHELL" "$m/cmd" <"$input" >"$m/.out.fifo" 2>"$m/.err.fifo"
	code=$?
	# Settle the deadline killer before writing anything: asleep, TERM ends it; already
	# sweeping (it ignores TERM then), let it finish, so that its sweep can neither be
	# cut short (leaving the command's children alive) nor hit our own helpers.
	if [ -n "$killer" ]; then
		kill -TERM "$killer" 2>/dev/null
		while kill -0 "$killer" 2>/dev/null; do
			wait "$killer"
		done
	fi
	# The captures end when every writer of the FIFOs has closed them (the command and
	# anything it left running with its output), as with ssh itself. A trapped TERM
	# interrupts `wait`, hence the loop.
	for cp in "$cap_out" "$cap_err"; do
		while kill -0 "$cp" 2>/dev/null; do
			wait "$cp"
		done
	done
	timed_out=0
	[ -f "$m/timed_out" ] && timed_out=1
	record="code=$code
timed_out=$timed_out
ended_at=$(now)"
	# A second try covers a helper (sync, mv) lost to a signal sweep under heavy load.
	durable_write "$m" exit "$record" || durable_write "$m" exit "$record" || exit 1
	for w in "$m"/.w.*; do
		[ -p "$w" ] && printf 'x\n' 1<>"$w"
	done
	# Off the waiters' path: they are awake already.
	rm -f "$m/.out.fifo" "$m/.err.fifo" "$m"/.w.*
}

# capture FILE CAP: keeps the first CAP bytes and counts the rest, always draining so
# the command never blocks on a full pipe nor dies of SIGPIPE.
capture() {
	# head -c counts bytes exactly but holds a stdio buffer when writing to a file, which
	# would hide live output until the end: unbuffer it where coreutils' stdbuf exists.
	# (dd count_bytes is no substitute: it counts a short pipe read as a whole block.)
	if [ -n "$unbuffered" ]; then
		stdbuf -o0 head -c "$2" >"$1"
	else
		head -c "$2" >"$1"
	fi
	# Count and drop what is past the cap (binary-safe, so wc rather than read).
	c_rest=$(wc -c)
	[ "$((c_rest + 0))" -gt 0 ] && printf '%s\n' "$((c_rest + 0))" >"$1.dropped"
}

# kill_after SECONDS SID M: at the deadline, TERM everything of the supervisor's session
# but the supervisor and this killer, then KILL what is left after a grace period. The
# supervisor is never signalled, so it always lives to write the exit record. (Sending
# TERM to the whole process group lost a supervisor now and then under heavy load.)
kill_after() {
	sleep "$1" &
	ka_sleep=$!
	trap 'kill "$ka_sleep" 2>/dev/null; exit 0' TERM
	wait "$ka_sleep"
	trap '' TERM
	: >"$3/timed_out"
	# shellcheck disable=SC2016 # $PPID belongs to the child shell: it names this process
	me=$(exec "$OPMARK_SHELL" -c 'echo "$PPID"')
	signal_session TERM "$2" "$me"
	sleep 2
	signal_session KILL "$2" "$me"
}

# signal_session SIG SID SPARE: sends SIG to every live process of session SID except
# its leader (the supervisor) and SPARE. Builtins only, so nothing it starts is hit.
signal_session() {
	for ka in /proc/[0-9]*/stat; do
		ka_pid=${ka#/proc/}
		ka_pid=${ka_pid%/stat}
		[ "$ka_pid" = "$2" ] || [ "$ka_pid" = "$3" ] && continue
		proc_stat "$ka_pid" && [ "$ps_session" = "$2" ] && kill -"$1" "$ka_pid" 2>/dev/null
	done
}

# probe OP
verb_probe() {
	[ "$#" -eq 1 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	setup_root
	state "$1"
	frame "P $(describe)"
}

# attach OP OUT_OFFSET ERR_OFFSET
verb_attach() {
	[ "$#" -eq 3 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	if ! is_uint "$2" || ! is_uint "$3"; then
		refuse "bad_args reason=offset"
	fi
	setup_root
	state "$1"
	case $st in
	absent | fenced) refuse "$st $(describe)" ;;
	esac
	frame "A $(describe)"
	register_waiter
	follow "$m" "$2" "$3"
	# (A run's supervisor removes its waiters; an attach may come after it is gone.)
	rm -f "$wf"
}

# fence OP FORCE: tombstone so the op id can never be claimed. Without FORCE only an
# absent or never-started claim is fenced; FORCE (an operator's not-applied decision)
# also fences an interrupted one.
verb_fence() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	setup_root
	m="$root/ops/$1"
	if mkdir "$m" 2>/dev/null; then
		mkdir "$m/started"
	else
		state "$1"
		case $st in
		fenced)
			frame "F already_fenced $(describe)"
			exit 0
			;;
		interrupted)
			# Take the start gate: if the supervisor never started, now it never will.
			mkdir "$m/started" 2>/dev/null || [ "$2" = 1 ] || refuse "$st $(describe)"
			;;
		*) refuse "$st $(describe)" ;;
		esac
	fi
	sync "$root/ops"
	durable_write "$m" fenced "fenced_at=$(now)" || refuse "root_unusable reason=fence_write_failed"
	st=fenced why=
	frame "F fenced $(describe)"
}

# supersede OP BY_ATTEMPT
verb_supersede() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	valid_id "$2" || refuse "bad_args reason=attempt_id"
	setup_root
	state "$1"
	[ "$st" = interrupted ] || refuse "$st $(describe)"
	supersede_marker "$2" || refuse "$st $(describe)"
	frame "U superseded_by=$2"
}

# gc MAX_AGE_S DRY_RUN: removes completed or fenced markers whose record is older than
# MAX_AGE_S; never a running or interrupted one.
verb_gc() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	is_uint "$1" || refuse "bad_args reason=age"
	setup_root
	limit=$(($(now) - $1))
	removed=0 kept=0
	for g in "$root"/ops/*; do
		[ -d "$g" ] || continue
		g_op=${g##*/}
		state "$g_op"
		case $st in
		completed) rget "$m/exit" ended_at && g_at=$rv ;;
		fenced) rget "$m/fenced" fenced_at && g_at=$rv ;;
		*)
			kept=$((kept + 1))
			continue
			;;
		esac
		if is_uint "$g_at" && [ "$g_at" -le "$limit" ]; then
			frame "G remove op=$g_op state=$st at=$g_at"
			[ "$2" = 1 ] || rm -rf "$g"
			removed=$((removed + 1))
		else
			kept=$((kept + 1))
		fi
	done
	[ "$2" = 1 ] || sync "$root/ops"
	frame "G done removed=$removed kept=$kept dry_run=$2"
}

# doctor: facts about the marker root for `opmark doctor`.
verb_doctor() {
	root=${OPMARK_ROOT:-${XDG_STATE_HOME:-${HOME:-}/.local/state}/opmark}
	frame "K root=$root"
	# setsid must be util-linux's: busybox's has no -f, and the supervisor needs it.
	if ! command -v setsid >/dev/null 2>&1; then
		dr_setsid=no
	elif setsid -f true </dev/null >/dev/null 2>&1; then
		dr_setsid=yes
	else
		dr_setsid=no_f
	fi
	frame "K shell=$OPMARK_SHELL login_shell=${SHELL:-unknown} setsid=$dr_setsid"
	dr_missing=
	for dr_tool in cat date dd find head mkdir mkfifo mv od rm sleep sync tail wc; do
		command -v "$dr_tool" >/dev/null 2>&1 || dr_missing="$dr_missing${dr_missing:+,}$dr_tool"
	done
	# The command is read with dd's count_bytes (exactly its size, never past it).
	if ! printf x | dd of=/dev/null bs=64 count=1 iflag=count_bytes,fullblock 2>/dev/null; then
		dr_missing="$dr_missing${dr_missing:+,}dd_count_bytes"
	fi
	frame "K missing=${dr_missing:-none}"
	if mkdir -p "$root/ops" 2>/dev/null && [ -w "$root/ops" ] &&
		(: >"$root/.doctor.$$") 2>/dev/null; then
		rm -f "$root/.doctor.$$"
		frame "K writable=yes"
	else
		frame "K writable=no"
	fi
	fs=$(stat -f -c %T "$root" 2>/dev/null || echo unknown)
	frame "K fstype=$fs"
	avail=$(df -Pk "$root" 2>/dev/null | awk 'NR==2 {print $4}')
	frame "K avail_kib=${avail:-unknown}"
	read_boot
	frame "K boot_id=$boot"
	frame "K done"
}

# ---------------------------------------------------------------------------------------
# Entry

verb=${1:-}
[ "$#" -gt 0 ] && shift
if [ "$verb" = supervise ]; then
	supervise "$@"
	exit 0
fi
exec 3>&2 2>/dev/null
new_nonce || {
	printf 'opmark-shim: cannot read /dev/urandom\n' >&3
	exit 3
}
hello
# Act only when the replies reach the client (sshd gives pipes or sockets). A startup
# file that sent our output elsewhere (`exec >/dev/null`) would let a claim happen that
# the client never hears of, while a channel that closes without our header is its
# evidence that nothing ran.
for tb in 1 3; do
	[ -e "/dev/fd/$tb" ] || continue
	[ -p "/dev/fd/$tb" ] || [ -S "/dev/fd/$tb" ] || exit 3
done
case $verb in
run) verb_run "$@" ;;
probe) verb_probe "$@" ;;
attach) verb_attach "$@" ;;
fence) verb_fence "$@" ;;
supersede) verb_supersede "$@" ;;
gc) verb_gc "$@" ;;
doctor) verb_doctor "$@" ;;
*) refuse "bad_args reason=unknown_verb" ;;
esac
exit 0
