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

# put_install MARKER: the file delivery a put claimed (docs/host-protocol.md#files), run by
# the supervisor in place of a command, in the login's directory and umask. The claim's
# stdin is the content and its stdin_sum the digest; the command text is
# `opmark-put --mode MODE [--parents] -- 'PATH'`, quoted by the client. PUT_WRITER
# writes it, as the login user or, with --become, as that user through sudo (the content
# on sudo's stdin: that user need not read the marker root). Says `written` or
# `unchanged` on stdout; a failure says why on stderr and exits 1 (2: the request itself
# is malformed), leaving PATH as it was.
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
	# A content of a MiB or more may be linked into place rather than copied (see
	# PUT_WRITER); a smaller one costs less to copy than to look at first.
	pi_link=
	rget "$pi_m/claim" stdin_bytes && is_uint "$rv" && [ "$rv" -ge 1048576 ] && pi_link=1
	# The temporary file is named after the operation: a second delivery of it (after a
	# crash) reuses the name instead of leaving another one behind.
	set -- "$pi_path" "$pi_mode" "$pi_parents" "$pi_sum" "opmark-${pi_m##*/}"
	if [ -n "${sv_become:-}" ]; then
		become_askpass "$pi_m"
		# shellcheck disable=SC2024 # the login reads the spool, sudo's user the pipe
		sudo -A -p '' -u "$sv_become" -- /bin/sh -c "$SYNC_FN
$PUT_WRITER" opmark-put "$@" '' '' <"$pi_m/stdin"
		# sudo's status is the writer's: never on to write a second time as the login.
		exit "$?"
	fi
	set -- "$@" "$pi_m/stdin" "$pi_link"
	eval "$PUT_WRITER" <"$pi_m/stdin"
	exit 1
}

# The writer of a put (its arguments PATH MODE PARENTS SUM TAG SAME LINK, the content on its
# stdin): self-contained, since sudo runs it in a shell of its own. The content is
# written to a temporary file beside PATH (`.NAME.TAG`; `.TAG` alone where that would pass
# the 255 bytes a file name may have: TAG names the operation, so it is one name per
# delivery still; the length in bytes is counted only when characters leave it in doubt), checked against SUM, given MODE,
# synced and renamed over PATH, so a reader of PATH sees the old file or the new one,
# never part of either; with PARENTS (1) missing directories on the way are made first.
# A PATH that already holds SUM is not written (its mode is set, its mtime unchanged).
# The directories made (below the deepest that existed) are synced once the file is in
# place, so its name is durable before the exit record says written. SAME, when not empty,
# is a file known to hold the content (the claim's stdin): the copy is compared with it
# byte for byte (cmp reads both in a fraction of a hash's time), else hashed. With LINK
# (1), SAME is first hard-linked as the temporary file: no copy and no comparison (its
# digest was checked when it arrived), the part of a large put that scp does not do. Only
# where the file then is what a copy made in PATH's directory would be: on the same file
# system, and neither the directory nor SAME has an ACL or a security context (`ls -ld`
# shows `+` or `.`) or the directory is setgid (a new file there takes its group). Once in
# place, SAME's name is removed, so PATH is one link as a copy would be. It always
# exits: 0 after saying `written` or `unchanged`, 1 after saying why on stderr.
# shellcheck disable=SC2016 # expanded by the shell that evaluates it, not here
PUT_WRITER='pw_path=$1 pw_mode=$2 pw_parents=$3 pw_sum=$4 pw_tag=$5 pw_same=$6 pw_link=${7:-}
pw_up() {
	case $1 in
	*/*)
		pw_u=${1%/*}
		pw_u=${pw_u:-/}
		;;
	*) pw_u=. ;;
	esac
}
case $pw_path in
*/*) pw_dir=${pw_path%/*} pw_base=${pw_path##*/} ;;
*) pw_dir=. pw_base=$pw_path ;;
esac
[ -n "$pw_dir" ] || pw_dir=/
if [ -z "$pw_base" ] || [ -d "$pw_path" ]; then
	printf "opmark-put: %s is a directory on this host; name the file to write\n" "$pw_path" >&2
	exit 1
fi
pw_top=$pw_dir
while ! [ -d "$pw_top" ]; do
	pw_up "$pw_top"
	pw_top=$pw_u
done
if [ "$pw_top" != "$pw_dir" ]; then
	if [ -z "$pw_parents" ]; then
		printf "opmark-put: no directory %s on this host; create it first\n" "$pw_dir" >&2
		exit 1
	fi
	if ! mkdir -p -- "$pw_dir"; then
		printf "opmark-put: cannot make the directory %s; nothing changed at %s\n" "$pw_dir" "$pw_path" >&2
		exit 1
	fi
fi
if [ -f "$pw_path" ]; then
	pw_have=$(sha256sum <"$pw_path" 2>/dev/null) || pw_have=
	if [ "${pw_have%% *}" = "$pw_sum" ]; then
		chmod "$pw_mode" "$pw_path" || exit 1
		printf "unchanged\n"
		exit 0
	fi
fi
pw_tmp="$pw_dir/.$pw_base.$pw_tag"
if [ "$((${#pw_base} + ${#pw_tag} + 2))" -gt 255 ] ||
	{ [ "$((4 * ${#pw_base} + ${#pw_tag} + 2))" -gt 255 ] &&
		[ "$(($(printf %s "$pw_base" | wc -c) + ${#pw_tag} + 2))" -gt 255 ]; }; then
	pw_tmp="$pw_dir/.$pw_tag"
fi
rm -f -- "$pw_tmp"
pw_linked=
if [ "$pw_link" = 1 ] && [ -n "$pw_same" ] && pw_ls=$(ls -ld -- "$pw_dir" "$pw_same" 2>/dev/null); then
	pw_linked=1
	while read -r pw_p pw_rest; do
		[ "${#pw_p}" -eq 10 ] || pw_linked=
		case $pw_p in d?????[sS]???) pw_linked= ;; esac
	done <<-PW_LS
		$pw_ls
	PW_LS
	[ -n "$pw_linked" ] && ! ln -- "$pw_same" "$pw_tmp" 2>/dev/null && pw_linked=
fi
if [ -z "$pw_linked" ] && ! { cat >"$pw_tmp"; } 2>/dev/null; then
	rm -f -- "$pw_tmp"
	printf "opmark-put: cannot write %s; nothing changed at %s\n" "$pw_tmp" "$pw_path" >&2
	exit 1
fi
if [ -n "$pw_linked" ]; then
	pw_have=$pw_sum
elif [ -n "$pw_same" ] && command -v cmp >/dev/null 2>&1; then
	cmp -s -- "$pw_same" "$pw_tmp" && pw_have=$pw_sum || pw_have=
else
	pw_have=$(sha256sum <"$pw_tmp")
fi
if [ "${pw_have%% *}" != "$pw_sum" ]; then
	rm -f -- "$pw_tmp"
	printf "opmark-put: the written copy does not match its digest; nothing changed at %s\n" "$pw_path" >&2
	exit 1
fi
if ! chmod "$pw_mode" "$pw_tmp" || ! sync "$pw_tmp" || ! mv -f -- "$pw_tmp" "$pw_path"; then
	rm -f -- "$pw_tmp"
	printf "opmark-put: cannot put the file in place; nothing changed at %s\n" "$pw_path" >&2
	exit 1
fi
[ -z "$pw_linked" ] || rm -f -- "$pw_same"
pw_d=$pw_dir
sync "$pw_d" || true
while [ "$pw_d" != "$pw_top" ]; do
	pw_up "$pw_d"
	pw_d=$pw_u
	sync "$pw_d" || true
done
printf "written\n"
exit 0'

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
	gs_n=$(wc -c <"$gs_m/got")
	gs_sum=$(sha256_of "$gs_m/got" "$((gs_n + 0))")
	printf 'opmark-get: sha256=%s bytes=%s\n' "${gs_sum%% *}" "$((gs_n + 0))" >&2
	cat -- "$gs_m/got" || exit 1
	rm -f -- "$gs_m/got"
	exit 0
}
