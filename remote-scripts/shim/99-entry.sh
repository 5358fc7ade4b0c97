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
