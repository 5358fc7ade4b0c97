#!/bin/sh
# Rewrites, in place, the citations of the product specification ("SPEC section N",
# "SPEC N", "SPEC §N", "SPEC sections N and M", "the SPEC's ...") and of the findings
# notes ("(FINDINGS)") in the code and the README into citations of the docs/ anchors
# that cover them. Neither document is in the repository; docs/ is (docs/README.md).
#
# Usage: scripts/cite-docs.sh [PATH...]
#        (default: src remote-scripts tests benches examples README.md)
#
# Run once from any directory, after the merges that touch those files; then remove the
# #[ignore] of tests/it/architecture_docs.rs, which fails on any citation left over and on
# any docs anchor that does not exist. Running it twice changes nothing the second time.
# It exits 1, listing them, when citations are left that the table below does not cover.
# Without arguments it also points the links of docs/ and the README at the files the
# refactor moved (see `moved` below).
#
# The table is one GNU sed program run over each whole file (-z), so that a citation
# wrapped over two comment lines ("(SPEC" / "//! section 14)") is found too. Order
# matters: wrapped forms are joined first, then citations whose context names a narrower
# anchor, then several sections at once, then one anchor per section.
set -eu

cd "$(dirname "$0")/.."
sweep=
if [ "$#" -eq 0 ]; then
	sweep=1
	set -- src remote-scripts tests benches examples README.md
fi

table=$(mktemp)
trap 'rm -f "$table"' EXIT

cat >"$table" <<'SED'
# --- a citation wrapped after "SPEC" or "SPEC section": keep the comment prefix, cite on
# the next line
s@SPEC(\n[[:blank:]]*(//!|///|//|#)[[:blank:]]*)((sections? )?[0-9])@see\1SPEC \3@g
s@SPEC (sections?)(\n[[:blank:]]*(//!|///|//|#)[[:blank:]]*)([0-9])@see\2SPEC \1 \4@g

# --- wrapped citations whose next words name a narrower anchor
s@SPEC section 3\)\. What stays@docs/host-protocol.md#tombstones). What stays@g
s@SPEC section 11, issue 18@docs/findings.md#speed, issue 18@g
s@disposable(\n[[:blank:]]*//[[:blank:]]*)\(SPEC 3\)@disposable\1(docs/host-protocol.md#marker-layout)@g

# --- the SPEC's words
s@the SPEC's pattern@the pattern of docs/guarantees.md#operation-ids@g
s@The SPEC's words as types@The words of docs/guarantees.md#vocabulary as types@g
s@in the SPEC's vocabulary@in the vocabulary of docs/guarantees.md#vocabulary@g
s@the SPEC's surface@the surface of docs/guarantees.md#the-command-line-contract@g
s@describes SPEC section 6's surface@describes the surface of docs/guarantees.md#the-command-line-contract@g
s@SPEC section 4's rows@the rows of docs/decisions.md#after-a-lost-connection@g

# --- several sections at once
s@The client's environment \(SPEC sections 6 and 7\)@The client's environment (docs/ledger.md#where-the-ledger-lives)@g
s@SPEC sections 2, 4, 8 and 10@docs/decisions.md@g
s@SPEC sections 2, 4, 8, 10@docs/decisions.md@g
s@SPEC sections 2, 8 and 10@docs/decisions.md#no-not-applied-without-proof and docs/guarantees.md#verdicts@g
s@SPEC sections 2, 4 and 10@docs/decisions.md@g
s@SPEC sections 3 and 8@docs/decisions.md#reconcile@g
s@SPEC sections 6 and 11@docs/guarantees.md#the-command-line-contract and docs/decisions.md#fleets@g
s@SPEC sections 6 and 7@docs/ledger.md#writes-before-and-after-dispatch@g
s@SPEC sections 7 and 14@docs/ledger.md#backends@g
s@SPEC sections 9 and 17@docs/guarantees.md#evidence-identity@g
s@SPEC sections 13 and 17@docs/guarantees.md#evidence-identity@g
s@SPEC 15, 16@docs/trust.md#the-keeper, docs/findings.md#speed@g
s@SPEC section 7 and issue 12@docs/ledger.md#redaction and issue 12@g

# --- section 1
s@as the client actually observed it \(SPEC section 1\)@as the client actually observed it (docs/guarantees.md#attempt-boundaries)@g
# --- section 2
s@An operator's decision is terminal \(SPEC section 2\)@An operator's decision is terminal (docs/decisions.md#operator-decision)@g
s@A final decision stands \(SPEC section 2\)@A final decision stands (docs/decisions.md#operator-decision)@g
s@settles an operation for good \(SPEC section 2\)@settles an operation for good (docs/decisions.md#operator-decision)@g
s@without contacting the host \(SPEC section 2\)@without contacting the host (docs/decisions.md#operator-decision)@g
# --- section 3: the narrower anchors of the host protocol
s@SPEC 3: it runs as@docs/host-protocol.md#the-commands-environment: it runs as@g
s@would run it \(SPEC 3\)@would run it (docs/host-protocol.md#the-commands-environment)@g
s@SPEC 3: the exit record@docs/host-protocol.md#the-claim: the exit record@g
s@SPEC 3: evidence is never turned@docs/host-protocol.md#tombstones: evidence is never turned@g
s@evidence into absence \(SPEC 3\)@evidence into absence (docs/host-protocol.md#tombstones)@g
s@what SPEC 3 keeps of it@what docs/host-protocol.md#tombstones keeps of it@g
s@SPEC 3: what stays is a tombstone@docs/host-protocol.md#tombstones: what stays is a tombstone@g
s@SPEC 3: before anything is collected@docs/host-protocol.md#tombstones: before anything is collected@g
s@keeps them all \(SPEC 3\)@keeps them all (docs/host-protocol.md#tombstones)@g
s@read as before \(SPEC 3\)@read as before (docs/host-protocol.md#tombstones)@g
s@left to replay \(SPEC 3\)@left to replay (docs/host-protocol.md#tombstones)@g
s@the marker is a tombstone \(SPEC 3\)@the marker is a tombstone (docs/host-protocol.md#tombstones)@g
s@exit status is left \(SPEC 3\)@exit status is left (docs/host-protocol.md#tombstones)@g
s@SPEC 3: output cut at the host's cap@docs/host-protocol.md#marker-layout: output cut at the host's cap@g
s@never a guess \(SPEC 3\)@never a guess (docs/host-protocol.md#liveness)@g
s@never taken for interrupted \(SPEC 3\)@never taken for interrupted (docs/host-protocol.md#liveness)@g
s@supersede a live command \(SPEC 3\)@supersede a live command (docs/host-protocol.md#liveness)@g
s@its id reused: SPEC 3\)@its id reused: docs/host-protocol.md#liveness)@g
s@refuses every run \(SPEC 3\)@refuses every run (docs/host-protocol.md#liveness)@g
s@own attempt's claim \(SPEC 3\)@own attempt's claim (docs/host-protocol.md#the-supervisor)@g
s@are disposable \(SPEC 3\)@are disposable (docs/host-protocol.md#lab-targets)@g
s@refuses on a real host \(SPEC 3\)@refuses on a real host (docs/host-protocol.md#marker-layout)@g
s@counts too \(SPEC 3\)@counts too (docs/decisions.md#what-earlier-runs-left)@g
s@never claims again \(SPEC 3\)@never claims again (docs/decisions.md#ledger-holds-the-exit)@g
s@issue 11, SPEC section 3@issue 11, docs/trust.md#the-host@g
# --- section 3: contradictions between evidence
# (also when wrapped: a citation in the same parenthesis as a word about contradictions)
s@([Cc]ontradict[^()]{0,80}\((see[^()]{0,12})?)SPEC (section )?3\)@\1docs/ledger.md#contradictions)@g
s@Contradictions between evidence recorded \(SPEC section 3\)@Contradictions between evidence recorded (docs/ledger.md#contradictions)@g
s@the ledger holds \(SPEC section 3\)@the ledger holds (docs/ledger.md#contradictions)@g
s@contradicted ones \(SPEC section 3\)@contradicted ones (docs/ledger.md#contradictions)@g
s@contradiction between evidence \(SPEC section 3\)@contradiction between evidence (docs/ledger.md#contradictions)@g
s@Contradicted operations \(SPEC section 3\)@Contradicted operations (docs/ledger.md#contradictions)@g
s@contradictions between evidence \(SPEC section 3\)@contradictions between evidence (docs/ledger.md#contradictions)@g
# --- section 4
s@says `interrupted` \(SPEC section 4\)@says `interrupted` (docs/decisions.md#probe-interrupted)@g
# --- section 7
s@belongs to the ledger \(SPEC section 7\)@belongs to the ledger (docs/ledger.md#the-installation-key)@g
s@keys its chain \(SPEC section 7\)@keys its chain (docs/ledger.md#the-installation-key)@g
s@Keyed chain \(SPEC section 7\)@Keyed chain (docs/ledger.md#the-chain)@g
s@does not trust the projection \(SPEC section 7\)@does not trust the projection (docs/ledger.md#the-chain)@g
s@differs from its replay \(SPEC section 7\)@differs from its replay (docs/ledger.md#the-chain)@g
s@SPEC 7: memory bounded@docs/ledger.md#redaction: memory bounded@g
s@spooled, not held: SPEC 7@spooled, not held: docs/ledger.md#redaction@g
# --- section 10: run's signals, and the shim's cancel
s@makes of the run \(SPEC section 10\)@makes of the run (docs/decisions.md#client-signal)@g
s@interruptions of the client \(SPEC section 10\)@interruptions of the client (docs/decisions.md#client-signal)@g
s@before the command ended \(SPEC 10\)@before the command ended (docs/host-protocol.md#cancel)@g
s@cancel_pending=1 \(SPEC 10\)@cancel_pending=1 (docs/host-protocol.md#cancel)@g
s@ended by itself \(SPEC 10\)@ended by itself (docs/host-protocol.md#cancel)@g
s@did not stop it \(SPEC section 10\)@did not stop it (docs/host-protocol.md#cancel)@g
# --- section 17: the root id itself, and the lab's names
s@the marker root's id \(SPEC 17\)@the marker root's id (docs/host-protocol.md#root-id)@g
s@unique per lab \(SPEC 17\)@unique per lab (docs/host-protocol.md#lab-targets)@g

# --- one anchor per section, in any spelling: "SPEC section N", "SPEC §N", "SPEC N"
s@SPEC (section |§ ?)?1([^0-9])@docs/guarantees.md#vocabulary\2@g
s@SPEC (section |§ ?)?2([^0-9])@docs/guarantees.md#verdicts\2@g
s@SPEC (section |§ ?)?3([^0-9])@docs/host-protocol.md#the-shim\2@g
s@SPEC (section |§ ?)?4([^0-9])@docs/decisions.md#after-a-lost-connection\2@g
s@SPEC (section |§ ?)?5([^0-9])@docs/trust.md#the-policy\2@g
s@SPEC (section |§ ?)?6([^0-9])@docs/guarantees.md#the-command-line-contract\2@g
s@SPEC (section |§ ?)?7([^0-9])@docs/ledger.md#events\2@g
s@SPEC (section |§ ?)?8([^0-9])@docs/guarantees.md#the-guarantees\2@g
s@SPEC (section |§ ?)?9([^0-9])@docs/guarantees.md#host-identity\2@g
s@SPEC (section |§ ?)?10([^0-9])@docs/guarantees.md#interruptions-and-cancel\2@g
s@SPEC (section |§ ?)?11([^0-9])@docs/decisions.md#fleets\2@g
s@SPEC (section |§ ?)?12([^0-9])@docs/guarantees.md#agents-over-mcp\2@g
s@SPEC (section |§ ?)?13([^0-9])@docs/host-protocol.md#lab-targets\2@g
s@SPEC (section |§ ?)?14([^0-9])@docs/ledger.md#backends\2@g
s@SPEC (section |§ ?)?15([^0-9])@docs/trust.md#the-keeper\2@g
s@SPEC (section |§ ?)?16([^0-9])@docs/findings.md#speed\2@g
s@SPEC (section |§ ?)?17([^0-9])@docs/guarantees.md#evidence-identity\2@g
s@SPEC (section |§ ?)?18([^0-9])@docs/guarantees.md#repetitions\2@g
s@SPEC (section |§ ?)?19([^0-9])@docs/ledger.md#health\2@g

# --- the findings notes: one anchor per measured fact
s@output can follow either \(FINDINGS\)@output can follow either (docs/findings.md#russh-exit-status-and-eof)@g
s@instead of KeyIsEncrypted \(FINDINGS\)@instead of KeyIsEncrypted (docs/findings.md#russh-key-loading)@g
s@on any network \(FINDINGS\)@on any network (docs/findings.md#nagle-and-delayed-acks)@g
s@per small exchange \(FINDINGS\)@per small exchange (docs/findings.md#nagle-and-delayed-acks)@g
s@into the previous block \(FINDINGS\)@into the previous block (docs/findings.md#ssh-config-parsers)@g
s@~630 ms; FINDINGS\)@~630 ms; docs/findings.md#key-exchange-cost)@g
s@healthy quiet commands \(FINDINGS\)@healthy quiet commands (docs/findings.md#keepalives-detect-a-dead-link)@g
s@one bad line \(FINDINGS\)@one bad line (docs/findings.md#russh-known-hosts-gaps)@g
s@drops them \(FINDINGS\)@drops them (docs/findings.md#sshd-maxstartups)@g
s@both ignored, for good \(FINDINGS\)@both ignored, for good (docs/findings.md#detaching-the-command)@g
s@the protocol and FINDINGS\)@the protocol and docs/findings.md#speed)@g
SED

# The test that checks the result names these words in its own patterns; leave it alone.
skip=tests/it/architecture_docs.rs
list=$(mktemp)
trap 'rm -f "$table" "$list"' EXIT
grep -rlE "SPEC|FINDINGS\\)" "$@" 2>/dev/null | sort >"$list" || true
changed=0
while IFS= read -r f; do
	[ "$f" = "$skip" ] && continue
	tmp=$f.cite-docs.$$
	sed -E -z -f "$table" "$f" >"$tmp"
	if cmp -s "$f" "$tmp"; then
		rm -f "$tmp"
	else
		# cat keeps the file's own mode and inode; only its content changes.
		cat "$tmp" >"$f"
		rm -f "$tmp"
		changed=$((changed + 1))
		printf 'cite-docs: %s\n' "$f"
	fi
done <"$list"
printf 'cite-docs: %s file(s) rewritten\n' "$changed"

# Files the refactor of issue 29 moves: once moved, docs/ and the README link to the new
# place (tests/it/architecture_docs.rs fails on a link to a file that is gone).
moved() {
	[ -e "$2" ] && ! [ -e "$1" ] || return 0
	for md in docs/*.md README.md; do
		sed "s@$1@$2@g" "$md" >"$md.cite-docs.$$" && cat "$md.cite-docs.$$" >"$md"
		rm -f "$md.cite-docs.$$"
	done
	printf 'cite-docs: links to %s now go to %s\n' "$1" "$2"
}
if [ -n "$sweep" ]; then
	moved src/commands/reach.rs src/ops/reach.rs
	moved src/ledger/redact.rs src/redact/mod.rs
fi

# The same words tests/it/architecture_docs.rs looks for (the exit code FINDINGS aside).
left=$(grep -rnwE "SPEC|FINDINGS" "$@" 2>/dev/null | grep -v "^$skip:" |
	grep -vE "::FINDINGS|const FINDINGS" || true)
if [ -n "$left" ]; then
	printf '%s\n' "$left"
	printf 'cite-docs: the citations above are not in the table; add a row for each\n' >&2
	exit 1
fi
