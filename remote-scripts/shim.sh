# shellcheck shell=sh
# opmark host shim: claims an operation marker atomically, runs the command detached,
# records its exit status durably, and answers probes. Delivered by the opmark client
# (nothing is installed on the host by hand) and kept by the host in its marker root
# under its sha256 (see Invocation); runs under dash, bash and busybox ash.
#
# Invocation (built by src/shim/mod.rs): the exec request is a one-line stub that any
# login shell can run (sh, bash, zsh, fish, tcsh). Usually it runs this script from the
# host's cache, $root/shim/<sha256>.sh, once the hash of the file matches:
#   sh FILE FILE c=TOKEN VERB ARGS...
# When the file is missing or differs, the stub asks for the text (nothing else runs),
# and the client calls again with the text in the channel's data; the stub then runs
#   sh -c "$SHIM" opmark-shim "$SHIM" c=TOKEN h=SHA256 VERB ARGS...
# and setup_root keeps the text in the cache. The script receives itself (file or text)
# as $1 so that it can start its detached supervisor with the same code (`setsid setsid
# sh FILE ... supervise` or `setsid setsid sh -c "$SHIM" ... supervise`, see detach).
# TOKEN is the client's
# per-call token, echoed in the header so that text printed by the login shell's startup
# files (even a copy of a header) is never taken for the shim's reply. The rest of the
# channel's data is the verb's input: for run, the secrets block (see read_secrets), the
# command (exactly its byte count), then the spooled stdin, if any, up to EOF.
#
# Verbs and their positional parameters, in order. The client builds every call from its
# own copy of this table (src/shim/mod.rs, VERBS); a unit test holds the two, and each
# verb's argument count check below, equal. The header's v= (OPMARK_SHIM_VERSION) is the
# protocol version the client checks: bump it with any change here or to the frames.
#   verb: run OP ATTEMPT FP FAMILY TIMEOUT_S CAP_BYTES STDIN_BYTES STDIN_SHA256 SUPERSEDE REPEAT_S REPEAT_ACTION DECLARED SECRETS BECOME CMD_BYTES
#   verb: probe OP
#   verb: attach OP OUT_OFFSET ERR_OFFSET
#   verb: output OP STREAM FROM LEN
#   verb: repeats OP FP REPEAT_S DECLARED
#   verb: fence OP FORCE
#   verb: supersede OP BY_ATTEMPT
#   verb: gc AGE_S DRY_RUN TOMB_AGE_S
#   verb: doctor
#   verb: cancel OP GRACE_MS
#   verb: serve
# serve is the resident host session (see verb_serve): it answers one request per line
# of its stdin, "q c=TOKEN [r=ROOT_ID] VERB ARGS...", each with the same frames as a call
# of its own, then an end frame "Z c=TOKEN status=N".
# A call for an operation that has attempts puts r=ROOT_ID (the marker root id they
# reached) between c=/h= and the verb; every verb that uses the marker root then answers
# a frame "M root_id=ID" first, or refuses "root_changed expected=... found=..." before
# acting when its root's id differs (found=none: the root has no id yet).
#
# Replies. stdout: a header line only (then the foreground lets go of the channel's
# stdout). stderr (frames): lines "OPMARK/1 <nonce> <KIND> <fields>"; a frame "O <n>" or
# "E <n>" is followed by exactly n raw bytes of the command's stdout or stderr and then a
# frame "C" that commits them. The nonce is 128 random bits made here and kept only in
# this shell's memory and the frames it writes: never in a file or directory name, a
# marker file, a process's arguments or environment, or a descriptor the command
# inherits. Any process of the login user can open /proc/<foreground>/fd/N and write into
# the channel; without the nonce such bytes break the framing (the client then probes,
# and never delivers uncommitted bytes) instead of passing for the shim's.
#
# Marker layout under $root/ops/<op>/ (directories 0700, files 0600):
#   claim     attempt, fingerprint, stdin digest, family, shim version, time, --become's
#             user (become=, - for none), foreground identity
#   proc      the supervisor's identity: pid, process start time, boot id
#   started   the start gate: the supervisor runs the command only if it creates it (an
#             exclusive create, see take_gate; a directory in markers of older shims)
#   cmd       the command text (run by the supervisor as the login shell's -c would run it)
#   stdin     the spooled stdin, out/err captured output (capped: the copy kept for
#             replay), *.dropped the count of bytes beyond the cap, *.s.<n> spill
#             segments beyond the cap, alive only until a following foreground sent them
#   exit      the exit record (temp file, fsync, rename)
#   cancelled the request of `opmark cancel` (the exit record then says cancelled=1)
#   exit_write_failed  the exit record could not be written (a full disk): interrupted
#   fenced    tombstone: this op id can never run
#   collected gc reduced the marker to a tombstone (collected_at): the claim with its exit
#             or fence record, no output; probe and claim still read completed/fenced
#   .out.raw .err.raw  with secrets, the FIFOs the command writes into while it runs,
#             read by the redactors (see redactor); removed when it ends
#   .w.<pid>.<start>  wake-up FIFOs of foregrounds following the marker (named by the
#             foreground's pid and start time, public anyway: never by anything secret)
#
# The fingerprint index under $root/fp/<fingerprint>/ (see repeat_check): one slot file per
# fresh claim of that intent, named by a 10-digit sequence number and made by an exclusive
# link, holding op=, claimed_at= and held=1 once its claim was refused as a repetition.
#
# Resource failures are evidence, not absence: every file a claim needs is made before the
# claim counts (a failure undoes it and names the cause: no_space, no_inodes,
# quota_exceeded), an exit record that cannot be written renames a file made in advance
# (a rename needs no free space) so the marker reads interrupted with the reason, and a
# supersede installs the new, complete claim before the old evidence moves aside.

# `set -- --library; . shim.sh` defines every function and does nothing: the shim's unit
# tests (tests/it/shim/functions.rs) call them one at a time. Only that first argument
# does it: a call's first argument is the script itself (a path or the text), and nothing
# in the environment can make a run stop short.
# A variable read before it is set is a mistake here, never a default: the shell says
# so and stops (the command always runs in a shell of its own, exec'd, without this).
set -u
# Read on paths that may not set them: a replay follows no live output, and the functions
# a test calls one at a time may look at the marker before one is named.
live=
m=
shim_library=
[ "${1:-}" = --library ] && shim_library=1
OPMARK_SHIM_VERSION=6
OPMARK_SHIM_SELF=$1
shift
# Run from the host's cache ($root/shim/<sha256>.sh, checked by the stub), $1 is that
# file: the supervisor starts from it too. Otherwise $1 is the text itself.
shim_file=
case $OPMARK_SHIM_SELF in
/*) shim_file=1 ;;
esac
call_token=
case ${1:-} in
c=*)
	call_token=${1#c=}
	shift
	;;
esac
case $call_token in
*[!0-9a-f]*) call_token= ;;
esac
# h=SHA256: the text came in the channel's data because the cache lacked it; keep it.
shim_hash=
case ${1:-} in
h=*)
	shim_hash=${1#h=}
	shift
	;;
esac
case $shim_hash in
*[!0-9a-f]*) shim_hash= ;;
esac
[ "${#shim_hash}" -eq 64 ] || shim_hash=
# r=ROOT_ID: the marker root id this operation's attempts reached (docs/guarantees.md#evidence-identity); setup_root
# refuses before acting when this root's id differs (or it has none).
expect_root=
case ${1:-} in
r=*)
	expect_root=${1#r=}
	shift
	;;
esac
case $expect_root in
*[!0-9a-f]*) expect_root=bad ;;
esac
# The login's umask and LC_ALL, as sshd and the login shell's startup files left them:
# the command gets them back (docs/host-protocol.md#the-commands-environment: it runs as `ssh HOST CMD` would), the shim's own
# records keep the strict ones set below. They reach the supervisor in its environment
# (OPMARK_LOGIN_UMASK; OPMARK_LOGIN_LC_ALL "-" when unset, "=VALUE" when set), which it
# removes before the command starts. The umask is read from /proc by a builtin (no
# process); `umask` answers where that line is missing. The supervisor, started under
# our strict settings, keeps what it was given (so does a resident's standby, see standby).
if [ "${1:-}" != supervise ] && [ "${1:-}" != standby ]; then
	OPMARK_LOGIN_UMASK='' lu_key=''
	{ read -r _ && read -r lu_key OPMARK_LOGIN_UMASK _; } 2>/dev/null </proc/$$/status
	[ "$lu_key" = Umask: ] || OPMARK_LOGIN_UMASK=$(umask)
	OPMARK_LOGIN_LC_ALL=-
	[ -n "${LC_ALL+set}" ] && OPMARK_LOGIN_LC_ALL="=$LC_ALL"
	export OPMARK_LOGIN_UMASK OPMARK_LOGIN_LC_ALL
fi
umask 077
LC_ALL=C
# The foreground's own pid: $$, except in a resident's request, which runs in a subshell
# and reads its own (see serve_one).
fg=$$
# Set in a resident (serve) to its own pid.
resident=
export LC_ALL
# The sub-shell used for the supervisor and the command; tests run other shells through it.
OPMARK_SHELL=${OPMARK_SH:-sh}
# Output beyond the cap reaches a following client through spill segments of SPILL_SEG
# bytes; at most SPILL_WINDOW of them wait to be streamed.
SPILL_SEG=1048576
SPILL_WINDOW=4
# Seconds a run's foreground waits for its supervisor's record before it takes the start
# gate itself (see supervisor_overdue); tests shorten it.
START_LIMIT=${OPMARK_START_LIMIT:-30}
case $START_LIMIT in
'' | *[!0-9]*) START_LIMIT=30 ;;
esac

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
	printf '%s\n' "$3" >"$dw_tmp" || return 1
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
# build; one that syncs `/` but not the files named has met a real error.)
sync() {
	if [ -z "${sync_plain:-}" ]; then
		command sync "$@" 2>/dev/null && return 0
		[ "$#" -gt 0 ] || return 1
		command sync / 2>/dev/null && return 1
		sync_plain=1
	fi
	command sync
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

# ---------------------------------------------------------------------------------------
# The detached supervisor

# supervise M TIMEOUT_S CAP CMD_BYTES ATTEMPT: the detached supervisor (own session,
# started by detach so signals are as under ssh). Runs the command in $M/cmd once and
# records its exit, if $M still holds the claim of ATTEMPT.
supervise() {
	m=$1 timeout=$2 cap=$3 cmd_bytes=${4:-} sv_attempt=${5:-}
	# `true` first: a failed redirection of `exec` would end the shell before it can
	# tell anyone (a full disk with no shim.log yet).
	true 2>>"${m%/ops/*}/shim.log" && exec 2>>"${m%/ops/*}/shim.log"
	clock=${m%/ops/*}/clock
	# Only our own attempt's claim (docs/host-protocol.md#the-supervisor): a supervisor that comes up late, after its
	# foreground set the claim aside (and a rerun may have claimed the op id again), finds
	# another claim at $m, or none, and leaves it alone. From the marker's directory every
	# step up to the start gate goes through "." (that directory, wherever a rename takes
	# it), so the gate can only be taken on the claim checked here.
	# The login directory (we were started in it), for the command: back there below.
	sv_login_dir=$PWD
	cd "$m" 2>/dev/null || exit 0
	rget claim attempt
	if [ -z "$sv_attempt" ] || [ "$rv" != "$sv_attempt" ]; then
		printf 'opmark-shim: %s: not the claim of attempt %s; left alone\n' "$m" "$sv_attempt" >&2
		exit 0
	fi
	# The fingerprint index's temp name our foreground linked its slot from (see
	# repeat_check), removed with our own leftovers at the end.
	sv_ixtmp='' sv_fp=''
	rget claim fingerprint && sv_fp=$rv && rget claim fg_pid && sv_fgp=$rv &&
		rget claim fg_start && sv_ixtmp=${m%/ops/*}/fp/$sv_fp/.t.$sv_fgp.$rv
	case $sv_fp in
	'' | *[!0-9a-f]*) sv_ixtmp= ;;
	esac
	proc_stat "$$"
	sv_start=$ps_start
	read_boot
	# We hold the FIFOs' write ends (6, 7) until the command holds its own, so that the
	# captures can open them at once and start (their processes, not their reading)
	# while the claim is made durable, which takes the disk's time rather than the
	# processor's; a capture that opened its FIFO before any writer would wait for the
	# command instead. (`command` keeps a failed open from ending the shell.)
	if ! [ -p .out.fifo ] || ! [ -p .err.fifo ] ||
		! { command exec 6<>.out.fifo 7<>.err.fifo; } 2>/dev/null; then
		start_failed
	fi
	unbuffered=
	command -v stdbuf >/dev/null 2>&1 && unbuffered=1
	capture out "$cap" <.out.fifo &
	cap_out=$!
	capture err "$cap" <.err.fifo &
	cap_err=$!
	# With secrets, the command writes into FIFOs of its own, read by a redactor each
	# that writes into the captures' (4 and 9 held here as 6 and 7 are, see above); the
	# redactors have the forms in their environment, the command none of them.
	sv_raw='' sv_o=6 sv_e=7
	if [ "${_OPMARK_RN:-0}" != 0 ]; then
		if ! { mkfifo .out.raw .err.raw && command exec 4<>.out.raw 9<>.err.raw; } 2>/dev/null; then
			start_failed
		fi
		redactor <.out.raw >&6 &
		redactor <.err.raw >&7 &
		sv_raw=1 sv_o=4 sv_e=9
		sv_i=1
		while [ "$sv_i" -le "$_OPMARK_RN" ]; do
			unset "_OPMARK_R_$sv_i" "_OPMARK_RL_$sv_i"
			sv_i=$((sv_i + 1))
		done
	fi
	unset _OPMARK_RN
	# The claim is durable before anything can run (the foreground wrote it and went on
	# to start us). Our record is complete before the start gate is taken, so whoever sees
	# the gate taken finds it whole; no fsync for it: after a crash the boot id changes
	# and it is moot anyway. If the marker was moved aside meanwhile, these fail and
	# nothing runs (the captures read EOF once we are gone).
	if ! sync claim . .. ||
		! printf 'pid=%s\nstart=%s\ncaptures=%s,%s\nboot=%s\n' "$$" "$sv_start" "$cap_out" "$cap_err" "$boot" >proc ||
		! take_gate .; then
		start_failed
	fi
	trap 'sv_term=1' TERM
	# Under heavy load supervisors were seen dying of a SIGPIPE they never wrote for
	# (always while the deadline killer swept the session). Caught, not ignored: the
	# command still gets the default disposition (a handler resets on exec).
	trap 'sv_pipe=1' PIPE HUP
	killer=
	if [ "$timeout" -gt 0 ]; then
		kill_after "$timeout" "$$" "$m" "$sv_start" "$cap_out,$cap_err" 4>&- 9>&- &
		killer=$!
	fi
	input=/dev/null
	[ -f "$m/stdin" ] && input="$m/stdin"
	# The command runs as sshd runs one (session.c: `execve(shell, [basename, "-c",
	# command])`): by the login shell, i.e. $SHELL as sshd set it from passwd (no process
	# to find it); where that is unset, not absolute or not executable (an sshd_config
	# SetEnv or a startup file changed it), by the passwd entry's shell as sshd itself
	# would (getent), and by /bin/sh where that is empty too, as sshd does for an empty
	# passwd field. In the login directory (where sshd started the login shell, or where
	# its startup files went: we never left it); with the login's environment, umask and
	# LC_ALL (taken at the top), none of our variables, and positional parameters, $0
	# and $SHELL as under ssh. All in a subshell that becomes the shell: the supervisor
	# keeps its strict umask and C locale for the exit record.
	sv_umask=${OPMARK_LOGIN_UMASK:-} sv_lc=${OPMARK_LOGIN_LC_ALL:--}
	sv_secrets=${OPMARK_SECRET_NAMES:-} sv_list=${OPMARK_SECRET_LIST:-}
	unset OPMARK_SH OPMARK_ROOT OPMARK_SHIM_SELF OPMARK_START_LIMIT OPMARK_LOGIN_UMASK OPMARK_LOGIN_LC_ALL OPMARK_SECRET_NAMES OPMARK_SECRET_LIST
	# --become: the user the claim says the command runs as (see run_become).
	sv_become=
	rget claim become && [ "$rv" != - ] && sv_become=$rv
	sv_shell=${SHELL:-}
	case $sv_shell in
	/*) [ -f "$sv_shell" ] && [ -x "$sv_shell" ] || sv_shell= ;;
	*) sv_shell= ;;
	esac
	if [ -z "$sv_shell" ]; then
		sv_shell=$(getent passwd "$(id -u)" 2>/dev/null)
		sv_shell=${sv_shell##*:}
		case $sv_shell in
		/*) [ -f "$sv_shell" ] && [ -x "$sv_shell" ] || sv_shell=/bin/sh ;;
		*) sv_shell=/bin/sh ;;
		esac
	fi
	sv_name=${sv_shell##*/}
	# Shells of the sh family (sh, bash, dash, zsh, ksh, mksh, yash, posh, busybox ash)
	# read the command from its file and eval it at the top level, as -c would run it:
	# whatever its size (an argument is capped at 128 KiB) and without showing it in
	# `ps`. A short command is read by the shell's own `read` (no cat), a long one by cat
	# (`read` takes a system call per byte); the two variables are unset, and the
	# positional parameters cleared, before the command's first word. Other shells (fish,
	# tcsh/csh, anything unknown) take `-c` their own way and get the command as sshd
	# gives it, as the argument: there it shows in `ps` and is limited to 128 KiB, as
	# under ssh.
	case $sv_name in
	*csh | *fish*) sv_posix= ;;
	*sh | *sh[0-9]* | *sh-* | busybox) sv_posix=1 ;;
	*) sv_posix= ;;
	esac
	sv_small=no
	is_uint "$cmd_bytes" && [ "$cmd_bytes" -le 4096 ] && sv_small=yes
	(
		cd "$sv_login_dir" 2>/dev/null || cd "${HOME:-/}" 2>/dev/null || cd /
		case $sv_umask in
		'' | *[!0-7]*) ;;
		*) umask "$sv_umask" ;;
		esac
		case $sv_lc in
		=*)
			LC_ALL=${sv_lc#=}
			export LC_ALL
			;;
		*) unset LC_ALL ;;
		esac
		[ -z "$sv_become" ] || run_become
		# Each secret under its own name (checked by read_secrets: a name, nothing else).
		for sv_n in $sv_secrets; do
			eval "$sv_n=\${_OPMARK_S_$sv_n}"
			unset "_OPMARK_S_$sv_n"
			export "${sv_n?}"
		done
		if [ -z "$sv_posix" ]; then
			sv_text=$(cat -- "$m/cmd") || exit 126
			# Its $0 is its argv[0], which sshd makes the shell's base name: exec'd by
			# that name when PATH finds this very shell (no other way in sh, and PATH
			# must stay the login's), else by its path.
			sv_found=$(command -v "$sv_name" 2>/dev/null)
			# -ef (one file under two paths: /bin and /usr/bin merged) is in dash, bash,
			# busybox; a test without it fails, which only costs the base name.
			# shellcheck disable=SC3013
			if [ "$sv_found" = "$sv_shell" ] || [ "$sv_found" -ef "$sv_shell" ]; then
				exec "$sv_name" -c "$sv_text"
			fi
			exec "$sv_shell" -c "$sv_text"
		fi
		# shellcheck disable=SC2016 # expanded by the command's shell, not here
		exec "$sv_shell" -c 'if [ "$2" = yes ]; then
_om_c= _om_l=
while IFS= read -r _om_l; do _om_c="$_om_c$_om_l
"; done <"$1" || exit 126
_om_c=$_om_c$_om_l
else _om_c=$(cat -- "$1") || exit 126; fi
eval "unset _om_c _om_l; set --; $_om_c
"' "$sv_name" "$m/cmd" "$sv_small"
	) <"$input" >&"$sv_o" 2>&"$sv_e" 6>&- 7>&- 4>&- 9>&-
	code=$?
	# The redactors' last newline (see redactor), and their end once nothing else writes.
	if [ -n "$sv_raw" ]; then
		printf '\n' >&4
		printf '\n' >&9
		exec 4>&- 9>&-
		rm -f .out.raw .err.raw
	fi
	# Whether a cancel's signal was on its way before the command ended (docs/host-protocol.md#cancel).
	sv_signalled=
	[ -f "$m/signalled" ] && sv_signalled=1
	exec 6>&- 7>&-
	# Settle the deadline killer before writing anything: asleep, TERM ends it; already
	# sweeping (it ignores TERM then), let it finish, so that its sweep can neither be
	# cut short (leaving the command's children alive) nor hit our own helpers.
	if [ -n "$killer" ]; then
		kill -TERM "$killer" 2>/dev/null
		while kill -0 "$killer" 2>/dev/null; do
			wait "$killer"
		done
	fi
	# The captures end when every writer of the FIFOs has closed them (the command and
	# anything it left running with its output), as with ssh itself. A trapped TERM
	# interrupts `wait`, hence the loop.
	for cp in "$cap_out" "$cap_err"; do
		while kill -0 "$cp" 2>/dev/null; do
			wait "$cp"
		done
	done
	timed_out=0
	[ -f "$m/timed_out" ] && timed_out=1
	# Stopped by a cancel only when its signal went out before the command ended and the
	# command died of it (TERM, or KILL after the grace); one that ended by itself while
	# the cancel was pending keeps its own status, marked cancel_pending=1 (docs/host-protocol.md#cancel).
	cancelled=0 cancel_pending=0
	if [ -f "$m/cancelled" ]; then
		if [ -n "$sv_signalled" ] && { [ "$code" = 143 ] || [ "$code" = 137 ]; }; then
			cancelled=1
		else
			cancel_pending=1
		fi
	fi
	now
	record="code=$code
timed_out=$timed_out
ended_at=$now
cancel_pending=$cancel_pending
cancelled=$cancelled"
	# Temp file, rename, sync (docs/host-protocol.md#the-claim: the exit record is never seen torn, even by a
	# reader that does not check for its last line). A second try covers a helper (sync,
	# mv) lost to a signal sweep under heavy load.
	if ! durable_write "$m" exit "$record" && ! durable_write "$m" exit "$record"; then
		# A full disk: renaming the file made before the claim counted needs no space, so
		# the marker says interrupted and why, instead of looking like a lost process.
		mv -f "$m/.noexit" "$m/exit_write_failed" && sync "$m"
		printf 'opmark-shim: %s: exit record (code=%s) could not be written\n' "$m" "$code" >&2
		rm -f "$m/.exit.tmp.$$"
	fi
	for w in "$m"/.w.*; do
		[ -p "$w" ] && printf 'x\n' 1<>"$w"
	done
	# Spill segments nobody is left to stream (never part of the kept copy); a live
	# follower removes what it streamed itself.
	if ! followed; then
		for sp in "$m"/out.s.* "$m"/err.s.*; do
			[ -e "$sp" ] && rm -f "$sp"
		done
	fi
	# Off the waiters' path: they are awake already.
	rm -f "$m/.out.fifo" "$m/.err.fifo" "$m"/.w.* "$m/.noexit" ${sv_ixtmp:+"$sv_ixtmp"}
}

# start_failed: the supervisor gives up before the start gate, so nothing ran: it tells
# the waiting foreground, which answers for it, instead of leaving it waiting for an exit.
# (Run in the marker's directory: its own claim's waiters, wherever it was moved.)
start_failed() {
	# The cause is read now, while the disk is as it was: once we are gone, another
	# process's tidy-up may free what the foreground would find missing.
	root=${m%/ops/*}
	resource_cause
	for w in .w.*; do
		[ -p "$w" ] && printf 'f %s\n' "$cause" 1<>"$w"
	done
	exit 1
}

# resource_cause [MESSAGE]: sets cause to why a write under the marker root failed:
# no_inodes, no_space, quota_exceeded, or write_failed when none of these can be seen.
# MESSAGE: what the failed write said, when it was kept (the disk may have changed since).
# Above the supervisor's end of reading (see standby): start_failed needs it there.
resource_cause() {
	cause=write_failed rc_err=${1:-}
	# shellcheck disable=SC2046 # df's words: filesystem, total, used, free, ...
	set -- $(df -Pi "$root" 2>/dev/null | tail -n 1)
	# Fewer free inodes than a claim and its records take (about 14): the write ran out
	# of them, even when a moment's temp file (another call's, freed since) left some.
	is_uint "${4:-x}" && [ "$4" -lt 16 ] && cause=no_inodes && return 0
	case $rc_err in
	*[Qq]uota*) cause=quota_exceeded && return 0 ;;
	*"No space"*) cause=no_space && return 0 ;;
	esac
	# shellcheck disable=SC2046
	set -- $(df -Pk "$root" 2>/dev/null | tail -n 1)
	# A few KiB may still show free while every block a new file needs is taken.
	is_uint "${4:-x}" && [ "$4" -lt 16 ] && cause=no_space && return 0
	rc_msg=$( (true >"$root/spool/.probe.$$") 2>&1)
	rm -f "$root/spool/.probe.$$"
	case $rc_msg in
	*[Qq]uota*) cause=quota_exceeded ;;
	*"No space"*) cause=no_space ;;
	esac
	return 0
}

# capture FILE CAP: keeps the first CAP bytes in FILE (the copy kept for replay). Beyond
# them, while a foreground follows, spills to segments FILE.s.<n> that the follower
# streams and removes (when SPILL_WINDOW wait, the command waits too, as with a slow ssh
# client); with nobody following, counts and drops. Always drains, so the command never
# blocks for good nor dies of SIGPIPE. FILE.dropped: every byte beyond the cap.
capture() {
	# Not a writer of any capture's FIFO (the supervisor's 6 and 7): each must end when
	# the command's side closes. (Closed by exec: a redirection on the call would only
	# move them aside for the call's duration.)
	exec 6>&- 7>&-
	# A cancel or deadline TERMs the session's processes: the capture must outlive the
	# command, or a command that ignores TERM would die of SIGPIPE at its next write
	# instead of being killed after the grace. (KILL still ends a capture left behind.)
	trap '' TERM
	capped_head "$2" >"$1"
	# Nothing kept under a cap above 0: the stream ended empty (no wc for that).
	[ "$2" -gt 0 ] && ! [ -s "$1" ] && return 0
	# One wc, as counting the rest always cost: a short copy means the stream ended.
	c_kept=$(wc -c <"$1")
	[ "$((c_kept + 0))" -lt "$2" ] && return 0
	c_n=0 c_beyond=0 c_ended=
	while followed; do
		c_seg="$1.s.$c_n"
		c_ok=1
		capped_head "$SPILL_SEG" >"$c_seg" || c_ok=
		# Gone already: a follower streamed it, which it does only with a full segment.
		c_size=$(wc -c <"$c_seg" 2>/dev/null) || c_size=$SPILL_SEG
		c_size=$((c_size + 0))
		# A segment that cannot be written (a full disk): what it took is counted, the
		# rest is counted and dropped below.
		[ -n "$c_ok" ] || {
			c_beyond=$((c_beyond + c_size))
			break
		}
		c_beyond=$((c_beyond + c_size))
		if [ "$c_size" -lt "$SPILL_SEG" ]; then
			c_ended=1
			[ "$c_size" -gt 0 ] || rm -f "$c_seg"
			break
		fi
		c_n=$((c_n + 1))
		while [ -e "$1.s.$((c_n - SPILL_WINDOW))" ] && followed; do
			sleep 0.05
		done
	done
	if [ -z "$c_ended" ]; then
		# Count and drop the rest (binary-safe, so wc rather than read).
		c_rest=$(wc -c)
		c_beyond=$((c_beyond + c_rest))
	fi
	[ "$c_beyond" -gt 0 ] && printf '%s\n' "$c_beyond" >"$1.dropped"
	return 0
}

# capped_head N: copies N bytes of stdin (fewer at its end) to stdout, a file opened
# fresh, as they come.
capped_head() {
	# head -c counts bytes exactly but holds a stdio buffer when writing to a file, which
	# would hide live output until the end: unbuffer it where coreutils' stdbuf exists.
	# (dd count_bytes is no substitute: it counts a short pipe read as a whole block.)
	if [ -n "$unbuffered" ]; then
		# A standby learnt what stdbuf puts in head's environment (see standby): head
		# alone with it, one exec fewer.
		if [ -n "${sb_preload:-}" ]; then
			LD_PRELOAD=$sb_preload _STDBUF_O=0 "$sb_head" -c "$1"
		else
			stdbuf -o0 head -c "$1"
		fi
		return
	fi
	# No stdbuf (a busybox userland): one dd per read of the FIFO, each writing at once
	# what that one read(2) returned (at most 64 KiB, a pipe's capacity), while the count
	# is the file's offset, read by a builtin from /proc/self/fdinfo/1 (this shell's
	# stdout, shared with the dd it started): exact, never past N, nothing held back. A
	# busy writer fills the pipe meanwhile, so the reads grow with the rate.
	ch_pos=0
	while [ "$ch_pos" -lt "$1" ]; do
		ch_bs=$(($1 - ch_pos))
		[ "$ch_bs" -le 65536 ] || ch_bs=65536
		dd bs="$ch_bs" count=1 2>/dev/null || return 1
		ch_key='' ch_at=''
		{ read -r ch_key ch_at _; } 2>/dev/null </proc/self/fdinfo/1
		[ "$ch_key" = pos: ] && is_uint "$ch_at" || return 1
		# Nothing read: the stream ended.
		[ "$ch_at" -gt "$ch_pos" ] || return 0
		ch_pos=$ch_at
	done
}

# followed: a live foreground follows this marker (a wake-up FIFO named by the pid and
# start time of a process that still exists).
followed() {
	for fw in "$m"/.w.*; do
		fw_id=${fw##*/.w.}
		[ -p "$fw" ] && alive "${fw_id%.*}" "${fw_id#*.}" && return 0
	done
	return 1
}

# kill_after SECONDS SID M START CAPTURES: at the deadline, TERM everything of the
# supervisor's session but the supervisor, this killer and the captures (CAPTURES: their
# pids, see signal_session), then KILL what is left after a grace period. The
# supervisor is never signalled, so it always lives to write the exit record. (Sending
# TERM to the whole process group lost a supervisor now and then under heavy load.)
kill_after() {
	exec 6>&- 7>&-
	sleep "$1" &
	ka_sleep=$!
	trap 'kill "$ka_sleep" 2>/dev/null; exit 0' TERM
	wait "$ka_sleep"
	trap '' TERM
	# A cancel is already stopping the command: it is not a timeout.
	[ -f "$3/cancelled" ] && exit 0
	true >"$3/timed_out"
	# shellcheck disable=SC2016 # $PPID belongs to the child shell: it names this process
	me=$(exec "$OPMARK_SHELL" -c 'echo "$PPID"')
	signal_session TERM "$2" "$me" "$4" "$5"
	sleep 2
	signal_session KILL "$2" "$me" "$4" "$5"
}

# signal_session SIG SID SPARE START [CAPTURES]: sends SIG to every live process of
# session SID except its leader (the supervisor, started at START), SPARE and the
# captures (CAPTURES: their pids, comma-separated, and so the helpers they run: their
# children and grandchildren); never to a process that started before the supervisor, and
# to nothing when SID now names a process with another start time (the session is gone
# and its id reused: docs/host-protocol.md#liveness). Builtins only, so nothing it starts is hit. A capture killed
# would lose what it read and not yet wrote, output the caller is owed; it ends by itself
# once the command's last writer is gone.
signal_session() {
	if [ -n "$4" ] && proc_stat "$2" && [ "$ps_start" != "$4" ]; then
		return 0
	fi
	ss_caps=,${5:-},
	for ka in /proc/[0-9]*/stat; do
		ka_pid=${ka#/proc/}
		ka_pid=${ka_pid%/stat}
		[ "$ka_pid" = "$2" ] || [ "$ka_pid" = "$3" ] && continue
		proc_stat "$ka_pid" || continue
		[ "$ps_session" = "$2" ] || continue
		[ "$ps_state" != Z ] || continue
		older_than "$ps_start" "$4" && continue
		if [ "$ss_caps" != ,, ]; then
			case $ss_caps in *",$ka_pid,"* | *",$ps_ppid,"*) continue ;; esac
			proc_stat "$ps_ppid" && case $ss_caps in *",$ps_ppid,"*) continue ;; esac
		fi
		kill -"$1" "$ka_pid" 2>/dev/null
	done
}

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
	if [ -n "${_OPMARK_PW:-}" ]; then
		SUDO_ASKPASS=${m%/ops/*}/askpass
		export SUDO_ASKPASS _OPMARK_PW
	fi
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

# The supervisor needs nothing below: it stops reading the script here (dash reads a
# script one command at a time), so only the foreground pays for parsing the rest.
# standby FIFO [PRELOAD HEAD]: a supervisor started by a resident before its command is
# known (see keep_standby), so that a request's foreground starts none: started as
# detach starts one (a session of its own, signals as under ssh, no descriptor of the
# channel; PRELOAD and HEAD from find_preload), with
# the resident's FIFO as its stdin, it says it is ready in FIFO.pid ("pid start", its own
# identity), then reads one line, "TIMEOUT_S CAP CMD_BYTES ATTEMPT M" (the arguments
# detach would give supervise), says the line is taken ("used" in FIFO.pid) and becomes
# that command's supervisor, with supervise's own checks (only the claim of ATTEMPT, the
# start gate). A line that is not one is skipped (a foreground writes a newline first, so
# a torn line never joins the next); EOF, the resident and every writer gone, ends it.
standby() {
	sb_fifo=$1
	proc_stat "$$" || exit 0
	# How its captures start head (see find_preload), as its resident found out once.
	sb_preload=${2:-} sb_head=${3:-}
	case $sb_head in
	/*) [ -f "$sb_head" ] && [ -x "$sb_head" ] || sb_preload= ;;
	*) sb_preload= ;;
	esac
	printf '%s %s\n' "$$" "$ps_start" >"$sb_fifo.pid" 2>/dev/null || exit 0
	while :; do
		sb_t='' sb_c='' sb_b='' sb_a='' sb_m=''
		read -r sb_t sb_c sb_b sb_a sb_m || exit 0
		if ! is_uint "$sb_t" || ! is_uint "$sb_c" || ! is_uint "$sb_b" || ! valid_id "$sb_a"; then
			continue
		fi
		case $sb_m in
		/*/ops/*) valid_id "${sb_m##*/}" && break ;;
		esac
	done
	printf 'used\n' >"$sb_fifo.pid" 2>/dev/null
	exec </dev/null
	supervise "$sb_m" "$sb_t" "$sb_c" "$sb_b" "$sb_a"
}

if [ "${1:-}" = supervise ]; then
	shift
	supervise "$@"
	exit 0
fi
if [ "${1:-}" = standby ]; then
	shift
	standby "$@"
	exit 0
fi

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
	[ -n "${spool:-}" ] && rm -f "$spool"
}

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
	# Another first call may link the id in between our read and the -e test: then read
	# again rather than take its absence for an unreadable id.
	if [ -z "$rid" ] && [ -e "$root/root_id" ]; then
		read -r rid 2>/dev/null <"$root/root_id"
	fi
	if [ -z "$rid" ] && ! [ -e "$root/root_id" ] && [ -z "$expect_root" ]; then
		ri_nonce=$nonce
		new_nonce || refuse "root_unusable reason=no_random"
		rid=$nonce nonce=$ri_nonce
		ri_tmp=$root/.root_id.$$
		if ! printf '%s\n' "$rid" >"$ri_tmp" || ! sync "$ri_tmp"; then
			rm -f "$ri_tmp"
			resource_cause
			refuse "root_unusable reason=$cause"
		fi
		ln "$ri_tmp" "$root/root_id" 2>/dev/null
		rm -f "$ri_tmp"
		rid=
		read -r rid 2>/dev/null <"$root/root_id"
		sync "$root"
	fi
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

# ---------------------------------------------------------------------------------------
# Streaming: copy what the command wrote since offsets oo/eo, and wait for more without
# polling for the end: the supervisor writes to our wake-up FIFO when the exit record is
# down; a timer only paces live output and the check that the process still exists.

emit() {
	sizes
	emit_stream "$m/out" O "$oo" "$so"
	oo=$es_pos
	emit_stream "$m/err" E "$eo" "$se"
	eo=$es_pos
}

# emit_stream FILE KIND POS KEPT: sends what FILE (the kept copy, KEPT bytes so far) holds
# beyond stream position POS and, for a live follower, what the spill segments hold past
# the cap; sets es_pos to the position reached. A segment sent completely is removed, which
# lets the capture go on; a missing one ends this follower's stream there (another follower
# took it, or it was dropped while nobody followed): the trailer then says truncated.
emit_stream() {
	es_pos=$3
	if [ "$4" -gt "$es_pos" ]; then
		payload "$2" "$1" "$es_pos" "$(($4 - es_pos))"
		es_pos=$4
	fi
	[ -n "$live" ] && [ "$es_pos" -ge "$cap" ] || return 0
	while :; do
		es_seg="$1.s.$(((es_pos - cap) / SPILL_SEG))"
		es_off=$(((es_pos - cap) % SPILL_SEG))
		[ -f "$es_seg" ] || return 0
		es_size=$(wc -c <"$es_seg")
		if [ "$es_size" -gt "$es_off" ]; then
			payload "$2" "$es_seg" "$es_off" "$((es_size - es_off))"
			es_pos=$((es_pos + es_size - es_off))
		fi
		# Still being written: come back at the next wake-up.
		[ "$es_size" -ge "$SPILL_SEG" ] || return 0
		rm -f "$es_seg"
		emitted=1
	done
}

# payload KIND FILE OFFSET LEN: one committed output frame. The commit frame after each
# payload lets the client check that the bytes it counted were ours (bytes slipped in by
# another process make the next line fail the nonce).
payload() {
	frame "$1 $4"
	tail -c +"$(($3 + 1))" "$2" | head -c "$4" >&3
	frame C
	emitted=1
}

trailer() {
	t_out=0 t_err=0
	[ -f "$m/out.dropped" ] && read -r t_out <"$m/out.dropped"
	[ -f "$m/err.dropped" ] && read -r t_err <"$m/err.dropped"
	rget "$m/exit" code
	t=$rv
	rget "$m/exit" timed_out
	t="$t out=$oo err=$eo kept_out=$so kept_err=$se timed_out=$rv dropped_out=$t_out dropped_err=$t_err"
	rget "$m/claim" attempt
	t="$t attempt=$rv"
	[ -f "$m/collected" ] && t="$t output_collected=1"
	rget "$m/exit" cancelled && [ "$rv" = 1 ] && t="$t cancelled=1"
	frame "X code=$t"
}

# register_waiter DIR [MORE_FIFOS...]: a wake-up FIFO for this foreground in marker DIR
# (and, for run, the supervisor's capture FIFOs in the same mkfifo call). Named by our
# pid and start time ($fg_start): the name is visible to every process of the user, and
# tells the capture that a live foreground follows.
register_waiter() {
	wf="$1/.w.$fg.$fg_start"
	shift
	mkfifo "$wf" "$@" && exec 5<>"$wf"
}

# follow M OUT_OFFSET ERR_OFFSET: stream until the exit record exists (trailer X) or the
# process is gone without one (frame I).
follow() {
	m=$1 oo=$2 eo=$3 fresh=${4:-}
	iv=0.05
	while :; do
		emitted=
		if [ -n "$fresh" ]; then
			# Just started: nothing to copy or check yet; go straight to waiting.
			fresh=
			wait_wake
			continue
		fi
		emit
		if exited; then
			emit
			trailer
			# The spill segments a live follower streamed last (a short one at the end).
			if [ -n "$live" ] && { [ "$oo" -gt "$cap" ] || [ "$eo" -gt "$cap" ]; }; then
				rm -f "$m"/out.s.* "$m"/err.s.*
			fi
			break
		fi
		state "${m##*/}"
		if [ "$why" = starting ] && [ -n "${own_claim:-}" ]; then
			supervisor_overdue
		fi
		if [ "$st" != running ]; then
			exited && continue
			frame "I $(describe)"
			break
		fi
		if [ -n "$emitted" ]; then
			iv=0.05
		else
			case $iv in
			0.05) iv=0.1 ;;
			0.1) iv=0.2 ;;
			*) iv=0.5 ;;
			esac
		fi
		wait_wake
	done
}

# supervisor_overdue: our own claim still has no supervisor record. A supervisor that
# never came up (its shell missing, killed before its record: detach cannot tell)
# would leave us, and the client, waiting for good. After START_LIMIT seconds we take the
# start gate ourselves, so that it can never start, set the claim aside and answer that
# nothing ran. (A supervisor that took the gate first is running: we keep waiting.)
supervisor_overdue() {
	now
	so_since=${so_since:-$now}
	[ "$((now - so_since))" -ge "$START_LIMIT" ] || return 0
	take_gate "$m" || return 0
	kill "$timer" 2>/dev/null
	rm -f "$wf"
	mv -f "$m" "$root/superseded/$op.$now.$attempt.failed-start"
	sync "$root/ops" "$root/superseded"
	refuse "cannot_start reason=supervisor_lost"
}

# wait_wake: blocks until the supervisor writes "x" (exit record down) or a timer of
# $iv seconds writes "t" (time to copy live output and check the process).
wait_wake() {
	# Without the channel's descriptors: a timer outliving us (a kill ends this subshell,
	# not its sleep) must not hold the channel open.
	(
		exec </dev/null 3>&-
		sleep "$iv"
		printf 't\n' >&5
	) &
	timer=$!
	wake='' wake_cause=''
	read -r wake wake_cause <&5
	case $iv in
	0.05) beat 5 ;;
	0.1) beat 10 ;;
	0.2) beat 20 ;;
	*) beat 50 ;;
	esac
	[ "$wake" = x ] && kill "$timer" 2>/dev/null
	[ "$wake" = f ] && never_started
	return 0
}

# never_started: our supervisor gave up before the start gate (a full disk), so nothing
# ran. A claim made fresh is taken back, as when it could not be written; one that
# replaced an interrupted claim stays (reading interrupted), since the old evidence moved.
never_started() {
	kill "$timer" 2>/dev/null
	# What the supervisor saw when it gave up; else what the disk shows now.
	case $wake_cause in
	no_inodes | no_space | quota_exceeded) cause=$wake_cause ;;
	*) resource_cause ;;
	esac
	if [ -z "${superseded:-}" ] && ! [ -e "$m/started" ]; then
		rm -rf "$m"
		sync "$root/ops"
	fi
	refuse "root_unusable reason=$cause"
}

# ---------------------------------------------------------------------------------------
# Verbs

# run OP ATTEMPT FP FAMILY TIMEOUT_S CAP_BYTES STDIN_BYTES|- STDIN_SHA256|- SUPERSEDE
#     REPEAT_S REPEAT_ACTION DECLARED|- SECRETS|- BECOME|- CMD_BYTES; the channel's data
#     holds the secrets block (see read_secrets), the command (CMD_BYTES), then the stdin.
#     BECOME: the user the command runs as through sudo (see become_check).
verb_run() {
	[ "$#" -eq 15 ] || refuse "bad_args reason=argument_count"
	op=$1 attempt=$2 fp=$3 family=$4 timeout=$5 cap=$6 in_bytes=$7 in_sum=$8 sup=$9
	shift 9
	rp_window=$1 rp_action=$2 rp_declared=$3 secrets=$4 become=$5 cmd_bytes=$6
	spool='' cmd_spool='' cmd_text=''
	# The secrets come first in the data: read before anything else (a resident that
	# refuses here ends, as the data was not read).
	[ -n "$resident" ] && sv_owed=1
	read_secrets "$secrets" || refuse "bad_args reason=secrets"
	if [ -n "$resident" ]; then
		# A resident's request: the data follows the request line and the next request
		# follows the data, so it is read by count, never to EOF. A short command alone
		# is read at once, before any check can refuse, so that a refusal leaves the
		# resident in step; otherwise a refusal before the data is read ends it.
		sv_owed=1
		if [ "$in_bytes" = - ] && is_uint "$cmd_bytes" && [ "$cmd_bytes" -gt 0 ] &&
			[ "$cmd_bytes" -le 4096 ]; then
			read_resident_command || refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=${#cmd_text}"
			sv_owed='' cmd_read=1
		fi
		# Started from the host's cached script, a resident detaches its supervisors
		# from that file: gone (a wiped marker root, gc of another version's cache), it
		# claims nothing and ends, and the client calls per call, which brings the
		# script again.
		if [ -n "$shim_file" ] && ! [ -f "$OPMARK_SHIM_SELF" ]; then
			sv_owed=1
			refuse "cannot_start reason=resident_stale"
		fi
	fi
	is_uint "$rp_window" || refuse "bad_args reason=repeat_window"
	case $become in
	-) become= ;;
	'' | -* | *[!A-Za-z0-9._-]*) refuse "bad_args reason=become" ;;
	esac
	# sudo's password is for sudo only (see read_secrets), never without --become.
	[ -z "$sc_pw" ] || [ -n "$become" ] || refuse "bad_args reason=secrets"
	case $rp_action in
	allow | warn | block) ;;
	*) refuse "bad_args reason=repeat_action" ;;
	esac
	case $rp_declared in
	-) rp_declared= ;;
	*[!A-Za-z0-9._:,-]*) refuse "bad_args reason=declared" ;;
	esac
	valid_id "$op" || refuse "invalid_op_id"
	valid_id "$attempt" || refuse "bad_args reason=attempt_id"
	case $fp in
	*[!0-9a-f]*) refuse "bad_args reason=fingerprint" ;;
	esac
	[ "${#fp}" -eq 64 ] || refuse "bad_args reason=fingerprint"
	# The stdin digest ("-": no stdin) is kept in the claim, so that a conflict can say
	# whether the command or the stdin differs; it goes into frames, so it is checked.
	case $in_sum in
	-) ;;
	*[!0-9a-f]*) refuse "bad_args reason=stdin_digest" ;;
	*) [ "${#in_sum}" -eq 64 ] || refuse "bad_args reason=stdin_digest" ;;
	esac
	case $family in
	read-only | convergent | append-only | destructive) ;;
	*) refuse "bad_args reason=family" ;;
	esac
	if ! is_uint "$timeout" || ! is_uint "$cap"; then
		refuse "bad_args reason=timeout_or_cap"
	fi
	if ! is_uint "$cmd_bytes" || [ "$cmd_bytes" -eq 0 ]; then
		refuse "bad_args reason=command_bytes"
	fi
	# A resident found its setsid once (see verb_serve): the PATH is the same per request.
	if [ -z "$resident" ] || [ -z "${setsid_bin:-}" ]; then
		find_setsid || refuse "cannot_start reason=no_setsid"
	fi
	# A claim whose process could not be told alive from gone would read running for good
	# or, worse, gone while it runs: refuse before anything is claimed.
	identity_readable || refuse "cannot_start reason=no_process_identity"
	# Output that may hold a secret is kept only through the redactor (see redactor).
	if [ "$sc_rn" -gt 0 ] && ! command -v awk >/dev/null 2>&1; then
		refuse "cannot_start reason=no_awk"
	fi
	setup_root
	[ -z "$become" ] || become_check

	# Receive the command, then stdin, into unclaimed spool files first: a connection
	# lost halfway must not leave a claim whose command is cut short or would read half
	# an input. dd with count_bytes,fullblock reads exactly CMD_BYTES and never past them
	# (busybox `head -c` reads ahead into the stdin that follows).
	if [ -n "${cmd_read:-}" ]; then
		:
	elif [ -n "$resident" ]; then
		spool_command
		# The newline the client puts after the command (see read_resident_command).
		sv_nl=x
		IFS= read -r sv_nl
		[ -z "$sv_nl" ] || refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=more"
	elif [ "$in_bytes" = - ] && [ "$cmd_bytes" -le 4096 ]; then
		# A short command and nothing after it but EOF: read by the shell's own `read`
		# (a system call per byte, nothing to start) and kept in memory until the claim.
		read_short_command || refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=${#cmd_text}"
	else
		spool_command
	fi
	if [ "$in_bytes" != - ]; then
		is_uint "$in_bytes" || refuse "bad_args reason=stdin_bytes"
		spool="$root/spool/$attempt.$$"
		if [ -n "$resident" ]; then
			# Exactly its size: the next request follows.
			dd of="$spool" bs=65536 count="$in_bytes" iflag=count_bytes,fullblock 2>/dev/null
		else
			cat >"$spool"
		fi
		# shellcheck disable=SC2181 # the status of whichever read ran
		if [ "$?" -ne 0 ]; then
			resource_cause
			[ "$cause" = write_failed ] && refuse "bad_stdin reason=read_failed"
			refuse "root_unusable reason=$cause"
		fi
		got=$(wc -c <"$spool")
		if [ "$((got + 0))" -ne "$in_bytes" ]; then
			rm -f "$spool"
			refuse "bad_stdin reason=size_mismatch expected=$in_bytes got=$((got + 0))"
		fi
		if command -v sha256sum >/dev/null 2>&1; then
			got=$(sha256sum <"$spool")
			if [ "${got%% *}" != "$in_sum" ]; then
				rm -f "$spool"
				refuse "bad_stdin reason=digest_mismatch"
			fi
		fi
	fi

	sv_owed=
	m="$root/ops/$op"
	# Our own start time, read by identity_readable above (the foreground does not
	# change identity between the two).
	fg_start=$id_start
	read_boot
	now
	claim_rec="cap=$cap
attempt=$attempt
fingerprint=$fp
stdin_sum=$in_sum
family=$family
shim=$OPMARK_SHIM_VERSION
claimed_at=$now
become=${become:--}
fg_pid=$fg
fg_start=$fg_start
boot=$boot"
	# A fresh claim of this intent is indexed first, and held back when it repeats a
	# recent claim under another op id (a claim of an op id already taken is answered
	# from its marker below, as before).
	[ -d "$m" ] || repeat_check
	# A marker found taken can be gone a moment later: a supersede swaps an interrupted
	# claim for its own through two renames, a claim that could not start is taken back.
	# Its name is free then, so the claim is tried again (a few times: nothing else
	# removes a marker that quickly), never answered as absent or as an unusable root.
	cl_try=0
	while :; do
		cl_try=$((cl_try + 1))
		# mkdir's message kept: by the time resource_cause looks, another process may
		# have freed the inode this mkdir found missing.
		if mk_err=$(mkdir "$m" 2>&1); then
			if ! prepare_marker "$m"; then
				# Nothing can have started: take the claim back, so that no empty or
				# half-written marker reads as running or interrupted later.
				resource_cause
				rm -rf "$m"
				sync "$root/ops"
				refuse "root_unusable reason=$cause"
			fi
			break
		elif [ -d "$m" ]; then
			# Returns 0 only after an interrupted claim was replaced by ours, 1 when the
			# marker was gone by the time its state was read.
			answer_taken_claim && break
			[ "$cl_try" -lt 5 ] || refuse "absent $(describe)"
		elif [ "$cl_try" -ge 5 ]; then
			# Neither made nor taken: the marker root cannot hold a new directory.
			resource_cause "$mk_err"
			refuse "root_unusable reason=$cause"
		fi
	done
	# prepare_marker moved the command into the claim.
	cmd_spool=
	[ -n "$spool" ] && mv -f "$spool" "$m/stdin"
	# A standby supervisor started long ago has no way to the secrets: a run with any
	# starts its own, which takes them from its environment (see with_secrets).
	if ! { [ -z "$sc_names" ] && [ "$sc_rn" -eq 0 ] && [ -z "$become" ] && hand_off "$m"; } &&
		! with_secrets detach "$OPMARK_SHELL" supervise "$m" "$timeout" "$cap" "$cmd_bytes" "$attempt"; then
		# Nothing can have run: the supervisor never passed the start gate. Take the gate
		# so a late supervisor cannot start either. A fresh claim is then taken back, as
		# nothing ran and nothing can (a leftover would only wait for gc); one that
		# replaced an interrupted claim stays, reading interrupted, since the old
		# evidence moved aside under it.
		take_gate "$m"
		if [ -z "${superseded:-}" ]; then
			rm -rf "$m"
			sync "$root/ops"
		fi
		refuse "cannot_start reason=setsid_failed"
	fi
	frame "S attempt=$attempt"
	live=1 own_claim=1
	follow "$m" 0 0 fresh
}

# repeat_check: the fingerprint index (docs/host-protocol.md#the-fingerprint-index).
# Every fresh claim takes the next slot of $root/fp/$fp by an exclusive create (a hard
# link of a complete record: link(2) fails when the name exists, so of two claimers of
# one slot exactly one wins and the other takes the next), unless its op id has a slot in
# the window already. The slots before ours are the claims of this intent made before
# ours, so two racing claims of one intent under two op ids are ordered, and the later
# one sees the earlier. Walking back from ours while slots are within REPEAT_S seconds,
# the first slot of another op id that may have run (and is not declared) is the
# repetition: `block` refuses "repeats earlier=OP earlier_state=ST earlier_at=T" and
# marks our slot held=1 (a held slot never counts); `warn` says so in a W frame with the
# same fields and goes on; `allow` goes on. Costs one glob and one link (the temp name is
# removed later, off the claim's path).
repeat_check() {
	ix=$root/fp/$fp
	[ -d "$ix" ] || mkdir -p "$ix" 2>/dev/null || return 0
	repeat_find
	if [ -z "$rc_own" ]; then
		rc_n=$((rc_last + 1))
		# Named by our pid and start time, made exclusively (noclobber: O_EXCL): a leftover
		# of that name (a killed claimer, another boot) may still be a slot's other name,
		# so it is removed, never written through.
		rc_tmp=$ix/.t.$fg.$fg_start
		set -C
		if ! { printf 'op=%s\nclaimed_at=%s\n' "$op" "$now" >"$rc_tmp"; } 2>/dev/null &&
			! { [ -e "$rc_tmp" ] && rm -f "$rc_tmp" &&
				{ printf 'op=%s\nclaimed_at=%s\n' "$op" "$now" >"$rc_tmp"; } 2>/dev/null; }; then
			set +C
			return 0
		fi
		set +C
		# Slots taken between our glob and our link are earlier claims than ours.
		slot_name "$rc_n"
		while ! ln "$rc_tmp" "$sn" 2>/dev/null; do
			[ -e "$sn" ] || break
			if [ -z "$rc_found" ] && slot_read "$rc_n" && [ "$sl_op" != "$op" ] && slot_counts; then
				rc_found=$rc_n rc_state=$sl_state rc_op=$sl_op rc_at=$sl_at
			fi
			rc_n=$((rc_n + 1))
			slot_name "$rc_n"
		done
		# The temp name goes later, off this path: with the supervisor's own leftovers
		# once the exit record is down (it derives the name from the claim), or with
		# our spools when we refuse.
		rc_left=$rc_tmp
		rc_own=$rc_n
	fi
	if [ -z "$rc_found" ] || [ "$rp_window" -eq 0 ] || [ "$rp_action" = allow ]; then
		slot_unhold
		return 0
	fi
	# The fields of the slot as the walk read it: a second read could see nothing (seen
	# once under load: a refusal with an empty earlier=), and it would say no more.
	rc_fields="earlier=$rc_op earlier_state=$rc_state earlier_at=$rc_at"
	if [ "$rp_action" = warn ]; then
		slot_unhold
		frame "W $rc_fields"
		return 0
	fi
	# Held: our slot says so, so that it never counts against a later claim.
	slot_name "$rc_own"
	printf 'op=%s\nclaimed_at=%s\nheld=1\n' "$op" "$now" >"$ix/.h.$$" 2>/dev/null &&
		mv -f "$ix/.h.$$" "$sn"
	refuse "repeats $rc_fields"
}

# repeat_find: the walk of repeat_check over the index $ix for a claim of $op with
# intent $fp: rc_last (the newest slot), rc_own (our op's slot), rc_found, rc_state,
# rc_op and rc_at (the first repetition that counts, within $rp_window of $now: its slot,
# its marker's state, its op id and claim time). Reads only.
repeat_find() {
	rc_last=0
	for rc_f in "$ix"/[0-9]*; do
		[ -f "$rc_f" ] && rc_last=${rc_f##*/}
	done
	rc_last=${rc_last#"${rc_last%%[!0]*}"}
	rc_last=${rc_last:-0}
	# Walk back from the newest slot to the first repetition (a claim of this intent
	# under another op id that may have had the effect, however it came to be newer
	# than a slot of ours: it still ran recently), passing our own slot (a retry of our
	# op) on the way. Reading stops there: the cost is the slots passed, not the window.
	rc_own='' rc_found='' rc_state='' rc_n=$rc_last rc_declared=,$rp_declared,
	while [ "$rc_n" -gt 0 ]; do
		slot_read "$rc_n" || break
		[ "$rp_window" -gt 0 ] && [ "$((sl_at + rp_window))" -lt "$now" ] && break
		if [ "$sl_op" = "$op" ]; then
			[ -n "$rc_own" ] || rc_own=$rc_n
		elif slot_counts; then
			rc_found=$rc_n rc_state=$sl_state rc_op=$sl_op rc_at=$sl_at
			break
		fi
		if [ "$rp_window" -eq 0 ] || [ "$rp_action" = allow ]; then
			break
		fi
		rc_n=$((rc_n - 1))
	done
}

# repeats OP FP REPEAT_S DECLARED: the earlier claim of intent FP under another op id
# within REPEAT_S that a claim of OP would meet (see repeat_check), read only: for a plan
# before acting. One `J` frame: `earlier= earlier_state= earlier_at=`, or `none`.
verb_repeats() {
	[ "$#" -eq 4 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	case $2 in
	'' | *[!0-9a-f]*) refuse "bad_args reason=fingerprint" ;;
	esac
	is_uint "$3" || refuse "bad_args reason=window"
	setup_root
	op=$1 fp=$2 rp_window=$3 rp_action=block rp_declared=$4
	[ "$rp_declared" = - ] && rp_declared=
	now
	ix=$root/fp/$fp
	rc_found=
	[ -d "$ix" ] && [ "$rp_window" -gt 0 ] && repeat_find
	if [ -n "$rc_found" ]; then
		frame "J earlier=$rc_op earlier_state=$rc_state earlier_at=$rc_at"
	else
		frame "J none"
	fi
}

# slot_name N: sets sn to the slot's path, N zero-padded to 10 digits (so a glob sorts
# them); a variable, not output, so that no process is started per slot.
slot_name() {
	sn=0000000000$1
	sn=$ix/${sn#"${sn%??????????}"}
}

# slot_read N: sets sl_op, sl_at, sl_held of slot N in $ix; false when it is missing.
slot_read() {
	slot_name "$1"
	slot_file "$sn"
}

# slot_file PATH: slot_read of the slot file at PATH.
slot_file() {
	sl_file=$1
	sl_op='' sl_at=0 sl_held=''
	[ -f "$sl_file" ] || return 1
	while IFS= read -r sl_line || [ -n "$sl_line" ]; do
		case $sl_line in
		op=*) sl_op=${sl_line#op=} ;;
		claimed_at=*) sl_at=${sl_line#claimed_at=} ;;
		held=1) sl_held=1 ;;
		esac
		sl_line=
	done <"$sl_file"
	is_uint "$sl_at" || sl_at=0
	return 0
}

# slot_counts: the slot just read (not ours) is a claim that may have had the effect:
# not held back, not declared by this run, and its op's marker holds this intent and
# is running, completed, interrupted, or fenced after its command started; a slot whose
# marker is not there yet counts while it is young (its claimer is between the index
# and its mkdir). Sets sl_state.
slot_counts() {
	[ -z "$sl_held" ] || return 1
	valid_id "$sl_op" || return 1
	case $rc_declared in
	*",$sl_op,"*) return 1 ;;
	esac
	sc_m=$m
	state "$sl_op"
	sl_state=$st
	sc_fp=
	rget "$m/claim" fingerprint && sc_fp=$rv
	sc_started=
	[ "$st" = fenced ] && rget "$m/fenced" command_started && sc_started=$rv
	m=$sc_m
	case $st in
	absent)
		sl_state=claiming
		[ "$((sl_at + 60))" -ge "$now" ]
		;;
	fenced) [ "$sc_started" = 1 ] && [ "$sc_fp" = "$fp" ] ;;
	*) [ -z "$sc_fp" ] || [ "$sc_fp" = "$fp" ] ;;
	esac
}

# slot_unhold: our slot (rc_own) was held back by an earlier run; this one goes on (a
# declared repetition, the window passed): it counts again.
slot_unhold() {
	slot_read "$rc_own" || return 0
	[ -n "$sl_held" ] || return 0
	slot_name "$rc_own"
	printf 'op=%s\nclaimed_at=%s\n' "$op" "$sl_at" >"$ix/.h.$$" 2>/dev/null &&
		mv -f "$ix/.h.$$" "$sn"
}

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

# detach SHELL ARGS...: starts `SHELL <this script> ARGS...` in a session of its own, with
# no descriptor of the channel, and returns at once. `setsid setsid CMD`, run in the
# foreground: the first setsid (not a process-group leader: no job control here) makes
# the new session itself and execs the second, which, now a group leader, forks; its
# child makes the session the supervisor leads (its pid is the session id) and execs
# it, while the parent returns. This works with util-linux's setsid and busybox's alike
# (which has no -f), and, unlike a background `setsid CMD &`, leaves SIGINT and SIGQUIT
# as the foreground had them, i.e. as under ssh: dash and busybox ash start `&`
# children with both ignored, for good (docs/findings.md#detaching-the-command).
# shellcheck disable=SC2317 # called through with_secrets
detach() {
	dt_sh=$1
	shift
	if [ -n "$shim_file" ]; then
		"$setsid_bin" "$setsid_bin" "$dt_sh" "$OPMARK_SHIM_SELF" "$OPMARK_SHIM_SELF" "$@" \
			</dev/null >/dev/null 2>&1 3>&- 5>&- 8>&-
	else
		"$setsid_bin" "$setsid_bin" "$dt_sh" -c "$OPMARK_SHIM_SELF" opmark-shim "$OPMARK_SHIM_SELF" "$@" \
			</dev/null >/dev/null 2>&1 3>&- 5>&- 8>&-
	fi
}

# hand_off M: in a resident's request, gives the command of marker M to the resident's
# standby supervisor (see standby) instead of starting one: one write of its line to the
# FIFO, no process. False, and detach starts one as before, when there is no standby
# that is ready (none yet, taken, gone or stopped: FIFO.pid names no live process, or a
# stopped one) or M cannot be written on one line. The FIFO is opened for the write
# only: a resident holds it open for reading and writing, so the open never waits, and
# the request's other processes inherit no end of it.
hand_off() {
	[ -n "${sb_fifo:-}" ] || return 1
	case $1 in
	*"
"*) return 1 ;;
	esac
	ho_pid='' ho_start=''
	read -r ho_pid ho_start _ 2>/dev/null <"$sb_fifo.pid" || return 1
	is_uint "$ho_pid" && alive "$ho_pid" "$ho_start" || return 1
	# A stopped one would hold the command until the start limit.
	[ "$ps_state" != T ] || return 1
	printf '\n%s %s %s %s %s\n' "$timeout" "$cap" "$cmd_bytes" "$attempt" "$1" 2>/dev/null >"$sb_fifo"
}

# keep_standby: the resident has a standby supervisor waiting (see standby), or starts
# one, between requests (off every request's path). One FIFO per resident, made with the
# first request that finds the marker root's spool (on first contact it is made by that
# request), held open here for reading and writing on 8: the standby's stdin never sees
# EOF while the resident lives, and does once it is gone, so a standby never outlives its
# resident waiting. A new standby only once the last one took its line ("used") or is
# gone: two readers of one FIFO could split a line. One that never got as far as FIFO.pid
# (killed at its start) leaves the resident starting none: its requests detach as before.
keep_standby() {
	if [ -z "${sb_fifo:-}" ]; then
		[ -n "${sb_off:-}" ] && return 0
		[ -n "$setsid_bin" ] || {
			sb_off=1
			return 0
		}
		case $sv_root in
		/*) ;;
		*)
			sb_off=1
			return 0
			;;
		esac
		[ -d "$sv_root/spool" ] || return 0
		sb_off=1
		proc_stat "$$" || return 0
		ks_fifo=$sv_root/spool/.sb.$$.$ps_start
		standby_leftovers
		{ mkfifo "$ks_fifo" && exec 8<>"$ks_fifo"; } 2>/dev/null || return 0
		sb_fifo=$ks_fifo
		find_preload
	else
		ks_state='' ks_start=''
		read -r ks_state ks_start _ 2>/dev/null <"$sb_fifo.pid"
		case $ks_state in
		used) ;;
		'') return 0 ;;
		*) alive "$ks_state" "$ks_start" && return 0 ;;
		esac
	fi
	true 2>/dev/null >"$sb_fifo.pid" || return 0
	# shellcheck disable=SC2094 # the FIFO's name is the standby's argument, not its output
	if [ -n "$shim_file" ]; then
		"$setsid_bin" "$setsid_bin" "$OPMARK_SHELL" "$OPMARK_SHIM_SELF" "$OPMARK_SHIM_SELF" standby "$sb_fifo" "$sb_preload" "$sb_head" \
			<"$sb_fifo" >/dev/null 2>&1 3>&- 5>&- 8>&-
	else
		"$setsid_bin" "$setsid_bin" "$OPMARK_SHELL" -c "$OPMARK_SHIM_SELF" opmark-shim "$OPMARK_SHIM_SELF" standby "$sb_fifo" "$sb_preload" "$sb_head" \
			<"$sb_fifo" >/dev/null 2>&1 3>&- 5>&- 8>&-
	fi
}

# find_preload: sets sb_preload and sb_head to the environment `stdbuf -o0` gives the
# program it runs (coreutils: its LD_PRELOAD and _STDBUF_O=0, read back by printenv) and
# the head it would run (the first on PATH, as its execvp finds it: never a shell's
# applet, busybox ash's own head writes through stdio), so that a standby's captures
# start that head with it themselves (see capped_head); both empty when anything is
# otherwise: stdbuf then. A resident asks once, for all its standbys.
find_preload() {
	sb_preload='' sb_head=''
	sb_ifs=$IFS
	IFS=:
	set -f
	# shellcheck disable=SC2086 # splitting PATH at its colons is the point
	for sb_d in $PATH; do
		case $sb_d in
		/*) [ -f "$sb_d/head" ] && [ -x "$sb_d/head" ] && sb_head=$sb_d/head && break ;;
		esac
	done
	set +f
	IFS=$sb_ifs
	if [ -n "$sb_head" ] && command -v stdbuf >/dev/null 2>&1 &&
		command -v printenv >/dev/null 2>&1; then
		sb_env=$(stdbuf -o0 printenv LD_PRELOAD _STDBUF_O </dev/null 2>/dev/null 3>&- 8>&-)
		case $sb_env in
		*libstdbuf*"
0")
			sb_preload=${sb_env%"
0"}
			;;
		esac
		case $sb_preload in
		*"
"*) sb_preload= ;;
		esac
	fi
}

# standby_leftovers: the FIFOs of residents that are gone without removing theirs (a
# SIGKILL), named by the resident's pid and start time.
standby_leftovers() {
	for sl_f in "$sv_root"/spool/.sb.*.pid; do
		[ -e "$sl_f" ] || continue
		sl_id=${sl_f#"$sv_root"/spool/.sb.}
		sl_id=${sl_id%.pid}
		alive "${sl_id%%.*}" "${sl_id#*.}" && continue
		rm -f "${sl_f%.pid}" "$sl_f"
	done
}

# read_resident_command: reads the command of a resident's request, cmd_bytes bytes and
# the newline the client puts after them (the line-wise builtin `read` cannot stop
# inside a line), into cmd_text; false unless exactly that arrived. The builtin reads
# one byte at a time from a pipe, so nothing past the newline is taken.
read_resident_command() {
	cmd_text='' rs_l=''
	while [ "${#cmd_text}" -le "$cmd_bytes" ] && IFS= read -r rs_l; do
		cmd_text="$cmd_text$rs_l
"
	done
	[ "${#cmd_text}" -eq "$((cmd_bytes + 1))" ] || return 1
	cmd_text=${cmd_text%?}
}

# read_short_command: reads the command, the channel's data up to EOF, into cmd_text;
# false unless it is exactly cmd_bytes bytes. (A final line without a newline is still
# read: `read` fails at EOF but sets the variable.)
read_short_command() {
	cmd_text='' rs_l=''
	while IFS= read -r rs_l; do
		cmd_text="$cmd_text$rs_l
"
	done
	cmd_text=$cmd_text$rs_l
	[ "${#cmd_text}" -eq "$cmd_bytes" ]
}

# spool_command: receives exactly cmd_bytes bytes of the channel's data into an
# unclaimed spool file ($cmd_spool), leaving what follows (the stdin) unread.
spool_command() {
	cmd_spool="$root/spool/$attempt.$$.cmd"
	# dd's own report says how many bytes it wrote ("N bytes ... copied" on its third
	# line, GNU and busybox alike): no wc for that, unless the report is not that.
	if ! got=$(dd of="$cmd_spool" bs=65536 count="$cmd_bytes" iflag=count_bytes,fullblock 2>&1); then
		# A full marker root is the host's state, not a bad request.
		resource_cause
		[ "$cause" = write_failed ] || refuse "root_unusable reason=$cause"
		refuse "bad_command reason=read_failed"
	fi
	got=${got#*records out
}
	case $got in
	[0-9]*" bytes"*) got=${got%% *} ;;
	*) got=$(wc -c <"$cmd_spool") ;;
	esac
	if [ "$((got + 0))" -ne "$cmd_bytes" ]; then
		resource_cause
		[ "$cause" = write_failed ] || refuse "root_unusable reason=$cause"
		refuse "bad_command reason=size_mismatch expected=$cmd_bytes got=$((got + 0))"
	fi
}

# prepare_marker DIR: everything a claim needs in DIR: the claim record first, then the
# command (written from memory, or moved in from its spool), the capture files, the empty
# file an unwritable exit record is renamed from, and the FIFOs. Fails (leaving DIR for
# the caller to remove) when any cannot be made: a claim either exists completely or not
# at all. Not synced here: the supervisor makes the claim durable before its start gate,
# while its captures start (a superseding claim is synced before the old one moves).
prepare_marker() {
	pm_dir=$1
	# `true`, not `:`: a failed redirection of a special built-in ends the whole shell.
	printf '%s\n' "$claim_rec" >"$pm_dir/claim" &&
		if [ -n "$cmd_spool" ]; then
			mv -f "$cmd_spool" "$pm_dir/cmd"
		else
			printf '%s' "$cmd_text" >"$pm_dir/cmd"
		fi &&
		true >"$pm_dir/out" && true >"$pm_dir/err" && true >"$pm_dir/.noexit" &&
		register_waiter "$pm_dir" "$pm_dir/.out.fifo" "$pm_dir/.err.fifo"
} 2>/dev/null

# The marker is taken: answer with its state instead of running (or supersede an
# interrupted claim when the client says policy allows it, then return with our claim in
# place).
answer_taken_claim() {
	state "$op"
	if [ "$st" = fenced ]; then
		refuse "fenced $(describe)"
	fi
	if claimed; then
		rget "$m/claim" fingerprint
		[ "$rv" = "$fp" ] || refuse "conflict $(describe)"
	fi
	case $st in
	completed)
		# replay=1: the recorded output and the exit frame follow (other verbs' refusals
		# end the reply).
		frame "R completed replay=1 $(describe)"
		drop_spools
		follow "$m" 0 0
		exit 0
		;;
	running) refuse "running $(describe)" ;;
	interrupted)
		[ "$sup" = 1 ] || refuse "interrupted $(describe)"
		supersede_marker "$attempt" || return 1
		frame "U superseded_by=$attempt"
		;;
	absent) return 1 ;;
	*) refuse "$st $(describe)" ;;
	esac
}

# supersede_marker BY: replaces the interrupted claim at $m by our complete claim and
# moves the old one aside (kept for audit), or refuses leaving it untouched; false when
# the marker was gone (another superseder's swap) so the caller claims again. The new
# marker is built beside it first, so a full disk can never leave the op id without
# evidence; the swap itself is two renames, which need no free space.
supersede_marker() {
	# One superseder at a time per claim: another one's new claim must never be moved
	# aside as if it were the old one.
	if ! mkdir "$m/.superseding" 2>/dev/null; then
		state "$op"
		# Gone between the renames of another superseder's swap: claim again.
		[ "$st" != absent ] || return 1
		[ -d "$m/.superseding" ] || [ "$st" != interrupted ] || {
			resource_cause
			refuse "interrupted $(describe) supersede_failed=$cause"
		}
		refuse "$st $(describe)"
	fi
	# Taking the start gate first means a supervisor that has not started yet never will.
	take_gate "$m"
	state "$op"
	if [ "$st" != interrupted ]; then
		rmdir "$m/.superseding"
		refuse "$st $(describe)"
	fi
	sm_next="$root/ops/.next.$$"
	if ! mkdir "$sm_next" 2>/dev/null || ! prepare_marker "$sm_next" ||
		! sync "$sm_next/claim" "$sm_next"; then
		resource_cause
		rm -rf "$sm_next"
		rmdir "$m/.superseding"
		refuse "interrupted $(describe) supersede_failed=$cause"
	fi
	now
	sm_aside="$root/superseded/$op.$now.$1"
	printf 'superseded_by=%s\nsuperseded_at=%s\n' "$1" "$now" >"$m/superseded" 2>/dev/null
	if ! mv "$m" "$sm_aside" 2>/dev/null; then
		resource_cause
		rm -rf "$sm_next"
		rmdir "$m/.superseding"
		refuse "interrupted $(describe) supersede_failed=$cause"
	fi
	rmdir "$sm_aside/.superseding"
	if ! mv "$sm_next" "$m" 2>/dev/null || ! [ -f "$m/claim" ] ||
		! rget "$m/claim" attempt || [ "$rv" != "$attempt" ]; then
		# A fresh claimer took the op id between the renames (its claim stands; ours
		# went into its directory if anywhere), or the rename failed: put the evidence
		# back where it was if the name is still free.
		rm -rf "$sm_next" "$m/.next.$$"
		[ -e "$m" ] || mv "$sm_aside" "$m" 2>/dev/null
		state "$op"
		refuse "$st $(describe)"
	fi
	wf="$m/.w.$fg.$fg_start"
	superseded=1
	sync "$root/ops" "$root/superseded"
}

# cancel OP GRACE_MS: stops the operation for good. Absent: fenced, so a delayed attempt
# can never run. Claimed but the command not started: the start gate is taken and the
# marker fenced. Running: TERM to its session (never the supervisor, which must live to
# write the exit record, marked cancelled=1), KILL after GRACE_MS, then wait for the
# record. Interrupted: fenced. Answers one frame "N <outcome> <marker fields>".
verb_cancel() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	is_uint "$2" || refuse "bad_args reason=grace"
	setup_root
	m="$root/ops/$1"
	if mkdir "$m" 2>/dev/null; then
		cancel_fence "$1" absent
	fi
	state "$1"
	case $st in
	fenced) cancel_answer already_fenced ;;
	completed) cancel_answer already_completed ;;
	interrupted)
		# Take the start gate: if the supervisor never started, now it never will. If
		# it had, the command may have had effects, and the fence must say so.
		take_gate "$m" || cf_started=1
		cancel_fence "$1" interrupted
		;;
	esac
	# Running. Whoever takes the start gate decides: if we do, the command never starts.
	if take_gate "$m"; then
		cancel_fence "$1" not_started
	fi
	# The gate is taken: the supervisor wrote its identity first (or a fence took it).
	cf_started=1
	state "$1"
	case $st in
	fenced) cancel_answer already_fenced ;;
	completed) cancel_answer already_completed ;;
	interrupted) cancel_fence "$1" interrupted ;;
	# Its processes cannot be seen here: nothing to signal, nothing asked.
	running) [ "$why" = liveness_unknown ] && cancel_answer still_running ;;
	# Moved aside by a concurrent supersede: say so rather than guess.
	*) refuse "$st $(describe)" ;;
	esac
	rget "$m/proc" pid
	cn_sid=$rv
	rget "$m/proc" start
	cn_start=$rv
	rget "$m/proc" captures
	cn_caps=$rv
	is_uint "$cn_sid" || refuse "running $(describe)"
	now
	durable_write "$m" cancelled "cancelled_at=$now
grace_ms=$2" || refuse "root_unusable reason=cancel_write_failed"
	# Just before the first signal: the supervisor reads it when the command ends, to
	# tell a command the signal stopped from one that ended by itself (docs/host-protocol.md#cancel).
	true >"$m/signalled"
	signal_session TERM "$cn_sid" "$$" "$cn_start" "$cn_caps"
	if ! cancel_wait "$(($2 / 100))"; then
		signal_session KILL "$cn_sid" "$$" "$cn_start" "$cn_caps"
		# The supervisor records the exit once its captures see the command gone.
		cancel_wait 300
	fi
	state "$1"
	case $st in
	completed)
		rget "$m/exit" cancelled
		if [ "$rv" = 1 ]; then
			cancel_answer cancelled
		fi
		cancel_answer already_completed
		;;
	interrupted) cancel_fence "$1" interrupted ;;
	*) cancel_answer "still_$st" ;;
	esac
}

# cancel_wait TENTHS: waits up to TENTHS/10 s for the exit record, or for the session
# to be gone; false when it is still running.
cancel_wait() {
	cw_left=$1
	while :; do
		exited && return 0
		alive "$cn_sid" "$cn_start" || session_alive "$cn_sid" "$cn_start" || return 0
		[ "$cw_left" -gt 0 ] || return 1
		cw_left=$((cw_left - 1))
		sleep 0.1
		beat 10
	done
}

# cancel_fence OP WAS: tombstones the marker $m (its start gate taken) and answers.
# cf_started=1: the supervisor had taken the gate first, so the command started and its
# outcome is unknown; the record keeps that, so no later reader takes the fence for
# "nothing ran".
cancel_fence() {
	take_gate "$m"
	sync "$root/ops"
	now
	durable_write "$m" fenced "fenced_at=$now
fenced_by=cancel
command_started=${cf_started:-0}" || refuse "root_unusable reason=fence_write_failed"
	state "$1"
	frame "N fenced was=$2 $(describe)"
	exit 0
}

cancel_answer() {
	frame "N $1 $(describe)"
	exit 0
}

# probe OP
verb_probe() {
	[ "$#" -eq 1 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	setup_root
	state "$1"
	frame "P $(describe)"
}

# attach OP OUT_OFFSET ERR_OFFSET
verb_attach() {
	[ "$#" -eq 3 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	if ! is_uint "$2" || ! is_uint "$3"; then
		refuse "bad_args reason=offset"
	fi
	setup_root
	state "$1"
	case $st in
	absent | fenced) refuse "$st $(describe)" ;;
	esac
	frame "A $(describe)"
	# Following a running command: output beyond the cap comes live, as for the run's
	# own foreground; a finished one gets the kept copy.
	live=
	if [ "$st" = running ] && rget "$m/claim" cap && is_uint "$rv"; then
		live=1 cap=$rv
	fi
	proc_stat "$fg"
	fg_start=$ps_start
	register_waiter "$m"
	follow "$m" "$2" "$3"
	# (A run's supervisor removes its waiters; an attach may come after it is gone.)
	rm -f "$wf"
}

# output OP STREAM FROM LEN: at most LEN bytes of the kept copy of a stream (out or
# err) from byte FROM, or, written -N, its last N bytes; what is there now, without
# waiting for more (a running command's copy grows up to its cap). Reads only. The bytes
# come as one payload, then a `V` frame: the marker, the stream's kept and dropped byte
# counts, and the range sent.
verb_output() {
	[ "$#" -eq 4 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	case $2 in
	out) ok=O ;;
	err) ok=E ;;
	*) refuse "bad_args reason=stream" ;;
	esac
	of=${3#-}
	if ! is_uint "$of" || ! is_uint "$4"; then
		refuse "bad_args reason=range"
	fi
	setup_root
	state "$1"
	case $st in
	absent | fenced) refuse "$st $(describe)" ;;
	esac
	sizes
	okept=$so
	[ "$2" = err ] && okept=$se
	odropped=0
	[ -f "$m/$2.dropped" ] && read -r odropped <"$m/$2.dropped"
	is_uint "$odropped" || odropped=0
	if [ "$3" = "$of" ]; then
		ofrom=$of
	else
		ofrom=$((okept - of))
		[ "$ofrom" -ge 0 ] || ofrom=0
	fi
	[ "$ofrom" -le "$okept" ] || ofrom=$okept
	olen=$((okept - ofrom))
	[ "$olen" -le "$4" ] || olen=$4
	[ "$olen" -gt 0 ] && payload "$ok" "$m/$2" "$ofrom" "$olen"
	frame "V $(describe) stream=$2 kept=$okept dropped=$odropped from=$ofrom len=$olen"
}

# fence OP FORCE: tombstone so the op id can never be claimed. Without FORCE only an
# absent or never-started claim is fenced; FORCE (an operator's not-applied decision)
# also fences an interrupted one.
verb_fence() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	setup_root
	m="$root/ops/$1"
	if mkdir "$m" 2>/dev/null; then
		take_gate "$m"
	else
		state "$1"
		case $st in
		fenced)
			frame "F already_fenced $(describe)"
			exit 0
			;;
		interrupted)
			# Take the start gate: if the supervisor never started, now it never will.
			# Forced over a started command (an operator's decision), the record says
			# the command had started.
			if ! take_gate "$m"; then
				[ "$2" = 1 ] || refuse "$st $(describe)"
				fe_started=1
			fi
			;;
		*) refuse "$st $(describe)" ;;
		esac
	fi
	sync "$root/ops"
	now
	durable_write "$m" fenced "fenced_at=$now
command_started=${fe_started:-0}" || refuse "root_unusable reason=fence_write_failed"
	st=fenced why=
	frame "F fenced $(describe)"
}

# supersede OP BY_ATTEMPT
verb_supersede() {
	[ "$#" -eq 2 ] || refuse "bad_args reason=argument_count"
	valid_id "$1" || refuse "invalid_op_id"
	valid_id "$2" || refuse "bad_args reason=attempt_id"
	setup_root
	op=$1 m="$root/ops/$1"
	# The same lock as a run's supersede: a claim installed meanwhile is never moved.
	if ! mkdir "$m/.superseding" 2>/dev/null; then
		state "$op"
		refuse "$st $(describe)"
	fi
	take_gate "$m"
	state "$op"
	if [ "$st" != interrupted ]; then
		rmdir "$m/.superseding"
		refuse "$st $(describe)"
	fi
	now
	sm_aside="$root/superseded/$op.$now.$2"
	printf 'superseded_by=%s\nsuperseded_at=%s\n' "$2" "$now" >"$m/superseded" 2>/dev/null
	if ! mv "$m" "$sm_aside" 2>/dev/null; then
		rmdir "$m/.superseding"
		refuse "$st $(describe)"
	fi
	rmdir "$sm_aside/.superseding"
	sync "$root/ops"
	frame "U superseded_by=$2"
}

# gc MAX_AGE_S DRY_RUN TOMB_AGE_S: collects completed or fenced markers whose record is
# older than MAX_AGE_S down to tombstones (see tombstone), never a running or interrupted
# one; removes tombstones whose record is older than TOMB_AGE_S only when that is given
# (`-`: tombstones are kept); reclaims failed-start leftovers and cached shims of other
# versions older than MAX_AGE_S. gc never turns evidence into absence (docs/host-protocol.md#tombstones).
verb_gc() {
	[ "$#" -eq 3 ] || refuse "bad_args reason=argument_count"
	is_uint "$1" || refuse "bad_args reason=age"
	[ "$3" = - ] || is_uint "$3" || refuse "bad_args reason=tombstone_age"
	setup_root
	now
	limit=$((now - $1))
	tomb_limit=
	[ "$3" = - ] || tomb_limit=$((now - $3))
	removed=0 kept=0 collected=0 tombs=0 reclaimed=0
	for g in "$root"/ops/*; do
		[ -d "$g" ] || continue
		g_op=${g##*/} g_at=
		state "$g_op"
		case $st in
		completed) rget "$m/exit" ended_at && g_at=$rv ;;
		fenced) rget "$m/fenced" fenced_at && g_at=$rv ;;
		*)
			kept=$((kept + 1))
			continue
			;;
		esac
		if ! is_uint "$g_at"; then
			kept=$((kept + 1))
		elif [ -f "$g/collected" ]; then
			if [ -n "$tomb_limit" ] && [ "$g_at" -le "$tomb_limit" ]; then
				frame "G remove op=$g_op state=$st at=$g_at tombstone=1"
				[ "$2" = 1 ] || rm -rf "$g"
				removed=$((removed + 1))
			else
				tombs=$((tombs + 1))
			fi
		elif [ "$g_at" -le "$limit" ]; then
			frame "G collect op=$g_op state=$st at=$g_at"
			if [ "$2" = 1 ] || tombstone "$g"; then
				collected=$((collected + 1))
			else
				kept=$((kept + 1))
			fi
		else
			kept=$((kept + 1))
		fi
	done
	gc_reclaim "$1" "$2"
	gc_index "$limit" "$2"
	[ "$2" = 1 ] || sync "$root/ops" "$root/superseded"
	frame "G done removed=$removed collected=$collected tombstones=$tombs reclaimed=$reclaimed kept=$kept dry_run=$2"
}

# tombstone M: reduces the finished marker M to what docs/host-protocol.md#tombstones keeps of it: the claim
# (attempt, fingerprint, family, claim time) with the exit or fence record (status, end
# time) and `collected`; the output, command, stdin and process records go. `collected`
# is down first, so a reader that finds the output gone knows why.
tombstone() {
	durable_write "$1" collected "collected_at=$now" || return 1
	for tf in "$1"/* "$1"/.[!.]*; do
		[ -e "$tf" ] || continue
		case ${tf##*/} in
		claim | exit | fenced | started | collected) ;;
		*) rm -rf "$tf" ;;
		esac
	done
	sync "$1"
}

# gc_reclaim MAX_AGE_S DRY_RUN: what is no evidence of any operation: claims set aside
# because their supervisor never started (their start gate taken, nothing ran), and
# cached shims of other versions (a client still using one sends it again), older than
# MAX_AGE_S (by modification time, in whole minutes).
gc_reclaim() {
	gr_min=$(($1 / 60))
	gr_self=
	if [ -n "$shim_file" ]; then
		gr_self=${OPMARK_SHIM_SELF##*/}
	elif [ -n "$shim_hash" ]; then
		gr_self=$shim_hash.sh
	fi
	for gr in "$root"/superseded/*.failed-start "$root"/shim/*.sh; do
		[ -e "$gr" ] || continue
		case $gr in
		"$root"/shim/*)
			# Only when this call knows its own copy, which is never one to reclaim.
			[ -n "$gr_self" ] || continue
			[ "${gr##*/}" != "$gr_self" ] || continue
			# Nor one a live resident runs from (`sh FILE FILE ... serve`): its next
			# supervisor starts from it.
			! grep -q -F -e "$gr" /proc/[0-9]*/cmdline 2>/dev/null || continue
			gr_what=shim
			;;
		*) gr_what=failed_start ;;
		esac
		[ -n "$(find "$gr" -prune -mmin +"$gr_min" 2>/dev/null)" ] || continue
		frame "G reclaim what=$gr_what name=${gr##*/}"
		[ "$2" = 1 ] || rm -rf "$gr"
		reclaimed=$((reclaimed + 1))
	done
}

# gc_index LIMIT DRY_RUN: prunes the fingerprint index (see repeat_check) of slots claimed
# at or before LIMIT, never the newest slot of an intent (the next claim numbers after
# it); a repetition window longer than gc's age sees back only as far as the slots kept.
gc_index() {
	for gi in "$root"/fp/*; do
		[ -d "$gi" ] || continue
		gi_last=
		for gi_f in "$gi"/[0-9]*; do
			[ -f "$gi_f" ] && gi_last=$gi_f
		done
		# Temp names of slots whose claimer was killed before its supervisor ended (the
		# slot itself stays).
		for gi_f in "$gi"/.t.*; do
			[ -f "$gi_f" ] || continue
			[ -n "$(find "$gi_f" -prune -mmin +"$gr_min" 2>/dev/null)" ] || continue
			[ "$2" = 1 ] || rm -f "$gi_f"
		done
		for gi_f in "$gi"/[0-9]*; do
			[ "$gi_f" != "$gi_last" ] || continue
			[ -f "$gi_f" ] || continue
			slot_file "$gi_f"
			[ "$sl_at" -le "$1" ] || continue
			[ "$2" = 1 ] || rm -f "$gi_f"
		done
	done
}

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
	for dr_tool in cat date dd find head mkdir mkfifo mv od rm sleep sync tail wc; do
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

# ---------------------------------------------------------------------------------------
# The resident host session (docs/host-protocol.md#the-resident-session)

# serve: one long-lived shim per kept connection. It answers requests, one per line of
# its stdin, until EOF, each in a subshell (an `exit` in a verb ends only that request,
# and no variable of one request reaches the next), and ends each reply with an end
# frame, so that a client knows the reply is whole on a channel that stays open. Every
# request is checked and answered exactly as a call of its own would be: its own call
# token and nonce, r= checked before the verb acts, the same verbs, the same frames. The
# supervisor of each command is still started detached (setsid), so it outlives the
# resident and the connection. An operator turns it off for a host with the file
# resident.off in the marker root, or OPMARK_RESIDENT=0 in the environment sshd gives the
# session: it then refuses, and the client calls the shim once per command.
verb_serve() {
	sv_root=${OPMARK_ROOT:-${XDG_STATE_HOME:-${HOME:-}/.local/state}/opmark}
	if [ "${OPMARK_RESIDENT:-1}" = 0 ] || [ -e "$sv_root/resident.off" ]; then
		refuse "cannot_start reason=resident_off"
	fi
	resident=$$
	find_setsid
	frame "Q ready pid=$$"
	sv_line=''
	while IFS= read -r sv_line; do
		set -f
		# shellcheck disable=SC2086 # a request is words without spaces or patterns
		set -- $sv_line
		set +f
		serve_one "$@"
		keep_standby
	done
	if [ -n "${sb_fifo:-}" ]; then
		exec 8>&-
		rm -f "$sb_fifo" "$sb_fifo.pid"
	fi
	exit 0
}

# serve_one q c=TOKEN [r=ROOT_ID] VERB ARGS...: one request. Anything else means the
# stream is out of step with the client: the resident ends rather than guess. So does a
# request that ended in any other way than its answer (a refusal before its data was
# read, a signal), since its data may be left unread.
serve_one() {
	[ "${1:-}" = q ] || exit 3
	shift
	call_token=
	case ${1:-} in
	c=*)
		call_token=${1#c=}
		shift
		;;
	esac
	case $call_token in
	'' | *[!0-9a-f]*) exit 3 ;;
	esac
	expect_root=
	case ${1:-} in
	r=*)
		expect_root=${1#r=}
		shift
		;;
	esac
	case $expect_root in
	*[!0-9a-f]*) expect_root=bad ;;
	esac
	# A nonce of this request's own, made here so that the end frame carries it too.
	new_nonce || exit 3
	(
		# The standby's FIFO is the resident's: a request opens it only to hand off.
		exec 8>&-
		# The subshell's own pid and start time, from one read of its stat line (its
		# check, identity_readable, uses the same line).
		self_line=
		read -r self_line 2>/dev/null </proc/self/stat
		fg=${self_line%% *}
		frame "H v=$OPMARK_SHIM_VERSION c=$call_token"
		dispatch "$@"
		exit 0
	)
	sv_rc=$?
	frame "Z c=$call_token status=$sv_rc"
	[ "$sv_rc" -eq 0 ] || exit 0
	# The script reached the cache with the first request that opened the root.
	shim_hash=
}

# beat CENTISECONDS: a resident's request that waits (following a command, a cancel)
# says "B" about twice a second, so that the client tells a resident that stopped
# answering (SIGSTOP, a hang) from a quiet command within its keepalive budget. A
# resident stopped while its request runs on says nothing either.
beat() {
	[ -n "$resident" ] || return 0
	bt_acc=$((${bt_acc:-0} + $1))
	[ "$bt_acc" -ge 50 ] || return 0
	bt_acc=0
	proc_stat "$resident" && [ "$ps_state" = T ] && return 0
	frame B
}

# dispatch VERB ARGS...: one verb's answer.
dispatch() {
	dp_verb=${1:-}
	[ "$#" -gt 0 ] && shift
	case $dp_verb in
	run) verb_run "$@" ;;
	probe) verb_probe "$@" ;;
	attach) verb_attach "$@" ;;
	repeats) verb_repeats "$@" ;;
	output) verb_output "$@" ;;
	fence) verb_fence "$@" ;;
	cancel) verb_cancel "$@" ;;
	supersede) verb_supersede "$@" ;;
	gc) verb_gc "$@" ;;
	doctor) verb_doctor "$@" ;;
	*) refuse "bad_args reason=unknown_verb" ;;
	esac
}

# ---------------------------------------------------------------------------------------
# Entry

# Sourced as a library (see the header): everything is defined, nothing acts.
[ -z "$shim_library" ] || return 0

verb=${1:-}
[ "$#" -gt 0 ] && shift
# Act only when the replies reach the client (sshd gives pipes or sockets). A startup
# file that sent our output elsewhere (`exec >/dev/null`) would let a claim happen that
# the client never hears of, while a channel that closes without our header is its
# evidence that nothing ran. (Checked before the header: after it, stdout is /dev/null
# on purpose.)
for tb in 1 2; do
	[ -e "/dev/fd/$tb" ] || continue
	[ -p "/dev/fd/$tb" ] || [ -S "/dev/fd/$tb" ] || exit 3
done
exec 3>&2 2>/dev/null
new_nonce || {
	printf 'opmark-shim: cannot read /dev/urandom\n' >&3
	exit 3
}
hello
case $verb in
serve) verb_serve "$@" ;;
*) dispatch "$verb" "$@" ;;
esac
exit 0
