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
	# Following a running command: output beyond the cap comes live, as for the run's
	# own foreground; a finished one gets the kept copy.
	live=
	if [ "$st" = running ] && rget "$m/claim" cap && is_uint "$rv"; then
		live=1 cap=$rv
	fi
	proc_stat "$fg"
	fg_start=$ps_start
	register_waiter "$m"
	follow "$m" "$2" "$3"
	# (A run's supervisor removes its waiters; an attach may come after it is gone.)
	rm -f "$wf"
}

# output OP STREAM FROM LEN: at most LEN bytes of the kept copy of a stream (out or
# err) from byte FROM, or, written -N, its last N bytes; what is there now, without
# waiting for more (a running command's copy grows up to its cap). Reads only. The bytes
# come as one payload, then a `V` frame: the marker, the stream's kept and dropped byte
# counts, and the range sent.
verb_output() {
	[ "$#" -eq 4 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	case $2 in
	out) ok=O ;;
	err) ok=E ;;
	*) refuse "bad_args reason=stream" ;;
	esac
	of=${3#-}
	if ! is_uint "$of" || ! is_uint "$4"; then
		refuse "bad_args reason=range"
	fi
	setup_root
	state "$1"
	case $st in
	absent | fenced) refuse "$st $(describe)" ;;
	esac
	sizes
	okept=$so
	[ "$2" = err ] && okept=$se
	odropped=0
	[ -f "$m/$2.dropped" ] && read -r odropped <"$m/$2.dropped"
	is_uint "$odropped" || odropped=0
	if [ "$3" = "$of" ]; then
		ofrom=$of
	else
		ofrom=$((okept - of))
		[ "$ofrom" -ge 0 ] || ofrom=0
	fi
	[ "$ofrom" -le "$okept" ] || ofrom=$okept
	olen=$((okept - ofrom))
	[ "$olen" -le "$4" ] || olen=$4
	[ "$olen" -gt 0 ] && payload "$ok" "$m/$2" "$ofrom" "$olen"
	frame "V $(describe) stream=$2 kept=$okept dropped=$odropped from=$ofrom len=$olen"
}

# fence OP FORCE: tombstone so the op id can never be claimed. Without FORCE only an
# absent or never-started claim is fenced; FORCE (an operator's not-applied decision)
# also fences an interrupted one.
verb_fence() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	setup_root
	m="$root/ops/$1"
	fe_was=
	if mkdir "$m" 2>/dev/null; then
		fe_was=absent
		take_gate "$m"
	else
		state "$1"
		case $st in
		fenced)
			frame "F already_fenced $(describe)"
			exit 0
			;;
		interrupted)
			# Take the start gate: if the supervisor never started, now it never will.
			# Forced over a started command (an operator's decision), the record says
			# the command had started.
			if ! take_gate "$m"; then
				[ "$2" = 1 ] || refuse "$st $(describe)"
				fe_started=1
			fi
			;;
		*) refuse "$st $(describe)" ;;
		esac
	fi
	sync "$root/ops"
	now
	durable_write "$m" fenced "fenced_at=$now
command_started=${fe_started:-0}" || fence_failed "$m" "$fe_was"
	st=fenced why=
	frame "F fenced $(describe)"
}

# supersede OP BY_ATTEMPT
verb_supersede() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	valid_id "$2" || refuse "bad_args reason=attempt_id"
	setup_root
	op=$1 m="$root/ops/$1"
	# The same lock as a run's supersede: a claim installed meanwhile is never moved.
	if ! mkdir "$m/.superseding" 2>/dev/null; then
		state "$op"
		refuse "$st $(describe)"
	fi
	take_gate "$m"
	state "$op"
	if [ "$st" != interrupted ]; then
		rmdir "$m/.superseding"
		refuse "$st $(describe)"
	fi
	now
	sm_aside="$root/superseded/$op.$now.$2"
	printf 'superseded_by=%s\nsuperseded_at=%s\n' "$2" "$now" >"$m/superseded" 2>/dev/null
	if ! mv "$m" "$sm_aside" 2>/dev/null; then
		rmdir "$m/.superseding"
		refuse "$st $(describe)"
	fi
	rmdir "$sm_aside/.superseding"
	sync "$root/ops"
	frame "U superseded_by=$2"
}

