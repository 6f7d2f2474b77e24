#!/bin/sh
# /init of the real guest: PID 1, busybox only. It brings up the network the way a cocoon OCI
# guest's init does, from the kernel's ip= and cocoon.hostname= arguments, serves one line on
# port @PORT@, says so on the console and stays up. Every failure is printed and powers the guest
# off, so a broken guest ends its VM at once instead of leaving a test to time out.
export PATH=/sbin:/bin:/usr/sbin:/usr/bin

fail() {
	echo "@FAILED@ $*"
	poweroff -f
}

mount -t proc proc /proc
mount -t sysfs sysfs /sys
mount -t devtmpfs devtmpfs /dev

# virtio-pci, then the drivers: virtio-net, virtio-console, the ACPI power button and evdev for
# acpid. The order, dependencies first, was resolved from modules.dep when the initramfs was built.
while read -r module; do
	insmod "/lib/modules/$module" || echo "realguest: insmod $module failed"
done </etc/realguest/modules

hostname=
ip_args=
console=
for arg in $(cat /proc/cmdline); do
	case "$arg" in
	cocoon.hostname=*) hostname=${arg#*=} ;;
	ip=*) ip_args="$ip_args ${arg#ip=}" ;;
	console=*) console=${arg#console=} console=${console%%,*} ;; # the last one is /dev/console
	esac
done

# With console=hvc0 (cocoon's choice) the kernel had no console to give /init: it appears once
# virtio_console has heard about the port from the device, a moment after insmod returns. Wait for
# it, then reopen /dev/console so what follows is seen. A failed exec redirection would end this
# shell, so only reopen what opens.
tries=0
while [ -n "$console" ] && [ ! -e "/dev/$console" ] && [ $tries -lt 100 ]; do
	tries=$((tries + 1))
	sleep 0.1
done
if { : </dev/console; } 2>/dev/null; then
	exec 0</dev/console 1>/dev/console 2>&1
fi

ip link set lo up || fail "bring up lo"

# configure_ip applies one ip=<ip>::<gw>:<netmask>:<hostname>:<dev>:off[:<dns0>[:<dns1>]]
# argument unless the kernel already did (a kernel with CONFIG_IP_PNP does; Debian's does not).
# It sets $addr and $ip_hostname and appends to $nameservers.
configure_ip() {
	old_ifs=$IFS
	IFS=:
	# shellcheck disable=SC2086 # split on ":" on purpose; empty fields are kept
	set -- $1
	IFS=$old_ifs
	addr=$1 gw=$3 mask=$4 ip_hostname=$5 dev=${6:-eth0}
	[ -n "$7" ] && [ "$7" != off ] && [ "$7" != none ] && fail "ip=: autoconf $7 is not supported"
	nameservers="$nameservers $8 $9"

	tries=0
	while [ ! -e "/sys/class/net/$dev" ]; do
		tries=$((tries + 1))
		[ $tries -gt 100 ] && fail "no network device $dev"
		sleep 0.1
	done
	if ip -4 addr show dev "$dev" | grep -q "inet $addr/"; then
		echo "realguest: $dev already has $addr from the kernel"
		return
	fi
	prefix=$(ipcalc -p "$addr" "$mask") || fail "bad address $addr/$mask"
	prefix=${prefix#PREFIX=}
	ip link set "$dev" up || fail "bring up $dev"
	ip addr add "$addr/$prefix" dev "$dev" || fail "add $addr/$prefix to $dev"
	if [ -n "$gw" ]; then
		ip route add default via "$gw" dev "$dev" || fail "default route via $gw"
	fi
}

first_addr=
nameservers=
for ip_arg in $ip_args; do
	configure_ip "$ip_arg"
	[ -n "$first_addr" ] || first_addr=$addr
	[ -n "$hostname" ] || hostname=$ip_hostname
done

hostname "${hostname:=realguest}" || fail "set hostname $hostname"
: >/etc/resolv.conf
for ns in $nameservers; do
	echo "nameserver $ns" >>/etc/resolv.conf
done
# shellcheck disable=SC2086 # one line, the addresses separated by single spaces
echo "@NAMESERVERS@" $nameservers

# One line per connection: nc -ll forks a server for each client and goes on listening.
echo "$hostname ${first_addr:-none}" >/etc/realguest/hello
nc -ll -p @PORT@ -e /bin/realguest-hello &

# The ACPI power button (QMP system_powerdown) arrives as KEY_POWER on an input device; acpid
# maps it to /etc/acpi/PWRF/00000080, which powers the guest off.
acpid || fail "start acpid"

echo "@READY@ $hostname ${first_addr:-none}"
while :; do
	sleep 3600
done
