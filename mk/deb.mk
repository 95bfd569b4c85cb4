# The Debian package (debian/), built with Debian's tools out of tree.
#
#   make deb         build/deb/idemproxy_VERSION_ARCH.deb, checked by lintian
#                    (scripts/deb-build.sh)
#   make check-deb   make deb, then install it on this machine, check it and
#                    purge it (tests/package/test_deb.py; root, and a machine
#                    without idemproxy installed or an idemproxy user)

.PHONY: deb check-deb
deb:
	scripts/deb-build.sh $(BUILD)/deb

check-deb: deb
	IDEMPROXY_DEB_DIR=$(abspath $(BUILD)/deb) $(PYTHON) -m pytest -q -p no:cacheprovider \
		tests/package $(PYTEST_ARGS)
