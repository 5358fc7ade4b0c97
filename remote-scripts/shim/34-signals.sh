# kill_after SECONDS SID M START CAPTURES: at the deadline, TERM everything of the
# supervisor's session but the supervisor, this killer and the captures (CAPTURES: their
# pids, see signal_session), then KILL what is left after a grace period. The
# supervisor is never signalled, so it always lives to write the exit record. (Sending
# TERM to the whole process group lost a supervisor now and then under heavy load.)
kill_after() {
	exec 6>&- 7>&-
	sleep "$1" &
	ka_sleep=$!
	trap 'kill "$ka_sleep" 2>/dev/null; exit 0' TERM
	wait "$ka_sleep"
	trap '' TERM
	# A cancel is already stopping the command: it is not a timeout.
	[ -f "$3/cancelled" ] && exit 0
	true >"$3/timed_out"
	# shellcheck disable=SC2016 # $PPID belongs to the child shell: it names this process
	me=$(exec "$OPMARK_SHELL" -c 'echo "$PPID"')
	signal_session TERM "$2" "$me" "$4" "$5"
	sleep 2
	signal_session KILL "$2" "$me" "$4" "$5"
}

# signal_session SIG SID SPARE START [CAPTURES]: sends SIG to every live process of
# session SID except its leader (the supervisor, started at START), SPARE and the
# captures (CAPTURES: their pids, comma-separated, and so the helpers they run: their
# children and grandchildren); never to a process that started before the supervisor, and
# to nothing when SID now names a process with another start time (the session is gone
# and its id reused: docs/host-protocol.md#liveness). Builtins only, so nothing it starts is hit. A capture killed
# would lose what it read and not yet wrote, output the caller is owed; it ends by itself
# once the command's last writer is gone.
signal_session() {
	if [ -n "$4" ] && proc_stat "$2" && [ "$ps_start" != "$4" ]; then
		return 0
	fi
	ss_caps=,${5:-},
	for ka in /proc/[0-9]*/stat; do
		ka_pid=${ka#/proc/}
		ka_pid=${ka_pid%/stat}
		[ "$ka_pid" = "$2" ] || [ "$ka_pid" = "$3" ] && continue
		proc_stat "$ka_pid" || continue
		[ "$ps_session" = "$2" ] || continue
		[ "$ps_state" != Z ] || continue
		older_than "$ps_start" "$4" && continue
		if [ "$ss_caps" != ,, ]; then
			case $ss_caps in *",$ka_pid,"* | *",$ps_ppid,"*) continue ;; esac
			proc_stat "$ps_ppid" && case $ss_caps in *",$ps_ppid,"*) continue ;; esac
		fi
		kill -"$1" "$ka_pid" 2>/dev/null
	done
}

