# gc MAX_AGE_S DRY_RUN TOMB_AGE_S: collects completed or fenced markers whose record is
# older than MAX_AGE_S down to tombstones (see tombstone), never a running or interrupted
# one; removes tombstones whose record is older than TOMB_AGE_S only when that is given
# (`-`: tombstones are kept); reclaims failed-start leftovers, cached shims of other
# versions and unclaimed spool files (cut uploads) older than MAX_AGE_S. gc never turns evidence into absence (docs/host-protocol.md#tombstones).
verb_gc() {
	[ "$#" -eq 3 ] || refuse "bad_args reason=argument_count"
	is_uint "$1" || refuse "bad_args reason=age"
	[ "$3" = - ] || is_uint "$3" || refuse "bad_args reason=tombstone_age"
	setup_root
	now
	limit=$((now - $1))
	tomb_limit=
	[ "$3" = - ] || tomb_limit=$((now - $3))
	removed=0 kept=0 collected=0 tombs=0 reclaimed=0
	for g in "$root"/ops/*; do
		[ -d "$g" ] || continue
		g_op=${g##*/} g_at=
		state "$g_op"
		case $st in
		completed) rget "$m/exit" ended_at && g_at=$rv ;;
		fenced) rget "$m/fenced" fenced_at && g_at=$rv ;;
		*)
			kept=$((kept + 1))
			continue
			;;
		esac
		if ! is_uint "$g_at"; then
			kept=$((kept + 1))
		elif [ -f "$g/collected" ]; then
			if [ -n "$tomb_limit" ] && [ "$g_at" -le "$tomb_limit" ]; then
				frame "G remove op=$g_op state=$st at=$g_at tombstone=1"
				[ "$2" = 1 ] || rm -rf "$g"
				removed=$((removed + 1))
			else
				tombs=$((tombs + 1))
			fi
		elif [ "$g_at" -le "$limit" ]; then
			frame "G collect op=$g_op state=$st at=$g_at"
			if [ "$2" = 1 ] || tombstone "$g"; then
				collected=$((collected + 1))
			else
				kept=$((kept + 1))
			fi
		else
			kept=$((kept + 1))
		fi
	done
	gc_reclaim "$1" "$2"
	gc_index "$limit" "$2"
	[ "$2" = 1 ] || sync "$root/ops" "$root/superseded"
	frame "G done removed=$removed collected=$collected tombstones=$tombs reclaimed=$reclaimed kept=$kept dry_run=$2"
}

# tombstone M: reduces the finished marker M to what docs/host-protocol.md#tombstones keeps of it: the claim
# (attempt, fingerprint, family, claim time) with the exit or fence record (status, end
# time) and `collected`; the output, command, stdin and process records go. `collected`
# is down first, so a reader that finds the output gone knows why.
tombstone() {
	durable_write "$1" collected "collected_at=$now" || return 1
	for tf in "$1"/* "$1"/.[!.]*; do
		[ -e "$tf" ] || continue
		case ${tf##*/} in
		claim | exit | fenced | started | collected) ;;
		*) rm -rf "$tf" ;;
		esac
	done
	sync "$1"
}

# gc_reclaim MAX_AGE_S DRY_RUN: what is no evidence of any operation: claims set aside
# because their supervisor never started (their start gate taken, nothing ran), and
# cached shims of other versions (a client still using one sends it again), older than
# MAX_AGE_S (by modification time, in whole minutes).
gc_reclaim() {
	gr_min=$(($1 / 60))
	gr_self=
	if [ -n "$shim_file" ]; then
		gr_self=${OPMARK_SHIM_SELF##*/}
	elif [ -n "$shim_hash" ]; then
		gr_self=$shim_hash.sh
	fi
	for gr in "$root"/superseded/*.failed-start "$root"/shim/*.sh "$root"/spool/[!.]*; do
		[ -e "$gr" ] || continue
		case $gr in
		# Content or a command a cut connection left unclaimed (a put's partial content
		# is kept for a resume: older than MAX_AGE_S, nobody resumes it).
		"$root"/spool/*) gr_what=spool ;;
		"$root"/shim/*)
			# Only when this call knows its own copy, which is never one to reclaim.
			[ -n "$gr_self" ] || continue
			[ "${gr##*/}" != "$gr_self" ] || continue
			# Nor one a live resident runs from (`sh FILE FILE ... serve`): its next
			# supervisor starts from it.
			! grep -q -F -e "$gr" /proc/[0-9]*/cmdline 2>/dev/null || continue
			gr_what=shim
			;;
		*) gr_what=failed_start ;;
		esac
		[ -n "$(find "$gr" -prune -mmin +"$gr_min" 2>/dev/null)" ] || continue
		frame "G reclaim what=$gr_what name=${gr##*/}"
		[ "$2" = 1 ] || rm -rf "$gr"
		reclaimed=$((reclaimed + 1))
	done
}

# gc_index LIMIT DRY_RUN: prunes the fingerprint index (see repeat_check) of slots claimed
# at or before LIMIT, never the newest slot of an intent (the next claim numbers after
# it); a repetition window longer than gc's age sees back only as far as the slots kept.
gc_index() {
	for gi in "$root"/fp/*; do
		[ -d "$gi" ] || continue
		gi_last=
		for gi_f in "$gi"/[0-9]*; do
			[ -f "$gi_f" ] && gi_last=$gi_f
		done
		# Temp names of slots whose claimer was killed before its supervisor ended (the
		# slot itself stays).
		for gi_f in "$gi"/.t.*; do
			[ -f "$gi_f" ] || continue
			[ -n "$(find "$gi_f" -prune -mmin +"$gr_min" 2>/dev/null)" ] || continue
			[ "$2" = 1 ] || rm -f "$gi_f"
		done
		for gi_f in "$gi"/[0-9]*; do
			[ "$gi_f" != "$gi_last" ] || continue
			[ -f "$gi_f" ] || continue
			slot_file "$gi_f"
			[ "$sl_at" -le "$1" ] || continue
			[ "$2" = 1 ] || rm -f "$gi_f"
		done
	done
}

