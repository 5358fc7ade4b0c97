# read_secrets LIST: the secrets block at the head of a run's data
# (docs/host-protocol.md#secrets). LIST is "-" (none) or comma-separated entries
# KIND:NAME:LINES, and the data holds, for each in order, the value's LINES lines (its
# newlines, one after each line, the last one too, so `read` takes them all). KIND e: the
# command's environment variable NAME; p: sudo's password for --become (_OPMARK_PW, read
# by the askpass, see become_check; never the command's); r: a form of NAME's value (the value, one of its
# lines, its base64 or URL-encoded text) that the redactor replaces with
# [REDACTED:NAME]. The values stay in this shell's memory (_OPMARK_S_NAME, _OPMARK_R_N,
# never exported here): never in an argument, a file or a record. Sets sc_names (" A
# B") and sc_rn (the count of forms); false on a malformed list or a short block.
read_secrets() {
	sc_names='' sc_rn=0 sc_pw='' sc_list=''
	[ "$1" = - ] && return 0
	rs_ifs=$IFS
	IFS=,
	set -f
	# shellcheck disable=SC2086 # splitting the list at its commas is the point
	set -- $1
	set +f
	IFS=$rs_ifs
	for rs_e in "$@"; do
		rs_kind=${rs_e%%:*} rs_rest=${rs_e#*:}
		rs_name=${rs_rest%%:*} rs_lines=${rs_rest#*:}
		# Upper case only: the shim's own variables are lower case, so none of them can
		# be set by a secret in the command's subshell (see supervise); and none of the
		# names the command's shell relies on (as the client refuses them too).
		case $rs_name in
		'' | [0-9]* | *[!A-Z0-9_]*) return 1 ;;
		PATH | HOME | SHELL | IFS | ENV | BASH_ENV | PS4 | CDPATH | PWD | OLDPWD | USER | LOGNAME | LANG | TERM) return 1 ;;
		OPMARK_* | _OPMARK_* | LD_* | LC_*) return 1 ;;
		esac
		is_uint "$rs_lines" && [ "$rs_lines" -ge 1 ] || return 1
		rs_v='' rs_i=0 rs_l=''
		while [ "$rs_i" -lt "$rs_lines" ]; do
			IFS= read -r rs_l || return 1
			if [ "$rs_i" -eq 0 ]; then
				rs_v=$rs_l
			else
				rs_v="$rs_v
$rs_l"
			fi
			rs_i=$((rs_i + 1))
		done
		case $rs_kind in
		e)
			case "$sc_names " in
			*" $rs_name "*) return 1 ;;
			esac
			eval "_OPMARK_S_$rs_name=\$rs_v"
			sc_names="$sc_names $rs_name"
			sc_list="$sc_list,$rs_name:$rs_lines"
			;;
		p)
			[ -z "$sc_pw" ] || return 1
			_OPMARK_PW=$rs_v sc_pw=1
			;;
		r)
			sc_rn=$((sc_rn + 1))
			eval "_OPMARK_R_$sc_rn=\$rs_v _OPMARK_RL_$sc_rn=\$rs_name"
			;;
		*) return 1 ;;
		esac
	done
	rs_v='' rs_l=''
}

# with_secrets CMD ARGS...: runs CMD (detach) with the secrets read by read_secrets in
# its environment, in a subshell, so that this shell (a resident's) exports nothing: the
# supervisor it starts inherits them, and no argument carries them.
with_secrets() {
	if [ -z "$sc_names" ] && [ "$sc_rn" -eq 0 ]; then
		"$@"
		return
	fi
	(
		for ws_n in $sc_names; do
			export "_OPMARK_S_$ws_n"
		done
		ws_i=1
		while [ "$ws_i" -le "$sc_rn" ]; do
			export "_OPMARK_R_$ws_i" "_OPMARK_RL_$ws_i"
			ws_i=$((ws_i + 1))
		done
		OPMARK_SECRET_NAMES=$sc_names _OPMARK_RN=$sc_rn OPMARK_SECRET_LIST=${sc_list#,}
		export OPMARK_SECRET_NAMES _OPMARK_RN OPMARK_SECRET_LIST
		[ -n "$sc_pw" ] && export _OPMARK_PW
		"$@"
	)
}

# become_check: before the claim, whether sudo runs a command as $become for the login
# user without a terminal: with no password (NOPASSWD, or root), or with the password
# given (through the askpass, see askpass_file). Refuses, naming why, when it cannot:
# nothing is claimed and nothing ran. The check runs `true` as that user.
become_check() {
	command -v sudo >/dev/null 2>&1 || refuse "cannot_start reason=no_sudo"
	bc_err=$(sudo -n -u "$become" -- true 2>&1 </dev/null) && return 0
	case $bc_err in
	*tty*) refuse "cannot_start reason=become_needs_tty" ;;
	esac
	[ -n "$sc_pw" ] || refuse "cannot_start reason=become_needs_password"
	askpass_file || refuse "root_unusable reason=write_failed"
	if bc_err=$(
		export _OPMARK_PW
		SUDO_ASKPASS=$root/askpass
		export SUDO_ASKPASS
		sudo -A -p '' -u "$become" -- true 2>&1 </dev/null
	); then
		return 0
	fi
	case $bc_err in
	*tty*) refuse "cannot_start reason=become_needs_tty" ;;
	*incorrect*) refuse "cannot_start reason=become_wrong_password" ;;
	esac
	refuse "cannot_start reason=become_refused"
}

# askpass_file: $root/askpass, the program sudo -A runs for the password: it prints
# _OPMARK_PW from its environment (sudo runs it with the caller's). No secret in it.
askpass_file() {
	# shellcheck disable=SC2016 # expanded by the askpass, not here
	ap_text='#!/bin/sh
printf '"'%s\\n'"' "$_OPMARK_PW"'
	ap_now=''
	[ -f "$root/askpass" ] && ap_now=$(cat "$root/askpass" 2>/dev/null)
	[ "$ap_now" = "$ap_text" ] && [ -x "$root/askpass" ] && return 0
	printf '%s\n' "$ap_text" >"$root/askpass.$$" && chmod 700 "$root/askpass.$$" &&
		mv -f "$root/askpass.$$" "$root/askpass"
}

