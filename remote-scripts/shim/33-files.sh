# put_spooled OP: ps_file and ps_size, the largest partial content a put of OP left in the
# spool (an attempt cut while the content travelled): what a later attempt sends on from,
# named by the probe's `spooled=`. Returns 1 when there is none.
put_spooled() {
	ps_file='' ps_size=0
	for ps_f in "$root/spool/put-$1".*; do
		[ -f "$ps_f" ] || continue
		ps_n=$(wc -c <"$ps_f" 2>/dev/null) || continue
		ps_n=$((ps_n + 0))
		if [ -z "$ps_file" ] || [ "$ps_n" -gt "$ps_size" ]; then
			ps_file=$ps_f ps_size=$ps_n
		fi
	done
	[ -n "$ps_file" ]
}

# put_resume OP FROM SPOOL: starts this attempt's spool with the first FROM bytes of the
# content an earlier attempt left (copied, not reused: the earlier attempt's reader may
# still write into its own file), and removes the earlier partials. Returns 1 when fewer
# than FROM bytes are held (taken by gc, or another attempt's digest failed).
put_resume() {
	put_spooled "$1" && [ "$ps_size" -ge "$2" ] || return 1
	head -c "$2" <"$ps_file" >"$3" || return 1
	[ "$(($(wc -c <"$3") + 0))" -eq "$2" ] || return 1
	for pr_f in "$root/spool/put-$1".*; do
		[ "$pr_f" = "$3" ] || rm -f "$pr_f"
	done
}

# parent_dir DIR: the directory DIR is in (`/` for a top-level one, `.` for a relative
# name without a slash).
parent_dir() {
	case $1 in
	*/*)
		pd=${1%/*}
		printf '%s\n' "${pd:-/}"
		;;
	*) printf '.\n' ;;
	esac
}

# put_install MARKER: the file delivery a put claimed (docs/host-protocol.md#files), run by
# the supervisor in place of a command, in the login's directory and umask. The claim's
# stdin is the content and its stdin_sum the digest; the command text is
# `opmark-put --mode MODE [--parents] -- 'PATH'`, quoted by the client. The content is
# written to a temporary file beside PATH, checked against the digest, given its mode,
# synced and renamed over PATH, so a reader of PATH sees the old file or the new one,
# never part of either. With --parents, missing directories on the way are made first. A PATH that already holds the digest is not written (its mode is set). Says
# `written` or `unchanged` on stdout; a failure says why on stderr and exits 1 (2: the
# request itself is malformed), leaving PATH as it was.
put_install() {
	pi_m=$1
	pi_req=$(cat -- "$pi_m/cmd") || exit 126
	case $pi_req in
	"opmark-put --mode "[0-7]*" -- '"*"'") ;;
	*)
		printf 'opmark-put: malformed request\n' >&2
		exit 2
		;;
	esac
	# The client quoted the path in single quotes ('\'' for a quote): the shell unquotes
	# it. Nothing else can be in it (checked just above and by the client).
	eval "set -- ${pi_req#opmark-put }"
	# `--parents` (a put of a directory's files): the directories PATH needs are made.
	pi_parents=
	case $#:${1-}:${3-}:${4-} in
	4:--mode:--:*) pi_path=$4 ;;
	5:--mode:--parents:--) pi_path=$5 pi_parents=1 ;;
	*)
		printf 'opmark-put: malformed request\n' >&2
		exit 2
		;;
	esac
	pi_mode=$2
	case $pi_mode in
	'' | *[!0-7]*)
		printf 'opmark-put: malformed request\n' >&2
		exit 2
		;;
	esac
	rget "$pi_m/claim" stdin_sum || exit 2
	pi_sum=$rv
	case $pi_path in
	*/*) pi_dir=${pi_path%/*} pi_base=${pi_path##*/} ;;
	*) pi_dir=. pi_base=$pi_path ;;
	esac
	[ -n "$pi_dir" ] || pi_dir=/
	if [ -z "$pi_base" ] || [ -d "$pi_path" ]; then
		printf 'opmark-put: %s is a directory on this host; name the file to write\n' "$pi_path" >&2
		exit 1
	fi
	# The deepest directory on the way to PATH that exists: those made below it are
	# synced with it once the file is in place, so the file's name is durable.
	pi_top=$pi_dir
	while ! [ -d "$pi_top" ]; do
		pi_top=$(parent_dir "$pi_top")
	done
	if [ "$pi_top" != "$pi_dir" ]; then
		if [ -z "$pi_parents" ]; then
			printf 'opmark-put: no directory %s on this host; create it first\n' "$pi_dir" >&2
			exit 1
		fi
		if ! mkdir -p -- "$pi_dir"; then
			printf 'opmark-put: cannot make the directory %s; nothing changed at %s\n' "$pi_dir" "$pi_path" >&2
			exit 1
		fi
	fi
	if [ -f "$pi_path" ]; then
		pi_have=$(sha256sum <"$pi_path" 2>/dev/null) || pi_have=
		if [ "${pi_have%% *}" = "$pi_sum" ]; then
			# The content is there already: nothing written, its mtime unchanged.
			chmod "$pi_mode" "$pi_path" || exit 1
			printf 'unchanged\n'
			exit 0
		fi
	fi
	# Named after the operation: a second delivery of it (after a crash) reuses the name
	# instead of leaving another temporary file behind.
	pi_tmp="$pi_dir/.$pi_base.opmark-${pi_m##*/}"
	rm -f -- "$pi_tmp"
	if ! cat -- "$pi_m/stdin" >"$pi_tmp"; then
		rm -f -- "$pi_tmp"
		printf 'opmark-put: cannot write %s; nothing changed at %s\n' "$pi_tmp" "$pi_path" >&2
		exit 1
	fi
	# The claim's stdin was checked against the digest before the claim; the copy is
	# compared with it byte for byte (cmp reads both in a fraction of a hash's time),
	# or hashed where there is no cmp.
	if command -v cmp >/dev/null 2>&1; then
		cmp -s -- "$pi_m/stdin" "$pi_tmp" && pi_have=$pi_sum || pi_have=
	else
		pi_have=$(sha256sum <"$pi_tmp")
	fi
	if [ "${pi_have%% *}" != "$pi_sum" ]; then
		rm -f -- "$pi_tmp"
		printf 'opmark-put: the written copy does not match its digest; nothing changed at %s\n' "$pi_path" >&2
		exit 1
	fi
	if ! chmod "$pi_mode" "$pi_tmp" || ! sync "$pi_tmp" || ! mv -f -- "$pi_tmp" "$pi_path"; then
		rm -f -- "$pi_tmp"
		printf 'opmark-put: cannot put the file in place; nothing changed at %s\n' "$pi_path" >&2
		exit 1
	fi
	# The rename durable too, and every directory made for it, before the exit record
	# says written.
	pi_d=$pi_dir
	sync "$pi_d" || true
	while [ "$pi_d" != "$pi_top" ]; do
		pi_d=$(parent_dir "$pi_d")
		sync "$pi_d" || true
	done
	printf 'written\n'
	exit 0
}

# get_send MARKER: the file read a get claimed, run by the supervisor in place of a
# command, in the login's directory. The command text is `opmark-get -- 'PATH'`, quoted by
# the client. PATH is copied into the marker first, so that the digest and the bytes sent
# are of one version of it, however it changes meanwhile; the first stderr line says
# `opmark-get: sha256=HEX bytes=N`, then the copy goes to stdout (kept in the marker as
# any output, for a replay) and is removed. A failure says why on stderr and exits 1 (2:
# the request itself is malformed).
get_send() {
	gs_m=$1
	gs_req=$(cat -- "$gs_m/cmd") || exit 126
	case $gs_req in
	"opmark-get -- '"*"'") ;;
	*)
		printf 'opmark-get: malformed request\n' >&2
		exit 2
		;;
	esac
	eval "set -- ${gs_req#opmark-get }"
	if [ "$#" -ne 2 ] || [ "$1" != -- ]; then
		printf 'opmark-get: malformed request\n' >&2
		exit 2
	fi
	gs_path=$2
	if ! [ -f "$gs_path" ]; then
		printf 'opmark-get: no file %s on this host\n' "$gs_path" >&2
		exit 1
	fi
	if ! cat -- "$gs_path" >"$gs_m/got"; then
		rm -f -- "$gs_m/got"
		printf 'opmark-get: cannot read %s\n' "$gs_path" >&2
		exit 1
	fi
	gs_sum=$(sha256sum <"$gs_m/got")
	gs_n=$(wc -c <"$gs_m/got")
	printf 'opmark-get: sha256=%s bytes=%s\n' "${gs_sum%% *}" "$((gs_n + 0))" >&2
	cat -- "$gs_m/got" || exit 1
	rm -f -- "$gs_m/got"
	exit 0
}
