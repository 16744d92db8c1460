//! The frame parsers on arbitrary bytes: the fast-path L2 parse and the full-layer summary
//! must never panic, and the L2 parse must agree with the summary. The IPv6 checks (with
//! the extension-header walk) and the ICMPv6/NDP parse run on the same bytes as an IPv6
//! packet: never a panic, offsets within the packet, errors quoting garbage built safely.
#![no_main]
use libfuzzer_sys::fuzz_target;
use std::net::Ipv6Addr;
use tapyard::wire::icmpv6::{self, Icmpv6Packet, Icmpv6Repr, NdOptions};
use tapyard::wire::ipv6;
use tapyard::wire::{EthMeta, Summary};
use tapyard::MacAddr;

fuzz_target!(|data: &[u8]| {
    let meta = EthMeta::parse(data);
    let s = Summary::parse(data);
    let _ = s.to_string();
    if let Ok(m) = meta {
        assert!(usize::from(m.l3) <= data.len());
        assert_eq!(s.eth, Some(m));
    }
    if let Ok(i) = ipv6::check(data) {
        assert!(i.l4_off <= i.total_len() && i.total_len() <= data.len());
        assert!(i.l4_off - ipv6::HEADER_LEN <= ipv6::MAX_EXT_BYTES + 8);
        let l4 = &data[i.l4_off..i.total_len()];
        if let Ok(p) = Icmpv6Packet::new_checked(l4) {
            let _ = Icmpv6Repr::parse(&p, i.src, i.dst);
        }
        let mut out = [0u8; 14 + ipv6::MIN_MTU];
        // The router's error shape: as much of the datagram as fits in the minimum MTU.
        let quote = data
            .len()
            .min(ipv6::MIN_MTU - ipv6::HEADER_LEN - icmpv6::HEADER_LEN);
        let e = Icmpv6Repr::TimeExceeded {
            code: 0,
            data: &data[..quote],
        };
        let z = MacAddr::ZERO;
        let n = ipv6::write_icmp(&mut out, z, z, Ipv6Addr::LOCALHOST, i.src, 64, &e).unwrap();
        assert!(n <= 14 + ipv6::MIN_MTU);
        // An error the router may send (never to a loopback source, which `check` refuses
        // as a destination, as Linux does) is itself a packet `check` accepts.
        if ipv6::may_send_icmp_error(data, &i, false) {
            assert!(ipv6::check(&out[14..n]).is_ok());
        }
    }
    let a = Ipv6Addr::LOCALHOST;
    if let Ok(p) = Icmpv6Packet::new_checked(data) {
        let _ = Icmpv6Repr::parse(&p, a, a);
    }
    for o in NdOptions::new(data) {
        if o.is_err() {
            break;
        }
    }
});
