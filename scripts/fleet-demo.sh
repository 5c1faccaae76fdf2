#!/usr/bin/env bash
# A whole dsec fleet on one machine, for trying it, tests and benchmarks alike:
#
#   bash scripts/fleet-demo.sh up DIR     # prints `export DSEC_HOST=... DSEC_CA=... DSEC_TOKEN=...`
#   eval "$(bash scripts/fleet-demo.sh up /tmp/fleet)"; dsec hosts; dsec create ...
#   bash scripts/fleet-demo.sh down DIR   # stops and removes everything `up` made
#
# `up` makes, all of it under DIR:
# - a fleet CA and certificates (dsec fleet ca / dsec fleet cert): etcd's, hosts h1 h2 h3,
#   gateway gw1, and `root` (etcd's administrator);
# - a bridge in a network namespace of its own (<ns>-br, 10.88.0.1/24) and a namespace per
#   member joined to it by a veth pair (gw1 .2, h1 .11, h2 .12, h3 .13): nothing is added
#   to the host's network namespace (no interface, route, sysctl or firewall rule);
# - etcd on the bridge (https://10.88.0.1:2379) with TLS, client-certificate
#   authentication and users named by certificate CN: each host may write only its own
#   registration (hosts/<name>/), only the gateway reads token hashes (docs/ARCHITECTURE.md
#   "The fleet" has the key layout);
# - three dsecd hosts, each in its namespace, with its own root, socket, instance, uid pool
#   and builder range (leased like the tests' daemons: /tmp/dsec-test-slots), their pids in
#   DIR/h1.pid ...;
# - the gateway in its namespace, and a forwarder from 127.0.0.1:PORT of the host's
#   namespace to it (through a Unix socket, which crosses namespaces);
# - a user token of tenant `demo` (and DIR/admin.token, an admin token).
# Run from a built checkout (make -C native; npx tsc), as root, with etcd installed
# (scripts/install.sh installs Debian's etcd-server and etcd-client).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
die() { printf 'fleet-demo: %s\n' "$*" >&2; exit 1; }
say() { printf 'fleet-demo: %s\n' "$*" >&2; }
[[ $# -eq 2 && ( $1 == up || $1 == down ) ]] || die "usage: fleet-demo.sh up|down DIR"
CMD=$1
DIR=$(realpath -m "$2")
HOSTS=(h1 h2 h3)
SUBNET=10.88.0
PREFIX=/dsec
SLOT_DIR=/tmp/dsec-test-slots

[[ $(id -u) -eq 0 ]] || die "run as root (dsecd creates mounts, cgroups and user namespaces; namespaces need root)"

# Namespace names: a short prefix derived from DIR, so two demos in two DIRs do not meet.
NS=dd$(printf '%s' "$DIR" | sha256sum | cut -c1-6)
ns() { echo "$NS-$1"; }
in_ns() { local n=$1; shift; nsenter --net="/run/netns/$(ns "$n")" "$@"; }
hostaddr() { local i; for i in "${!HOSTS[@]}"; do if [[ ${HOSTS[$i]} == "$1" ]]; then echo "$SUBNET.$((11 + i))"; fi; done; }
etcdctl_root() {
  in_ns br etcdctl --endpoints="https://$SUBNET.1:2379" --cacert="$DIR/ca/ca.crt" --cert="$DIR/certs/root.crt" --key="$DIR/certs/root.key" "$@"
}

# A uid-pool slot (test/fixtures/slots.ts): a file created exclusively, holding the pid of
# its holder; a file whose pid is gone is free. Prints the slot number.
lease_slot() {
  mkdir -p "$SLOT_DIR"
  local s pid
  for s in $(seq 118 -1 0); do
    if (set -o noclobber; echo $$ > "$SLOT_DIR/$s") 2>/dev/null; then echo "$s"; return; fi
    pid=$(cat "$SLOT_DIR/$s" 2>/dev/null || echo 0)
    if [[ $pid -gt 0 ]] && ! kill -0 "$pid" 2>/dev/null; then
      rm -f "$SLOT_DIR/$s"
      if (set -o noclobber; echo $$ > "$SLOT_DIR/$s") 2>/dev/null; then echo "$s"; return; fi
    fi
  done
  die "no free uid-pool slot in $SLOT_DIR"
}
pool_base() { local s=$1; if ((s < 63)); then echo $((3 * (1 << 30) + s * (1 << 24))); else echo $(((1 << 30) + (s - 63) * (1 << 24))); fi; }
builder_base() { echo $(((1 << 30) + 56 * (1 << 24) + $1 * (1 << 20))); }

# Starts a command in the background detached from this shell, its pid in $1.
start_bg() {
  local pidfile=$1 log=$2; shift 2
  setsid "$@" >>"$log" 2>&1 < /dev/null &
  echo $! > "$pidfile"
}

up() {
  [[ ! -e $DIR/state ]] || die "$DIR holds a fleet already: fleet-demo.sh down $DIR first"
  command -v etcd >/dev/null && command -v etcdctl >/dev/null || die "etcd is not installed: run scripts/install.sh (or apt-get install etcd-server etcd-client)"
  [[ -f dist/gateway/main.js && -f dist/daemon/main.js ]] || die "build this checkout first: make -C native && npx tsc -p tsconfig.json"
  mkdir -p "$DIR"/certs
  echo up > "$DIR/state"
  echo "$NS" > "$DIR/netns-prefix"
  local DSEC=(node "$REPO/bin/dsec")
  say "certificates (fleet CA in $DIR/ca)"
  "${DSEC[@]}" fleet ca "$DIR/ca" >/dev/null
  "${DSEC[@]}" fleet cert --ca "$DIR/ca" --role host --name etcd --san "$SUBNET.1" --days 30 --out "$DIR/certs/etcd" >/dev/null
  "${DSEC[@]}" fleet cert --ca "$DIR/ca" --role client --name root --days 30 --out "$DIR/certs/root" >/dev/null
  local h
  for h in "${HOSTS[@]}"; do "${DSEC[@]}" fleet cert --ca "$DIR/ca" --role host --name "$h" --san "$(hostaddr "$h")" --days 30 --out "$DIR/certs/$h" >/dev/null; done
  "${DSEC[@]}" fleet cert --ca "$DIR/ca" --role gateway --name gw1 --san "$SUBNET.2" --san 127.0.0.1 --days 30 --out "$DIR/certs/gw1" >/dev/null

  say "network namespaces $NS-* and a bridge in $(ns br)"
  ip netns add "$(ns br)"
  ip -n "$(ns br)" link set lo up
  ip -n "$(ns br)" link add br0 type bridge
  ip -n "$(ns br)" addr add "$SUBNET.1/24" dev br0
  ip -n "$(ns br)" link set br0 up
  local m addr
  for m in gw1 "${HOSTS[@]}"; do
    if [[ $m == gw1 ]]; then addr=$SUBNET.2; else addr=$(hostaddr "$m"); fi
    ip netns add "$(ns "$m")"
    ip -n "$(ns "$m")" link set lo up
    ip -n "$(ns br)" link add "v-$m" type veth peer name eth0 netns "$(ns "$m")"
    ip -n "$(ns br)" link set "v-$m" master br0 up
    ip -n "$(ns "$m")" addr add "$addr/24" dev eth0
    ip -n "$(ns "$m")" link set eth0 up
  done

  say "etcd on https://$SUBNET.1:2379 (TLS, client certificates, users and roles)"
  mkdir -p "$DIR/etcd"
  start_bg "$DIR/etcd.pid" "$DIR/etcd/etcd.log" nsenter --net="/run/netns/$(ns br)" etcd --name etcd --data-dir "$DIR/etcd/data" \
    --listen-client-urls "https://$SUBNET.1:2379" --advertise-client-urls "https://$SUBNET.1:2379" \
    --listen-peer-urls "http://$SUBNET.1:2380" --initial-advertise-peer-urls "http://$SUBNET.1:2380" --initial-cluster "etcd=http://$SUBNET.1:2380" \
    --cert-file "$DIR/certs/etcd.crt" --key-file "$DIR/certs/etcd.key" --client-cert-auth --trusted-ca-file "$DIR/ca/ca.crt" \
    --logger zap --log-outputs stderr --log-level warn
  local i
  for i in $(seq 1 100); do etcdctl_root endpoint health >/dev/null 2>&1 && break; sleep 0.2; done
  etcdctl_root endpoint health >/dev/null 2>&1 || die "etcd did not come up; see $DIR/etcd/etcd.log"
  local P=$PREFIX/v1/
  etcdctl_root user add root --no-password >/dev/null
  etcdctl_root user grant-role root root >/dev/null
  etcdctl_root role add dsec-gateway >/dev/null
  etcdctl_root role grant-permission dsec-gateway read "$P" --prefix=true >/dev/null
  local sub
  for sub in hosts/ cordons/ tokens/ token-meta/ revoked/ idempotency/ quotas/; do etcdctl_root role grant-permission dsec-gateway readwrite "$P$sub" --prefix=true >/dev/null; done
  etcdctl_root user add gw1 --no-password >/dev/null
  etcdctl_root user grant-role gw1 dsec-gateway >/dev/null
  for h in "${HOSTS[@]}"; do
    etcdctl_root role add "dsec-host-$h" >/dev/null
    etcdctl_root role grant-permission "dsec-host-$h" readwrite "${P}hosts/$h/" --prefix=true >/dev/null
    etcdctl_root role grant-permission "dsec-host-$h" readwrite "${P}revoked/" --prefix=true >/dev/null
    etcdctl_root role grant-permission "dsec-host-$h" read "${P}token-meta/" --prefix=true >/dev/null
    etcdctl_root user add "$h" --no-password >/dev/null
    etcdctl_root user grant-role "$h" "dsec-host-$h" >/dev/null
  done
  etcdctl_root auth enable >/dev/null

  for h in "${HOSTS[@]}"; do
    local s root=$DIR/$h
    s=$(lease_slot)
    mkdir -p "$root"
    echo "$s" > "$DIR/$h.slot"
    printf '[uid_pool]\nbase = %d\nsize = %d\n[builder]\nbase = %d\nsize = %d\n' "$(pool_base "$s")" $((1 << 24)) "$(builder_base "$s")" $((1 << 20)) > "$root/dsecd.toml"
    say "dsecd $h in $(ns "$h") at https://$(hostaddr "$h"):8443 (root $root, uid-pool slot $s)"
    start_bg "$DIR/$h.pid" "$root/dsecd.log" nsenter --net="/run/netns/$(ns "$h")" "$REPO/bin/dsecd" --root "$root" --socket "$root/dsecd.sock" --config "$root/dsecd.toml" \
      --listen "$(hostaddr "$h"):8443" --tls-cert "$DIR/certs/$h.crt" --tls-key "$DIR/certs/$h.key" --tls-ca "$DIR/ca/ca.crt" \
      --etcd "https://$SUBNET.1:2379" --etcd-prefix "$PREFIX" --host-name "$h"
    # The slot's lease now lives as long as this dsecd.
    cat "$DIR/$h.pid" > "$SLOT_DIR/$s"
  done
  for h in "${HOSTS[@]}"; do
    for i in $(seq 1 600); do curl -sf --unix-socket "$DIR/$h/dsecd.sock" http://dsecd/v1/version >/dev/null 2>&1 && break; kill -0 "$(cat "$DIR/$h.pid")" 2>/dev/null || die "dsecd $h exited; see $DIR/$h/dsecd.log"; sleep 0.2; done
  done

  say "gateway gw1 in $(ns gw1) at https://$SUBNET.2:8443"
  local GW=(--tls-cert "$DIR/certs/gw1.crt" --tls-key "$DIR/certs/gw1.key" --tls-ca "$DIR/ca/ca.crt" --etcd "https://$SUBNET.1:2379" --etcd-prefix "$PREFIX")
  start_bg "$DIR/gateway.pid" "$DIR/gateway.log" nsenter --net="/run/netns/$(ns gw1)" node "$REPO/bin/dsec-gateway" --listen "$SUBNET.2:8443" "${GW[@]}"
  for i in $(seq 1 300); do grep -q 'dsec-gateway ready' "$DIR/gateway.log" 2>/dev/null && break; kill -0 "$(cat "$DIR/gateway.pid")" 2>/dev/null || die "the gateway exited; see $DIR/gateway.log"; sleep 0.2; done
  start_bg "$DIR/forward-inner.pid" "$DIR/forward-inner.log" nsenter --net="/run/netns/$(ns gw1)" node "$REPO/scripts/fleet-forward.mjs" "unix:$DIR/gateway.sock" "$SUBNET.2:8443"
  for i in $(seq 1 100); do [[ -S $DIR/gateway.sock ]] && break; sleep 0.1; done
  start_bg "$DIR/forward-outer.pid" "$DIR/forward-outer.log" node "$REPO/scripts/fleet-forward.mjs" 127.0.0.1:0 "unix:$DIR/gateway.sock"
  local port=''
  for i in $(seq 1 100); do port=$(sed -n 's/^127\.0\.0\.1:\([0-9]*\)$/\1/p' "$DIR/forward-outer.log" 2>/dev/null | head -1); [[ -n $port ]] && break; sleep 0.1; done
  [[ -n $port ]] || die "the forwarder did not start; see $DIR/forward-outer.log"

  local token admin
  token=$(in_ns gw1 node "$REPO/bin/dsec-gateway" token create --tenant demo --role user --description 'fleet-demo user' "${GW[@]}")
  admin=$(in_ns gw1 node "$REPO/bin/dsec-gateway" token create --tenant system --role admin --description 'fleet-demo admin' "${GW[@]}")
  (umask 077; echo "$admin" > "$DIR/admin.token"; echo "$token" > "$DIR/user.token")
  echo "export DSEC_HOST=https://127.0.0.1:$port DSEC_CA=$DIR/ca/ca.crt DSEC_TOKEN=$token"
  say "up. An admin token (dsec hosts cordon/drain, tokens) is in $DIR/admin.token; stop with: bash scripts/fleet-demo.sh down $DIR"
}

# Stops a process by the pid in a file (SIGTERM, then SIGKILL after 30 s).
stop_pidfile() {
  local f=$1 pid i
  [[ -f $f ]] || return 0
  pid=$(cat "$f")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    for i in $(seq 1 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -0 "$pid" 2>/dev/null && kill -KILL "$pid" 2>/dev/null || true
  fi
  rm -f "$f"
}

down() {
  [[ -d $DIR ]] || die "$DIR does not exist"
  [[ -f $DIR/netns-prefix ]] && NS=$(cat "$DIR/netns-prefix")
  stop_pidfile "$DIR/forward-outer.pid"
  stop_pidfile "$DIR/forward-inner.pid"
  stop_pidfile "$DIR/gateway.pid"
  local h pid s
  for h in "${HOSTS[@]}"; do
    pid=$(cat "$DIR/$h.pid" 2>/dev/null || echo 0)
    stop_pidfile "$DIR/$h.pid"
    # Sandboxes outlive dsecd: purge destroys them and removes the instance's mounts, cgroups and store.
    if [[ -d $DIR/$h && -f $DIR/$h/dsecd.toml ]]; then
      "$REPO/bin/dsecd" --root "$DIR/$h" --socket "$DIR/$h/dsecd.sock" --config "$DIR/$h/dsecd.toml" --purge >>"$DIR/$h/dsecd.log" 2>&1 \
        || say "purge of $h failed; see $DIR/$h/dsecd.log"
    fi
    s=$(cat "$DIR/$h.slot" 2>/dev/null || echo)
    if [[ -n $s && -f $SLOT_DIR/$s && $(cat "$SLOT_DIR/$s") == "$pid" ]]; then rm -f "$SLOT_DIR/$s"; fi
  done
  stop_pidfile "$DIR/etcd.pid"
  local m
  for m in gw1 "${HOSTS[@]}" br; do ip netns del "$(ns "$m")" 2>/dev/null || true; done
  # Anything of DIR still mounted (a purge that failed) is unmounted lazily before removal.
  { grep " $DIR/" /proc/self/mountinfo || true; } | awk '{print $5}' | sort -r | while read -r mnt; do umount -l "$mnt" 2>/dev/null || true; done
  rm -rf "$DIR"
  say "down: $DIR removed"
}

"$CMD"
