# standby FIFO [PRELOAD HEAD]: a supervisor started by a resident before its command is
# known (see keep_standby), so that a request's foreground starts none: started as
# detach starts one (a session of its own, signals as under ssh, no descriptor of the
# channel; PRELOAD and HEAD from find_preload), with
# the resident's FIFO as its stdin, it says it is ready in FIFO.pid ("pid start", its own
# identity), then reads one line, "TIMEOUT_S CAP CMD_BYTES ATTEMPT M" (the arguments
# detach would give supervise), says the line is taken ("used" in FIFO.pid) and becomes
# that command's supervisor, with supervise's own checks (only the claim of ATTEMPT, the
# start gate). A line that is not one is skipped (a foreground writes a newline first, so
# a torn line never joins the next); EOF, the resident and every writer gone, ends it.
standby() {
	sb_fifo=$1
	proc_stat "$$" || exit 0
	# How its captures start head (see find_preload), as its resident found out once.
	sb_preload=${2:-} sb_head=${3:-}
	case $sb_head in
	/*) [ -f "$sb_head" ] && [ -x "$sb_head" ] || sb_preload= ;;
	*) sb_preload= ;;
	esac
	printf '%s %s\n' "$$" "$ps_start" >"$sb_fifo.pid" 2>/dev/null || exit 0
	while :; do
		sb_t='' sb_c='' sb_b='' sb_a='' sb_m=''
		read -r sb_t sb_c sb_b sb_a sb_m || exit 0
		if ! is_uint "$sb_t" || ! is_uint "$sb_c" || ! is_uint "$sb_b" || ! valid_id "$sb_a"; then
			continue
		fi
		case $sb_m in
		/*/ops/*) valid_id "${sb_m##*/}" && break ;;
		esac
	done
	printf 'used\n' >"$sb_fifo.pid" 2>/dev/null
	exec </dev/null
	supervise "$sb_m" "$sb_t" "$sb_c" "$sb_b" "$sb_a"
}

# The supervisor and the standby need nothing below: they stop reading the script here
# (dash reads a script one command at a time, and they exit before the next), so only
# the foreground pays for parsing the rest. Every function they run is defined above, in
# this part or one numbered lower (tests/it/shim.rs checks that no line above calls one
# defined below).
if [ "${1:-}" = supervise ]; then
	shift
	supervise "$@"
	exit 0
fi
if [ "${1:-}" = standby ]; then
	shift
	standby "$@"
	exit 0
fi

