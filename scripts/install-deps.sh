#!/usr/bin/env bash
# Installs what dsec's demo and tests need on a fresh Debian machine (root).
# Idempotent and quiet when everything is already there.
set -euo pipefail
need=()
command -v busybox >/dev/null 2>&1 || need+=(busybox-static)
command -v mkfs.ext4 >/dev/null 2>&1 || need+=(e2fsprogs)
command -v mkfs.btrfs >/dev/null 2>&1 || need+=(btrfs-progs)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
command -v bash >/dev/null 2>&1 || need+=(bash)
command -v node >/dev/null 2>&1 || need+=(nodejs npm)
command -v python3 >/dev/null 2>&1 || need+=(python3)
if [ ${#need[@]} -gt 0 ]; then
  echo "install-deps: apt-get install ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
if ! command -v go >/dev/null 2>&1 && [ -x /usr/local/go/bin/go ]; then
  echo "install-deps: add /usr/local/go/bin to PATH" >&2
fi
# The FUSE device and the modules dsec uses.
[ -e /dev/fuse ] || modprobe fuse 2>/dev/null || true
modprobe overlay 2>/dev/null || true
