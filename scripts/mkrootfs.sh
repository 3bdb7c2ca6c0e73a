#!/usr/bin/env bash
# mkrootfs.sh DIR: a small real rootfs for demos and tests: Debian's static
# busybox with its applets, plus the host's bash and the libraries it needs
# (the E2B SDK runs commands with /bin/bash -l -c), and minimal /etc.
set -euo pipefail
dir=${1:?usage: mkrootfs.sh DIR}
bb=$(command -v busybox) || { echo "mkrootfs: busybox not found (apt-get install busybox-static)" >&2; exit 1; }
rm -rf "$dir"
mkdir -p "$dir"/{bin,sbin,usr/bin,usr/sbin,etc,tmp,root,home/user,proc,sys,dev,run,var/tmp,workspace}
chmod 1777 "$dir/tmp" "$dir/var/tmp"
cp "$bb" "$dir/bin/busybox"
for applet in $("$bb" --list); do
  [ "$applet" = busybox ] && continue
  [ -e "$dir/bin/$applet" ] || ln -s busybox "$dir/bin/$applet"
done
copy_with_libs() {
  local bin=$1 dest=$2
  cp -L "$bin" "$dir$dest"
  ldd "$bin" 2>/dev/null | grep -oE '/[^ ]+' | while read -r lib; do
    mkdir -p "$dir$(dirname "$lib")"
    cp -Ln "$lib" "$dir$lib"
  done
}
rm -f "$dir/bin/bash"
copy_with_libs "$(command -v bash)" /bin/bash
cat > "$dir/etc/passwd" <<'P'
root:x:0:0:root:/root:/bin/sh
user:x:1000:1000:user:/home/user:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/false
P
cat > "$dir/etc/group" <<'G'
root:x:0:
user:x:1000:
nogroup:x:65534:
G
chown 1000:1000 "$dir/home/user"
echo "dsec-rootfs" > "$dir/etc/hostname"
printf 'export PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin\n' > "$dir/etc/profile"
echo "hello from the image" > "$dir/workspace/README"
