#!/usr/bin/env bash
# The main job of opmark, end to end, against a disposable local SSH target:
#   an operation that appends a line to a file and exits 3; a forced disconnect in the
#   middle of it; the probe of its marker; the replay (same op id: nothing runs again, the
#   file keeps ONE line); then the agent's JSON verdict and the operator's views.
# Installs what is missing, builds opmark, and stops and removes everything on exit. Uses
# a private ledger and config dir inside the lab directory, never your real ones. Fails
# (non-zero) when opmark does not behave as shown, so it doubles as a smoke test.
#
#   bash scripts/demo.sh
#
# As root the disconnect is a silent network cut (the target sits in its own network
# namespace); otherwise the opmark client is killed with SIGKILL mid-command. Environment:
#   OPMARK_DEMO_DISCONNECT=cut|kill   force one kind of disconnect (cut needs root)
#   OPMARK_DEMO_PLACEMENT=docker      the target is a container (a Docker engine is needed;
#                                     the first run builds its image, about two minutes)
#   OPMARK_DEMO_KEEP=1                leave the lab running at the end, to explore it
set -euo pipefail

say() { printf '\n== %s\n' "$*"; }
die() {
  printf '\ndemo FAILED: %s\n' "$*" >&2
  exit 1
}

mode=${OPMARK_DEMO_DISCONNECT:-}
why="OPMARK_DEMO_DISCONNECT=$mode"
if [[ -z $mode ]]; then
  if [[ $(id -u) -eq 0 ]]; then mode="cut"; else mode="kill" why="not root, so no network namespace"; fi
fi
case $mode in
cut | kill) ;;
*) die "OPMARK_DEMO_DISCONNECT must be cut or kill, not '$mode'" ;;
esac
placement=${OPMARK_DEMO_PLACEMENT:-}
case $placement in
'' | docker) ;;
*) die "OPMARK_DEMO_PLACEMENT must be docker or unset, not '$placement'" ;;
esac

cd "$(dirname "${BASH_SOURCE[0]}")/.."
# Only what the demo needs (the tests' toolchain is `install-deps.sh` without --demo).
bash scripts/install-deps.sh --demo ${placement:+--docker}
export PATH="$HOME/.cargo/bin:$PATH"

echo "== building opmark (cargo build)"
# The binary is wherever cargo puts it (CARGO_TARGET_DIR, build.target-dir, ...): cargo
# names it in its build messages, so nothing here guesses target/debug.
build_messages=$(cargo build --quiet --message-format=json-render-diagnostics) ||
  die "cargo build failed (see above)"
opmark=$(grep -o '"executable":"[^"]*/opmark"' <<<"$build_messages" | tail -n 1 | cut -d'"' -f4) ||
  opmark= # no such message: said just below, not a silent `set -e` exit
[[ -n $opmark ]] || die "cargo build named no opmark executable in its messages"
[[ -x $opmark ]] || die "no opmark binary at $opmark, where cargo build said it put it"
echo "opmark: $opmark"

# The default lab place (a lab may also live under /tmp: its targets are disposable).
lab=${XDG_STATE_HOME:-$HOME/.local/state}/opmark/demo-lab
# The target's HOME is a directory of the lab (the targets are local), so the effect of
# the command on the target can be read here.
effect=$lab/target1/home/deploy.log
errlog=$lab/last-stderr
# A connection keeper of the demo's own. opmark keeps its keeper in
# $XDG_RUNTIME_DIR/opmark, so the demo's runs point XDG_RUNTIME_DIR into the lab, and its
# cleanup stops that keeper only: yours (and the connections it holds) is left alone.
keeper_run=$lab/run
demo_opmark() { XDG_RUNTIME_DIR=$keeper_run "$opmark" "$@"; }
stop_demo_keeper() {
  if [[ -d $keeper_run/opmark ]]; then demo_opmark keeper stop >/dev/null 2>&1 || true; fi
}
op=demo-deploy
# Appends one line (the effect), prints progress for ~4 s, exits with a distinctive 3.
# shellcheck disable=SC2016 # expanded on the target, not here
cmd='echo "release 42 deployed" >> ~/deploy.log; for i in 1 2 3 4; do echo "step $i/4"; sleep 1; done; echo done; exit 3'

helper_pid=
cleanup() {
  if [[ -n $helper_pid ]]; then kill "$helper_pid" 2>/dev/null || true; fi
  if [[ ${OPMARK_DEMO_KEEP:-} == 1 ]]; then
    echo "== the lab is left running (OPMARK_DEMO_KEEP=1); explore it with:"
    echo "   export OPMARK_LEDGER=$lab/ledger.db OPMARK_SSH_CONFIG=$lab/demo_ssh_config XDG_CONFIG_HOME=$lab/config"
    echo "   $opmark show $op"
    echo "   stop it with: XDG_RUNTIME_DIR=$keeper_run $opmark keeper stop; $opmark lab down --dir $lab"
  else
    # The demo's connection keeper holds a connection to the lab's target.
    stop_demo_keeper
    "$opmark" lab down --dir "$lab" >/dev/null 2>&1 || true
    echo "(the lab is stopped and removed; OPMARK_DEMO_KEEP=1 leaves it running to explore)"
  fi
}
# A lab (and keeper) an earlier demo left running (OPMARK_DEMO_KEEP=1) goes first.
stop_demo_keeper
"$opmark" lab down --dir "$lab" >/dev/null 2>&1 || true
trap cleanup EXIT

# typed WORD...: prints a command line as you would type it (single quotes where needed).
typed() {
  local arg line='$'
  for arg in "$@"; do
    if [[ $arg =~ ^[A-Za-z0-9._/:=@-]+$ ]]; then
      line+=" $arg"
    else
      line+=" '${arg//\'/\'\\\'\'}'"
    fi
  done
  printf '%s\n' "$line"
}

# Prints an opmark command as you would type it (the lab's settings are in the
# environment), then runs it: its stderr is shown live and kept in $errlog, its exit
# status in $rc.
shown() {
  typed opmark "$@"
  rc=0
  # Through a pipe, not a process substitution: bash leaves a process substitution's end
  # open in the command (fd 63), a connection keeper the command starts inherits it, and
  # tee then waits for the keeper's end, minutes later. With pipefail the status is
  # opmark's (tee's is 0), and tee has written everything when the pipeline ends.
  { demo_opmark "$@" 2>&1 1>&3 3>&- | tee "$errlog" >&2; } 3>&1 || rc=$?
}

# Waits until the command has started on the target (its effect line exists), then a
# little more, so that the disconnect lands in the middle of the command.
mid_command() {
  local _
  for _ in $(seq 100); do
    if [[ -s $effect ]]; then
      sleep 1.2
      return 0
    fi
    sleep 0.1
  done
  echo "demo: the command never started on the target" >&2
  return 1
}

say "a. start a disposable SSH target: a real OpenSSH sshd on this machine (opmark lab up)"
if [[ $placement == docker ]]; then
  "$opmark" lab up 1 --placement docker --dir "$lab" ||
    die "the docker target did not start (is the Docker engine running? see above)"
  # The container's HOME is inside it; its marker volume is readable from here, so the
  # effect goes there.
  markers=$("$opmark" --json lab status --dir "$lab" | grep -o '"markers_on_host":"[^"]*"' | head -n 1 | cut -d'"' -f4)
  [[ -n $markers ]] || die "lab status did not say where the target's markers are"
  effect=$(dirname "$markers")/deploy.log
  # shellcheck disable=SC2016 # expanded on the target, not here
  cmd='echo "release 42 deployed" >> "$XDG_STATE_HOME/deploy.log"; for i in 1 2 3 4; do echo "step $i/4"; sleep 1; done; echo done; exit 3'
elif [[ $mode == cut ]]; then
  if ! "$opmark" lab up 1 --placement netns --dir "$lab"; then
    why="the network-namespace target did not start (see above)"
    echo "($why: falling back to killing the client)"
    "$opmark" lab down --dir "$lab" >/dev/null 2>&1 || true
    mode="kill"
  fi
fi
if [[ $mode == kill && $placement != docker ]]; then
  "$opmark" lab up 1 --dir "$lab"
fi

# The target's alias is unique per lab (<lab id>-target1), so operations on two labs never
# share a ledger name; `target1` would work too, inside this lab's ssh_config only.
host=$("$opmark" --json lab status --dir "$lab" | grep -o '"alias":"[^"]*"' | head -n 1 | cut -d'"' -f4)
[[ -n $host ]] || die "lab status did not name the target"

# A private ledger and policy dir for the demo, and an ssh config that notices a dead
# link within ~3 s (keepalive every second, 2 unanswered tolerated) on top of the lab's.
export OPMARK_LEDGER=$lab/ledger.db XDG_CONFIG_HOME=$lab/config
export OPMARK_SSH_CONFIG=$lab/demo_ssh_config
printf '%s\n' 'ServerAliveInterval 1' 'ServerAliveCountMax 2' 'ConnectTimeout 2' \
  "Include $lab/ssh_config" >"$OPMARK_SSH_CONFIG"
echo "ledger: $OPMARK_LEDGER; ssh config: $OPMARK_SSH_CONFIG; the effect file: $effect"

if [[ $mode == cut ]]; then
  say "b+c. run an operation (appends a line, ~4 s, exits 3) and cut the target's network in the middle of it"
  echo "(about a second into the command the link is cut silently: no RST, no FIN; it is"
  echo " restored once the run has noticed the loss by keepalive. The run keeps probing the"
  echo " marker until the host answers, re-attaches and gets the command's true exit status)"
  (
    mid_command
    "$opmark" lab cut "$host" --dir "$lab"
    # Held until the run reports the loss (a fixed 4 s against a 3 s budget could end
    # before a busy machine's keepalives fire); restored after 30 s at most either way.
    for _ in $(seq 300); do
      grep -q 'lost after dispatch' "$errlog" 2>/dev/null && break
      sleep 0.1
    done
    "$opmark" lab restore "$host" --dir "$lab"
  ) &
  helper_pid=$!
  shown run "$host" --op "$op" -- "$cmd"
  wait "$helper_pid" || die "cutting or restoring the link failed"
  helper_pid=
  [[ $rc -eq 3 ]] || die "the interrupted run exited $rc, expected the command's own 3"
  grep -q 'lost after dispatch' "$errlog" ||
    die "the cut was not noticed (no 'connection ... lost' line); nothing was demonstrated"
  echo "-> exit status $rc: the command's own, received after the reconnect"
else
  say "b+c. run an operation (appends a line, ~4 s, exits 3) and kill the opmark client with SIGKILL in the middle of it"
  echo "($why: the client's death stands in for the lost link)"
  printf '%s &\n' "$(typed opmark run "$host" --op "$op" -- "$cmd")"
  demo_opmark run "$host" --op "$op" -- "$cmd" &
  helper_pid=$!
  mid_command
  kill -KILL "$helper_pid"
  wait "$helper_pid" 2>/dev/null || true
  helper_pid=
  echo "-> killed the opmark client (kill -KILL) while the command was running on the target"
fi

say "d. probe the marker on the target: the evidence opmark consults before any retry"
typed opmark probe "$host" "$op"
marker=$(demo_opmark probe "$host" "$op") || die "probe failed"
printf '%s\n' "$marker"
case $mode:$marker in
cut:"completed exit=3 "*) echo "-> completed with exit 3: the marker on the host recorded it" ;;
kill:running*) echo "-> running: the command outlived its client (it runs detached from the SSH session)" ;;
kill:"completed exit=3 "*) echo "-> completed with exit 3: the command outlived its client and finished" ;;
*) die "unexpected marker state: $marker" ;;
esac

say "e. the replay: the same op id and command again (an agent retrying after the disconnect)"
if [[ $mode == kill ]]; then
  echo "(if the command is still running, this run follows it instead of starting it again)"
fi
shown run "$host" --op "$op" -- "$cmd"
[[ $rc -eq 3 ]] || die "the replay exited $rc, expected the recorded 3"
grep -q '^opmark: replayed:' "$errlog" || die "the second run was not 'replayed'"
lines=$(wc -l <"$effect")
echo "-> exit $rc again, output returned; the effect file on the target:"
sed 's/^/   /' "$effect"
[[ $lines -eq 1 ]] || die "the effect file has $lines lines, expected exactly 1"
echo "-> exactly ONE line: the command ran once, although opmark was asked twice"

say "f. what an agent sees: --json makes the verdict a document (stdout), exit status still 3"
typed opmark --json run "$host" --op "$op" -- "$cmd"
rc=0
json=$(demo_opmark --json run "$host" --op "$op" -- "$cmd") || rc=$?
printf '%s\n' "$json"
[[ $rc -eq 3 ]] || die "the JSON run exited $rc, expected 3"
grep -Eq '"verdict": ?"replayed"' <<<"$json" || die "the JSON verdict is not replayed"
[[ $(wc -l <"$effect") -eq 1 ]] || die "the effect file grew after the JSON run"

say "f. what an operator sees: the operation's investigation page (attempts, probes, verdicts)"
shown show "$op"
[[ $rc -eq 0 ]] || die "show exited $rc"

say "f. every operation in the ledger (unresolved ones are marked !)"
shown list
[[ $rc -eq 0 ]] || die "list exited $rc"

say "f. the ledger is a hash chain of events; verify that none was edited or deleted"
shown audit verify
[[ $rc -eq 0 ]] || die "audit verify exited $rc"

say "done: one operation, one disconnect ($mode), one execution"
