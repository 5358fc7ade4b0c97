# redactor: copies its stdin to its stdout with every form of a secret (_OPMARK_R_1..N
# in its environment, see read_secrets) replaced by [REDACTED:NAME], line by line, so
# that a command that prints a secret leaves only the mark in its kept output, on the
# host as everywhere after it. awk reads the forms from its environment (never its
# arguments). Each line goes out as it comes; its newline only once the next line
# starts: the supervisor ends the stream with one newline of its own (see supervise), so
# that a last line without one stays without one. Like a capture, it outlives TERM.
redactor() {
	exec 4>&- 9>&- 6>&- 7>&-
	trap '' TERM
	# shellcheck disable=SC2016 # awk's own $0
	exec awk 'BEGIN {
	n = ENVIRON["_OPMARK_RN"] + 0
	for (i = 1; i <= n; i++) { v[i] = ENVIRON["_OPMARK_R_" i]; w[i] = "[REDACTED:" ENVIRON["_OPMARK_RL_" i] "]" }
}
{
	if (NR > 1) printf "\n"
	s = $0
	for (i = 1; i <= n; i++) {
		if (v[i] == "") continue
		o = ""
		while ((p = index(s, v[i])) > 0) { o = o substr(s, 1, p - 1) w[i]; s = substr(s, p + length(v[i])) }
		s = o s
	}
	printf "%s", s
	fflush()
}'
}

# run_become: in the command's subshell, runs the command as $sv_become through sudo and
# ends that subshell
# (`sudo -u USER sh -c CMD`, the command in sh's argument as sudo shows it in `ps`), its
# password from the askpass (see become_check). sudo resets the environment and closes
# every other descriptor, so the secrets go in at the head of the command's stdin, ahead
# of the stdin itself, and BECOME_READER takes them off: the list of names and line
# counts, then each value's lines (printf is a builtin: no process carries them).
# shellcheck disable=SC2317 # called by supervise, after an `exec` that only redirects
run_become() {
	sv_text=$(cat -- "$m/cmd") || exit 126
	become_askpass "$m"
	{
		printf '%s\n' "${sv_list:--}"
		for sv_n in $sv_secrets; do
			eval "printf '%s\\n' \"\${_OPMARK_S_$sv_n}\""
		done
		exec cat
	} | sudo -A -p '' -u "$sv_become" -- /bin/sh -c "$BECOME_READER" opmark-become "$sv_text"
	# The subshell ends with sudo's status (the command's): it must never go on to run the
	# command a second time, as the login user.
	exit "$?"
}

# become_askpass MARKER: with sudo's password given, the askpass (see become_check) and
# the password in the environment sudo -A hands to it.
become_askpass() {
	if [ -n "${_OPMARK_PW:-}" ]; then
		SUDO_ASKPASS=${1%/ops/*}/askpass
		export SUDO_ASKPASS _OPMARK_PW
	fi
}

# The program sudo runs as the become user (its $1 the command): reads the secrets
# run_become puts ahead of the stdin, exports each under its name, then evaluates the
# command with what is left of the stdin as its own.
# shellcheck disable=SC2016 # expanded by that sh, not here
BECOME_READER='_om_c=$1
IFS= read -r _om_list || exit 126
if [ "$_om_list" != - ]; then
	_om_ifs=$IFS
	IFS=,
	set -f
	set -- $_om_list
	set +f
	IFS=$_om_ifs
	for _om_e do
		_om_n=${_om_e%:*} _om_k=${_om_e##*:} _om_v= _om_i=0
		while [ "$_om_i" -lt "$_om_k" ]; do
			IFS= read -r _om_l || exit 126
			if [ "$_om_i" -eq 0 ]; then _om_v=$_om_l; else _om_v="$_om_v
$_om_l"; fi
			_om_i=$((_om_i + 1))
		done
		eval "$_om_n=\$_om_v"
		export "$_om_n"
	done
fi
unset _om_list _om_ifs _om_e _om_n _om_k _om_v _om_i _om_l
set --
eval "unset _om_c; $_om_c
"'

