//! The guard against frames a pod could send: its own traffic passes (DHCP, ARP probes,
//! DAD, MLD, link-local NDP included), anyone else's addresses or MAC do not.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use etherparse::{Icmpv6Type, PacketBuilder};

use super::*;

const MAC: MacAddr = MacAddr([0x02, 0, 0, 0, 1, 2]);
const OTHER_MAC: [u8; 6] = [0x02, 0, 0, 0, 1, 3];
const GW_MAC: [u8; 6] = [0x02, 0xaa, 0, 0, 0, 1];
const V4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 2);
const OTHER4: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 3);

fn v6(h: u16) -> Ipv6Addr {
    Ipv6Addr::new(0xfd00, 0x10, 0x244, 1, 0, 0, 0, h)
}

fn guard() -> PortGuard {
    PortGuard::new(MAC, [IpAddr::V4(V4), IpAddr::V6(v6(2))]).unwrap()
}

fn udp_ipv4(src_mac: [u8; 6], src: Ipv4Addr, sport: u16, dport: u16) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(src_mac, GW_MAC)
        .ipv4(src.octets(), [10, 96, 0, 10], 64)
        .udp(sport, dport)
        .write(&mut f, &[1; 10])
        .unwrap();
    f
}

fn udp_ipv6(src: Ipv6Addr) -> Vec<u8> {
    let mut f = Vec::new();
    PacketBuilder::ethernet2(MAC.0, GW_MAC)
        .ipv6(src.octets(), v6(1).octets(), 64)
        .udp(40000, 53)
        .write(&mut f, &[1; 10])
        .unwrap();
    f
}

/// An ARP packet: `op`, sender MAC and address, target address.
fn arp(eth_src: [u8; 6], sha: [u8; 6], spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0xff; 6];
    f.extend_from_slice(&eth_src);
    f.extend_from_slice(&[0x08, 0x06, 0, 1, 0x08, 0, 6, 4, 0, 2]);
    f.extend_from_slice(&sha);
    f.extend_from_slice(&spa.octets());
    f.extend_from_slice(&[0; 6]);
    f.extend_from_slice(&tpa.octets());
    f
}

/// An ICMPv6 message from `src` of type `ty` whose body is a link-layer address option
/// carrying `lladdr` (a router solicitation).
fn nd(src: Ipv6Addr, ty: Icmpv6Type, lladdr: Option<[u8; 6]>) -> Vec<u8> {
    let mut opts = Vec::new();
    if let Some(m) = lladdr {
        let kind = if matches!(ty, Icmpv6Type::Unknown { type_u8: 136, .. }) {
            2
        } else {
            1
        };
        opts.extend_from_slice(&[kind, 1]);
        opts.extend_from_slice(&m);
    }
    let mut f = Vec::new();
    PacketBuilder::ethernet2(MAC.0, GW_MAC)
        .ipv6(src.octets(), v6(1).octets(), 255)
        .icmpv6(ty)
        .write(&mut f, &opts)
        .unwrap();
    f
}

/// The ICMPv6 header of an NS (135) or NA (136): etherparse's `Unknown` carries the 4 bytes
/// after the checksum; the target follows as payload (see [`with_target`]).
fn ns_na(code: u8) -> Icmpv6Type {
    let mut bytes = [0u8; 4];
    if code == 136 {
        bytes[0] = 0x60; // solicited, override
    }
    Icmpv6Type::Unknown {
        type_u8: code,
        code_u8: 0,
        bytes5to8: bytes,
    }
}

fn with_target(src: Ipv6Addr, code: u8, target: Ipv6Addr, lladdr: Option<[u8; 6]>) -> Vec<u8> {
    let mut payload = target.octets().to_vec();
    if let Some(m) = lladdr {
        payload.extend_from_slice(&[if code == 136 { 2 } else { 1 }, 1]);
        payload.extend_from_slice(&m);
    }
    let mut f = Vec::new();
    PacketBuilder::ethernet2(MAC.0, GW_MAC)
        .ipv6(src.octets(), v6(1).octets(), 255)
        .icmpv6(ns_na(code))
        .write(&mut f, &payload)
        .unwrap();
    f
}

#[test]
fn the_pods_own_traffic_passes() {
    let g = guard();
    let ll = Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0xff, 0xfe00, 0x102);
    for f in [
        udp_ipv4(MAC.0, V4, 40000, 53),
        udp_ipv4(MAC.0, Ipv4Addr::UNSPECIFIED, 68, 67),
        arp(MAC.0, MAC.0, V4, Ipv4Addr::new(10, 244, 1, 1)),
        arp(MAC.0, MAC.0, Ipv4Addr::UNSPECIFIED, V4),
        udp_ipv6(v6(2)),
        udp_ipv6(ll),
        with_target(Ipv6Addr::UNSPECIFIED, 135, v6(2), None),
        with_target(v6(2), 135, v6(1), Some(MAC.0)),
        with_target(v6(2), 136, v6(2), Some(MAC.0)),
        with_target(ll, 136, ll, Some(MAC.0)),
        nd(
            ll,
            Icmpv6Type::Unknown {
                type_u8: 133,
                code_u8: 0,
                bytes5to8: [0; 4],
            },
            Some(MAC.0),
        ),
    ] {
        assert_eq!(g.check(&f), Ok(()), "{f:02x?}");
    }
    // Other EtherTypes: the MAC only.
    let mut lldp = vec![0x01, 0x80, 0xc2, 0, 0, 0x0e];
    lldp.extend_from_slice(&MAC.0);
    lldp.extend_from_slice(&[0x88, 0xcc, 0, 0]);
    assert_eq!(g.check(&lldp), Ok(()));
    // Short frames are left to the datapath.
    assert_eq!(g.check(&udp_ipv4(MAC.0, V4, 1, 2)[..20]), Ok(()));
}

#[test]
fn anyone_elses_mac_or_address_is_dropped_by_reason() {
    let g = guard();
    let cases = [
        (udp_ipv4(OTHER_MAC, V4, 40000, 53), SpoofDrop::Mac),
        (udp_ipv4(MAC.0, OTHER4, 40000, 53), SpoofDrop::Ip),
        (
            udp_ipv4(MAC.0, Ipv4Addr::UNSPECIFIED, 40000, 53),
            SpoofDrop::Ip,
        ),
        (
            udp_ipv4(MAC.0, Ipv4Addr::new(172, 18, 0, 2), 40000, 53),
            SpoofDrop::Ip,
        ),
        (arp(MAC.0, MAC.0, OTHER4, V4), SpoofDrop::Arp),
        (arp(MAC.0, OTHER_MAC, V4, OTHER4), SpoofDrop::Mac),
        (udp_ipv6(v6(3)), SpoofDrop::Ip),
        (udp_ipv6(Ipv6Addr::UNSPECIFIED), SpoofDrop::Ip),
        (with_target(v6(2), 136, v6(3), Some(MAC.0)), SpoofDrop::Nd),
        (
            with_target(v6(2), 136, v6(2), Some(OTHER_MAC)),
            SpoofDrop::Mac,
        ),
        (
            with_target(v6(2), 135, v6(1), Some(OTHER_MAC)),
            SpoofDrop::Mac,
        ),
        (with_target(v6(3), 135, v6(1), Some(MAC.0)), SpoofDrop::Ip),
        // Duplicate address detection of another port's (tentative) address.
        (
            with_target(Ipv6Addr::UNSPECIFIED, 135, v6(3), None),
            SpoofDrop::Nd,
        ),
    ];
    for (f, want) in cases {
        assert_eq!(g.check(&f), Err(want), "{f:02x?}");
    }
    // Behind a VLAN tag, the same.
    let mut tagged = udp_ipv4(MAC.0, OTHER4, 40000, 53);
    tagged.splice(12..12, [0x81, 0x00, 0, 5]);
    assert_eq!(g.check(&tagged), Err(SpoofDrop::Ip));
    assert_eq!(SpoofDrop::Nd.name(), "spoofed_nd");
}

#[test]
fn a_guard_is_checked_when_made() {
    assert!(matches!(
        PortGuard::new(MacAddr::BROADCAST, []),
        Err(GuardError::NotUnicast(_))
    ));
    let many = (1..=5).map(|i| IpAddr::V4(Ipv4Addr::new(10, 0, 0, i)));
    let e = PortGuard::new(MAC, many).unwrap_err();
    assert_eq!(e.to_string(), "at most 4 addresses of each family, got 5");
    let g = guard();
    assert_eq!(
        (g.mac(), g.ipv4(), g.ipv6()),
        (MAC, &[V4][..], &[v6(2)][..])
    );
}

#[test]
fn random_bytes_never_panic() {
    let g = guard();
    let mut x: u64 = 0x1234_5678_9abc_def1;
    let base = [
        udp_ipv4(MAC.0, V4, 1, 2),
        udp_ipv6(v6(2)),
        with_target(v6(2), 136, v6(2), Some(MAC.0)),
    ];
    for i in 0..20_000 {
        let mut f = base[i % 3].clone();
        for _ in 0..4 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let at = usize::try_from(x % u64::try_from(f.len()).unwrap()).unwrap();
            f[at] = x.to_le_bytes()[1];
        }
        x ^= x << 13;
        let cut = usize::try_from(x % u64::try_from(f.len() + 1).unwrap()).unwrap();
        f.truncate(cut);
        let _ = g.check(&f);
    }
}
