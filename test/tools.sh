#!/usr/bin/env bash
# Installs the system tools imagepipe's tests and benchmarks use, when missing:
# qemu-img and qemu-io (the conversion oracle), skopeo (an independent registry
# client), mkfs.ext4 (realistic filesystem images), the partitioning and mkfs
# tools, syslinux's MBR code, systemd-boot and mtools (guest disks for
# internal/guest), QEMU, OVMF, mmdebstrap, syslinux, busybox-static, cpio
# and xorriso (the guests test/guests.sh builds and test/guest boots),
# GNU time (peak memory), zstd,
# xz and gzip (wrapped sources), libisal-dev (ISA-L gzip), socat, unshare and
# mount (network and mount namespaces of the node stand-in and some tests), then
# builds the distribution registry, MinIO, crane, etcd, kube-apiserver, kubectl,
# kube-controller-manager, CDI's controller and importer, the CDI/KubeVirt
# CRDs and CDI's zstd decoding (test/zstdref) (test/buildtools.sh,
# test/buildkube.sh), and the test guests (test/guests.sh).
set -euo pipefail

need=()
command -v qemu-img >/dev/null || need+=(qemu-utils)
command -v qemu-io >/dev/null || need+=(qemu-utils)
command -v skopeo >/dev/null || need+=(skopeo)
command -v mkfs.ext4 >/dev/null || need+=(e2fsprogs)
# guest filesystems for internal/guest, made by their own tools
command -v mkfs.xfs >/dev/null || need+=(xfsprogs)
command -v mkfs.btrfs >/dev/null || need+=(btrfs-progs)
command -v mkfs.fat >/dev/null || need+=(dosfstools)
command -v mkntfs >/dev/null || need+=(ntfs-3g)
command -v hivexsh >/dev/null || need+=(libhivex-bin) # writes registry hives for the Windows reader's tests
command -v pvcreate >/dev/null || need+=(lvm2)
command -v sfdisk >/dev/null || need+=(fdisk)
command -v sgdisk >/dev/null || need+=(gdisk)
[ -f /usr/lib/syslinux/mbr/mbr.bin ] || need+=(syslinux-common) # real MBR boot code
[ -f /usr/lib/systemd/boot/efi/systemd-bootx64.efi ] || need+=(systemd-boot-efi) # a real EFI loader
command -v mcopy >/dev/null || need+=(mtools)
command -v dpkg-query >/dev/null || need+=(dpkg) # the oracle of the dpkg status reader
command -v rpmbuild >/dev/null || need+=(rpm) # rpm and rpmbuild: the rpm database reader's oracle
command -v sqlite3 >/dev/null || need+=(sqlite3) # shrinks rpm's database into a fuzz seed
[ -x /usr/bin/time ] || need+=(time)
command -v zstd >/dev/null || need+=(zstd)
[ -f /usr/include/isa-l/igzip_lib.h ] || need+=(libisal-dev)
command -v socat >/dev/null || need+=(socat)
command -v ss >/dev/null || need+=(iproute2)
command -v unshare >/dev/null || need+=(util-linux)
command -v mount >/dev/null || need+=(mount)
command -v xz >/dev/null || need+=(xz-utils)
command -v gzip >/dev/null || need+=(gzip)
command -v make >/dev/null || need+=(make)
# the guests test/guests.sh builds from Debian packages and the tests boot
command -v qemu-system-x86_64 >/dev/null || need+=(qemu-system-x86)
[ -f /usr/share/OVMF/OVMF_CODE_4M.fd ] || need+=(ovmf)
command -v mmdebstrap >/dev/null || need+=(mmdebstrap)
command -v syslinux >/dev/null || need+=(syslinux) # installs syslinux on a FAT image through mtools
dpkg-query -W -f='${Status}' busybox-static 2>/dev/null | grep -q 'ok installed' || need+=(busybox-static)
command -v cpio >/dev/null || need+=(cpio)
command -v xorrisofs >/dev/null || need+=(xorriso) # KubeVirt's NoCloud seed, as virt-launcher makes it

if [ ${#need[@]} -gt 0 ]; then
	echo "installing: ${need[*]}"
	if [ "$(id -u)" -eq 0 ]; then
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
	elif command -v sudo >/dev/null; then
		sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}"
	else
		echo "missing ${need[*]}: install them with apt-get (needs root)" >&2
		exit 1
	fi
fi

# The real components the integration tests run, built from the Go module
# proxy in three lanes of about equal length (about 22 minutes each on a fresh
# 2-core machine, measured): while one lane waits on the module
# proxy or links single-threaded, the others keep the cores busy. Each lane's
# lines carry its name; the first failure fails the run once all have ended.
here="$(dirname "$0")"
# Less garbage collection in the compiler and linker: a tenth less CPU on a
# cold build cache, each process capped by GOMEMLIMIT (as the Makefile's GOBUILD).
export GOGC=400 GOMEMLIMIT=4GiB
lane() {
	local name=$1
	shift
	"$@" 2>&1 | sed -u "s/^/[$name] /"
}
lane kube bash -c "bash '$here/buildkube.sh' && bash '$here/buildtools.sh' etcd crane" &
kube=$!
lane servers bash -c "bash '$here/buildtools.sh' minio registry zot && bash '$here/kubevirt/build-admission.sh'" &
servers=$!
# The guests: mostly apt's downloads and dpkg, a few minutes the first time.
lane guests bash "$here/guests.sh" &
guests=$!
status=0
lane kubevirt bash "$here/buildtools.sh" cosign cdi crds zstdref || status=$?
wait "$kube" || status=$?
wait "$servers" || status=$?
wait "$guests" || status=$?
exit "$status"
