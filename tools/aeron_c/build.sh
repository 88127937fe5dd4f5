#!/usr/bin/env bash
# Build Aeron's C client (libaeron.so) and C media driver (aeronmd) from nothing, under
# build/aeron/ of this repository (or $AERON_BUILD_DIR):
#
#   venv/        a venv with pip's cmake (Aeron needs CMake >= 3.30; Debian 12 ships 3.25)
#   sdist/       the pyaeron 0.1.0 sdist; its third_party/aeron is Aeron 1.53.0-SNAPSHOT, the
#                C client and the C driver (no samples, no archive)
#   src/         the sdist unpacked
#   cmake/       CMake's build tree (its binaries/ and lib/)
#   lib/         -> cmake/lib: libaeron.so, libaeron_driver.so
#   bin/aeronmd  -> ../cmake/binaries/aeronmd
#   include/     -> the client's headers (aeronc.h), aeron-client/src/main/c of the source
#
# Idempotent: each step is skipped when its result is there, and the build itself is CMake's
# incremental one, so a second run costs seconds. lib/, bin/aeronmd and include/ are linked
# last, so they exist only after a whole build. Needs python3 (with venv), a C and a C++
# compiler (Aeron's CMake project enables both languages), make and network access to PyPI.
# $AERON_BUILD_JOBS sets the parallel jobs (2).
set -euo pipefail

for compiler in cc c++; do
    command -v "$compiler" >/dev/null || {
        echo "aeron-c: no $compiler on PATH (Aeron's CMake project needs a C and a C++ compiler;" \
             "on Debian: apt-get install gcc g++)" >&2
        exit 1
    }
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
OUT="${AERON_BUILD_DIR:-$ROOT/build/aeron}"
JOBS="${AERON_BUILD_JOBS:-2}"
VERSION=0.1.0
PYAERON="pyaeron-$VERSION"
SOURCE_REL="src/$PYAERON/third_party/aeron"
SOURCE="$OUT/$SOURCE_REL"

mkdir -p "$OUT"

if [ ! -x "$OUT/venv/bin/cmake" ]; then
    echo "aeron-c: a venv with pip's cmake in $OUT/venv"
    rm -rf "$OUT/venv"
    python3 -m venv "$OUT/venv"
    "$OUT/venv/bin/pip" install --quiet --disable-pip-version-check 'cmake>=3.30'
fi

if [ ! -f "$OUT/sdist/$PYAERON.tar.gz" ]; then
    echo "aeron-c: the $PYAERON sdist into $OUT/sdist"
    # --ignore-requires-python: pyaeron asks for Python >= 3.12; only its source is wanted here.
    "$OUT/venv/bin/pip" download --quiet --disable-pip-version-check "pyaeron==$VERSION" \
        --no-deps --no-binary pyaeron --ignore-requires-python -d "$OUT/sdist"
fi

if [ ! -f "$SOURCE/CMakeLists.txt" ]; then
    echo "aeron-c: unpacking into $OUT/src"
    rm -rf "$OUT/src"
    mkdir -p "$OUT/src"
    tar xzf "$OUT/sdist/$PYAERON.tar.gz" -C "$OUT/src"
fi

if [ ! -f "$OUT/cmake/CMakeCache.txt" ]; then
    echo "aeron-c: configuring $OUT/cmake"
    # AERON_INSTALL_TARGETS=OFF: its install step wants aeron-config.cmake.in, not in the sdist.
    # GIT_CEILING_DIRECTORIES: Aeron stamps its version with `git log` in its source folder,
    # which would otherwise find this repository and stamp its commit.
    GIT_CEILING_DIRECTORIES="$OUT/src" "$OUT/venv/bin/cmake" -S "$SOURCE" -B "$OUT/cmake" \
        -DCMAKE_BUILD_TYPE=Release -DBUILD_AERON_DRIVER=ON -DBUILD_AERON_ARCHIVE_API=OFF -DAERON_TESTS=OFF \
        -DAERON_UNIT_TESTS=OFF -DAERON_SYSTEM_TESTS=OFF -DAERON_BUILD_SAMPLES=OFF \
        -DAERON_BUILD_DOCUMENTATION=OFF -DAERON_INSTALL_TARGETS=OFF >"$OUT/cmake-configure.log" \
        || { tail -30 "$OUT/cmake-configure.log"; rm -f "$OUT/cmake/CMakeCache.txt"; exit 1; }
fi

echo "aeron-c: building libaeron and aeronmd ($JOBS jobs)"
"$OUT/venv/bin/cmake" --build "$OUT/cmake" --parallel "$JOBS" --target aeron aeronmd \
    >"$OUT/cmake-build.log" || { tail -30 "$OUT/cmake-build.log"; exit 1; }

mkdir -p "$OUT/bin"
ln -sfn "$SOURCE_REL/aeron-client/src/main/c" "$OUT/include"
ln -sfn cmake/lib "$OUT/lib"
ln -sfn ../cmake/binaries/aeronmd "$OUT/bin/aeronmd"
echo "aeron-c: $OUT/lib/libaeron.so, $OUT/bin/aeronmd, headers in $OUT/include"
