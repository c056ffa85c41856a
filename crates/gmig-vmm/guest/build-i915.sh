#!/bin/sh
# Builds `gmig-i915-blit` (i915.c), the guest program that renders frames on the blitter through
# Linux's i915 uAPI, as a static program, and prints its path.
#   usage: build-i915.sh OUT      (OUT: the program to write, or a directory to put it in)
# CC overrides the compiler (default gcc; glibc's static libraries are needed: libc6-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-i915.sh OUT}
if [ -d "$out" ]; then
    out=${out%/}/gmig-i915-blit
fi
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -std=gnu11 "$here/i915.c" -o "$out" >&2
echo "$out"
