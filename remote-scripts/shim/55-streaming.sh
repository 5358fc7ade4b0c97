# ---------------------------------------------------------------------------------------
# Streaming: copy what the command wrote since offsets oo/eo, and wait for more without
# polling for the end: the supervisor writes to our wake-up FIFO when the exit record is
# down; a timer only paces live output and the check that the process still exists.

emit() {
	sizes
	emit_stream "$m/out" O "$oo" "$so"
	oo=$es_pos
	emit_stream "$m/err" E "$eo" "$se"
	eo=$es_pos
}

# emit_stream FILE KIND POS KEPT: sends what FILE (the kept copy, KEPT bytes so far) holds
# beyond stream position POS and, for a live follower, what the spill segments hold past
# the cap; sets es_pos to the position reached. A segment sent completely is removed, which
# lets the capture go on; a missing one ends this follower's stream there (another follower
# took it, or it was dropped while nobody followed): the trailer then says truncated.
emit_stream() {
	es_pos=$3
	if [ "$4" -gt "$es_pos" ]; then
		payload "$2" "$1" "$es_pos" "$(($4 - es_pos))"
		es_pos=$4
	fi
	[ -n "$live" ] && [ "$es_pos" -ge "$cap" ] || return 0
	while :; do
		es_seg="$1.s.$(((es_pos - cap) / SPILL_SEG))"
		es_off=$(((es_pos - cap) % SPILL_SEG))
		[ -f "$es_seg" ] || return 0
		es_size=$(wc -c <"$es_seg")
		if [ "$es_size" -gt "$es_off" ]; then
			payload "$2" "$es_seg" "$es_off" "$((es_size - es_off))"
			es_pos=$((es_pos + es_size - es_off))
		fi
		# Still being written: come back at the next wake-up.
		[ "$es_size" -ge "$SPILL_SEG" ] || return 0
		rm -f "$es_seg"
		emitted=1
	done
}

# payload KIND FILE OFFSET LEN: LEN bytes of FILE from OFFSET as committed output frames
# of at most PAYLOAD_MAX bytes each. The commit frame after each payload lets the client
# check that the bytes it counted were ours (bytes slipped in by another process make the
# next line fail the nonce).
payload() {
	pl_off=$3 pl_left=$4
	while [ "$pl_left" -gt 0 ]; do
		pl_n=$pl_left
		[ "$pl_n" -le "$PAYLOAD_MAX" ] || pl_n=$PAYLOAD_MAX
		frame "$1 $pl_n"
		tail -c +"$((pl_off + 1))" "$2" | head -c "$pl_n" >&3
		frame C
		pl_off=$((pl_off + pl_n)) pl_left=$((pl_left - pl_n))
	done
	emitted=1
}

trailer() {
	t_out=0 t_err=0
	[ -f "$m/out.dropped" ] && read -r t_out <"$m/out.dropped"
	[ -f "$m/err.dropped" ] && read -r t_err <"$m/err.dropped"
	rget "$m/exit" code
	t=$rv
	rget "$m/exit" timed_out
	t="$t out=$oo err=$eo kept_out=$so kept_err=$se timed_out=$rv dropped_out=$t_out dropped_err=$t_err"
	rget "$m/claim" attempt
	t="$t attempt=$rv"
	[ -f "$m/collected" ] && t="$t output_collected=1"
	rget "$m/exit" cancelled && [ "$rv" = 1 ] && t="$t cancelled=1"
	frame "X code=$t"
}

# register_waiter DIR [MORE_FIFOS...]: a wake-up FIFO for this foreground in marker DIR
# (and, for run, the supervisor's capture FIFOs in the same mkfifo call). Named by our
# pid and start time ($fg_start): the name is visible to every process of the user, and
# tells the capture that a live foreground follows.
register_waiter() {
	wf="$1/.w.$fg.$fg_start"
	shift
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
		if exited; then
			emit
			trailer
			# The spill segments a live follower streamed last (a short one at the end).
			if [ -n "$live" ] && { [ "$oo" -gt "$cap" ] || [ "$eo" -gt "$cap" ]; }; then
				rm -f "$m"/out.s.* "$m"/err.s.*
			fi
			break
		fi
		state "${m##*/}"
		if [ "$why" = starting ] && [ -n "${own_claim:-}" ]; then
			supervisor_overdue
		fi
		if [ "$st" != running ]; then
			exited && continue
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

# supervisor_overdue: our own claim still has no supervisor record. A supervisor that
# never came up (its shell missing, killed before its record: detach cannot tell)
# would leave us, and the client, waiting for good. After START_LIMIT seconds we take the
# start gate ourselves, so that it can never start, set the claim aside and answer that
# nothing ran. (A supervisor that took the gate first is running: we keep waiting.)
supervisor_overdue() {
	now
	so_since=${so_since:-$now}
	[ "$((now - so_since))" -ge "$START_LIMIT" ] || return 0
	take_gate "$m" || return 0
	kill "$timer" 2>/dev/null
	rm -f "$wf"
	mv -f "$m" "$root/superseded/$op.$now.$attempt.failed-start"
	sync "$root/ops" "$root/superseded"
	refuse "cannot_start reason=supervisor_lost"
}

# wait_wake: blocks until the supervisor writes "x" (exit record down) or a timer of
# $iv seconds writes "t" (time to copy live output and check the process).
wait_wake() {
	# Without the channel's descriptors: a timer outliving us (a kill ends this subshell,
	# not its sleep) must not hold the channel open.
	(
		exec </dev/null 3>&-
		sleep "$iv"
		printf 't\n' >&5
	) &
	timer=$!
	wake='' wake_cause=''
	read -r wake wake_cause <&5
	case $iv in
	0.05) beat 5 ;;
	0.1) beat 10 ;;
	0.2) beat 20 ;;
	*) beat 50 ;;
	esac
	[ "$wake" = x ] && kill "$timer" 2>/dev/null
	[ "$wake" = f ] && never_started
	return 0
}

# never_started: our supervisor gave up before the start gate (a full disk), so nothing
# ran. A claim made fresh is taken back, as when it could not be written; one that
# replaced an interrupted claim stays (reading interrupted), since the old evidence moved.
never_started() {
	kill "$timer" 2>/dev/null
	# The locks were not free in time: the supervisor took a fresh claim back itself
	# (whoever follows, if anyone), see lock_busy.
	case $wake_cause in
	lock_busy" "*) refuse "$wake_cause" ;;
	esac
	# What the supervisor saw when it gave up; else what the disk shows now.
	case $wake_cause in
	no_inodes | no_space | quota_exceeded) cause=$wake_cause ;;
	*) resource_cause ;;
	esac
	if [ -z "${superseded:-}" ] && ! [ -e "$m/started" ]; then
		rm -rf "$m"
		sync "$root/ops"
	fi
	refuse "root_unusable reason=$cause"
}

