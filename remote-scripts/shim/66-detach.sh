# detach SHELL ARGS...: starts `SHELL <this script> ARGS...` in a session of its own, with
# no descriptor of the channel, and returns at once. `setsid setsid CMD`, run in the
# foreground: the first setsid (not a process-group leader: no job control here) makes
# the new session itself and execs the second, which, now a group leader, forks; its
# child makes the session the supervisor leads (its pid is the session id) and execs
# it, while the parent returns. This works with util-linux's setsid and busybox's alike
# (which has no -f), and, unlike a background `setsid CMD &`, leaves SIGINT and SIGQUIT
# as the foreground had them, i.e. as under ssh: dash and busybox ash start `&`
# children with both ignored, for good (docs/findings.md#detaching-the-command).
# shellcheck disable=SC2317 # called through with_secrets
detach() {
	dt_sh=$1
	shift
	if [ -n "$shim_file" ]; then
		"$setsid_bin" "$setsid_bin" "$dt_sh" "$OPMARK_SHIM_SELF" "$OPMARK_SHIM_SELF" "$@" \
			</dev/null >/dev/null 2>&1 3>&- 5>&- 8>&-
	else
		"$setsid_bin" "$setsid_bin" "$dt_sh" -c "$OPMARK_SHIM_SELF" opmark-shim "$OPMARK_SHIM_SELF" "$@" \
			</dev/null >/dev/null 2>&1 3>&- 5>&- 8>&-
	fi
}

# hand_off M: in a resident's request, gives the command of marker M to the resident's
# standby supervisor (see standby) instead of starting one: one write of its line to the
# FIFO, no process. False, and detach starts one as before, when there is no standby
# that is ready (none yet, taken, gone or stopped: FIFO.pid names no live process, or a
# stopped one) or M cannot be written on one line. The FIFO is opened for the write
# only: a resident holds it open for reading and writing, so the open never waits, and
# the request's other processes inherit no end of it.
hand_off() {
	[ -n "${sb_fifo:-}" ] || return 1
	case $1 in
	*"
"*) return 1 ;;
	esac
	ho_pid='' ho_start=''
	read -r ho_pid ho_start _ 2>/dev/null <"$sb_fifo.pid" || return 1
	is_uint "$ho_pid" && alive "$ho_pid" "$ho_start" || return 1
	# A stopped one would hold the command until the start limit.
	[ "$ps_state" != T ] || return 1
	printf '\n%s %s %s %s %s\n' "$timeout" "$cap" "$cmd_bytes" "$attempt" "$1" 2>/dev/null >"$sb_fifo"
}

# keep_standby: the resident has a standby supervisor waiting (see standby), or starts
# one, between requests (off every request's path). One FIFO per resident, made with the
# first request that finds the marker root's spool (on first contact it is made by that
# request), held open here for reading and writing on 8: the standby's stdin never sees
# EOF while the resident lives, and does once it is gone, so a standby never outlives its
# resident waiting. A new standby only once the last one took its line ("used") or is
# gone: two readers of one FIFO could split a line. One that never got as far as FIFO.pid
# (killed at its start) leaves the resident starting none: its requests detach as before.
keep_standby() {
	if [ -z "${sb_fifo:-}" ]; then
		[ -n "${sb_off:-}" ] && return 0
		[ -n "$setsid_bin" ] || {
			sb_off=1
			return 0
		}
		case $sv_root in
		/*) ;;
		*)
			sb_off=1
			return 0
			;;
		esac
		[ -d "$sv_root/spool" ] || return 0
		sb_off=1
		proc_stat "$$" || return 0
		ks_fifo=$sv_root/spool/.sb.$$.$ps_start
		standby_leftovers
		{ mkfifo "$ks_fifo" && exec 8<>"$ks_fifo"; } 2>/dev/null || return 0
		sb_fifo=$ks_fifo
		find_preload
	else
		ks_state='' ks_start=''
		read -r ks_state ks_start _ 2>/dev/null <"$sb_fifo.pid"
		case $ks_state in
		used) ;;
		'') return 0 ;;
		*) alive "$ks_state" "$ks_start" && return 0 ;;
		esac
	fi
	true 2>/dev/null >"$sb_fifo.pid" || return 0
	# shellcheck disable=SC2094 # the FIFO's name is the standby's argument, not its output
	if [ -n "$shim_file" ]; then
		"$setsid_bin" "$setsid_bin" "$OPMARK_SHELL" "$OPMARK_SHIM_SELF" "$OPMARK_SHIM_SELF" standby "$sb_fifo" "$sb_preload" "$sb_head" \
			<"$sb_fifo" >/dev/null 2>&1 3>&- 5>&- 8>&-
	else
		"$setsid_bin" "$setsid_bin" "$OPMARK_SHELL" -c "$OPMARK_SHIM_SELF" opmark-shim "$OPMARK_SHIM_SELF" standby "$sb_fifo" "$sb_preload" "$sb_head" \
			<"$sb_fifo" >/dev/null 2>&1 3>&- 5>&- 8>&-
	fi
}

# find_preload: sets sb_preload and sb_head to the environment `stdbuf -o0` gives the
# program it runs (coreutils: its LD_PRELOAD and _STDBUF_O=0, read back by printenv) and
# the head it would run (the first on PATH, as its execvp finds it: never a shell's
# applet, busybox ash's own head writes through stdio), so that a standby's captures
# start that head with it themselves (see capped_head); both empty when anything is
# otherwise: stdbuf then. A resident asks once, for all its standbys.
find_preload() {
	sb_preload='' sb_head=''
	sb_ifs=$IFS
	IFS=:
	set -f
	# shellcheck disable=SC2086 # splitting PATH at its colons is the point
	for sb_d in $PATH; do
		case $sb_d in
		/*) [ -f "$sb_d/head" ] && [ -x "$sb_d/head" ] && sb_head=$sb_d/head && break ;;
		esac
	done
	set +f
	IFS=$sb_ifs
	if [ -n "$sb_head" ] && command -v stdbuf >/dev/null 2>&1 &&
		command -v printenv >/dev/null 2>&1; then
		sb_env=$(stdbuf -o0 printenv LD_PRELOAD _STDBUF_O </dev/null 2>/dev/null 3>&- 8>&-)
		case $sb_env in
		*libstdbuf*"
0")
			sb_preload=${sb_env%"
0"}
			;;
		esac
		case $sb_preload in
		*"
"*) sb_preload= ;;
		esac
	fi
}

# standby_leftovers: the FIFOs of residents that are gone without removing theirs (a
# SIGKILL), named by the resident's pid and start time.
standby_leftovers() {
	for sl_f in "$sv_root"/spool/.sb.*.pid; do
		[ -e "$sl_f" ] || continue
		sl_id=${sl_f#"$sv_root"/spool/.sb.}
		sl_id=${sl_id%.pid}
		alive "${sl_id%%.*}" "${sl_id#*.}" && continue
		rm -f "${sl_f%.pid}" "$sl_f"
	done
}

