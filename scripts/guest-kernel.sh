#!/usr/bin/env bash
# Fetches the guest kernel of the microvm and vm tiers from the Debian archive the host
# already uses, downloaded with `apt-get download` and unpacked with `dpkg-deb -x` into a
# dsec-owned directory. It is never installed into the host's /boot or /lib/modules.
#
#   bash scripts/guest-kernel.sh [--series 6.12|6.1] [DEST]
#        (default series 6.12; default DEST /usr/local/lib/dsec/guest)
#
# Series:
#   6.12  Debian bookworm's backported 6.12 kernel, the default: the current dependency of
#         the metapackage linux-image-6.12-amd64 (e.g. linux-image-6.12.118+deb12-amd64),
#         taken as its `-unsigned` package (the same kernel and modules without the Secure
#         Boot signing wrapper). It has DAMON (vaddr, paddr, sysfs, DAMON_RECLAIM,
#         DAMON_LRU_SORT), page reporting, virtio-balloon, virtio-pmem and zswap, which the
#         guest-side reclaim (native/agent/damon.c) needs.
#   6.1   bookworm's own kernel (the metapackage linux-image-amd64, e.g.
#         linux-image-6.1.0-57-amd64); built without DAMON.
#
# Result (what dsecd's [vm] kernel and [vm] modules default to):
#   DEST/vmlinuz  -> <package>/boot/vmlinuz-<release>
#   DEST/modules  -> <package>/lib/modules/<release>
# Packages of other series already unpacked in DEST stay beside it, so `[vm] kernel` and
# `[vm] modules` can name one directly (DEST/<package>/boot/vmlinuz-<release>,
# DEST/<package>/lib/modules/<release>). Re-running is cheap when the current package is
# already unpacked.
set -euo pipefail
SERIES=6.12
DEST=
while [[ $# -gt 0 ]]; do
  case "$1" in
    --series) SERIES=${2:?--series needs 6.12 or 6.1}; shift 2 ;;
    --series=*) SERIES=${1#--series=}; shift ;;
    -*) printf 'guest-kernel: unknown option %s\n' "$1" >&2; exit 2 ;;
    *) DEST=$1; shift ;;
  esac
done
DEST=${DEST:-/usr/local/lib/dsec/guest}
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'guest-kernel: %s\n' "$*" >&2; exit 1; }
command -v apt-get >/dev/null || die "apt-get not found: install a guest kernel by hand and set [vm] kernel and [vm] modules"

case "$SERIES" in
  6.12) META=linux-image-6.12-amd64 SUFFIX=-unsigned ;;
  6.1) META=linux-image-amd64 SUFFIX= ;;
  *) die "unknown series $SERIES (6.12 or 6.1)" ;;
esac

# The metapackage names the current kernel package as its dependency.
dep() { apt-cache depends "$META" 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}'; }
BASE=$(dep)
if [[ -z "$BASE" ]]; then
  apt-get update -qq
  BASE=$(dep)
fi
[[ -n "$BASE" ]] || die "apt-cache does not know $META (is Debian bookworm's archive, with its updates suite, configured?)"
REL=${BASE#linux-image-}
PKG=$BASE$SUFFIX
if [[ -f "$DEST/$PKG/boot/vmlinuz-$REL" && -d "$DEST/$PKG/lib/modules/$REL/kernel" ]]; then
  say "guest kernel $PKG already in $DEST"
else
  say "fetching guest kernel $PKG into $DEST"
  mkdir -p "$DEST"
  TMP=$(mktemp -d "$DEST/.fetch.XXXXXX")
  chmod 0755 "$TMP" # apt-get download drops to user _apt, which must reach it
  trap 'rm -rf "$TMP"' EXIT
  (cd "$TMP" && apt-get download -q "$PKG" >/dev/null)
  DEB=$(ls "$TMP"/*.deb)
  dpkg-deb -x "$DEB" "$TMP/root"
  [[ -f "$TMP/root/boot/vmlinuz-$REL" ]] || die "$DEB has no boot/vmlinuz-$REL"
  [[ -d "$TMP/root/lib/modules/$REL/kernel" ]] || die "$DEB has no lib/modules/$REL/kernel"
  rm -rf "${DEST:?}/$PKG"
  mv "$TMP/root" "$DEST/$PKG"
fi
ln -sfn "$PKG/boot/vmlinuz-$REL" "$DEST/vmlinuz.tmp" && mv -T "$DEST/vmlinuz.tmp" "$DEST/vmlinuz"
ln -sfn "$PKG/lib/modules/$REL" "$DEST/modules.tmp" && mv -T "$DEST/modules.tmp" "$DEST/modules"
say "guest kernel: $DEST/vmlinuz ($REL)"
