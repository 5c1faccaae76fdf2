#!/usr/bin/env bash
# dsec install: Debian 12, as root. Installs the apt packages dsec needs (etcd for fleets, its service disabled), the npm
# packages, builds the native parts (agent, addon, ...) and the TypeScript in this
# checkout, installs the build as a release of its own under /usr/local/lib/dsec with
# `dsec` and `dsecd` in /usr/local/bin and the configuration in /etc/dsec
# (scripts/install-release.sh: the installed host never reads this checkout), then
# (unless --no-demo) runs the main job: starts dsecd on the embedded defaults, creates a
# busybox sandbox, runs a command in it, prints the output and destroys the sandbox.
# dsecd is left running. Re-running it from a newer checkout upgrades: a running dsecd
# keeps its release until it is restarted.
#
#   bash scripts/install.sh [--no-demo]
set -euo pipefail
cd "$(dirname "$0")/.."
DEMO=1
[[ "${1:-}" == "--no-demo" ]] && DEMO=0

say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'install: %s\n' "$*" >&2; exit 1; }

[[ $(id -u) -eq 0 ]] || die "run as root (dsec creates mounts, cgroups and user namespaces)"
command -v node >/dev/null || die "Node.js 20.19+ is required (node not found)"
node -e 'const [a,b]=process.versions.node.split(".").map(Number); process.exit(a>20||(a===20&&b>=19)?0:1)' \
  || die "Node.js 20.19+ is required (found $(node --version))"

# Apt packages: the OCI runtime, EROFS tools, busybox for the built-in image (and
# bash-static for the E2B base template on top of it: /bin/bash for E2B's SDKs), a C
# toolchain with a static libc for the agent, util-linux(-extra: fincore)/iproute2 for
# tests, podman and bubblewrap as benchmark peers, systemd for `systemd-analyze verify`,
# debootstrap for the Debian base image, zstd and attr for layer import, criu so that
# process checkpoints are offered where `criu check` passes, apparmor for apparmor_parser
# (per-sandbox profiles are compiled everywhere and loaded only where the kernel has AppArmor),
# clang, libbpf-dev and bpftool for the eBPF programs (egress policy, denial counters),
# slirp4netns and nftables for sandbox networking (in a network namespace of dsec's own),
# btrfs-progs and xfsprogs for the writable-layer filesystem with per-sandbox quotas,
# qemu-system-x86 and qemu-utils for the microvm and vm tiers (e2fsprogs formats their disks; seabios is the
# vm tier's q35 firmware, named so a minimal install that skips recommends still has it),
# python3-venv for the Python client's offline install into a venv (sdk/python, its tests).
PKGS=(runc crun erofs-utils busybox-static bash-static gcc make libc6-dev g++ python3 python3-venv util-linux util-linux-extra iproute2 podman bubblewrap systemd uidmap
      debootstrap zstd attr criu apparmor clang llvm libbpf-dev bpftool slirp4netns nftables btrfs-progs xfsprogs
      qemu-system-x86 qemu-utils e2fsprogs seabios)
missing=()
for p in "${PKGS[@]}"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
if ((${#missing[@]})); then
  say "apt-get install ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# etcd for fleets (docs/OPERATIONS.md "A fleet"): Debian's etcd-server and etcd-client (3.4).
# The package enables and starts an etcd without authentication on 127.0.0.1:2379 (a
# systemd unit, or its init script where PID 1 is not systemd); dsec runs etcd only where
# a fleet is configured, with TLS and users, so the packaged service is kept from
# starting at install (a policy-rc.d that denies starts, for this install only, when the
# host has none) and disabled afterwards.
if ! dpkg-query -W -f='${Status}' etcd-server 2>/dev/null | grep -q "ok installed"; then
  say "apt-get install etcd-server etcd-client (its service stays disabled)"
  export DEBIAN_FRONTEND=noninteractive
  made_policy=0
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\n# dsec install: no service starts while packages install\nexit 101\n' > /usr/sbin/policy-rc.d
    chmod 755 /usr/sbin/policy-rc.d
    made_policy=1
  fi
  apt-get install -y -qq --no-install-recommends etcd-server etcd-client >/dev/null || { ((made_policy)) && rm -f /usr/sbin/policy-rc.d; die "apt-get install etcd-server etcd-client failed"; }
  ((made_policy)) && rm -f /usr/sbin/policy-rc.d
fi
if [[ -d /run/systemd/system ]]; then
  if systemctl is-enabled --quiet etcd.service 2>/dev/null || systemctl is-active --quiet etcd.service 2>/dev/null; then
    say "disabling the packaged etcd.service (unauthenticated; a fleet runs its own etcd)"
    systemctl disable --now etcd.service >/dev/null 2>&1 || true
  fi
elif [[ -x /etc/init.d/etcd ]]; then
  # Without systemd: stop the init script's etcd if it runs, and keep it from starting at boot.
  /etc/init.d/etcd status >/dev/null 2>&1 && /etc/init.d/etcd stop >/dev/null 2>&1 || true
  update-rc.d etcd disable >/dev/null 2>&1 || true
fi

if [[ ! -d node_modules || package-lock.json -nt node_modules/.package-lock.json ]]; then
  say "npm ci"
  npm ci --no-audit --no-fund --loglevel=error
fi

# The microvm tier's guest kernel: Debian bookworm's 6.12 kernel package, unpacked into a dsec-owned
# directory (never installed into the host's /boot); [vm] kernel and [vm] modules default to it.
bash scripts/guest-kernel.sh

say "building native agent and addon"
make -s -C native
say "building TypeScript"
npx tsc -p tsconfig.json

say "installing the release"
if [[ -d /run/systemd/system ]]; then
  bash scripts/install-release.sh --unitdir /etc/systemd/system
  systemctl daemon-reload
else
  bash scripts/install-release.sh
fi
getent group dsec >/dev/null || groupadd --system dsec

[[ $DEMO -eq 1 ]] || exit 0

PATH=/usr/local/bin:$PATH
# `dsec ls` exits 125 when no daemon answers on the socket.
if ! dsec ls >/dev/null 2>&1; then
  if [[ -d /run/systemd/system ]]; then
    say "starting dsecd (systemctl start dsecd)"
    systemctl enable --now dsecd
  else
    say "starting dsecd in the background (log: /var/log/dsecd.log; stop: kill \$(cat /run/dsec/dsecd.pid))"
    mkdir -p /run/dsec
    nohup /usr/local/bin/dsecd >>/var/log/dsecd.log 2>&1 &
    echo $! > /run/dsec/dsecd.pid
  fi
  for _ in $(seq 1 300); do dsec ls >/dev/null 2>&1 && break; sleep 0.1; done
  dsec ls >/dev/null 2>&1 || die "dsecd did not come up; see /var/log/dsecd.log (or journalctl -u dsecd)"
fi

say "dsec run --image busybox -- sh -c 'echo hello from \$(hostname); uname -a; id'"
dsec run --image busybox -- sh -c 'echo hello from $(hostname); uname -a; id'
say "done. Try: dsec create --image busybox; dsec ls; dsec exec ID -- sh -c 'ls /'; dsec rm -f ID"
