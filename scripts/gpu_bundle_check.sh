#!/bin/sh
# Try gpu-bundle/ as a bare machine would see it: in a private mount namespace (unshare, root)
# where this machine's Open MPI, PMIx and every library the bundle carries are hidden, so that
# anything the bundle forgot fails here instead of on the GPU machine. Runs the bundle's mpirun
# with comm_mpi_check on 2 ranks, then `parallax run --ranks 2` on the CPU backend.
# Usage: sh scripts/gpu_bundle.sh && sh scripts/gpu_bundle_check.sh
set -eu
[ -d gpu-bundle ] || { echo "gpu_bundle_check: no gpu-bundle/: run scripts/gpu_bundle.sh" >&2; exit 2; }
if [ "${1:-}" != "--inside" ]; then
	exec unshare --mount --propagation private sh "$0" --inside
fi
empty=$(mktemp -d)
hide() { [ -e "$1" ] && mount --bind "$2" "$1"; }
ompi_lib=/usr/lib/x86_64-linux-gnu/openmpi
for d in "$ompi_lib" /usr/lib/x86_64-linux-gnu/pmix2 /usr/share/openmpi /etc/openmpi; do
	hide "$d" "$empty" || true
done
for f in /usr/bin/orterun /usr/bin/mpirun /usr/bin/mpiexec /usr/bin/orted; do
	hide "$(readlink -f "$f")" /dev/null || true
done
for lib in gpu-bundle/lib/*; do
	hide "/usr/lib/x86_64-linux-gnu/$(basename "$lib")" /dev/null || true
done
# the hiding must work, or the check proves nothing
if ldd gpu-bundle/bin/parallax | grep -q 'libmpi.so.40 => /'; then
	if gpu-bundle/bin/parallax --version > /dev/null 2>&1; then
		echo "gpu_bundle_check: this machine's libmpi is still visible" >&2
		exit 1
	fi
fi
. gpu-bundle/env.sh
echo "== mpirun: $(command -v mpirun)"
mpirun -np 2 gpu-bundle/bin/comm_mpi_check 2>&1 | tail -30
echo "== parallax run --ranks 1 (CPU backend; MPI as a singleton, through the bundle's orted)"
gpu-bundle/bin/parallax run scenarios/gpt2-mini-cpu-zero3.json --ranks 1 --steps 2 --no-db 2>&1 |
	tail -1
echo "== parallax run --ranks 2 (CPU backend)"
gpu-bundle/bin/parallax run scenarios/gpt2-mini-cpu-zero3.json --ranks 2 --steps 2 --no-db 2>&1 |
	tail -3
