# ---------------------------------------------------------------------------------------
# The detached supervisor

# supervise M TIMEOUT_S CAP CMD_BYTES ATTEMPT: the detached supervisor (own session,
# started by detach so signals are as under ssh). Runs the command in $M/cmd once and
# records its exit, if $M still holds the claim of ATTEMPT.
supervise() {
	m=$1 timeout=$2 cap=$3 cmd_bytes=${4:-} sv_attempt=${5:-}
	# `true` first: a failed redirection of `exec` would end the shell before it can
	# tell anyone (a full disk with no shim.log yet).
	true 2>>"${m%/ops/*}/shim.log" && exec 2>>"${m%/ops/*}/shim.log"
	clock=${m%/ops/*}/clock
	# Only our own attempt's claim (docs/host-protocol.md#the-supervisor): a supervisor that comes up late, after its
	# foreground set the claim aside (and a rerun may have claimed the op id again), finds
	# another claim at $m, or none, and leaves it alone. From the marker's directory every
	# step up to the start gate goes through "." (that directory, wherever a rename takes
	# it), so the gate can only be taken on the claim checked here.
	# The login directory (we were started in it), for the command: back there below.
	sv_login_dir=$PWD
	cd "$m" 2>/dev/null || exit 0
	rget claim attempt
	if [ -z "$sv_attempt" ] || [ "$rv" != "$sv_attempt" ]; then
		printf 'opmark-shim: %s: not the claim of attempt %s; left alone\n' "$m" "$sv_attempt" >&2
		exit 0
	fi
	# The fingerprint index's temp name our foreground linked its slot from (see
	# repeat_check), removed with our own leftovers at the end.
	sv_ixtmp='' sv_fp=''
	rget claim fingerprint && sv_fp=$rv && rget claim fg_pid && sv_fgp=$rv &&
		rget claim fg_start && sv_ixtmp=${m%/ops/*}/fp/$sv_fp/.t.$sv_fgp.$rv
	case $sv_fp in
	'' | *[!0-9a-f]*) sv_ixtmp= ;;
	esac
	proc_stat "$$"
	sv_start=$ps_start
	read_boot
	# We hold the FIFOs' write ends (6, 7) until the command holds its own, so that the
	# captures can open them at once and start (their processes, not their reading)
	# while the claim is made durable, which takes the disk's time rather than the
	# processor's; a capture that opened its FIFO before any writer would wait for the
	# command instead. (`command` keeps a failed open from ending the shell.)
	if ! [ -p .out.fifo ] || ! [ -p .err.fifo ] ||
		! { command exec 6<>.out.fifo 7<>.err.fifo; } 2>/dev/null; then
		start_failed
	fi
	unbuffered=
	command -v stdbuf >/dev/null 2>&1 && unbuffered=1
	capture out "$cap" <.out.fifo &
	cap_out=$!
	capture err "$cap" <.err.fifo &
	cap_err=$!
	# With secrets, the command writes into FIFOs of its own, read by a redactor each
	# that writes into the captures' (4 and 9 held here as 6 and 7 are, see above); the
	# redactors have the forms in their environment, the command none of them.
	sv_raw='' sv_o=6 sv_e=7
	if [ "${_OPMARK_RN:-0}" != 0 ]; then
		if ! { mkfifo .out.raw .err.raw && command exec 4<>.out.raw 9<>.err.raw; } 2>/dev/null; then
			start_failed
		fi
		redactor <.out.raw >&6 &
		redactor <.err.raw >&7 &
		sv_raw=1 sv_o=4 sv_e=9
		sv_i=1
		while [ "$sv_i" -le "$_OPMARK_RN" ]; do
			unset "_OPMARK_R_$sv_i" "_OPMARK_RL_$sv_i"
			sv_i=$((sv_i + 1))
		done
	fi
	unset _OPMARK_RN
	# The claim is durable before anything can run (the foreground wrote it and went on
	# to start us). Our record is complete before the start gate is taken, so whoever sees
	# the gate taken finds it whole; no fsync for it: after a crash the boot id changes
	# and it is moot anyway. If the marker was moved aside meanwhile, these fail and
	# nothing runs (the captures read EOF once we are gone).
	if ! sync claim . .. ||
		! printf 'pid=%s\nstart=%s\ncaptures=%s,%s\nboot=%s\n' "$$" "$sv_start" "$cap_out" "$cap_err" "$boot" >proc; then
		start_failed
	fi
	# The claim's host locks, before the gate: while it waits the marker reads running
	# (the record above names a live supervisor), and nothing has started.
	take_locks
	take_gate . || start_failed
	trap 'sv_term=1' TERM
	# Under heavy load supervisors were seen dying of a SIGPIPE they never wrote for
	# (always while the deadline killer swept the session). Caught, not ignored: the
	# command still gets the default disposition (a handler resets on exec).
	trap 'sv_pipe=1' PIPE HUP
	killer=
	if [ "$timeout" -gt 0 ]; then
		kill_after "$timeout" "$$" "$m" "$sv_start" "$cap_out,$cap_err" 4>&- 9>&- &
		killer=$!
	fi
	input=/dev/null
	[ -f "$m/stdin" ] && input="$m/stdin"
	# The command runs as sshd runs one (session.c: `execve(shell, [basename, "-c",
	# command])`): by the login shell, i.e. $SHELL as sshd set it from passwd (no process
	# to find it); where that is unset, not absolute or not executable (an sshd_config
	# SetEnv or a startup file changed it), by the passwd entry's shell as sshd itself
	# would (getent), and by /bin/sh where that is empty too, as sshd does for an empty
	# passwd field. In the login directory (where sshd started the login shell, or where
	# its startup files went: we never left it); with the login's environment, umask and
	# LC_ALL (taken at the top), none of our variables, and positional parameters, $0
	# and $SHELL as under ssh. All in a subshell that becomes the shell: the supervisor
	# keeps its strict umask and C locale for the exit record.
	sv_umask=${OPMARK_LOGIN_UMASK:-} sv_lc=${OPMARK_LOGIN_LC_ALL:--}
	sv_secrets=${OPMARK_SECRET_NAMES:-} sv_list=${OPMARK_SECRET_LIST:-}
	unset OPMARK_SH OPMARK_ROOT OPMARK_SHIM_SELF OPMARK_START_LIMIT OPMARK_LOGIN_UMASK OPMARK_LOGIN_LC_ALL OPMARK_SECRET_NAMES OPMARK_SECRET_LIST
	# --become: the user the claim says the command runs as (see run_become).
	sv_become=
	rget claim become && [ "$rv" != - ] && sv_become=$rv
	sv_kind='command'
	rget claim kind && sv_kind=$rv
	sv_shell=${SHELL:-}
	case $sv_shell in
	/*) [ -f "$sv_shell" ] && [ -x "$sv_shell" ] || sv_shell= ;;
	*) sv_shell= ;;
	esac
	if [ -z "$sv_shell" ]; then
		sv_shell=$(getent passwd "$(id -u)" 2>/dev/null)
		sv_shell=${sv_shell##*:}
		case $sv_shell in
		/*) [ -f "$sv_shell" ] && [ -x "$sv_shell" ] || sv_shell=/bin/sh ;;
		*) sv_shell=/bin/sh ;;
		esac
	fi
	sv_name=${sv_shell##*/}
	# Shells of the sh family (sh, bash, dash, zsh, ksh, mksh, yash, posh, busybox ash)
	# read the command from its file and eval it at the top level, as -c would run it:
	# whatever its size (an argument is capped at 128 KiB) and without showing it in
	# `ps`. A short command is read by the shell's own `read` (no cat), a long one by cat
	# (`read` takes a system call per byte); the two variables are unset, and the
	# positional parameters cleared, before the command's first word. Other shells (fish,
	# tcsh/csh, anything unknown) take `-c` their own way and get the command as sshd
	# gives it, as the argument: there it shows in `ps` and is limited to 128 KiB, as
	# under ssh.
	case $sv_name in
	*csh | *fish*) sv_posix= ;;
	*sh | *sh[0-9]* | *sh-* | busybox) sv_posix=1 ;;
	*) sv_posix= ;;
	esac
	sv_small=no
	is_uint "$cmd_bytes" && [ "$cmd_bytes" -le 4096 ] && sv_small=yes
	(
		cd "$sv_login_dir" 2>/dev/null || cd "${HOME:-/}" 2>/dev/null || cd /
		case $sv_umask in
		'' | *[!0-7]*) ;;
		*) umask "$sv_umask" ;;
		esac
		case $sv_lc in
		=*)
			LC_ALL=${sv_lc#=}
			export LC_ALL
			;;
		*) unset LC_ALL ;;
		esac
		# A put's delivery (as --become's user too, see put_install) or a get's read
		# (never with --become: refused before the claim), in place of a command.
		case $sv_kind in
		put) put_install "$m" ;;
		get) get_send "$m" ;;
		esac
		[ -z "$sv_become" ] || run_become
		# Each secret under its own name (checked by read_secrets: a name, nothing else).
		for sv_n in $sv_secrets; do
			eval "$sv_n=\${_OPMARK_S_$sv_n}"
			unset "_OPMARK_S_$sv_n"
			export "${sv_n?}"
		done
		if [ -z "$sv_posix" ]; then
			sv_text=$(cat -- "$m/cmd") || exit 126
			# Its $0 is its argv[0], which sshd makes the shell's base name: exec'd by
			# that name when PATH finds this very shell (no other way in sh, and PATH
			# must stay the login's), else by its path.
			sv_found=$(command -v "$sv_name" 2>/dev/null)
			# -ef (one file under two paths: /bin and /usr/bin merged) is in dash, bash,
			# busybox; a test without it fails, which only costs the base name.
			# shellcheck disable=SC3013
			if [ "$sv_found" = "$sv_shell" ] || [ "$sv_found" -ef "$sv_shell" ]; then
				exec "$sv_name" -c "$sv_text"
			fi
			exec "$sv_shell" -c "$sv_text"
		fi
		# shellcheck disable=SC2016 # expanded by the command's shell, not here
		exec "$sv_shell" -c 'if [ "$2" = yes ]; then
_om_c= _om_l=
while IFS= read -r _om_l; do _om_c="$_om_c$_om_l
"; done <"$1" || exit 126
_om_c=$_om_c$_om_l
else _om_c=$(cat -- "$1") || exit 126; fi
eval "unset _om_c _om_l; set --; $_om_c
"' "$sv_name" "$m/cmd" "$sv_small"
	) <"$input" >&"$sv_o" 2>&"$sv_e" 6>&- 7>&- 4>&- 9>&-
	code=$?
	# The redactors' last newline (see redactor), and their end once nothing else writes.
	if [ -n "$sv_raw" ]; then
		printf '\n' >&4
		printf '\n' >&9
		exec 4>&- 9>&-
		rm -f .out.raw .err.raw
	fi
	# Whether a cancel's signal was on its way before the command ended (docs/host-protocol.md#cancel).
	sv_signalled=
	[ -f "$m/signalled" ] && sv_signalled=1
	exec 6>&- 7>&-
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
	# Stopped by a cancel only when its signal went out before the command ended and the
	# command died of it (TERM, or KILL after the grace); one that ended by itself while
	# the cancel was pending keeps its own status, marked cancel_pending=1 (docs/host-protocol.md#cancel).
	cancelled=0 cancel_pending=0
	if [ -f "$m/cancelled" ]; then
		if [ -n "$sv_signalled" ] && { [ "$code" = 143 ] || [ "$code" = 137 ]; }; then
			cancelled=1
		else
			cancel_pending=1
		fi
	fi
	now
	record="code=$code
timed_out=$timed_out
ended_at=$now
cancel_pending=$cancel_pending
cancelled=$cancelled"
	# Temp file, rename, sync (docs/host-protocol.md#the-claim: the exit record is never seen torn, even by a
	# reader that does not check for its last line). A second try covers a helper (sync,
	# mv) lost to a signal sweep under heavy load.
	if ! durable_write "$m" exit "$record" && ! durable_write "$m" exit "$record"; then
		# A full disk: renaming the file made before the claim counted needs no space, so
		# the marker says interrupted and why, instead of looking like a lost process.
		mv -f "$m/.noexit" "$m/exit_write_failed" && sync "$m"
		printf 'opmark-shim: %s: exit record (code=%s) could not be written\n' "$m" "$code" >&2
		rm -f "$m/.exit.tmp.$$"
	fi
	# The next holder starts only once this command's end is on record.
	release_locks
	for w in "$m"/.w.*; do
		[ -p "$w" ] && printf 'x\n' 1<>"$w"
	done
	# Spill segments nobody is left to stream (never part of the kept copy); a live
	# follower removes what it streamed itself.
	if ! followed; then
		for sp in "$m"/out.s.* "$m"/err.s.*; do
			[ -e "$sp" ] && rm -f "$sp"
		done
	fi
	# Off the waiters' path: they are awake already.
	rm -f "$m/.out.fifo" "$m/.err.fifo" "$m"/.w.* "$m/.noexit" ${sv_ixtmp:+"$sv_ixtmp"}
}

# start_failed: the supervisor gives up before the start gate, so nothing ran: it tells
# the waiting foreground, which answers for it, instead of leaving it waiting for an exit.
# (Run in the marker's directory: its own claim's waiters, wherever it was moved.)
start_failed() {
	release_locks
	# The cause is read now, while the disk is as it was: once we are gone, another
	# process's tidy-up may free what the foreground would find missing.
	root=${m%/ops/*}
	resource_cause
	for w in .w.*; do
		[ -p "$w" ] && printf 'f %s\n' "$cause" 1<>"$w"
	done
	exit 1
}

# resource_cause [MESSAGE]: sets cause to why a write under the marker root failed:
# no_inodes, no_space, quota_exceeded, or write_failed when none of these can be seen.
# MESSAGE: what the failed write said, when it was kept (the disk may have changed since).
# Above the supervisor's end of reading (see standby): start_failed needs it there.
resource_cause() {
	cause=write_failed rc_err=${1:-}
	# shellcheck disable=SC2046 # df's words: filesystem, total, used, free, ...
	set -- $(df -Pi "$root" 2>/dev/null | tail -n 1)
	# Fewer free inodes than a claim and its records take (about 14): the write ran out
	# of them, even when a moment's temp file (another call's, freed since) left some.
	is_uint "${4:-x}" && [ "$4" -lt 16 ] && cause=no_inodes && return 0
	case $rc_err in
	*[Qq]uota*) cause=quota_exceeded && return 0 ;;
	*"No space"*) cause=no_space && return 0 ;;
	esac
	# shellcheck disable=SC2046
	set -- $(df -Pk "$root" 2>/dev/null | tail -n 1)
	# A few KiB may still show free while every block a new file needs is taken.
	is_uint "${4:-x}" && [ "$4" -lt 16 ] && cause=no_space && return 0
	rc_msg=$( (true >"$root/spool/.probe.$$") 2>&1)
	rm -f "$root/spool/.probe.$$"
	case $rc_msg in
	*[Qq]uota*) cause=quota_exceeded ;;
	*"No space"*) cause=no_space ;;
	esac
	return 0
}

