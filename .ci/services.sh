#!/usr/bin/env bash
# Start the servers the test suite talks to, if they are not answering, and wait until they do.
# Only loopback addresses are used.
set -u

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
mysql_up() { mysqladmin --connect-timeout=2 -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1; }

start_redis() {
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
}
start_pg() { pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql | head -n1)" main start; }
start_mysql() { start-stop-daemon --start --oknodo --background --exec /usr/sbin/mariadbd; }

wait_for() {  # name, probe; waits at most 60 s
    local name=$1 probe=$2 i
    for i in $(seq 1 120); do
        if $probe; then echo "services: $name is up"; return 0; fi
        sleep 0.5
    done
    echo "services: $name did not come up" >&2
    return 1
}

status=0
for svc in redis pg mysql; do
    if ! "${svc}_up"; then
        echo "services: starting $svc"
        "start_$svc" || true
    fi
    wait_for "$svc" "${svc}_up" || status=1
done
# The suite's databases; creating them is idempotent.
psql -h 127.0.0.1 -U postgres -tc "SELECT 1 FROM pg_database WHERE datname = 'test'" 2>/dev/null | grep -q 1 \
    || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null 2>&1 || true
mysql -h 127.0.0.1 -uroot -e "CREATE DATABASE IF NOT EXISTS test" >/dev/null 2>&1 || true
exit $status
