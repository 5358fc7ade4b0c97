#!/usr/bin/env bash
# Mutation testing of the host shim's guards: for each row of scripts/shim-mutants.tsv,
# replace one guard line of the shim (in the shell function the row names, found in the
# parts under remote-scripts/shim/) by its mutant, assemble the parts as build.rs does
# (name order, concatenated), run the shim tests (tests/it/shim.rs, which read the script named by
# OPMARK_SHIM_UNDER_TEST) against that copy, and say whether they caught it. The shipped
# script is never edited: every mutant is a copy in a temporary directory.
#
#   bash scripts/mutate-shim.sh           every mutant
#   bash scripts/mutate-shim.sh NAME...   only these
#   bash scripts/mutate-shim.sh --list    the mutants, one a line
#
# Exit 0 when every mutant did what its row expects (`caught`, or `survives: why` for a
# mutant no shim test can tell apart), 1 otherwise, 2 on a bad row (a line that is not
# in its function exactly once: the table has rotted and must follow the script).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
table=scripts/shim-mutants.tsv
parts=(remote-scripts/shim/*.sh)

rows() { grep -v '^#' "$table" | tail -n +2 | grep -v '^$'; }

if [[ ${1:-} == --list ]]; then
  rows | cut -f1,2,6
  exit 0
fi

# part_of FUNCTION: the part that defines FUNCTION; fails unless exactly one does.
part_of() {
  local found
  found=$(grep -l -e "^$1() {" "${parts[@]}") || return 1
  [[ $found != *$'\n'* ]] || return 1
  printf '%s\n' "$found"
}

# mutate FUNCTION LINE MUTANT OUT: the assembled script with LINE (leading whitespace
# aside) of FUNCTION replaced by MUTANT in the part that defines it, indentation kept;
# fails unless LINE occurs there once. The texts go through the environment: awk's -v
# would read their backslashes.
mutate() {
  local part p
  part=$(part_of "$1") || {
    echo "no single part defines $1" >&2
    return 3
  }
  for p in "${parts[@]}"; do
    if [[ $p == "$part" ]]; then
      mutate_part "$@" <"$p" || return
    else
      cat "$p"
    fi | shipped "$p"
  done >"$4"
}

# shipped PART: stdin (that part) as build.rs ships it: the header whole, any other part
# without its comment lines (the joined parts pass the 128 KiB one argument may hold).
shipped() {
  if [[ $1 == "${parts[0]}" ]]; then
    cat
  else
    sed -E '/^[[:space:]]*#([[:space:]].*)?$/d'
  fi
}

# mutate_part FUNCTION LINE MUTANT: stdin (one part) with the line replaced.
mutate_part() {
  MU_FN=$1 MU_FROM=$2 MU_TO=$3 awk '
    BEGIN { fn = ENVIRON["MU_FN"]; from = ENVIRON["MU_FROM"]; to = ENVIRON["MU_TO"] }
    index($0, fn "() {") == 1 { inside = 1 }
    {
      line = $0
      if (inside) {
        t = line
        sub(/^[ \t]+/, "", t)
        if (t == from) {
          n++
          line = substr(line, 1, length(line) - length(t)) to
        }
      }
      print line
      if (inside && $0 == "}") inside = 0
    }
    END { if (n != 1) { printf "matched %d times\n", n > "/dev/stderr"; exit 3 } }
  '
}

echo "== building the test binary"
bin=$(cargo test --locked --test it --no-run 2>&1 |
  sed -n 's/.*Executable tests\/it\/main.rs (\(.*\))/\1/p' | tail -n 1)
[[ -x $bin ]] || {
  echo "mutate-shim: could not find the integration test binary" >&2
  exit 2
}

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
# A copy: a build during the run must not swap the binary under it.
cp "$bin" "$work/it"
bin=$work/it

# run_tests SCRIPT: the shim tests against SCRIPT; 0 when they all pass. The tests that
# go through sshd run the opmark binary's own embedded script, not SCRIPT, so they are
# skipped; shellcheck judges the shipped file. A hang counts as not passing (and is said).
run_tests() {
  OPMARK_SHIM_UNDER_TEST=$1 timeout 900 "$bin" shim:: \
    --skip shim_is_shellcheck_clean --skip through_real_sshd -q </dev/null >"$work/log" 2>&1
}

# shellcheck disable=SC2094 # shipped names the part it reads, it never writes it
for p in "${parts[@]}"; do shipped "$p" <"$p"; done >"$work/original.sh"
echo "== the shim tests against the unchanged script"
if ! run_tests "$work/original.sh"; then
  tail -n 40 "$work/log"
  echo "mutate-shim: the tests fail without any mutant; fix that first" >&2
  exit 1
fi

wanted=("$@")
bad=0 caught=0 survived=0 total=0
printf '%-36s %-6s %-9s %s\n' mutant path result expected
while IFS=$'\t' read -r name path fn from to expect; do
  if [[ ${#wanted[@]} -gt 0 ]] && ! printf '%s\n' "${wanted[@]}" | grep -qx "$name"; then
    continue
  fi
  total=$((total + 1))
  if ! mutate "$fn" "$from" "$to" "$work/$name.sh" 2>"$work/err"; then
    echo "mutate-shim: row $name: the line is not in $fn ($(part_of "$fn" || echo no part)) exactly once ($(cat "$work/err"))" >&2
    exit 2
  fi
  if ! sh -n "$work/$name.sh" 2>"$work/err"; then
    echo "mutate-shim: row $name: the mutant does not parse: $(cat "$work/err")" >&2
    exit 2
  fi
  hung=
  if run_tests "$work/$name.sh"; then
    result=survived
    survived=$((survived + 1))
  else
    # timeout's 124: the tests hung on the mutant rather than failed (caught all the
    # same, but no test names the guard; a row that only hangs wants a test that fails).
    [[ $? -eq 124 ]] && hung=1
    result=caught
    caught=$((caught + 1))
  fi
  case $expect in
  caught) [[ $result == caught ]] || bad=$((bad + 1)) ;;
  survives:*) [[ $result == survived ]] || bad=$((bad + 1)) ;;
  *)
    echo "mutate-shim: row $name: expect must be caught or survives: why" >&2
    exit 2
    ;;
  esac
  printf '%-36s %-6s %-9s %s\n' "$name" "$path" "$result" "$expect"
  if [[ -n $hung ]]; then
    echo "    hung: the shim tests did not end within 900 s"
  elif [[ $result == caught ]]; then
    grep -E '^    [a-z0-9_:]+$' "$work/log" | sed 's/^ */    failed: /' | head -n 3 || true
  fi
done < <(rows)

echo "== $total mutants: $caught caught, $survived survived, $bad not as expected"
[[ $bad -eq 0 ]]
