#!/bin/sh
# Gather what a bare GPU machine needs to run the GPU checks (scripts/gpu_session.sh) into
# gpu-bundle/ (git-ignored): the release binaries built here with CUDA, the shared libraries they
# load that are not CUDA's own, and Open MPI's launcher with its plugins and help files. The GPU
# machine has CUDA, cuBLAS and NCCL but none of Debian's packages, and cannot install any.
# Usage: make -j2 build/rel/parallax build/rel/px_tests build/rel/comm_mpi_check \
#            build/rel/comm_nccl_check && sh scripts/gpu_bundle.sh
set -eu
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in parallax px_tests comm_mpi_check comm_nccl_check; do
	[ -x "build/rel/$b" ] || { echo "gpu_bundle: build/rel/$b missing: build it first" >&2; exit 1; }
	cp "build/rel/$b" "$out/bin/"
done
# every library the binaries load, but the C library's and CUDA's (the GPU machine has its own)
for b in "$out"/bin/*; do ldd "$b"; done | awk '$3 ~ /^\// {print $3}' | sort -u |
	grep -v -e '/libc\.so' -e '/libm\.so' -e '/ld-linux' -e '/libpthread' -e '/libdl\.so' \
		-e '/librt\.so' -e 'libcuda' -e 'libcublas' -e 'libnccl' -e 'libcudart' |
	while read -r lib; do cp -L "$lib" "$out/lib/"; done
# Open MPI: the launcher, its plugins and help texts, relocated with OPAL_PREFIX
ompi=/usr/lib/x86_64-linux-gnu/openmpi
mkdir -p "$out/ompi/bin" "$out/ompi/lib" "$out/ompi/share"
cp -L "$(command -v mpirun)" "$out/ompi/bin/mpirun"
cp -RL "$ompi/lib/openmpi3" "$out/ompi/lib/" 2>/dev/null || cp -RL "$ompi/lib/openmpi" "$out/ompi/lib/"
cp -RL /usr/share/openmpi "$out/ompi/share/"
cp -RL /etc/openmpi "$out/ompi/etc" 2>/dev/null || true
cat > "$out/env.sh" <<'ENV'
# . gpu-bundle/env.sh: the bundle's binaries and libraries first
b=$(cd "$(dirname "${BUNDLE_DIR:-gpu-bundle}/x")" && pwd)
export PATH="$b/bin:$b/ompi/bin:$PATH"
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
export OPAL_PREFIX="$b/ompi"
ENV
du -sh "$out"
