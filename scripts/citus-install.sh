#!/bin/sh
# Makes sure the Citus extension is installed into the PostgreSQL that
# pg_config names, for `make test-citus`. Nothing to do when citus.so is
# there already (Citus from its own packages, or built before). Otherwise
# it is built from the source folder given as the first argument (or
# CITUS_SRC): a folder with a build.sh is trusted to build and install it
# (as in CI); a Citus source tree is configured, built and installed.
# Needs root to install.
set -eu
libdir=$(pg_config --pkglibdir 2>/dev/null || echo /usr/lib/postgresql/15/lib)
if [ -f "$libdir/citus.so" ]; then
	exit 0
fi
src=${1:-${CITUS_SRC:-}}
if [ -z "$src" ]; then
	echo "citus-install: $libdir/citus.so is missing: install Citus, or" \
	     "give its source (make test-citus CITUS_SRC=DIR)" >&2
	exit 1
fi
if [ -x "$src/build.sh" ]; then
	echo "citus-install: building Citus with $src/build.sh"
	"$src/build.sh"
elif [ -x "$src/configure" ]; then
	echo "citus-install: building Citus from $src"
	(cd "$src" && ./configure --without-libcurl >/dev/null &&
		make -s -j"$(nproc)" >/dev/null && make -s install >/dev/null)
else
	echo "citus-install: $src has neither build.sh nor configure" >&2
	exit 1
fi
[ -f "$libdir/citus.so" ] || {
	echo "citus-install: the build did not install $libdir/citus.so" >&2
	exit 1
}
