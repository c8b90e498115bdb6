#!/bin/sh
# Gather what a bare GPU machine needs to run the GPU checks (scripts/gpu_session.sh) into
# gpu-bundle/ (git-ignored): the release binaries built here with CUDA, the shared libraries they
# and Open MPI load that are not the C library's or CUDA's, and Open MPI's launcher with its
# plugins and help files, relocated with OPAL_PREFIX (and PMIx's with PMIX_PREFIX). The GPU
# machine has CUDA, cuBLAS and NCCL but none of Debian's packages, and cannot install any.
# Checked here by scripts/gpu_bundle_check.sh, which hides this machine's Open MPI and runs the
# bundle's.
# Usage: make -j2 build/rel/parallax build/rel/px_tests build/rel/comm_mpi_check \
#            build/rel/comm_nccl_check && sh scripts/gpu_bundle.sh
# Then carry gpu-bundle.tar.xz to the GPU machine and there:
#   tar -xJf gpu-bundle.tar.xz && . gpu-bundle/env.sh && bash scripts/gpu_session.sh "$OUT"
set -eu
out=gpu-bundle
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
for b in parallax px_tests comm_mpi_check comm_nccl_check; do
	[ -x "build/rel/$b" ] || { echo "gpu_bundle: build/rel/$b missing: build it first" >&2; exit 1; }
	cp "build/rel/$b" "$out/bin/"
done

# Open MPI's directories under its prefix, as `ompi_info --path` gives them: the bundle keeps the
# same layout under its own prefix, where OPAL_PREFIX makes Open MPI look
path_of() { ompi_info --path "$1" --parsable | sed 's/^path:[^:]*://'; }
prefix=$(path_of prefix)
under() { d=$(path_of "$1"); echo "${d#"$prefix"/}"; }
ompi="$out/ompi"
mkdir -p "$ompi/bin" "$ompi/$(under pkglibdir)" "$ompi/$(under pkgdatadir)"
cp -L "$(command -v mpirun)" "$ompi/bin/mpirun"
# a rank started without mpirun (parallax run --ranks 1) initialises MPI as a singleton, which
# starts Open MPI 4's orted itself
cp -L "$(command -v orted)" "$ompi/bin/orted"
cp -L "$(path_of pkglibdir)"/*.so "$ompi/$(under pkglibdir)/"
cp -RL "$(path_of pkgdatadir)"/. "$ompi/$(under pkgdatadir)/"
# Debian builds Open MPI against an external PMIx with plugins and help files of its own
pmix_lib=$(ldd "$(command -v mpirun)" "$out/bin/parallax" "$(path_of pkglibdir)"/mca_pmix_*.so |
	awk '$1 ~ /^libpmix/ {print $3; exit}')
if [ -n "$pmix_lib" ]; then
	pmix_prefix=$(dirname "$(dirname "$(readlink -f "$pmix_lib")")")
	for d in lib/pmix share/pmix; do
		if [ -d "$pmix_prefix/$d" ]; then
			mkdir -p "$out/pmix/$d"
			cp -RL "$pmix_prefix/$d"/. "$out/pmix/$d/"
		fi
	done
fi

# every library the binaries, the launcher and the plugins load, but the C library's and CUDA's
# (the GPU machine has its own)
for f in "$out"/bin/* "$ompi"/bin/* $(find "$ompi" "$out/pmix" -name '*.so' 2>/dev/null); do
	ldd "$f" 2>/dev/null || true
done | awk '$3 ~ /^\// {print $3}' | sort -u |
	grep -v -e '/libc\.so' -e '/libm\.so' -e '/ld-linux' -e '/libpthread' -e '/libdl\.so' \
		-e '/librt\.so' -e 'libcuda' -e 'libcublas' -e 'libnccl' -e 'libcudart' \
		-e 'libnvidia' |
	while read -r lib; do cp -L "$lib" "$out/lib/"; done
# the C++ runtime only where the GPU machine has none: its own is newer than Debian's, and the
# CUDA libraries found there (NCCL) may need the newer one
mkdir -p "$out/lib-fallback"
for lib in libstdc++.so.6 libgcc_s.so.1; do
	[ -e "$out/lib/$lib" ] && mv "$out/lib/$lib" "$out/lib-fallback/"
done

git rev-parse HEAD > "$out/REVISION" 2>/dev/null || true # the device tool carries no .git
cat > "$out/env.sh" <<'ENV'
# . gpu-bundle/env.sh (from the directory holding gpu-bundle/, or with BUNDLE_DIR set): the
# bundle's binaries, libraries and Open MPI first
b=$(cd "${BUNDLE_DIR:-gpu-bundle}" && pwd)
export PATH="$b/bin:$b/ompi/bin:$PATH"
export PX_HOST_LD_LIBRARY_PATH="${LD_LIBRARY_PATH:-}" # for the machine's own programs (python3)
export LD_LIBRARY_PATH="$b/lib:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}"
ldconfig -p 2>/dev/null | grep -q 'libstdc++\.so\.6 ' ||
	LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$b/lib-fallback"
# CUDA 13's runtime, cuBLAS and NCCL wherever that machine keeps them (NCCL may come only with
# PyTorch's Python packages)
for l in libcudart.so.13 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
	ldconfig -p 2>/dev/null | grep -q "$l " && continue
	[ -e "/usr/local/cuda/lib64/$l" ] && continue
	f=$(find /usr/local /opt /usr/lib -name "$l" 2>/dev/null | head -1)
	[ -n "$f" ] && LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$(dirname "$f")"
done
unset l f
export OPAL_PREFIX="$b/ompi"
export PMIX_PREFIX="$b/pmix"
export PX_GPU_BIN="$b/bin" # scripts/gpu_session.sh's binaries
# the GPU machine runs as root in a container: let mpirun
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# that machine has a PMIx of its own whose compression plugin does not load: said, then harmless
export PMIX_MCA_pcompress_base_silence_warning=1
ENV
# the device tool carries at most 64 MiB: debug sections out, then one compressed file
strip --strip-debug "$out"/bin/*
find "$out" -name '*.so*' -type f -exec strip --strip-unneeded {} +
tar -cJf "$out.tar.xz" "$out"
du -sh "$out" "$out.tar.xz"
