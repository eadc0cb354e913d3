#!/usr/bin/env bash
# Write a root filesystem tarball holding this Debian machine's own python3.11 and libstdc++6
# and every package they depend on (their dpkg dependency closure), for `podman import` or
# `docker import`: a base image with Python 3.11 and nothing else (no shell, no pip), made
# without a registry or a Debian mirror, in a few seconds.
#
#   containers/base/host-python-rootfs.sh OUT.tar [EXTRA_PACKAGE ...]
#
# Only packages installed here are copied (an alternative dependency is satisfied by the first
# installed one); a dependency that is not installed stops the script, naming it.
set -euo pipefail
out=${1:?usage: $0 OUT.tar [EXTRA_PACKAGE ...]}
shift
command -v dpkg-query >/dev/null || { echo "$0: needs a Debian machine (dpkg-query)" >&2; exit 2; }

installed() { dpkg-query -W -f='${db:Status-Abbrev}' "$1" 2>/dev/null | grep -q '^ii'; }

declare -A seen=()
todo=(python3.11 libstdc++6 "$@")  # C++ runtime: binary wheels (pyzmq) link it, as in python:*-slim
while ((${#todo[@]})); do
  pkg=${todo[-1]}
  unset 'todo[-1]'
  [[ -n ${seen[$pkg]:-} ]] && continue
  installed "$pkg" || { echo "$0: package $pkg is not installed here" >&2; exit 2; }
  seen[$pkg]=1
  deps=$(dpkg-query -W -f='${Pre-Depends}, ${Depends}' "$pkg")
  IFS=',' read -ra groups <<<"$deps"
  for group in "${groups[@]}"; do
    [[ -z ${group// /} ]] && continue
    IFS='|' read -ra alternatives <<<"$group"
    found=""
    for alt in "${alternatives[@]}"; do
      name=$(sed -E 's/^ *//; s/[ (:].*$//' <<<"$alt")
      if installed "$name"; then found=$name; break; fi
    done
    [[ -n $found ]] || { echo "$0: no installed package satisfies '$group' ($pkg)" >&2; exit 2; }
    todo+=("$found")
  done
done

# Every file and folder of those packages (folders first, so tar keeps their modes), plus the
# few things a container expects: /tmp, /etc/passwd for root, the python3 name.
list=$(mktemp)
trap 'rm -f "$list"' EXIT
for pkg in "${!seen[@]}"; do dpkg-query -L "$pkg"; done \
  | grep -v -e '^/usr/share/doc' -e '^/usr/share/man' -e '^/usr/share/locale' \
  | sed -E 's#^/(bin|sbin|lib|lib32|lib64|libx32)(/|$)#/usr/\1\2#' \
  | sort -u | sed 's|^/||' | grep -v -e '^\.$' -e '^$' -e '^usr$' >"$list"
stage=$(mktemp -d)
trap 'rm -f "$list"; rm -rf "$stage"' EXIT
mkdir -p "$stage"/{tmp,etc,root,proc,sys,dev,run} "$stage/usr/bin"
chmod 1777 "$stage/tmp"
printf 'root:x:0:0:root:/root:/usr/sbin/nologin\n' >"$stage/etc/passwd"
printf 'root:x:0:\n' >"$stage/etc/group"
ln -s python3.11 "$stage/usr/bin/python3"
# Debian 12 merged /usr: /bin, /sbin, /lib and /lib64 are links into /usr (the packages'
# paths were moved under usr/ above). The files are copied into the stage, then archived once.
for link in bin sbin lib lib64; do
  if [[ -L /$link ]]; then mkdir -p "$stage/usr/$link" && ln -s "usr/$link" "$stage/$link"; fi
done
tar -C / --no-recursion -cf - -T "$list" | tar -C "$stage" -xpf -
tar -C "$stage" --numeric-owner -cf "$out" .
echo "$out: ${#seen[@]} packages: ${!seen[*]}" >&2
