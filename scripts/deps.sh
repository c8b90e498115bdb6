#!/bin/sh
# Make sure the build's Debian packages are present; install what is missing when we are root,
# otherwise print the exact command and fail. Called by the Makefile before the first build.
set -eu

missing=""
need() { # need PACKAGE FILE: FILE is how we tell the package is installed
	[ -e "$2" ] || missing="$missing $1"
}
need libcjson-dev /usr/include/cjson/cJSON.h
need libsqlite3-dev /usr/include/sqlite3.h
need libcunit1-dev /usr/include/CUnit/Basic.h
need gnuplot-nox /usr/bin/gnuplot
need sqlite3 /usr/bin/sqlite3
need libopenblas-dev /usr/include/x86_64-linux-gnu/cblas.h
need openmpi-bin /usr/bin/mpirun
need libopenmpi-dev /usr/lib/x86_64-linux-gnu/openmpi/include/mpi.h

[ -z "$missing" ] && exit 0

cmd="apt-get update && apt-get install -y$missing"
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
	echo "deps: installing$missing" >&2
	apt-get update -qq >&2
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing >&2
	exit 0
fi
echo "deps: missing Debian packages:$missing" >&2
echo "deps: run as root: $cmd" >&2
exit 1
