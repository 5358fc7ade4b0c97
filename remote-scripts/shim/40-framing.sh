# ---------------------------------------------------------------------------------------
# Framing

new_nonce() {
	nonce=
	# Two of the kernel's random UUIDs, read by a builtin (no process): the first's 32 hex
	# digits with its two fixed ones (version, variant) taken from the second, 128 random
	# bits. od on /dev/urandom where the file is missing.
	nn_a='' nn_b=''
	read -r nn_a </proc/sys/kernel/random/uuid 2>/dev/null &&
		read -r nn_b </proc/sys/kernel/random/uuid 2>/dev/null
	case $nn_a$nn_b in
	????????-????-????-????-????????????????????-????-????-????-????????????)
		nn_ifs=$IFS
		IFS=-
		# shellcheck disable=SC2086 # splitting at the dashes is the point
		set -- $nn_a $nn_b
		IFS=$nn_ifs
		nn_x=${6#?} nn_y=${6#??}
		nonce=$1$2${6%"$nn_x"}${3#?}${nn_x%"$nn_y"}${4#?}$5
		;;
	*)
		# shellcheck disable=SC2046 # od prints the bytes as words; joining them is the point
		set -- $(od -An -N16 -tx1 /dev/urandom)
		for nb in "$@"; do nonce=$nonce$nb; done
		;;
	esac
	case $nonce in
	'' | *[!0-9a-f]*) nonce= ;;
	esac
	[ "${#nonce}" -eq 32 ]
}

frame() {
	printf 'OPMARK/1 %s %s\n' "$nonce" "$*" >&3
}

hello() {
	printf 'OPMARK/1 %s H v=%s%s\n' "$nonce" "$OPMARK_SHIM_VERSION" "${call_token:+ c=$call_token}"
	# Output travels in committed frames from here on; an open stdout would only let
	# other processes write unframed bytes into the channel through /proc.
	exec 1>/dev/null
	frame "H v=$OPMARK_SHIM_VERSION${call_token:+ c=$call_token}"
}

refuse() {
	drop_spools
	frame "R $*"
	# A resident's request refused before its data was read: what is left of the data
	# must never be read as the next request, so the resident ends (see serve_one).
	[ -n "${sv_owed:-}" ] && exit 4
	exit 0
}

drop_spools() {
	[ -n "${rc_left:-}" ] && rm -f "$rc_left"
	[ -n "${cmd_spool:-}" ] && rm -f "$cmd_spool"
	# A put's content stays for a later attempt to resume from (see put_spooled).
	[ -n "${spool:-}" ] && [ -z "${spool_keep:-}" ] && rm -f "$spool"
	return 0
}

