#!/bin/sh
# Installs the Debian packages the build, the tests and the demo need, if any
# is missing. Needs root (or sudo) only when something is missing.
set -eu
# shellcheck disable=SC2086 # a list of package names
exec "$(dirname "$0")/apt-install.sh" \
	build-essential pkg-config xxd libmicrohttpd-dev libcurl4-openssl-dev \
	libpq-dev libjansson-dev libssl-dev libconfig-dev libcmocka-dev zlib1g-dev libjose-dev libjemalloc-dev \
	postgresql postgresql-contrib \
	python3 python3-pytest python3-psycopg python3-requests python3-yaml python3-jwt python3-cryptography curl procps \
	clang libclang-rt-14-dev clang-format prometheus systemd \
	iproute2 nftables faketime \
	pandoc groff man-db debhelper dpkg-dev fakeroot lintian adduser
