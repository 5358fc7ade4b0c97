# repeat_check: the fingerprint index (docs/host-protocol.md#the-fingerprint-index).
# Every fresh claim takes the next slot of $root/fp/$fp by an exclusive create (a hard
# link of a complete record: link(2) fails when the name exists, so of two claimers of
# one slot exactly one wins and the other takes the next), unless its op id has a slot in
# the window already. The slots before ours are the claims of this intent made before
# ours, so two racing claims of one intent under two op ids are ordered, and the later
# one sees the earlier. Walking back from ours while slots are within REPEAT_S seconds,
# the first slot of another op id that may have run (and is not declared) is the
# repetition: `block` refuses "repeats earlier=OP earlier_state=ST earlier_at=T" and
# marks our slot held=1 (a held slot never counts); `warn` says so in a W frame with the
# same fields and goes on; `allow` goes on. Costs one glob and one link (the temp name is
# removed later, off the claim's path).
repeat_check() {
	ix=$root/fp/$fp
	[ -d "$ix" ] || mkdir -p "$ix" 2>/dev/null || return 0
	repeat_find
	if [ -z "$rc_own" ]; then
		rc_n=$((rc_last + 1))
		# Named by our pid and start time, made exclusively (noclobber: O_EXCL): a leftover
		# of that name (a killed claimer, another boot) may still be a slot's other name,
		# so it is removed, never written through.
		rc_tmp=$ix/.t.$fg.$fg_start
		set -C
		if ! { printf 'op=%s\nclaimed_at=%s\n' "$op" "$now" >"$rc_tmp"; } 2>/dev/null &&
			! { [ -e "$rc_tmp" ] && rm -f "$rc_tmp" &&
				{ printf 'op=%s\nclaimed_at=%s\n' "$op" "$now" >"$rc_tmp"; } 2>/dev/null; }; then
			set +C
			return 0
		fi
		set +C
		# Slots taken between our glob and our link are earlier claims than ours.
		slot_name "$rc_n"
		while ! ln "$rc_tmp" "$sn" 2>/dev/null; do
			[ -e "$sn" ] || break
			if [ -z "$rc_found" ] && slot_read "$rc_n" && [ "$sl_op" != "$op" ] && slot_counts; then
				rc_found=$rc_n rc_state=$sl_state rc_op=$sl_op rc_at=$sl_at
			fi
			rc_n=$((rc_n + 1))
			slot_name "$rc_n"
		done
		# The temp name goes later, off this path: with the supervisor's own leftovers
		# once the exit record is down (it derives the name from the claim), or with
		# our spools when we refuse.
		rc_left=$rc_tmp
		rc_own=$rc_n
	fi
	if [ -z "$rc_found" ] || [ "$rp_window" -eq 0 ] || [ "$rp_action" = allow ]; then
		slot_unhold
		return 0
	fi
	# The fields of the slot as the walk read it: a second read could see nothing (seen
	# once under load: a refusal with an empty earlier=), and it would say no more.
	rc_fields="earlier=$rc_op earlier_state=$rc_state earlier_at=$rc_at"
	if [ "$rp_action" = warn ]; then
		slot_unhold
		frame "W $rc_fields"
		return 0
	fi
	# Held: our slot says so, so that it never counts against a later claim.
	slot_name "$rc_own"
	printf 'op=%s\nclaimed_at=%s\nheld=1\n' "$op" "$now" >"$ix/.h.$$" 2>/dev/null &&
		mv -f "$ix/.h.$$" "$sn"
	refuse "repeats $rc_fields"
}

# repeat_find: the walk of repeat_check over the index $ix for a claim of $op with
# intent $fp: rc_last (the newest slot), rc_own (our op's slot), rc_found, rc_state,
# rc_op and rc_at (the first repetition that counts, within $rp_window of $now: its slot,
# its marker's state, its op id and claim time). Reads only.
repeat_find() {
	rc_last=0
	for rc_f in "$ix"/[0-9]*; do
		[ -f "$rc_f" ] && rc_last=${rc_f##*/}
	done
	rc_last=${rc_last#"${rc_last%%[!0]*}"}
	rc_last=${rc_last:-0}
	# Walk back from the newest slot to the first repetition (a claim of this intent
	# under another op id that may have had the effect, however it came to be newer
	# than a slot of ours: it still ran recently), passing our own slot (a retry of our
	# op) on the way. Reading stops there: the cost is the slots passed, not the window.
	rc_own='' rc_found='' rc_state='' rc_n=$rc_last rc_declared=,$rp_declared,
	while [ "$rc_n" -gt 0 ]; do
		slot_read "$rc_n" || break
		[ "$rp_window" -gt 0 ] && [ "$((sl_at + rp_window))" -lt "$now" ] && break
		if [ "$sl_op" = "$op" ]; then
			[ -n "$rc_own" ] || rc_own=$rc_n
		elif slot_counts; then
			rc_found=$rc_n rc_state=$sl_state rc_op=$sl_op rc_at=$sl_at
			break
		fi
		if [ "$rp_window" -eq 0 ] || [ "$rp_action" = allow ]; then
			break
		fi
		rc_n=$((rc_n - 1))
	done
}

# repeats OP FP REPEAT_S DECLARED: the earlier claim of intent FP under another op id
# within REPEAT_S that a claim of OP would meet (see repeat_check), read only: for a plan
# before acting. One `J` frame: `earlier= earlier_state= earlier_at=`, or `none`.
verb_repeats() {
	[ "$#" -eq 4 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	case $2 in
	'' | *[!0-9a-f]*) refuse "bad_args reason=fingerprint" ;;
	esac
	is_uint "$3" || refuse "bad_args reason=window"
	setup_root
	op=$1 fp=$2 rp_window=$3 rp_action=block rp_declared=$4
	[ "$rp_declared" = - ] && rp_declared=
	now
	ix=$root/fp/$fp
	rc_found=
	[ -d "$ix" ] && [ "$rp_window" -gt 0 ] && repeat_find
	if [ -n "$rc_found" ]; then
		frame "J earlier=$rc_op earlier_state=$rc_state earlier_at=$rc_at"
	else
		frame "J none"
	fi
}

# slot_name N: sets sn to the slot's path, N zero-padded to 10 digits (so a glob sorts
# them); a variable, not output, so that no process is started per slot.
slot_name() {
	sn=0000000000$1
	sn=$ix/${sn#"${sn%??????????}"}
}

# slot_read N: sets sl_op, sl_at, sl_held of slot N in $ix; false when it is missing.
slot_read() {
	slot_name "$1"
	slot_file "$sn"
}

# slot_file PATH: slot_read of the slot file at PATH.
slot_file() {
	sl_file=$1
	sl_op='' sl_at=0 sl_held=''
	[ -f "$sl_file" ] || return 1
	while IFS= read -r sl_line || [ -n "$sl_line" ]; do
		case $sl_line in
		op=*) sl_op=${sl_line#op=} ;;
		claimed_at=*) sl_at=${sl_line#claimed_at=} ;;
		held=1) sl_held=1 ;;
		esac
		sl_line=
	done <"$sl_file"
	is_uint "$sl_at" || sl_at=0
	return 0
}

# slot_counts: the slot just read (not ours) is a claim that may have had the effect:
# not held back, not declared by this run, and its op's marker holds this intent and
# is running, completed, interrupted, or fenced after its command started; a slot whose
# marker is not there yet counts while it is young (its claimer is between the index
# and its mkdir). Sets sl_state.
slot_counts() {
	[ -z "$sl_held" ] || return 1
	valid_id "$sl_op" || return 1
	case $rc_declared in
	*",$sl_op,"*) return 1 ;;
	esac
	sc_m=$m
	state "$sl_op"
	sl_state=$st
	sc_fp=
	rget "$m/claim" fingerprint && sc_fp=$rv
	sc_started=
	[ "$st" = fenced ] && rget "$m/fenced" command_started && sc_started=$rv
	m=$sc_m
	case $st in
	absent)
		sl_state=claiming
		[ "$((sl_at + 60))" -ge "$now" ]
		;;
	fenced) [ "$sc_started" = 1 ] && [ "$sc_fp" = "$fp" ] ;;
	*) [ -z "$sc_fp" ] || [ "$sc_fp" = "$fp" ] ;;
	esac
}

# slot_unhold: our slot (rc_own) was held back by an earlier run; this one goes on (a
# declared repetition, the window passed): it counts again.
slot_unhold() {
	slot_read "$rc_own" || return 0
	[ -n "$sl_held" ] || return 0
	slot_name "$rc_own"
	printf 'op=%s\nclaimed_at=%s\n' "$op" "$sl_at" >"$ix/.h.$$" 2>/dev/null &&
		mv -f "$ix/.h.$$" "$sn"
}

