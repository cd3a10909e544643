#!/usr/bin/env bash
# What the test suite runs besides Python, by command and the Debian package that has it. `make test` runs this
# first: nothing happens when every command is there; as root, apt-get installs the missing packages; otherwise
# it names them (their tests skip, and under CI=true fail, with the same reason).
set -euo pipefail
cd "$(dirname "$0")/.."
NEEDS="tmux:tmux ip:iproute2 tc:iproute2 setpriv:util-linux mount:mount umount:mount losetup:mount
mkfs.ext4:e2fsprogs pgrep:procps truncate:coreutils make:make chromium:chromium"
export PATH="$PATH:/usr/sbin:/sbin"  # iproute2, mount and e2fsprogs live there; a user's PATH may lack them
missing=()
for pair in $NEEDS; do
  command -v "${pair%%:*}" >/dev/null || missing+=("${pair#*:}")
done
[ -x .venv/bin/python ] || python3 -c 'import ensurepip' 2>/dev/null || missing+=(python3-venv)  # `python3 -m venv`
[ ${#missing[@]} -eq 0 ] && exit 0
packages=$(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')
if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
  echo "scripts/ci-deps.sh: installing ${packages}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $packages &&
    exit  # else (no network, say) as below
fi
echo "scripts/ci-deps.sh: missing ${packages}(apt-get install -y ${packages% } as root): their tests skip" \
     "(under CI=true they fail)" >&2
[ "${CI:-}" != true ]
