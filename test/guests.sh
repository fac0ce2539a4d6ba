#!/usr/bin/env bash
# Builds the guests imagepipe's tests boot under QEMU, from Debian packages
# only (the configured apt sources), into $IMAGEPIPE_CACHE/guests/KEY
# (default $HOME/.cache/imagepipe/guests/KEY). KEY is derived from this
# script and the candidate versions of the Debian packages the guests are
# made of, so a new kernel, cloud-init or boot loader builds them anew; a
# complete directory is left as it is. The disks are sparse raw files:
#
#   bios.raw    MBR, syslinux on an active FAT partition: BIOS only
#   uefi.raw    GPT, systemd-boot on an ESP, no MBR boot code: UEFI only
#   hybrid.raw  GPT with syslinux's GPT MBR code and an ESP holding both
#               syslinux (legacy BIOS bootable) and systemd-boot
#   debian.raw  Debian (mmdebstrap --variant=apt) with Debian's cloud
#               kernel, systemd, cloud-init limited to NoCloud, OpenSSH
#               and the QEMU guest agent, booted by syslinux (BIOS); its
#               network is DHCP through systemd-networkd
#
# The first three boot Debian's cloud kernel into a busybox init that
# prints the boot signal below with the firmware it booted from, then
# powers off. The kernel command line of all four has console=ttyS0.
#
#   guests.sh          build what is missing, print the directory
#   guests.sh --dir    print the directory this script and the machine's
#                      package versions select, building nothing
#
# Needs root (mmdebstrap's root mode) and the packages test/tools.sh
# installs.
set -euo pipefail

# signal is the line the small guests print once booted; the Go tests
# (internal/bootcheck's, test/guest's) look for it.
signal="IMAGEPIPE-GUEST-BOOTED"

cache="${IMAGEPIPE_CACHE:-$HOME/.cache/imagepipe}/guests"
# shellcheck source=/dev/null
suite="$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")"

kernel_pkg="$(apt-cache depends linux-image-cloud-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')"
[ -n "$kernel_pkg" ] || { echo "guests.sh: apt knows no linux-image-cloud-amd64 (run apt-get update)" >&2; exit 1; }

# versions prints what the key is made of: this script, the suite, and
# each package's candidate version (one apt-cache call: the tests ask).
versions() {
	local pkgs=("$kernel_pkg" busybox-static syslinux syslinux-common systemd-boot-efi cloud-init openssh-server systemd qemu-guest-agent)
	echo "script $(sha256sum "$0" | cut -d' ' -f1)"
	echo "suite $suite"
	apt-cache policy "${pkgs[@]}" | awk '/^[^ ].*:$/ {p = substr($1, 1, length($1) - 1)} /Candidate:/ {print p, $2}' >"$1"
	for p in "${pkgs[@]}"; do
		if ! grep -q "^$p [^(]" "$1"; then
			echo "guests.sh: apt has no candidate for $p" >&2
			exit 1
		fi
	done
	cat "$1"
}
listing="$(mktemp)"
vers="$(versions "$listing")"
rm -f "$listing"
key="$(printf '%s\n' "$vers" | sha256sum | cut -c1-16)"
dir="$cache/$key"

if [ "${1:-}" = "--dir" ]; then
	echo "$dir"
	exit 0
fi
if [ -f "$dir/versions" ]; then
	echo "$dir"
	exit 0
fi
[ "$(id -u)" -eq 0 ] || { echo "guests.sh: building the guests needs root (mmdebstrap)" >&2; exit 1; }

mkdir -p "$dir"
work="$(mktemp -d "$cache/.build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
log() { echo "guests.sh: $*" >&2; }

# The cloud kernel for the small guests.
log "kernel $kernel_pkg"
(cd "$work" && apt-get download -q "$kernel_pkg" >/dev/null 2>&1) || { log "apt-get download $kernel_pkg failed"; exit 1; }
dpkg-deb -x "$work"/linux-image-*.deb "$work/kernel"
vmlinuz="$(ls "$work"/kernel/boot/vmlinuz-*)"

# The busybox init: the boot signal on the serial console, then power off.
mkdir -p "$work/initrd/bin"
cp /bin/busybox "$work/initrd/bin/busybox"
cat >"$work/initrd/init" <<EOF
#!/bin/busybox sh
/bin/busybox --install -s /bin
mkdir -p /dev /proc /sys
mount -t devtmpfs dev /dev
exec </dev/console >/dev/console 2>&1
mount -t proc proc /proc
mount -t sysfs sys /sys
fw=bios
[ -d /sys/firmware/efi ] && fw=uefi
echo "$signal firmware=\$fw"
poweroff -f
EOF
chmod 0755 "$work/initrd/init"
(cd "$work/initrd" && find . | LC_ALL=C sort | cpio --quiet -o -H newc --reproducible | gzip -9n) >"$work/initrd.img"

cmdline="console=ttyS0 panic=-1 quiet"

# fat MIB FILE: a FAT filesystem of MIB MiB holding the kernel and initrd,
# with syslinux's and systemd-boot's configuration.
fat() {
	local img=$2
	rm -f "$img"
	truncate -s "$1M" "$img"
	mkfs.fat -F 16 -n BOOT "$img" >/dev/null
	mcopy -i "$img" "$vmlinuz" ::/vmlinuz
	mcopy -i "$img" "$work/initrd.img" ::/initrd.img
	printf 'DEFAULT guest\nPROMPT 0\nTIMEOUT 0\nLABEL guest\n  KERNEL /vmlinuz\n  APPEND initrd=/initrd.img %s\n' "$cmdline" >"$work/syslinux.cfg"
	mcopy -i "$img" "$work/syslinux.cfg" ::/syslinux.cfg
	mmd -i "$img" ::/EFI ::/EFI/BOOT ::/loader ::/loader/entries
	printf 'timeout 0\ndefault guest.conf\n' >"$work/loader.conf"
	printf 'title imagepipe test guest\nlinux /vmlinuz\ninitrd /initrd.img\noptions %s\n' "$cmdline" >"$work/guest.conf"
	mcopy -i "$img" "$work/loader.conf" ::/loader/loader.conf
	mcopy -i "$img" "$work/guest.conf" ::/loader/entries/guest.conf
}
with_syslinux() {
	mcopy -i "$1" /usr/lib/syslinux/modules/bios/ldlinux.c32 ::/ldlinux.c32
	syslinux --install "$1"
}
with_systemd_boot() {
	mcopy -i "$1" /usr/lib/systemd/boot/efi/systemd-bootx64.efi ::/EFI/BOOT/BOOTX64.EFI
}
# place PART DISK START_SECTOR: writes a partition image into a disk.
place() { dd status=none conv=notrunc,sparse bs=1M if="$1" of="$2" seek="$(($3 * 512))" oflag=seek_bytes; }

build_small() {
	local name=$1 out="$dir/$1.raw" tmp="$work/$1.raw" esp="$work/$1-esp.img"
	[ -f "$out" ] && return
	log "building $name.raw"
	fat 32 "$esp"
	truncate -s 40M "$tmp"
	case $name in
	bios)
		with_syslinux "$esp"
		printf 'label: dos\nstart=2048, size=65536, type=c, bootable\n' | sfdisk -q "$tmp"
		dd status=none conv=notrunc bs=440 count=1 if=/usr/lib/syslinux/mbr/mbr.bin of="$tmp"
		;;
	uefi)
		with_systemd_boot "$esp"
		sgdisk -n 1:2048:+32M -t 1:EF00 -c 1:ESP "$tmp" >/dev/null
		;;
	hybrid)
		with_syslinux "$esp"
		with_systemd_boot "$esp"
		sgdisk -n 1:2048:+32M -t 1:EF00 -c 1:ESP -A 1:set:2 "$tmp" >/dev/null
		dd status=none conv=notrunc bs=440 count=1 if=/usr/lib/syslinux/mbr/gptmbr.bin of="$tmp"
		;;
	esac
	place "$esp" "$tmp" 2048
	mv "$tmp" "$out"
}
for g in bios uefi hybrid; do build_small "$g"; done

build_debian() {
	local out="$dir/debian.raw" tmp="$work/debian.raw" root="$work/root"
	[ -f "$out" ] && return
	log "building debian.raw (mmdebstrap $suite)"
	local uuid
	uuid="$(cat /proc/sys/kernel/random/uuid)"
	# The hooks' $1 is mmdebstrap's: the root being built.
	# shellcheck disable=SC2016
	mmdebstrap --quiet --variant=apt \
		--include=linux-image-cloud-amd64,systemd-sysv,udev,cloud-init,openssh-server,qemu-guest-agent \
		--dpkgopt='path-exclude=/usr/share/man/*' \
		--dpkgopt='path-exclude=/usr/share/locale/*' \
		--dpkgopt='path-include=/usr/share/locale/locale.alias' \
		--dpkgopt='path-exclude=/usr/share/doc/*' \
		--dpkgopt='path-include=/usr/share/doc/*/copyright' \
		--customize-hook="echo 'UUID=$uuid / ext4 defaults,errors=remount-ro 0 1' >\"\$1/etc/fstab\"" \
		--customize-hook='echo guest >"$1/etc/hostname"' \
		--customize-hook='printf "datasource_list: [NoCloud, None]\nssh_genkeytypes: [ed25519]\n" >"$1/etc/cloud/cloud.cfg.d/90-imagepipe.cfg"' \
		--customize-hook='printf "[Match]\nName=en* eth*\n\n[Network]\nDHCP=yes\n" >"$1/etc/systemd/network/99-dhcp.network"' \
		--customize-hook='chroot "$1" systemctl enable systemd-networkd.service' \
		--customize-hook='rm -f "$1"/etc/ssh/ssh_host_*' \
		--customize-hook='rm -rf "$1"/var/lib/apt/lists/* "$1"/var/cache/apt/*.bin' \
		"$suite" "$root" >&2

	# What was installed: apt's indexes may be newer than the machine's.
	dpkg-query --admindir="$root/var/lib/dpkg" -W >"$dir/debian.packages"

	# A FAT boot partition (syslinux, the kernel and initrd) and the ext4 root.
	local boot="$work/debian-boot.img" rootfs="$work/debian-root.img" mib
	rm -f "$boot"
	truncate -s 96M "$boot"
	mkfs.fat -F 16 -n BOOT "$boot" >/dev/null
	mcopy -i "$boot" "$root"/boot/vmlinuz-* ::/vmlinuz
	mcopy -i "$boot" "$root"/boot/initrd.img-* ::/initrd.img
	printf 'DEFAULT debian\nPROMPT 0\nTIMEOUT 0\nLABEL debian\n  KERNEL /vmlinuz\n  APPEND initrd=/initrd.img root=UUID=%s ro console=tty0 console=ttyS0,115200\n' "$uuid" >"$work/syslinux.cfg"
	mcopy -i "$boot" "$work/syslinux.cfg" ::/syslinux.cfg
	with_syslinux "$boot"
	# The root's size: what the tree holds and a third more.
	mib=$(($(du -sm "$root" | cut -f1) * 4 / 3 + 256))
	truncate -s "${mib}M" "$rootfs"
	mkfs.ext4 -q -F -U "$uuid" -L root -d "$root" "$rootfs"
	truncate -s "$((1 + 96 + mib))M" "$tmp"
	printf 'label: dos\nstart=2048, size=%d, type=c, bootable\nstart=%d, type=83\n' $((96 * 2048)) $((2048 + 96 * 2048)) | sfdisk -q "$tmp"
	dd status=none conv=notrunc bs=440 count=1 if=/usr/lib/syslinux/mbr/mbr.bin of="$tmp"
	place "$boot" "$tmp" 2048
	place "$rootfs" "$tmp" $((2048 + 96 * 2048))
	mv "$tmp" "$out"
}
build_debian

printf '%s\nsignal %s\n' "$vers" "$signal" >"$dir/versions"
log "built in $dir"
echo "$dir"
