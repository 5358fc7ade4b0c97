# ---------------------------------------------------------------------------------------
# The marker root

setup_root() {
	root=${OPMARK_ROOT:-${XDG_STATE_HOME:-${HOME:-}/.local/state}/opmark}
	case $root in
	/*) ;;
	*) refuse "root_unusable reason=not_absolute" ;;
	esac
	# A reboot clears these, and with them the evidence that an operation ran. A target
	# that is itself erased at reboot (a lab target, a test container) may say so in the
	# environment its sshd gives every session; the client has no way to set it.
	case $root/ in
	/tmp/* | /dev/shm/* | /run/* | /var/run/*)
		[ "${OPMARK_ALLOW_VOLATILE_ROOT:-}" = 1 ] || refuse "root_unusable reason=volatile_path"
		;;
	esac
	if ! [ -d "$root/superseded" ]; then
		mkdir -p "$root/ops" "$root/spool" "$root/superseded" 2>/dev/null
		chmod 700 "$root" 2>/dev/null
	fi
	[ -w "$root/ops" ] || refuse "root_unusable reason=not_writable"
	root_id
	clock=$root/clock
	true 2>>"$root/shim.log" && exec 2>>"$root/shim.log"
	[ -n "$shim_hash" ] && [ -z "$shim_file" ] && cache_self
	true
}

# root_id: the marker root's id (docs/host-protocol.md#root-id), 128 random bits in hex made once with the
# root and kept in $root/root_id: written to a temp file, synced, then hard-linked into
# place (link(2) fails if the name exists, so of two first calls exactly one id wins,
# and the other reads it), then the directory synced. Reported as "M root_id=ID"; a call
# that expects another id (r=) is refused here, before the verb acts. A root that lost
# its id (wiped, rebuilt, another user's) is another store of evidence.
root_id() {
	rid=
	read -r rid 2>/dev/null <"$root/root_id"
	if [ -z "$rid" ] && ! [ -e "$root/root_id" ] && [ -z "$expect_root" ]; then
		ri_nonce=$nonce
		new_nonce || refuse "root_unusable reason=no_random"
		ri_new=$nonce nonce=$ri_nonce
		ri_tmp=$root/.root_id.$$
		if ! printf '%s\n' "$ri_new" >"$ri_tmp" || ! sync "$ri_tmp"; then
			rm -f "$ri_tmp"
			resource_cause
			refuse "root_unusable reason=$cause"
		fi
		ln "$ri_tmp" "$root/root_id" 2>/dev/null
		rm -f "$ri_tmp"
		sync "$root"
	fi
	# Read again whenever the first read found nothing: by now the id is in place, ours or
	# that of a first call that linked it between our read and our test (two tests there
	# left a window where neither saw the other's link: found by fifty claimers at once).
	[ -n "$rid" ] || read -r rid 2>/dev/null <"$root/root_id"
	case $rid in
	'' | *[!0-9a-f]*) rid= ;;
	esac
	[ "${#rid}" -eq 32 ] || rid=
	if [ -n "$expect_root" ] && [ "$expect_root" != "$rid" ]; then
		refuse "root_changed expected=$expect_root found=${rid:-none} root=$root"
	fi
	[ -n "$rid" ] || refuse "root_unusable reason=root_id_unreadable"
	frame "M root_id=$rid"
}

# Keeps this script's text as $root/shim/<sha256>.sh so that later calls send only its
# hash. Only a copy whose content hashes to the name the stub will check gets there (the
# $(...) that received the text dropped its final newline; printf puts it back), and only
# into a directory of ours. No fsync: a copy lost or torn in a crash fails the stub's
# hash check and is sent again, never run.
cache_self() {
	sc=$root/shim
	[ -d "$sc" ] || mkdir "$sc" 2>/dev/null
	[ -O "$sc" ] || return 0
	st=$sc/.$$.tmp
	if printf '%s\n' "$OPMARK_SHIM_SELF" >"$st" 2>/dev/null &&
		[ "$( (sha256sum || shasum -a 256) <"$st" 2>/dev/null)" = "$shim_hash  -" ]; then
		mv -f "$st" "$sc/$shim_hash.sh"
	else
		rm -f "$st"
	fi
}

# state OP: sets st (absent|fenced|completed|running|interrupted) and why.
state() {
	m="$root/ops/$1"
	why=
	if ! [ -d "$m" ]; then
		st=absent
	elif [ -f "$m/fenced" ]; then
		st=fenced
	elif exited; then
		st=completed
	elif [ -f "$m/exit_write_failed" ]; then
		# The command ended, but its exit record could not be written (a full disk).
		st=interrupted why=exit_write_failed
	elif ! identity_readable; then
		# No process identity can be read here: whether the claim's process lives cannot
		# be told, and liveness is evidence, never a guess (docs/host-protocol.md#liveness).
		st=running why=liveness_unknown
	elif has_proc; then
		s_boot=$rv
		rget "$m/proc" pid
		s_pid=$rv
		rget "$m/proc" start
		s_start=$rv
		read_boot
		if [ "$s_boot" != "$boot" ]; then
			st=interrupted why=reboot
		elif alive "$s_pid" "$s_start" || session_alive "$s_pid" "$s_start"; then
			st=running
		elif exited; then
			st=completed
		else
			st=interrupted why=process_gone
		fi
	elif claimed; then
		c_boot=$rv
		rget "$m/claim" fg_pid
		c_pid=$rv
		rget "$m/claim" fg_start
		c_start=$rv
		read_boot
		if [ "$c_boot" = "$boot" ] && alive "$c_pid" "$c_start"; then
			st=running why=starting
		elif has_proc; then
			state "$1"
		else
			st=interrupted why=never_started
		fi
	elif [ -n "$(find "$m" -prune -mmin -1 2>/dev/null)" ]; then
		# Between a claimer's mkdir and its complete claim record: microseconds normally.
		st=running why=claiming
	else
		st=interrupted why=never_started
	fi
}

# fence_failed M WAS: a fence whose record could not be written (a full disk). A marker
# the fence itself made (WAS=absent) is taken back down, so the op id reads absent, as
# before, and not as a claim that started and never ended; its waiters are woken first.
# A marker that held a claim keeps it, and the gate the fence took.
fence_failed() {
	if [ "$2" = absent ]; then
		for ff_w in "$1"/.w.*; do
			[ -p "$ff_w" ] && printf 'x\n' 1<>"$ff_w"
		done
		rm -f "$1/started" "$1"/.w.*
		rmdir "$1" 2>/dev/null && sync "${1%/*}"
	fi
	refuse "root_unusable reason=fence_write_failed"
}

# describe: the fields of a probe or refusal for the current marker $m.
describe() {
	d="state=$st"
	[ -n "$why" ] && d="$d why=$why"
	rget "$m/claim" fingerprint && d="$d fp=$rv"
	rget "$m/claim" stdin_sum && d="$d stdin_sum=$rv"
	for dk in attempt family claimed_at; do
		rget "$m/claim" "$dk" && d="$d $dk=$rv"
	done
	if [ "$st" = completed ]; then
		for dk in code timed_out ended_at cancel_pending cancelled; do
			rget "$m/exit" "$dk" && d="$d $dk=$rv"
		done
	fi
	if [ "$st" = fenced ]; then
		rget "$m/fenced" fenced_at && d="$d fenced_at=$rv"
		rget "$m/fenced" command_started && d="$d command_started=$rv"
	fi
	[ -f "$m/collected" ] && d="$d output_collected=1"
	# Absent, but a put's content partly here: a retry sends only the rest.
	[ "$st" = absent ] && put_spooled "${m##*/}" && d="$d spooled=$ps_size"
	if [ -f "$m/out" ] || [ -f "$m/err" ]; then
		sizes
		d="$d out=$so err=$se"
	fi
	printf '%s' "$d"
}

# sizes: so/se, the captured stdout/stderr byte counts (one wc for both).
sizes() {
	so=0 se=0
	[ -f "$m/out" ] && [ -f "$m/err" ] || return 0
	# Nothing captured (most commands' stderr, `true`'s both): no wc.
	[ -s "$m/out" ] || [ -s "$m/err" ] || return 0
	# shellcheck disable=SC2046 # wc's words: count name count name total
	set -- $(wc -c "$m/out" "$m/err")
	so=$1 se=$3
}

