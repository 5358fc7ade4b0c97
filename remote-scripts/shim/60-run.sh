# ---------------------------------------------------------------------------------------
# Verbs

# run OP ATTEMPT FP FAMILY TIMEOUT_S CAP_BYTES STDIN_BYTES|- STDIN_SHA256|- SUPERSEDE
#     REPEAT_S REPEAT_ACTION DECLARED|- SECRETS|- BECOME|- LOCKS|- LOCK_WAIT_S KIND
#     CMD_BYTES;
#     the channel's data holds the secrets block (see read_secrets), the command
#     (CMD_BYTES), then the stdin. BECOME: the user the command runs as through sudo (see
#     become_check). LOCKS: NAME:N,... in name order, the host locks the supervisor takes
#     before the command starts, waiting up to LOCK_WAIT_S seconds (see take_locks).
#     KIND: `command`; `put` (or `put:FROM`, resumed): the stdin is a file's content that
#     the supervisor delivers to the path the command text names (see put_install); `get`:
#     the supervisor sends the file the command text names (see get_send). For put and
#     get no command runs.
verb_run() {
	[ "$#" -eq 18 ] || refuse "bad_args reason=argument_count"
	op=$1 attempt=$2 fp=$3 family=$4 timeout=$5 cap=$6 in_bytes=$7 in_sum=$8 sup=$9
	shift 9
	rp_window=$1 rp_action=$2 rp_declared=$3 secrets=$4 become=$5 locks=$6 lock_wait=$7
	kind=$8 cmd_bytes=$9
	spool='' cmd_spool='' cmd_text=''
	# The secrets come first in the data: read before anything else (a resident that
	# refuses here ends, as the data was not read).
	[ -n "$resident" ] && sv_owed=1
	read_secrets "$secrets" || refuse "bad_args reason=secrets"
	if [ -n "$resident" ]; then
		# A resident's request: the data follows the request line and the next request
		# follows the data, so it is read by count, never to EOF. A short command alone
		# is read at once, before any check can refuse, so that a refusal leaves the
		# resident in step; otherwise a refusal before the data is read ends it.
		sv_owed=1
		if [ "$in_bytes" = - ] && is_uint "$cmd_bytes" && [ "$cmd_bytes" -gt 0 ] &&
			[ "$cmd_bytes" -le 4096 ]; then
			read_resident_command || refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=${#cmd_text}"
			sv_owed='' cmd_read=1
		fi
		# Started from the host's cached script, a resident detaches its supervisors
		# from that file: gone (a wiped marker root, gc of another version's cache), it
		# claims nothing and ends, and the client calls per call, which brings the
		# script again.
		if [ -n "$shim_file" ] && ! [ -f "$OPMARK_SHIM_SELF" ]; then
			sv_owed=1
			refuse "cannot_start reason=resident_stale"
		fi
	fi
	is_uint "$rp_window" || refuse "bad_args reason=repeat_window"
	valid_locks "$locks" || refuse "bad_args reason=locks"
	is_uint "$lock_wait" || refuse "bad_args reason=lock_wait"
	put_from=0
	case $kind in
	command) ;;
	put:*)
		# A put resumed: the data holds the content from byte FROM on, the spool of an
		# earlier attempt the bytes before it (see put_resume).
		put_from=${kind#put:} kind=put
		is_uint "$put_from" || refuse "bad_args reason=kind"
		;;
	esac
	case $kind in
	command) ;;
	put)
		# A delivery: its content, checked by digest, which needs sha256sum before
		# anything is claimed; as the login user, or through sudo as --become's (its
		# password the one secret a put takes: there is no command to give one to).
		[ "$in_bytes" != - ] || refuse "bad_args reason=kind"
		[ -z "$sc_names" ] || refuse "bad_args reason=secrets"
		command -v sha256sum >/dev/null 2>&1 || refuse "cannot_start reason=no_sha256sum"
		;;
	get)
		# A file read: no stdin, as the login user, its digest computed on the host.
		if [ "$in_bytes" != - ] || [ "$become" != - ]; then
			refuse "bad_args reason=kind"
		fi
		command -v sha256sum >/dev/null 2>&1 || refuse "cannot_start reason=no_sha256sum"
		;;
	*) refuse "bad_args reason=kind" ;;
	esac
	case $become in
	-) become= ;;
	'' | -* | *[!A-Za-z0-9._-]*) refuse "bad_args reason=become" ;;
	esac
	# sudo's password is for sudo only (see read_secrets), never without --become.
	[ -z "$sc_pw" ] || [ -n "$become" ] || refuse "bad_args reason=secrets"
	case $rp_action in
	allow | warn | block) ;;
	*) refuse "bad_args reason=repeat_action" ;;
	esac
	case $rp_declared in
	-) rp_declared= ;;
	*[!A-Za-z0-9._:,-]*) refuse "bad_args reason=declared" ;;
	esac
	valid_id "$op" || refuse "invalid_op_id"
	valid_id "$attempt" || refuse "bad_args reason=attempt_id"
	case $fp in
	*[!0-9a-f]*) refuse "bad_args reason=fingerprint" ;;
	esac
	[ "${#fp}" -eq 64 ] || refuse "bad_args reason=fingerprint"
	# The stdin digest ("-": no stdin) is kept in the claim, so that a conflict can say
	# whether the command or the stdin differs; it goes into frames, so it is checked.
	case $in_sum in
	-) ;;
	*[!0-9a-f]*) refuse "bad_args reason=stdin_digest" ;;
	*) [ "${#in_sum}" -eq 64 ] || refuse "bad_args reason=stdin_digest" ;;
	esac
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
	# A resident found its setsid once (see verb_serve): the PATH is the same per request.
	if [ -z "$resident" ] || [ -z "${setsid_bin:-}" ]; then
		find_setsid || refuse "cannot_start reason=no_setsid"
	fi
	# A claim whose process could not be told alive from gone would read running for good
	# or, worse, gone while it runs: refuse before anything is claimed.
	identity_readable || refuse "cannot_start reason=no_process_identity"
	# Output that may hold a secret is kept only through the redactor (see redactor).
	if [ "$sc_rn" -gt 0 ] && ! command -v awk >/dev/null 2>&1; then
		refuse "cannot_start reason=no_awk"
	fi
	setup_root
	[ -z "$become" ] || become_check

	# Receive the command, then stdin, into unclaimed spool files first: a connection
	# lost halfway must not leave a claim whose command is cut short or would read half
	# an input. dd with count_bytes,fullblock reads exactly CMD_BYTES and never past them
	# (busybox `head -c` reads ahead into the stdin that follows).
	if [ -n "${cmd_read:-}" ]; then
		:
	elif [ -n "$resident" ]; then
		spool_command
		# The newline the client puts after the command (see read_resident_command).
		sv_nl=x
		IFS= read -r sv_nl
		[ -z "$sv_nl" ] || refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=more"
	elif [ "$in_bytes" = - ] && [ "$cmd_bytes" -le 4096 ]; then
		# A short command and nothing after it but EOF: read by the shell's own `read`
		# (a system call per byte, nothing to start) and kept in memory until the claim.
		read_short_command || refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=${#cmd_text}"
	else
		spool_command
	fi
	if [ "$in_bytes" != - ]; then
		is_uint "$in_bytes" || refuse "bad_args reason=stdin_bytes"
		spool="$root/spool/$attempt.$$"
		if [ "$kind" = put ]; then
			# Named by the operation, and kept when the data is cut short, so that a
			# later attempt sends only the rest.
			spool="$root/spool/put-$op.$attempt.$$" spool_keep=1
			[ "$put_from" -le "$in_bytes" ] || refuse "bad_args reason=kind"
			if [ "$put_from" -gt 0 ]; then
				put_resume "$op" "$put_from" "$spool" ||
					refuse "bad_stdin reason=resume_gap held=${ps_size:-0}"
			else
				: >"$spool"
			fi
		fi
		if [ -n "$resident" ]; then
			# Exactly its size: the next request follows.
			dd bs=65536 count="$((in_bytes - put_from))" iflag=count_bytes,fullblock 2>/dev/null >>"$spool"
		else
			cat >>"$spool"
		fi
		# shellcheck disable=SC2181 # the status of whichever read ran
		if [ "$?" -ne 0 ]; then
			resource_cause
			[ "$cause" = write_failed ] && refuse "bad_stdin reason=read_failed"
			refuse "root_unusable reason=$cause"
		fi
		got=$(wc -c <"$spool")
		if [ "$((got + 0))" -ne "$in_bytes" ]; then
			# A put's content cut short stays to be resumed (drop_spools keeps it).
			[ "$((got + 0))" -lt "$in_bytes" ] || spool_keep=
			[ -n "${spool_keep:-}" ] || rm -f "$spool"
			refuse "bad_stdin reason=size_mismatch expected=$in_bytes got=$((got + 0))"
		fi
		if command -v sha256sum >/dev/null 2>&1; then
			got=$(sha256_of "$spool" "$in_bytes")
			if [ "${got%% *}" != "$in_sum" ]; then
				# Not to be resumed from: the next attempt sends it all.
				rm -f "$spool"
				refuse "bad_stdin reason=digest_mismatch"
			fi
		fi
		spool_keep=
	fi

	sv_owed=
	m="$root/ops/$op"
	# Our own start time, read by identity_readable above (the foreground does not
	# change identity between the two).
	fg_start=$id_start
	read_boot
	now
	claim_rec="cap=$cap
attempt=$attempt
fingerprint=$fp
stdin_sum=$in_sum
stdin_bytes=$in_bytes
family=$family
shim=$OPMARK_SHIM_VERSION
claimed_at=$now
become=${become:--}
locks=$locks
lock_wait=$lock_wait
kind=$kind
fg_pid=$fg
fg_start=$fg_start
boot=$boot"
	# A fresh claim of this intent is indexed first, and held back when it repeats a
	# recent claim under another op id (a claim of an op id already taken is answered
	# from its marker below, as before).
	[ -d "$m" ] || repeat_check
	# A marker found taken can be gone a moment later: a supersede swaps an interrupted
	# claim for its own through two renames, a claim that could not start is taken back.
	# Its name is free then, so the claim is tried again (a few times: nothing else
	# removes a marker that quickly), never answered as absent or as an unusable root.
	cl_try=0
	while :; do
		cl_try=$((cl_try + 1))
		# mkdir's message kept: by the time resource_cause looks, another process may
		# have freed the inode this mkdir found missing.
		if mk_err=$(mkdir "$m" 2>&1); then
			if ! prepare_marker "$m"; then
				# Nothing can have started: take the claim back, so that no empty or
				# half-written marker reads as running or interrupted later.
				resource_cause
				rm -rf "$m"
				sync "$root/ops"
				refuse "root_unusable reason=$cause"
			fi
			break
		elif [ -d "$m" ]; then
			# Returns 0 only after an interrupted claim was replaced by ours, 1 when the
			# marker was gone by the time its state was read.
			answer_taken_claim && break
			[ "$cl_try" -lt 5 ] || refuse "absent $(describe)"
		elif [ "$cl_try" -ge 5 ]; then
			# Neither made nor taken: the marker root cannot hold a new directory.
			resource_cause "$mk_err"
			refuse "root_unusable reason=$cause"
		fi
	done
	# prepare_marker moved the command into the claim.
	cmd_spool=
	[ -n "$spool" ] && mv -f "$spool" "$m/stdin"
	# A standby supervisor started long ago has no way to the secrets: a run with any
	# starts its own, which takes them from its environment (see with_secrets).
	if ! { [ -z "$sc_names" ] && [ "$sc_rn" -eq 0 ] && [ -z "$become" ] && hand_off "$m"; } &&
		! with_secrets detach "$OPMARK_SHELL" supervise "$m" "$timeout" "$cap" "$cmd_bytes" "$attempt"; then
		# Nothing can have run: the supervisor never passed the start gate. Take the gate
		# so a late supervisor cannot start either. A fresh claim is then taken back, as
		# nothing ran and nothing can (a leftover would only wait for gc); one that
		# replaced an interrupted claim stays, reading interrupted, since the old
		# evidence moved aside under it.
		take_gate "$m"
		if [ -z "${superseded:-}" ]; then
			rm -rf "$m"
			sync "$root/ops"
		fi
		refuse "cannot_start reason=setsid_failed"
	fi
	frame "S attempt=$attempt"
	live=1 own_claim=1
	follow "$m" 0 0 fresh
}

