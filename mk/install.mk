# Installing: the binary, the man pages, the example conf, the systemd unit,
# the alert rules and the dashboard.
#
#   make install [PREFIX=/usr/local] [DESTDIR=]   build if needed, install
#   make uninstall [PREFIX=...] [DESTDIR=]        remove what install put
#   make man                                      only the man pages, in
#                                                 build/man/
#
# Files (under DESTDIR):
#   SBINDIR/idemproxy                        PREFIX/sbin (idemproxy(8))
#   MANDIR/man8/idemproxy.8                  PREFIX/share/man
#   MANDIR/man5/idemproxy.conf.5
#   UNITDIR/idemproxy.service                PREFIX/lib/systemd/system (a
#                                            directory systemd reads for
#                                            /usr/local too)
#   DATADIR/idemproxy.conf.example           PREFIX/share/idemproxy
#   DATADIR/prometheus/idemproxy-alerts.yml
#   DATADIR/grafana/idemproxy-dashboard.json
#
# The unit names the packaged binary, /usr/sbin/idemproxy; installed under
# another SBINDIR it names that one. Nothing goes to /etc: the conf is the
# operator's (the Debian package installs it as a conffile).
# INSTALL_STRIP=-s strips the binary (the container image does; the
# package leaves that to dh_strip). tests/integration/test_install.py
# installs into a temporary DESTDIR and checks the list, the modes and that
# uninstall leaves nothing.

PREFIX  ?= /usr/local
SBINDIR ?= $(PREFIX)/sbin
MANDIR  ?= $(PREFIX)/share/man
DATADIR ?= $(PREFIX)/share/idemproxy
UNITDIR ?= $(PREFIX)/lib/systemd/system
INSTALL_STRIP ?=

# The man pages: Markdown rendered by pandoc (doc/man/man.lua says how).
# idemproxy.conf(5) is doc/configuration.md between a head (NAME,
# SYNOPSIS, DESCRIPTION) and a tail (FILES, SEE ALSO): the reference is
# written once, for the web and for man.
MAN_PAGES := $(BUILD)/man/idemproxy.8 $(BUILD)/man/idemproxy.conf.5
MAN_VERSION = $(shell scripts/version.sh --version-only .)
# The date of the newest changelog entry, so that a rebuild is the same.
MAN_DATE = $(shell date -u -d "$$(sed -n 's/^ -- .*>  //p;T;q' debian/changelog)" '+%B %Y')
PANDOC_MAN = pandoc -s -f markdown -t man --lua-filter=doc/man/man.lua -V header-includes=.ad\ l -V header-includes=.nh \
	-M footer="idemproxy $(MAN_VERSION)" -M date="$(MAN_DATE)"

.PHONY: man install uninstall
man: $(MAN_PAGES)

$(BUILD)/man:
	@mkdir -p $@

$(BUILD)/man/idemproxy.8: doc/man/idemproxy.8.md doc/man/man.lua debian/changelog | $(BUILD)/man
	$(PANDOC_MAN) -o $@ doc/man/idemproxy.8.md

$(BUILD)/man/idemproxy.conf.5: doc/man/idemproxy.conf.5.head.md doc/configuration.md \
		doc/man/idemproxy.conf.5.tail.md doc/man/man.lua debian/changelog | $(BUILD)/man
	$(PANDOC_MAN) -o $@ doc/man/idemproxy.conf.5.head.md doc/configuration.md \
		doc/man/idemproxy.conf.5.tail.md

INSTALL_FILES := $(SBINDIR)/idemproxy $(MANDIR)/man8/idemproxy.8 \
	$(MANDIR)/man5/idemproxy.conf.5 $(UNITDIR)/idemproxy.service \
	$(DATADIR)/idemproxy.conf.example $(DATADIR)/prometheus/idemproxy-alerts.yml \
	$(DATADIR)/grafana/idemproxy-dashboard.json

install: $(BUILD)/idemproxy $(MAN_PAGES)
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(MANDIR)/man8 $(DESTDIR)$(MANDIR)/man5 \
		$(DESTDIR)$(UNITDIR) $(DESTDIR)$(DATADIR)/prometheus $(DESTDIR)$(DATADIR)/grafana
	install -m 0755 $(INSTALL_STRIP) $(BUILD)/idemproxy $(DESTDIR)$(SBINDIR)/idemproxy
	install -m 0644 $(BUILD)/man/idemproxy.8 $(DESTDIR)$(MANDIR)/man8/idemproxy.8
	install -m 0644 $(BUILD)/man/idemproxy.conf.5 $(DESTDIR)$(MANDIR)/man5/idemproxy.conf.5
	sed 's|/usr/sbin/idemproxy|$(SBINDIR)/idemproxy|g' conf/idemproxy.service \
		> $(DESTDIR)$(UNITDIR)/idemproxy.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/idemproxy.service
	install -m 0644 conf/idemproxy.conf $(DESTDIR)$(DATADIR)/idemproxy.conf.example
	install -m 0644 conf/prometheus/idemproxy-alerts.yml $(DESTDIR)$(DATADIR)/prometheus/
	install -m 0644 conf/grafana/idemproxy-dashboard.json $(DESTDIR)$(DATADIR)/grafana/

# Only what install put, and the directories of idemproxy's own; the
# shared ones (sbin, man8, ...) stay even when empty.
uninstall:
	rm -f $(addprefix $(DESTDIR),$(INSTALL_FILES))
	-rmdir $(DESTDIR)$(DATADIR)/prometheus $(DESTDIR)$(DATADIR)/grafana $(DESTDIR)$(DATADIR)
