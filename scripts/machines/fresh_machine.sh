#!/usr/bin/env bash
# A fresh-machine check for maintainers, before a release: the README's two commands, `bash scripts/tour.sh`
# then `bash scripts/test.sh`, run as root inside a brand-new minimal Debian 12 root made by debootstrap
# from Debian's packages, so that nothing installed by hand on this machine can hide a missing install step.
#
#   sudo bash scripts/machines/fresh_machine.sh                 # the committed HEAD, cloned into the new root
#   sudo bash scripts/machines/fresh_machine.sh --worktree      # the working tree as it is, uncommitted changes too
#   sudo bash scripts/machines/fresh_machine.sh --keep --dir /var/tmp/dp-fresh --logs /var/tmp/dp-fresh-logs
#
# It takes about 18 minutes on 2 cores (measured 2026-12-03 at 85bed44): debootstrap under 1, the tour 6
# (Debian's packages, the build, every stage), the test suite 11 (the tests' build 2, ctest 7). Correct
# output ends with
#   fresh_machine: tour.sh exit 0 in N s; test.sh exit 0 in N s; ctest: N passed, 0 failed, 0 skipped
#   fresh_machine: PASS
# and exit 0. Exit 1: a command failed or a test was skipped (the logs say which); exit 2: bad arguments or
# not root. Whatever happens, everything mounted in the root is unmounted, its processes are ended, the
# network namespaces the tests made are removed, and the root is deleted (unless --keep).
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir="" logs=/var/tmp/dp-fresh-logs keep=0 worktree=0
mirror=http://deb.debian.org/debian
usage() { sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    --worktree) worktree=1 ;;
    --keep) keep=1 ;;
    --dir) dir=${2:?--dir needs a folder}; shift ;;
    --logs) logs=${2:?--logs needs a folder}; shift ;;
    --mirror) mirror=${2:?--mirror needs a URL}; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "fresh_machine: unknown argument '$1'; use --worktree, --keep, --dir DIR, --logs DIR or --mirror URL" >&2; exit 2 ;;
  esac
  shift
done
[ "$(id -u)" = 0 ] || { echo "fresh_machine: debootstrap, chroot and mounts need root (id -u is $(id -u)): run it with sudo" >&2; exit 2; }
if [ -n "$dir" ] && [ -e "$dir" ] && [ -n "$(ls -A "$dir" 2>/dev/null)" ]; then
  echo "fresh_machine: --dir $dir exists and is not empty: give a new folder (it is deleted at the end)" >&2; exit 2
fi
command -v debootstrap >/dev/null || {
  echo "fresh_machine: installing debootstrap"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null || { apt-get update -qq && apt-get install -y -qq debootstrap; }
}
[ -n "$dir" ] || dir=$(mktemp -d /var/tmp/dp-fresh.XXXXXX)
mkdir -p "$dir" "$logs"
dir=$(cd "$dir" && pwd)
chmod 755 "$dir"  # mktemp's 0700 would lock the root's own users out of / (_apt, munge's postinst)

mounted=()
teardown() {
  local rc=$?
  trap - EXIT INT TERM
  # The tests' network namespaces live in the root's /run/netns; the launcher removes what a killed run left.
  if [ -x "$dir/src/build/bin/ddp_launch" ] && mountpoint -q "$dir/proc"; then
    chroot "$dir" /src/build/bin/ddp_launch --net-cleanup >/dev/null 2>&1 || true
  fi
  # End every process whose root is the new root, then unmount in reverse order (lazily if still busy).
  for p in /proc/[0-9]*; do
    [ "$(readlink "$p/root" 2>/dev/null)" = "$dir" ] && kill -9 "${p#/proc/}" 2>/dev/null
  done
  sleep 1
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do
    umount "${mounted[i]}" 2>/dev/null || umount -l "${mounted[i]}" 2>/dev/null || true
  done
  # Anything else mounted below the root (netns files bind-mounted by `ip netns add`), deepest first.
  grep -o " $dir/[^ ]*" /proc/mounts | sort -r | while read -r m; do umount -l "$m" 2>/dev/null; done
  if grep -q " $dir" /proc/mounts; then
    echo "fresh_machine: still mounted under $dir:" >&2; grep " $dir" /proc/mounts >&2; rc=1
  elif [ "$keep" = 0 ]; then
    rm -rf --one-file-system "$dir"
  else
    echo "fresh_machine: kept the root in $dir"
  fi
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM
mnt() {  # type-or-bind source target [options]
  mkdir -p "$3"
  if [ "$1" = bind ]; then mount --bind "$2" "$3"; else mount -t "$1" ${4:+-o "$4"} "$2" "$3"; fi || {
    echo "fresh_machine: could not mount $2 on $3" >&2; exit 1; }
  mounted+=("$3")
}

t0=$(date +%s)
echo "fresh_machine: debootstrap --variant=minbase bookworm $dir $mirror"
debootstrap --variant=minbase bookworm "$dir" "$mirror" > "$logs/debootstrap.log" 2>&1 || {
  echo "fresh_machine: debootstrap failed; its log:" >&2; tail -n 30 "$logs/debootstrap.log" >&2; exit 1; }
t1=$(date +%s)
echo "fresh_machine: the root is ready in $((t1 - t0)) s ($(du -sh "$dir" | cut -f1))"

# The project: a clean clone of HEAD (what would land), or the working tree as it is (no build outputs).
if [ "$worktree" = 1 ]; then
  mkdir -p "$dir/src"
  tar -C "$repo" --exclude='./build*' --exclude='./.git' -cf - . | tar -C "$dir/src" -xf -
  echo "fresh_machine: copied the working tree of $repo"
else
  git clone -q "$repo" "$dir/src" || { echo "fresh_machine: git clone of $repo failed" >&2; exit 1; }
  echo "fresh_machine: cloned $(git -C "$dir/src" log -1 --format='%h %s' | cut -c1-100)"
fi

# What a booted machine has: / as a mount point of its own (`ip netns exec` remounts / as a slave, which a
# plain folder cannot be), /proc, /sys with its cgroup hierarchy (slurmd needs it), /dev, a tmpfs /run
# (ip netns keeps its namespaces there), DNS, and the /etc/hosts that Debian's installer writes (this host's
# name on 127.0.1.1: torchrun and Slurm resolve it).
mnt bind "$dir" "$dir"
mount --make-private "$dir"
mnt proc proc "$dir/proc"
mnt sysfs sysfs "$dir/sys"
# The host's cgroup mounts (v2 alone, or v1's tmpfs and controllers), each bound at the same place, in order.
while read -r m; do mnt bind "$m" "$dir$m"; done < <(awk '$2 ~ "^/sys/fs/cgroup(/|$)" {print $2}' /proc/mounts)
mnt bind /dev "$dir/dev"
mnt devpts devpts "$dir/dev/pts" gid=5,mode=620,ptmxmode=666
mnt tmpfs tmpfs "$dir/run" mode=755
mnt tmpfs tmpfs "$dir/dev/shm" mode=1777
cp -L /etc/resolv.conf "$dir/etc/resolv.conf"
# This network's own trust: a machine here reaches Debian and PyPI through the CAs installed in
# /usr/local/share/ca-certificates (and pip's /etc/pip.conf, if any); the new root gets the same, so that
# update-ca-certificates keeps them when the ca-certificates package arrives.
if compgen -G "/usr/local/share/ca-certificates/*.crt" >/dev/null; then
  mkdir -p "$dir/usr/local/share/ca-certificates" "$dir/etc/ssl/certs"
  cp /usr/local/share/ca-certificates/*.crt "$dir/usr/local/share/ca-certificates/"
  cp -L /etc/ssl/certs/ca-certificates.crt "$dir/etc/ssl/certs/ca-certificates.crt"
fi
[ -f /etc/pip.conf ] && cp /etc/pip.conf "$dir/etc/pip.conf"
cp /etc/apt/sources.list.d/*.sources "$dir/etc/apt/sources.list.d/" 2>/dev/null || true
echo "$(hostname)" > "$dir/etc/hostname"
printf '127.0.0.1\tlocalhost\n127.0.1.1\t%s\n\n::1\tlocalhost ip6-localhost ip6-loopback\nff02::1\tip6-allnodes\nff02::2\tip6-allrouters\n' \
    "$(hostname)" > "$dir/etc/hosts"

run_in_root() {  # name, command: a clean root login's environment, output to $logs/name.log
  local name=$1; shift
  local start=$(date +%s)
  # In the background and waited for: bash runs the INT/TERM trap (and so the teardown) at once during a
  # `wait`, but only after a foreground command has finished.
  chroot "$dir" /usr/bin/env -i HOME=/root LANG=C.UTF-8 TERM=dumb PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    bash -c "cd /src && $*" > "$logs/$name.log" 2>&1 < /dev/null &
  wait $!
  local rc=$?
  echo "$name $rc $(( $(date +%s) - start ))" >> "$logs/summary.txt"
  echo "fresh_machine: $name exit $rc in $(( $(date +%s) - start )) s (log: $logs/$name.log)"
  return $rc
}
: > "$logs/summary.txt"
run_in_root tour "bash scripts/tour.sh"; tour_rc=$?
run_in_root test "bash scripts/test.sh"; test_rc=$?

# ctest's counts: its summary line and its skipped tests.
line=$(grep -E "tests passed, [0-9]+ tests failed out of [0-9]+" "$logs/test.log" | tail -n 1)
total=$(sed -E 's/.* out of ([0-9]+).*/\1/' <<< "$line")
failed=$(sed -E 's/.* ([0-9]+) tests failed.*/\1/' <<< "$line")
skipped=$(grep -cE "\*\*\*Skipped|Not Run" "$logs/test.log")
passed=$(( ${total:-0} - ${failed:-0} - skipped ))
tour_s=$(awk '$1 == "tour" {print $3}' "$logs/summary.txt"); test_s=$(awk '$1 == "test" {print $3}' "$logs/summary.txt")
echo "fresh_machine: tour.sh exit $tour_rc in ${tour_s} s; test.sh exit $test_rc in ${test_s} s; ctest: $passed passed, ${failed:-?} failed, $skipped skipped"
if [ -n "$line" ] && [ "$tour_rc" = 0 ] && [ "$test_rc" = 0 ] && [ "$skipped" = 0 ]; then
  echo "fresh_machine: PASS"
  exit 0
fi
[ "$skipped" = 0 ] || grep -E "\*\*\*Skipped|Not Run" "$logs/test.log" | sed 's/^/fresh_machine: skipped: /'
echo "fresh_machine: FAIL (logs in $logs)"
exit 1
