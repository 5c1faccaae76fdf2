#!/usr/bin/env bash
# Fetches the guest kernel of the microvm tier: Debian's linux-image-amd64 (the
# metapackage's current dependency, e.g. linux-image-6.1.0-57-amd64), downloaded with
# `apt-get download` and unpacked with `dpkg-deb -x` into a dsec-owned directory. It is
# never installed into the host's /boot or /lib/modules.
#
#   bash scripts/guest-kernel.sh [DEST]        (default DEST: /usr/local/lib/dsec/guest)
#
# Result (what dsecd's [vm] kernel and [vm] modules default to):
#   DEST/vmlinuz  -> <package>/boot/vmlinuz-<release>
#   DEST/modules  -> <package>/lib/modules/<release>
# Re-running is cheap when the current package is already unpacked.
set -euo pipefail
DEST=${1:-/usr/local/lib/dsec/guest}
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'guest-kernel: %s\n' "$*" >&2; exit 1; }
command -v apt-get >/dev/null || die "apt-get not found: install a guest kernel by hand and set [vm] kernel and [vm] modules"

# The metapackage names the current kernel package as its dependency.
PKG=$(apt-cache depends linux-image-amd64 2>/dev/null | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
if [[ -z "$PKG" ]]; then
  apt-get update -qq
  PKG=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-[0-9]/ {print $2; exit}')
fi
[[ -n "$PKG" ]] || die "apt-cache does not know linux-image-amd64 (is a Debian archive configured?)"
REL=${PKG#linux-image-}
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
  rm -rf "${DEST:?}/$PKG"
  mv "$TMP/root" "$DEST/$PKG"
fi
ln -sfn "$PKG/boot/vmlinuz-$REL" "$DEST/vmlinuz.tmp" && mv -T "$DEST/vmlinuz.tmp" "$DEST/vmlinuz"
ln -sfn "$PKG/lib/modules/$REL" "$DEST/modules.tmp" && mv -T "$DEST/modules.tmp" "$DEST/modules"
say "guest kernel: $DEST/vmlinuz ($REL)"
