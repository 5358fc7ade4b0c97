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
#   verb: run OP ATTEMPT FP FAMILY TIMEOUT_S CAP_BYTES STDIN_BYTES STDIN_SHA256 SUPERSEDE REPEAT_S REPEAT_ACTION DECLARED SECRETS BECOME LOCKS LOCK_WAIT_S KIND CMD_BYTES
#   verb: probe OP
#   verb: attach OP OUT_OFFSET ERR_OFFSET
#   verb: output OP STREAM FROM LEN
#   verb: repeats OP FP REPEAT_S DECLARED
#   verb: fence OP FORCE
#   verb: supersede OP BY_ATTEMPT
#   verb: gc AGE_S DRY_RUN TOMB_AGE_S
#   verb: doctor
#   verb: cancel OP GRACE_MS
#   verb: locks
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
#             user (become=, - for none), the host locks it takes (locks=NAME:N,... or
#             -) and how long it waits for them (lock_wait= seconds), foreground identity
#   supersedes  this claim replaced an interrupted one (which moved to superseded/)
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
OPMARK_SHIM_VERSION=8
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
# The most bytes one output payload carries: the client holds a payload until its commit
# frame, so a large kept copy (a get's file) goes in pieces it writes out as they come.
PAYLOAD_MAX=8388608
# Seconds a run's foreground waits for its supervisor's record before it takes the start
# gate itself (see supervisor_overdue); tests shorten it.
START_LIMIT=${OPMARK_START_LIMIT:-30}
case $START_LIMIT in
'' | *[!0-9]*) START_LIMIT=30 ;;
esac

