# proc_stat PID: sets ps_state, ps_ppid, ps_session, ps_start from /proc/PID/stat
# (fields 3, 4, 6 and 22, counted after the last ") " because the command name may hold spaces).
proc_stat() {
	ps_line=
	# Empty when the process cannot be read, never the last one's.
	ps_start=
	read -r ps_line 2>/dev/null <"/proc/$1/stat" || return 1
	proc_fields
}

# proc_fields: proc_stat's parse of the line in ps_line (a resident's request reads its
# own line once and parses it here: the builtin reads /proc a byte per system call).
proc_fields() {
	ps_rest=${ps_line##*) }
	set -f
	# shellcheck disable=SC2086 # splitting the stat fields is the point
	set -- $ps_rest
	set +f
	[ "$#" -ge 20 ] || return 1
	ps_state=$1
	ps_ppid=$2
	ps_session=$4
	shift 19
	ps_start=$1
	return 0
}

# alive PID START: the process exists, is not a zombie and is the one recorded (a reused
# pid has another start time).
alive() {
	proc_stat "$1" || return 1
	[ "$ps_state" != Z ] && [ "$ps_start" = "$2" ]
}

# session_alive SID START: some live process still belongs to the supervisor's session
# (the command may outlive a killed supervisor). A session id is its leader's pid, which
# the kernel hands out again only once the session has no member left: a process with
# that pid and another start time means the recorded session is gone (pid reuse, e.g. in
# a container's pid namespace after a crash), whatever is in the new one. A member older
# than the recorded supervisor cannot be of its session either.
session_alive() {
	if proc_stat "$1" && [ "$ps_start" != "$2" ]; then
		return 1
	fi
	for sa_stat in /proc/[0-9]*/stat; do
		sa_pid=${sa_stat#/proc/}
		sa_pid=${sa_pid%/stat}
		proc_stat "$sa_pid" || continue
		[ "$ps_session" = "$1" ] || continue
		[ "$ps_state" != Z ] || continue
		older_than "$ps_start" "$2" && continue
		return 0
	done
	return 1
}

# older_than START1 START2: process start time START1 is before START2 (both numbers).
older_than() {
	is_uint "$1" && is_uint "$2" && [ "$1" -lt "$2" ]
}

# identity_readable: this shell can read its own process identity (its /proc entry, with
# a start time, is its own) and the boot id. Without them (no /proc, a /proc of another
# pid namespace, hidepid hiding our own processes) nobody's liveness can be told, and
# "gone" would let a rerun supersede a live command (docs/host-protocol.md#liveness). Checked once per shell;
# id_start keeps the start time of $fg it read. A resident's request comes with both
# from the one read of its own /proc/self/stat (see serve_one): the same check.
identity_readable() {
	if [ -z "${id_ok:-}" ]; then
		id_ok=no ir_pid='' id_start=''
		read_boot
		if [ -n "${self_line:-}" ]; then
			ps_line=$self_line
			ir_pid=${ps_line%% *}
			# Our entry must be there by its pid too (hidepid, a foreign /proc).
			[ -r "/proc/$ir_pid/stat" ] && proc_fields || ir_pid=
		else
			# /proc/self, opened by this shell itself (a builtin's redirection), is $$
			# only in a /proc of our own pid namespace.
			read -r ir_pid _ 2>/dev/null </proc/self/stat
			[ "$ir_pid" = "$fg" ] && proc_stat "$fg" || ir_pid=
		fi
		if [ "$boot" != unknown ] && [ -n "$ir_pid" ] && [ "$ir_pid" = "$fg" ] &&
			is_uint "$ps_start"; then
			id_ok=yes id_start=$ps_start
		fi
	fi
	[ "$id_ok" = yes ]
}

# read_boot: sets boot to this boot's id (a reboot changes it).
read_boot() {
	boot=
	read -r boot 2>/dev/null </proc/sys/kernel/random/boot_id
	boot=${boot:-unknown}
}

# The claim and the supervisor's record are written in place, with no temp file and
# rename (each would cost a process on every run), so a reader may catch one
# half-written: a record counts only once its last line is there. claimed, has_proc and
# exited say that the claim, the supervisor's record and the exit record of $m (renamed
# into place whole, but checked the same way) are complete; they leave the last value
# in rv.
claimed() { rget "$m/claim" boot; }
has_proc() { rget "$m/proc" boot; }
exited() { rget "$m/exit" cancelled; }

