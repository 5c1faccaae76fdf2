#!/usr/bin/env bash
# Installs this (already built) checkout as a release of its own, so that an installed
# dsecd never reads the checkout: moving, rebuilding or deleting the checkout leaves the
# host running. scripts/install.sh builds and then calls this; the test suite keeps using
# the checkout's own build (bin/dsecd, dist/), never the installed one.
#
#   bash scripts/install-release.sh [--prefix DIR] [--sysconfdir DIR] [--unitdir DIR]
#
# Layout (PREFIX default /usr/local, SYSCONFDIR default /etc):
#   PREFIX/lib/dsec/releases/<version>-<hash>/  one release, never changed once installed:
#       package.json, bin/, dist/{daemon,cli,sdk}/, node_modules/ (production dependencies
#       only), native/ (agent, addon, seccomp monitor, VMM launcher, builder tools, BPF
#       objects, syscall table), daemon/security/profiles/ (seccomp, AppArmor, network
#       policies). <hash> is of the release's content, so re-installing the same build
#       changes nothing.
#   PREFIX/lib/dsec/current -> releases/<id>    switched by renaming a new symlink over it
#   PREFIX/bin/dsec, PREFIX/bin/dsecd -> ../lib/dsec/current/bin/<name>
#   SYSCONFDIR/dsec/dsecd.toml                  a commented template (etc/dsecd.toml),
#       installed when missing; replaced on upgrade only while it is still the template
#       this script installed last; once edited it is kept and the new template goes
#       beside it as dsecd.toml.dist
#   SYSCONFDIR/dsec/network-policies/           the operator's network policy files
#   UNITDIR/dsecd.service                       with --unitdir only: systemd/dsecd.service
#       with ExecStart at PREFIX/bin/dsecd (run `systemctl daemon-reload` after a change)
#
# Upgrades: Node resolves PREFIX/bin/dsecd to the real path of the release before it loads
# anything, so a running dsecd keeps reading the release it started from; the new one is
# used from its next start (`systemctl restart dsecd`: sandboxes keep running and are
# adopted). Releases other than the new one, the one it replaced and any a running process
# still maps (its addon or a binary) are removed.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$(pwd)
PREFIX=/usr/local
SYSCONFDIR=/etc
UNITDIR=
while (($#)); do
  case "$1" in
    --prefix) PREFIX=$2; shift 2 ;;
    --sysconfdir) SYSCONFDIR=$2; shift 2 ;;
    --unitdir) UNITDIR=$2; shift 2 ;;
    *) printf 'install-release: unknown option %s\nusage: install-release.sh [--prefix DIR] [--sysconfdir DIR] [--unitdir DIR]\n' "$1" >&2; exit 2 ;;
  esac
done
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'install-release: %s\n' "$*" >&2; exit 1; }
mkdir -p "$PREFIX" "$SYSCONFDIR"
PREFIX=$(realpath "$PREFIX")
SYSCONFDIR=$(realpath "$SYSCONFDIR")
LIB=$PREFIX/lib/dsec

# What a release holds besides dist/ and node_modules/: built files (native/) and data.
NATIVE_EXE=(native/agent/dsec-agent native/seccomp-monitor/dsec-seccomp-monitor native/vmm/dsec-vmm-launch native/oci-exec/dsec-oci-exec native/builder/dsec-builder)
NATIVE_DATA=(native/addon/build/Release/dsec_native.node native/builder/libdsec-mkfs.so native/seccomp-monitor/syscalls.json)
missing=()
for f in package.json package-lock.json bin/dsec bin/dsecd bin/dsec-gateway dist/daemon/main.js dist/cli/main.js dist/gateway/main.js dist/sdk dist/pki node_modules/.package-lock.json \
  "${NATIVE_EXE[@]}" "${NATIVE_DATA[@]}" daemon/security/profiles/seccomp-default.json etc/dsecd.toml systemd/dsecd.service systemd/dsec-gateway.service; do
  [[ -e $f ]] || missing+=("$f")
done
compgen -G 'native/bpf/build/*.o' >/dev/null || missing+=(native/bpf/build/*.o)
((${#missing[@]} == 0)) || die "the checkout is not built (missing: ${missing[*]}); run: make -C native && npx tsc -p tsconfig.json (or bash scripts/install.sh)"
VERSION=$(node -p 'require("./package.json").version')

mkdir -p "$LIB/releases" "$PREFIX/bin"
STAGE=$(mktemp -d "$LIB/releases/.stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
say "staging release from $REPO"
cp package.json package-lock.json "$STAGE/"
mkdir -p "$STAGE/bin" "$STAGE/dist" "$STAGE/daemon/security"
cp bin/dsec bin/dsecd bin/dsec-gateway "$STAGE/bin/"
cp -R dist/daemon dist/cli dist/sdk dist/gateway dist/pki "$STAGE/dist/"
cp -R daemon/security/profiles "$STAGE/daemon/security/"
for f in "${NATIVE_EXE[@]}"; do install -D -m 0755 "$f" "$STAGE/$f"; done
for f in "${NATIVE_DATA[@]}"; do install -D -m 0644 "$f" "$STAGE/$f"; done
mkdir -p "$STAGE/native/bpf/build"
install -m 0644 native/bpf/build/*.o "$STAGE/native/bpf/build/"
# node_modules may be a symlink (a worktree sharing another's): copy what it points to.
# Caches of dev tools (.vite, .cache) are not part of a release.
mkdir "$STAGE/node_modules"
cp -R node_modules/. "$STAGE/node_modules/"
find "$STAGE/node_modules" -mindepth 1 -maxdepth 1 -name '.*' ! -name .bin ! -name .package-lock.json -exec rm -rf {} +
(cd "$STAGE" && npm prune --omit=dev --offline --no-audit --no-fund --loglevel=error >/dev/null)
# The builder identity (an unprivileged uid) runs dist/daemon/image/builder-worker.js with
# these node_modules: everything is readable by all, writable by root only.
chmod -R u+rwX,go+rX,go-w "$STAGE"
dangling=$(find "$STAGE" -xtype l)
[[ -z $dangling ]] || die "dangling symlinks in the release: $(head -3 <<<"$dangling")"
while IFS= read -r l; do
  case "$(realpath "$l")" in "$STAGE"/*) ;; *) die "$l points outside the release ($(realpath "$l"))" ;; esac
done < <(find "$STAGE" -type l)

# Content hash: names, modes, symlink targets and bytes, not times or owners.
HASH=$(tar -C "$STAGE" --sort=name --mtime=@0 --owner=0 --group=0 --numeric-owner --format=gnu -cf - . | sha256sum | cut -c1-12)
ID=$VERSION-$HASH
if [[ -d $LIB/releases/$ID ]]; then
  say "release $ID is installed already"
else
  chmod 0755 "$STAGE"
  mv -T "$STAGE" "$LIB/releases/$ID"
  say "installed release $ID"
fi

PREV=$(readlink "$LIB/current" 2>/dev/null || true)
ln -sfn "releases/$ID" "$LIB/.current.tmp"
mv -T "$LIB/.current.tmp" "$LIB/current"
for b in dsec dsecd dsec-gateway; do
  ln -sfn "../lib/dsec/current/bin/$b" "$PREFIX/bin/.$b.tmp"
  mv -T "$PREFIX/bin/.$b.tmp" "$PREFIX/bin/$b"
done

# User-editable configuration: never overwrite an edited file.
ETC=$SYSCONFDIR/dsec
mkdir -p "$ETC/network-policies"
SUMS=$LIB/installed-config.sha256
installed_sum() { [[ -f $SUMS ]] && awk -v f="$1" '$2 == f { print $1 }' "$SUMS" || true; }
record_sum() {
  local f=$1 s
  s=$(sha256sum < "$f" | cut -d' ' -f1)
  { [[ -f $SUMS ]] && awk -v f="$f" '$2 != f' "$SUMS"; echo "$s $f"; } > "$SUMS.tmp"
  mv -T "$SUMS.tmp" "$SUMS"
}
dst=$ETC/dsecd.toml
if [[ ! -e $dst ]]; then
  install -m 0644 etc/dsecd.toml "$dst"
  record_sum "$dst"
elif ! cmp -s etc/dsecd.toml "$dst"; then
  if [[ "$(sha256sum < "$dst" | cut -d' ' -f1)" == "$(installed_sum "$dst")" ]]; then
    install -m 0644 etc/dsecd.toml "$dst"
    record_sum "$dst"
  else
    install -m 0644 etc/dsecd.toml "$dst.dist"
    say "kept your edited $dst; this release's template is $dst.dist"
  fi
fi

if [[ -n $UNITDIR ]]; then
  mkdir -p "$UNITDIR"
  # dsec-gateway.service is installed but never enabled here: a gateway runs only where a fleet is set up.
  for unit in dsecd dsec-gateway; do
    sed "s#^ExecStart=/usr/local/bin/$unit #ExecStart=$PREFIX/bin/$unit #" "systemd/$unit.service" > "$UNITDIR/.$unit.service.tmp"
    if cmp -s "$UNITDIR/.$unit.service.tmp" "$UNITDIR/$unit.service"; then
      rm -f "$UNITDIR/.$unit.service.tmp"
    else
      chmod 0644 "$UNITDIR/.$unit.service.tmp"
      mv -T "$UNITDIR/.$unit.service.tmp" "$UNITDIR/$unit.service"
      say "installed $UNITDIR/$unit.service (run: systemctl daemon-reload)"
    fi
  done
fi

# Processes that map a file of a release (dsecd maps its addon, the seccomp monitor is a
# binary of it) still need that release.
RELEASES=$(realpath "$LIB/releases")
users_of() {
  local d=$RELEASES/$1/ p
  for p in /proc/[0-9]*; do
    grep -qsF "$d" "$p/maps" 2>/dev/null && echo "${p#/proc/}"
  done
  return 0
}
for r in "$LIB"/releases/*/; do
  r=$(basename "$r")
  [[ $r == "$ID" || "releases/$r" == "$PREV" ]] && continue
  pids=$(users_of "$r")
  if [[ -n $pids ]]; then
    say "kept release $r: still used by pid $(echo $pids)"
  else
    rm -rf "${LIB:?}/releases/$r"
  fi
done
if [[ -n $PREV && $PREV != "releases/$ID" && -d $LIB/$PREV ]]; then
  pids=$(users_of "$(basename "$PREV")")
  [[ -z $pids ]] || say "pid $(echo $pids) still runs release $(basename "$PREV"); restart dsecd (systemctl restart dsecd) to run $ID: sandboxes keep running and are adopted"
fi
say "dsec $ID: $LIB/current; dsec and dsecd in $PREFIX/bin; configuration in $ETC"
