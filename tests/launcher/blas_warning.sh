#!/usr/bin/env bash
# check_blas()'s warning (common/dist/runtime.cpp), for runs that do not come through ddp_launch (torchrun, srun, a
# program run alone): it must name the remedy exactly where OpenBLAS fell back to its Prescott (SSE3) kernels on a
# CPU with AVX2 and FMA, and say nothing elsewhere or where the user chose the kernels.
#
#   blas_warning.sh LAUNCH_PROBE PROGRAM
#
# The oracle is launch_probe, which loads OpenBLAS without LibTorch or common/ (tests/launcher/probe.cpp): run alone,
# it says which kernels OpenBLAS picks for this CPU; ldd says whether PROGRAM loads OpenBLAS at all (Debian's LibTorch
# does, through libblas.so.3; pip's brings its own BLAS, and then no warning is right). PROGRAM is any stage, run alone.
set -uo pipefail
probe=$1 prog=$2
warning="OpenBLAS does not know this CPU and runs its Prescott"
fail() { echo "FAIL: $*"; exit 1; }

# First whether PROGRAM loads OpenBLAS: where it does not, "no warning" holds with or without OpenBLAS installed.
blas=$(ldd "$prog" | awk '/libblas\.so|libopenblas/ {print $3; exit}')
loads=0; [ -n "$blas" ] && [[ "$(readlink -f "$blas")" == *openblas* ]] && loads=1
if [ $loads = 1 ]; then
  oracle=$(env -u OPENBLAS_CORETYPE "$probe" blas) || fail "launch_probe blas exited $?"
  core=$(sed -n 's/^BLAS_CORE=//p' <<<"$oracle")
  avx2=$(sed -n 's/^AVX2=//p' <<<"$oracle")
  # PROGRAM loads OpenBLAS but the probe finds no libopenblas.so.0: the oracle cannot say which kernels run.
  [ "$core" = none ] && { echo "SKIP: no libopenblas.so.0 (apt-get install libopenblas0-pthread)"; exit 77; }
fi

out=$(env -u OPENBLAS_CORETYPE -u RANK -u WORLD_SIZE timeout 60 "$prog" 2>&1) || fail "$prog alone exited $?: $out"
if [ $loads = 0 ]; then
  grep -q "$warning" <<<"$out" && fail "$prog does not load OpenBLAS (${blas:-no libblas.so.3 in ldd}), yet it warned: $out"
  echo "$prog does not load OpenBLAS (${blas:-no libblas.so.3 in ldd}): no warning, as expected"
elif [ "$core" = Prescott ] && [ "$avx2" = 1 ]; then
  # Fell back: the warning, with the variable and a core this CPU runs (SkylakeX with AVX-512, else Haswell).
  grep -q "$warning" <<<"$out" || fail "OpenBLAS runs Prescott's kernels on a CPU with AVX2, and no warning: $out"
  grep -Eq "export OPENBLAS_CORETYPE=(SkylakeX|Haswell)$" <<<"$out" || fail "the warning names no remedy: $out"
  echo "fell back to Prescott here: warned ($(grep -o 'OPENBLAS_CORETYPE=[A-Za-z]*$' <<<"$out"))"
else
  grep -q "$warning" <<<"$out" && fail "OpenBLAS runs $core (AVX2=$avx2), yet the program warned: $out"
  echo "OpenBLAS runs $core here (AVX2=$avx2): no warning, as expected"
fi

# A core the user chose is theirs, even Prescott: no warning.
out=$(OPENBLAS_CORETYPE=Prescott timeout 60 "$prog" 2>&1) || fail "$prog with OPENBLAS_CORETYPE=Prescott exited $?"
grep -q "$warning" <<<"$out" && fail "warned although the user set OPENBLAS_CORETYPE=Prescott: $out"
echo "PASS: check_blas() warns exactly where OpenBLAS fell back and the user chose no kernels"
