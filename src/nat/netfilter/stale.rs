//! kube-proxy's stale UDP flow cleanup (`CleanStaleEntries`, pkg/proxy/conntrack/cleanup.go),
//! written once for both families.
//!
//! UDP has no connection end: a flow's entry lives as long as datagrams keep coming, and
//! every datagram of it is translated as its first one was. When a Service changes, a flow
//! whose first datagram met another state of it is stale: kube-proxy deletes every UDP entry
//! whose original destination is one of the Service's frontends (ClusterIP:port,
//! LoadBalancer and external IPs:port, `*:nodePort`) and whose reply source is not one of its
//! serving endpoints. That includes flows that began *before* the Service existed: un-DNAT'd
//! (the reply comes from the ClusterIP itself), perhaps masqueraded. A DNS resolver that sent
//! before the DNS Service was programmed keeps its source port, and without the cleanup its
//! queries would follow that untranslated entry until the UDP timeout.
//!
//! Differences, on purpose:
//! * the endpoint is matched by address *and* port (kube-proxy: address only), so a flow to
//!   an endpoint whose port changed is flushed too;
//! * a Service without serving endpoints is cleaned as well (kube-proxy skips it: its filter
//!   table REJECTs every packet to the ClusterIP, established or not, which tapyard's
//!   Service table does only for a connection's first packet; flushing makes the next
//!   datagram a first one, rejected);
//! * the flows tagged with the Service (DNAT'd by it) are flushed too when their endpoint is
//!   no longer serving or their frontend went away (a changed port or ClusterIP, a protocol
//!   change, the Service's removal), as `conntrack -D --orig-dst <vip> --reply-src
//!   <endpoint> -p udp` of older kube-proxies;
//! * it runs on the change of one Service, and only when its frontends or serving endpoints
//!   changed, not on every sync of all Services.

use super::{NatFamily, Netfilter};
use crate::nat::service::ServiceAddr;
use crate::nat::ServiceSpec;
use crate::time::Instant;
use crate::wire::family::IpProto;
use crate::wire::ipv4::PROTO_UDP;
use crate::wire::tuple::Tuple;

/// Which UDP entries of a family's table a Service change leaves stale (see the module docs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StaleUdp<A> {
    /// The Service's tag: the flows it DNAT'd.
    pub(crate) service: u32,
    /// Its UDP frontends (address, port): the ClusterIP and any other address it answers on.
    pub(crate) frontends: Vec<(A, u16)>,
    /// Its node port: a flow to this port on any address, as kube-proxy's `*:nodePort`.
    pub(crate) node_port: Option<u16>,
    /// Frontends it no longer has: the flows it DNAT'd through them are stale.
    pub(crate) gone: Vec<(A, u16)>,
    /// A node port it no longer has.
    pub(crate) gone_node_port: Option<u16>,
    /// Its serving endpoints (address, port), sorted.
    pub(crate) serving: Vec<(A, u16)>,
    /// Every flow it DNAT'd is stale (the Service is removed).
    pub(crate) all_tagged: bool,
}

/// A Service's UDP frontends of family `A` (its ClusterIP, LoadBalancer and external IPs of
/// the family, on its port) and its node port (none for a TCP Service; the node port only
/// with a ClusterIP of the family: it answers on the families of its ClusterIPs).
pub(crate) fn udp_frontends<A: ServiceAddr>(spec: &ServiceSpec) -> (Vec<(A, u16)>, Option<u16>) {
    if spec.proto != IpProto::UDP {
        return (Vec::new(), None);
    }
    let vip = spec.vip_of::<A>();
    let others = spec
        .external_frontends()
        .filter_map(|(ip, _)| A::from_ip(ip));
    let f = vip.into_iter().chain(others).map(|a| (a, spec.port));
    (f.collect(), spec.node_port.filter(|_| vip.is_some()))
}

/// A Service's serving endpoints of family `A`, sorted: those serving, and those ready but
/// not serving (`publishNotReadyAddresses`: new connections still go to them, so their flows
/// are kept).
pub(crate) fn serving<A: ServiceAddr + Ord>(spec: &ServiceSpec) -> Vec<(A, u16)> {
    let mut v: Vec<(A, u16)> = spec
        .endpoints_of::<A>()
        .iter()
        .filter(|e| e.conditions.serving || e.conditions.ready)
        .map(|e| A::split(e.addr))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

/// What of a Service the cleanup compares, in one family: its UDP frontends, its node port,
/// its serving endpoints (sorted).
pub(crate) type Side<A> = (Vec<(A, u16)>, Option<u16>, Vec<(A, u16)>);

impl<A: Copy + Ord> StaleUdp<A> {
    /// What a change of Service `service` from `old` (frontends, node port, serving
    /// endpoints) to `new` leaves stale; `new` `None`: the Service is removed. `None` when
    /// nothing can be stale (nothing of it changed, or no UDP frontend either side).
    pub(crate) fn of_change(
        service: u32,
        old: Option<&Side<A>>,
        new: Option<&Side<A>>,
    ) -> Option<StaleUdp<A>> {
        let Some((frontends, node_port, serving)) = new else {
            return Some(StaleUdp {
                service,
                frontends: Vec::new(),
                node_port: None,
                gone: Vec::new(),
                gone_node_port: None,
                serving: Vec::new(),
                all_tagged: true,
            });
        };
        let (gone, gone_node_port) = match old {
            Some(o) => {
                if new == Some(o) {
                    return None;
                }
                let (f, np, _) = o;
                let gone = f.iter().filter(|x| !frontends.contains(x)).copied();
                let gone: Vec<_> = gone.collect();
                (gone, np.filter(|p| *node_port != Some(*p)))
            }
            None => (Vec::new(), None),
        };
        if frontends.is_empty() && gone.is_empty() && gone_node_port.is_none() {
            return None;
        }
        Some(StaleUdp {
            service,
            frontends: frontends.clone(),
            node_port: *node_port,
            gone,
            gone_node_port,
            serving: serving.clone(),
            all_tagged: false,
        })
    }

    /// Whether the entry with tuples `orig` and `reply`, tagged with `service`, is stale.
    #[inline]
    pub(crate) fn is_stale(&self, orig: &Tuple<A>, reply: &Tuple<A>, service: u32) -> bool
    where
        A: crate::wire::family::Family,
    {
        if orig.proto != PROTO_UDP {
            return false;
        }
        let to = (orig.dst, orig.dport);
        let tagged = service == self.service;
        if tagged
            && (self.all_tagged
                || self.gone.contains(&to)
                || self.gone_node_port == Some(orig.dport))
        {
            return true;
        }
        let front = self.frontends.contains(&to) || self.node_port == Some(orig.dport);
        (front || tagged)
            && self
                .serving
                .binary_search(&(reply.src, reply.sport))
                .is_err()
    }
}

impl Netfilter {
    /// Flushes the UDP flows of family `A` that `stale` says are stale (if the family's table
    /// was made: a table not made yet holds no flow); returns how many.
    pub(crate) fn flush_udp<A: NatFamily<W>, const W: usize>(
        &self,
        stale: &StaleUdp<A>,
        now: Instant,
    ) -> usize {
        let Some(ct) = self.tables.if_made::<A>() else {
            return 0;
        };
        ct.retain_hits(now, |v| !stale.is_stale(&v.orig, &v.reply, v.service))
    }

    /// kube-proxy's cleanup for family `A` after Service `service` changed from `old` to
    /// `new` (`None`: added; removed): the scan runs only when the family's frontends or
    /// serving endpoints changed. Returns how many flows were flushed.
    pub(crate) fn clean_stale_udp<A: NatFamily<W> + ServiceAddr + Ord, const W: usize>(
        &self,
        service: u32,
        old: Option<&ServiceSpec>,
        new: Option<&ServiceSpec>,
        now: Instant,
    ) -> usize {
        let side = |s: &ServiceSpec| {
            let (f, np) = udp_frontends::<A>(s);
            (f, np, serving::<A>(s))
        };
        let (o, n) = (old.map(side), new.map(side));
        match StaleUdp::of_change(service, o.as_ref(), n.as_ref()) {
            Some(stale) => self.flush_udp::<A, W>(&stale, now),
            None => 0,
        }
    }

    /// kube-proxy's cleanup for every Service at once, both families, as its full sync does
    /// (see the `stale` module): every UDP flow to a Service's frontend (ClusterIP:port,
    /// `*:node_port`) whose reply does not come from one of its endpoints is flushed. For
    /// changes outside the Services that make flows stale, such as
    /// [`NatRules::node_port_addresses`](super::NatRules::node_port_addresses) (a node address
    /// that starts answering a node port has flows to it from before). One scan of each
    /// table, only when a UDP Service exists. Returns how many flows were flushed.
    pub fn flush_stale_udp(&self, now: Instant) -> usize {
        self.flush_stale_udp_of::<std::net::Ipv4Addr, 2>(now)
            + self.flush_stale_udp_of::<std::net::Ipv6Addr, 5>(now)
    }

    /// [`Netfilter::flush_stale_udp`] for family `A`.
    fn flush_stale_udp_of<A: NatFamily<W> + ServiceAddr + Ord, const W: usize>(
        &self,
        now: Instant,
    ) -> usize {
        let stale: Vec<StaleUdp<A>> = self
            .services
            .list()
            .iter()
            .filter_map(|s| {
                let id = self.services.get(&s.name)?.id().get();
                let (f, np) = udp_frontends::<A>(s);
                StaleUdp::of_change(id, None, Some(&(f, np, serving::<A>(s))))
            })
            .collect();
        let Some(ct) = self.tables.if_made::<A>().filter(|_| !stale.is_empty()) else {
            return 0;
        };
        ct.retain_hits(now, |v| {
            !stale
                .iter()
                .any(|s| s.is_stale(&v.orig, &v.reply, v.service))
        })
    }
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::{Side, StaleUdp};
    use crate::wire::tuple::Tuple;

    const VIP: Ipv4Addr = Ipv4Addr::new(10, 96, 0, 10);
    const EP: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 5);
    const NODE: Ipv4Addr = Ipv4Addr::new(172, 18, 0, 2);
    const CLIENT: Ipv4Addr = Ipv4Addr::new(10, 244, 1, 9);

    fn udp(src: Ipv4Addr, sport: u16, dst: Ipv4Addr, dport: u16) -> Tuple<Ipv4Addr> {
        Tuple {
            src,
            dst,
            sport,
            dport,
            proto: 17,
            zone: 0,
        }
    }

    fn side(f: &[(Ipv4Addr, u16)], np: Option<u16>, e: &[(Ipv4Addr, u16)]) -> Side<Ipv4Addr> {
        (f.to_vec(), np, e.to_vec())
    }

    fn dns() -> StaleUdp<Ipv4Addr> {
        let new = side(&[(VIP, 53)], Some(30053), &[(EP, 5353)]);
        StaleUdp::of_change(7, None, Some(&new)).unwrap()
    }

    #[test]
    fn a_flow_from_before_the_service_is_stale_a_served_one_is_not() {
        let s = dns();
        let orig = udp(CLIENT, 40000, VIP, 53);
        // Un-DNAT'd: the reply comes from the ClusterIP itself (masqueraded or not).
        assert!(s.is_stale(&orig, &orig.invert(), 0));
        let mut masq = orig.invert();
        masq.dst = NODE;
        assert!(s.is_stale(&orig, &masq, 0));
        // DNAT'd to the serving endpoint: kept, tagged or not.
        let served = udp(EP, 5353, CLIENT, 40000);
        assert!(!s.is_stale(&orig, &served, 7));
        assert!(!s.is_stale(&orig, &served, 0));
        // The endpoint's address on another port is not the endpoint.
        let other_port = udp(EP, 53, CLIENT, 40000);
        assert!(s.is_stale(&orig, &other_port, 7));
        // Node port on any address; other ports and TCP untouched.
        let np = udp(CLIENT, 40000, NODE, 30053);
        assert!(s.is_stale(&np, &np.invert(), 0));
        let other = udp(CLIENT, 40000, VIP, 54);
        assert!(!s.is_stale(&other, &other.invert(), 0));
        let mut tcp = orig;
        tcp.proto = 6;
        assert!(!s.is_stale(&tcp, &tcp.invert(), 0));
    }

    #[test]
    fn only_a_change_of_frontends_or_endpoints_scans() {
        let f: &[(Ipv4Addr, u16)] = &[(VIP, 53)];
        let e: &[(Ipv4Addr, u16)] = &[(EP, 5353)];
        let dns = side(f, None, e);
        assert_eq!(StaleUdp::of_change(7, Some(&dns), Some(&dns)), None);
        // A TCP service (no UDP frontend) never scans, but for its removal.
        let tcp = side(&[], None, e);
        assert_eq!(
            StaleUdp::of_change(7, Some(&tcp), Some(&side(&[], None, &[]))),
            None
        );
        assert!(StaleUdp::of_change(7, Some(&tcp), None).is_some());
        // A moved ClusterIP: the flows the service DNAT'd through the old one are stale,
        // whatever their endpoint; another service's are not.
        let to = side(&[(Ipv4Addr::new(10, 96, 0, 11), 53)], None, e);
        let moved = StaleUdp::of_change(7, Some(&dns), Some(&to)).unwrap();
        let orig = udp(CLIENT, 40000, VIP, 53);
        let served = udp(EP, 5353, CLIENT, 40000);
        assert!(moved.is_stale(&orig, &served, 7));
        assert!(!moved.is_stale(&orig, &served, 8));
        // Removal: every flow it DNAT'd.
        let gone = StaleUdp::of_change(7, Some(&dns), None).unwrap();
        assert!(gone.is_stale(&orig, &served, 7));
        assert!(!gone.is_stale(&orig, &orig.invert(), 0));
    }
}
