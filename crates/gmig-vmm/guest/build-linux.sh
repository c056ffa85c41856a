#!/bin/sh
# Builds `gmig-guest`, the guest GPU driver as a static Linux program (linux.c + the core gpu.c
# the freestanding guest shares), and prints its path.
#   usage: build-linux.sh OUT      (OUT: the program to write, or a directory to put gmig-guest in)
# CC overrides the compiler (default gcc; glibc's static libraries are needed: libc6-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-linux.sh OUT}
if [ -d "$out" ]; then
    out=${out%/}/gmig-guest
fi
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -std=gnu11 \
    "$here/linux.c" "$here/gpu.c" -o "$out" >&2
echo "$out"
