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

