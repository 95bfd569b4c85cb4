#!/bin/sh
# Builds idemproxy from this checkout and installs it with `make install`.
#
#   docker/build.sh [PREFIX]      build, check, then make install PREFIX=PREFIX
#                                 (default /usr/local; DESTDIR from the
#                                 environment stages it elsewhere: the
#                                 Dockerfile's DESTDIR=/out)
#   docker/build.sh --deps-only   only install the Debian build dependencies
#
# What `make install` puts where: doc/install.md. The binary is stripped.
# The build dependencies are installed when missing (that needs root or
# sudo). The Dockerfile's build stage runs this script; it works the same
# on any Debian 12 machine. BUILD=DIR builds in DIR instead of build/.
set -eu

SRC=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$SRC/build}
install_deps() {
	"$SRC/scripts/apt-install.sh" build-essential pkg-config xxd pandoc \
		libmicrohttpd-dev libcurl4-openssl-dev libpq-dev libjansson-dev \
		libssl-dev libconfig-dev libjose-dev libjemalloc-dev zlib1g-dev libsystemd-dev
}

install_deps
[ "${1:-}" = "--deps-only" ] && exit 0

PREFIX=${1:-/usr/local}
make -C "$SRC" --no-print-directory BUILD="$BUILD" -j"$(nproc)" "$BUILD/idemproxy"
# The binary must at least run, and the container's conf must validate.
"$BUILD/idemproxy" --version
"$BUILD/idemproxy" -c "$SRC/docker/idemproxy.conf" --check >/dev/null

make -C "$SRC" --no-print-directory BUILD="$BUILD" PREFIX="$PREFIX" \
	DESTDIR="${DESTDIR:-}" INSTALL_STRIP=-s install
echo "build.sh: installed ${DESTDIR:-}$PREFIX/sbin/idemproxy"
