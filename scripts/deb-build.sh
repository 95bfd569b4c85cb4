#!/bin/sh
# Builds the Debian package out of tree, then checks it with lintian.
#
#   scripts/deb-build.sh OUT      (make deb: OUT = build/deb)
#
# dpkg-buildpackage writes its results one directory above the tree it
# builds, so the tree is copied to OUT/idemproxy-VERSION first: the files
# git knows (tracked, and untracked ones not ignored), or outside git
# everything but build output. The copy gets a COMMIT file with the
# checkout's commit, since it is no checkout itself (scripts/version.sh).
# Leaves OUT/idemproxy_VERSION_ARCH.deb; fails on a lintian error, shows
# its warnings (doc/install.md explains those left).
set -eu

SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT=$1
VERSION=$("$SRC/scripts/version.sh" --version-only "$SRC")
TREE=$OUT/idemproxy-$VERSION

rm -rf "$OUT"
mkdir -p "$TREE"
if git -C "$SRC" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
	# --ignore-failed-read: a tracked file deleted in the work tree.
	(cd "$SRC" && git ls-files -z --cached --others --exclude-standard |
		tar --null -T - --ignore-failed-read -cf - 2>/dev/null) | tar -xf - -C "$TREE"
else
	(cd "$SRC" && tar --exclude=./build --exclude='./build-*' --exclude=./.run -cf - .) |
		tar -xf - -C "$TREE"
fi
"$SRC/scripts/version.sh" "$SRC" |
	sed -n 's/^#define IDEMPROXY_COMMIT "\(.*\)"$/\1/p' > "$TREE/COMMIT"

# -us -uc: unsigned; -b: binary only (the source is this repository).
(cd "$TREE" && DEB_BUILD_OPTIONS="${DEB_BUILD_OPTIONS:-parallel=$(nproc)}" \
	dpkg-buildpackage -us -uc -b)
rm -rf "$TREE"

DEB=$(ls "$OUT"/idemproxy_"$VERSION"_*.deb)
lintian --fail-on error "$OUT"/idemproxy_"$VERSION"_*.changes
echo "deb-build.sh: built $DEB"
