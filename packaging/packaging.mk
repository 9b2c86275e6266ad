# packaging/packaging.mk - what `make install` adds beyond binaries,
# libraries, header and man pages, and `make deb`.  Included by the main
# Makefile, which owns PREFIX, DESTDIR, LIBDIR, BUILD, LIBVERSION and the
# install/uninstall targets; it runs install-extra / uninstall-extra as
# prerequisites of install / uninstall.
#
#   make install PREFIX=/usr DESTDIR=/tmp/root   units, sysusers.d, tmpfiles.d,
#                                                gpucmd.pc, example config,
#                                                bash completion
#   make deb                                     build the Debian packages in a
#                                                temporary copy of the tree;
#                                                the .debs land in $(BUILD)/deb
#
# The sources of the sysusers.d and tmpfiles.d files are packaging/sysusers/
# and packaging/tmpfiles/: a directory named *.d would be ignored by git
# (.gitignore's *.d is for compiler dependency files).
#
# Every directory is a variable (recursive, so that the Makefile's LIBDIR,
# defined after this fragment is read, is the one used):
#   SYSTEMDUNITDIR  $(PREFIX)/lib/systemd/system  (Debian 12: /lib/systemd/system)
#   SYSUSERSDIR     $(PREFIX)/lib/sysusers.d
#   TMPFILESDIR     $(PREFIX)/lib/tmpfiles.d
#                   (under a PREFIX other than /usr and /usr/local, which
#                   systemd does not search: /usr/local/lib/...)
#   PKGCONFIGDIR    $(LIBDIR)/pkgconfig
#   SYSCONFDIR      /etc  (the daemon reads /etc/gpucmd/gpucmdd.conf)
#   EXAMPLEDIR      $(SYSCONFDIR)/gpucmd, for gpucmdd.conf.example
#   BASHCOMPDIR     $(PREFIX)/share/bash-completion/completions
#
# The units run $(SBINDIR)/gpucmdd: their ExecStart= and ExecReload= are
# rewritten from /usr/sbin when installed under another PREFIX.

SYSTEMD_PREFIX = $(if $(filter /usr /usr/local,$(PREFIX)),$(PREFIX),/usr/local)
SYSTEMDUNITDIR ?= $(SYSTEMD_PREFIX)/lib/systemd/system
SYSUSERSDIR ?= $(SYSTEMD_PREFIX)/lib/sysusers.d
TMPFILESDIR ?= $(SYSTEMD_PREFIX)/lib/tmpfiles.d
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
SYSCONFDIR ?= /etc
EXAMPLEDIR ?= $(SYSCONFDIR)/gpucmd
BASHCOMPDIR ?= $(PREFIX)/share/bash-completion/completions

INSTALL_EXTRA := install-extra
UNINSTALL_EXTRA := uninstall-extra

PKG_UNITS := gpucmdd.service gpucmdd.socket gpucmdd@.service gpucmdd@.socket

# gpucmd.pc names its directories relative to ${prefix} where it can, so
# pkg-config --define-prefix can relocate the tree.
pc_rel = $(patsubst $(PREFIX)/%,$${prefix}/%,$(1))

.PHONY: install-extra uninstall-extra deb

install-extra:
	$(call msg,GEN,$(BUILD)/gpucmd.pc)
	$(Q)mkdir -p $(BUILD)
	$(Q)sed -e 's|@prefix@|$(PREFIX)|' \
		-e 's|@libdir@|$(call pc_rel,$(LIBDIR))|' \
		-e 's|@includedir@|$(call pc_rel,$(INCDIR))|' \
		-e 's|@version@|$(LIBVERSION)|' \
		packaging/gpucmd.pc.in >$(BUILD)/gpucmd.pc
	install -d $(DESTDIR)$(SYSTEMDUNITDIR) $(DESTDIR)$(SYSUSERSDIR) \
		$(DESTDIR)$(TMPFILESDIR) $(DESTDIR)$(PKGCONFIGDIR) \
		$(DESTDIR)$(EXAMPLEDIR) $(DESTDIR)$(BASHCOMPDIR)
	for u in $(PKG_UNITS); do \
		sed 's|^\(Exec[A-Za-z]*=\)/usr/sbin/gpucmdd|\1$(SBINDIR)/gpucmdd|' \
			packaging/systemd/$$u >$(DESTDIR)$(SYSTEMDUNITDIR)/$$u && \
		chmod 0644 $(DESTDIR)$(SYSTEMDUNITDIR)/$$u || exit 1; \
	done
	install -m 0644 packaging/sysusers/gpucmd.conf $(DESTDIR)$(SYSUSERSDIR)/gpucmd.conf
	install -m 0644 packaging/tmpfiles/gpucmd.conf $(DESTDIR)$(TMPFILESDIR)/gpucmd.conf
	install -m 0644 $(BUILD)/gpucmd.pc $(DESTDIR)$(PKGCONFIGDIR)/gpucmd.pc
	install -m 0644 packaging/gpucmdd.conf.example \
		$(DESTDIR)$(EXAMPLEDIR)/gpucmdd.conf.example
	install -m 0644 packaging/bash-completion/gpucmd $(DESTDIR)$(BASHCOMPDIR)/gpucmd

uninstall-extra:
	rm -f $(addprefix $(DESTDIR)$(SYSTEMDUNITDIR)/,$(PKG_UNITS)) \
		$(DESTDIR)$(SYSUSERSDIR)/gpucmd.conf \
		$(DESTDIR)$(TMPFILESDIR)/gpucmd.conf \
		$(DESTDIR)$(PKGCONFIGDIR)/gpucmd.pc \
		$(DESTDIR)$(EXAMPLEDIR)/gpucmdd.conf.example \
		$(DESTDIR)$(BASHCOMPDIR)/gpucmd
	-rmdir $(DESTDIR)$(EXAMPLEDIR) 2>/dev/null

# ---- the Debian packages ----------------------------------------------------
# dpkg-buildpackage wants debian/ at the top of the tree and writes into
# the tree and its parent, so it runs in a temporary copy of the sources
# (what git tracks plus untracked files it does not ignore; a plain tar of
# the tree without build/ where there is no git).  The results are copied
# to $(BUILD)/deb and, when lintian is installed, checked with it (errors
# fail the target).  DEB_BUILD_OPTIONS passes through (nocheck skips the
# tests).
DEB_OUT = $(BUILD)/deb

deb:
	$(Q)command -v dpkg-buildpackage >/dev/null || { \
		echo "make deb needs dpkg-buildpackage: apt-get install dpkg-dev debhelper" >&2; \
		exit 1; }
	$(Q)set -e; \
	tmp=$$(mktemp -d /tmp/gpucmd-deb-XXXXXX); \
	trap 'rm -rf "$$tmp"' EXIT; \
	src=$$tmp/gpucmd-$(LIBVERSION); \
	mkdir -p "$$src"; \
	if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
		git ls-files -z --cached --others --exclude-standard | \
			tar --null -T - --ignore-failed-read -cf - 2>/dev/null | \
			tar -xf - -C "$$src"; \
	else \
		tar --exclude=./build --exclude=./.git -cf - . | tar -xf - -C "$$src"; \
	fi; \
	rm -rf "$$src/debian"; \
	cp -r packaging/debian "$$src/debian"; \
	echo "  DEB    in $$src"; \
	(cd "$$src" && dpkg-buildpackage -b -us -uc); \
	rm -rf $(DEB_OUT); mkdir -p $(DEB_OUT); \
	cp "$$tmp"/*.deb "$$tmp"/*.changes "$$tmp"/*.buildinfo $(DEB_OUT)/; \
	ls -l $(DEB_OUT); \
	if command -v lintian >/dev/null; then \
		echo "  LINT   $(DEB_OUT)/*.changes"; \
		lintian --fail-on error $(DEB_OUT)/*.changes; \
	else \
		echo "make deb: lintian is not installed; the packages were not checked" >&2; \
	fi
