# doctor: facts about the marker root for `opmark doctor`.
verb_doctor() {
	root=${OPMARK_ROOT:-${XDG_STATE_HOME:-${HOME:-}/.local/state}/opmark}
	frame "K root=$root"
	# The marker root must be absolute (every verb refuses a relative one: not_absolute).
	dr_abs=yes
	case $root in
	/*) ;;
	*) dr_abs=no ;;
	esac
	frame "K root_absolute=$dr_abs"
	# How runs detach their supervisor (see detach): a setsid of either kind, found on
	# PATH or at its usual place. setsid= keeps its old meaning (yes: with -f).
	dr_setsid=no dr_detach=none dr_kind=none dr_path=none
	if find_setsid; then
		dr_detach=setsid_setsid
		dr_path=$(command -v "$setsid_bin")
		# A static busybox sh names its own applets without a path.
		case $dr_path in
		/*) ;;
		*) dr_path=applet ;;
		esac
		if "$setsid_bin" -f true </dev/null >/dev/null 2>&1; then
			dr_setsid=yes dr_kind=util-linux
		else
			dr_setsid=no_f dr_kind=busybox
		fi
	fi
	frame "K shell=$OPMARK_SHELL login_shell=${SHELL:-unknown} setsid=$dr_setsid"
	frame "K detach=$dr_detach setsid_path=${dr_path:-none} setsid_kind=$dr_kind"
	dr_missing=
	# ln and readlink: the fingerprint index and host locks; sort: a run's locks.
	for dr_tool in cat date dd find head ln mkdir mkfifo mv od readlink rm sleep sort sync tail wc; do
		command -v "$dr_tool" >/dev/null 2>&1 || dr_missing="$dr_missing${dr_missing:+,}$dr_tool"
	done
	# The command is read with dd's count_bytes (exactly its size, never past it).
	if ! printf x | dd of=/dev/null bs=64 count=1 iflag=count_bytes,fullblock 2>/dev/null; then
		dr_missing="$dr_missing${dr_missing:+,}dd_count_bytes"
	fi
	frame "K missing=${dr_missing:-none}"
	# How output is captured: through coreutils' stdbuf, or one dd per read without it.
	dr_cap=dd_per_read
	command -v stdbuf >/dev/null 2>&1 && dr_cap=stdbuf
	frame "K capture=$dr_cap"
	# Liveness is read from /proc: without it the shim refuses every run (docs/host-protocol.md#liveness).
	dr_id=no
	identity_readable && dr_id=yes
	frame "K process_identity=$dr_id"
	if [ "$dr_abs" = yes ] && mkdir -p "$root/ops" 2>/dev/null && [ -w "$root/ops" ] &&
		(: >"$root/.doctor.$$") 2>/dev/null; then
		# Whether sync takes the files it is to make durable; without, runs flush
		# everything instead (see sync).
		dr_sync=yes
		command sync "$root/.doctor.$$" "$root" 2>/dev/null || dr_sync=no
		rm -f "$root/.doctor.$$"
		frame "K writable=yes"
		frame "K sync_file=$dr_sync"
	else
		frame "K writable=no"
	fi
	fs=$(stat -f -c %T "$root" 2>/dev/null || echo unknown)
	frame "K fstype=$fs"
	frame "K volatile_root_allowed=$([ "${OPMARK_ALLOW_VOLATILE_ROOT:-}" = 1 ] && echo yes || echo no)"
	avail=$(df -Pk "$root" 2>/dev/null | awk 'NR==2 {print $4}')
	frame "K avail_kib=${avail:-unknown}"
	read_boot
	frame "K boot_id=$boot"
	dr_rid=
	read -r dr_rid 2>/dev/null <"$root/root_id"
	frame "K root_id=${dr_rid:-none}"
	frame "K done"
}

