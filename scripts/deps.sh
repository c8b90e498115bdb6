#!/bin/sh
# Make sure the build's Debian packages are present; install what is missing when we are root,
# otherwise print the exact command and fail. Called by the Makefile before the first build.
#
# A package counts as present only when dpkg says it is installed: a file on disk is no proof,
# since another package may ship the same path (Debian's netlib libblas-dev also installs
# cblas.h, yet the build links -lopenblas). After any install, a link probe checks that every
# library the build links is really there.
#
# PX_DEPS_DRY_RUN=1 reports what is missing (exit 1 when something is) and installs nothing.
set -eu

PACKAGES="libcjson-dev libsqlite3-dev libcunit1-dev gnuplot-nox sqlite3 libopenblas-dev
openmpi-bin libopenmpi-dev"
# what the Makefile links against (LDLIBS, TESTLIBS), checked by linking an empty program
LINK_LIBS="-lcjson -lsqlite3 -lcunit -lopenblas"

installed() { # installed PACKAGE: dpkg reports it fully installed
	[ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

link_probe() { # every library the build needs links into a program
	dir=$(mktemp -d)
	printf 'int main(void) { return 0; }\n' > "$dir/probe.c"
	ok=0
	${CC:-cc} "$dir/probe.c" -o "$dir/probe" $LINK_LIBS 2> "$dir/err" || ok=1
	[ $ok = 0 ] || sed 's/^/deps: /' "$dir/err" >&2
	rm -rf "$dir"
	return $ok
}

if ! command -v dpkg-query >/dev/null 2>&1; then
	# not Debian: nothing to install with; the link probe says whether the build can link
	if link_probe; then
		exit 0
	fi
	echo "deps: no dpkg on this machine and the libraries above do not link; install the" \
		"equivalents of: $(echo $PACKAGES)" >&2
	exit 1
fi

missing=""
for p in $PACKAGES; do
	installed "$p" || missing="$missing $p"
done

if [ -z "$missing" ]; then
	link_probe && exit 0
	echo "deps: every package is installed but the build's libraries ($LINK_LIBS) do not link" >&2
	exit 1
fi

cmd="apt-get update && apt-get install -y$missing"
if [ "${PX_DEPS_DRY_RUN:-0}" = 1 ]; then
	echo "deps: missing Debian packages:$missing" >&2
	exit 1
fi
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "deps: installing$missing" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >&2
	link_probe && exit 0
	echo "deps: installed$missing, but the build's libraries still do not link" >&2
	exit 1
fi
echo "deps: missing Debian packages:$missing" >&2
echo "deps: run as root: $cmd" >&2
exit 1
