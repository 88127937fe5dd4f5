"""Builds the two native extensions; all metadata lives in pyproject.toml.

shmbus.shm._native (shmbus/shm/native/): the core every process maps. netbridge._io
(netbridge/native/): what only the netbridge runs; it includes _native's headers and reaches
its types through the capsule shmbus.shm._native._C_API, and links OpenSSL's libcrypto (the
headers come from libssl-dev on Debian, openssl-devel in the manylinux image).
"""

from glob import glob

from setuptools import Extension, setup

FLAGS = ["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"]
CORE_HEADERS = sorted(glob("shmbus/shm/native/*.h"))

setup(
    ext_modules=[
        Extension(
            "shmbus.shm._native",
            sources=sorted(glob("shmbus/shm/native/*.c")),
            depends=CORE_HEADERS,
            extra_compile_args=FLAGS,
        ),
        Extension(
            "netbridge._io",
            sources=sorted(glob("netbridge/native/*.c")),
            include_dirs=["shmbus/shm/native"],
            depends=CORE_HEADERS + sorted(glob("netbridge/native/*.h")),
            extra_compile_args=FLAGS,
            libraries=["crypto"],  # OpenSSL's libcrypto: AES-256-GCM (sealing.c)
        ),
    ]
)
