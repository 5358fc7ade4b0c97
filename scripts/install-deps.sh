#!/usr/bin/env bash
# Installs what opmark's demo and tests need on Debian/Ubuntu: OpenSSH server and client
# (the lab targets are real sshd), the shells the host shim is tested under (dash,
# busybox-static: a static busybox is also what the host matrix's busybox images are
# made of) and the login shells its exec stub must work through (zsh, fish, tcsh, and
# for the matrix's users mksh, ksh93, yash, posh),
# dropbear (the matrix's other SSH server, with dropbearconvert for the lab's host keys), a
# linter (shellcheck), netcat (a ProxyCommand `nc %h %p` in the transport tests),
# iproute2 + nftables (network-namespace targets and link cuts),
# e2fsprogs + mount (small loop-mounted marker roots for the disk-full tests),
# postgresql (the shared-ledger tests start a throwaway cluster of their own with its
# initdb and pg_ctl; the package's own cluster and service are not used), groff
# (renders the generated man page in tests/it/ux.rs), debootstrap (builds the image of
# docker lab targets; the Docker engine itself is expected to be installed and running
# already), a C compiler (bundled SQLite, ring),
# Python with the official MCP SDK (the real MCP client tests/it/mcp.rs drives
# `opmark mcp` with), its 1.x line in a virtualenv (python3-venv) for the task client
# tests/it/tasks.rs drives, and jsonschema (checks schemas/run.schema.json against real
# output), tmux (tests/it/screens.rs draws the screens in an 80-column terminal),
# Rust via rustup when cargo is missing, and cargo-mutants, pinned (the mutation runs of
# docs/claims.md#mutation-testing; not for --demo).
#
#   bash scripts/install-deps.sh           install only what is missing
#   bash scripts/install-deps.sh --always  apt-get update + install regardless (CI)
#   bash scripts/install-deps.sh --bench   also the benchmarks' peers: pssh (parallel-ssh),
#                                          ansible and rsync (benches skip what is missing)
#   bash scripts/install-deps.sh --demo    only what scripts/demo.sh needs: OpenSSH, a C
#                                          compiler, Rust, iproute2 + nftables for the cut
#                                          (no test toolchain, no Python); with --docker
#                                          also debootstrap for a docker target's image
set -euo pipefail

always=0 bench=0 demo=0 docker=0
for arg in "$@"; do
  case $arg in
  --always) always=1 ;;
  --bench) bench=1 ;;
  --demo) demo=1 ;;
  --docker) docker=1 ;;
  *)
    echo "install-deps: unknown option $arg (use --always, --bench, --demo, --docker)" >&2
    exit 2
    ;;
  esac
done

packages=(openssh-server openssh-client dash busybox-static shellcheck iproute2 nftables
  procps util-linux ca-certificates curl gcc libc6-dev e2fsprogs mount zsh fish tcsh
  groff-base debootstrap python3 python3-pip python3-venv netcat-openbsd postgresql mksh ksh yash posh dropbear-bin
  tmux openssl)
# One probe per package above, in the same order: a missing probe means install.
probes=(/usr/sbin/sshd ssh dash busybox_static shellcheck ip nft ps setsid
  /etc/ssl/certs/ca-certificates.crt curl cc /usr/include/stdio.h mkfs.ext4 mount zsh fish tcsh
  groff /usr/sbin/debootstrap python3 pip3 python3_venv nc postgresql_initdb mksh ksh93 yash posh /usr/sbin/dropbear
  tmux openssl)
# Python packages, pinned: the MCP client the tests use must not move under them.
python_packages=(mcp==2.3.0 jsonschema==4.26.0 prometheus_client==0.26.0)

have() {
  if [[ $1 == postgresql_initdb ]]; then
    # Versioned directory: any /usr/lib/postgresql/*/bin/initdb will do.
    compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
  elif [[ $1 == python3_venv ]]; then
    # `python3 -m venv` needs ensurepip, which Debian ships apart (python3-venv).
    python3 -c 'import ensurepip' >/dev/null 2>&1
  elif [[ $1 == busybox_static ]]; then
    # busybox-static replaces the dynamic busybox (both install /bin/busybox).
    dpkg-query -W -f '${Status}' busybox-static 2>/dev/null | grep -q 'ok installed'
  elif [[ $1 == /* ]]; then [[ -e $1 ]]; else command -v "$1" >/dev/null 2>&1; fi
}

as_root() {
  if [[ $(id -u) -eq 0 ]]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    echo "install-deps: need root or sudo to run: $*" >&2
    exit 1
  fi
}

if [[ $demo -eq 1 ]]; then
  # The demo is one run against one sshd: the tests' shells, servers, PostgreSQL, linters
  # and Python are theirs to install (`.ci/run` runs this script with --always).
  packages=(openssh-server openssh-client iproute2 nftables procps util-linux ca-certificates
    curl gcc libc6-dev)
  probes=(/usr/sbin/sshd ssh ip nft ps setsid /etc/ssl/certs/ca-certificates.crt curl cc
    /usr/include/stdio.h)
  python_packages=()
fi
if [[ $docker -eq 1 ]]; then
  packages+=(debootstrap)
  probes+=(/usr/sbin/debootstrap)
fi

if [[ $bench -eq 1 ]]; then
  packages+=(pssh ansible rsync)
  probes+=(parallel-ssh ansible rsync)
fi

missing=0
for probe in "${probes[@]}"; do
  have "$probe" || missing=1
done

if [[ $always -eq 1 || $missing -eq 1 ]]; then
  export DEBIAN_FRONTEND=noninteractive
  as_root apt-get update -q
  # The package's own sshd service is not used (and may not start in a container).
  as_root apt-get install -y -q --no-install-recommends "${packages[@]}"
fi

if [[ ${#python_packages[@]} -gt 0 ]] &&
  { ! python3 -c 'import mcp, jsonschema, prometheus_client' >/dev/null 2>&1 || [[ $always -eq 1 ]]; }; then
  # --break-system-packages: CI images mark the system Python as externally managed;
  # these are test tools, not part of opmark.
  python3 -m pip install -q "${python_packages[@]}" ||
    python3 -m pip install -q --break-system-packages "${python_packages[@]}"
fi

# The MCP tasks test (tests/it/tasks.rs) needs the SDK's task client, which mcp 2.0 removed
# with the tasks wire of protocol 2025-11-25 it spoke; no release speaks the later tasks
# extension as a client. So a 1.x, pinned, in a virtualenv of its own beside the 2.x above.
tasks_venv="$HOME/.cache/opmark/mcp-tasks-venv"
tasks_sdk=1.26.0
if [[ ${#python_packages[@]} -gt 0 ]] &&
  { [[ $always -eq 1 ]] ||
    [[ $("$tasks_venv/bin/python" -c 'import importlib.metadata as m, mcp.client.experimental.tasks; print(m.version("mcp"))' 2>/dev/null) != "$tasks_sdk" ]]; }; then
  python3 -m venv "$tasks_venv"
  "$tasks_venv/bin/python" -m pip install -q "mcp==$tasks_sdk"
fi

export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
  echo "install-deps: cargo not found; installing Rust with rustup (https://rustup.rs)" >&2
  curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs |
    sh -s -- -y --profile minimal --component rustfmt,clippy
fi

# cargo-mutants, pinned like the Python tools above: the counts in docs/claims.md are of
# this version's mutants. Built with its own lock file; skipped when the pinned version
# is already installed, even with --always (a rebuild takes minutes and changes nothing),
# for --demo, which runs no tests, and in CI, whose test suite never runs it (building it
# there cost minutes of a run for nothing).
mutants_version=25.3.1
if [[ $demo -eq 0 && -z ${CI:-} ]] &&
  [[ $(cargo mutants --version 2>/dev/null) != "cargo-mutants $mutants_version" ]]; then
  # Only the mutation runs need it, never the tests: a registry that does not answer is
  # said, not fatal.
  cargo install cargo-mutants --version "$mutants_version" --locked ||
    echo "install-deps: cargo-mutants $mutants_version did not install; only the mutation runs (docs/claims.md#mutation-testing) need it" >&2
fi
