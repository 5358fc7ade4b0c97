# read_resident_command: reads the command of a resident's request, cmd_bytes bytes and
# the newline the client puts after them (the line-wise builtin `read` cannot stop
# inside a line), into cmd_text; false unless exactly that arrived. The builtin reads
# one byte at a time from a pipe, so nothing past the newline is taken.
read_resident_command() {
	cmd_text='' rs_l=''
	while [ "${#cmd_text}" -le "$cmd_bytes" ] && IFS= read -r rs_l; do
		cmd_text="$cmd_text$rs_l
"
	done
	[ "${#cmd_text}" -eq "$((cmd_bytes + 1))" ] || return 1
	cmd_text=${cmd_text%?}
}

# read_short_command: reads the command, the channel's data up to EOF, into cmd_text;
# false unless it is exactly cmd_bytes bytes. (A final line without a newline is still
# read: `read` fails at EOF but sets the variable.)
read_short_command() {
	cmd_text='' rs_l=''
	while IFS= read -r rs_l; do
		cmd_text="$cmd_text$rs_l
"
	done
	cmd_text=$cmd_text$rs_l
	[ "${#cmd_text}" -eq "$cmd_bytes" ]
}

# spool_command: receives exactly cmd_bytes bytes of the channel's data into an
# unclaimed spool file ($cmd_spool), leaving what follows (the stdin) unread.
spool_command() {
	cmd_spool="$root/spool/$attempt.$$.cmd"
	# dd's own report says how many bytes it wrote ("N bytes ... copied" on its third
	# line, GNU and busybox alike): no wc for that, unless the report is not that.
	if ! got=$(dd of="$cmd_spool" bs=65536 count="$cmd_bytes" iflag=count_bytes,fullblock 2>&1); then
		# A full marker root is the host's state, not a bad request.
		resource_cause
		[ "$cause" = write_failed ] || refuse "root_unusable reason=$cause"
		refuse "bad_command reason=read_failed"
	fi
	got=${got#*records out
}
	case $got in
	[0-9]*" bytes"*) got=${got%% *} ;;
	*) got=$(wc -c <"$cmd_spool") ;;
	esac
	if [ "$((got + 0))" -ne "$cmd_bytes" ]; then
		resource_cause
		[ "$cause" = write_failed ] || refuse "root_unusable reason=$cause"
		refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=$((got + 0))"
	fi
}

# prepare_marker DIR: everything a claim needs in DIR: the claim record first, then the
# command (written from memory, or moved in from its spool), the capture files, the empty
# file an unwritable exit record is renamed from, and the FIFOs. Fails (leaving DIR for
# the caller to remove) when any cannot be made: a claim either exists completely or not
# at all. Not synced here: the supervisor makes the claim durable before its start gate,
# while its captures start (a superseding claim is synced before the old one moves).
prepare_marker() {
	pm_dir=$1
	# `true`, not `:`: a failed redirection of a special built-in ends the whole shell.
	printf '%s\n' "$claim_rec" >"$pm_dir/claim" &&
		if [ -n "$cmd_spool" ]; then
			mv -f "$cmd_spool" "$pm_dir/cmd"
		else
			printf '%s' "$cmd_text" >"$pm_dir/cmd"
		fi &&
		true >"$pm_dir/out" && true >"$pm_dir/err" && true >"$pm_dir/.noexit" &&
		register_waiter "$pm_dir" "$pm_dir/.out.fifo" "$pm_dir/.err.fifo"
} 2>/dev/null

# The marker is taken: answer with its state instead of running (or supersede an
# interrupted claim when the client says policy allows it, then return with our claim in
# place).
answer_taken_claim() {
	state "$op"
	if [ "$st" = fenced ]; then
		refuse "fenced $(describe)"
	fi
	if claimed; then
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
		supersede_marker "$attempt" || return 1
		frame "U superseded_by=$attempt"
		;;
	absent) return 1 ;;
	*) refuse "$st $(describe)" ;;
	esac
}

# supersede_marker BY: replaces the interrupted claim at $m by our complete claim and
# moves the old one aside (kept for audit), or refuses leaving it untouched; false when
# the marker was gone (another superseder's swap) so the caller claims again. The new
# marker is built beside it first, so a full disk can never leave the op id without
# evidence; the swap itself is two renames, which need no free space.
supersede_marker() {
	# One superseder at a time per claim: another one's new claim must never be moved
	# aside as if it were the old one.
	if ! mkdir "$m/.superseding" 2>/dev/null; then
		state "$op"
		# Gone between the renames of another superseder's swap: claim again.
		[ "$st" != absent ] || return 1
		[ -d "$m/.superseding" ] || [ "$st" != interrupted ] || {
			resource_cause
			refuse "interrupted $(describe) supersede_failed=$cause"
		}
		refuse "$st $(describe)"
	fi
	# Taking the start gate first means a supervisor that has not started yet never will.
	take_gate "$m"
	state "$op"
	if [ "$st" != interrupted ]; then
		rmdir "$m/.superseding"
		refuse "$st $(describe)"
	fi
	sm_next="$root/ops/.next.$$"
	if ! mkdir "$sm_next" 2>/dev/null || ! prepare_marker "$sm_next" ||
		! { true >"$sm_next/supersedes"; } 2>/dev/null ||
		! sync "$sm_next/claim" "$sm_next"; then
		resource_cause
		rm -rf "$sm_next"
		rmdir "$m/.superseding"
		refuse "interrupted $(describe) supersede_failed=$cause"
	fi
	now
	sm_aside="$root/superseded/$op.$now.$1"
	printf 'superseded_by=%s\nsuperseded_at=%s\n' "$1" "$now" >"$m/superseded" 2>/dev/null
	if ! mv "$m" "$sm_aside" 2>/dev/null; then
		resource_cause
		rm -rf "$sm_next"
		rmdir "$m/.superseding"
		refuse "interrupted $(describe) supersede_failed=$cause"
	fi
	rmdir "$sm_aside/.superseding"
	if ! mv "$sm_next" "$m" 2>/dev/null || ! [ -f "$m/claim" ] ||
		! rget "$m/claim" attempt || [ "$rv" != "$attempt" ]; then
		# A fresh claimer took the op id between the renames (its claim stands; ours
		# went into its directory if anywhere), or the rename failed: put the evidence
		# back where it was if the name is still free.
		rm -rf "$sm_next" "$m/.next.$$"
		[ -e "$m" ] || mv "$sm_aside" "$m" 2>/dev/null
		state "$op"
		refuse "$st $(describe)"
	fi
	wf="$m/.w.$fg.$fg_start"
	superseded=1
	sync "$root/ops" "$root/superseded"
}

