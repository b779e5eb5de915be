# Sourced by the measurement scripts: kvpd_port LOG prints the port of a kvpd started
# with --listen 127.0.0.1:0 once its log (stderr) says it is listening; after 10 s
# without that line it prints the log to stderr and returns 1.
kvpd_port() {
    local port=
    for _ in $(seq 100); do
        port=$(sed -n 's/.*listening on [0-9.]*:\([0-9]*\).*/\1/p' "$1")
        [ -n "$port" ] && { echo "$port"; return 0; }
        sleep 0.1
    done
    cat "$1" >&2
    return 1
}
