# cancel OP GRACE_MS: stops the operation for good. Absent: fenced, so a delayed attempt
# can never run. Claimed but the command not started: the start gate is taken and the
# marker fenced. Running: TERM to its session (never the supervisor, which must live to
# write the exit record, marked cancelled=1), KILL after GRACE_MS, then wait for the
# record. Interrupted: fenced. Answers one frame "N <outcome> <marker fields>".
verb_cancel() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	is_uint "$2" || refuse "bad_args reason=grace"
	setup_root
	m="$root/ops/$1"
	if mkdir "$m" 2>/dev/null; then
		cancel_fence "$1" absent
	fi
	state "$1"
	case $st in
	fenced) cancel_answer already_fenced ;;
	completed) cancel_answer already_completed ;;
	interrupted)
		# Take the start gate: if the supervisor never started, now it never will. If
		# it had, the command may have had effects, and the fence must say so.
		take_gate "$m" || cf_started=1
		cancel_fence "$1" interrupted
		;;
	esac
	# Running. Whoever takes the start gate decides: if we do, the command never starts.
	if take_gate "$m"; then
		cancel_fence "$1" not_started
	fi
	# The gate is taken: the supervisor wrote its identity first (or a fence took it).
	cf_started=1
	state "$1"
	case $st in
	fenced) cancel_answer already_fenced ;;
	completed) cancel_answer already_completed ;;
	interrupted) cancel_fence "$1" interrupted ;;
	# Its processes cannot be seen here: nothing to signal, nothing asked.
	running) [ "$why" = liveness_unknown ] && cancel_answer still_running ;;
	# Moved aside by a concurrent supersede: say so rather than guess.
	*) refuse "$st $(describe)" ;;
	esac
	rget "$m/proc" pid
	cn_sid=$rv
	rget "$m/proc" start
	cn_start=$rv
	rget "$m/proc" captures
	cn_caps=$rv
	is_uint "$cn_sid" || refuse "running $(describe)"
	now
	durable_write "$m" cancelled "cancelled_at=$now
grace_ms=$2" || refuse "root_unusable reason=cancel_write_failed"
	# Just before the first signal: the supervisor reads it when the command ends, to
	# tell a command the signal stopped from one that ended by itself (docs/host-protocol.md#cancel).
	true >"$m/signalled"
	signal_session TERM "$cn_sid" "$$" "$cn_start" "$cn_caps"
	if ! cancel_wait "$(($2 / 100))"; then
		signal_session KILL "$cn_sid" "$$" "$cn_start" "$cn_caps"
		# The supervisor records the exit once its captures see the command gone.
		cancel_wait 300
	fi
	state "$1"
	case $st in
	completed)
		rget "$m/exit" cancelled
		if [ "$rv" = 1 ]; then
			cancel_answer cancelled
		fi
		cancel_answer already_completed
		;;
	interrupted) cancel_fence "$1" interrupted ;;
	*) cancel_answer "still_$st" ;;
	esac
}

# cancel_wait TENTHS: waits up to TENTHS/10 s for the exit record, or for the session
# to be gone; false when it is still running.
cancel_wait() {
	cw_left=$1
	while :; do
		exited && return 0
		alive "$cn_sid" "$cn_start" || session_alive "$cn_sid" "$cn_start" || return 0
		[ "$cw_left" -gt 0 ] || return 1
		cw_left=$((cw_left - 1))
		sleep 0.1
		beat 10
	done
}

# cancel_fence OP WAS: tombstones the marker $m (its start gate taken) and answers.
# cf_started=1: the supervisor had taken the gate first, so the command started and its
# outcome is unknown; the record keeps that, so no later reader takes the fence for
# "nothing ran".
cancel_fence() {
	take_gate "$m"
	sync "$root/ops"
	now
	durable_write "$m" fenced "fenced_at=$now
fenced_by=cancel
command_started=${cf_started:-0}" || fence_failed "$m" "$2"
	state "$1"
	frame "N fenced was=$2 $(describe)"
	exit 0
}

cancel_answer() {
	frame "N $1 $(describe)"
	exit 0
}

