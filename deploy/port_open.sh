# Sourced by deploy/kafka/kafka.sh and deploy/stack.sh.
# port_open PORT: whether something listens on TCP PORT of this host (network namespace).  Read from
# /proc/net/tcp{,6} (a LISTEN row, state 0A, with that local port), not by connecting: a connect to a port of the
# ephemeral range (32768-60999) that nothing listens on can pick that very port as its own source port and
# connect to itself (TCP simultaneous open), which a start-up wait took for a broker that was not there, and
# whose leftover socket then kept the broker from binding (user trial 35, port 39192).  Without /proc (not
# Linux), a connect, as before.  FP_PROC_NET (default /proc/net) is for tests.
port_open() {
  local net=${FP_PROC_NET:-/proc/net}
  if [ -r "$net/tcp" ]; then
    local hex tables=("$net/tcp")
    hex=$(printf ':%04X' "$1")
    # tcp6 is missing on a kernel without IPv6, and mawk gives up on a file it cannot open (exit 2, "not open")
    [ -r "$net/tcp6" ] && tables+=("$net/tcp6")
    awk -v p="$hex" '$4 == "0A" && substr($2, length($2) - 4) == p { found = 1 } END { exit !found }' "${tables[@]}"
  else
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
  fi
}
