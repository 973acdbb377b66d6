#!/usr/bin/env bash
# scripts/pack_ompi.sh OUT: Debian's Open MPI launcher (mpirun = orterun, orted), its libraries,
# components and help files, and PMIx's, copied into OUT/usr as they lie under /usr, for a machine that
# has no MPI of its own (the lent GPU machines: docs/cuda.md, "Several GPUs"). There:
#
#   source OUT/ompi_env.sh && mpirun -np 2 PROGRAM ...
#
# ompi_env.sh points Open MPI at OUT/usr (OPAL_PREFIX), puts its launcher and libraries first on the
# paths, allows root, and keeps to one machine: shared memory and TCP, no remote launch agent. PMIx
# looks for its components only where Debian installed them, so ompi_env.sh links that folder to
# OUT's copy when the machine has none. Left out: the network components that load libraries such a
# machine may lack (libfabric, UCX, verbs, PSM), Java, and the headers.
set -euo pipefail
out=$(realpath -m "${1:?usage: scripts/pack_ompi.sh OUT}")
M=/usr/lib/x86_64-linux-gnu
U=$out/usr
[ -x /usr/bin/orterun ] && [ -d $M/openmpi ] && [ -d $M/pmix2 ] ||
    { echo "pack_ompi: Debian's Open MPI (openmpi-bin, libopenmpi-dev) is not installed here" >&2; exit 1; }
rm -rf "$out"
mkdir -p "$U/bin" "$U/lib/x86_64-linux-gnu" "$U/share"
cp -a /usr/bin/orterun /usr/bin/orted /usr/bin/ompi_info "$U/bin/"
ln -s orterun "$U/bin/mpirun"
ln -s orterun "$U/bin/mpiexec"
cp -a $M/openmpi $M/pmix2 "$U/lib/x86_64-linux-gnu/"
cp -a /usr/share/openmpi "$U/share/"
# openmpi/lib's names point at ../../, the real files in $M: those too.
for f in $M/libmpi.so.40 $M/libopen-pal.so.40 $M/libopen-rte.so.40 $M/libmca_common_*.so.[0-9]*; do
    cp -L "$f" "$U/lib/x86_64-linux-gnu/"
done
rm -rf "$U/lib/x86_64-linux-gnu/openmpi/include" "$U/lib/x86_64-linux-gnu/pmix2/lib/libpmix.a"
for net in ofi ucx verbs psm openib portals usnic java; do
    rm -f "$U"/lib/x86_64-linux-gnu/openmpi/lib/openmpi3/*"$net"* "$U"/lib/x86_64-linux-gnu/openmpi/lib/*"$net"* \
        "$U"/lib/x86_64-linux-gnu/libmca_common_"$net"*
done
# The libraries all of these load, other than the C runtime and the ones copied above: into OUT/usr/lib.
skip='^(linux-vdso|libc\.so|libm\.so|libdl\.so|librt\.so|libpthread\.so|ld-linux|libstdc\+\+|libgcc_s|libmpi|libopen-|libmca_common|libpmix)'
find "$U" -type f \( -name '*.so*' -o -path '*/bin/*' \) | while read -r f; do
    ldd "$f" 2>/dev/null | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r name path; do
        [[ $name =~ $skip ]] || [ -e "$U/lib/$name" ] || cp -L "$path" "$U/lib/$name"
    done
done
cat >"$out/ompi_env.sh" <<'ENV'
# source this on the other machine: Open MPI and PMIx from this folder
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
export OPAL_PREFIX=$here/usr
export PATH=$here/usr/bin:$PATH
export LD_LIBRARY_PATH=$here/usr/lib/x86_64-linux-gnu:$here/usr/lib/x86_64-linux-gnu/openmpi/lib:$here/usr/lib/x86_64-linux-gnu/pmix2/lib:$here/usr/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
P=/usr/lib/x86_64-linux-gnu/pmix2   # (PMIx's components: only there)
[ -e $P ] || { mkdir -p "$(dirname $P)" && ln -s "$here/usr/lib/x86_64-linux-gnu/pmix2" $P; } 2>/dev/null ||
    echo "ompi_env.sh: cannot link $P to this folder's PMIx: mpirun may print that it lacks components" >&2
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl=self,vader,tcp OMPI_MCA_pml=ob1 OMPI_MCA_plm=isolated OMPI_MCA_rmaps_base_oversubscribe=1
ENV
du -sh "$out" | awk '{print "pack_ompi: " $1 " in " $2}'
