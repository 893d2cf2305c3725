#!/usr/bin/env bash
# Start the servers the test suite talks to, if they are not answering, and wait until they do.
# Only loopback addresses are used.
set -u

redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
pg_up() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
cluster_up() { redis-cli -h 127.0.0.1 -p 7000 cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }
mysql_up() { mysqladmin --connect-timeout=2 -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1; }

start_redis() {
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir /var/lib/redis --logfile /var/log/redis/ci.log
}
# Redis Cluster: three masters on 127.0.0.1:7000-7002, no replicas, nothing persisted.
CLUSTER_PORTS="7000 7001 7002"
CLUSTER_DIR=${ASYNCLOCK_CLUSTER_DIR:-/tmp/asynclock-redis-cluster}
start_cluster() {
    local port addrs=""
    for port in $CLUSTER_PORTS; do
        mkdir -p "$CLUSTER_DIR/$port"
        if ! redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG; then
            # a node left over from an earlier run remembers a cluster that may be gone
            rm -f "$CLUSTER_DIR/$port/nodes.conf"
            redis-server --cluster-enabled yes --cluster-config-file nodes.conf \
                --cluster-node-timeout 5000 --port "$port" --bind 127.0.0.1 \
                --save "" --appendonly no --daemonize yes --dir "$CLUSTER_DIR/$port" \
                --logfile "$CLUSTER_DIR/$port/redis.log"
        fi
        addrs="$addrs 127.0.0.1:$port"
    done
    for port in $CLUSTER_PORTS; do  # wait for every node before creating the cluster
        for _ in $(seq 1 40); do
            redis-cli -h 127.0.0.1 -p "$port" ping 2>/dev/null | grep -q PONG && break
            sleep 0.25
        done
    done
    if ! redis-cli -h 127.0.0.1 -p 7000 cluster info 2>/dev/null | grep -q 'cluster_known_nodes:3'; then
        # shellcheck disable=SC2086 - one argument per node
        redis-cli --cluster create $addrs --cluster-replicas 0 --cluster-yes >/dev/null
    fi
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
for svc in redis cluster pg mysql; do
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
