# ---------------------------------------------------------------------------------------
# The resident host session (docs/host-protocol.md#the-resident-session)

# serve: one long-lived shim per kept connection. It answers requests, one per line of
# its stdin, until EOF, each in a subshell (an `exit` in a verb ends only that request,
# and no variable of one request reaches the next), and ends each reply with an end
# frame, so that a client knows the reply is whole on a channel that stays open. Every
# request is checked and answered exactly as a call of its own would be: its own call
# token and nonce, r= checked before the verb acts, the same verbs, the same frames. The
# supervisor of each command is still started detached (setsid), so it outlives the
# resident and the connection. An operator turns it off for a host with the file
# resident.off in the marker root, or OPMARK_RESIDENT=0 in the environment sshd gives the
# session: it then refuses, and the client calls the shim once per command.
verb_serve() {
	sv_root=${OPMARK_ROOT:-${XDG_STATE_HOME:-${HOME:-}/.local/state}/opmark}
	if [ "${OPMARK_RESIDENT:-1}" = 0 ] || [ -e "$sv_root/resident.off" ]; then
		refuse "cannot_start reason=resident_off"
	fi
	resident=$$
	find_setsid
	frame "Q ready pid=$$"
	sv_line=''
	while IFS= read -r sv_line; do
		set -f
		# shellcheck disable=SC2086 # a request is words without spaces or patterns
		set -- $sv_line
		set +f
		serve_one "$@"
		keep_standby
	done
	if [ -n "${sb_fifo:-}" ]; then
		exec 8>&-
		rm -f "$sb_fifo" "$sb_fifo.pid"
	fi
	exit 0
}

# serve_one q c=TOKEN [r=ROOT_ID] VERB ARGS...: one request. Anything else means the
# stream is out of step with the client: the resident ends rather than guess. So does a
# request that ended in any other way than its answer (a refusal before its data was
# read, a signal), since its data may be left unread.
serve_one() {
	[ "${1:-}" = q ] || exit 3
	shift
	call_token=
	case ${1:-} in
	c=*)
		call_token=${1#c=}
		shift
		;;
	esac
	case $call_token in
	'' | *[!0-9a-f]*) exit 3 ;;
	esac
	expect_root=
	case ${1:-} in
	r=*)
		expect_root=${1#r=}
		shift
		;;
	esac
	case $expect_root in
	*[!0-9a-f]*) expect_root=bad ;;
	esac
	# A nonce of this request's own, made here so that the end frame carries it too.
	new_nonce || exit 3
	(
		# The standby's FIFO is the resident's: a request opens it only to hand off.
		exec 8>&-
		# The subshell's own pid and start time, from one read of its stat line (its
		# check, identity_readable, uses the same line).
		self_line=
		read -r self_line 2>/dev/null </proc/self/stat
		fg=${self_line%% *}
		frame "H v=$OPMARK_SHIM_VERSION c=$call_token"
		dispatch "$@"
		exit 0
	)
	sv_rc=$?
	frame "Z c=$call_token status=$sv_rc"
	[ "$sv_rc" -eq 0 ] || exit 0
	# The script reached the cache with the first request that opened the root.
	shim_hash=
}

# beat CENTISECONDS: a resident's request that waits (following a command, a cancel)
# says "B" about twice a second, so that the client tells a resident that stopped
# answering (SIGSTOP, a hang) from a quiet command within its keepalive budget. A
# resident stopped while its request runs on says nothing either.
beat() {
	[ -n "$resident" ] || return 0
	bt_acc=$((${bt_acc:-0} + $1))
	[ "$bt_acc" -ge 50 ] || return 0
	bt_acc=0
	proc_stat "$resident" && [ "$ps_state" = T ] && return 0
	frame B
}

# dispatch VERB ARGS...: one verb's answer.
dispatch() {
	dp_verb=${1:-}
	[ "$#" -gt 0 ] && shift
	case $dp_verb in
	run) verb_run "$@" ;;
	probe) verb_probe "$@" ;;
	attach) verb_attach "$@" ;;
	repeats) verb_repeats "$@" ;;
	output) verb_output "$@" ;;
	fence) verb_fence "$@" ;;
	cancel) verb_cancel "$@" ;;
	supersede) verb_supersede "$@" ;;
	gc) verb_gc "$@" ;;
	doctor) verb_doctor "$@" ;;
	locks) verb_locks "$@" ;;
	*) refuse "bad_args reason=unknown_verb" ;;
	esac
}

