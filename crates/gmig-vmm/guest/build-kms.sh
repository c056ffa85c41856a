#!/bin/sh
# Builds `gmig-kms-draw` (kms.c), the guest program that shows known images through Linux's KMS
# uAPI, as a static program, and prints its path.
#   usage: build-kms.sh OUT      (OUT: the program to write, or a directory to put it in)
# CC overrides the compiler (default gcc; glibc's static libraries are needed: libc6-dev).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
out=${1:?usage: build-kms.sh OUT}
if [ -d "$out" ]; then
    out=${out%/}/gmig-kms-draw
fi
${CC:-gcc} -static -O2 -Wall -Wextra -Werror -std=gnu11 "$here/kms.c" -o "$out" >&2
echo "$out"
