#!/usr/bin/env bash
# Runs a command inside a qemu VM whose stock Debian kernel brings real soft-RoCE
# (rdma_rxe, device rxe0), so the `verbs` provider runs against a real verbs stack
# (docs/rxe-vm.md, ../shared/docs/rxe-vm.md).
#
#   scripts/rxe-vm.sh [--timeout SECONDS] [--with-perftest] [--tsc] [--] COMMAND [ARGS...]
#
# --with-perftest: perftest (ib_read_lat, ib_write_bw, ...) is unpacked into the cache
# (apt-get download + dpkg-deb -x, with the libraries it needs that the host lacks) and put
# on the guest command's PATH and LD_LIBRARY_PATH.
# --tsc: the guest's clocksource is the TSC (`tsc=reliable clocksource=tsc`), for timing runs.
# Under TCG the guest kernel finds its vCPUs' TSCs "unsynchronized" and falls back to the
# HPET, which the vDSO cannot read: every clock_gettime is then a system call and an
# emulated MMIO read, where perftest reads the TSC with rdtsc.
#
# The guest mounts the host's / read-only (9p) under an overlay with a tmpfs upper layer and
# chroots into it, so host-built test executables (`cargo test --no-run`) run at their host
# paths with the host's libraries, in the current directory. Output streams to the terminal;
# the exit status is the command's. A hung or panicked guest is an error within the timeout
# (default 600 s), with the console log kept. Idempotent: the guest kernel (apt-get download
# + dpkg-deb -x, never installed on the host) and the initramfs are cached in
# $KVCM_RXE_CACHE (default target/rxe-vm). Needs root (apt-get for missing host tools).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$(pwd)

timeout_s=600
with_perftest=0
kernel_args=
while [ $# -gt 0 ]; do
    case "$1" in
        --timeout) timeout_s=$2; shift 2 ;;
        --with-perftest) with_perftest=1; shift ;;
        --tsc) kernel_args="$kernel_args tsc=reliable clocksource=tsc"; shift ;;
        --) shift; break ;;
        -*) echo "rxe-vm: unknown option $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
if [ $# -eq 0 ]; then
    echo "usage: scripts/rxe-vm.sh [--timeout SECONDS] [--with-perftest] [--tsc] [--] COMMAND [ARGS...]" >&2
    exit 2
fi

cache=${KVCM_RXE_CACHE:-$repo/target/rxe-vm}
mkdir -p "$cache"
cache=$(cd "$cache" && pwd)
phase_started=$SECONDS
phase() {
    echo "rxe-vm: $1 took $((SECONDS - phase_started)) s" >&2
    phase_started=$SECONDS
}

# 1. Host tools (qemu, busybox, kmod) and the verbs userland the guest runs from the host's
#    root (libibverbs, the rxe provider, the rdma tool).
need=()
for package in qemu-system-x86 busybox-static cpio kmod rdma-core ibverbs-providers iproute2; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || need+=("$package")
done
if [ "${#need[@]}" -gt 0 ]; then
    echo "rxe-vm: installing ${need[*]}" >&2
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi
phase "host tools"

# 2. The guest kernel and its modules, unpacked into the cache.
if ! ls "$cache"/kernel/boot/vmlinuz-* >/dev/null 2>&1; then
    package=$(apt-cache depends linux-image-amd64 | awk '/Depends: linux-image-/ {print $2; exit}')
    (cd "$cache" && rm -f linux-image-*.deb && apt-get download "$package" 2>/dev/null)
    rm -rf "$cache/kernel"
    dpkg-deb -x "$cache"/linux-image-*.deb "$cache/kernel"
    rm -f "$cache"/linux-image-*.deb
fi
vmlinuz=$(ls "$cache"/kernel/boot/vmlinuz-* | head -1)
kver=${vmlinuz##*/vmlinuz-}
[ -f "$cache/kernel/lib/modules/$kver/modules.dep" ] || depmod -b "$cache/kernel" "$kver"
phase "guest kernel $kver"

# 2b. perftest (only with --with-perftest): the package and those of its shared-library
#     dependencies the host lacks (the guest runs on the host's root), unpacked into the cache.
perftest_root="$cache/perftest"
perftest_libs="$perftest_root/usr/lib/x86_64-linux-gnu"
if [ "$with_perftest" = 1 ]; then
    if [ ! -x "$perftest_root/usr/bin/ib_read_lat" ]; then
        packages=(perftest)
        for package in $(apt-cache depends perftest | awk '/^ *Depends: lib/ {print $2}'); do
            dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" ||
                packages+=("$package")
        done
        download=$(mktemp -d "$cache/debs.XXXXXX")
        (cd "$download" && chmod 777 . && apt-get download "${packages[@]}" >/dev/null 2>&1) || {
            apt-get update -qq
            (cd "$download" && apt-get download "${packages[@]}" >/dev/null 2>&1)
        }
        rm -rf "$perftest_root"
        for deb in "$download"/*.deb; do dpkg-deb -x "$deb" "$perftest_root"; done
        rm -rf "$download"
        echo "rxe-vm: perftest unpacked from ${packages[*]}" >&2
    fi
    if LD_LIBRARY_PATH="$perftest_libs" ldd "$perftest_root/usr/bin/ib_read_lat" | grep 'not found' >&2; then
        echo "rxe-vm: perftest lacks the libraries above" >&2
        exit 1
    fi
    phase "perftest"
fi

# 3. The initramfs: static busybox, the modules, /init (rebuilt when this script changes).
stamp=$(sha256sum "$0" | cut -c1-16)
initrd="$cache/initrd-$kver-$stamp.cpio.gz"
if [ ! -f "$initrd" ]; then
    root=$(mktemp -d)
    mkdir -p "$root"/{bin,dev,proc,sys,host,upper,newroot,share,lib/modules}
    cp /bin/busybox "$root/bin/busybox"
    for tool in sh mount umount insmod ip mkdir cat echo poweroff sleep chroot; do
        ln -s busybox "$root/bin/$tool"
    done
    modules=(udp_tunnel ip6_udp_tunnel ib_core ib_uverbs crc32_generic rdma_rxe rdma_ucm
             virtio_pci virtio_net 9pnet_virtio 9p overlay)
    : > "$root/modules.order"
    for module in "${modules[@]}"; do
        modprobe --show-depends -d "$cache/kernel" -S "$kver" "$module" 2>/dev/null |
            awk '$1 == "insmod" {print $2}' |
            while read -r path; do
                name=${path##*/}
                if [ ! -f "$root/lib/modules/$name" ]; then
                    cp "$path" "$root/lib/modules/$name"
                    echo "$name" >> "$root/modules.order"
                fi
            done
    done
    cat > "$root/init" <<'INIT'
#!/bin/sh
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
for module in $(cat /modules.order); do insmod "/lib/modules/$module" 2>/dev/null; done
echo "KVCM-RXE-INIT"
ip link set lo up
# No duplicate-address detection: the link-local address (GID 0) is usable at once.
echo 0 > /proc/sys/net/ipv6/conf/eth0/accept_dad
echo 0 > /proc/sys/net/ipv6/conf/eth0/dad_transmits
ip link set eth0 up
ip addr add 10.0.2.15/24 dev eth0
mount -t 9p -o trans=virtio,version=9p2000.L,ro host /host
mount -t 9p -o trans=virtio,version=9p2000.L share /share
mount -t tmpfs tmpfs /upper
mkdir -p /upper/data /upper/work
mount -t overlay overlay -o lowerdir=/host,upperdir=/upper/data,workdir=/upper/work /newroot
mount -t proc proc /newroot/proc
mount -t sysfs sys /newroot/sys
mount -t devtmpfs dev /newroot/dev
mount -t tmpfs tmpfs /newroot/tmp
mkdir -p /newroot/rxe-share
mount --bind /share /newroot/rxe-share
gids_ready() {
    for gid in 0 1; do
        value=$(cat /sys/class/infiniband/rxe0/ports/1/gids/$gid 2>/dev/null)
        case "$value" in ""|0000:0000:0000:0000:0000:0000:0000:0000) return 1 ;; esac
    done
}
if chroot /newroot rdma link add rxe0 type rxe netdev eth0; then
    # The port's GIDs (link-local and IPv4) appear shortly after the link: wait up to 20 s.
    tries=0
    while ! gids_ready && [ "$tries" -lt 200 ]; do sleep 0.1; tries=$((tries + 1)); done
    gids_ready || echo "rxe-vm guest: rxe0 GIDs not ready after 20 s"
    chroot /newroot /bin/sh /rxe-share/command.sh
    echo "$?" > /share/status
else
    echo "rxe-vm guest: rdma link add rxe0 failed" 
    echo 125 > /share/status
fi
echo "KVCM-RXE-DONE"
poweroff -f
INIT
    chmod +x "$root/init"
    rm -f "$cache"/initrd-*.cpio.gz
    (cd "$root" && find . | cpio -o -H newc --quiet | gzip -1) > "$initrd.tmp"
    mv "$initrd.tmp" "$initrd"
    rm -rf "$root"
fi
phase "initramfs"

# 4. Acceleration: KVM only when a 15-second probe boot under -enable-kvm reaches init.
share=$(mktemp -d "$cache/run.XXXXXX")
trap 'rm -rf "$share"' EXIT
vm=(qemu-system-x86_64 -m 2048 -smp 2 -nographic -no-reboot
    -kernel "$vmlinuz" -initrd "$initrd"
    -append "console=ttyS0 quiet panic=-1 rdinit=/init$kernel_args"
    -netdev user,id=n0,restrict=on -device virtio-net-pci,netdev=n0,romfile=
    -virtfs local,path=/,mount_tag=host,security_model=none,readonly=on,multidevs=remap
    -virtfs "local,path=$share,mount_tag=share,security_model=none")
if [ ! -f "$cache/accel" ]; then
    accel="-accel tcg,thread=multi -cpu max"
    if [ -w /dev/kvm ]; then
        printf 'exit 0\n' > "$share/command.sh"
        if timeout 15 "${vm[@]}" -enable-kvm -cpu host 2>/dev/null | grep -q KVCM-RXE-INIT; then
            accel="-enable-kvm -cpu host"
        fi
    fi
    echo "$accel" > "$cache/accel"
fi
accel=$(cat "$cache/accel")
phase "acceleration probe ($accel)"

# 5. The run: the command in the guest, in this directory, with the environment's KVCM_*,
#    RUST_* and CI settings.
{
    echo "cd $(printf '%q' "$(pwd)") || exit 126"
    env | grep -E '^(KVCM_|RUST_|CI=)' | while IFS= read -r setting; do
        echo "export $(printf '%q' "$setting")"
    done
    if [ "$with_perftest" = 1 ]; then
        echo "export PATH=$(printf '%q' "$perftest_root/usr/bin"):\${PATH:-/usr/sbin:/usr/bin:/sbin:/bin}"
        echo "export LD_LIBRARY_PATH=$(printf '%q' "$perftest_libs")"
    fi
    printf 'exec'
    printf ' %q' "$@"
    echo
} > "$share/command.sh"
log="$cache/console.log"
rm -f "$share/status"
# shellcheck disable=SC2086 # $accel holds several flags
timeout "$timeout_s" "${vm[@]}" $accel 2>&1 | tee "$log" | grep -v 'KVCM-RXE-' || true
phase "guest run"
if [ ! -f "$share/status" ]; then
    echo "rxe-vm: the guest ended without an exit status (hung past ${timeout_s} s, or panicked); console log: $log" >&2
    exit 124
fi
status=$(cat "$share/status")
echo "rxe-vm: the command exited with $status" >&2
exit "$status"
