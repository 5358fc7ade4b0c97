# locks: the host locks held and waited for, read only (docs/host-protocol.md#host-locks).
# One frame per held slot, "L held lock=NAME capacity=N slot=I op=OP since=EPOCH
# alive=yes|no" (alive=no: its holder is gone and the next taker reaps it), one per claim
# whose supervisor waits for its locks, "L waiting op=OP locks=LIST since=EPOCH" (its
# claim time), then "L done held=N waiting=M". A held or waiting frame ends with the
# operation's command as lock_busy names it (`cmd=HEX [cmd_cut=1]`, see
# holder_cmd_fields) while its marker has it.
verb_locks() {
	setup_root
	read_boot
	lk_held=0 lk_waiting=0
	for lk_dir in "$root"/locks/*; do
		[ -d "$lk_dir" ] || continue
		lk_name=${lk_dir##*/}
		# Only what a lock name can be: the frame carries it.
		case $lk_name in
		'' | *[!A-Za-z0-9._-]* | [!A-Za-z0-9]*) continue ;;
		esac
		lk_cap=$(readlink "$lk_dir/capacity" 2>/dev/null)
		is_uint "$lk_cap" || lk_cap=unknown
		for lk_slot in "$lk_dir"/*; do
			[ -L "$lk_slot" ] || continue
			lk_i=${lk_slot##*/}
			is_uint "$lk_i" || continue
			lk_t=$(readlink "$lk_slot" 2>/dev/null) || continue
			lk_alive=no
			lock_holder_alive "$lk_t" && lk_alive=yes
			set -f
			# shellcheck disable=SC2086 # the holder's words
			set -- $lk_t
			set +f
			lk_op=${5:-} lk_since=${4:-}
			valid_id "$lk_op" || lk_op=unknown
			is_uint "$lk_since" || lk_since=0
			hc_fields=''
			[ "$lk_op" = unknown ] || holder_cmd_fields "$root/ops/$lk_op/cmd"
			frame "L held lock=$lk_name capacity=$lk_cap slot=$lk_i op=$lk_op since=$lk_since alive=$lk_alive${hc_fields:+ $hc_fields}"
			lk_held=$((lk_held + 1))
		done
	done
	for lk_m in "$root"/ops/*; do
		if ! [ -d "$lk_m" ] || [ -e "$lk_m/started" ]; then
			continue
		fi
		if ! rget "$lk_m/claim" locks || [ "$rv" = - ] || ! valid_locks "$rv"; then
			continue
		fi
		lk_list=$rv
		state "${lk_m##*/}"
		[ "$st" = running ] || continue
		rget "$lk_m/claim" claimed_at
		is_uint "$rv" || rv=0
		holder_cmd_fields "$lk_m/cmd"
		frame "L waiting op=${lk_m##*/} locks=$lk_list since=$rv${hc_fields:+ $hc_fields}"
		lk_waiting=$((lk_waiting + 1))
	done
	frame "L done held=$lk_held waiting=$lk_waiting"
}
