#!/bin/sh
# Installs the Debian packages the build, the tests and the demo need, if any
# is missing. Needs root (or sudo) only when something is missing.
set -eu
# Node runs the OpenAPI validator of the contract tests (tests/contract).
# Debian packages npm apart from nodejs; NodeSource's nodejs carries it and
# conflicts with Debian's npm package.
npm_pkg=npm
! command -v npm >/dev/null 2>&1 || npm_pkg=""
# shellcheck disable=SC2086 # a list of package names
exec "$(dirname "$0")/apt-install.sh" \
	build-essential pkg-config xxd libmicrohttpd-dev libcurl4-openssl-dev \
	libpq-dev libjansson-dev libssl-dev libconfig-dev libcmocka-dev zlib1g-dev libjose-dev libjemalloc-dev libsystemd-dev \
	postgresql postgresql-contrib \
	python3 python3-pytest python3-psycopg python3-requests python3-yaml python3-jwt python3-cryptography curl procps \
	clang libclang-rt-14-dev clang-format prometheus systemd \
	iproute2 nftables faketime nodejs $npm_pkg \
	chromium chromium-driver python3-selenium \
	pandoc groff man-db debhelper dpkg-dev fakeroot lintian adduser
