# ---------------------------------------------------------------------------------------
# Small helpers

valid_id() {
	case $1 in
	'' | *[!A-Za-z0-9._:-]* | [!A-Za-z0-9]*) return 1 ;;
	esac
	[ "${#1}" -le 128 ]
}

is_uint() {
	case $1 in
	'' | *[!0-9]*) return 1 ;;
	esac
	return 0
}

# now: sets now to the time in seconds since the epoch, usually without starting a
# process: the seconds since boot (/proc/uptime, read by a builtin) plus the epoch time of
# the boot kept in $clock (the marker root's `clock`: boot id, that time, and the uptime it
# was taken at). date(1) sets it again each boot and every 10 minutes, so a clock step
# shows within 10 minutes; a missing, foreign or malformed file only costs the date.
# (/proc/stat's btime would need no file, but the read builtin takes a system call per
# byte and the line before it counts every interrupt: kilobytes on a large host.)
now() {
	now='' nw_up='' nw_boot='' nw_base='' nw_set=''
	read -r nw_up _ 2>/dev/null </proc/uptime
	nw_up=${nw_up%.*}
	[ -n "${clock:-}" ] && read -r nw_boot nw_base nw_set _ 2>/dev/null <"$clock"
	[ -n "${boot:-}" ] || read_boot
	if is_uint "$nw_up" && is_uint "$nw_base" && is_uint "$nw_set" &&
		[ "$nw_boot" = "$boot" ] && [ "$nw_up" -ge "$nw_set" ] &&
		[ "$((nw_up - nw_set))" -lt 600 ]; then
		now=$((nw_base + nw_up))
		return 0
	fi
	now=$(date +%s)
	if [ -n "${clock:-}" ] && is_uint "$nw_up" && is_uint "$now"; then
		printf '%s %s %s\n' "$boot" "$((now - nw_up))" "$nw_up" >"$clock" 2>/dev/null
	fi
	return 0
}

# durable_write DIR NAME CONTENT [MORE_DIRS...]: temp file, fsync, rename, fsync the
# directory (and MORE_DIRS, e.g. the parent of a new marker), so that a reader sees the
# old record or the new one, never a torn one, and a crash keeps it.
durable_write() {
	dw_dir=$1 dw_file="$1/$2" dw_tmp="$1/.$2.tmp.$$"
	if ! printf '%s\n' "$3" >"$dw_tmp"; then
		# A full disk: no half-written record left behind.
		rm -f "$dw_tmp"
		return 1
	fi
	# Rename first, then one sync for the file's data and the directory entry: readers
	# see the whole record either way (the rename is atomic, the data in the page
	# cache), and nothing proceeds until both are on disk.
	mv -f "$dw_tmp" "$dw_file" || return 1
	shift 3
	sync "$dw_file" "$dw_dir" "$@"
}

# sync [FILE...]: fsyncs the files and directories named (coreutils, most busybox
# builds). Some sync builds take no file arguments ("no arguments allowed"): there every
# later call of this shell flushes everything with a plain sync, slower but as durable,
# rather than every run failing as write_failed. (A sync that fails on `/` too is such a
# build; one that syncs `/` but not the files named has met a real error.) Kept as text
# too, for the scripts the shim hands to sudo (see put_install).
# shellcheck disable=SC2016 # expanded where it is evaluated
SYNC_FN='sync() {
	if [ -z "${sync_plain:-}" ]; then
		command sync "$@" 2>/dev/null && return 0
		[ "$#" -gt 0 ] || return 1
		command sync / 2>/dev/null && return 1
		sync_plain=1
	fi
	command sync
}'
eval "$SYNC_FN"

# sha256_of FILE BYTES: FILE's SHA-256 as sha256sum prints it (the hex digest first).
# Content of more than a megabyte is hashed by openssl where the host has it: it uses the
# CPU's SHA instructions where coreutils and busybox do not (100 MB: 0.14 s against
# 0.30 s here), while its start costs more than a small file's whole hash. Anything but
# a digest from it falls back to sha256sum.
sha256_of() {
	if [ "$2" -gt 1048576 ] && command -v openssl >/dev/null 2>&1; then
		so_sum=$(openssl dgst -sha256 -r <"$1" 2>/dev/null) || so_sum=
		so_hex=${so_sum%% *}
		case $so_hex in
		'' | *[!0-9a-f]*) ;;
		*)
			if [ "${#so_hex}" -eq 64 ]; then
				printf '%s\n' "$so_sum"
				return 0
			fi
			;;
		esac
	fi
	sha256sum <"$1"
}

# find_setsid: sets setsid_bin to a setsid to detach with: the one on PATH, or one at its
# usual absolute path when PATH lacks it (a startup file's PATH, a static busybox sh
# that answers only its own applets). Either kind will do (see detach); false when the
# host has none.
find_setsid() {
	setsid_bin=
	if command -v setsid >/dev/null 2>&1; then
		setsid_bin=setsid
		return 0
	fi
	for fs_bin in /usr/bin/setsid /bin/setsid /usr/sbin/setsid /sbin/setsid; do
		if [ -f "$fs_bin" ] && [ -x "$fs_bin" ]; then
			setsid_bin=$fs_bin
			return 0
		fi
	done
	return 1
}

# take_gate M: takes the start gate of marker M by creating M/started exclusively
# (noclobber: O_EXCL, a builtin, so exactly one of any number of takers wins); false when
# it was taken already (also by an older shim's directory there).
take_gate() {
	set -C
	{ true >"$1/started"; } 2>/dev/null
	tg_rc=$?
	set +C
	return "$tg_rc"
}

# rget FILE KEY: sets rv to the value of KEY=value in a record file ("" if absent).
# A variable, not output: a command substitution would cost a fork per field.
rget() {
	rv=
	[ -f "$1" ] || return 1
	while IFS= read -r rg_line || [ -n "$rg_line" ]; do
		case $rg_line in
		"$2="*)
			rv=${rg_line#*=}
			return 0
			;;
		esac
	done <"$1"
	return 1
}

