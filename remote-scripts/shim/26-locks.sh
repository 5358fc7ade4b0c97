# ---------------------------------------------------------------------------------------
# Host locks (docs/host-protocol.md#host-locks): the supervisor takes a claim's locks
# before its start gate (take_locks) and gives them back once the exit record is down.
#
# A lock is a directory, locks/<name>/ under the marker root, of N slots named 1..N and
# its capacity. A slot is a symbolic link whose target is its holder,
# "<session> <start> <boot> <since> <op>": `ln -s` makes the name and its content in one
# step and fails when the name is taken, so a slot is free or held, never half taken,
# and no second writer can replace it. The holder is a supervisor's session, and it
# holds while any process of that session lives on this boot (the command can outlive
# its supervisor), the liveness that section 3 proves for a claim. A slot whose holder
# is proven gone is removed by a waiter, one waiter at a time (lock_reap).
#
# The capacity is the lock's, not the caller's: `capacity` is a link to N made by the
# first taker, and a caller that says another N is refused, since two readings of one
# lock would let a caller who asked for 1 share it.

# lock_holder_alive TARGET: the holder a slot's target names still holds it: the same
# boot, and its session has a live process. A target opmark did not write (too few
# words) names no one and is treated as gone.
lock_holder_alive() {
	set -f
	# shellcheck disable=SC2086 # the target's words are the point
	set -- $1
	set +f
	[ "$#" -ge 5 ] && is_uint "$1" && is_uint "$2" || return 1
	[ -n "${boot:-}" ] || read_boot
	[ "$3" = "$boot" ] || return 1
	# The leader itself alive is the common case, and one read; else the session's members.
	alive "$1" "$2" || session_alive "$1" "$2"
}

# lock_reap DIR SLOT TARGET: removes slot SLOT of lock DIR if it still names TARGET and
# TARGET is gone. Under the lock's reaper directory (mkdir, atomic): between the check
# and the removal only a reaper could change a slot whose holder is gone, and there is
# one. A reaper that died holding it (a reap takes milliseconds) is taken to be gone
# after a minute. False when it removed nothing (another waiter is reaping, or the
# slot changed hands).
lock_reap() {
	lr_mutex=$1/.reaper
	if ! mkdir "$lr_mutex" 2>/dev/null; then
		[ -n "$(find "$lr_mutex" -prune -mmin +1 2>/dev/null)" ] && rmdir "$lr_mutex" 2>/dev/null
		return 1
	fi
	lr_t=$(readlink "$1/$2" 2>/dev/null) lr_reaped=1
	if [ "$lr_t" = "$3" ] && ! lock_holder_alive "$lr_t"; then
		rm -f "$1/$2" && lr_reaped=0
	fi
	rmdir "$lr_mutex"
	return "$lr_reaped"
}

# uptime_cs: sets up_cs to the centiseconds since boot (/proc/uptime, read by a builtin):
# a wait's deadline to a tenth of a second, where `now` counts whole seconds.
uptime_cs() {
	up_cs=''
	read -r up_cs _ 2>/dev/null </proc/uptime
	up_cs=${up_cs%.*}${up_cs#*.}
	# No leading zero: some shells read one as octal.
	while :; do
		case $up_cs in
		0?*) up_cs=${up_cs#0} ;;
		*) break ;;
		esac
	done
	is_uint "$up_cs"
}

# lock_take DIR CAP ME UNTIL_CS: takes a slot of lock DIR (capacity CAP) for holder ME,
# trying until up_cs reaches UNTIL_CS (see uptime_cs; one already past: once, so a wait
# shared by several locks is one deadline). Sets lock_slot to the slot taken,
# or returns 1 with lock_holder set to a holder's target (lock_busy), 2 with
# lock_capacity set to the capacity the lock already has, or 3 when it cannot try (bad
# arguments, no readlink, no /proc/uptime, a directory it cannot make). No order among
# waiters.
lock_take() {
	lt_dir=$1 lt_cap=$2 lt_me=$3 lock_slot='' lock_holder='' lock_capacity=''
	is_uint "$lt_cap" && [ "$lt_cap" -ge 1 ] && is_uint "$4" || return 3
	mkdir -p "$lt_dir" 2>/dev/null || return 3
	if ! ln -s "$lt_cap" "$lt_dir/capacity" 2>/dev/null; then
		lock_capacity=$(readlink "$lt_dir/capacity" 2>/dev/null)
		[ "$lock_capacity" = "$lt_cap" ] || return 2
	fi
	command -v readlink >/dev/null 2>&1 || return 3
	lt_until=$4
	while :; do
		lt_i=1
		while [ "$lt_i" -le "$lt_cap" ]; do
			if ln -s "$lt_me" "$lt_dir/$lt_i" 2>/dev/null; then
				# shellcheck disable=SC2034 # the caller's answer
				lock_slot=$lt_i
				return 0
			fi
			lt_t=$(readlink "$lt_dir/$lt_i" 2>/dev/null)
			# Freed between the two steps: try the same slot again.
			[ -n "$lt_t" ] || continue
			if ! lock_holder_alive "$lt_t" && lock_reap "$lt_dir" "$lt_i" "$lt_t"; then
				continue
			fi
			# shellcheck disable=SC2034 # the caller's answer, if none frees
			lock_holder=$lt_t
			lt_i=$((lt_i + 1))
		done
		uptime_cs
		[ "$up_cs" -lt "$lt_until" ] || return 1
		sleep 0.1
	done
}

# lock_release DIR SLOT ME: gives slot SLOT of lock DIR back, if ME holds it.
lock_release() {
	[ "$(readlink "$1/$2" 2>/dev/null)" = "$3" ] && rm -f "$1/$2"
}

# valid_locks LIST: `-` (none), or NAME:N,... with names of [A-Za-z0-9._-] (a letter or
# digit first, at most 64) in strictly ascending order (each once, and the order every
# claim takes them in, so two claims never wait for each other crosswise) and N a
# capacity from 1 to 999.
valid_locks() {
	[ "$1" = - ] && return 0
	case $1 in
	'' | *[!A-Za-z0-9._:,-]* | ,* | *, | *,,*) return 1 ;;
	esac
	vl_prev=''
	vl_ifs=$IFS
	IFS=,
	set -f
	# shellcheck disable=SC2086 # split at the commas
	set -- $1
	set +f
	IFS=$vl_ifs
	for vl in "$@"; do
		vl_name=${vl%:*} vl_cap=${vl##*:}
		case $vl_name in
		'' | *:* | [!A-Za-z0-9]*) return 1 ;;
		esac
		[ "${#vl_name}" -le 64 ] && [ "$vl_name:$vl_cap" = "$vl" ] || return 1
		case $vl_cap in
		'' | *[!0-9]* | 0*) return 1 ;;
		esac
		[ "${#vl_cap}" -le 3 ] || return 1
		# Byte order, as the client sorts them (expr's string comparison is the locale's).
		if [ -n "$vl_prev" ]; then
			[ "$(printf '%s\n%s\n' "$vl_prev" "$vl_name" | LC_ALL=C sort | head -n 1)" = "$vl_prev" ] &&
				[ "$vl_prev" != "$vl_name" ] || return 1
		fi
		vl_prev=$vl_name
	done
	return 0
}

# take_locks: in the supervisor (in the marker's directory, its identity in $$, sv_start
# and boot), takes the locks its claim names within the claim's lock_wait, one deadline
# for all, holding them as its session (sv_held: DIR/SLOT words, for release_locks); or
# gives back what it took and ends through lock_busy.
take_locks() {
	sv_held=''
	rget claim locks
	[ -n "$rv" ] && [ "$rv" != - ] || return 0
	tl_list=$rv
	rget claim lock_wait
	tl_wait=${rv:-0}
	is_uint "$tl_wait" || tl_wait=0
	uptime_cs || lock_busy "${tl_list%%:*}" "" "reason=cannot_wait"
	tl_until=$((up_cs + tl_wait * 100))
	now
	sv_me="$$ $sv_start $boot $now ${m##*/}"
	tl_ifs=$IFS
	IFS=,
	set -f
	# shellcheck disable=SC2086 # split at the commas (checked by valid_locks)
	set -- $tl_list
	set +f
	IFS=$tl_ifs
	for tl in "$@"; do
		tl_dir=${m%/ops/*}/locks/${tl%:*}
		lock_take "$tl_dir" "${tl##*:}" "$sv_me" "$tl_until"
		case $? in
		0) sv_held="$sv_held $tl_dir/$lock_slot" ;;
		1) lock_busy "${tl%:*}" "$lock_holder" ;;
		2)
			is_uint "$lock_capacity" || lock_capacity=unknown
			lock_busy "${tl%:*}" "" "reason=capacity_differs capacity=$lock_capacity"
			;;
		*) lock_busy "${tl%:*}" "" "reason=cannot_wait" ;;
		esac
	done
	return 0
}

# release_locks: gives back the locks take_locks took (none: nothing).
release_locks() {
	for rl in ${sv_held:-}; do
		lock_release "${rl%/*}" "${rl##*/}" "$sv_me"
	done
	sv_held=''
}

# holder_cmd_fields FILE: sets hc_fields to the fields that name a lock holder's command
# (FILE, its marker's cmd) in lock_busy: `cmd=HEX`, the first line of FILE and at most its
# first 160 bytes, in lowercase hex (a frame's field holds no space or newline, and a
# command any byte), then ` cmd_cut=1` when FILE holds more than that. Empty when FILE is
# missing, unreadable or starts with a newline. The client decodes and redacts it.
holder_cmd_fields() {
	hc_fields=''
	[ -f "$1" ] && [ -r "$1" ] || return 0
	# Two bytes past the limit tell a line of 160 bytes from a longer one, and a line that
	# ends the file from one that more follow. As " xx" words, one space before each.
	hc_hex=$(head -c 162 -- "$1" 2>/dev/null | od -An -tx1 -v | tr -s ' \n' '  ')
	hc_hex=" ${hc_hex# }"
	hc_hex=${hc_hex% }
	hc_line=${hc_hex%%" 0a"*}
	hc_cut=''
	case ${hc_hex#"$hc_line"} in
	'' | ' 0a') ;;
	*) hc_cut=1 ;;
	esac
	# 160 bytes are 480 characters of " xx".
	while [ "${#hc_line}" -gt 480 ]; do
		hc_line=${hc_line%???}
		hc_cut=1
	done
	hc_line=$(printf '%s' "$hc_line" | tr -d ' ')
	[ -n "$hc_line" ] || return 0
	hc_fields="cmd=$hc_line${hc_cut:+ cmd_cut=1}"
}

# lock_busy NAME HOLDER [FIELDS]: the supervisor could not take lock NAME (held by HOLDER,
# a slot's target; or as FIELDS say: reason=capacity_differs capacity=N, the lock's own,
# or reason=cannot_wait, no clock or no readlink on the host), so nothing ran: it gives
# back what it took, tells whoever follows ("f lock_busy ..." on the wake-up FIFOs,
# naming the holder's op id, since when and, while its marker has it, its command), and
# takes a fresh claim back, so that the op id reads absent and a rerun claims it again. A
# claim that replaced an interrupted one stays (the evidence under it moved aside; it
# reads interrupted, as after any start that failed). Ends the supervisor.
lock_busy() {
	release_locks
	lb_holder='' lb_since=''
	if [ -n "$2" ]; then
		set -f
		# shellcheck disable=SC2086 # the target's words
		set -- "$1" $2 "${3:-}"
		set +f
		lb_since=${5:-} lb_holder=${6:-}
		set -- "$1" "" "${7:-}"
	fi
	lb_detail="lock_busy lock=$1"
	if [ -n "$lb_holder" ] && valid_id "$lb_holder"; then
		lb_detail="$lb_detail holder=$lb_holder"
		# The holder's marker, beside ours: its command, as the client names it.
		holder_cmd_fields "${m%/*}/$lb_holder/cmd"
	else
		hc_fields=''
	fi
	is_uint "$lb_since" && lb_detail="$lb_detail since=$lb_since"
	[ -n "$hc_fields" ] && lb_detail="$lb_detail $hc_fields"
	[ -n "${3:-}" ] && lb_detail="$lb_detail $3"
	for w in .w.*; do
		[ -p "$w" ] && printf 'f %s\n' "$lb_detail" 1<>"$w"
	done
	if ! [ -f supersedes ]; then
		# Nothing can start it later (the gate is ours), then the claim goes.
		take_gate .
		rm -rf "$m"
		sync "${m%/*}"
	fi
	exit 0
}
