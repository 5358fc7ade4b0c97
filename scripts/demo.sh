#!/usr/bin/env bash
# Demo against disposable local targets: installs what is missing, builds opmark, starts
# three real OpenSSH sshd targets with `opmark lab up`, runs a command through each with
# the plain OpenSSH client, shows each target's own marker state dir, and (as root) cuts
# and restores a network-namespace target's link. Everything is stopped on exit.
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
bash scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"

echo "== building opmark"
cargo build --quiet
opmark=$PWD/target/debug/opmark
# Not under /tmp: markers there would not survive a reboot, and the shim refuses them.
lab=$PWD/target/demo-lab

"$opmark" lab down --dir "$lab" >/dev/null 2>&1 || true
trap '"$opmark" lab down --dir "$lab" >/dev/null 2>&1 || true' EXIT

echo "== opmark lab up 3"
"$opmark" lab up 3 --dir "$lab"

echo "== an SSH round trip through each target (OpenSSH client, generated ssh_config)"
for t in target1 target2 target3; do
  # \$ expands on the target: each target has its own state dir, hence marker root.
  ssh -F "$lab/ssh_config" -o BatchMode=yes "$t" \
    "echo \"$t: I am \$(id -un), my marker root is \$XDG_STATE_HOME/opmark\""
done

if [[ $(id -u) -eq 0 ]]; then
  netlab=$PWD/target/demo-netlab
  "$opmark" lab down --dir "$netlab" >/dev/null 2>&1 || true
  trap '"$opmark" lab down --dir "$lab" >/dev/null 2>&1 || true
        "$opmark" lab down --dir "$netlab" >/dev/null 2>&1 || true' EXIT
  echo "== a target in its own network namespace, and a silent link cut"
  "$opmark" lab up 1 --placement netns --dir "$netlab" >/dev/null
  ssh -F "$netlab/ssh_config" -o BatchMode=yes target1 'echo "netns target answers"'
  "$opmark" lab cut target1 --dir "$netlab"
  start=$(date +%s%N)
  if ssh -F "$netlab/ssh_config" -o BatchMode=yes -o ConnectTimeout=2 target1 true 2>/dev/null; then
    echo "unexpected: a cut target answered" >&2
    exit 1
  fi
  echo "cut target: connect timed out after $((($(date +%s%N) - start) / 1000000)) ms (no RST, no ICMP)"
  "$opmark" lab restore target1 --dir "$netlab"
  ssh -F "$netlab/ssh_config" -o BatchMode=yes target1 'echo "restored target answers again"'
else
  echo "(not root: skipping the network-namespace part of the demo)"
fi

echo "== opmark lab status"
"$opmark" lab status --dir "$lab"
echo "== done; the targets are stopped on exit"
