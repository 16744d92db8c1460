//! A small synchronous rtnetlink client: just what the plugin does in the container's
//! namespace (find a link, set its MTU and state, add and list addresses and routes), and the
//! policy-routing rules tapyard's host port sets in its own namespace.
//!
//! Messages are built and parsed with `netlink-packet-route`; the socket is a blocking
//! `netlink-sys` socket. Each request carries its own sequence number and waits for its ACK
//! (or, for dumps, `NLMSG_DONE`); a kernel error comes back as the `io::Error` of its errno.
//! Open the client inside the namespace it should act on (see [`crate::netns`]).

use crate::types::Cidr;
use netlink_packet_core::{
    NetlinkHeader, NetlinkMessage, NetlinkPayload, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP, NLM_F_EXCL,
    NLM_F_REQUEST,
};
use netlink_packet_route::address::{AddressAttribute, AddressFlags, AddressMessage, AddressScope};
use netlink_packet_route::link::{LinkAttribute, LinkFlags, LinkMessage};
use netlink_packet_route::route::{
    RouteAddress, RouteAttribute, RouteHeader, RouteMessage, RouteProtocol, RouteScope, RouteType,
};
use netlink_packet_route::rule::{
    RuleAction, RuleAttribute, RuleHeader, RuleMessage, RulePortRange,
};
use netlink_packet_route::{AddressFamily, IpProtocol, RouteNetlinkMessage};
use netlink_sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr};
use std::io;
use std::net::IpAddr;

/// A link as the plugin needs to know it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Link {
    /// The ifindex.
    pub index: u32,
    /// The MAC address, `aa:bb:cc:dd:ee:ff` (empty if the link has none).
    pub mac: String,
    /// The MTU.
    pub mtu: u32,
    /// Whether it is administratively up.
    pub up: bool,
}

/// A route of the main table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteEntry {
    /// The destination.
    pub dst: Cidr,
    /// The next hop, if any.
    pub gw: Option<IpAddr>,
    /// The outgoing ifindex, if any.
    pub oif: Option<u32>,
}

/// A policy-routing rule (`ip rule`) that looks a table up, as far as this client models it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// IPv6 (`ip -6 rule`), else IPv4.
    pub v6: bool,
    /// Its priority (`pref`): lower is tried first.
    pub priority: u32,
    /// The table it looks up (`lookup`): 255 is `local`, 254 `main`.
    pub table: u32,
    /// `to`: the destination prefix it matches.
    pub dst: Option<Cidr>,
    /// `iif`: the input interface it matches (`lo`: locally generated packets).
    pub iif: Option<String>,
    /// `ipproto`: the IP protocol it matches.
    pub ip_proto: Option<u8>,
    /// `dport`: the destination port it matches.
    pub dport: Option<u16>,
    /// `protocol`: who installed it (2: the kernel).
    pub protocol: u8,
    /// It has a selector or an action this type does not model (`from`, `fwmark`, a port
    /// range, `goto`, ...): it is listed, never one that [`Netlink::add_rule`] makes.
    pub other: bool,
}

impl Rule {
    /// `pref <priority> [to ...] [iif ...] [ipproto ...] [dport ...] lookup <table>`, as
    /// `ip rule` lists it.
    pub fn describe(&self) -> String {
        let mut s = format!("pref {}", self.priority);
        if let Some(d) = self.dst {
            s += &format!(" to {}/{}", d.addr, d.prefix_len);
        }
        if let Some(i) = &self.iif {
            s += &format!(" iif {i}");
        }
        if let Some(p) = self.ip_proto {
            s += &format!(" ipproto {p}");
        }
        if let Some(p) = self.dport {
            s += &format!(" dport {p}");
        }
        s + &format!(" lookup {}", self.table)
    }

    fn message(&self) -> RuleMessage {
        let mut m = RuleMessage::default();
        m.header = RuleHeader {
            family: if self.v6 {
                AddressFamily::Inet6
            } else {
                AddressFamily::Inet
            },
            action: RuleAction::ToTable,
            ..Default::default()
        };
        m.attributes.push(RuleAttribute::Priority(self.priority));
        m.attributes.push(RuleAttribute::Table(self.table));
        if let Some(d) = self.dst {
            m.header.dst_len = d.prefix_len;
            m.attributes.push(RuleAttribute::Destination(d.addr));
        }
        if let Some(i) = &self.iif {
            m.attributes.push(RuleAttribute::Iifname(i.clone()));
        }
        if let Some(p) = self.ip_proto {
            m.attributes
                .push(RuleAttribute::IpProtocol(IpProtocol::from(p)));
        }
        if let Some(p) = self.dport {
            m.attributes
                .push(RuleAttribute::DestinationPortRange(RulePortRange {
                    start: p,
                    end: p,
                }));
        }
        m
    }
}

/// A blocking rtnetlink socket of the namespace it was opened in.
#[derive(Debug)]
pub struct Netlink {
    socket: Socket,
    seq: u32,
}

fn family(addr: IpAddr) -> AddressFamily {
    if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    }
}

fn invalid(e: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e.to_string())
}

impl Netlink {
    /// Opens a socket in the calling thread's network namespace.
    pub fn open() -> io::Result<Netlink> {
        let mut socket = Socket::new(NETLINK_ROUTE)?;
        socket.bind_auto()?;
        socket.connect(&SocketAddr::new(0, 0))?;
        Ok(Netlink { socket, seq: 0 })
    }

    /// Sends `msg` and collects the messages of the answer until its ACK or `NLMSG_DONE`.
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
    ) -> io::Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | flags;
        header.sequence_number = self.seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut buf = vec![0; packet.buffer_len()];
        packet.serialize(&mut buf);
        self.socket.send(&buf, 0)?;
        let mut answer = Vec::new();
        let mut rx = Vec::with_capacity(1 << 16);
        loop {
            rx.clear();
            let n = self.socket.recv(&mut rx, 0)?;
            if n > rx.len() {
                return Err(invalid("netlink message truncated"));
            }
            let mut offset = 0;
            while offset < rx.len() {
                let reply = NetlinkMessage::<RouteNetlinkMessage>::deserialize(&rx[offset..])
                    .map_err(invalid)?;
                let len = reply.header.length as usize;
                if len == 0 {
                    return Err(invalid("netlink message of length 0"));
                }
                offset += (len + 3) & !3;
                if reply.header.sequence_number != self.seq {
                    continue;
                }
                match reply.payload {
                    NetlinkPayload::Done(_) => return Ok(answer),
                    NetlinkPayload::Error(e) if e.code.is_some() => return Err(e.to_io()),
                    NetlinkPayload::Error(_) => return Ok(answer),
                    NetlinkPayload::InnerMessage(m) => answer.push(m),
                    _ => {}
                }
            }
        }
    }

    /// The link called `name`, or `None` if there is none.
    pub fn link_by_name(&mut self, name: &str) -> io::Result<Option<Link>> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        Ok(self.get_link(msg)?.map(|(_, link)| link))
    }

    /// The link whose ifindex is `index`, with its name, or `None` if there is none.
    pub fn link_by_index(&mut self, index: u32) -> io::Result<Option<(String, Link)>> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        self.get_link(msg)
    }

    fn get_link(&mut self, msg: LinkMessage) -> io::Result<Option<(String, Link)>> {
        let answer = match self.request(RouteNetlinkMessage::GetLink(msg), NLM_F_ACK) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => return Ok(None),
            other => other?,
        };
        for m in answer {
            if let RouteNetlinkMessage::NewLink(link) = m {
                let mut out = Link {
                    index: link.header.index,
                    mac: String::new(),
                    mtu: 0,
                    up: link.header.flags.contains(LinkFlags::Up),
                };
                let mut name = String::new();
                for attr in link.attributes {
                    match attr {
                        LinkAttribute::Address(mac) => out.mac = format_mac(&mac),
                        LinkAttribute::Mtu(mtu) => out.mtu = mtu,
                        LinkAttribute::IfName(n) => name = n,
                        _ => {}
                    }
                }
                return Ok(Some((name, out)));
            }
        }
        Ok(None)
    }

    /// Deletes link `index` (`RTM_DELLINK`); a link that is already gone is not an error.
    pub fn del_link(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        match self.request(RouteNetlinkMessage::DelLink(msg), NLM_F_ACK) {
            Err(e) if e.raw_os_error() == Some(libc::ENODEV) => Ok(()),
            other => other.map(drop),
        }
    }

    /// Moves link `index` of this namespace into the namespace `netns` (an open
    /// `/proc/<pid>/ns/net` or `/var/run/netns/<name>` file), renamed `name` there and with
    /// MTU `mtu`, in one `RTM_NEWLINK` request (`IFLA_NET_NS_FD`, `IFLA_IFNAME`, `IFLA_MTU`): the
    /// kernel applies all three or none, so a name taken in the target namespace
    /// (`EEXIST`) leaves the link where it was, under its old name.
    pub fn move_to_netns(
        &mut self,
        index: u32,
        netns: std::os::fd::BorrowedFd<'_>,
        name: &str,
        mtu: u32,
    ) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes
            .push(LinkAttribute::NetNsFd(netns.as_raw_fd()));
        msg.attributes.push(LinkAttribute::IfName(name.to_string()));
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.request(RouteNetlinkMessage::SetLink(msg), NLM_F_ACK)
            .map(drop)
    }

    /// Sets the MAC address of link `index`.
    pub fn set_mac(&mut self, index: u32, mac: [u8; 6]) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Address(mac.to_vec()));
        self.request(RouteNetlinkMessage::SetLink(msg), NLM_F_ACK)
            .map(drop)
    }

    /// Sets the MTU of link `index`.
    pub fn set_mtu(&mut self, index: u32, mtu: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.attributes.push(LinkAttribute::Mtu(mtu));
        self.request(RouteNetlinkMessage::SetLink(msg), NLM_F_ACK)
            .map(drop)
    }

    /// Brings link `index` up.
    pub fn set_up(&mut self, index: u32) -> io::Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = index;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(RouteNetlinkMessage::SetLink(msg), NLM_F_ACK)
            .map(drop)
    }

    /// Adds `addr` to link `index`; an address already there is not an error. IPv6 addresses
    /// skip duplicate address detection (the subnet is IPAM's, and the pod should not wait).
    pub fn add_address(&mut self, index: u32, addr: Cidr) -> io::Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = family(addr.addr);
        msg.header.prefix_len = addr.prefix_len;
        msg.header.scope = AddressScope::Universe;
        msg.header.index = index;
        if addr.addr.is_ipv4() {
            msg.attributes.push(AddressAttribute::Local(addr.addr));
        } else {
            msg.attributes
                .push(AddressAttribute::Flags(AddressFlags::Nodad));
        }
        msg.attributes.push(AddressAttribute::Address(addr.addr));
        let flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        match self.request(RouteNetlinkMessage::NewAddress(msg), flags) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other.map(drop),
        }
    }

    /// The addresses of link `index`.
    pub fn addresses(&mut self, index: u32) -> io::Result<Vec<Cidr>> {
        let answer = self.request(
            RouteNetlinkMessage::GetAddress(AddressMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for m in answer {
            let RouteNetlinkMessage::NewAddress(a) = m else {
                continue;
            };
            if a.header.index != index {
                continue;
            }
            // IFA_LOCAL is the interface's own address; IFA_ADDRESS the peer on p2p links.
            let mut found = None;
            for attr in &a.attributes {
                match attr {
                    AddressAttribute::Local(ip) => found = Some(*ip),
                    AddressAttribute::Address(ip) if found.is_none() => found = Some(*ip),
                    _ => {}
                }
            }
            if let Some(addr) = found {
                out.push(Cidr {
                    addr,
                    prefix_len: a.header.prefix_len,
                });
            }
        }
        Ok(out)
    }

    /// Adds a route to `dst` out of link `index`, via `gw` when given (else on-link); a route
    /// already there is not an error.
    pub fn add_route(&mut self, index: u32, dst: Cidr, gw: Option<IpAddr>) -> io::Result<()> {
        self.add_route_in(u32::from(RouteHeader::RT_TABLE_MAIN), index, dst, gw, None)
    }

    /// [`Netlink::add_route`] in routing table `table`, with the preferred source address
    /// `src` when given (`ip route add ... src SRC table TABLE`).
    pub fn add_route_in(
        &mut self,
        table: u32,
        index: u32,
        dst: Cidr,
        gw: Option<IpAddr>,
        src: Option<IpAddr>,
    ) -> io::Result<()> {
        let mut msg = route_message(table, dst, gw);
        msg.header.protocol = RouteProtocol::Boot;
        msg.header.scope = if gw.is_some() {
            RouteScope::Universe
        } else {
            RouteScope::Link
        };
        msg.header.kind = RouteType::Unicast;
        if let Some(src) = src {
            msg.attributes
                .push(RouteAttribute::PrefSource(RouteAddress::from(src)));
        }
        msg.attributes.push(RouteAttribute::Oif(index));
        let flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        match self.request(RouteNetlinkMessage::NewRoute(msg), flags) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other.map(drop),
        }
    }

    /// Deletes the main table's route to `dst` out of link `index` (via `gw` when given); a
    /// route that is not there is not an error.
    pub fn del_route(&mut self, index: u32, dst: Cidr, gw: Option<IpAddr>) -> io::Result<()> {
        let mut msg = route_message(u32::from(RouteHeader::RT_TABLE_MAIN), dst, gw);
        msg.header.scope = RouteScope::NoWhere;
        msg.attributes.push(RouteAttribute::Oif(index));
        match self.request(RouteNetlinkMessage::DelRoute(msg), NLM_F_ACK) {
            Err(e) if matches!(e.raw_os_error(), Some(libc::ESRCH | libc::ENOENT)) => Ok(()),
            other => other.map(drop),
        }
    }

    /// The routes of the main table, both families.
    pub fn routes(&mut self) -> io::Result<Vec<RouteEntry>> {
        let answer = self.request(
            RouteNetlinkMessage::GetRoute(RouteMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for m in answer {
            let RouteNetlinkMessage::NewRoute(r) = m else {
                continue;
            };
            let mut table = u32::from(r.header.table);
            let zero = match r.header.address_family {
                AddressFamily::Inet => IpAddr::from([0u8; 4]),
                AddressFamily::Inet6 => IpAddr::from([0u8; 16]),
                _ => continue,
            };
            let mut entry = RouteEntry {
                dst: Cidr {
                    addr: zero,
                    prefix_len: r.header.destination_prefix_length,
                },
                gw: None,
                oif: None,
            };
            for attr in r.attributes {
                match attr {
                    RouteAttribute::Table(t) => table = t,
                    RouteAttribute::Destination(a) => {
                        if let Some(ip) = route_ip(a) {
                            entry.dst.addr = ip;
                        }
                    }
                    RouteAttribute::Gateway(a) => entry.gw = route_ip(a),
                    RouteAttribute::Oif(i) => entry.oif = Some(i),
                    _ => {}
                }
            }
            if table == u32::from(RouteHeader::RT_TABLE_MAIN) {
                out.push(entry);
            }
        }
        Ok(out)
    }
}

impl Netlink {
    /// The policy-routing rules of both families, in the kernel's order.
    pub fn rules(&mut self) -> io::Result<Vec<Rule>> {
        let answer = self.request(
            RouteNetlinkMessage::GetRule(RuleMessage::default()),
            NLM_F_DUMP,
        )?;
        let mut out = Vec::new();
        for m in answer {
            let RouteNetlinkMessage::NewRule(r) = m else {
                continue;
            };
            let v6 = match r.header.family {
                AddressFamily::Inet => false,
                AddressFamily::Inet6 => true,
                _ => continue,
            };
            let mut rule = Rule {
                v6,
                priority: 0,
                table: u32::from(r.header.table),
                dst: None,
                iif: None,
                ip_proto: None,
                dport: None,
                protocol: 0,
                other: r.header.action != RuleAction::ToTable
                    || r.header.src_len != 0
                    || r.header.tos != 0,
            };
            for attr in r.attributes {
                match attr {
                    RuleAttribute::Priority(p) => rule.priority = p,
                    RuleAttribute::Table(t) => rule.table = t,
                    RuleAttribute::Destination(a) => {
                        rule.dst = Some(Cidr {
                            addr: a,
                            prefix_len: r.header.dst_len,
                        });
                    }
                    RuleAttribute::Iifname(i) => rule.iif = Some(i),
                    RuleAttribute::IpProtocol(p) => rule.ip_proto = Some(u8::from(p)),
                    RuleAttribute::DestinationPortRange(p) if p.start == p.end => {
                        rule.dport = Some(p.start);
                    }
                    RuleAttribute::Protocol(p) => rule.protocol = u8::from(p),
                    // Attributes the kernel reports at their neutral value.
                    RuleAttribute::FwMark(0)
                    | RuleAttribute::FwMask(0)
                    | RuleAttribute::SuppressPrefixLen(u32::MAX)
                    | RuleAttribute::SuppressIfGroup(u32::MAX)
                    | RuleAttribute::L3MDev(false) => {}
                    _ => rule.other = true,
                }
            }
            out.push(rule);
        }
        Ok(out)
    }

    /// Adds `rule` (marked with its `protocol`); the same rule already there is not an error.
    /// A rule with `other` set is refused (`InvalidInput`).
    pub fn add_rule(&mut self, rule: &Rule) -> io::Result<()> {
        if rule.other {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "a rule with selectors this client does not model",
            ));
        }
        let mut m = rule.message();
        m.attributes
            .push(RuleAttribute::Protocol(RouteProtocol::from(rule.protocol)));
        let flags = NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
        match self.request(RouteNetlinkMessage::NewRule(m), flags) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            other => other.map(drop),
        }
    }

    /// Deletes the first rule that matches `rule` (its priority, table and selectors; not
    /// its `protocol`); none is not an error.
    pub fn del_rule(&mut self, rule: &Rule) -> io::Result<()> {
        match self.request(RouteNetlinkMessage::DelRule(rule.message()), NLM_F_ACK) {
            Err(e) if e.raw_os_error() == Some(libc::ENOENT) => Ok(()),
            other => other.map(drop),
        }
    }
}

/// A route message of table `table` to `dst`, via `gw` when given (no output link yet).
fn route_message(table: u32, dst: Cidr, gw: Option<IpAddr>) -> RouteMessage {
    let mut msg = RouteMessage::default();
    msg.header = RouteHeader {
        address_family: family(dst.addr),
        destination_prefix_length: dst.prefix_len,
        table: u8::try_from(table).unwrap_or(RouteHeader::RT_TABLE_UNSPEC),
        ..Default::default()
    };
    if dst.prefix_len > 0 {
        msg.attributes
            .push(RouteAttribute::Destination(RouteAddress::from(dst.addr)));
    }
    if let Some(gw) = gw {
        msg.attributes
            .push(RouteAttribute::Gateway(RouteAddress::from(gw)));
    }
    msg.attributes.push(RouteAttribute::Table(table));
    msg
}

fn route_ip(a: RouteAddress) -> Option<IpAddr> {
    match a {
        RouteAddress::Inet(v4) => Some(v4.into()),
        RouteAddress::Inet6(v6) => Some(v6.into()),
        _ => None,
    }
}

/// `aa:bb:cc:dd:ee:ff`.
pub fn format_mac(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}
