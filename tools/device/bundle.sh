#!/usr/bin/env bash
# bundle.sh - packs what a GPU machine needs to run vlmd's binaries and tests:
# build/bin, the test executables, and every shared library they link that is
# not part of the base system there (libzmq, libuv, libh2o, msgpack, jansson,
# criterion, openblas, ...). The GPU machine has CUDA, glibc >= 2.36 and Python
# but none of those libraries, and no network.
#
# usage: tools/device/bundle.sh [BUILD_DIR] [OUT_DIR]   (defaults: build .device-bundle)
# It leaves OUT_DIR/bundle.tar.xz (OpenBLAS alone is 35 MB unpacked; the device
# tool carries at most 64 MiB with the repository).
# then on the GPU machine: tools/device/gpu-check.sh OUT_DIR/bundle.tar.xz MODEL_DIR
set -euo pipefail
build=${1:-build}
out=${2:-.device-bundle}
rm -rf "$out"
mkdir -p "$out/bin" "$out/tests" "$out/lib"
cp "$build"/bin/* "$out/bin/"
for t in "$build"/tests/test_*; do # the CUDA emulator's tests (*_emu) are for machines without one
  if [[ -f $t && $t != *_emu ]]; then cp "$t" "$out/tests/"; fi
done

# Libraries the GPU machine already has (glibc, the CUDA driver and runtime).
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libresolv|libcuda\.so|libcudart|libcublas|libcublasLt|libnccl|libgcc_s|libstdc\+\+)'
for f in "$out"/bin/* "$out"/tests/*; do
  ldd "$f" | awk '/=> \//{print $1" "$3}'
done | sort -u | while read -r name path; do
  if ! [[ $name =~ $skip ]]; then
    cp -L "$path" "$out/lib/$name"
  fi
done
# Symbols and debug sections are half of the binaries' bytes; the device tool carries
# at most 64 MiB with the repository, so they stay here.
strip --strip-unneeded "$out"/bin/* "$out"/tests/* "$out"/lib/*
tar -C "$out" -cJf "$out.tar.xz" bin tests lib
rm -rf "$out"
mkdir -p "$out"
mv "$out.tar.xz" "$out/bundle.tar.xz"
du -sh "$out/bundle.tar.xz"
