#!/usr/bin/env bash
# Start the servers the test suite talks to, if they are not answering, and wait until they do:
# Redis 6379, a 3-master Redis Cluster 7000-7002, PostgreSQL 5432 (trust, database `test`),
# PgBouncer 6432 (transaction pooling in front of it), MariaDB 3306 (root without password,
# database `test`). Only loopback addresses are used. It also makes sure Debian's headless
# Chromium is there for tests/web (.ci/browser.sh).
#
# A server whose programs are missing is installed with apt-get when that is possible (root,
# or password-less sudo, on Debian/Ubuntu); otherwise the script stops with one line naming
# the packages to install. Everything is idempotent: when all servers answer, it only probes
# them (well under a second; it runs before every `make test`).
#
#   bash .ci/services.sh           start what is down (installing what is missing)
#   bash .ci/services.sh --check   only report what is missing or down; change nothing
set -u

CHECK_ONLY=0
case "${1:-}" in
    --check) CHECK_ONLY=1 ;;
    "") ;;
    *) echo "usage: $0 [--check]" >&2; exit 2 ;;
esac

# -- probes ---------------------------------------------------------------------------------
redis_up() { redis-cli -h 127.0.0.1 -p 6379 ping 2>/dev/null | grep -q PONG; }
cluster_up() { redis-cli -h 127.0.0.1 -p 7000 cluster info 2>/dev/null | grep -q 'cluster_state:ok'; }
# "up" means ready for the suite: trust login on loopback and the database `test` exist
pg_answers() { pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null; }
pg_up() { psql -h 127.0.0.1 -p 5432 -U postgres -d test -tAc 'SELECT 1' 2>/dev/null | grep -q 1; }
# through PgBouncer to the server: a bouncer that accepts but cannot log in is not "up"
pgbouncer_up() { psql -h 127.0.0.1 -p 6432 -U postgres -d test -tAc 'SELECT 1' 2>/dev/null | grep -q 1; }
mysql_answers() { mysqladmin --connect-timeout=2 -h 127.0.0.1 -P 3306 -uroot ping >/dev/null 2>&1; }
mysql_up() { mysql --connect-timeout=2 -h 127.0.0.1 -P 3306 -uroot -D test -e 'SELECT 1' >/dev/null 2>&1; }

# -- what each service needs: its Debian package and the programs this script calls -----------
package_of() {
    case $1 in
        redis | cluster) echo redis-server ;;
        pg) echo postgresql ;;
        pgbouncer) echo pgbouncer ;;
        mysql) echo mariadb-server ;;
    esac
}
programs_of() {
    case $1 in
        redis | cluster) echo redis-server redis-cli ;;
        pg) echo pg_ctlcluster pg_lsclusters pg_isready psql ;;
        pgbouncer) echo pgbouncer ;;
        mysql) echo mariadbd mysqladmin mysql ;;
    esac
}
# Debian keeps the server programs outside a normal user's PATH
PATH=$PATH:/usr/sbin:/sbin
SERVICES="redis cluster pg pgbouncer mysql"

missing_packages() {  # the packages whose programs are not on PATH, each once
    local svc program found=""
    for svc in $SERVICES; do
        for program in $(programs_of "$svc"); do
            if ! command -v "$program" >/dev/null 2>&1; then
                case " $found " in *" $(package_of "$svc") "*) ;; *) found="$found $(package_of "$svc")" ;; esac
                break
            fi
        done
    done
    echo "${found# }"
}

as_root() {  # run a command as root: directly, or through password-less sudo
    if [ "$(id -u)" = 0 ]; then "$@"; else sudo -n "$@"; fi
}

install_packages() {  # apt-get install "$@", or one line naming them and exit 1
    if command -v apt-get >/dev/null 2>&1 && { [ "$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then
        echo "services: installing $*"
        # a fresh image has no package lists; an old one may name versions that are gone
        export DEBIAN_FRONTEND=noninteractive
        if as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null 2>&1 \
            || { as_root apt-get update -qq >/dev/null 2>&1 \
                && as_root apt-get install -y -qq --no-install-recommends "$@" >/dev/null; }; then
            return 0
        fi
        echo "services: apt-get could not install: $*" >&2
        exit 1
    fi
    echo "services: missing servers; install the packages: $* (e.g. sudo apt-get install $*)" >&2
    exit 1
}

# -- starting each service ------------------------------------------------------------------
start_redis() {
    mkdir -p /var/lib/redis /var/log/redis 2>/dev/null
    local dir=/var/lib/redis log=/var/log/redis/ci.log
    [ -w "$dir" ] || { dir=${TMPDIR:-/tmp}; log=$dir/asynclock-redis.log; }
    redis-server --daemonize yes --bind 127.0.0.1 -::1 --port 6379 --save "" --appendonly no \
        --dir "$dir" --logfile "$log"
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

# PostgreSQL: the first cluster of the newest installed version (created if there is none),
# with trust authentication on loopback: the test setup has no passwords.
pg_version() { ls /usr/lib/postgresql 2>/dev/null | sort -V | tail -n1; }
start_pg() {
    local version cluster hba
    version=$(pg_lsclusters -h 2>/dev/null | awk 'NR == 1 { print $1 }')
    cluster=$(pg_lsclusters -h 2>/dev/null | awk 'NR == 1 { print $2 }')
    if [ -z "$version" ]; then
        version=$(pg_version) cluster=main
        as_root pg_createcluster "$version" "$cluster" --port 5432 >/dev/null || return 1
    fi
    hba=/etc/postgresql/$version/$cluster/pg_hba.conf
    if ! grep -q '^host[[:space:]]\+all[[:space:]]\+all[[:space:]]\+127.0.0.1/32[[:space:]]\+trust' "$hba" 2>/dev/null; then
        # the first matching line wins: put loopback trust before the packaged scram lines
        as_root sed -i '1i host all all 127.0.0.1/32 trust\nhost all all ::1/128 trust' "$hba"
        as_root pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" reload 2>/dev/null
    fi
    pg_answers || as_root pg_ctlcluster --skip-systemctl-redirect "$version" "$cluster" start
    wait_for "PostgreSQL server" pg_answers || return 1
    psql -h 127.0.0.1 -U postgres -tc "SELECT 1 FROM pg_database WHERE datname = 'test'" 2>/dev/null | grep -q 1 \
        || psql -h 127.0.0.1 -U postgres -c "CREATE DATABASE test" >/dev/null
}

# PgBouncer in transaction pooling mode on 127.0.0.1:6432, in front of 127.0.0.1:5432. Its
# config, pid and log live in a directory of its own, never /etc; it refuses to run as root,
# so as root it runs as the `postgres` user.
PGBOUNCER_DIR=${ASYNCLOCK_PGBOUNCER_DIR:-/tmp/asynclock-pgbouncer}
pgbouncer_config() {
    cat <<EOF
;; written by .ci/services.sh: transaction pooling for the test suite, loopback only
[databases]
* = host=127.0.0.1 port=5432

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
unix_socket_dir =
auth_type = trust
auth_file = $PGBOUNCER_DIR/userlist.txt
pool_mode = transaction
;; few server connections for many clients, so the suite's transactions really move between
;; server connections (a named prepared statement would be lost on the next one)
default_pool_size = 4
max_client_conn = 500
logfile = $PGBOUNCER_DIR/pgbouncer.log
pidfile = $PGBOUNCER_DIR/pgbouncer.pid
admin_users = postgres
EOF
}
start_pgbouncer() {
    local run_as=()
    mkdir -p "$PGBOUNCER_DIR"
    printf '"postgres" ""\n' >"$PGBOUNCER_DIR/userlist.txt"
    pgbouncer_config >"$PGBOUNCER_DIR/pgbouncer.ini"
    if [ "$(id -u)" = 0 ]; then
        chown -R postgres "$PGBOUNCER_DIR"
        run_as=(runuser -u postgres --)
    fi
    if [ -s "$PGBOUNCER_DIR/pgbouncer.pid" ] && kill -0 "$(cat "$PGBOUNCER_DIR/pgbouncer.pid")" 2>/dev/null; then
        kill -HUP "$(cat "$PGBOUNCER_DIR/pgbouncer.pid")"  # running with an older config: reload
    else
        rm -f "$PGBOUNCER_DIR/pgbouncer.pid"
        "${run_as[@]}" pgbouncer -d -q "$PGBOUNCER_DIR/pgbouncer.ini"
    fi
}

# MariaDB: root may log in over TCP from loopback without a password (the test setup).
start_mysql() {
    as_root mkdir -p /run/mysqld /var/log/mysql
    as_root chown mysql:mysql /run/mysqld /var/log/mysql 2>/dev/null
    if [ ! -d /var/lib/mysql/mysql ]; then
        as_root mariadb-install-db --user=mysql --datadir=/var/lib/mysql >/dev/null || return 1
    fi
    mysql_answers || as_root start-stop-daemon --start --oknodo --background \
        --exec "$(command -v mariadbd)" -- --user=mysql
    if ! mysql_answers; then
        # a fresh install: root logs in over the socket only, as the OS root (unix_socket)
        wait_for "MariaDB socket" mysql_socket_root || return 1
        as_root mysql -uroot <<'SQL' || return 1
CREATE USER IF NOT EXISTS 'root'@'127.0.0.1' IDENTIFIED BY '';
GRANT ALL PRIVILEGES ON *.* TO 'root'@'127.0.0.1' WITH GRANT OPTION;
ALTER USER 'root'@'localhost' IDENTIFIED VIA unix_socket OR mysql_native_password USING PASSWORD('');
SQL
    fi
    mysql -h 127.0.0.1 -uroot -e "CREATE DATABASE IF NOT EXISTS test"
}
mysql_socket_root() { as_root mysql -uroot -e "SELECT 1" >/dev/null 2>&1 || mysql_answers; }

wait_for() {  # name, probe; waits at most 60 s
    local name=$1 probe=$2
    for _ in $(seq 1 120); do
        if $probe; then echo "services: $name is up"; return 0; fi
        sleep 0.5
    done
    echo "services: $name did not come up" >&2
    return 1
}

# -- main -----------------------------------------------------------------------------------
# the headless Chromium of tests/web (not a server: never fatal here, see .ci/browser.sh)
if [ "$CHECK_ONLY" = 1 ]; then
    bash "$(dirname "$0")/browser.sh" --check
else
    bash "$(dirname "$0")/browser.sh" || true
fi
down=""
for svc in $SERVICES; do
    "${svc}_up" || down="$down $svc"
done
if [ -z "$down" ]; then
    [ "$CHECK_ONLY" = 1 ] && echo "services: all up"
    exit 0  # everything is ready: the probes log into the databases `test`
fi
missing=$(missing_packages)
if [ "$CHECK_ONLY" = 1 ]; then
    echo "services: down:${down}${missing:+; would install: $missing}"
    exit 1
fi
# shellcheck disable=SC2086 - one argument per package
[ -n "$missing" ] && install_packages $missing

status=0
for svc in $down; do
    echo "services: starting $svc"
    "start_$svc" || true
    wait_for "$svc" "${svc}_up" || status=1
done
exit $status
