//! The control half of VXLAN (the per-packet half is `tunnel`): the VXLAN interfaces, and
//! their peers added and removed while traffic flows, each with the route and neighbour it
//! implies.

use std::net::IpAddr;

use super::Control;
use crate::base::IfaceId;
use crate::l3::route::{NextHop, Route, RouteAddr, RouteProto, RouteTable};
use crate::l3::vxlan::{PeerError, Tunnel, VxlanPeer};
use crate::time::Instant;

impl<'a> Control<'a> {
    /// The VXLAN interfaces.
    pub fn tunnels(&self) -> &'a [Tunnel] {
        &self.dp.tunnels
    }

    /// The VXLAN interface called `name`.
    pub fn tunnel_by_name(&self, name: &str) -> Option<&'a Tunnel> {
        self.dp.tunnels.iter().find(|t| t.cfg.name == name)
    }

    /// Adds a peer to VXLAN interface `tunnel`, with what Flannel programs for a node: the
    /// route `<pod_cidr> via <gateway> dev <tunnel> onlink`, the permanent neighbour
    /// `<gateway> lladdr <vtep_mac>` and the FDB entry `<vtep_mac> dst <node_ip>`. Traffic
    /// to and from the peer flows from the next batch on.
    pub fn add_vxlan_peer(
        &self,
        tunnel: &str,
        peer: VxlanPeer,
        now: Instant,
    ) -> Result<(), PeerError> {
        let (Some(t), Some(r)) = (self.tunnel_by_name(tunnel), &self.dp.router) else {
            return Err(PeerError::NoSuchTunnel(tunnel.to_string()));
        };
        let _w = t.lock();
        t.check_peer(&peer)?;
        if crate::l3::vxlan::mask_ip(t.cfg.addr, peer.pod_prefix_len) == peer.pod_cidr {
            return Err(PeerError::Overlap {
                pod_cidr: (peer.pod_cidr, peer.pod_prefix_len),
                other: (t.cfg.addr, t.cfg.prefix_len),
            });
        }
        // The route and permanent neighbour Flannel programs per peer; the neighbour goes
        // again when the route is refused.
        let len = peer.pod_prefix_len;
        match (peer.gateway(), peer.pod_cidr) {
            (IpAddr::V4(gw), IpAddr::V4(c)) => {
                r.neigh
                    .add_static(t.iface, gw, peer.vtep_mac, now)
                    .map_err(|e| PeerError::Table(e.to_string()))?;
                if let Err(e) = r.routes.add(peer_route(t.iface, gw, c, len)) {
                    r.neigh.remove(t.iface, gw);
                    return Err(PeerError::Table(e.to_string()));
                }
            }
            (IpAddr::V6(gw), IpAddr::V6(c)) => {
                r.neigh6
                    .add_static(t.iface, gw, peer.vtep_mac, now)
                    .map_err(|e| PeerError::Table(e.to_string()))?;
                if let Err(e) = r.routes6.add(peer_route(t.iface, gw, c, len)) {
                    r.neigh6.remove(t.iface, gw);
                    return Err(PeerError::Table(e.to_string()));
                }
            }
            _ => return Err(PeerError::WrongFamily("pod_cidr", peer.pod_cidr)),
        }
        t.publish_add(peer);
        Ok(())
    }

    /// Removes the peer at `node_ip` from VXLAN interface `tunnel`, with its route and
    /// neighbour: from the next batch on, nothing is sent to it or accepted from it.
    pub fn remove_vxlan_peer(
        &self,
        tunnel: &str,
        node_ip: impl Into<IpAddr>,
    ) -> Result<VxlanPeer, PeerError> {
        let node_ip = node_ip.into();
        let (Some(t), Some(r)) = (self.tunnel_by_name(tunnel), &self.dp.router) else {
            return Err(PeerError::NoSuchTunnel(tunnel.to_string()));
        };
        let _w = t.lock();
        let peer = t
            .publish_remove(node_ip)
            .ok_or(PeerError::NotFound(node_ip))?;
        let len = peer.pod_prefix_len;
        match (peer.gateway(), peer.pod_cidr) {
            (IpAddr::V4(gw), IpAddr::V4(c)) => {
                remove_peer_route(&r.routes, t.iface, gw, c, len);
                r.neigh.remove(t.iface, gw);
            }
            (IpAddr::V6(gw), IpAddr::V6(c)) => {
                remove_peer_route(&r.routes6, t.iface, gw, c, len);
                r.neigh6.remove(t.iface, gw);
            }
            _ => {}
        }
        Ok(peer)
    }

    /// Writes the FDB entries the VXLAN peers imply, as `bridge fdb show dev flannel.1`
    /// prints Flannel's: `<vtep_mac> dev <tunnel> dst <node_ip> self permanent`.
    pub fn fmt_vxlan_fdb(&self, out: &mut impl std::fmt::Write) -> std::fmt::Result {
        for t in &self.dp.tunnels {
            for p in t.peers().iter() {
                writeln!(
                    out,
                    "{} dev {} dst {} self permanent",
                    p.peer.vtep_mac, t.cfg.name, p.peer.node_ip
                )?;
            }
        }
        Ok(())
    }
}

/// A VXLAN peer's route, as Flannel programs it: `pod_cidr/len via gw dev <tunnel> onlink`.
fn peer_route<A: RouteAddr>(iface: IfaceId, gw: A, pod_cidr: A, len: u8) -> Route<A> {
    Route {
        prefix: pod_cidr,
        len,
        next_hop: NextHop::Via(iface, gw),
        metric: 0,
        proto: RouteProto::Static,
        src: None,
    }
}

/// Removes a VXLAN peer's route when it is still the peer's (a route configured over it
/// since is left alone).
fn remove_peer_route<A: RouteAddr>(
    routes: &RouteTable<A>,
    iface: IfaceId,
    gw: A,
    pod_cidr: A,
    len: u8,
) {
    let ours = routes
        .routes()
        .into_iter()
        .find(|x| x.prefix == pod_cidr && x.len == len && x.next_hop == NextHop::Via(iface, gw));
    if let Some(x) = ours {
        let _ = routes.remove(x.prefix, x.len, Some(x.metric));
    }
}
